"""What each rank runs for the comm-GEMM overlap tests (``runtime/comm_overlap.py``),
dispatched from ``dist_cases.run_case``.

Each case runs one training step of a sequence-parallel module with overlap off, then
enables it for the TP group and runs the same step eagerly and compiled (fullgraph,
three steps, one graph, no break). Compiled always equals eager overlapped, bit for
bit. Against the non-overlapped step: on gloo the calls fall back to the plain
collectives and GEMMs (the column-parallel wgrad re-gather still runs asynchronously
behind dgrad), so the results are bitwise equal and no fused op runs; on NCCL the
symmetric-memory fused ops run (counted: every SP collective beside a bf16 GEMM, and
FP8 current scaling's reduce-scatters) and agree within bf16 rounding.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch
import torch.distributed as dist
from dist_cases import (
    RECIPES,
    SEED,
    World,
    _assert_equal,
    _chunk,
    _compiled_matches_eager,
    _rel_error,
    _step,
)

import transformer_engine_ops as te
from transformer_engine_ops.runtime import comm_overlap

# 64 rows: each rank's block of 32 suits the FP8 GEMM of the fused reduce-scatter.
SEQ, BATCH, HIDDEN, FFN, HEADS, GROUPS = 32, 2, 64, 128, 4, 2

OVERLAP = [
    f"overlap-{kind}-{recipe}"
    for kind in ("column", "row", "mlp", "transformer")
    for recipe in RECIPES
]
# gloo only: the fused path's wiring inside the ops (operand order, the gathered output
# gradient reused by wgrad, the bias added after, the output shapes), with the fused ops
# stood in for by their definitions (an all-gather then a matmul, a matmul then a
# reduce-scatter), since symmetric memory needs NCCL.
EMULATED = [f"overlap-emulated-{kind}-bf16" for kind in ("column", "row", "mlp", "transformer")]
# Overlapped vs non-overlapped on NCCL, relative Frobenius error (bf16 GEMMs chunked
# by rank, and the reduce-scatter summed in another order).
NCCL_TOL = 2e-2


def _module(w: World, kind: str) -> torch.nn.Module:
    torch.manual_seed(SEED)
    common = dict(tp_group=w.group, tp_size=w.size, sequence_parallel=True)
    common.update(params_dtype=torch.bfloat16, device=w.device)
    if kind == "mlp":
        return te.LayerNormMLP(HIDDEN, FFN, set_parallel_mode=True, **common)
    if kind == "transformer":  # QKV, fc1 column-; proj, fc2 row-parallel
        return te.TransformerLayer(
            HIDDEN,
            FFN,
            HEADS,
            num_gqa_groups=GROUPS,
            hidden_dropout=0.0,
            attention_dropout=0.0,
            set_parallel_mode=True,
            **common,
        )
    return te.Linear(HIDDEN, FFN if kind == "column" else HIDDEN, parallel_mode=kind, **common)


def _inputs(w: World, kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's input and output gradient: sequence shards where SP shards them."""
    gen = torch.Generator().manual_seed(SEED + 11)
    x = torch.randn(SEQ, BATCH, HIDDEN, generator=gen)
    out_features = FFN if kind == "column" else HIDDEN
    dy = torch.randn(SEQ, BATCH, out_features, generator=gen)
    r, n = w.rank, w.size
    if kind == "column":  # sequence-sharded input, feature-sharded output
        x, dy = _chunk(x, 0, r, n), _chunk(dy, -1, r, n)
    elif kind == "row":  # feature-sharded input, sequence-sharded output
        x, dy = _chunk(x, -1, r, n), _chunk(dy, 0, r, n)
    else:  # LayerNormMLP, TransformerLayer: sequence shards in and out
        x, dy = _chunk(x, 0, r, n), _chunk(dy, 0, r, n)
    return x.to(torch.bfloat16).to(w.device), dy.to(torch.bfloat16).to(w.device)


FUSED = ("all_gather_matmul", "matmul_reduce_scatter", "scaled_matmul_reduce_scatter")
# Fused calls per training step: bf16 fuses every SP collective beside a GEMM (Linear: 2,
# LayerNormMLP: 4, TransformerLayer: 8); FP8 current scaling only its reduce-scatters (the input is quantized
# after the all-gather, with the gathered tensor's scale).
PER_STEP = {
    ("column", "bf16"): 2,
    ("row", "bf16"): 2,
    ("mlp", "bf16"): 4,
    ("transformer", "bf16"): 8,
    ("column", "fp8_current"): 1,
    ("row", "fp8_current"): 1,
    ("mlp", "fp8_current"): 2,
    ("transformer", "fp8_current"): 4,
}


class _CountFused:
    """Counts calls of the fused ops for the duration of a ``with`` block."""

    def __enter__(self) -> Counter:
        self.saved = {name: getattr(comm_overlap, name) for name in FUSED}
        self.calls: Counter = Counter()
        for name, original in self.saved.items():
            setattr(comm_overlap, name, self._counting(name, original))
        return self.calls

    def _counting(self, name: str, original: Any) -> Any:
        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            return original(*args, **kwargs)

        return counted

    def __exit__(self, *exc: Any) -> None:
        for name, original in self.saved.items():
            setattr(comm_overlap, name, original)


class _Emulated:
    """For a ``with`` block: the fused path serves every call on an enabled group, the
    fused ops computed by their definitions with gloo's collectives."""

    def __enter__(self) -> None:
        names = ("fused_reason", "all_gather_matmul", "matmul_reduce_scatter")
        self.saved = {name: getattr(comm_overlap, name) for name in names}

        def fused_reason(group: Any, *operands: Any) -> str | None:
            return None if comm_overlap.enabled(group) else "overlap is not enabled"

        def all_gather_matmul(a: Any, b: Any, group: Any, *, return_gathered: bool) -> Any:
            gathered = a.new_empty((a.shape[0] * group.size(), a.shape[1]))
            dist.all_gather_into_tensor(gathered, a.contiguous(), group=group)
            return (gathered if return_gathered else None), gathered @ b

        def matmul_reduce_scatter(a: Any, b: Any, group: Any) -> Any:
            product = a @ b
            out = product.new_empty((product.shape[0] // group.size(), product.shape[1]))
            dist.reduce_scatter_tensor(out, product, group=group)
            return out

        comm_overlap.fused_reason = fused_reason
        comm_overlap.all_gather_matmul = all_gather_matmul
        comm_overlap.matmul_reduce_scatter = matmul_reduce_scatter

    def __exit__(self, *exc: Any) -> None:
        for name, original in self.saved.items():
            setattr(comm_overlap, name, original)


def run_overlap_case(w: World, name: str) -> dict[str, Any]:
    *_, kind, recipe = name.split("-")
    if name.startswith("overlap-emulated-"):
        with _Emulated():
            return _run(w, kind, recipe)
    return _run(w, kind, recipe)


def _run(w: World, kind: str, recipe: str) -> dict[str, Any]:
    module = _module(w, kind)
    params = list(module.parameters())
    names = ["output", "input grad"] + [f"{n} grad" for n, _ in module.named_parameters()]
    x, dy = _inputs(w, kind)
    assert not comm_overlap.enabled(w.group)
    plain = _step(module, params, x, dy, recipe)
    comm_overlap.enable(w.group)
    try:
        reason = comm_overlap.fused_reason(w.group, x)
        with _CountFused() as calls:
            overlapped, info = _compiled_matches_eager(
                module, params, x, dy, recipe, "aot_eager", None, names
            )
    finally:
        comm_overlap.disable(w.group)
    assert not comm_overlap.enabled(w.group)
    info["fused_reason"] = reason
    info["fused_calls"] = dict(calls)
    if reason is not None:
        assert not calls, f"a fused op ran although {reason}: {calls}"
        _assert_equal(overlapped, plain, names)
        return info
    # One eager and three compiled steps.
    assert sum(calls.values()) == 4 * PER_STEP[kind, recipe], dict(calls)
    errors = {n: _rel_error(o, p) for n, o, p in zip(names, overlapped, plain, strict=True)}
    info["rel_error_vs_plain"] = errors
    worst = max(errors, key=errors.get)
    assert errors[worst] <= NCCL_TOL, f"{worst}: overlapped vs plain {errors[worst]:.3g}"
    return info
