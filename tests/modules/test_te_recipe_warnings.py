"""TE's recipe warnings and errors around ``quantized_model_init`` weights: "Quantizer is
being updated" when a delayed-scaling weight takes its module's new weight quantizer,
and "Recipe mismatch" when a weight's format is not the active recipe's."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

import transformer_engine_ops as te
from transformer_engine_ops.recipe import (
    CustomRecipe,
    DelayedScaling,
    Float8BlockScaling,
    Float8CurrentScaling,
    MXFP8BlockScaling,
    NVFP4BlockScaling,
)

MODULES = ["Linear", "LayerNormLinear", "LayerNormMLP", "GroupedLinear"]
UPDATED = "Quantizer is being updated, this may affect model behavior"


def _module(name: str) -> torch.nn.Module:
    cls = getattr(te, name)
    return cls(1, 32, 32) if name == "GroupedLinear" else cls(32, 32)


def _run(module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    return module(x, [x.shape[0]]) if isinstance(module, te.GroupedLinear) else module(x)


def _weights(module: torch.nn.Module) -> list[te.QuantizedTensor]:
    return [p for p in module.parameters() if isinstance(p, te.QuantizedTensor)]


@pytest.mark.parametrize("name", MODULES)
def test_a_changed_delayed_scaling_recipe_updates_the_weights_quantizer_with_te_s_warning(name):
    with te.quantized_model_init(recipe=DelayedScaling(amax_history_len=16)):
        module = _module(name)
    weights = _weights(module)
    scales = [w.quantizer.scale.clone() for w in weights]
    x = torch.randn(32, 32)
    with te.autocast(recipe=DelayedScaling(amax_history_len=16)), warnings.catch_warnings():
        warnings.simplefilter("error")  # the recipe the weights were made with: no warning
        _run(module, x)
    with te.autocast(recipe=DelayedScaling(amax_history_len=4)):
        with pytest.warns(UserWarning, match=UPDATED) as record:
            _run(module, x)
    assert sum(UPDATED in str(w.message) for w in record) == len(weights)
    for weight, scale in zip(weights, scales, strict=True):
        quantizer = weight.quantizer
        assert quantizer.amax_history_len == 4
        # TE keeps the scale across a history-length change (the history truncated); a
        # weight made under quantized_model_init records no amax in the forward.
        assert torch.equal(quantizer.scale, scale)
    with te.autocast(recipe=DelayedScaling(amax_history_len=4)), warnings.catch_warnings():
        warnings.simplefilter("error")  # updated once
        _run(module, x)


def test_the_updated_weight_quantizer_is_the_one_the_module_updates():
    with te.quantized_model_init(recipe=DelayedScaling(amax_history_len=16)):
        module = te.Linear(32, 32)
    with te.autocast(recipe=DelayedScaling(amax_history_len=4)), pytest.warns(UserWarning):
        module(torch.randn(8, 32))
    state = module.state_dict()["_extra_state"]
    with torch.no_grad():
        module.weight.mul_(100.0)  # an in-place update records the weight's amax
    after = module.state_dict()["_extra_state"]
    assert not torch.equal(after["scale_fwd"][1], state["scale_fwd"][1])
    assert after["amax_history_fwd"].shape == (4, 3)


@pytest.mark.parametrize("length", [1, 5])
def test_another_history_length_keeps_the_scales(length):
    """TE keeps the scale when only the history length changes: the first step under
    the new length quantizes as a step under the old one would."""
    torch.manual_seed(0)
    module = te.Linear(16, 8)
    x = torch.randn(4, 16) * 7
    with te.autocast(recipe=DelayedScaling(amax_history_len=2)):
        module(x)
    twin = copy.deepcopy(module)
    with te.autocast(recipe=DelayedScaling(amax_history_len=2)):
        same = twin(x)
    with te.autocast(recipe=DelayedScaling(amax_history_len=length)):
        changed = module(x)
    assert torch.equal(changed, same)
    assert module.state_dict()["_extra_state"]["amax_history_fwd"].shape == (length, 3)


def test_loading_a_state_dict_rebinds_the_weights_quietly():
    with te.quantized_model_init(recipe=DelayedScaling(amax_history_len=16)):
        source = te.Linear(32, 32)
        target = te.Linear(32, 32)
    with te.autocast(recipe=DelayedScaling(amax_history_len=4)), pytest.warns(UserWarning):
        source(torch.randn(8, 32))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        target.load_state_dict(source.state_dict())
    assert target.weight.quantizer.amax_history_len == 4
    torch.testing.assert_close(target.weight.quantizer.scale, source.weight.quantizer.scale)


def test_update_quantizer_is_quiet_for_the_same_quantizer_and_refuses_another_encoding():
    q = te.MXFP8Quantizer()
    value = q(torch.randn(32, 32))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        value.update_quantizer(te.MXFP8Quantizer())  # the same configuration
    assert value._get_quantizer() == q
    with pytest.raises(ValueError, match="does not encode as this value's"):
        value.update_quantizer(te.MXFP8Quantizer(fp8_dtype=torch.float8_e5m2))
    delayed = te.Float8Quantizer()
    fp8 = delayed(torch.randn(4, 8))
    with pytest.warns(UserWarning, match=UPDATED):
        fp8.update_quantizer(te.Float8Quantizer(margin=1))
    assert fp8.quantizer.margin == 1 and fp8.columnwise_usage


@pytest.mark.parametrize(
    ("made", "active", "supports"),
    [
        (MXFP8BlockScaling(), DelayedScaling(), "MXFP8BlockScaling"),
        (Float8BlockScaling(), DelayedScaling(), "Float8BlockScaling"),
        (NVFP4BlockScaling(), Float8CurrentScaling(), "NVFP4BlockScaling"),
        (DelayedScaling(), MXFP8BlockScaling(), "DelayedScaling"),
        (Float8CurrentScaling(), DelayedScaling(), "Float8CurrentScaling"),
    ],
)
def test_a_weight_of_another_recipe_raises_te_s_recipe_mismatch(made, active, supports):
    with te.quantized_model_init(recipe=made):
        module = te.Linear(32, 32)
    got = type(active).__name__
    match = (
        f"Recipe mismatch for 'weight': tensor supports recipe {supports}, but got {got}. "
        r"Please check the recipes assigned during quantized_model_init\(\) and autocast\(\) calls."
    )
    with te.autocast(recipe=active), pytest.raises(RuntimeError, match=match):
        module(torch.randn(32, 32))


@pytest.mark.parametrize("name", MODULES)
def test_the_recipe_the_weights_were_made_with_and_a_custom_recipe_run(name):
    with te.quantized_model_init(recipe=MXFP8BlockScaling()):
        module = _module(name)
    x = torch.randn(32, 32)
    with te.autocast(recipe=MXFP8BlockScaling()):
        _run(module, x)
    with te.autocast(recipe=CustomRecipe(qfactory=lambda role: te.MXFP8Quantizer())):
        _run(module, x)  # a factory chooses each role's format: not checked
    with te.autocast(enabled=False):
        _run(module, x)
