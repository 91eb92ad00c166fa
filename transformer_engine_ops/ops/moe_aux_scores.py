"""The MoE auxiliary-loss score op: TE's ``fused_compute_score_for_moe_aux_loss``, the
scores a load-balancing loss reads and the experts each token would route to.

Scores are fp32 ``[..., E]``: the softmax of the logits, or ``sigmoid(x)`` /
``sqrt(softplus(x))`` normalized to sum to 1 over the experts (``/ (sum + 1e-20)``).
The routing map marks each token's ``topk`` highest scores: bool ``[..., E]``, or its
LSB-first bitmap (``bitmap_u8``, uint8 ``[..., ceil(E / 8)]``). The backward carries
the scores' gradient back to the logits (fp32, returned in the logits' dtype); every
reduction is inside the op, so a compiled call computes eager's bits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch

from transformer_engine_ops.ops import _router
from transformer_engine_ops.ops._router import RoutingMapFormat, ScoreFunction
from transformer_engine_ops.runtime.declaration import OpDeclaration
from transformer_engine_ops.runtime.precision import math_dtype
from transformer_engine_ops.runtime.tensor_spec import TensorSpec


@dataclass
class MoeAuxScoresFwdArgs:
    """Everything the load-balancing scores need."""

    logits: torch.Tensor  # [..., E]
    topk: int
    score_function: ScoreFunction
    routing_map_format: RoutingMapFormat

    logits_requires_grad: bool

    # --- Autograd state ---
    is_grad_enabled: bool


@dataclass
class MoeAuxScoresBwdArgs:
    """Everything the scores' backward needs."""

    grad_outputs: list[torch.Tensor]  # (scores, routing map)

    logits: torch.Tensor
    score_function: ScoreFunction

    requires_dgrad: bool


def _plan(args: MoeAuxScoresFwdArgs) -> tuple[tuple[Any, ...], Any]:
    where = "MoeAuxScoresFwdArgs"
    logits = args.logits
    if len(logits.shape) < 1 or not logits.dtype.is_floating_point:
        raise ValueError(
            f"{where}.logits: float [..., num_experts] expected, got {logits.dtype} "
            f"{tuple(logits.shape)}"
        )
    experts = logits.shape[-1]
    if args.score_function not in _router.SCORE_FUNCTIONS:
        raise ValueError(
            f"{where}.score_function: one of {_router.SCORE_FUNCTIONS}, got {args.score_function!r}"
        )
    if not 0 < args.topk <= experts:
        raise ValueError(f"{where}.topk: {args.topk} of {experts} experts")
    if args.routing_map_format not in ("bytemap", "bitmap_u8"):
        raise ValueError(
            f"{where}.routing_map_format: 'bytemap' or 'bitmap_u8', got {args.routing_map_format!r}"
        )
    return tuple(logits.shape[:-1]), experts


def _scores(x: torch.Tensor, score_function: str) -> tuple[torch.Tensor, Any]:
    """``(scores, activated)``: the scores of rows ``x``, and for sigmoid and
    sqrtsoftplus the activations they normalize (None for softmax)."""
    if score_function == "softmax":
        return torch.softmax(x, dim=-1), None
    a = _router.activation(x, score_function)
    return _router.normalized(a), a


def moe_aux_scores_forward(
    args: MoeAuxScoresFwdArgs,
) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """``((scores, routing_map), ())``; scores fp32 of the logits' shape (the float
    output first: TE's function returns them the other way round)."""
    lead, experts = _plan(args)
    logits = args.logits
    x = _router.as_rows(logits)
    scores, _ = _scores(x, args.score_function)
    selected = torch.topk(scores, k=args.topk, dim=-1)[1]
    routing = _router.routing_output(selected, experts, lead, args.routing_map_format, None)
    return (scores.reshape(logits.shape), routing), ()


def moe_aux_scores_forward_spec(
    args: MoeAuxScoresFwdArgs,
) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    lead, experts = _plan(args)
    logits, device = args.logits, args.logits.device
    shape, dtype = _router.routing_shape(lead, experts, args.topk, args.routing_map_format, None)
    scores = TensorSpec(tuple(logits.shape), math_dtype(logits.dtype), device=device)
    return (scores, TensorSpec(shape, dtype, device=device)), ()


def moe_aux_scores_setup_context(
    args: MoeAuxScoresFwdArgs, outputs: tuple[Any, ...], saved: tuple[Any, ...]
) -> dict[str, Any]:
    return dict(
        requires_dgrad=args.is_grad_enabled and args.logits_requires_grad,
    )


def moe_aux_scores_backward(args: MoeAuxScoresBwdArgs) -> tuple[Optional[torch.Tensor]]:
    """The logits' gradient from the scores' (fp32; the map has none)."""
    if not args.requires_dgrad:
        return (None,)
    logits = args.logits
    x = _router.as_rows(logits)
    g = args.grad_outputs[0].reshape(x.shape).to(x.dtype)
    scores, activated = _scores(x, args.score_function)
    if activated is None:
        dx = _router.softmax_grad(scores, g)
    else:
        da = _router.normalized_grad(activated, g)
        dx = da * _router.activation_grad(x, activated, args.score_function)
    return (dx.to(logits.dtype).reshape(logits.shape),)


def moe_aux_scores_backward_spec(args: MoeAuxScoresBwdArgs) -> tuple[Optional[TensorSpec]]:
    if not args.requires_dgrad:
        return (None,)
    logits = args.logits
    return (TensorSpec(tuple(logits.shape), logits.dtype, device=logits.device),)


MOE_AUX_SCORES = OpDeclaration(
    name="moe_aux_scores",
    forward=MoeAuxScoresFwdArgs,
    backward=MoeAuxScoresBwdArgs,
    grad_fields=("logits",),
    forward_impl=moe_aux_scores_forward,
    backward_impl=moe_aux_scores_backward,
    forward_spec=moe_aux_scores_forward_spec,
    backward_spec=moe_aux_scores_backward_spec,
    setup_context=moe_aux_scores_setup_context,
)
