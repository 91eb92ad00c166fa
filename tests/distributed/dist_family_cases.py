"""What each rank runs for the distributed LayerNormLinear and LayerNormMLP tests
(dispatched from ``dist_cases.run_case``; same records, same comparisons).

Each case builds the tensor-parallel module and the single-process module from the
same seed (every rank draws the same full weights and keeps its shard), checks the
compiled module bitwise against eager on two ranks, and eager against the slices of
the single-process result. Under sequence parallelism each rank's norm-parameter
gradients cover its own sequence rows (TE leaves their sum to the framework), so they
are compared with the single-process module run on those rows.
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

SEQ, BATCH, HIDDEN, OUT, FFN = 8, 2, 64, 32, 64

FAMILY = [
    f"family-{kind}-{'sp' if sp else 'nosp'}-{recipe}"
    for kind in ("lnl", "mlp")
    for sp in (False, True)
    for recipe in RECIPES
]
FAMILY += ["family-mlp-sp-swiglu-bf16"]


def _tensors(w: World, out_features: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(SEED + 7)
    t = {
        "x": torch.randn(SEQ, BATCH, HIDDEN, generator=gen),
        "dy": torch.randn(SEQ, BATCH, out_features, generator=gen),
        "ln_w": 1 + 0.2 * torch.randn(HIDDEN, generator=gen),
        "ln_b": 0.2 * torch.randn(HIDDEN, generator=gen),
    }
    return {k: v.to(torch.bfloat16).to(w.device) for k, v in t.items()}


def _norm_params(module: Any, t: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        module.layer_norm_weight.copy_(t["ln_w"])
        module.layer_norm_bias.copy_(t["ln_b"])


def _lnl(w: World, sp: bool, recipe: str) -> dict[str, Any]:
    t = _tensors(w, OUT)
    r, n = w.rank, w.size

    def make(parallel: bool) -> te.LayerNormLinear:
        torch.manual_seed(SEED)
        m = te.LayerNormLinear(
            HIDDEN,
            OUT,
            sequence_parallel=sp and parallel,
            tp_group=w.group if parallel else None,
            tp_size=n if parallel else 1,
            params_dtype=torch.bfloat16,
            parallel_mode="column" if parallel else None,
            device=w.device,
        )
        _norm_params(m, t)
        return m

    layer, ref = make(True), make(False)
    assert torch.equal(layer.weight, _chunk(ref.weight, 0, r, n)), "weight shard"
    names = ["output", "input grad", "ln weight grad", "ln bias grad", "weight grad", "bias grad"]
    x_local = _chunk(t["x"], 0, r, n) if sp else t["x"]
    # The output is this rank's feature shard of every row (SP gathers before the GEMM).
    dy_local = _chunk(t["dy"], -1, r, n)
    params = list(layer.parameters())
    eager, info = _compiled_matches_eager(
        layer, params, x_local, dy_local, recipe, "aot_eager", None, names
    )
    out, dx, dlw, dlb, dw, db = _step(ref, list(ref.parameters()), t["x"], t["dy"], recipe)
    if sp:  # the norm gradients of this rank's rows
        rows = _step(ref, list(ref.parameters()), x_local, _chunk(t["dy"], 0, r, n), recipe)
        dlw, dlb = rows[2], rows[3]
    want = [
        _chunk(out, -1, r, n),
        _chunk(dx, 0, r, n) if sp else dx,
        dlw,
        dlb,
        _chunk(dw, 0, r, n),
        _chunk(db, 0, r, n),
    ]
    info["ref_rel_error"] = _compare_reference(eager, want, names, REF_TOL[recipe])
    return info


def _mlp(w: World, sp: bool, recipe: str, activation: str) -> dict[str, Any]:
    t = _tensors(w, HIDDEN)
    r, n = w.rank, w.size

    def make(parallel: bool) -> te.LayerNormMLP:
        torch.manual_seed(SEED)
        m = te.LayerNormMLP(
            HIDDEN,
            FFN,
            sequence_parallel=sp and parallel,
            tp_group=w.group if parallel else None,
            tp_size=n if parallel else 1,
            params_dtype=torch.bfloat16,
            activation=activation,
            set_parallel_mode=parallel,
            device=w.device,
        )
        _norm_params(m, t)
        with torch.no_grad():
            gen = torch.Generator().manual_seed(SEED + 3)
            full1 = 0.1 * torch.randn(m.fc1_bias.shape[0] * (n if parallel else 1), generator=gen)
            full2 = 0.1 * torch.randn(HIDDEN, generator=gen)
            halves = 2 if activation == "swiglu" else 1
            if parallel:
                full1 = torch.cat([_chunk(h, 0, r, n) for h in full1.chunk(halves)])
            m.fc1_bias.copy_(full1.to(torch.bfloat16))
            m.fc2_bias.copy_(full2.to(torch.bfloat16))
        return m

    model, ref = make(True), make(False)
    halves = 2 if activation == "swiglu" else 1

    def fc1_shard(full: torch.Tensor) -> torch.Tensor:
        return torch.cat([_chunk(h, 0, r, n) for h in full.chunk(halves)])

    assert torch.equal(model.fc1_weight, fc1_shard(ref.fc1_weight)), "fc1 shard"
    assert torch.equal(model.fc2_weight, _chunk(ref.fc2_weight, 1, r, n)), "fc2 shard"
    names = ["output", "input grad", "ln weight grad", "ln bias grad"]
    names += ["fc1 weight grad", "fc1 bias grad", "fc2 weight grad", "fc2 bias grad"]
    x_local = _chunk(t["x"], 0, r, n) if sp else t["x"]
    dy_local = _chunk(t["dy"], 0, r, n) if sp else t["dy"]
    eager, info = _compiled_matches_eager(
        model, list(model.parameters()), x_local, dy_local, recipe, "aot_eager", None, names
    )
    out, dx, dlw, dlb, dw1, db1, dw2, db2 = _step(
        ref, list(ref.parameters()), t["x"], t["dy"], recipe
    )
    if sp:
        rows = _step(ref, list(ref.parameters()), x_local, dy_local, recipe)
        dlw, dlb = rows[2], rows[3]
    want = [
        _chunk(out, 0, r, n) if sp else out,
        _chunk(dx, 0, r, n) if sp else dx,
        dlw,
        dlb,
        fc1_shard(dw1),
        fc1_shard(db1),
        _chunk(dw2, 1, r, n),
        db2,
    ]
    info["ref_rel_error"] = _compare_reference(eager, want, names, REF_TOL[recipe])
    return info


def run_family_case(w: World, name: str) -> dict[str, Any]:
    parts = name.split("-")
    kind, sp = parts[1], parts[2] == "sp"
    recipe = parts[-1]
    if kind == "lnl":
        return _lnl(w, sp, recipe)
    activation = parts[3] if len(parts) == 5 else "gelu"
    return _mlp(w, sp, recipe, activation)
