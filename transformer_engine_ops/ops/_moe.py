"""What the MoE permutation ops share: TE's row maps and the moves and sums over them.

A helper beside the op modules: it declares no op, so the generator writes nothing for
it. Nothing here reads a tensor value on the host where the tensors are on CUDA (no
synchronization, safe under CUDA graphs), except :func:`token_sum` without Triton,
which reads the largest routed count once.

The row maps are TE's, so a map from one op feeds the others as in TE:

* mask map (``moe_permute(map_type="mask")``): int32 ``[T, 2E + 1]``. For token ``t``
  routed to ``n`` experts, entries ``[0, n)`` hold its destination rows in descending
  order (so its experts in descending order), entries ``[E, E + n)`` those experts,
  entry ``2E`` holds ``n``; every other entry is -1. Expert ``e``'s tokens take
  consecutive rows in token order, experts in order; with ``pad_offsets`` expert ``e``'s
  rows move down by ``pad_offsets[e]`` (the map keeps the unpadded rows).
* index map (``map_type="index"``): int32 ``[K * T]``; entry ``k * T + t`` is the row
  of token ``t``'s ``k``-th choice (rows sorted by expert, stably), -1 past
  ``num_out_tokens``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Optional

import torch

from transformer_engine_ops.kernels import moe_kernels
from transformer_engine_ops.runtime._torch_private import assert_async
from transformer_engine_ops.runtime.precision import math_dtype

ROW_ID_DTYPE = torch.int32
_I64 = torch.int64
# An op output that a call does not produce (TE's ``torch.empty(0)``): a user output
# is never None, so that its gradient slot always holds a tensor.
ABSENT_SHAPE = (0,)
ABSENT_DTYPE = torch.float32


def absent(device: torch.device) -> torch.Tensor:
    """The empty tensor an op returns for an output the call does not produce."""
    return torch.empty(ABSENT_SHAPE, dtype=ABSENT_DTYPE, device=device)


def device_check(ok: torch.Tensor, message: Callable[[], str], short: str) -> None:
    """Refuse values breaking a rule: on the CPU ``ok`` is read and a ValueError carries
    ``message()``; on CUDA the rule becomes ``torch._assert_async`` (no host
    synchronization, safe under CUDA graphs), failing the stream with ``short`` at the
    next synchronization."""
    if ok.device.type == "cuda":
        assert_async(ok, short)
    elif not bool(ok):
        raise ValueError(message())


def mask_row_id_map(routing_map: torch.Tensor) -> torch.Tensor:
    """TE's mask-map ``row_id_map`` (module docstring) of ``routing_map`` ``[T, E]``
    (bool or integer, nonzero where routed)."""
    mask = routing_map if routing_map.dtype == torch.bool else routing_map != 0
    per_expert = mask.sum(0, dtype=ROW_ID_DTYPE)
    first = torch.cumsum(per_expert, 0, dtype=ROW_ID_DTYPE) - per_expert
    rank = torch.cumsum(mask, 0, dtype=ROW_ID_DTYPE) - 1
    dst = torch.where(mask, first + rank, -1)
    rows, order = torch.sort(dst, dim=1, descending=True, stable=True)
    experts = torch.where(rows >= 0, order.to(ROW_ID_DTYPE), -1)
    routed = mask.sum(1, dtype=ROW_ID_DTYPE)
    return torch.cat((rows, experts, routed[:, None]), dim=1)


def mask_experts(row_id_map: torch.Tensor) -> int:
    """``E`` of a mask-map ``row_id_map`` ``[T, 2E + 1]``."""
    return (row_id_map.shape[1] - 1) // 2 if len(row_id_map.shape) == 2 else 0


def mask_table(
    row_id_map: torch.Tensor, pad_offsets: Optional[torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(rows, experts, counts)`` of a mask map: ``[T, E]`` int64 rows (padded by
    ``pad_offsets``) and experts of each token's slots, -1 past its count, and the
    counts ``[T]``."""
    e = mask_experts(row_id_map)
    rows = row_id_map[:, :e].to(_I64)
    experts = row_id_map[:, e : 2 * e].to(_I64)
    counts = row_id_map[:, 2 * e].to(_I64)
    valid = torch.arange(e, device=row_id_map.device) < counts[:, None]
    rows = torch.where(valid, rows, -1)
    experts = torch.where(valid, experts, -1)
    if pad_offsets is not None:
        shift = pad_offsets.to(_I64)[experts.clamp_min(0)]
        rows = torch.where(valid, rows + shift, -1)
    return rows, experts, counts


def index_row_id_map(indices: torch.Tensor, num_out_tokens: int) -> torch.Tensor:
    """TE's index-map ``row_id_map`` (module docstring) of ``indices`` ``[T, K]``
    (expert ids); also the order of the rows: see :func:`index_order`."""
    tokens, k = indices.shape
    order = index_order(indices)
    slots = torch.arange(order.numel(), device=order.device)
    position = torch.empty_like(order).scatter_(0, order, slots)
    rows = torch.where(position < num_out_tokens, position, -1)
    return rows.view(tokens, k).t().reshape(-1).to(ROW_ID_DTYPE)


def index_order(indices: torch.Tensor) -> torch.Tensor:
    """The flat slots ``t * K + k`` of ``indices`` sorted by expert id, stably: output
    row ``p`` holds the token of slot ``index_order[p]``."""
    return torch.argsort(indices.reshape(-1), stable=True)


def index_table(row_id_map: torch.Tensor, topk: int) -> torch.Tensor:
    """The rows ``[T, K]`` (int64, -1 where dropped) of an index map."""
    return row_id_map.to(_I64).view(topk, -1).t()


def row_sources(rows: torch.Tensor, num_rows: int) -> torch.Tensor:
    """For each of ``num_rows`` rows, the slot ``t * J + j`` of the ``[T, J]`` table
    ``rows`` naming it (int64), -1 for a row no slot names (padding, or past the routed
    rows). Rows are unique among the slots; a slot's row past ``num_rows`` is dropped."""
    tokens, j = rows.shape
    slots = torch.arange(tokens * j, device=rows.device)
    flat = rows.reshape(-1)
    named = (flat >= 0) & (flat < num_rows)
    # A slot naming no row writes a place of its own past the rows: no two writes meet.
    target = torch.where(named, flat, num_rows + slots)
    sources = torch.full((num_rows + tokens * j,), -1, dtype=_I64, device=rows.device)
    sources.scatter_(0, target, slots)
    return sources[:num_rows]


def gather_rows(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``x[index]`` (a fresh ``[N, H]`` tensor), zeros where ``index`` is -1."""
    missing = index < 0
    if x.shape[0] == 0:
        return x.new_zeros((index.shape[0], *x.shape[1:]))
    out = x.index_select(0, index.clamp_min(0))
    return out.masked_fill_(missing.view(-1, *([1] * (x.dim() - 1))), 0)


def token_sum(
    x: torch.Tensor,
    rows: torch.Tensor,
    counts: Optional[torch.Tensor],
    weights: Optional[torch.Tensor],
    out_dtype: torch.dtype,
) -> torch.Tensor:
    """``out[t] = sum_j weights[t, j] * x[rows[t, j]]`` over the slots ``j <
    counts[t]`` (every slot when ``counts`` is None) holding a row (not -1), each
    product and the sum in fp32 (float64 for float64 ``x``), added in slot order, cast
    once to ``out_dtype``. On CUDA with Triton one kernel (``moe_kernels``); otherwise
    torch ops, one pass per slot up to the largest count (read on the host: on CUDA
    without Triton, one synchronization)."""
    if moe_kernels.eligible(x):
        return moe_kernels.token_sum(x, rows, counts, weights, out_dtype)
    tokens, slots = rows.shape
    dtype = math_dtype(x.dtype)
    acc = torch.zeros((tokens, *x.shape[1:]), dtype=dtype, device=x.device)
    bound = slots if counts is None or tokens == 0 else min(slots, int(counts.max()))
    for j in range(bound):
        row = rows[:, j]
        take = row >= 0
        if counts is not None:
            take = take & (counts > j)
        v = gather_rows(x, row).to(dtype)
        if weights is not None:
            v = v * weights[:, j, None].to(dtype)
        acc = torch.where(take[:, None], acc + v, acc)
    return acc.to(out_dtype)


def slot_dot(x: torch.Tensor, sources: torch.Tensor, g: torch.Tensor, slots: int) -> torch.Tensor:
    """For each row ``r`` of ``x`` that ``sources`` maps to slot ``s = t * J + j`` (-1:
    none), ``dot(x[r], g[t])`` in fp32 (float64 for float64 data), placed at slot
    ``s`` of a ``[T, J]`` result (zero where no row maps): the merging
    probabilities' gradient of an unpermute."""
    tokens = g.shape[0]
    dtype = math_dtype(x.dtype, g.dtype)
    token = torch.where(sources >= 0, sources // slots, -1)
    dots = (x.to(dtype) * gather_rows(g, token).to(dtype)).sum(dim=1)
    flat = torch.zeros(tokens * slots + x.shape[0], dtype=dtype, device=x.device)
    spare = tokens * slots + torch.arange(x.shape[0], device=x.device)
    place = torch.where(sources >= 0, sources, spare)  # a row of no slot writes past them
    flat.scatter_(0, place, dots)
    return flat[: tokens * slots].view(tokens, slots)
