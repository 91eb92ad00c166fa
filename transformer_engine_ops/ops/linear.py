"""The Linear op: its argument bundles and its op declaration.

``LinearFwdArgs`` and ``LinearBwdArgs`` follow what Transformer Engine's Linear
passes between its module, forward and backward. ``make codegen`` reads this
file statically and writes ``generated/linear.py`` (schemas, flatten/unflatten,
slot tables); edit the bundles here, never the generated file.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple, Optional

import torch
import torch.distributed as dist

from transformer_engine_ops.ops import _wgrad
from transformer_engine_ops.ops import tensor_parallel as tp
from transformer_engine_ops.quantization.float8 import Float8CurrentScalingQuantizer
from transformer_engine_ops.quantization.gemm import (
    _scaled_mm_operands,
    gemm,
    plain_product,
)
from transformer_engine_ops.quantization.nvfp4 import NVFP4Quantizer
from transformer_engine_ops.quantization.quantizer import QuantizedData, Quantizer
from transformer_engine_ops.quantization.stochastic import quantize_gradient
from transformer_engine_ops.runtime import comm_overlap
from transformer_engine_ops.runtime._torch_private import current_graph_task_id
from transformer_engine_ops.runtime.declaration import OpDeclaration
from transformer_engine_ops.runtime.lowering import exact, examples
from transformer_engine_ops.runtime.precision import math_dtype
from transformer_engine_ops.runtime.tensor_spec import TensorSpec
from transformer_engine_ops.runtime.types import ProcessGroup, TensorOrQuantized
from transformer_engine_ops.runtime.values import GemmConfig

ParallelMode = Literal["column", "row"]


class BackwardOverride(enum.Enum):
    """Which tensors the backward GEMMs of a quantized Linear consume."""

    # Keep the unquantized input and weight for backward; run dgrad/wgrad unquantized.
    HIGH_PRECISION = "high_precision"
    # Keep the quantized tensors but dequantize them for an unquantized backward.
    DEQUANTIZED = "dequantized"


@dataclass
class LinearFwdArgs:
    """Everything the Linear forward needs, as one bundle."""

    # --- Differentiable inputs ---
    weight: TensorOrQuantized
    inp: torch.Tensor
    bias: Optional[torch.Tensor]

    # --- Cached quantized weight (reused across microbatches) ---
    weight_workspace: Optional[TensorOrQuantized]

    # --- requires_grad, recorded so the backward does not re-query ---
    input_requires_grad: bool
    weight_requires_grad: bool
    bias_requires_grad: bool

    # --- Quantizers (None when the recipe does not quantize that tensor) ---
    input_quantizer: Optional[Quantizer]
    weight_quantizer: Optional[Quantizer]
    output_quantizer: Optional[Quantizer]
    grad_input_quantizer: Optional[Quantizer]
    grad_weight_quantizer: Optional[Quantizer]
    grad_output_quantizer: Optional[Quantizer]

    # --- Numerics ---
    activation_dtype: torch.dtype
    fp8: bool
    fp8_output: bool
    backward_override: Optional[BackwardOverride]
    fprop_gemm: GemmConfig
    dgrad_gemm: GemmConfig
    wgrad_gemm: GemmConfig

    # --- Weight-workspace caching ---
    is_first_microbatch: Optional[bool]
    cache_weight: bool

    # --- Tensor and sequence parallelism ---
    parallel_mode: Optional[ParallelMode]
    tp_group: Optional[ProcessGroup]
    tp_size: int
    sequence_parallel: bool
    in_features: int
    out_features: int

    # --- Userbuffers-style communication overlap ---
    ub_overlap_ag_fprop: bool
    ub_overlap_rs_fprop: bool
    ub_name: Optional[str]

    # --- Not supported across the op boundary: must be None ---
    wgrad_store: Optional[Any]

    # --- Autograd state ---
    is_grad_enabled: bool

    # --- Stochastic rounding of the output gradient: (seed, offset), int64 (2,) ---
    sr_rng_state: Optional[torch.Tensor] = None

    # --- Weight-gradient scheduling (eager only: the weight's main_grad, a deferred GEMM) ---
    fuse_wgrad_accumulation: bool = False
    delay_wgrad_compute: bool = False

    # --- TE's save_original_input: keep the unquantized input, re-quantize it in backward ---
    save_original_input: bool = False

    # --- Calibration (autocast(enabled=False, calibrating=True)): input's, weight's ---
    calibration_quantizers: Optional[list[Optional[Quantizer]]] = None


@dataclass
class LinearBwdArgs:
    """Everything the Linear backward needs, as one bundle."""

    # --- Incoming gradients, one per forward output ---
    grad_outputs: list[torch.Tensor]

    # --- Saved by the forward ---
    inputmat: Optional[TensorOrQuantized]
    weight_fp8: Optional[TensorOrQuantized]
    inp_shape: torch.Size

    # --- What to compute ---
    requires_dgrad: bool
    requires_wgrad: bool
    use_bias: bool

    # --- Quantizers ---
    input_quantizer: Optional[Quantizer]
    weight_quantizer: Optional[Quantizer]
    grad_input_quantizer: Optional[Quantizer]
    grad_weight_quantizer: Optional[Quantizer]
    grad_output_quantizer: Optional[Quantizer]

    # --- Numerics ---
    activation_dtype: torch.dtype
    fp8: bool
    backward_override: Optional[BackwardOverride]
    dgrad_gemm: GemmConfig
    wgrad_gemm: GemmConfig

    # --- Tensor and sequence parallelism ---
    parallel_mode: Optional[ParallelMode]
    tp_group: Optional[ProcessGroup]
    tp_size: int
    sequence_parallel: bool

    # --- Userbuffers-style communication overlap ---
    ub_overlap_ag_dgrad: bool
    ub_overlap_rs_dgrad: bool
    ub_bulk_wgrad: bool

    # --- Not supported across the op boundary: must be None ---
    wgrad_store: Optional[Any]
    main_grad_func: Optional[Callable[[], torch.Tensor]]

    # --- Stochastic rounding of the output gradient: (seed, offset), int64 (2,) ---
    sr_rng_state: Optional[torch.Tensor] = None

    # --- Where the weight gradient goes instead of being returned (eager only) ---
    wgrad_route: Optional[Any] = None

    # --- inputmat is the original input: the backward quantizes it as the forward would ---
    save_original_input: bool = False


# --- The plan: every decision real kernels and spec fakes share --------------------
# Real and fake kernels both derive their branches from these functions, so the
# fake's output layout cannot drift from the real one (a class of late bugs in TE).


# Exact types of plain tensors (a tensor subclass, e.g. a quantized wrapper, is not one).
_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)


def _is_quantized(value: Any) -> bool:
    return isinstance(value, QuantizedData) or (
        isinstance(value, TensorSpec) and value.is_quantized
    )


class _Usage(NamedTuple):
    rowwise: bool
    columnwise: bool


class _ForwardPlan(NamedTuple):
    save_input: _Usage | None  # input quantized with these usages and kept for backward
    quantize_weight: _Usage | None  # weight quantized in this call, with these usages
    weight_from_workspace: bool
    quantized_output: bool
    gather_input: bool  # column + sequence parallel: all-gather the input along dim 0
    gather_quantized: bool  # ... quantized first, as TE does (gathers_quantized)
    reduce_output: str | None  # row parallel: "all_reduce", or "reduce_scatter" (+ SP)
    # What the forward returns for the backward, after the fprop GEMM dropped the usages
    # the backward does not read (the fakes declare exactly these buffers):
    saved_input: _Usage | None = None  # the kept quantized input's usages
    saved_weight: _Usage | None = None  # the weight quantized here (None: not returned)
    # TE's save_original_input: the input is quantized for the fprop GEMM only and kept
    # unquantized; the backward quantizes it as ``saved_input`` would have held it.
    save_original: bool = False


class _BackwardPlan(NamedTuple):
    gather_grad_output: bool  # row + sequence parallel: all-gather dy along dim 0
    gather_grad_output_quantized: bool  # ... quantized first (gathers_quantized)
    gather_input: bool  # column + SP with a saved local shard: re-gather it
    reduce_dgrad: str | None  # column parallel: "all_reduce", or "reduce_scatter" (+ SP)


# --- tensor and sequence parallelism: the plan of a Linear call ----------------------
# The collectives themselves are in ops/tensor_parallel.py.


def _parallel_forward(args: LinearFwdArgs) -> tuple[bool, str | None]:
    if not tp.tp_active(args):
        return False, None
    sp = args.sequence_parallel
    if args.parallel_mode == "column":
        return sp, None
    if sp:
        tp.check_dim0(args.inp.shape, args.tp_size, "the row-parallel input")
    return False, "reduce_scatter" if sp else "all_reduce"


def _backward_plan(args: LinearBwdArgs) -> _BackwardPlan:
    if not tp.tp_active(args):
        return _BackwardPlan(False, False, False, None)
    sp = args.sequence_parallel
    if args.parallel_mode == "row":
        # dy goes to the GEMMs quantized; quantized on the wire too unless the wgrad
        # GEMM reads a high-precision input (and so a high-precision dy).
        quantized = (
            sp
            and _backward_quantized(args)
            and tp.gathers_quantized(args.grad_output_quantizer, args.grad_outputs[0].shape)
            and (args.requires_dgrad or args.requires_wgrad)
            and (not args.requires_wgrad or _wgrad_reads_quantized(args))
        )
        return _BackwardPlan(sp, quantized, False, None)
    # Column parallel. The saved input is the local shard (high precision, or quantized
    # before the gather: gathers_quantized), re-gathered here as TE does (memory: one
    # shard kept, not tp_size of them); a quantized input gathered in high precision
    # was quantized after the forward's all-gather and is kept full-length.
    local = not _is_quantized(args.inputmat) or tp.gathers_quantized(
        args.input_quantizer, args.inp_shape
    )
    regather = sp and args.requires_wgrad and local
    reduce = None
    if args.requires_dgrad:
        reduce = "reduce_scatter" if sp else "all_reduce"
    return _BackwardPlan(False, False, regather, reduce)


def linear_output_shape(args: LinearFwdArgs) -> tuple[Any, ...]:
    """The forward output's shape: the input's leading dims, dim 0 multiplied (column +
    SP all-gather) or divided (row + SP reduce-scatter) by tp_size, and the local
    output features (the weight shard's rows)."""
    gather, reduce = _parallel_forward(args)
    lead = list(args.inp.shape[:-1])
    if gather:
        lead[0] = lead[0] * args.tp_size
    elif reduce == "reduce_scatter":
        lead[0] = lead[0] // args.tp_size
    return (*lead, args.weight.shape[0])


def _quantize_and_gather(
    x: torch.Tensor,
    quantizer: Quantizer,
    usage: _Usage,
    gather: _Usage,
    args: LinearFwdArgs | LinearBwdArgs,
) -> tuple[Any, Any]:
    """``(local, gathered)``: ``x`` (rows, k) quantized with ``usage`` (per-tensor FP8:
    rowwise; per-tensor formats with the amax of every rank's ``x``, a MAX all-reduce
    of two floats), and every rank's shard gathered with the usages ``gather``."""
    if isinstance(quantizer, Float8CurrentScalingQuantizer):
        stats = quantizer.amax_stats(x)
        dist.all_reduce(stats, op=dist.ReduceOp.MAX, group=tp.tp_group_of(args))
        local = _internal(quantizer, _Usage(True, False)).quantize_with_stats(x, stats)
    elif isinstance(quantizer, NVFP4Quantizer):
        local_quantizer = _internal(quantizer, usage)
        stats = local_quantizer.amax_stats(x)
        dist.all_reduce(stats, op=dist.ReduceOp.MAX, group=tp.tp_group_of(args))
        local = local_quantizer.quantize_with_stats(x, stats)
    else:
        local = _internal(quantizer, usage).quantize(x)
    return local, tp.all_gather_quantized(local, args, gather.rowwise, gather.columnwise)


def _overlapped_reduce_scatter(
    A: Any, B: Any, layout: str, config: GemmConfig, args: LinearFwdArgs | LinearBwdArgs
) -> torch.Tensor | None:
    """``gemm(A, B, layout)`` reduce-scattered along dim 0 by one fused op (plain, or FP8
    with tensorwise scales: the operands ``gemm`` itself would pass ``_scaled_mm``), or
    None where none serves (the caller runs the GEMM, then the collective)."""
    group = tp.tp_group_of(args)
    if comm_overlap.fused_reason(group) is not None:
        return None
    if type(A) in _PLAIN_TENSORS and type(B) in _PLAIN_TENSORS:
        right = A.t() if layout == "TN" else A  # TN: x @ W.t(); NN: dy @ W
        if comm_overlap.fused_reason(group, B, right) is not None:
            return None
        return comm_overlap.matmul_reduce_scatter(B, right, group)
    fp8 = _scaled_mm_operands(A, B, layout)
    out_dtype = args.activation_dtype
    if fp8 is None or out_dtype not in _CUDA_HALF or fp8[0].shape[0] % (16 * args.tp_size):
        return None
    a, b, scale_a, scale_b = fp8
    if comm_overlap.fused_reason(group, a, b) is not None:
        return None
    return comm_overlap.scaled_matmul_reduce_scatter(
        a,
        b,
        scale_a,
        scale_b,
        group,
        out_dtype=out_dtype,
        use_fast_accum=not config.use_split_accumulator,
    )


def _check_forward_input(args: LinearFwdArgs) -> None:
    """What the GEMM needs of the input, checked before any work so that the real kernel
    and the spec fake (under torch.compile) raise the same message."""
    inp, weight = args.inp, args.weight
    if len(inp.shape) == 0:
        raise ValueError("Linear: the input must have at least 1 dimension, got a 0-D tensor")
    if inp.device.type == "meta":
        raise ValueError(
            f"Linear: the input of shape {tuple(inp.shape)} is on the meta device (it has "
            "no data); move it, and the module, to cpu or cuda"
        )
    if inp.shape[-1] != weight.shape[-1]:
        raise ValueError(
            f"Linear: the input's last dim is {inp.shape[-1]} (input shape {tuple(inp.shape)}), "
            f"but the weight of shape {tuple(weight.shape)} expects {weight.shape[-1]} input "
            "features"
        )
    bias = args.bias
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        # (addmm would broadcast a bias of shape (1,) silently)
        raise ValueError(
            f"Linear: the bias has shape {tuple(bias.shape)}, but the weight of shape "
            f"{tuple(weight.shape)} has {weight.shape[0]} output features: one bias value "
            "each"
        )


def _check_columnwise_weight(quantizer: Quantizer) -> None:
    """Refuse, before any work, a quantized weight the backward's dgrad GEMM cannot read:
    one holding rowwise data only (``quantized_model_init`` under ``torch.no_grad``, as
    TE builds weights for inference) in a format whose columnwise data cannot be made
    from it (its scales differ per direction; per-tensor FP8 makes it exactly)."""
    if quantizer.columnwise_usage or quantizer.storage_cls.USAGES_SHARE_VALUES:
        return
    name = quantizer.wrapper_cls.__name__
    raise ValueError(
        f"LinearFwdArgs.weight: a {name} holding rowwise data only (quantized under "
        "torch.no_grad() or torch.inference_mode(), for inference, as TE builds "
        "quantized_model_init weights there) cannot serve the backward's dgrad GEMM, "
        f"which reads columnwise data that {name} cannot make from its rowwise data; "
        "build the module with gradients enabled to train it"
    )


def _weight_from_workspace(args: LinearFwdArgs) -> bool:
    """Whether the fprop GEMM reads the cached weight workspace (a later microbatch
    whose recipe quantizes the weight: a workspace left from a quantized run never
    replaces the weight of a call without one)."""
    return (
        args.weight_workspace is not None
        and args.weight_quantizer is not None
        and not args.is_first_microbatch
        and not _is_quantized(args.weight)
    )


def _forward_plan(args: LinearFwdArgs) -> _ForwardPlan:
    """Every forward decision, shared by the real kernel and the spec fake.

    Saved usages follow TE's Linear: the input is quantized rowwise (fprop GEMM) plus
    columnwise (wgrad) and only the columnwise data is kept once the fprop GEMM has
    run; a quantized weight made here is kept only in the usage dgrad reads
    (columnwise). A backward that does not run quantized GEMMs (``backward_override``,
    or no grad-output quantizer) reads the rowwise data (``DEQUANTIZED``) or the
    original tensors (``HIGH_PRECISION``: nothing quantized is kept). A weight made
    for the workspace cache keeps every usage it was made with: it is the cached
    workspace, held by the module anyway, and later microbatches' fprop GEMMs read its
    rowwise data. A sequence-parallel input gathered quantized (:func:`gathers_quantized`)
    is kept as TE keeps it, as the local shard the backward re-gathers: per-tensor FP8
    keeps its rowwise codes (TE's rowwise-only exception for gathered per-tensor FP8
    inputs), the block formats and NVFP4 the usage above; one gathered in high
    precision is quantized after the gather and kept full-length.
    """
    _check_forward_input(args)
    backward_quantized = args.backward_override is None and args.grad_output_quantizer is not None
    needs_wgrad = args.is_grad_enabled and args.weight_requires_grad
    needs_dgrad = args.is_grad_enabled and args.input_requires_grad
    keeps_quantized = args.backward_override is not BackwardOverride.HIGH_PRECISION
    backward_usage = _Usage(False, True) if backward_quantized else _Usage(True, False)
    if needs_dgrad and backward_quantized and _is_quantized(args.weight):
        _check_columnwise_weight(args.weight.quantizer)
    save_input = saved_input = None
    save_original = saves_original_input(args)
    if args.input_quantizer is not None and needs_wgrad and keeps_quantized and not save_original:
        save_input = _Usage(True, backward_quantized)
        saved_input = backward_usage
    from_workspace = _weight_from_workspace(args)
    quantize_weight = saved_weight = None
    if args.weight_quantizer is not None and not _is_quantized(args.weight) and not from_workspace:
        quantize_weight = _Usage(True, needs_dgrad and backward_quantized)
        if args.cache_weight:
            saved_weight = quantize_weight
        elif needs_dgrad and keeps_quantized:
            saved_weight = backward_usage
    quantized_output = args.fp8_output and args.output_quantizer is not None
    gather_input, reduce_output = _parallel_forward(args)
    gather_quantized = gather_input and tp.gathers_quantized(args.input_quantizer, args.inp.shape)
    per_tensor = isinstance(args.input_quantizer, Float8CurrentScalingQuantizer)
    if gather_quantized and per_tensor and save_input is not None:
        # TE keeps the local FP8 shard, rowwise (per-tensor FP8 gathers rowwise codes
        # only); the backward re-gathers it and makes the transpose there. Block formats
        # and NVFP4 keep the shard in the usage the backward reads and gather that.
        save_input = saved_input = _Usage(True, False)
    if save_original:
        # The backward quantizes the (gathered) input with these usages: a shape they
        # cannot take is refused now, as it is without save_original_input.
        rows = math.prod(args.inp.shape[:-1]) * (args.tp_size if gather_input else 1)
        usage = _Usage(True, backward_quantized)
        _check_quantizable(_internal(args.input_quantizer, usage), (rows, args.inp.shape[-1]))
    return _ForwardPlan(
        save_input,
        quantize_weight,
        from_workspace,
        quantized_output,
        gather_input,
        gather_quantized,
        reduce_output,
        saved_input,
        saved_weight,
        save_original,
    )


def requantizes_exactly(quantizer: Quantizer) -> bool:
    """Whether quantizing the same tensor again gives the same bits (TE's
    ``is_requantization_safe``): not a stateful quantizer (delayed scaling, whose scale
    moves between the forward and the backward) nor one that rounds stochastically."""
    stateless = getattr(quantizer, "value_opaque", True)
    return stateless and not getattr(quantizer, "stochastic_rounding", False)


def saves_original_input(args: LinearFwdArgs) -> bool:
    """Whether this call keeps its unquantized input for the backward, which quantizes
    it again (TE's ``save_original_input``): asked for, with an input quantizer, a
    weight gradient, a plain input and no ``backward_override`` (``HIGH_PRECISION``
    keeps the original input anyway, ``DEQUANTIZED`` the quantized one, as in TE). A
    quantizer whose second quantize could differ is refused: the module resolves TE's
    policy (an error for delayed scaling, a warning otherwise) before the op is called."""
    if not (
        args.save_original_input
        and args.input_quantizer is not None
        and args.is_grad_enabled
        and args.weight_requires_grad
        and args.backward_override is None
        and not _is_quantized(args.inp)
    ):
        return False
    if not requantizes_exactly(args.input_quantizer):
        raise ValueError(
            "LinearFwdArgs.save_original_input: the input quantizer "
            f"{type(args.input_quantizer).__name__} cannot quantize the original input again "
            "to the same values (stateful or stochastic); leave save_original_input False"
        )
    return True


def _keep_usage(value: Any, usage: _Usage | None) -> Any:
    """``value`` (a quantized value made by this forward) with only ``usage``'s buffers;
    the others are dropped in place (no data copy). None when ``usage`` is None."""
    if usage is None:
        return None
    value.update_usage(rowwise_usage=usage.rowwise, columnwise_usage=usage.columnwise)
    return value


def _internal(quantizer: Quantizer, usage: _Usage) -> Quantizer:
    return quantizer.with_usage(rowwise=usage.rowwise, columnwise=usage.columnwise).with_internal(
        True
    )


def _made_weight_quantizer(quantizer: Quantizer, usage: _Usage, cache_weight: bool) -> Quantizer:
    """The quantizer of a weight quantized in this call: it makes a storage, or with
    ``cache_weight`` a wrapper tensor. The workspace a module keeps across microbatches
    is state a compiled graph writes (flag True) and reads (flag False), and only a
    tensor can cross a graph's boundary that way (a storage cannot be built inside a
    traced call); TE keeps its cache entries as wrappers too."""
    return _internal(quantizer, usage).with_internal(not cache_weight)


def _check_supported(args: LinearFwdArgs | LinearBwdArgs, flags: tuple[str, ...]) -> None:
    for flag in flags:
        if getattr(args, flag):
            raise ValueError(
                f"{type(args).__name__}.{flag}: userbuffers communication overlap is not "
                "implemented by this library; leave it False"
            )


_FWD_UB_FLAGS = ("ub_overlap_ag_fprop", "ub_overlap_rs_fprop")
_BWD_UB_FLAGS = ("ub_overlap_ag_dgrad", "ub_overlap_rs_dgrad", "ub_bulk_wgrad")


# --- Forward ---------------------------------------------------------------------


def _forward_input(args: LinearFwdArgs, plan: _ForwardPlan) -> tuple[Any, Any, Any]:
    """``(x, x_saved, overlap)``: the fprop GEMM's input (cast, gathered, quantized as
    the plan says), the quantized input kept for the backward where it is not ``x``
    (a sequence-parallel shard gathered quantized), and the group of a fused
    all-gather GEMM (None: ``x`` is gathered already)."""
    inp, dtype = args.inp, args.activation_dtype
    if type(inp) in _PLAIN_TENSORS and len(inp.shape) == 2 and inp.dtype == dtype:
        x = inp  # what the reshape and cast would return (a tensor subclass takes them)
    else:
        x = inp.reshape(-1, inp.shape[-1]).to(dtype)
    hp_gemm = args.input_quantizer is None and args.weight_quantizer is None
    calibrating = args.calibration_quantizers is not None
    # Calibration reads the whole (gathered) input: no gather fused into the GEMM.
    overlap = tp.overlap_group(
        args, plan.gather_input and hp_gemm and not calibrating, x, args.weight
    )
    x_saved = None
    if plan.gather_quantized:
        # Quantize the shard (per-tensor FP8: with the group's amax), gather its rowwise
        # data for the fprop GEMM (TE's way); the backward re-gathers the kept shard.
        usage = plan.save_input or _Usage(True, False)
        rowwise = _Usage(True, False)
        x_saved, x = _quantize_and_gather(x, args.input_quantizer, usage, rowwise, args)
    else:
        if plan.gather_input and overlap is None:
            # High precision on the wire, quantized once gathered (the fused overlap
            # gathers inside its GEMM).
            x = tp.all_gather_rows(x, args)
        if args.input_quantizer is not None:
            usage = plan.save_input or _Usage(True, False)
            x = _internal(args.input_quantizer, usage).quantize(x)
    return x, x_saved, overlap


def _forward_weight(args: LinearFwdArgs, plan: _ForwardPlan) -> Any:
    """The fprop GEMM's weight: the cached workspace, the weight quantized here, or the
    weight itself (cast to the activation dtype)."""
    weight, dtype = args.weight, args.activation_dtype
    if plan.weight_from_workspace:
        return args.weight_workspace
    if plan.quantize_weight is not None:
        quantizer = _made_weight_quantizer(
            args.weight_quantizer, plan.quantize_weight, args.cache_weight
        )
        return quantizer.quantize(weight.to(dtype))
    if weight.dtype != dtype and not _is_quantized(weight):
        return weight.to(dtype)
    return weight


def linear_forward(args: LinearFwdArgs) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """``(outputs, saved)``: ``outputs == (out,)``; ``saved == (input, weight)`` holds the
    quantized tensors made here that the backward reads, or that the module caches as
    its weight workspace, each with only the usages :func:`_forward_plan` keeps (None
    where nothing is kept)."""
    _check_supported(args, _FWD_UB_FLAGS)
    plan = _forward_plan(args)
    inp, dtype = args.inp, args.activation_dtype
    x, x_saved, overlap = _forward_input(args, plan)
    weight = _forward_weight(args, plan)
    if args.calibration_quantizers is not None:
        _calibrate(args.calibration_quantizers, (x, weight))
    bias = args.bias
    if bias is not None and bias.dtype != dtype:
        bias = bias.to(dtype)
    out = None
    if overlap is not None:
        _, out = comm_overlap.all_gather_matmul(x, weight.t(), overlap, return_gathered=False)
    elif plan.reduce_output == "reduce_scatter":
        out = _overlapped_reduce_scatter(weight, x, "TN", args.fprop_gemm, args)
    fused = out is not None
    if not fused:
        out = gemm(
            weight,
            x,
            layout="TN",
            out_dtype=args.activation_dtype,
            bias=None if plan.reduce_output else bias,
            use_split_accumulator=args.fprop_gemm.use_split_accumulator,
        )
        out = tp.reduce(out, plan.reduce_output, args)
    if plan.reduce_output or fused:
        # Row parallel (or a fused GEMM, which takes no bias): add the (full) bias once,
        # after the reduction, in fp32 as the GEMM epilogue does.
        if bias is not None:
            dtype = math_dtype(out.dtype)
            out = (out.to(dtype) + bias.to(dtype)).to(args.activation_dtype)
    if len(inp.shape) != 2 or plan.gather_input or plan.reduce_output:
        out = out.view(linear_output_shape(args))
    if plan.quantized_output:
        out = args.output_quantizer.with_internal(False).quantize(out)
    # The fprop GEMM has run: keep only what the backward reads.
    saved_input = _keep_usage(x if x_saved is None else x_saved, plan.saved_input)
    saved_weight = _keep_usage(weight, plan.saved_weight)
    return (out,), (saved_input, saved_weight)


def linear_saved(args: LinearFwdArgs) -> tuple[Any, Any]:
    """What :func:`linear_forward` returns as ``saved``, made by the same code without
    the fprop GEMM: the quantized input and weight the backward reads (LayerNormMLP's
    recompute of fc2's backward operands, whose output it does not need again)."""
    _check_supported(args, _FWD_UB_FLAGS)
    plan = _forward_plan(args)
    saved_input = saved_weight = None
    if plan.saved_input is not None:
        x, x_saved, _ = _forward_input(args, plan)
        saved_input = _keep_usage(x if x_saved is None else x_saved, plan.saved_input)
    if plan.saved_weight is not None:
        saved_weight = _keep_usage(_forward_weight(args, plan), plan.saved_weight)
    return saved_input, saved_weight


def _calibrate(quantizers: list[Optional[Quantizer]], operands: tuple[Any, ...]) -> None:
    """TE's calibration: each GEMM operand's quantizer records what quantizing the
    operand would (a delayed-scaling amax; nothing for the stateless formats)."""
    if len(quantizers) != len(operands):
        raise ValueError(
            f"LinearFwdArgs.calibration_quantizers: {len(quantizers)} quantizers for the "
            f"GEMM's {len(operands)} operands (input, weight)"
        )
    for quantizer, operand in zip(quantizers, operands, strict=True):
        if quantizer is not None:
            quantizer.calibrate(operand)


def _check_quantizable(quantizer: Any, shape: Any) -> None:
    """``quantizer.check_shape(shape)``; a refused symbolic shape (``dynamic=True``) is
    reported with its concrete sizes, as the eager kernel reports it (the trace fails
    anyway, so specializing the sizes costs nothing)."""
    try:
        quantizer.check_shape(tuple(shape))
    except ValueError:
        quantizer.check_shape(tuple(int(d) for d in shape))
        raise


def linear_forward_spec(args: LinearFwdArgs) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """What :func:`linear_forward` returns, as TensorSpecs (tensor fields are specs)."""
    _wgrad.refuse_traced("LinearFwdArgs", args.fuse_wgrad_accumulation, args.delay_wgrad_compute)
    plan = _forward_plan(args)
    inp, device, dtype = args.inp, args.inp.device, args.activation_dtype
    rows = math.prod(inp.shape[:-1]) * (args.tp_size if plan.gather_input else 1)
    # Check the shapes the kernel quantizes, in its order (input, then weight), so a shape
    # a format cannot take raises the same error compiled as eagerly.
    if args.input_quantizer is not None:
        usage = plan.save_input or _Usage(True, False)
        _check_quantizable(_internal(args.input_quantizer, usage), (rows, inp.shape[-1]))
    if not plan.weight_from_workspace and plan.quantize_weight is not None:
        _check_quantizable(
            _internal(args.weight_quantizer, plan.quantize_weight), args.weight.shape
        )
    out_shape = linear_output_shape(args)
    out_quantizer = args.output_quantizer.with_internal(False) if plan.quantized_output else None
    out = TensorSpec(out_shape, dtype, out_quantizer, device=device)
    saved_input = None
    if plan.saved_input is not None:
        quantizer = _internal(args.input_quantizer, plan.saved_input)
        saved_rows = math.prod(inp.shape[:-1]) if plan.gather_quantized else rows
        saved_input = TensorSpec((saved_rows, inp.shape[-1]), dtype, quantizer, device=device)
    saved_weight = None
    if plan.saved_weight is not None:
        quantizer = _made_weight_quantizer(
            args.weight_quantizer, plan.saved_weight, args.cache_weight
        )
        saved_weight = TensorSpec(tuple(args.weight.shape), dtype, quantizer, device=device)
    return (out,), (saved_input, saved_weight)


def linear_setup_context(
    args: LinearFwdArgs, outputs: tuple[Any, ...], saved: tuple[Any, ...]
) -> dict[str, Any]:
    """The backward bundle: what the forward kept, and the backward's configuration
    (the backward reads no output)."""
    saved_input, saved_weight = saved
    needs_wgrad = args.is_grad_enabled and args.weight_requires_grad
    needs_dgrad = args.is_grad_enabled and args.input_requires_grad
    inputmat = None
    if needs_wgrad:
        inputmat = saved_input if saved_input is not None else args.inp
    weight = None
    if needs_dgrad:
        if args.backward_override is BackwardOverride.HIGH_PRECISION:
            weight = args.weight  # the original weight, as TE's high-precision backward
        elif saved_weight is not None:
            weight = saved_weight
        elif _weight_from_workspace(args):
            weight = args.weight_workspace
        else:
            weight = args.weight
    return dict(
        inputmat=inputmat,
        weight_fp8=weight,
        inp_shape=args.inp.shape,
        requires_dgrad=needs_dgrad,
        requires_wgrad=needs_wgrad,
        use_bias=args.bias is not None and args.bias_requires_grad and args.is_grad_enabled,
        ub_overlap_ag_dgrad=False,
        ub_overlap_rs_dgrad=False,
        ub_bulk_wgrad=False,
        wgrad_store=None,
        main_grad_func=None,
        wgrad_route=_wgrad.route_of(
            args.weight,
            args.fuse_wgrad_accumulation,
            args.delay_wgrad_compute,
            args.is_first_microbatch,
        )
        if needs_wgrad
        else None,
        save_original_input=needs_wgrad and saved_input is None and saves_original_input(args),
    )


# --- Backward --------------------------------------------------------------------


def _backward_quantized(args: LinearBwdArgs) -> bool:
    return args.backward_override is None and args.grad_output_quantizer is not None


def _wgrad_reads_quantized(args: LinearBwdArgs) -> bool:
    """Whether the wgrad GEMM's input is quantized: kept so, or the original input the
    backward quantizes (``save_original_input``)."""
    return _is_quantized(args.inputmat) or args.save_original_input


def _requantized_input(x: torch.Tensor, args: LinearBwdArgs, quantized: bool) -> Any:
    """The original input ``x`` (rows, k; gathered) quantized as the forward would have
    kept it without ``save_original_input``: columnwise for a quantized wgrad GEMM,
    rowwise (to dequantize) otherwise. Each usage of these formats is made from the
    data alone, so the bits are those the forward would have made."""
    usage = _Usage(not quantized, quantized)
    return _internal(args.input_quantizer, usage).quantize(x)


def _high_precision(value: Any, dtype: torch.dtype) -> Any:
    if isinstance(value, QuantizedData):
        return value.dequantize(dtype)
    return value if value.dtype == dtype else value.to(dtype)


def _wgrad_input(inputmat: Any, dtype: torch.dtype) -> torch.Tensor:
    """The saved input as the high-precision (rows, k) matrix the wgrad GEMM reads."""
    x = _high_precision(inputmat, dtype)
    return x if len(x.shape) == 2 else x.reshape(-1, x.shape[-1])


def _check_no_double_backward(args: LinearBwdArgs) -> None:
    """A quantized backward is not differentiable (quantization has no useful second
    derivative, and the GEMMs read quantized codes): refuse ``create_graph=True`` rather
    than return a gradient silently detached from the graph."""
    # Grad mode inside a backward the autograd engine runs means create_graph=True (a
    # direct call of the op, e.g. by opcheck, is not inside a graph task).
    in_backward = current_graph_task_id() != -1
    if args.fp8 and torch.is_grad_enabled() and in_backward:
        raise RuntimeError(
            "Linear: backward with create_graph=True (double backward) is not supported "
            "under a quantized recipe; run the backward with create_graph=False, or without "
            "autocast"
        )


def linear_backward(args: LinearBwdArgs) -> tuple[torch.Tensor | None, ...]:
    """Gradients of ``(inp, weight, bias)``; None for those not required."""
    _check_supported(args, _BWD_UB_FLAGS)
    _check_no_double_backward(args)
    plan = _backward_plan(args)
    dtype = args.activation_dtype
    grad_output = args.grad_outputs[0]
    if (
        type(grad_output) in _PLAIN_TENSORS
        and len(grad_output.shape) == 2
        and grad_output.dtype == dtype
    ):
        dy = grad_output
    else:
        dy = grad_output.reshape(-1, grad_output.shape[-1]).to(dtype)
    quantized = _backward_quantized(args)
    weight = dgrad = None
    if args.requires_dgrad:
        weight = args.weight_fp8 if quantized else _high_precision(args.weight_fp8, dtype)
    fuse_gather = plan.gather_grad_output and args.requires_dgrad and not quantized
    overlap = tp.overlap_group(args, fuse_gather, dy, weight)
    dy_gemm = dy
    bgrad = None
    if overlap is not None:
        # Row parallel: the gathered dy also feeds wgrad and the bias grad below.
        dy, dgrad = comm_overlap.all_gather_matmul(dy, weight, overlap, return_gathered=True)
        dy_gemm = dy
    elif plan.gather_grad_output_quantized:
        # Row parallel + SP: dy quantized (per-tensor FP8: with the group's amax) and
        # gathered quantized (TE's way); the bias gradient from each rank's rows. The
        # GEMMs read only dy_gemm.
        if args.use_bias:
            bgrad = tp.gathered_bias_grad(dy, args)
        usage = _Usage(args.requires_dgrad, args.requires_wgrad)
        gq = args.grad_output_quantizer
        dy = dy_gemm = _quantize_and_gather(dy, gq, usage, usage, args)[1]
    elif plan.gather_grad_output:
        dy = dy_gemm = tp.all_gather_rows(dy, args)
    pending_input = None
    hp_input = not isinstance(args.inputmat, QuantizedData)
    if plan.gather_input and hp_input and comm_overlap.enabled(tp.tp_group_of(args)):
        # Column + SP: the wgrad input's re-gather travels behind the dgrad GEMM.
        pending_input = comm_overlap.start_all_gather_rows(
            _wgrad_input(args.inputmat, dtype), tp.tp_group_of(args)
        )
    if quantized and not plan.gather_grad_output_quantized:
        usage = _Usage(args.requires_dgrad, args.requires_wgrad)
        if usage.rowwise or usage.columnwise:
            quantizer = _internal(args.grad_output_quantizer, usage)
            # With a bias, its gradient comes from the pass that quantizes dy.
            quantized_dy = quantize_gradient(
                quantizer,
                dy,
                args.sr_rng_state,
                "LinearBwdArgs.sr_rng_state",
                with_bias_grad=args.use_bias,
            )
            if args.use_bias:
                dy_gemm, bgrad = quantized_dy
            else:
                dy_gemm = quantized_dy
    wgrad = None
    if args.requires_dgrad:
        if plan.reduce_dgrad == "reduce_scatter":
            dgrad = _overlapped_reduce_scatter(weight, dy_gemm, "NN", args.dgrad_gemm, args)
        if dgrad is None:  # (unless a fused all-gather or reduce-scatter computed it)
            dgrad = gemm(
                weight,
                dy_gemm,
                layout="NN",
                out_dtype=dtype,
                use_split_accumulator=args.dgrad_gemm.use_split_accumulator,
            )
            dgrad = tp.reduce(dgrad, plan.reduce_dgrad, args)
        if len(args.inp_shape) != 2:  # a 2-D input's gradient has its shape already
            dgrad = dgrad.view(args.inp_shape)
    if args.requires_wgrad:
        x = args.inputmat
        gathered = False
        if pending_input is not None:
            x = pending_input.wait()
            gathered = True
        elif plan.gather_input and isinstance(x, QuantizedData):
            # The local quantized shard the forward kept: gathered quantized, in the
            # layout the wgrad GEMM reads (columnwise; rowwise to dequantize).
            x = tp.all_gather_quantized(x, args, rowwise=not quantized, columnwise=quantized)
            gathered = True
        if args.save_original_input and not isinstance(x, QuantizedData):
            x = _wgrad_input(x, dtype)
            if plan.gather_input and not gathered:
                x = tp.all_gather_rows(x, args)
                gathered = True
            x = _requantized_input(x, args, quantized)
        if not (quantized and isinstance(x, QuantizedData)):
            x = _wgrad_input(x, dtype)
            if plan.gather_input and not gathered:
                x = tp.all_gather_rows(x, args)
        dy_wgrad = dy_gemm if quantized and isinstance(x, QuantizedData) else dy
        split = args.wgrad_gemm.use_split_accumulator

        def wgrad_gemm(out_dtype: torch.dtype) -> torch.Tensor:
            return gemm(x, dy_wgrad, layout="NT", out_dtype=out_dtype, use_split_accumulator=split)

        if args.wgrad_route is None:
            wgrad = wgrad_gemm(dtype)
        else:  # into main_grad, or deferred to backward_dw (ops/_wgrad.py)
            wgrad = _wgrad.send(args.wgrad_route, wgrad_gemm, dtype)
    if args.use_bias:
        bgrad = _bias_grad(dy, dtype) if bgrad is None else bgrad.to(dtype)
    return dgrad, wgrad, bgrad


_CUDA_HALF = (torch.bfloat16, torch.float16)


@exact("bias_grad(Tensor dy, ScalarType dtype) -> Tensor")
def _bias_grad(dy: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``dy``'s column sums in ``dtype``: accumulated in fp32 straight from ``dy`` (no
    fp32 copy of it: ~110 us a layer at 4096x8192 on an H200), rounded once. On CUDA a
    16-bit ``sum`` is exactly that in one kernel (fp32 accumulator, one rounding; the
    same bits as the fp32 sum cast, tested on the GPU), which saves a launch a layer."""
    if dy.dtype == dtype and dtype in _CUDA_HALF and dy.is_cuda:
        return dy.sum(0)
    total = dy.sum(0, dtype=math_dtype(dy.dtype))
    return total if total.dtype == dtype else total.to(dtype)


def linear_backward_spec(args: LinearBwdArgs) -> tuple[TensorSpec | None, ...]:
    """What :func:`linear_backward` returns, as TensorSpecs. The collectives leave these
    shapes unchanged: dgrad is reduced back to the local input's shape, wgrad and the
    bias grad have the local weight shard's shapes."""
    _backward_plan(args)  # the same validation as the real kernel
    dtype = args.activation_dtype
    grad_output = args.grad_outputs[0]
    device = grad_output.device
    n, k = grad_output.shape[-1], args.inp_shape[-1]
    dgrad = TensorSpec(tuple(args.inp_shape), dtype, device=device) if args.requires_dgrad else None
    wgrad = TensorSpec((n, k), dtype, device=device) if args.requires_wgrad else None
    bgrad = TensorSpec((n,), dtype, device=device) if args.use_bias else None
    return dgrad, wgrad, bgrad


# --- the plain eager call (the declaration's ``plain_call``) ------------------------


class _PlainLinear(torch.autograd.Function):
    """The eager call of the commonest case (:func:`linear_plain_call` says exactly
    when). It computes what the impls compute for that case, through the same kernels
    (the branch ``gemm`` takes for such operands, ``plain_product``; ``_bias_grad``), so
    the bits are the same (tested against the op path), without the field checks and
    the backward bundle that every other call pays for: on the H200's host those cost
    ~85 us a layer over a minimal ``autograd.Function``, and ``torch.nn.Linear``'s whole
    step is ~150 us a layer."""

    @staticmethod
    def forward(
        ctx: Any, inp: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor:
        # What linear_setup_context keeps: the input for wgrad, the weight for dgrad.
        needs_dgrad, needs_wgrad, needs_bgrad = ctx.needs_input_grad
        ctx.save_for_backward(inp if needs_wgrad else None, weight if needs_dgrad else None)
        ctx.use_bias = bias is not None and needs_bgrad
        dtype = ctx.dtype = inp.dtype
        return plain_product(weight, inp, "TN", bias, dtype)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        inp, weight = ctx.saved_tensors
        dtype = ctx.dtype
        if type(dy) in _PLAIN_TENSORS and dy.dim() == 2 and dy.dtype == dtype:
            # Autograd hands the output's device and shape: what plain_product needs.
            dgrad = plain_product(weight, dy, "NN", None, dtype) if weight is not None else None
            wgrad = plain_product(inp, dy, "NT", None, dtype) if inp is not None else None
        else:
            dy = dy.reshape(-1, dy.shape[-1]).to(dtype)  # as linear_backward reads it
            dgrad = gemm(weight, dy, layout="NN", out_dtype=dtype) if weight is not None else None
            wgrad = gemm(inp, dy, layout="NT", out_dtype=dtype) if inp is not None else None
        bgrad = _bias_grad(dy, dtype) if ctx.use_bias else None
        return dgrad, wgrad, bgrad


def linear_plain_call(
    weight: Any,
    inp: Any,
    bias: Any,
    weight_workspace: Any,
    input_requires_grad: bool,
    weight_requires_grad: bool,
    bias_requires_grad: bool,
    input_quantizer: Any,
    weight_quantizer: Any,
    output_quantizer: Any,
    grad_input_quantizer: Any,
    grad_weight_quantizer: Any,
    grad_output_quantizer: Any,
    activation_dtype: torch.dtype,
    fp8: bool,
    backward_override: Any,
    is_first_microbatch: bool | None,
    parallel_mode: str | None,
    tp_group: Any,
    tp_size: int,
    sequence_parallel: bool,
    in_features: int,
    out_features: int,
    ub_overlap_ag_fprop: bool,
    ub_overlap_rs_fprop: bool,
    ub_name: str | None,
    wgrad_store: Any,
    is_grad_enabled: bool,
    sr_rng_state: Any,
    fuse_wgrad_accumulation: bool,
    delay_wgrad_compute: bool,
    calibration_quantizers: Any,
) -> tuple[torch.Tensor] | None:
    """``linear_forward``'s outputs for a plain eager call, through :class:`_PlainLinear`
    (torch's own ``linear`` for contiguous 16-bit CUDA tensors, the same kernels):
    no recipe or workspace, one rank, no wgrad scheduling, plain 2-D tensors of the
    activation dtype on one CPU or CUDA device, and requires-grad flags that say what
    the tensors say. None for any other call, which the generic path serves (and
    reports, when something is wrong with it). The generated ``call_linear`` passes the
    fields named here (positionally, in this order) before it builds a bundle; the fields left out (``fp8_output``,
    ``cache_weight``, the GEMM configurations) change nothing for such a call."""
    dtype = activation_dtype
    if (
        fp8
        or input_quantizer is not None
        or weight_quantizer is not None
        or output_quantizer is not None
        or grad_input_quantizer is not None
        or grad_weight_quantizer is not None
        or grad_output_quantizer is not None
        or backward_override is not None
        or weight_workspace is not None
        or is_first_microbatch is not None
        or tp_group is not None
        or tp_size != 1
        or parallel_mode is not None
        or sequence_parallel
        or ub_overlap_ag_fprop
        or ub_overlap_rs_fprop
        or ub_name is not None
        or wgrad_store is not None
        or sr_rng_state is not None
        or fuse_wgrad_accumulation
        or delay_wgrad_compute
        or calibration_quantizers is not None
        or type(inp) not in _PLAIN_TENSORS
        or type(weight) not in _PLAIN_TENSORS
        or (bias is not None and type(bias) not in _PLAIN_TENSORS)
    ):
        return None
    # The tensors' checks, the cheap reads first (``Tensor.device`` builds an object,
    # and its ``.type`` costs ~0.4 us).
    device = inp.device
    if (
        inp.dim() != 2
        or inp.dtype != dtype
        or weight.dtype != dtype
        or weight.shape != (out_features, in_features)
        or inp.shape[1] != in_features
        or not (inp.is_cuda or inp.is_cpu)
        or weight.device != device
        or (
            bias is not None
            and (bias.dtype != dtype or bias.shape != (out_features,) or bias.device != device)
        )
        or is_grad_enabled is not torch.is_grad_enabled()
        or input_requires_grad is not inp.requires_grad
        or weight_requires_grad is not weight.requires_grad
        or bias_requires_grad is not (bias is not None and bias.requires_grad)
    ):
        return None
    if is_grad_enabled and (input_requires_grad or weight_requires_grad or bias_requires_grad):
        if inp.is_cuda and dtype in _CUDA_HALF and inp.is_contiguous() and weight.is_contiguous():
            # torch's own autograd runs the kernels _PlainLinear runs, with no Python
            # forward or backward (~20-30 us a layer on the H200's host): ``linear`` is
            # ``addmm(bias, inp, weight.t())`` (``mm`` without a bias), whose backward
            # for row-major operands is ``mm(dy, weight)``, ``mm(dy.t(), inp)`` and the
            # bias's ``dy.sum(0)`` (tested bitwise against the op path on the GPU).
            return (torch.nn.functional.linear(inp, weight, bias),)
        return (_PlainLinear.apply(inp, weight, bias),)
    return (plain_product(weight, inp, "TN", bias, dtype),)


LINEAR = OpDeclaration(
    name="linear",
    forward=LinearFwdArgs,
    backward=LinearBwdArgs,
    grad_fields=("inp", "weight", "bias"),
    forward_impl=linear_forward,
    backward_impl=linear_backward,
    forward_spec=linear_forward_spec,
    backward_spec=linear_backward_spec,
    setup_context=linear_setup_context,
    # Backward fields setup_context computes although a forward field has their name.
    derived=("wgrad_store", "save_original_input"),
    lowers=True,
    plain_call=linear_plain_call,
    # Compiled calls that run eagerly, with the reason (the generated compile blocker).
    eager_when=(
        ("quantized(inp)", "a quantized input tensor"),
        (
            "fuse_wgrad_accumulation",
            "fused wgrad accumulation into main_grad (fuse_wgrad_accumulation)",
        ),
        ("delay_wgrad_compute", "delayed wgrad compute (delay_wgrad_compute, run by backward_dw)"),
        (
            "fp8_output and is_grad_enabled",
            "fp8_output=True with autograd enabled (a differentiable quantized output)",
        ),
    ),
)


@examples(LinearFwdArgs)
def linear_examples(recipe: Any, device: torch.device) -> list[LinearFwdArgs]:
    """Bundles the lowering is checked on (``tests/runtime/lowering_check.py``): a 3-D input,
    with and without a bias, in bf16 and fp32, and one keeping its original input."""
    from transformer_engine_ops.ops import _examples

    # (seed, dtype, bias, save_original_input): TE's save_original_input once, on tensors
    # of its own (a tensor two calls share sums two gradients), where the recipe's input
    # quantizer can quantize again (as the op requires).
    cases = [
        (seed, dtype, bias, False)
        for seed, dtype in enumerate(_examples.DTYPES)
        for bias in (True, False)
    ]
    input_quantizer = recipe.make_quantizer("input") if recipe else None
    if input_quantizer is not None and requantizes_exactly(input_quantizer):
        cases.append((len(_examples.DTYPES), _examples.DTYPES[0], True, True))
    bundles = []
    per_seed: dict[int, Any] = {}  # one random stream and one set of quantizers a seed
    for seed, dtype, with_bias, save_original in cases:
        if seed not in per_seed:
            per_seed[seed] = (
                _examples.random_tensors(seed, dtype, device),
                _examples.quantizer_fields(recipe),
            )
        make, quantizers = per_seed[seed]
        bias = make(32) if with_bias else None
        bundles.append(
            LinearFwdArgs(
                weight=make(32, 64),
                inp=make(4, 16, 64),
                bias=bias,
                weight_workspace=None,
                input_requires_grad=True,
                weight_requires_grad=True,
                bias_requires_grad=bias is not None,
                **quantizers,
                activation_dtype=dtype,
                fp8_output=False,
                backward_override=None,
                **_examples.gemm_fields(recipe),
                is_first_microbatch=None,
                cache_weight=False,
                parallel_mode=None,
                tp_group=None,
                tp_size=1,
                sequence_parallel=False,
                in_features=64,
                out_features=32,
                ub_overlap_ag_fprop=False,
                ub_overlap_rs_fprop=False,
                ub_name=None,
                wgrad_store=None,
                is_grad_enabled=True,
                sr_rng_state=_examples.rng_state(quantizers, device),
                save_original_input=save_original,
            )
        )
    return bundles
