"""TE's calibration, ``te.autocast(enabled=False, calibrating=True, recipe=...)``: the
modules compute in high precision and each GEMM's input and weight quantizers record
what they would quantize (delayed scaling's amax, TE's ``calibrate``) into the module's
scaling state, which a later quantized run and ``_extra_state`` carry on."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F

import transformer_engine_ops as te
from transformer_engine_ops.recipe import DelayedScaling, Float8CurrentScaling, MXFP8BlockScaling

MODULES = ["Linear", "LayerNormLinear", "LayerNormMLP", "GroupedLinear"]


def _module(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    cls = getattr(te, name)
    return cls(2, 32, 32) if name == "GroupedLinear" else cls(32, 32)


def _run(module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    return module(x, [16, 16]) if isinstance(module, te.GroupedLinear) else module(x)


def _amax(t: torch.Tensor) -> torch.Tensor:
    """TE's calibrate: the largest magnitude (``max(-amin, amax)``)."""
    amin, amax = t.detach().float().aminmax()
    return torch.maximum(-amin, amax)


def _input() -> torch.Tensor:
    return torch.randn(32, 32, generator=torch.Generator().manual_seed(1)) * 3


@pytest.mark.parametrize("name", MODULES)
def test_calibrating_computes_in_high_precision_and_records_the_amaxes(name):
    module = _module(name)
    x = _input()
    plain = _run(module, x)
    with te.autocast(enabled=False, calibrating=True, recipe=DelayedScaling(amax_history_len=4)):
        calibrated = _run(module, x)
    assert torch.equal(calibrated, plain)
    state = module.state_dict()["_extra_state"]
    # No update at the exit of a disabled region (TE's): every scale is still 1, and
    # the amaxes wait in the history's current slot.
    assert torch.equal(state["scale_fwd"], torch.ones(3))
    assert torch.equal(state["amax_history_fwd"][1:], torch.zeros(3, 3))
    recorded = state["amax_history_fwd"][0]
    weight = module.fc1_weight if name == "LayerNormMLP" else module._parameters.get("weight")
    if name == "GroupedLinear":  # each GEMM its own state: GEMM 0's rows and weight
        weight = module.weight0
        x = x[:16]
    assert torch.equal(recorded[1], _amax(weight))
    if name in ("Linear", "GroupedLinear"):
        assert torch.equal(recorded[0], _amax(x))
    else:  # the norm's output
        ln = F.layer_norm(x, (32,), module.layer_norm_weight, module.layer_norm_bias, 1e-5)
        torch.testing.assert_close(recorded[0], _amax(ln), rtol=1e-5, atol=0)
    assert torch.equal(recorded[2], torch.zeros(()))  # the output is quantized by no GEMM
    assert torch.equal(state["amax_history_bwd"], torch.zeros(4, 3))  # forward only


def test_layernorm_mlp_calibrates_each_gemm_and_fc2_s_input_is_the_activation():
    module = _module("LayerNormMLP")
    x = _input()
    with te.autocast(enabled=False, calibrating=True, recipe=DelayedScaling()):
        module(x)
    fc2 = module.state_dict()["_extra_state"]["fc2"]["amax_history_fwd"][0]
    ln = F.layer_norm(x, (32,), module.layer_norm_weight, module.layer_norm_bias, 1e-5)
    act = F.gelu(ln @ module.fc1_weight.t() + module.fc1_bias, approximate="tanh")
    torch.testing.assert_close(fc2[0], _amax(act), rtol=1e-5, atol=0)
    assert torch.equal(fc2[1], _amax(module.fc2_weight))


def test_the_next_quantized_step_scales_from_the_calibrated_history():
    recipe = DelayedScaling(amax_history_len=4)
    module = _module("Linear")
    x = _input()
    with te.autocast(enabled=False, calibrating=True, recipe=recipe):
        module(x * 10)  # a larger amax than the quantized step's
    with te.autocast(recipe=recipe):
        module(x)
    scale = module.state_dict()["_extra_state"]["scale_fwd"][0]
    amax = _amax(x * 10)
    assert torch.equal(scale, torch.full_like(amax, 448.0) / amax)


def test_a_stateless_recipe_calibrates_nothing():
    for recipe in (Float8CurrentScaling(), MXFP8BlockScaling(), None):
        module = _module("Linear")
        x = _input()
        with te.autocast(enabled=False, calibrating=True, recipe=recipe):
            y = module(x)
        assert torch.equal(y, module(x))
        assert module.state_dict()["_extra_state"].numel() == 0


def test_calibrating_with_quantization_enabled_is_the_quantized_run():
    recipe = DelayedScaling(amax_history_len=4)
    a, b = _module("Linear"), _module("Linear")
    x = _input()
    with te.autocast(enabled=True, calibrating=True, recipe=recipe):
        ya = a(x)
    with te.autocast(recipe=recipe):
        yb = b(x)
    assert torch.equal(ya, yb)
    for key, value in a.state_dict()["_extra_state"].items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, b.state_dict()["_extra_state"][key]), key


def _calibrated_state(module: Any, x: torch.Tensor) -> dict[str, Any]:
    with te.autocast(enabled=False, calibrating=True, recipe=DelayedScaling(amax_history_len=4)):
        y = module(x)
    inner = getattr(module, "_orig_mod", module)
    return {"y": y, **inner.state_dict()["_extra_state"]}


def test_compiled_calibration_runs_eagerly_with_the_same_result_and_fullgraph_names_it():
    x = _input()
    eager = _calibrated_state(_module("Linear"), x)
    module = _module("Linear")
    compiled = _calibrated_state(torch.compile(module, backend="aot_eager"), x)
    for key in ("y", "scale_fwd", "amax_history_fwd"):
        assert torch.equal(compiled[key], eager[key]), key
    strict = torch.compile(_module("Linear"), fullgraph=True, backend="aot_eager")

    def step(inp: torch.Tensor) -> torch.Tensor:
        with te.autocast(enabled=False, calibrating=True, recipe=DelayedScaling()):
            return strict(inp)

    with pytest.raises(Exception, match="calibrating=True"):
        torch.compile(step, fullgraph=True, backend="aot_eager")(x)
