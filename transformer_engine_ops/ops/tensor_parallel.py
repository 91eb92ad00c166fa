"""Tensor and sequence parallelism: the collectives of the GEMM ops.

Activations are (seq, batch, ..., hidden) or (tokens, hidden): dim 0 is the sequence
dim that sequence parallelism shards. Collectives run inside the real kernels on the
group resolved from a bundle's ``tp_group``; the spec fakes only see the shapes they
produce. What a Linear call gathers, reduces and quantizes first is planned in
``ops/linear.py``; this module holds the collectives it plans with.
"""

from __future__ import annotations

from typing import Any, Optional, Protocol

import torch
import torch.distributed as dist

from transformer_engine_ops.quantization.encoding import matrix_dims
from transformer_engine_ops.quantization.float8 import Float8CurrentScalingQuantizer
from transformer_engine_ops.quantization.float8_block import Float8BlockQuantizer
from transformer_engine_ops.quantization.mxfp8 import MXFP8_BLOCK, MXFP8Quantizer
from transformer_engine_ops.quantization.nvfp4 import NVFP4_BLOCK, NVFP4Quantizer
from transformer_engine_ops.quantization.quantizer import Quantizer
from transformer_engine_ops.runtime import comm_overlap


class ParallelArgs(Protocol):
    """The fields of a GEMM bundle that say how it is parallel."""

    parallel_mode: Optional[str]
    tp_size: int
    tp_group: Any
    activation_dtype: torch.dtype


def tp_active(args: ParallelArgs) -> bool:
    """Whether this call communicates: a parallel mode on more than one rank."""
    if args.parallel_mode is None or args.tp_size == 1:
        return False
    if args.tp_size < 1:
        raise ValueError(f"{type(args).__name__}.tp_size: must be >= 1, got {args.tp_size}")
    if args.tp_group is None:
        raise ValueError(
            f"{type(args).__name__}: parallel_mode={args.parallel_mode!r} with "
            f"tp_size={args.tp_size} needs a tp_group, got None"
        )
    return True


def check_dim0(shape: Any, tp_size: int, what: str) -> None:
    if len(shape) < 2 or shape[0] % tp_size != 0:
        raise ValueError(
            f"Linear: sequence parallelism splits dim 0 of {what} over tp_size={tp_size} "
            f"ranks, but its shape is {tuple(shape)} (dim 0 must be divisible by tp_size)"
        )


def tp_group_of(args: ParallelArgs) -> Any:
    group = args.tp_group
    if group.size() != args.tp_size:
        raise ValueError(
            f"{type(args).__name__}: tp_size={args.tp_size} but the process group "
            f"{group.group_name!r} has {group.size()} ranks"
        )
    return group


_all_gather_tensor = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_tensor = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def all_gather_rows(x: torch.Tensor, args: ParallelArgs) -> torch.Tensor:
    """``x`` (rows, k) of every rank, concatenated in rank order along dim 0."""
    x = x.contiguous()
    out = torch.empty((x.shape[0] * args.tp_size, *x.shape[1:]), dtype=x.dtype, device=x.device)
    _all_gather_tensor(out, x, group=tp_group_of(args))
    return out


def all_reduce(x: torch.Tensor, args: ParallelArgs) -> torch.Tensor:
    x = x.contiguous()
    dist.all_reduce(x, group=tp_group_of(args))
    return x


def reduce_scatter_rows(x: torch.Tensor, args: ParallelArgs) -> torch.Tensor:
    """The sum over ranks of ``x`` (rows, k), keeping this rank's block of rows."""
    x = x.contiguous()
    out = torch.empty((x.shape[0] // args.tp_size, *x.shape[1:]), dtype=x.dtype, device=x.device)
    _reduce_scatter_tensor(out, x, group=tp_group_of(args))
    return out


def gathers_quantized(quantizer: Optional[Quantizer], shard_shape: Any) -> bool:
    """Whether a sequence-parallel all-gather of a shard of ``shard_shape`` that
    ``quantizer`` quantizes moves quantized data, as TE gathers it (the recipe's
    ``fp8_all_gather``, default True, chooses):

    * FP8 current scaling: every rank quantizes its shard with the amax of the whole
      tensor (TE's amax reduction over the TP group) and the codes are gathered;
    * MXFP8 (1-D blocks): codes and E8M0 scales, when the shard's rows are a multiple
      of 32, so no columnwise block straddles two shards (else high precision, as TE);
    * FP8 block scaling with 1-D blocks: codes and fp32 scales, when the shard's rows
      are a multiple of the block length (else, and for 2-D blocks, high precision);
    * NVFP4: every rank quantizes its shard with the rowwise and columnwise amaxes of
      the whole tensor (reduced over the TP group) and the packed codes and E4M3
      scales are gathered, when the shard's rows and features are multiples of 16
      (TE's ``is_quantizable``); row-scaled data (TE: not quantizable) and stochastic
      rounding (its bits depend on an element's position in the whole tensor) gather
      in high precision.

    Either way the gathered value holds the bits of the whole tensor quantized at once.
    Other formats gather in high precision and quantize the gathered tensor."""
    if isinstance(quantizer, Float8CurrentScalingQuantizer):
        return quantizer.fp8_all_gather
    if isinstance(quantizer, MXFP8Quantizer):
        m, k = matrix_dims(shard_shape)
        return (
            quantizer.fp8_all_gather
            and not quantizer.with_2d_quantization
            and m % MXFP8_BLOCK == 0
            and k % MXFP8_BLOCK == 0
        )
    if isinstance(quantizer, Float8BlockQuantizer):
        m, _ = matrix_dims(shard_shape)
        return (
            quantizer.fp8_all_gather
            and quantizer.block_scaling_dim == 1
            and m % quantizer.block_len == 0
        )
    if isinstance(quantizer, NVFP4Quantizer):
        m, k = matrix_dims(shard_shape)
        return (
            quantizer.fp8_all_gather
            and not quantizer.row_scaled_nvfp4
            and not quantizer.stochastic_rounding
            and m % NVFP4_BLOCK == 0
            and k % NVFP4_BLOCK == 0
        )
    return False


def all_gather_quantized(local: Any, args: ParallelArgs, rowwise: bool, columnwise: bool) -> Any:
    """Every rank's ``local`` (a quantized shard; one scale on every rank where the
    format has one per tensor), concatenated along dim 0 in rank order, holding the
    usages asked for (the format's ``gathered_rows``)."""
    return local.gathered_rows(
        lambda t: all_gather_rows(t, args), args.tp_size, rowwise=rowwise, columnwise=columnwise
    )


def gathered_bias_grad(dy: torch.Tensor, args: ParallelArgs) -> torch.Tensor:
    """The bias gradient over every rank's rows of ``dy``: each rank's fp32 column sums,
    gathered (tp_size x n floats) and added in rank order, so every rank holds the same
    bits without the high-precision dy on the wire."""
    partial = dy.sum(0, dtype=torch.float32).reshape(1, -1)
    return all_gather_rows(partial, args).sum(0).to(args.activation_dtype)


def reduce(x: torch.Tensor, how: str | None, args: ParallelArgs) -> torch.Tensor:
    if how == "all_reduce":
        return all_reduce(x, args)
    if how == "reduce_scatter":
        return reduce_scatter_rows(x, args)
    return x


def overlap_group(args: ParallelArgs, sp_comm: bool, *operands: Any) -> Any:
    """The TP group when this call's sequence-parallel collective runs fused with the GEMM
    beside it (``runtime/comm_overlap.py``: opted in, NCCL, plain CUDA operands); else None."""
    if not sp_comm:
        return None
    group = tp_group_of(args)
    return group if comm_overlap.fused_reason(group, *operands) is None else None
