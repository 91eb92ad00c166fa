"""LayerNormLinear: every recipe x bias compiled bitwise equal to eager, the plain
formula in bf16, quantized recipes within their bound, extra outputs, dynamic batch
sizes, quantized weights, the quantized output (``fp8_output``), weight caching across
microbatches (``is_first_microbatch``), TE's constructor and state-dict keys."""

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
from module_cases import (
    QUANTIZED,
    RECIPES,
    assert_bitwise,
    graph_breaks,
    recipe_context,
    unique_graphs,
)

import transformer_engine_ops as te
from transformer_engine_ops.modules.autocast import STATE
from transformer_engine_ops.quantization.quantizer import QuantizedTensor, Quantizer
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
        dict(ub_overlap_ag=True),
        dict(return_layernorm_output_gathered=True),
    ],
    ids=lambda kw: next(iter(kw)),
)
def test_unimplemented_arguments_raise_naming_them(kwargs):
    name = next(iter(kwargs))
    with pytest.raises(NotImplementedError, match=name):
        te.LayerNormLinear(64, 32, **kwargs)


def test_unimplemented_forward_arguments_raise_naming_them():
    module, x = make(KIND), make_input()
    with pytest.raises(NotImplementedError, match="fp8_grad"):
        module(x, fp8_grad=True)


def test_row_parallel_is_refused_as_te_refuses_it():
    # TE 2.20.2: NotImplementedError("Normalization does not support tensor-parallel
    # distribution."): the norm needs the whole hidden dim a row-parallel input shards.
    with pytest.raises(NotImplementedError, match="parallel_mode='row'.*normalization"):
        te.LayerNormLinear(64, 32, parallel_mode="row")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(parallel_mode="diagonal"), "parallel_mode must be one of"),
        (dict(parallel_mode="column", tp_size=2), "parallel_mode='column' with tp_size=2 needs"),
        (dict(parallel_mode="column", tp_size=0), "tp_size must be a positive int"),
    ],
)
def test_parallelism_errors_name_the_module_class(kwargs, message):
    with pytest.raises(ValueError, match=f"^LayerNormLinear: {message}"):
        te.LayerNormLinear(64, 32, **kwargs)
    with pytest.raises(ValueError, match=f"^Linear: {message}"):
        te.Linear(64, 32, **kwargs)


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
    # One warning per reason: the recipe's (fetching the module's own stateful
    # quantizers), then the op call's (its quantizers are no graph constants).
    reasons = [str(w.message) for w in caught if issubclass(w.category, EagerFallbackWarning)]
    assert len(reasons) == len(set(reasons)) == 2 and "DelayedScaling" in reasons[0], reasons
    assert "not value-opaque" in reasons[1], reasons


# --- quantized output (fp8_output) ------------------------------------------------------


def _output_step(module, x, recipe, **kwargs):
    """Forward with ``fp8_output=True`` and backward through the dequantized output
    (loss = sum): (quantized output, input grad, parameter grads)."""
    for p in module.parameters():
        p.grad = None
    x = x.detach().clone().requires_grad_(True)
    with recipe_context(recipe):
        y = module(x, fp8_output=True, **kwargs)
    y.dequantize().sum().backward()
    return y, x.grad, [p.grad for p in module.parameters()]


@pytest.mark.parametrize("recipe", QUANTIZED)
def test_fp8_output_is_the_plain_output_quantized_by_the_output_quantizer(recipe):
    module, x = make(KIND), make_input()
    with torch.no_grad(), recipe_context(recipe):
        plain = module(x)
        got = module(x, fp8_output=True)
        expected = STATE.autocast.output.with_internal(False).quantize(plain)
    assert isinstance(got, QuantizedTensor)
    assert type(got) is type(expected)
    assert got.shape == plain.shape == (4, 32, 32)
    assert torch.equal(got.dequantize(), expected.dequantize())
    assert not torch.equal(got.dequantize(), plain)  # it was quantized


@pytest.mark.parametrize("recipe", QUANTIZED)
def test_gradient_flows_back_through_the_quantized_output(recipe):
    module, x = make(KIND), make_input()
    y, dx, grads = _output_step(module, x, recipe)
    assert isinstance(y, QuantizedTensor) and y.requires_grad
    # The quantized output's gradient passes straight through: the same gradients as
    # the unquantized output's, bit for bit.
    _, plain_dx, plain_grads = step(module, x, recipe)
    assert torch.equal(dx, plain_dx)
    assert len(grads) == 4 and all(g is not None for g in grads)
    assert all(torch.equal(a, b) for a, b in zip(grads, plain_grads, strict=True))


@pytest.mark.parametrize("recipe", QUANTIZED)
def test_fp8_output_under_no_grad_compiles_bitwise_equal_to_eager(recipe):
    module, x = make(KIND, return_layernorm_output=True), make_input()
    compiled = torch.compile(module, fullgraph=True, backend=AOT)
    with torch.no_grad(), recipe_context(recipe):
        eager, eager_ln = module(x, fp8_output=True)
        got, got_ln = compiled(x, fp8_output=True)
    assert isinstance(eager, QuantizedTensor)
    assert type(got) is type(eager)
    assert torch.equal(got.dequantize(), eager.dequantize())
    assert torch.equal(got_ln, eager_ln)
    assert graph_breaks() == 0 and unique_graphs() == 1


def test_fp8_output_with_grad_falls_back_with_its_reason_as_linear_does():
    module, x = make(KIND), make_input()
    eager = _output_step(module, x, "mxfp8")
    compiled = torch.compile(module, backend=AOT)
    with pytest.warns(EagerFallbackWarning, match="fp8_output"):
        got = _output_step(compiled, x, "mxfp8")
    assert type(got[0]) is type(eager[0])
    assert torch.equal(got[0].dequantize(), eager[0].dequantize())
    assert torch.equal(got[1], eager[1])
    assert all(torch.equal(a, b) for a, b in zip(got[2], eager[2], strict=True))
    assert graph_breaks() > 0


def test_fp8_output_with_grad_under_fullgraph_raises_the_reason():
    compiled = torch.compile(make(KIND), fullgraph=True, backend=AOT)
    with recipe_context("fp8_current"):
        with pytest.raises(torch._dynamo.exc.Unsupported, match="fp8_output=True"):
            compiled(make_input(), fp8_output=True)


def test_fp8_output_without_a_recipe_is_the_plain_output():
    module, x = make(KIND), make_input()
    got = module(x, fp8_output=True)
    assert type(got) is torch.Tensor and torch.equal(got, module(x))


# --- weight caching across microbatches (is_first_microbatch) ------------------------------

WEIGHT_SHAPE = (32, 64)  # (out_features, in_features): no activation or gradient has it


@pytest.fixture
def weight_quantizations(monkeypatch):
    """How many times a weight-shaped tensor was quantized (every format quantizes
    through ``Quantizer.quantize``)."""
    calls = []
    original = Quantizer.quantize

    def counting(self, t):
        if tuple(t.shape) == WEIGHT_SHAPE:
            calls.append(type(self).__name__)
        return original(self, t)

    monkeypatch.setattr(Quantizer, "quantize", counting)
    return calls


@pytest.mark.parametrize("recipe", QUANTIZED)
def test_later_microbatches_reuse_the_quantized_weight(recipe, weight_quantizations):
    cached, plain, x = make(KIND), make(KIND), make_input()
    workspaces = []
    for first in (True, False, False):
        before = len(weight_quantizations)
        got = step(cached, x, recipe, is_first_microbatch=first)
        assert len(weight_quantizations) - before == (1 if first else 0), first
        assert_bitwise(got, step(plain, x, recipe))
        workspaces.append(cached._weight_workspace)
    assert workspaces[0] is not None
    assert workspaces[0] is workspaces[1] is workspaces[2]


def test_a_weight_changed_after_the_first_microbatch_is_not_requantized():
    """TE's contract: the workspace is used as is until the next first microbatch."""
    module, x = make(KIND), make_input()
    first = step(module, x, "fp8_current", is_first_microbatch=True)
    with torch.no_grad():
        module.weight.mul_(2)
    later = step(module, x, "fp8_current", is_first_microbatch=False)
    assert torch.equal(later[0], first[0])
    refreshed = step(module, x, "fp8_current", is_first_microbatch=True)
    assert not torch.equal(refreshed[0], first[0])


def test_workspace_cached_without_grad_is_refreshed_when_backward_needs_it():
    module, plain, x = make(KIND), make(KIND), make_input()
    with torch.no_grad(), recipe_context("mxfp8"):
        module(x, is_first_microbatch=True)
    got = step(module, x, "mxfp8", is_first_microbatch=False)
    assert_bitwise(got, step(plain, x, "mxfp8"))


@pytest.mark.parametrize("first", [True, False, None])
def test_bf16_accepts_is_first_microbatch_and_behaves_as_none(first):
    module, plain, x = make(KIND), make(KIND), make_input()
    assert_bitwise(step(module, x, "bf16", is_first_microbatch=first), step(plain, x, "bf16"))
    assert module._weight_workspace is None


def test_compiled_microbatches_compile_under_fullgraph_and_match_eager():
    eager_module, module, x = make(KIND), make(KIND), make_input()
    compiled = torch.compile(module, fullgraph=True, backend=AOT)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for first in (True, False, False):
            got = step(compiled, x, "fp8_current", is_first_microbatch=first)
            assert_bitwise(got, step(eager_module, x, "fp8_current", is_first_microbatch=first))
    fallbacks = [w for w in caught if issubclass(w.category, EagerFallbackWarning)]
    assert fallbacks == []
    assert module._weight_workspace is not None


def test_quantized_weight_accepts_is_first_microbatch_and_caches_nothing(weight_quantizations):
    with te.quantized_model_init(recipe=RECIPES["mxfp8"]()):
        module = make(KIND)
    weight_quantizations.clear()  # the quantization quantized_model_init made
    x = make_input()
    plain = step(module, x, "mxfp8")
    for first in (True, False):
        assert_bitwise(step(module, x, "mxfp8", is_first_microbatch=first), plain)
    assert module._weight_workspace is None
    assert weight_quantizations == []  # the weight is already quantized
