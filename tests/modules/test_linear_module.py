"""Linear under torch.compile: zero graph breaks, bitwise agreement with eager, the
documented eager fallbacks with their reasons, recompiles, and weight caching."""

from __future__ import annotations

import copy
import dataclasses
import warnings

import pytest
import torch
from module_cases import (
    QUANTIZED,
    RECIPES,
    assert_bitwise,
    graph_breaks,
    linear_call_bundle,
    make_input,
    make_mlp,
    recipe_context,
    step,
    unique_graphs,
)
from torch._dynamo.utils import counters

from transformer_engine_ops.modules import linear as linear_module
from transformer_engine_ops.modules.autocast import autocast, quantized_model_init
from transformer_engine_ops.modules.linear import Linear
from transformer_engine_ops.ops.linear import LinearFwdArgs
from transformer_engine_ops.quantization import DelayedScaling, Float8CurrentScaling
from transformer_engine_ops.quantization.quantizer import QuantizedTensor
from transformer_engine_ops.runtime.fallback import EagerFallbackWarning

AOT = "aot_eager"


def _compile_and_compare(recipe: str, backend: str, model=None, x=None) -> None:
    model = model if model is not None else make_mlp()
    x = x if x is not None else make_input()
    eager = step(model, x, recipe)
    compiled = torch.compile(model, fullgraph=True, backend=backend)
    got = step(compiled, x, recipe)
    assert graph_breaks() == 0, dict(counters["graph_break"])
    assert unique_graphs() == 1
    assert_bitwise(got, eager)


# --- fullgraph, bitwise ------------------------------------------------------------


@pytest.mark.parametrize("recipe", list(RECIPES))
def test_compiled_mlp_is_bitwise_equal_to_eager(recipe):
    _compile_and_compare(recipe, AOT)


@pytest.mark.parametrize("recipe", ["bf16", "fp8_current"])
def test_compiled_mlp_on_inductor_is_bitwise_equal_to_eager(recipe):
    _compile_and_compare(recipe, "inductor")


@pytest.mark.parametrize("recipe", ["bf16", "fp8_block"])
def test_compiled_mlp_without_bias(recipe):
    _compile_and_compare(recipe, AOT, model=make_mlp(bias=False))


def test_frozen_weight_keeps_its_bias_grad_under_compile():
    model = make_mlp()
    for layer in (model.fc1, model.fc2):
        layer.weight.requires_grad_(False)
    x = make_input()
    eager = step(model, x, "fp8_current")
    got = step(torch.compile(model, fullgraph=True, backend=AOT), x, "fp8_current")
    assert graph_breaks() == 0
    assert torch.equal(got[0], eager[0]) and torch.equal(got[1], eager[1])
    # parameters: fc1.weight, fc1.bias, fc2.weight, fc2.bias; the weights are frozen
    assert [g is None for g in got[2]] == [True, False, True, False]
    assert [g is None for g in eager[2]] == [True, False, True, False]
    assert torch.equal(got[2][1], eager[2][1]) and torch.equal(got[2][3], eager[2][3])


# --- quantized weight parameters ------------------------------------------------------


@pytest.mark.parametrize("recipe", ["fp8_current", "mxfp8"])
def test_quantized_model_init_weights_compile_and_match_eager(recipe):
    with quantized_model_init(recipe=RECIPES[recipe]()):
        model = make_mlp()
    assert isinstance(model.fc1.weight, QuantizedTensor)
    assert isinstance(model.fc1.weight, torch.nn.Parameter) or model.fc1.weight.requires_grad
    _compile_and_compare(recipe, AOT, model=model)


# --- quantized output ----------------------------------------------------------------


@pytest.mark.parametrize("recipe", QUANTIZED)
def test_fp8_output_under_no_grad_is_a_quantized_tensor_equal_to_eager(recipe):
    model, x = make_mlp(), make_input()
    compiled = torch.compile(model, fullgraph=True, backend=AOT)
    with torch.no_grad(), recipe_context(recipe):
        eager = model(x, fp8_output=True)
        got = compiled(x, fp8_output=True)
    assert isinstance(eager, QuantizedTensor)
    assert type(got) is type(eager)
    assert got.shape == eager.shape == (4, 16, 32)
    assert torch.equal(got.dequantize(), eager.dequantize())
    assert graph_breaks() == 0 and unique_graphs() == 1


def test_fp8_output_with_grad_falls_back_with_its_reason():
    model, x = make_mlp(), make_input()
    compiled = torch.compile(model, backend=AOT)
    with autocast(recipe=Float8CurrentScaling()):
        eager = model(x, fp8_output=True)
        with pytest.warns(EagerFallbackWarning, match="fp8_output"):
            got = compiled(x, fp8_output=True)
    assert isinstance(got, QuantizedTensor)
    assert torch.equal(got.dequantize(), eager.dequantize())
    assert graph_breaks() > 0


def test_fp8_output_with_grad_under_fullgraph_raises_the_reason():
    compiled = torch.compile(make_mlp(), fullgraph=True, backend=AOT)
    with autocast(recipe=Float8CurrentScaling()):
        with pytest.raises(torch._dynamo.exc.Unsupported, match="fp8_output=True"):
            compiled(make_input(), fp8_output=True)


# --- weight caching across microbatches -------------------------------------------------


@pytest.mark.parametrize("recipe", QUANTIZED)
def test_eager_microbatches_quantize_the_weight_once_and_reuse_it(recipe):
    cached, plain = make_mlp(), make_mlp()
    x = make_input()
    workspaces = []
    for first in (True, False, False):
        got = step(cached, x, recipe, is_first_microbatch=first)
        assert_bitwise(got, step(plain, x, recipe))
        workspaces.append(cached.fc1._weight_workspace)
    assert workspaces[0] is not None
    assert workspaces[0] is workspaces[1] is workspaces[2]
    assert cached.fc2._weight_workspace is not None


def test_later_microbatches_do_not_requantize_the_weight():
    """The cached workspace is used as is: a weight changed in place after the first
    microbatch changes nothing until the next first microbatch (TE's contract)."""
    model, x = make_mlp(), make_input()
    first = step(model, x, "fp8_current", is_first_microbatch=True)
    with torch.no_grad():
        model.fc1.weight.mul_(2)
    later = step(model, x, "fp8_current", is_first_microbatch=False)
    assert torch.equal(later[0], first[0])
    refreshed = step(model, x, "fp8_current", is_first_microbatch=True)
    assert not torch.equal(refreshed[0], first[0])


def test_workspace_cached_without_grad_is_refreshed_when_backward_needs_it():
    model, plain, x = make_mlp(), make_mlp(), make_input()
    with torch.no_grad(), recipe_context("fp8_current"):
        model(x, is_first_microbatch=True)
    got = step(model, x, "fp8_current", is_first_microbatch=False)
    assert_bitwise(got, step(plain, x, "fp8_current"))


def test_compiled_microbatches_compile_under_fullgraph_and_match_eager():
    eager_model = make_mlp()
    model = copy.deepcopy(eager_model)
    compiled = torch.compile(model, fullgraph=True, backend=AOT)
    x = make_input()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for first in (True, False, False):
            got = step(compiled, x, "fp8_current", is_first_microbatch=first)
            assert_bitwise(got, step(eager_model, x, "fp8_current", is_first_microbatch=first))
    fallbacks = [w for w in caught if issubclass(w.category, EagerFallbackWarning)]
    assert fallbacks == []
    assert model.fc1._weight_workspace is not None


# --- train / eval ---------------------------------------------------------------------


@pytest.mark.parametrize("recipe", ["bf16", "mxfp8"])
def test_train_eval_train_agrees_with_eager(recipe):
    model, x = make_mlp(), make_input()
    compiled = torch.compile(model, fullgraph=True, backend=AOT)
    assert_bitwise(step(compiled, x, recipe), step(model, x, recipe))
    model.eval()
    with torch.no_grad(), recipe_context(recipe):
        assert torch.equal(compiled(x), model(x))
    model.train()
    assert_bitwise(step(compiled, x, recipe), step(model, x, recipe))
    assert graph_breaks() == 0


# --- dynamic shapes and recompiles ----------------------------------------------------


@pytest.mark.parametrize("recipe", ["bf16", "fp8_current", "mxfp8"])
def test_dynamic_batch_sizes_share_one_graph(recipe):
    model = make_mlp()
    compiled = torch.compile(model, fullgraph=True, backend=AOT, dynamic=True)
    for batch in (2, 3, 5, 6, 8):
        x = make_input(batch=batch, seq=32, seed=batch)  # MXFP8: rows a multiple of 32
        assert_bitwise(step(compiled, x, recipe), step(model, x, recipe))
    assert unique_graphs() == 1
    assert graph_breaks() == 0


def test_same_configuration_compiles_once(recompile_log):
    model, x = make_mlp(), make_input()
    compiled = torch.compile(model, fullgraph=True, backend=AOT)
    for _ in range(10):
        step(compiled, x, "fp8_current")  # autocast re-entered with an equal recipe
    assert unique_graphs() == 1
    assert recompile_log.messages == []


def test_changing_the_recipe_recompiles_naming_the_quantizer_field(recompile_log):
    model, x = make_mlp(), make_input()
    compiled = torch.compile(model, fullgraph=True, backend=AOT)
    step(compiled, x, "fp8_current")
    with autocast(recipe=Float8CurrentScaling(use_power_2_scales=True)):
        step(compiled, x, None)
    assert unique_graphs() == 2
    assert len(recompile_log.messages) == 1
    reason = recompile_log.messages[0]
    # the quantizer (an opaque value, guarded by equality), read from the thread's
    # active-recipe cell, with the guarded field's old value
    assert "STATE.autocast_cell[0].input ==" in reason
    assert "Float8CurrentScalingQuantizer(" in reason
    assert "force_pow_2_scales=False" in reason
    step(compiled, x, "fp8_current")  # back to the first recipe: cached, no recompile
    assert unique_graphs() == 2


def test_ten_steps_under_re_entered_autocast_compile_once():
    """autocast re-entered with an equal recipe object on every entry: no recompile."""
    model, x = make_mlp(), make_input()
    compiled = torch.compile(model, fullgraph=True, backend=AOT)
    for _ in range(10):
        step(compiled, x, "fp8_current")
    assert unique_graphs() == 1


# --- delayed scaling -------------------------------------------------------------------


def test_delayed_scaling_under_fullgraph_raises_clearly():
    compiled = torch.compile(make_mlp(), fullgraph=True, backend=AOT)
    with autocast(recipe=DelayedScaling()):
        with pytest.raises(torch._dynamo.exc.Unsupported) as info:
            compiled(make_input())
    message = str(info.value)
    assert "DelayedScaling" in message
    assert "not value-opaque" in message
    assert "delayed scaling" in message


def test_delayed_scaling_falls_back_with_one_warning_and_matches_eager():
    eager_model = make_mlp()
    compiled = torch.compile(copy.deepcopy(eager_model), backend=AOT)
    xs = [make_input(seed=s) for s in range(3)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with autocast(recipe=DelayedScaling()):
            got = [step(compiled, x, None) for x in xs]
    with autocast(recipe=DelayedScaling()):
        expected = [step(eager_model, x, None) for x in xs]
    for g, e in zip(got, expected, strict=True):
        assert_bitwise(g, e)
    # One warning per reason over the three steps: the recipe's (fetching the module's
    # own stateful quantizers) and the op call's (its quantizers are no graph constants).
    fallbacks = [str(w.message) for w in caught if issubclass(w.category, EagerFallbackWarning)]
    assert len(fallbacks) == len(set(fallbacks)) == 2
    assert all("not value-opaque" in message for message in fallbacks)


# --- bad values at run time ---------------------------------------------------------------


BAD_ATTRS = [
    ("tp_group", 3, TypeError, "LinearFwdArgs.tp_group: expected ProcessGroup, got int"),
    ("parallel_mode", "diagonal", ValueError, "LinearFwdArgs.parallel_mode: expected one of"),
    ("tp_size", 2.0, TypeError, "LinearFwdArgs.tp_size: expected int or SymInt, got float"),
]


@pytest.mark.parametrize(
    ("attr", "value", "exc", "message"), BAD_ATTRS, ids=[b[0] for b in BAD_ATTRS]
)
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_module_rejects_a_wrong_kind_value_naming_the_field(attr, value, exc, message, compiled):
    layer = Linear(64, 32, params_dtype=torch.bfloat16)
    setattr(layer, attr, value)
    run = torch.compile(layer, backend=AOT) if compiled else layer
    with pytest.raises(exc) as info:
        run(make_input())
    assert message in str(info.value)


def test_module_rejects_a_non_tensor_input_naming_the_field():
    layer = Linear(64, 32, params_dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="LinearFwdArgs.inp: expected Tensor, got int"):
        layer(3)


def test_module_args_match_the_bundle_the_ops_take():
    """The module passes every bundle field (none left to a default)."""
    layer = Linear(64, 32, params_dtype=torch.bfloat16)
    seen: list[set[str]] = []
    entry = linear_module.call_linear
    with pytest.MonkeyPatch.context() as m:
        m.setattr(linear_module, "call_linear", lambda **kw: seen.append(set(kw)) or entry(**kw))
        layer(make_input())
    assert seen == [{f.name for f in dataclasses.fields(LinearFwdArgs)} | {"keep"}]
    args = linear_call_bundle(layer, make_input())
    assert args.fp8 is False and args.input_quantizer is None and args.weight_workspace is None
