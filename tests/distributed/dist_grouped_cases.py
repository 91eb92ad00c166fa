"""What each rank runs for the distributed GroupedLinear tests (dispatched from
``dist_cases.run_case``; same records, same comparisons).

As in TE 2.20.2, GroupedLinear communicates nothing: ``parallel_mode`` only shards each
weight (column: output features, row: input features) and the MoE dispatch and combine
stages around it do the collectives. So each rank's results are checked against the
single-process module (same seed: every rank draws the same full weights and keeps its
shard) on what that rank holds, locally, never waiting on the other rank:

* column: the output is this rank's feature shard; the input gradient is this rank's
  partial sum, which is the single-process input gradient of ``dy`` zeroed outside the
  shard's columns;
* row: the output is this rank's partial sum, which is the single-process output of the
  input zeroed outside the shard's columns; the input gradient is the shard's columns.

Zeroing keeps every amax, so FP8 current scaling quantizes with the scales the rank
uses. Under sequence parallelism each rank holds its own rows of the sequence, with its
own ``m_splits`` (they count the rank's rows), and nothing else changes.
"""

from __future__ import annotations

from typing import Any

import torch
from dist_cases import (
    RECIPES,
    REF_TOL,
    SEED,
    World,
    _chunk,
    _compare_reference,
    _compiled_matches_eager,
    _step,
)

import transformer_engine_ops as te

SEQ, BATCH, IN, OUT, GEMMS = 16, 2, 64, 32, 3
# Rows are the flattened (seq, batch) tokens: 32 in all, 16 per rank under SP.
SPLITS = [12, 0, 20]
SP_SPLITS = ([10, 0, 6], [2, 14, 0])  # per rank: each rank's own rows, one group empty

GROUPED = [
    f"grouped-{mode}-{'sp' if sp else 'nosp'}-{recipe}"
    for mode in ("column", "row")
    for sp in (False, True)
    for recipe in RECIPES
]


class _WithSplits(torch.nn.Module):
    """``grouped(x, splits)`` as a one-argument module (the splits as an int64 tensor)."""

    def __init__(self, grouped: te.GroupedLinear, splits: list[int]) -> None:
        super().__init__()
        self.grouped = grouped
        self.register_buffer("splits", torch.tensor(splits, dtype=torch.int64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.grouped(x, self.splits)


def _zero_outside(t: torch.Tensor, dim: int, rank: int, parts: int) -> torch.Tensor:
    """``t`` with every slice along ``dim`` but this rank's shard set to zero."""
    mask = torch.zeros_like(t)
    _chunk(mask, dim, rank, parts)  # shape check
    mask.narrow(dim, rank * (t.shape[dim] // parts), t.shape[dim] // parts).fill_(1)
    return t * mask


def _grouped(w: World, mode: str, sp: bool, recipe: str) -> dict[str, Any]:
    r, n = w.rank, w.size
    gen = torch.Generator().manual_seed(SEED + 11)
    x = torch.randn(SEQ, BATCH, IN, generator=gen).to(torch.bfloat16).to(w.device)
    dy = torch.randn(SEQ, BATCH, OUT, generator=gen).to(torch.bfloat16).to(w.device)
    splits = SPLITS
    if sp:  # this rank's rows of the sequence, and its own split counts
        x, dy, splits = _chunk(x, 0, r, n), _chunk(dy, 0, r, n), SP_SPLITS[r]

    def make(parallel: bool) -> te.GroupedLinear:
        torch.manual_seed(SEED)
        return te.GroupedLinear(
            GEMMS,
            IN,
            OUT,
            sequence_parallel=sp and parallel,
            tp_group=w.group if parallel else None,
            tp_size=n if parallel else 1,
            bias=False,  # TE refuses a bias with tp_size > 1
            params_dtype=torch.bfloat16,
            parallel_mode=mode if parallel else None,
            device=w.device,
        )

    layer, ref = make(True), make(False)
    assert layer.sequence_parallel == sp
    dim = 0 if mode == "column" else 1  # the sharded weight dim
    for i in range(GEMMS):
        got, full = getattr(layer, f"weight{i}"), getattr(ref, f"weight{i}")
        assert torch.equal(got, _chunk(full, dim, r, n)), f"weight{i} shard"
    names = ["output", "input grad"] + [f"weight{i} grad" for i in range(GEMMS)]
    if mode == "column":
        x_local, dy_local = x, _chunk(dy, -1, r, n)
    else:
        x_local, dy_local = _chunk(x, -1, r, n), dy
    eager, info = _compiled_matches_eager(
        _WithSplits(layer, splits),
        list(layer.parameters()),
        x_local,
        dy_local,
        recipe,
        "aot_eager",
        None,
        names,
    )
    model = _WithSplits(ref, splits)
    params = list(ref.parameters())
    if mode == "column":
        out, dx, *dws = _step(model, params, x, _zero_outside(dy, -1, r, n), recipe)
        want = [_chunk(out, -1, r, n), dx, *[_chunk(g, 0, r, n) for g in dws]]
    else:
        out, dx, *dws = _step(model, params, _zero_outside(x, -1, r, n), dy, recipe)
        want = [out, _chunk(dx, -1, r, n), *[_chunk(g, 1, r, n) for g in dws]]
    info["ref_rel_error"] = _compare_reference(eager, want, names, REF_TOL[recipe])
    return info


def run_grouped_case(w: World, name: str) -> dict[str, Any]:
    _, mode, sp, recipe = name.split("-")
    return _grouped(w, mode, sp == "sp", recipe)
