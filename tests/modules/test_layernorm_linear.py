"""LayerNormLinear: every recipe x bias compiled bitwise equal to eager, the plain
formula in bf16, quantized recipes within their bound, extra outputs, dynamic batch
sizes, quantized weights, TE's constructor and state-dict keys."""

from __future__ import annotations

import warnings

import pytest
import torch
from family_cases import (
    assert_close_to_reference,
    compile_and_compare,
    make,
    make_input,
    reference_step,
    step,
)
from module_cases import RECIPES, assert_bitwise, graph_breaks, recipe_context, unique_graphs

import transformer_engine_ops as te
from transformer_engine_ops.runtime.fallback import EagerFallbackWarning

KIND = "layernorm_linear"
AOT = "aot_eager"


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("recipe", list(RECIPES))
def test_compiled_is_bitwise_equal_to_eager(recipe, bias):
    compile_and_compare(make(KIND, bias=bias), recipe)


@pytest.mark.parametrize(("recipe", "bias"), [("bf16", True), ("mxfp8", False)])
def test_compiled_on_inductor_is_bitwise_equal_to_eager(recipe, bias):
    compile_and_compare(make(KIND, bias=bias), recipe, backend="inductor")


def test_rmsnorm_zero_centered_compiles_bitwise_equal_to_eager():
    compile_and_compare(make(KIND, normalization="RMSNorm", zero_centered_gamma=True), "nvfp4")


@pytest.mark.parametrize("zero_centered_gamma", [False, True])
@pytest.mark.parametrize("normalization", ["LayerNorm", "RMSNorm"])
def test_bf16_eager_matches_the_torch_formula(normalization, zero_centered_gamma):
    module = make(KIND, normalization=normalization, zero_centered_gamma=zero_centered_gamma)
    x = make_input()
    assert_close_to_reference(step(module, x, "bf16"), reference_step(module, KIND, x), 2e-2)


# Output error bound relative to the output's max: FP8 (3 mantissa bits, E4M3) and
# block formats stay within a few percent; NVFP4 (E2M1, 1 mantissa bit) within ~25%.
BOUNDS = {"fp8_current": 0.08, "mxfp8": 0.08, "fp8_block": 0.08, "nvfp4": 0.25}


@pytest.mark.parametrize("recipe", list(BOUNDS))
def test_quantized_output_is_within_the_format_bound(recipe):
    module, x = make(KIND), make_input()
    y = step(module, x, recipe)[0]
    ref = reference_step(module, KIND, x)[0]
    err = (y.float() - ref).abs().max() / ref.abs().max()
    assert err <= BOUNDS[recipe], f"{recipe}: relative error {err:.3f}"
    assert err > 0  # the GEMM did run quantized


def _two_output_step(module, x, recipe):
    for p in module.parameters():
        p.grad = None
    x = x.detach().clone().requires_grad_(True)
    with recipe_context(recipe):
        y, ln_out = module(x)
    (y.float().square().sum() + 3 * ln_out.float().sum()).backward()
    return (y, ln_out), x.grad, [p.grad for p in module.parameters()]


@pytest.mark.parametrize("recipe", ["bf16", "fp8_block"])
def test_return_layernorm_output_returns_the_norm_and_takes_its_gradient(recipe):
    module = make(KIND, return_layernorm_output=True)
    x = make_input()
    (y, ln_out), dx, grads = _two_output_step(module, x, recipe)
    expected_ln = torch.nn.functional.layer_norm(
        x.float(), (64,), module.layer_norm_weight.float(), module.layer_norm_bias.float()
    )
    assert (ln_out.float() - expected_ln).abs().max() < 2e-2 * expected_ln.abs().max()
    compiled = torch.compile(module, fullgraph=True, backend=AOT)
    (cy, cln), cdx, cgrads = _two_output_step(compiled, x, recipe)
    assert graph_breaks() == 0
    assert torch.equal(cy, y) and torch.equal(cln, ln_out) and torch.equal(cdx, dx)
    assert all(torch.equal(a, b) for a, b in zip(grads, cgrads, strict=True))
    # The ln_out gradient reaches the norm: without it, the input grad differs.
    plain = make(KIND)
    _, plain_dx, _ = _two_output_step_single(plain, x, recipe)
    assert not torch.equal(plain_dx, dx)


def _two_output_step_single(module, x, recipe):
    x = x.detach().clone().requires_grad_(True)
    with recipe_context(recipe):
        y = module(x)
    y.float().square().sum().backward()
    return y, x.grad, None


def test_return_bias_returns_the_bias_unapplied():
    module = make(KIND, return_bias=True)
    plain = make(KIND)
    x = make_input()
    y, b = module(x)
    assert b is module.bias or torch.equal(b, module.bias)
    # bf16 rounding of y before the bias add: within a couple of bf16 ulps
    assert torch.allclose(y.float() + b.float(), plain(x).float(), atol=2e-2, rtol=1e-2)
    assert not torch.allclose(y.float(), plain(x).float(), atol=2e-2, rtol=1e-2)


@pytest.mark.parametrize("recipe", ["bf16", "fp8_current", "mxfp8"])
def test_dynamic_batch_sizes_share_one_graph(recipe):
    module = make(KIND)
    compiled = torch.compile(module, fullgraph=True, backend=AOT, dynamic=True)
    for batch in (2, 3, 5, 6, 8):
        x = make_input(batch=batch, seed=batch)
        assert_bitwise(step(compiled, x, recipe), step(module, x, recipe))
    assert unique_graphs() == 1
    assert graph_breaks() == 0


@pytest.mark.parametrize("recipe", ["fp8_current", "mxfp8"])
def test_quantized_model_init_weight_compiles_and_matches_eager(recipe):
    with te.quantized_model_init(recipe=RECIPES[recipe]()):
        module = make(KIND)
    assert type(module.weight.data) is not torch.Tensor
    compile_and_compare(module, recipe)


def test_train_eval_train_agrees_with_eager():
    module, x = make(KIND), make_input()
    compiled = torch.compile(module, fullgraph=True, backend=AOT)
    for mode in (True, False, True):
        module.train(mode)
        assert_bitwise(step(compiled, x, "fp8_current"), step(module, x, "fp8_current"))
    with torch.no_grad():
        assert torch.equal(compiled(x), module(x))
    assert graph_breaks() == 0


# --- TE's constructor and state dict ----------------------------------------------------


def test_te_positional_arguments_mean_what_they_mean_in_te():
    # TE: (in_features, out_features, eps, sequence_parallel, fuse_wgrad_accumulation,
    #      tp_group, tp_size, get_rng_state_tracker, init_method, bias, normalization)
    m = te.LayerNormLinear(64, 32, 1e-3, False, False, None, 1, None, None, False, "RMSNorm")
    assert (m.eps, m.bias, m.normalization, m.layer_norm_bias) == (1e-3, None, "RMSNorm", None)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(parameters_split=("a", "b")),
        dict(fuse_wgrad_accumulation=True),
        dict(ub_overlap_ag=True),
        dict(return_layernorm_output_gathered=True),
        dict(delay_wgrad_compute=True),
        dict(parallel_mode="row"),
    ],
    ids=lambda kw: next(iter(kw)),
)
def test_unimplemented_arguments_raise_naming_them(kwargs):
    name = next(iter(kwargs))
    with pytest.raises(NotImplementedError, match=name):
        te.LayerNormLinear(64, 32, **kwargs)


def test_unimplemented_forward_arguments_raise_naming_them():
    module, x = make(KIND), make_input()
    for kwargs in (dict(is_first_microbatch=True), dict(fp8_output=True)):
        with pytest.raises(NotImplementedError, match=next(iter(kwargs))):
            module(x, **kwargs)


def test_bad_normalization_is_named():
    with pytest.raises(ValueError, match="normalization must be"):
        te.LayerNormLinear(64, 32, normalization="BatchNorm")


# TE 2.20.2's LayerNormLinear(64, 32) state dict: names and shapes.
TE_KEYS = {
    "layer_norm_weight": (64,),
    "layer_norm_bias": (64,),
    "weight": (32, 64),
    "bias": (32,),
    "_extra_state": (0,),
}


@pytest.mark.parametrize("normalization", ["LayerNorm", "RMSNorm"])
def test_state_dict_has_te_keys_and_loads_strictly_both_ways(normalization):
    a = make(KIND, normalization=normalization)
    b = make(KIND, normalization=normalization, seed=5)
    state = a.state_dict()
    expected = dict(TE_KEYS)
    if normalization == "RMSNorm":
        del expected["layer_norm_bias"]
    assert {k: tuple(v.shape) for k, v in state.items()} == expected
    b.load_state_dict(state, strict=True)
    x = make_input()
    assert torch.equal(b(x), a(x))
    a.load_state_dict(b.state_dict(), strict=True)


def test_delayed_scaling_falls_back_eagerly_with_its_reason_and_matches_eager():
    module, x = make(KIND), make_input()
    # The module keeps its delayed-scaling state across calls: the eager twin starts fresh.
    twin = make(KIND)
    compiled = torch.compile(module, backend=AOT)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with te.autocast(recipe=te.recipe.DelayedScaling()):
            got = compiled(x)
    with te.autocast(recipe=te.recipe.DelayedScaling()):
        expected = twin(x)
    assert torch.equal(got, expected)
    reasons = [str(w.message) for w in caught if issubclass(w.category, EagerFallbackWarning)]
    assert len(reasons) == 1 and "DelayedScaling" in reasons[0], reasons
