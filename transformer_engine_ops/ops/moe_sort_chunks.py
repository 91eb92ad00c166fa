"""The MoE chunk sort op: TE's ``moe_sort_chunks_by_index`` (``_with_probs``), the rows
split into chunks by ``split_sizes`` and the chunks reordered by ``sorted_index``.

Output chunk ``i`` is input chunk ``sorted_index[i]``. Rows past the chunks'
total stay where they are (TE's identity rule for a buffer longer than its chunks).
``probs`` (one per row) move with their rows (without them the second output is
empty). The destination of every row is computed
on the device from the two index tensors (nothing read on the host; safe under CUDA
graphs); the backward moves each row's gradient back. ``split_sizes`` must not
overrun the rows and ``sorted_index`` must be a permutation of the chunks: a ValueError
on the CPU, a device-side assertion on CUDA.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch

from transformer_engine_ops.ops import _moe
from transformer_engine_ops.runtime.declaration import OpDeclaration
from transformer_engine_ops.runtime.tensor_spec import TensorSpec


@dataclass
class MoeSortChunksFwdArgs:
    """Everything reordering row chunks needs."""

    # --- Differentiable inputs ---
    inp: torch.Tensor  # [N, H]
    probs: Optional[torch.Tensor]  # [N], moved with the rows

    # --- The chunks (integer tensors, read on the device) ---
    split_sizes: torch.Tensor  # [S]: rows of each chunk
    sorted_index: torch.Tensor  # [S]: output chunk i is input chunk sorted_index[i]

    inp_requires_grad: bool
    probs_requires_grad: bool

    # --- Autograd state ---
    is_grad_enabled: bool


@dataclass
class MoeSortChunksBwdArgs:
    """Everything the chunk sort's backward needs."""

    grad_outputs: list[torch.Tensor]

    destinations: torch.Tensor  # [N] int64: the output row of each input row

    requires_dgrad: bool
    requires_probs_grad: bool


def _plan(args: MoeSortChunksFwdArgs) -> None:
    where = "MoeSortChunksFwdArgs"
    inp, probs = args.inp, args.probs
    if len(inp.shape) != 2:
        raise ValueError(f"{where}.inp: [num_tokens, hidden] expected, got {tuple(inp.shape)}")
    if probs is not None and tuple(probs.shape) != (inp.shape[0],):
        raise ValueError(
            f"{where}.probs: shape {tuple(probs.shape)}, expected ({inp.shape[0]},) (one per row)"
        )
    sizes, index = args.split_sizes, args.sorted_index
    for name, t in (("split_sizes", sizes), ("sorted_index", index)):
        if len(t.shape) != 1 or t.dtype.is_floating_point or t.dtype == torch.bool:
            raise ValueError(
                f"{where}.{name}: a 1-D integer tensor expected, got {t.dtype} of shape "
                f"{tuple(t.shape)}"
            )
    if sizes.shape[0] != index.shape[0]:
        raise ValueError(
            f"{where}: split_sizes {tuple(sizes.shape)} and sorted_index {tuple(index.shape)} "
            "must name the same chunks"
        )


def destinations(split_sizes: torch.Tensor, sorted_index: torch.Tensor, rows: int) -> Any:
    """The output row of each of ``rows`` input rows (int64; rows past the chunks keep
    theirs), after checking the chunks against the rows."""
    device = split_sizes.device
    sizes = split_sizes.to(torch.int64)
    index = sorted_index.to(torch.int64)
    chunks = sizes.shape[0]
    ends = torch.cumsum(sizes, 0)
    total = ends[-1:] if chunks else sizes.new_zeros(1)
    ordered = torch.sort(index).values
    _moe.device_check(
        (sizes >= 0).all()
        & (total <= rows).all()
        & (ordered == torch.arange(chunks, device=device)).all(),
        lambda: f"moe_sort_chunks_by_index: split_sizes {sizes.tolist()} (non-negative, at "
        f"most the input's {rows} rows in all) and sorted_index {index.tolist()} (a "
        "permutation of the chunks) do not fit",
        "moe_sort_chunks_by_index: bad split_sizes or sorted_index",
    )
    row = torch.arange(rows, device=device)
    if chunks == 0:
        return row
    chunk = torch.searchsorted(ends, row, right=True).clamp_max(chunks - 1)
    offset = row - (ends - sizes)[chunk]
    # Where each input chunk lands: after the chunks placed before it.
    placed = torch.cumsum(sizes[index], 0) - sizes[index]
    start = torch.empty_like(placed).scatter_(0, index, placed)
    return torch.where(row < total, start[chunk] + offset, row)


def _moved(x: torch.Tensor, destinations: torch.Tensor) -> torch.Tensor:
    """``out[destinations[r]] = x[r]`` (``destinations`` a permutation of the rows)."""
    sources = torch.empty_like(destinations).scatter_(
        0, destinations, torch.arange(destinations.shape[0], device=destinations.device)
    )
    return x.index_select(0, sources)


def moe_sort_chunks_forward(
    args: MoeSortChunksFwdArgs,
) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """``((out, permuted_probs), (destinations,))``."""
    _plan(args)
    inp = args.inp
    dest = destinations(
        args.split_sizes.to(inp.device), args.sorted_index.to(inp.device), inp.shape[0]
    )
    out = _moved(inp, dest)
    probs = _moe.absent(inp.device) if args.probs is None else _moved(args.probs, dest)
    return (out, probs), (dest,)


def moe_sort_chunks_forward_spec(
    args: MoeSortChunksFwdArgs,
) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    _plan(args)
    inp, probs, device = args.inp, args.probs, args.inp.device
    out = TensorSpec(tuple(inp.shape), inp.dtype, device=device)
    if probs is None:
        moved = TensorSpec(_moe.ABSENT_SHAPE, _moe.ABSENT_DTYPE, device=device)
    else:
        moved = TensorSpec(tuple(probs.shape), probs.dtype, device=device)
    return (out, moved), (TensorSpec((inp.shape[0],), torch.int64, device=device),)


def moe_sort_chunks_setup_context(
    args: MoeSortChunksFwdArgs, outputs: tuple[Any, ...], saved: tuple[Any, ...]
) -> dict[str, Any]:
    grad = args.is_grad_enabled
    return dict(
        destinations=saved[0],
        requires_dgrad=grad and args.inp_requires_grad,
        requires_probs_grad=grad and args.probs is not None and args.probs_requires_grad,
    )


def moe_sort_chunks_backward(args: MoeSortChunksBwdArgs) -> tuple[Optional[torch.Tensor], ...]:
    """Each row's gradient read back from where the row went."""
    dest = args.destinations
    dgrad = args.grad_outputs[0].index_select(0, dest) if args.requires_dgrad else None
    dprobs = args.grad_outputs[1].index_select(0, dest) if args.requires_probs_grad else None
    return dgrad, dprobs


def moe_sort_chunks_backward_spec(
    args: MoeSortChunksBwdArgs,
) -> tuple[Optional[TensorSpec], ...]:
    g, device = args.grad_outputs[0], args.destinations.device
    dgrad = TensorSpec(tuple(g.shape), g.dtype, device=device) if args.requires_dgrad else None
    dprobs = None
    if args.requires_probs_grad:
        gp = args.grad_outputs[1]
        dprobs = TensorSpec(tuple(gp.shape), gp.dtype, device=device)
    return dgrad, dprobs


MOE_SORT_CHUNKS = OpDeclaration(
    name="moe_sort_chunks",
    forward=MoeSortChunksFwdArgs,
    backward=MoeSortChunksBwdArgs,
    grad_fields=("inp", "probs"),
    forward_impl=moe_sort_chunks_forward,
    backward_impl=moe_sort_chunks_backward,
    forward_spec=moe_sort_chunks_forward_spec,
    backward_spec=moe_sort_chunks_backward_spec,
    setup_context=moe_sort_chunks_setup_context,
)
