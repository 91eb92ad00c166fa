"""TE 2.20's fused MoE router functions (``transformer_engine.pytorch.router``), each on a
generated op (``ops/moe_router.py``, ``ops/moe_aux_scores.py``, ``ops/moe_aux_loss.py``),
eager and under ``torch.compile(fullgraph=True)``, with TE's signatures, checks and
messages.

As TE's kernels, all math is fp32 (scores are fp32; probabilities and gradients return
in the logits' dtype), and every reduction (softmax and normalizing sums, the loss's
sums) stays inside its op, so a compiled call computes eager's bits.

Caller-owned outputs are TE's too: ``topk_indices`` receives the selected expert ids in
place and is returned as the routing output; ``qb_histogram`` accumulates each call's
Quantile Balancing counts in place. ``qb_histogram_mode`` (TE's choice of kernels,
``"two_kernel"`` or ``"fused_atomic"``) is checked and changes nothing here: both count
the same histogram. The QB bin bounds are read on the host once per version of their
tensor (TE's rule: an eager call must have read them before a CUDA graph captures).
"""

from __future__ import annotations

import enum
from typing import Any, Optional, Union

import torch

from ..generated.moe_aux_loss import call_moe_aux_loss
from ..generated.moe_aux_scores import call_moe_aux_scores
from ..generated.moe_router import call_moe_router

__all__ = [
    "QBHistogramMode",
    "RoutingMapFormat",
    "fused_compute_score_for_moe_aux_loss",
    "fused_moe_aux_loss",
    "fused_topk_with_score_function",
]


class RoutingMapFormat(enum.IntEnum):
    """TE's routing-map layouts: ``BYTEMAP`` bool ``[T, E]``; ``BITMAP_U8`` uint8
    ``[T, ceil(E / 8)]``, bit ``e % 8`` of byte ``e // 8`` (LSB first)."""

    BYTEMAP = 0
    BITMAP_U8 = 1


class QBHistogramMode(enum.IntEnum):
    """TE's Quantile Balancing histogram kernels (one result here)."""

    TWO_KERNEL = 0
    FUSED_ATOMIC = 1


_FORMAT_NAMES = {RoutingMapFormat.BYTEMAP: "bytemap", RoutingMapFormat.BITMAP_U8: "bitmap_u8"}
_FORMAT_FROM_STRING = {"bytemap": RoutingMapFormat.BYTEMAP, "bitmap_u8": RoutingMapFormat.BITMAP_U8}
_QB_MODES = {"two_kernel": QBHistogramMode.TWO_KERNEL, "fused_atomic": QBHistogramMode.FUSED_ATOMIC}


def _routing_map_format(value: Union[str, RoutingMapFormat, int]) -> str:
    """TE's coercion of ``routing_map_format`` (the enum, its int, or its lowercase
    name), as the op's literal."""
    if isinstance(value, RoutingMapFormat):
        return _FORMAT_NAMES[value]
    if isinstance(value, int) and not isinstance(value, bool):
        if value in _FORMAT_NAMES:
            return _FORMAT_NAMES[RoutingMapFormat(value)]
        raise ValueError(
            f"routing_map_format int must be one of {sorted(int(f) for f in RoutingMapFormat)}; "
            f"got {value!r}"
        )
    if isinstance(value, str):
        if value in _FORMAT_FROM_STRING:
            return value
        raise ValueError(
            f"routing_map_format string must be 'bytemap' or 'bitmap_u8' (lowercase); got {value!r}"
        )
    raise TypeError(
        "routing_map_format must be an int, a RoutingMapFormat enum, or 'bytemap' / "
        f"'bitmap_u8'; got {value!r}"
    )


def _check_qb(
    score_function: str,
    expert_bias: Optional[torch.Tensor],
    num_groups: Optional[int],
    group_topk: Optional[int],
    histogram: torch.Tensor,
    mode: Any,
    logits: torch.Tensor,
) -> None:
    """TE's checks of a Quantile Balancing call, in TE's order and words."""
    if score_function != "sigmoid":
        raise ValueError("Quantile Balancing only supports score_function='sigmoid'")
    if expert_bias is None:
        raise ValueError("Quantile Balancing requires expert_bias")
    if num_groups is not None or group_topk is not None:
        raise ValueError("Quantile Balancing does not support grouped Top-k")
    if mode not in _QB_MODES and not isinstance(mode, QBHistogramMode):
        raise ValueError(f"qb_histogram_mode must be 'two_kernel' or 'fused_atomic', got {mode!r}")
    experts = logits.shape[-1]
    if (
        histogram.dtype != torch.int32
        or histogram.dim() != 2
        or histogram.shape[0] != experts
        or histogram.device != logits.device
    ):
        raise ValueError(
            f"qb_histogram: an int32 [num_experts={experts}, num_bins] tensor on the logits' "
            f"device ({logits.device}) expected, got {histogram.dtype} "
            f"{tuple(histogram.shape)} on {histogram.device}"
        )


def fused_topk_with_score_function(
    logits: torch.Tensor,
    topk: int,
    use_pre_softmax: bool,
    num_groups: Optional[int],
    group_topk: Optional[int],
    scaling_factor: Optional[float],
    score_function: str,
    expert_bias: Optional[torch.Tensor],
    routing_map_format: Union[str, RoutingMapFormat, int] = RoutingMapFormat.BYTEMAP,
    topk_indices: Optional[torch.Tensor] = None,
    qb_histogram: Optional[torch.Tensor] = None,
    qb_bin_bounds: Optional[torch.Tensor] = None,
    qb_histogram_mode: Optional[str] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(probs, routing_map)``: each token's ``topk`` experts from ``logits``
    ``[..., E]`` (fp32/bf16/fp16) by ``score_function`` (``"softmax"``, ``"sigmoid"``,
    ``"sqrtsoftplus"``; ops/moe_router.py states the math). ``probs`` has the logits'
    shape and dtype, zero off the selected experts. ``routing_map``: bool ``[..., E]``,
    or its LSB-first bitmap (``"bitmap_u8"``); with ``topk_indices`` (a ``[..., topk]``
    int16/32/64 buffer) the selected ids are written there and it is returned instead.
    ``qb_histogram`` (int32 ``[E, bins]``), ``qb_bin_bounds`` (fp32 ``[lower, upper]``)
    and ``qb_histogram_mode`` together turn on Quantile Balancing (sigmoid with a bias):
    the histogram accumulates in place."""
    if logits.dtype == torch.float64:
        raise ValueError("Current TE does not support float64 router type.")
    fmt = _routing_map_format(routing_map_format)
    qb = (qb_histogram, qb_bin_bounds, qb_histogram_mode)
    num_bins = None
    if any(value is not None for value in qb):
        if any(value is None for value in qb):
            raise ValueError(
                "qb_histogram, qb_bin_bounds, and qb_histogram_mode must be provided together"
            )
        _check_qb(
            score_function,
            expert_bias,
            num_groups,
            group_topk,
            qb_histogram,
            qb_histogram_mode,
            logits,
        )
        num_bins = qb_histogram.shape[1]
    dense_dtype = None
    if topk_indices is not None:
        expected = (*logits.shape[:-1], topk)
        if tuple(topk_indices.shape) != expected:
            raise ValueError(
                f"topk_indices: shape {tuple(topk_indices.shape)}, expected {expected} "
                "(the logits' leading dims and topk)"
            )
        dense_dtype = topk_indices.dtype
    grad = torch.is_grad_enabled()
    probs, routing, counts = call_moe_router(
        logits=logits,
        topk=topk,
        use_pre_softmax=use_pre_softmax,
        num_groups=num_groups,
        group_topk=group_topk,
        scaling_factor=scaling_factor,
        score_function=score_function,
        expert_bias=expert_bias,
        routing_map_format=fmt,
        dense_dtype=dense_dtype,
        qb_bin_bounds=qb_bin_bounds,
        qb_num_bins=num_bins,
        logits_requires_grad=grad and logits.requires_grad,
        is_grad_enabled=grad,
    )
    if qb_histogram is not None:
        qb_histogram.add_(counts)
    if topk_indices is not None:
        topk_indices.copy_(routing)
        return probs, topk_indices
    return probs, routing


def fused_compute_score_for_moe_aux_loss(
    logits: torch.Tensor,
    topk: int,
    score_function: str,
    routing_map_format: Union[str, RoutingMapFormat, int] = RoutingMapFormat.BYTEMAP,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(routing_map, scores)``: the fp32 scores a load-balancing loss reads (the
    softmax of the logits, or their sigmoid / sqrt-softplus normalized over the
    experts) and each token's ``topk`` highest of them as a routing map (bool, or the
    ``"bitmap_u8"`` bitmap)."""
    fmt = _routing_map_format(routing_map_format)
    grad = torch.is_grad_enabled()
    scores, routing = call_moe_aux_scores(
        logits=logits,
        topk=topk,
        score_function=score_function,
        routing_map_format=fmt,
        logits_requires_grad=grad and logits.requires_grad,
        is_grad_enabled=grad,
    )
    return routing, scores


def _count(total: Any) -> Any:
    """A host token count as an int (a symbolic one as it is)."""
    return total if isinstance(total, (int, torch.SymInt)) else int(total)


def fused_moe_aux_loss(
    probs: torch.Tensor,
    tokens_per_expert: torch.Tensor,
    total_num_tokens: Union[int, torch.Tensor],
    num_experts: int,
    topk: int,
    coeff: float,
) -> torch.Tensor:
    """The load-balancing loss ``sum_e (sum_t probs[t, e]) * tokens_per_expert[e] *
    num_experts * coeff / (topk * total_num_tokens ** 2)``, a 0-d tensor of ``probs``'
    dtype. ``total_num_tokens``: a host int, or a 0-d integer tensor read on the device
    (a CUDA graph replays with its current value)."""
    grad = torch.is_grad_enabled()
    on_device = isinstance(total_num_tokens, torch.Tensor)
    return call_moe_aux_loss(
        probs=probs,
        tokens_per_expert=tokens_per_expert,
        total_num_tokens=None if on_device else _count(total_num_tokens),
        total_num_tokens_tensor=total_num_tokens if on_device else None,
        num_experts=num_experts,
        topk=topk,
        coeff=float(coeff),
        probs_requires_grad=grad and probs.requires_grad,
        is_grad_enabled=grad,
    )[0]
