"""LayerNormLinear and GroupedLinear treat a recipe as ``Linear`` does: the
recipe's GEMM settings reach their GEMMs, its ``backward_override`` runs the backward it
names, ``quantized_model_init`` under delayed scaling seeds each weight's scale from its
own amax, and GroupedLinear keeps one delayed-scaling state per GEMM (as TE keeps FP8
metadata per GEMM), saved in ``_extra_state`` and loadable with ``weights_only=True``."""

from __future__ import annotations

import io
import types
from typing import Any

import pytest
import torch
from family_cases import HIDDEN, OUT, make, make_input
from module_cases import RECIPES

import transformer_engine_ops as te
from transformer_engine_ops.modules import grouped_linear, layernorm_linear
from transformer_engine_ops.quantization import DelayedScaling

LNL = "layernorm_linear"
OVERRIDES = ["high_precision", "dequantized"]


def rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    return ((got.float() - ref.float()).norm() / ref.float().norm()).item()


def _grouped(num_gemms: int = 2, dtype: torch.dtype = torch.bfloat16, **kwargs) -> te.GroupedLinear:
    torch.manual_seed(0)
    module = te.GroupedLinear(num_gemms, HIDDEN, OUT, params_dtype=dtype, **kwargs)
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in module.parameters():
            if type(p.data) is torch.Tensor:
                p.copy_((torch.randn(p.shape, generator=gen) * 0.1).to(p.dtype))
    return module


def _run(module, x, recipe, *extra):
    """Output and every gradient (parameters, then input) of ``sum(y)``: its output
    gradient (all ones) does not depend on the recipe, so gradients of backwards that
    run unquantized on the same tensors are equal bit for bit."""
    x = x.detach().requires_grad_(True)
    with te.autocast(enabled=recipe is not None, recipe=recipe):
        y = module(x, *extra)
    y.float().sum().backward()
    params = list(module.parameters())
    grads = [p.grad.clone() for p in params] + [x.grad.clone()]
    for p in params:
        p.grad = None
    return y.detach(), grads


def _assert_equal(a, b):
    for i, (ga, gb) in enumerate(zip(a, b, strict=True)):
        assert torch.equal(ga, gb), f"gradient {i} differs"


# --- the recipe's GEMM settings ------------------------------------------------------


def _recipe_with_gemms(split: bool) -> te.recipe.Float8CurrentScaling:
    mm = te.recipe.MMParams(use_split_accumulator=split)
    return te.recipe.Float8CurrentScaling(fp8_gemm_fprop=mm, fp8_gemm_dgrad=mm, fp8_gemm_wgrad=mm)


def _captured(module_file, monkeypatch, call):
    """The fields a module hands its ``call_<op>`` by name, as attributes (the op itself
    not run)."""
    seen = []
    entry = "call_" + module_file.__name__.rsplit(".", 1)[-1]

    def record(keep: Any = None, **fields: Any) -> tuple[int]:
        seen.append(types.SimpleNamespace(**fields))
        return (0,)

    monkeypatch.setattr(module_file, entry, record)
    call()
    return seen[0]


@pytest.mark.parametrize("split", [True, False])
def test_layernorm_linear_passes_the_recipes_gemm_settings(split, monkeypatch):
    module = make(LNL)

    def call():
        with te.autocast(recipe=_recipe_with_gemms(split)):
            module(make_input())

    args = _captured(layernorm_linear, monkeypatch, call)
    mm = te.recipe.MMParams(use_split_accumulator=split)
    assert args.fprop_gemm == args.dgrad_gemm == args.wgrad_gemm == mm


@pytest.mark.parametrize("split", [True, False])
def test_grouped_linear_passes_the_recipes_gemm_settings(split, monkeypatch):
    module = _grouped()
    x = make_input().reshape(-1, HIDDEN)

    def call():
        with te.autocast(recipe=_recipe_with_gemms(split)):
            module(x, [64, 64])

    mm = te.recipe.MMParams(use_split_accumulator=split)
    # The loop over GEMMs (grouped_linear) takes all three settings; the grouped-GEMM op,
    # which serves a stateless recipe where it can, takes fprop's and dgrad's.
    seen = []

    def record(keep: Any = None, **fields: Any) -> tuple[int]:
        seen.append(types.SimpleNamespace(**fields))
        return (0,)

    monkeypatch.setattr(grouped_linear, "call_grouped_gemm", record)
    monkeypatch.setattr(grouped_linear, "call_grouped_linear", record)
    call()
    args = seen[0]
    assert args.fprop_gemm == args.dgrad_gemm == mm
    assert getattr(args, "wgrad_gemm", mm) == mm


# --- backward_override ---------------------------------------------------------------


@pytest.mark.parametrize("recipe", ["fp8_current", "mxfp8"])
def test_layernorm_linear_high_precision_backward_gives_the_unquantized_gradients(recipe):
    module, x = make(LNL), make_input()
    _, plain = _run(module, x, None)
    _, quantized = _run(module, x, RECIPES[recipe]())
    _, high = _run(module, x, RECIPES[recipe](backward_override="high_precision"))
    _assert_equal(high, plain)
    assert not torch.equal(quantized[2], plain[2])  # the weight gradient: quantized GEMM


@pytest.mark.parametrize("override", OVERRIDES)
def test_layernorm_linear_backward_override_matches_layernorm_then_linear(override):
    """LayerNormLinear under an override equals te.LayerNorm -> te.Linear under it."""
    module, x = make(LNL), make_input()
    norm = te.LayerNorm(HIDDEN, params_dtype=torch.bfloat16)
    linear = te.Linear(HIDDEN, OUT, params_dtype=torch.bfloat16)
    with torch.no_grad():
        norm.weight.copy_(module.layer_norm_weight)
        norm.bias.copy_(module.layer_norm_bias)
        linear.weight.copy_(module.weight)
        linear.bias.copy_(module.bias)
    recipe = RECIPES["fp8_current"](backward_override=override)
    y, got = _run(module, x, recipe)
    y_ref, ref = _run(torch.nn.Sequential(norm, linear), x, recipe)
    assert torch.equal(y, y_ref)
    for i, (g, r) in enumerate(zip(got, ref, strict=True)):
        torch.testing.assert_close(g, r, rtol=0, atol=0, msg=f"gradient {i}")


def test_layernorm_linear_dequantized_backward_differs_from_both_others():
    module, x = make(LNL), make_input()
    _, quantized = _run(module, x, RECIPES["fp8_current"]())
    _, high = _run(module, x, RECIPES["fp8_current"](backward_override="high_precision"))
    _, deq = _run(module, x, RECIPES["fp8_current"](backward_override="dequantized"))
    # The weight gradient: from the dequantized norm output, not the exact one, nor an
    # FP8 GEMM on a quantized output gradient (sum's ones quantize exactly).
    assert not torch.equal(deq[2], high[2])


@pytest.mark.parametrize("override", OVERRIDES)
def test_layernorm_linear_backward_override_compiles_equal_to_eager(override):
    module, x = make(LNL), make_input()
    recipe = RECIPES["fp8_current"](backward_override=override)
    eager = _run(module, x, recipe)
    compiled = torch.compile(module, fullgraph=True, backend="aot_eager")
    got = _run(compiled, x, recipe)
    assert torch.equal(got[0], eager[0])
    _assert_equal(got[1], eager[1])


@pytest.mark.parametrize("recipe", ["fp8_current", "fp8_block"])
def test_grouped_linear_high_precision_backward_gives_the_unquantized_gradients(recipe):
    module = _grouped()
    x = make_input().reshape(-1, HIDDEN)
    _, plain = _run(module, x, None, [100, 28])
    _, quantized = _run(module, x, RECIPES[recipe](), [100, 28])
    _, high = _run(module, x, RECIPES[recipe](backward_override="high_precision"), [100, 28])
    _assert_equal(high, plain)
    assert not torch.equal(quantized[0], plain[0])


@pytest.mark.parametrize("override", OVERRIDES)
def test_grouped_linear_backward_override_compiles_equal_to_eager(override):
    module = _grouped()
    x = make_input().reshape(-1, HIDDEN)
    splits = torch.tensor([100, 28])
    recipe = RECIPES["mxfp8"](backward_override=override)
    eager = _run(module, x, recipe, splits)
    compiled = torch.compile(module, fullgraph=True, backend="aot_eager")
    got = _run(compiled, x, recipe, splits)
    assert torch.equal(got[0], eager[0])
    _assert_equal(got[1], eager[1])


@pytest.mark.parametrize("override", OVERRIDES)
def test_grouped_linear_backward_override_matches_one_linear_per_group(override):
    module = _grouped()
    x = make_input().reshape(-1, HIDDEN)
    splits = [100, 28]
    recipe = RECIPES["fp8_current"](backward_override=override)
    y, got = _run(module, x, recipe, splits)
    outs, ref_param_grads, ref_dx = [], [], []
    for i, x_i in enumerate(x.split(splits)):
        linear = te.Linear(HIDDEN, OUT, params_dtype=torch.bfloat16)
        with torch.no_grad():
            linear.weight.copy_(getattr(module, f"weight{i}"))
            linear.bias.copy_(getattr(module, f"bias{i}"))
        y_i, grads_i = _run(linear, x_i, recipe)
        outs.append(y_i)
        ref_param_grads.append(grads_i[:2])
        ref_dx.append(grads_i[2])
    assert torch.equal(y, torch.cat(outs))
    # GroupedLinear registers weight0, bias0, weight1, bias1, ...
    _assert_equal(got[:-1], [g for pair in ref_param_grads for g in pair])
    assert torch.equal(got[-1], torch.cat(ref_dx))


# --- delayed scaling -----------------------------------------------------------------


def test_layernorm_linear_quantized_model_init_seeds_the_delayed_scale_from_its_weight():
    def small(w):
        torch.nn.init.normal_(w, std=1e-3)

    torch.manual_seed(0)
    with te.quantized_model_init(recipe=DelayedScaling()):
        quantized = te.LayerNormLinear(HIDDEN, OUT, init_method=small)
    torch.manual_seed(0)
    plain = te.LayerNormLinear(HIDDEN, OUT, init_method=small)
    assert rel_err(quantized.weight.dequantize(), plain.weight) < 2**-4
    torch.testing.assert_close(
        quantized.weight.dequantize().abs().max(), plain.weight.abs().max(), rtol=1e-6, atol=0
    )


def _far_apart_grouped() -> te.GroupedLinear:
    """GEMM 0's weights around 1e-4, GEMM 1's around 1e2: one shared per-tensor FP8
    scale flushes GEMM 0's weights to zero."""
    module = _grouped(dtype=torch.float32, bias=False)
    with torch.no_grad():
        module.weight0.mul_(1e-3)
        module.weight1.mul_(1e3)
    return module


def _grouped_delayed_steps(module, steps, seed=0):
    outs = []
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(16, HIDDEN, generator=gen)
        with te.autocast(recipe=DelayedScaling()):
            y = module(x, [8, 8])
        y.sum().backward()
        outs.append((x, y.detach()))
    return outs


def _grouped_reference(module, x, splits):
    ws = [getattr(module, f"weight{i}").detach() for i in range(module.num_gemms)]
    return torch.cat([x_i @ w.T for x_i, w in zip(x.split(splits), ws, strict=True)])


def test_grouped_linear_gemms_keep_their_own_delayed_scaling_state_and_stay_accurate():
    module = _far_apart_grouped()
    for step, (x, y) in enumerate(_grouped_delayed_steps(module, 5)):
        if step < 2:
            continue  # scales from no (or a garbage) history, as in TE
        ref = _grouped_reference(module, x, [8, 8])
        for i, (got, want) in enumerate(zip(y.split(8), ref.split(8), strict=True)):
            assert rel_err(got, want) < 0.1, (step, i)
    state = module.state_dict()["_extra_state"]
    assert state["scale_fwd"][1] > 1e3 * state["gemm1"]["scale_fwd"][1]


def test_grouped_linear_scaling_state_round_trips_through_weights_only_load():
    trained = _far_apart_grouped()
    _grouped_delayed_steps(trained, 3)
    buffer = io.BytesIO()
    torch.save(trained.state_dict(), buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)
    assert set(state["_extra_state"]) >= {"scale_fwd", "amax_history_fwd", "gemm1"}
    fresh = _grouped(dtype=torch.float32, bias=False)
    fresh.load_state_dict(state, strict=True)
    for key in ("scale_fwd", "scale_bwd", "amax_history_fwd", "amax_history_bwd"):
        assert torch.equal(fresh.state_dict()["_extra_state"][key], state["_extra_state"][key])
        assert torch.equal(
            fresh.state_dict()["_extra_state"]["gemm1"][key], state["_extra_state"]["gemm1"][key]
        )
    ((_, want),) = _grouped_delayed_steps(trained, 1, seed=9)
    ((_, got),) = _grouped_delayed_steps(fresh, 1, seed=9)
    assert torch.equal(got, want)


def test_a_scaling_state_of_another_gemm_count_is_refused_before_anything_loads():
    """A GroupedLinear's _extra_state keeps one entry per further GEMM; a state saved by a
    module with fewer (or more) GEMMs names what is missing (or extra) instead of loading
    the first GEMM's state and leaving the others silently as they were."""
    trained = _far_apart_grouped()
    _grouped_delayed_steps(trained, 2)
    state = trained.state_dict()
    three = _grouped(num_gemms=3, dtype=torch.float32, bias=False)
    three_state = three.state_dict()
    with pytest.raises(ValueError, match=r"missing \['gemm2'\], unexpected \[\]"):
        three.load_state_dict({**three_state, "_extra_state": state["_extra_state"]})
    assert torch.equal(three.state_dict()["_extra_state"], three_state["_extra_state"])
    one_gemm_state = {k: v for k, v in state["_extra_state"].items() if k != "gemm1"}
    fresh = _grouped(dtype=torch.float32, bias=False)
    with pytest.raises(ValueError, match=r"missing \['gemm1'\]"):
        fresh.load_state_dict({**state, "_extra_state": one_gemm_state})
    extra = {**state["_extra_state"], "gemm7": state["_extra_state"]["gemm1"]}
    with pytest.raises(ValueError, match=r"unexpected \['gemm7'\]"):
        fresh.load_state_dict({**state, "_extra_state": extra})
    fresh.load_state_dict(state)  # the matching state still loads


def test_grouped_linear_quantized_model_init_seeds_each_gemms_scale_from_its_own_weight():
    stds = [1e-4, 10.0]
    calls = iter(stds * 2)

    def init(w):
        torch.nn.init.normal_(w, std=next(calls))

    torch.manual_seed(0)
    with te.quantized_model_init(recipe=DelayedScaling()):
        quantized = te.GroupedLinear(2, HIDDEN, OUT, init_method=init, bias=False)
    torch.manual_seed(0)
    plain = te.GroupedLinear(2, HIDDEN, OUT, init_method=init, bias=False)
    for i in range(2):
        q, p = getattr(quantized, f"weight{i}"), getattr(plain, f"weight{i}")
        assert rel_err(q.dequantize(), p) < 2**-4, i
        torch.testing.assert_close(q.dequantize().abs().max(), p.abs().max(), rtol=1e-6, atol=0)


# --- backward_override with weight caching -------------------------------------------


@pytest.fixture
def weight_quantizations(monkeypatch):
    """How many times a weight-shaped tensor was quantized (every format quantizes
    through ``Quantizer.quantize``; no activation or gradient here has that shape)."""
    from transformer_engine_ops.quantization.quantizer import Quantizer

    calls = []
    original = Quantizer.quantize

    def counting(self, t):
        if tuple(t.shape) == (OUT, HIDDEN):
            calls.append(type(self).__name__)
        return original(self, t)

    monkeypatch.setattr(Quantizer, "quantize", counting)
    return calls


@pytest.mark.parametrize("override", OVERRIDES)
@pytest.mark.parametrize("kind", [LNL, "grouped_linear"])
def test_later_microbatches_under_a_backward_override_reuse_the_cached_weights(
    kind, override, weight_quantizations
):
    """The override's backward reads no columnwise weight, so the cached workspace
    (made without it) serves the later microbatches as it is."""
    if kind == LNL:
        cached, plain, x, extra = make(LNL), make(LNL), make_input(), ()
    else:
        cached, plain = _grouped(), _grouped()
        x, extra = make_input().reshape(-1, HIDDEN), ([100, 28],)
    recipe = RECIPES["mxfp8"](backward_override=override)
    want = _run(plain, x, recipe, *extra)
    for first in (True, False, False):
        before = len(weight_quantizations)
        got = _run(cached, x, recipe, *extra, first)
        if not first:
            assert len(weight_quantizations) == before, "a later microbatch quantized a weight"
        assert torch.equal(got[0], want[0])
        _assert_equal(got[1], want[1])


def test_grouped_linear_high_precision_backward_quantizes_no_weight(weight_quantizations):
    module = _grouped()
    x = make_input().reshape(-1, HIDDEN).requires_grad_(True)
    with te.autocast(recipe=RECIPES["fp8_current"](backward_override="high_precision")):
        y = module(x, [100, 28])
    forward = len(weight_quantizations)
    assert forward == 2  # each GEMM's fprop
    y.float().sum().backward()
    assert len(weight_quantizations) == forward
