"""The MoE router op: TE's ``fused_topk_with_score_function``, each token's top-k experts
and their probabilities from its logits.

Scores and probabilities are fp32 whatever the logits' dtype (TE's kernels); the
probabilities return in the logits' dtype and shape, zero off the selected experts.

* ``softmax``: with ``use_pre_softmax`` the softmax of every logit, then the top k of
  it; otherwise the top k logits, then the softmax of those k.
* ``sigmoid`` / ``sqrtsoftplus``: ``sigmoid(x)`` or ``sqrt(softplus(x))``; experts are
  chosen on the score plus ``expert_bias`` (when given) and weighted by the score
  alone, normalized to sum to 1 (``/ (sum + 1e-20)``) when ``topk > 1``.
* ``num_groups`` / ``group_topk``: only the ``group_topk`` best expert groups compete
  (DeepSeek's grouped routing; a group scores the sum of its ``topk // group_topk``
  best).
* ``scaling_factor`` multiplies the probabilities.
* Quantile Balancing (``qb_num_bins``; sigmoid with a bias): the top ``k + 1`` biased
  scores are taken, the lowest of them (the cutoff) dropped (of equal ones, the highest
  expert id), and for every expert the bias it would need to reach the cutoff,
  ``cutoff - score``, is counted in one of ``qb_num_bins`` uniform bins over
  ``qb_bin_bounds`` (clamped to the end bins): the op's third output, an int32
  ``[E, bins]`` histogram of this call, which the caller adds into its own (empty
  without Quantile Balancing).

The routing output is the bool map ``[..., E]``, its LSB-first bitmap (``bitmap_u8``,
uint8 ``[..., ceil(E / 8)]``), or with ``dense_dtype`` the selected ids ``[..., topk]``
in that dtype. The backward reads the logits and the selection (kept in int64,
whatever the output format), so every format has the same gradient to the bit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

import torch

from transformer_engine_ops.ops import _router
from transformer_engine_ops.ops._moe import ABSENT_DTYPE, ABSENT_SHAPE, absent
from transformer_engine_ops.ops._router import RoutingMapFormat, ScoreFunction
from transformer_engine_ops.runtime.declaration import OpDeclaration
from transformer_engine_ops.runtime.tensor_spec import TensorSpec


@dataclass
class MoeRouterFwdArgs:
    """Everything choosing each token's experts needs."""

    # --- Differentiable input ---
    logits: torch.Tensor  # [..., E]

    # --- The selection ---
    topk: int
    use_pre_softmax: bool
    num_groups: Optional[int]
    group_topk: Optional[int]
    scaling_factor: Optional[float]
    score_function: ScoreFunction
    expert_bias: Optional[torch.Tensor]  # [E]: added to the scores that choose, not the probs

    # --- The routing output: a map in this format, or the ids in dense_dtype ---
    routing_map_format: RoutingMapFormat
    dense_dtype: Optional[torch.dtype]

    # --- Quantile Balancing (None: off) ---
    qb_bin_bounds: Optional[torch.Tensor]  # fp32 [2]: (lower, upper)
    qb_num_bins: Optional[int]

    logits_requires_grad: bool

    # --- Autograd state ---
    is_grad_enabled: bool


@dataclass
class MoeRouterBwdArgs:
    """Everything the router's backward needs."""

    grad_outputs: list[torch.Tensor]

    logits: torch.Tensor
    selected: torch.Tensor  # [T, topk] int64: each token's experts

    topk: int
    use_pre_softmax: bool
    scaling_factor: Optional[float]
    score_function: ScoreFunction

    requires_dgrad: bool


def _plan(args: MoeRouterFwdArgs) -> tuple[tuple[Any, ...], Any, Any]:
    """Checks the bundle; ``(leading dims, E, tokens)``."""
    where = "MoeRouterFwdArgs"
    logits = args.logits
    if len(logits.shape) < 1:
        raise ValueError(f"{where}.logits: [..., num_experts] expected, got a scalar")
    if logits.dtype == torch.float64:
        raise ValueError("Current TE does not support float64 router type.")
    if not logits.dtype.is_floating_point:
        raise TypeError(f"{where}.logits: a float dtype expected, got {logits.dtype}")
    lead, experts = tuple(logits.shape[:-1]), logits.shape[-1]
    if args.score_function not in _router.SCORE_FUNCTIONS:
        raise ValueError(
            f"{where}.score_function: one of {_router.SCORE_FUNCTIONS}, got {args.score_function!r}"
        )
    if not 0 < args.topk <= experts:
        raise ValueError(f"{where}.topk: {args.topk} of {experts} experts")
    bias = args.expert_bias
    if bias is not None:
        if args.score_function == "softmax":
            raise ValueError(
                f"{where}.expert_bias: used with the sigmoid and sqrtsoftplus score functions, "
                "not softmax"
            )
        if tuple(bias.shape) != (experts,):
            raise ValueError(
                f"{where}.expert_bias: shape {tuple(bias.shape)}, expected ({experts},)"
            )
    groups, group_topk = args.num_groups, args.group_topk
    if group_topk:
        if not groups or experts % groups or groups < group_topk or args.topk % group_topk:
            raise ValueError(
                f"{where}: group_topk={group_topk} of num_groups={groups} over {experts} "
                f"experts and topk={args.topk}: num_groups must divide the experts, be at "
                "least group_topk, and group_topk divide topk"
            )
    if args.routing_map_format not in ("bytemap", "bitmap_u8"):
        raise ValueError(
            f"{where}.routing_map_format: 'bytemap' or 'bitmap_u8', got {args.routing_map_format!r}"
        )
    dense = args.dense_dtype
    if dense is not None and dense not in (torch.int16, torch.int32, torch.int64):
        raise ValueError(f"{where}.dense_dtype: int16, int32 or int64, got {dense}")
    if args.qb_num_bins is not None:
        _check_qb(args, experts)
    tokens = 1
    for d in lead:
        tokens = tokens * d
    return lead, experts, tokens


def _check_qb(args: MoeRouterFwdArgs, experts: Any) -> None:
    where = "MoeRouterFwdArgs"
    if args.score_function != "sigmoid" or args.expert_bias is None or args.group_topk:
        raise ValueError(
            f"{where}: Quantile Balancing takes score_function='sigmoid' with an expert_bias "
            "and no grouped top-k"
        )
    bounds = args.qb_bin_bounds
    if bounds is None or tuple(bounds.shape) != (2,) or bounds.dtype != torch.float32:
        got = None if bounds is None else f"{bounds.dtype} {tuple(bounds.shape)}"
        raise ValueError(f"{where}.qb_bin_bounds: an fp32 [2] tensor expected, got {got}")
    if args.qb_num_bins < 1:
        raise ValueError(f"{where}.qb_num_bins: at least 1, got {args.qb_num_bins}")
    if args.topk >= experts:
        raise ValueError(f"{where}.topk: Quantile Balancing takes the top k + 1 of {experts}")


def _qb_select(biased: torch.Tensor, topk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(selected [T, topk], cutoff [T])``: the top ``k + 1`` biased scores less the
    one at the cutoff (of equal ones, the highest expert id), in their order."""
    values, ids = torch.topk(biased, k=topk + 1, dim=-1)
    cutoff = values.min(dim=-1).values
    candidates = ids.masked_fill(values != cutoff.unsqueeze(1), -1)
    dropped = candidates.max(dim=-1).values
    at = (ids == dropped.unsqueeze(1)).to(torch.int32).argmax(dim=-1, keepdim=True)
    slots = torch.arange(topk, device=ids.device).unsqueeze(0)
    return ids.gather(1, slots + (slots >= at).to(slots.dtype)), cutoff


def _qb_histogram(
    raw: torch.Tensor, cutoff: torch.Tensor, bounds: torch.Tensor, bins: int
) -> torch.Tensor:
    """int32 ``[E, bins]``: per expert, how many tokens need each bias bin to reach
    their cutoff."""
    lower, upper = bounds[0], bounds[1]
    required = cutoff.unsqueeze(1) - raw
    scale = bins / (upper - lower)
    index = torch.floor((required - lower) * scale).to(torch.int64).clamp_(0, bins - 1)
    experts = raw.shape[1]
    offsets = torch.arange(experts, device=raw.device, dtype=torch.int64) * bins
    flat = (index + offsets).reshape(-1)
    # Integer sums (any order gives the same counts); ``bincount`` would read the
    # largest index on the host.
    counts = torch.zeros(experts * bins, dtype=torch.int32, device=raw.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat, dtype=torch.int32))
    return counts.reshape(experts, bins)


def _probabilities(
    args: Any, x: torch.Tensor, selected: torch.Tensor, scores: Optional[torch.Tensor]
) -> torch.Tensor:
    """``[T, topk]`` probabilities of the selected experts (before scaling): ``x`` are
    the logits as rows, ``scores`` their score function's values (None: softmax after
    selection)."""
    if args.score_function == "softmax":
        if args.use_pre_softmax:
            return scores.gather(1, selected)
        return torch.softmax(x.gather(1, selected), dim=-1)
    v = scores.gather(1, selected)
    return _router.normalized(v) if args.topk > 1 else v


def moe_router_forward(args: MoeRouterFwdArgs) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """``((probs, routing, qb_histogram), (selected,))``; the histogram empty
    (``_moe.absent``) without Quantile Balancing."""
    lead, experts, _ = _plan(args)
    logits = args.logits
    x = _router.as_rows(logits)
    histogram = absent(logits.device)
    if args.score_function == "softmax":
        scores = torch.softmax(x, dim=-1) if args.use_pre_softmax else None
        chooser = scores if args.use_pre_softmax else x
        selected = _router.select(chooser, args.topk, args.num_groups, args.group_topk)
    else:
        scores = _router.activation(x, args.score_function)
        chooser = scores if args.expert_bias is None else scores + args.expert_bias
        if args.qb_num_bins is not None:
            _validate_bounds(args.qb_bin_bounds)
            selected, cutoff = _qb_select(chooser, args.topk)
            histogram = _qb_histogram(scores, cutoff, args.qb_bin_bounds, args.qb_num_bins)
        else:
            selected = _router.select(chooser, args.topk, args.num_groups, args.group_topk)
    p = _probabilities(args, x, selected, scores)
    if args.scaling_factor:
        p = p * args.scaling_factor
    probs = torch.zeros(x.shape, dtype=logits.dtype, device=logits.device)
    probs = probs.scatter_(1, selected, p.to(logits.dtype)).reshape(logits.shape)
    routing = _router.routing_output(
        selected, experts, lead, args.routing_map_format, args.dense_dtype
    )
    return (probs, routing, histogram), (selected,)


_VALIDATED = "_teops_qb_bounds_version"


def _validate_bounds(bounds: torch.Tensor) -> None:
    """TE's rule for the QB bin bounds: finite with lower < upper. Read on the host once
    per version of the tensor (an in-place update is read again), refused while a CUDA
    graph captures before the bounds' current version was read."""
    version = bounds._version
    if getattr(bounds, _VALIDATED, None) == version:
        return
    if bounds.is_cuda:
        with torch.cuda.device(bounds.device):
            if torch.cuda.is_current_stream_capturing():
                raise RuntimeError(
                    "QB bin_bounds must be validated by an eager router call before CUDA "
                    "graph capture"
                )
    lower, upper = bounds.detach().cpu().tolist()
    if not (math.isfinite(lower) and math.isfinite(upper) and lower < upper):
        raise ValueError(
            f"QB bin_bounds values must be finite with lower < upper, got [{lower}, {upper}]"
        )
    setattr(bounds, _VALIDATED, version)


def moe_router_forward_spec(args: MoeRouterFwdArgs) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    lead, experts, tokens = _plan(args)
    logits, device = args.logits, args.logits.device
    probs = TensorSpec(tuple(logits.shape), logits.dtype, device=device)
    shape, dtype = _router.routing_shape(
        lead, experts, args.topk, args.routing_map_format, args.dense_dtype
    )
    routing = TensorSpec(shape, dtype, device=device)
    histogram = TensorSpec(ABSENT_SHAPE, ABSENT_DTYPE, device=device)
    if args.qb_num_bins is not None:
        histogram = TensorSpec((experts, args.qb_num_bins), torch.int32, device=device)
    selected = TensorSpec((tokens, args.topk), torch.int64, device=device)
    return (probs, routing, histogram), (selected,)


def moe_router_setup_context(
    args: MoeRouterFwdArgs, outputs: tuple[Any, ...], saved: tuple[Any, ...]
) -> dict[str, Any]:
    return dict(
        selected=saved[0],
        requires_dgrad=args.is_grad_enabled and args.logits_requires_grad,
    )


def moe_router_backward(args: MoeRouterBwdArgs) -> tuple[Optional[torch.Tensor]]:
    """The logits' gradient: the probabilities' gradient at the selected experts, back
    through the scaling, the normalization or softmax, and the score function (fp32)."""
    if not args.requires_dgrad:
        return (None,)
    logits, selected = args.logits, args.selected
    x = _router.as_rows(logits)
    g = args.grad_outputs[0].reshape(x.shape).to(x.dtype).gather(1, selected)
    if args.scaling_factor:
        g = g * args.scaling_factor
    if args.score_function == "softmax":
        if args.use_pre_softmax:
            p = torch.softmax(x, dim=-1)
            full = torch.zeros_like(x).scatter_(1, selected, g)
            return (_router.softmax_grad(p, full).to(logits.dtype).reshape(logits.shape),)
        q = torch.softmax(x.gather(1, selected), dim=-1)
        dx = _router.softmax_grad(q, g)
    else:
        s = _router.activation(x.gather(1, selected), args.score_function)
        dv = _router.normalized_grad(s, g) if args.topk > 1 else g
        dx = dv * _router.activation_grad(x.gather(1, selected), s, args.score_function)
    full = torch.zeros_like(x).scatter_(1, selected, dx)
    return (full.to(logits.dtype).reshape(logits.shape),)


def moe_router_backward_spec(args: MoeRouterBwdArgs) -> tuple[Optional[TensorSpec]]:
    if not args.requires_dgrad:
        return (None,)
    logits = args.logits
    return (TensorSpec(tuple(logits.shape), logits.dtype, device=logits.device),)


MOE_ROUTER = OpDeclaration(
    name="moe_router",
    forward=MoeRouterFwdArgs,
    backward=MoeRouterBwdArgs,
    grad_fields=("logits",),
    forward_impl=moe_router_forward,
    backward_impl=moe_router_backward,
    forward_spec=moe_router_forward_spec,
    backward_spec=moe_router_backward_spec,
    setup_context=moe_router_setup_context,
)
