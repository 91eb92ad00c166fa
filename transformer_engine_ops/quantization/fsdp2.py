"""FSDP2's all-gather extension for per-tensor FP8 parameters (``quantized_model_init``).

``torch.distributed.fsdp.fully_shard`` shards a parameter by rows of dim 0 and, before
each forward and backward, all-gathers the shards. A :class:`Float8Tensor` parameter
implements FSDP2's hooks (``fsdp_pre_all_gather`` / ``fsdp_post_all_gather``, called
with the shard, on every rank in the same order) with the functions here, so what
crosses the wire is the shard's FP8 codes (one byte an element) and its scale inverse,
not a high-precision copy, as TE's ``Float8Tensor`` does.

One scale per tensor means every shard must be encoded with the same scale. The shards
made by ``fully_shard`` are row blocks of one quantized tensor (the codes and the scale
copied exactly), and a shard requantized in place (an optimizer step) takes its scale
from the amax of the whole parameter: the maximum over the shard group, all-reduced
(TE's ``amax_reduction_group``, which TE's hook sets to the FSDP mesh's group, as this
one does). The all-gather carries every shard's scale inverse, and the gathered tensor
is refused when they differ, instead of decoding some rows with another rank's scale.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.distributed as dist

from ..runtime import _torch_private as _private
from .encoding import has_inf, tensor_amax
from .quantizer import QuantizedTensor, value_opaque_reason

__all__ = ["amax_group", "post_all_gather", "pre_all_gather", "quantize_with_group_amax"]

# The attribute of a shard that holds its amax-reduction group (set by ``pre_all_gather``
# on the shard FSDP2 keeps; a per-parameter value, never module-level state).
_GROUP_ATTR = "_teops_fsdp2_amax_group"


def amax_group(shard: QuantizedTensor) -> Optional[Any]:
    """The process group whose amax a requantization of ``shard`` reduces over, or None
    for a tensor FSDP2 has not gathered (a plain quantized parameter)."""
    return shard.__dict__.get(_GROUP_ATTR)


def _refuse(shard: QuantizedTensor, orig_size: torch.Size, why: str) -> RuntimeError:
    return RuntimeError(
        f"fully_shard: the {shard.quantizer.format_name} parameter "
        f"({type(shard).__name__}, unsharded shape {tuple(orig_size)}) cannot be "
        f"all-gathered in FP8: {why}"
    )


def pre_all_gather(
    shard: QuantizedTensor, mesh: Any, orig_size: torch.Size
) -> tuple[tuple[torch.Tensor, ...], tuple[bool]]:
    """What FSDP2 all-gathers for ``shard``: its rowwise codes (uint8, the shard's
    shape) and its scale inverse (fp32, one element), plus whether the gathered tensor
    keeps columnwise (transposed) codes as the shard does, derived after the gather."""
    reason = value_opaque_reason(shard.quantizer)
    if reason is not None:
        raise _refuse(
            shard,
            orig_size,
            "its scale comes from quantizer state that each rank updates from its own "
            f"shard ({reason}); use FP8 current scaling",
        )
    world = mesh.size()
    if len(orig_size) == 0 or orig_size[0] % world:
        raise _refuse(
            shard,
            orig_size,
            f"dim 0 must divide evenly over the {world} ranks of the FSDP mesh (every "
            "shard a whole block of rows; a padded shard has no single FP8 scale)",
        )
    object.__setattr__(shard, _GROUP_ATTR, mesh.get_group() if world > 1 else None)
    rowwise = shard._inner_dict()
    codes = rowwise.get("_data")
    if codes is None:
        codes = shard._derive_usage(columnwise=False)["_data"]
    return (codes, shard._scale_inv), (shard.columnwise_usage,)


def post_all_gather(
    shard: QuantizedTensor,
    outputs: tuple[torch.Tensor, ...],
    metadata: tuple[bool],
    param_dtype: torch.dtype,
    out: Optional[QuantizedTensor],
) -> Optional[tuple[QuantizedTensor, tuple[torch.Tensor, ...]]]:
    """The unsharded FP8 tensor from the gathered codes and scales: a new one (first
    gather), or ``out`` (FSDP2's tensor from the first gather) refilled in place."""
    codes, scale_invs = outputs
    (columnwise,) = metadata
    scale_invs = scale_invs.reshape(-1)
    scale_inv = scale_invs[:1]
    if not torch.equal(scale_invs, scale_inv.expand_as(scale_invs)):
        raise RuntimeError(
            f"fully_shard: the shards of an FP8 parameter of shape {tuple(codes.shape)} "
            f"hold different scales ({scale_invs.tolist()}): their codes cannot form one "
            "per-tensor FP8 tensor; write the parameter through in-place ops on the "
            "sharded parameter (an optimizer step), which requantize with the amax of "
            "the whole parameter"
        )
    if out is not None:
        # The same values the last gather gave (the parameter changes only between
        # steps, through the shards): the forward's saved buffers stay valid.
        object.__setattr__(out, "_data", codes)
        with _private.preserve_version_counter(out._scale_inv):
            out._scale_inv.copy_(scale_inv)
        if out._transpose is not None:
            with _private.preserve_version_counter(out._transpose):
                out._transpose.copy_(out._derive_usage(columnwise=True)["_transpose"])
        return None
    quantizer = shard.quantizer.with_usage(rowwise=True, columnwise=False)
    full = type(shard)(
        {"_data": codes, "_scale_inv": scale_inv.clone()}, quantizer=quantizer, dtype=param_dtype
    )
    if columnwise:
        full.update_usage(columnwise_usage=True)
    kept = (codes, scale_invs) + ((full._transpose,) if columnwise else ())
    return full, kept


def quantize_with_group_amax(
    shard: QuantizedTensor, value: torch.Tensor, group: Any
) -> dict[str, torch.Tensor]:
    """The inner buffers of ``value`` (this rank's rows of a parameter) quantized with
    the scale of the whole parameter: its amax and Inf flag all-reduced (MAX) over
    ``group``, then the shard quantized by the parameter's own quantizer with that amax
    appended as one extra element (the scale is a function of the amax alone, so the
    codes and the scale are bit for bit those of quantizing the whole parameter)."""
    flat = value.reshape(-1)
    stats = torch.stack([tensor_amax(flat), has_inf(flat).float()])
    dist.all_reduce(stats, op=dist.ReduceOp.MAX, group=group)
    extra = torch.where(stats[1] > 0, torch.full_like(stats[0], float("inf")), stats[0])
    padded = torch.cat([flat, extra.reshape(1).to(flat.dtype)])
    quantizer = shard.quantizer.with_internal(True).with_usage(rowwise=True, columnwise=False)
    encoded = quantizer.quantize(padded)
    fresh = type(shard)(
        {"_data": encoded._data[:-1].reshape(value.shape), "_scale_inv": encoded._scale_inv},
        quantizer=shard.quantizer,
        dtype=shard.dtype,
    )
    if shard.columnwise_usage:
        fresh.update_usage(columnwise_usage=True)
    if not shard.rowwise_usage:
        fresh.update_usage(rowwise_usage=False)
    return fresh._inner_dict()
