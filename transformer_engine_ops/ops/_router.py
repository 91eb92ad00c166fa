"""What the MoE router ops share: score functions, their derivatives, the top-k
selection (grouped or not) and the routing-map formats.

A helper beside the op modules: it declares no op, so the generator writes nothing for
it. Every function takes and returns fp32 (float64 for float64 logits) ``[T, E]``
tensors unless it says otherwise; as TE's router kernels, the math is fp32 whatever the
logits' dtype (``router.py``'s precision notes).
"""

from __future__ import annotations

from typing import Literal, Optional

import torch
import torch.nn.functional as F

from transformer_engine_ops.runtime.precision import math_dtype

ScoreFunction = Literal["softmax", "sigmoid", "sqrtsoftplus"]
RoutingMapFormat = Literal["bytemap", "bitmap_u8"]

# Added to a normalizing sum (TE's and Megatron's: a row of zero scores stays zero).
NORM_EPS = 1e-20
SCORE_FUNCTIONS = ("softmax", "sigmoid", "sqrtsoftplus")


def as_rows(logits: torch.Tensor) -> torch.Tensor:
    """The logits as ``[T, E]`` rows in the math dtype."""
    return logits.reshape(-1, logits.shape[-1]).to(math_dtype(logits.dtype))


def activation(x: torch.Tensor, score_function: str) -> torch.Tensor:
    """``sigmoid(x)`` or ``sqrt(softplus(x))`` (softplus linear past 20, torch's)."""
    if score_function == "sigmoid":
        return torch.sigmoid(x)
    return F.softplus(x).sqrt()


def activation_grad(x: torch.Tensor, s: torch.Tensor, score_function: str) -> torch.Tensor:
    """``d activation(x) / dx`` given ``s = activation(x)``."""
    if score_function == "sigmoid":
        return s * (1.0 - s)
    slope = torch.where(x > 20.0, torch.ones_like(x), torch.sigmoid(x))
    return slope / (2.0 * s)


def normalized(v: torch.Tensor) -> torch.Tensor:
    """``v / (sum(v) + 1e-20)`` along the last dim."""
    return v / (v.sum(dim=-1, keepdim=True) + NORM_EPS)


def normalized_grad(v: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """The gradient of :func:`normalized` at ``v`` for output gradient ``g``."""
    total = v.sum(dim=-1, keepdim=True) + NORM_EPS
    return g / total - (g * v).sum(dim=-1, keepdim=True) / (total * total)


def softmax_grad(p: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """The gradient of a softmax with output ``p`` for output gradient ``g``."""
    return p * (g - (g * p).sum(dim=-1, keepdim=True))


def select(
    scores: torch.Tensor, topk: int, num_groups: Optional[int], group_topk: Optional[int]
) -> torch.Tensor:
    """``[T, topk]`` int64 expert ids of the ``topk`` highest ``scores`` (descending),
    within the ``group_topk`` best of ``num_groups`` expert groups when grouped (a
    group's score: the sum of its ``topk // group_topk`` best)."""
    if group_topk:
        tokens, experts = scores.shape
        groups = scores.view(tokens, num_groups, experts // num_groups)
        group_scores = groups.topk(topk // group_topk, dim=-1)[0].sum(dim=-1)
        best = torch.topk(group_scores, k=group_topk, dim=-1, sorted=False)[1]
        keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, best, True)
        keep = keep.unsqueeze(-1).expand(tokens, num_groups, experts // num_groups)
        scores = scores.masked_fill(~keep.reshape(tokens, experts), float("-inf"))
    return torch.topk(scores, k=topk, dim=-1)[1]


def bytemap(selected: torch.Tensor, experts: int) -> torch.Tensor:
    """bool ``[T, E]``: True at each token's selected experts."""
    out = torch.zeros((selected.shape[0], experts), dtype=torch.bool, device=selected.device)
    return out.scatter_(1, selected, True)


def bitmap_u8(routing: torch.Tensor) -> torch.Tensor:
    """uint8 ``[T, ceil(E / 8)]``: bit ``e % 8`` of byte ``e // 8`` set where token
    ``t`` routes to expert ``e`` (LSB first), from the bool ``[T, E]`` map."""
    tokens, experts = routing.shape
    width = (experts + 7) // 8
    padded = F.pad(routing.to(torch.uint8), (0, width * 8 - experts))
    # 1, 2, 4, ... 128, made on the device (a host list would be copied there).
    weights = torch.arange(8, dtype=torch.int32, device=routing.device).exp2().to(torch.int32)
    packed = (padded.view(tokens, width, 8).to(torch.int32) * weights).sum(dim=-1)
    return packed.to(torch.uint8)


def routing_output(
    selected: torch.Tensor,
    experts: int,
    lead: tuple[int, ...],
    routing_map_format: str,
    dense_dtype: Optional[torch.dtype],
) -> torch.Tensor:
    """The routing output a router returns, shaped by the logits' leading dims: the
    selected ids (``dense_dtype``, ``[..., topk]``), else the bool map or its bitmap."""
    if dense_dtype is not None:
        return selected.to(dense_dtype).reshape(*lead, selected.shape[1])
    routing = bytemap(selected, experts)
    if routing_map_format == "bitmap_u8":
        routing = bitmap_u8(routing)
    return routing.reshape(*lead, routing.shape[1])


def routing_shape(
    lead: tuple[int, ...],
    experts: int,
    topk: int,
    routing_map_format: str,
    dense_dtype: Optional[torch.dtype],
) -> tuple[tuple[int, ...], torch.dtype]:
    """``(shape, dtype)`` of :func:`routing_output`."""
    if dense_dtype is not None:
        return (*lead, topk), dense_dtype
    if routing_map_format == "bitmap_u8":
        return (*lead, (experts + 7) // 8), torch.uint8
    return (*lead, experts), torch.bool
