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
    _assert_equal,
    _chunk,
    _compare_reference,
    _compiled_matches_eager,
    _graph_breaks,
    _recipe,
    _step,
)
from torch._dynamo.utils import counters

import transformer_engine_ops as te

SEQ, BATCH, HIDDEN, OUT, FFN = 8, 2, 64, 32, 64

FAMILY = [
    f"family-{kind}-{'sp' if sp else 'nosp'}-{recipe}"
    for kind in ("lnl", "mlp")
    for sp in (False, True)
    for recipe in RECIPES
]
FAMILY += ["family-mlp-sp-swiglu-bf16"]
# LayerNormLinear column parallel + SP with TE's per-call arguments: weight caching
# across microbatches (eager; a named fallback under compile, as for Linear) and the
# quantized output under no_grad (compiled fullgraph).
FAMILY += ["family-lnl-sp-cache-fp8_current", "family-lnl-sp-fp8out-fp8_current"]
# LayerNormMLP given the TP group but set_parallel_mode=False: not partitioned, every
# rank holds (and computes) the whole single-process module.
FAMILY += ["family-mlp-unsplit"]
# LayerNormMLP (fc1 column-, fc2 row-parallel, SP) with TE's checkpoint: the backward's
# recompute gathers the norm output again (quantized, with the group's amax).
FAMILY += ["family-mlp-sp-checkpoint-fp8_current"]


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


def _make_lnl(w: World, sp: bool, parallel: bool, t: dict[str, torch.Tensor]) -> Any:
    torch.manual_seed(SEED)
    n = w.size
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


def _lnl_step(module: Any, x: torch.Tensor, dy: torch.Tensor, recipe: str, **kwargs: Any) -> list:
    params = list(module.parameters())
    for p in params:
        p.grad = None
    x = x.detach().clone().requires_grad_(True)
    with _recipe(recipe):
        y = module(x, **kwargs)
    y.backward(dy)
    return [y.detach().clone(), x.grad.clone(), *[p.grad.clone() for p in params]]


def _lnl_cache(w: World, recipe: str) -> dict[str, Any]:
    """Microbatches True, False, False: the same results as the uncached module, bit for
    bit, and the weight shard quantized once (the workspace object is reused)."""
    t = _tensors(w, OUT)
    r, n = w.rank, w.size
    cached, plain = _make_lnl(w, True, True, t), _make_lnl(w, True, True, t)
    x_local, dy_local = _chunk(t["x"], 0, r, n), _chunk(t["dy"], -1, r, n)
    names = ["output", "input grad", "ln weight grad", "ln bias grad", "weight grad", "bias grad"]
    workspaces = []
    for first in (True, False, False):
        got = _lnl_step(cached, x_local, dy_local, recipe, is_first_microbatch=first)
        _assert_equal(got, _lnl_step(plain, x_local, dy_local, recipe), names)
        workspaces.append(cached._weight_workspace)
    assert workspaces[0] is not None, "no workspace cached"
    assert workspaces[0] is workspaces[1] is workspaces[2], "the workspace was remade"
    return {"microbatches": 3}


def _lnl_fp8_output(w: World, recipe: str) -> dict[str, Any]:
    """The quantized output under no_grad: compiled (fullgraph) equal to eager, and to
    the single-process module's output quantized, on this rank's feature shard."""
    t = _tensors(w, OUT)
    r, n = w.rank, w.size
    layer = _make_lnl(w, True, True, t)
    x_local = _chunk(t["x"], 0, r, n)
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    with torch.no_grad(), _recipe(recipe):
        eager = layer(x_local, fp8_output=True)
        got = compiled(x_local, fp8_output=True)
        plain = layer(x_local)
    assert type(got) is type(eager) and type(eager) is not torch.Tensor, type(eager)
    assert got.shape == eager.shape == (SEQ, BATCH, OUT // n), tuple(got.shape)
    _assert_equal([got.dequantize()], [eager.dequantize()], ["quantized output"])
    assert _graph_breaks() == 0, dict(counters["graph_break"])
    # Quantizing only rounds: within the format's error of the unquantized output.
    err = (eager.dequantize().float() - plain.float()).abs().max().item()
    bound = 0.08 * plain.float().abs().max().item()
    assert 0 < err <= bound, f"quantized output error {err:.3g} (bound {bound:.3g})"
    return {"rel_error": err / plain.float().abs().max().item()}


def _lnl(w: World, sp: bool, recipe: str) -> dict[str, Any]:
    t = _tensors(w, OUT)
    r, n = w.rank, w.size

    layer, ref = _make_lnl(w, sp, True, t), _make_lnl(w, sp, False, t)
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


def _mlp_unsplit(w: World) -> dict[str, Any]:
    """TE's set_parallel_mode=False with a tp_group: the full weights on every rank (it
    used to slice this rank's rows and fail), the single-process module's output."""
    t = _tensors(w, HIDDEN)
    torch.manual_seed(SEED)
    module = te.LayerNormMLP(
        HIDDEN, FFN, tp_group=w.group, tp_size=w.size, set_parallel_mode=False
    ).to(torch.bfloat16)
    torch.manual_seed(SEED)
    single = te.LayerNormMLP(HIDDEN, FFN).to(torch.bfloat16)
    module, single = module.to(w.device), single.to(w.device)
    names = ["fc1_weight", "fc2_weight"]
    _assert_equal([getattr(module, n) for n in names], [getattr(single, n) for n in names], names)
    _assert_equal([module(t["x"])], [single(t["x"])], ["output"])
    return {"fc1_rows": module.fc1_weight.shape[0]}


def _mlp_checkpoint(w: World, recipe: str) -> dict[str, Any]:
    """TE's checkpoint on the tensor- and sequence-parallel LayerNormMLP: the gradients
    are the bits of the module without it, compiled equal to eager."""
    t = _tensors(w, HIDDEN)
    r, n = w.rank, w.size

    def make(checkpoint: bool) -> te.LayerNormMLP:
        torch.manual_seed(SEED)
        m = te.LayerNormMLP(
            HIDDEN,
            FFN,
            sequence_parallel=True,
            tp_group=w.group,
            tp_size=n,
            params_dtype=torch.bfloat16,
            set_parallel_mode=True,
            device=w.device,
            checkpoint=checkpoint,
        )
        _norm_params(m, t)
        return m

    names = ["output", "input grad", "ln weight grad", "ln bias grad"]
    names += ["fc1 weight grad", "fc1 bias grad", "fc2 weight grad", "fc2 bias grad"]
    x_local, dy_local = _chunk(t["x"], 0, r, n), _chunk(t["dy"], 0, r, n)
    model = make(True)
    eager, info = _compiled_matches_eager(
        model, list(model.parameters()), x_local, dy_local, recipe, "aot_eager", None, names
    )
    plain = make(False)
    _assert_equal(eager, _step(plain, list(plain.parameters()), x_local, dy_local, recipe), names)
    return info


def run_family_case(w: World, name: str) -> dict[str, Any]:
    if name == "family-mlp-unsplit":
        return _mlp_unsplit(w)
    if name.startswith("family-mlp-sp-checkpoint-"):
        return _mlp_checkpoint(w, name.rsplit("-", 1)[-1])
    parts = name.split("-")
    kind, sp = parts[1], parts[2] == "sp"
    recipe = parts[-1]
    if kind == "lnl" and len(parts) == 5:
        variant = {"cache": _lnl_cache, "fp8out": _lnl_fp8_output}[parts[3]]
        return variant(w, recipe)
    if kind == "lnl":
        return _lnl(w, sp, recipe)
    activation = parts[3] if len(parts) == 5 else "gelu"
    return _mlp(w, sp, recipe, activation)
