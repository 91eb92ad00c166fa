"""A quantized model's state dict round-trips through ``torch.save`` and the default
``torch.load(weights_only=True)``."""

from __future__ import annotations

import io

import pytest
import torch
from module_cases import QUANTIZED, RECIPES

from transformer_engine_ops.modules.autocast import autocast, quantized_model_init
from transformer_engine_ops.modules.linear import Linear
from transformer_engine_ops.quantization.quantizer import QuantizedTensor


@pytest.mark.parametrize("recipe", QUANTIZED)
def test_quantized_state_dict_loads_with_weights_only(recipe):
    torch.manual_seed(0)
    with quantized_model_init(recipe=RECIPES[recipe]()):
        saved = Linear(64, 32, params_dtype=torch.bfloat16)
        fresh = Linear(64, 32, params_dtype=torch.bfloat16)
    assert isinstance(saved.weight, QuantizedTensor)
    buf = io.BytesIO()
    torch.save(saved.state_dict(), buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)
    assert type(state["weight"]) is type(saved.weight)
    fresh.load_state_dict(state)
    x = torch.randn(32, 64).to(torch.bfloat16)
    with autocast(recipe=RECIPES[recipe]()):
        assert torch.equal(fresh(x), saved(x))


def _delayed_state(module):
    """``module``'s state dict after a delayed-scaling forward and backward."""
    from transformer_engine_ops.quantization import DelayedScaling

    x = torch.randn(16, 64)
    with autocast(recipe=DelayedScaling()):
        module(x.requires_grad_()).float().sum().backward()
    return module.state_dict()


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf"), 0.0, -1.0])
@pytest.mark.parametrize(
    ("key", "index", "role"), [("scale_fwd", 1, "weight"), ("scale_bwd", 0, "grad_output")]
)
def test_a_delayed_scaling_state_with_a_bad_scale_is_refused_naming_the_entry(
    value, key, index, role
):
    """A NaN, infinite, zero or negative scale would load silently and make the next
    forward non-finite: refused, naming the module and the entry; the module's own
    state stays as it was."""
    from transformer_engine_ops.quantization import DelayedScaling

    torch.manual_seed(0)
    state = _delayed_state(Linear(64, 32))
    state["_extra_state"][key][index] = value
    target = Linear(64, 32)
    before = _delayed_state(target)["_extra_state"]
    with pytest.raises(ValueError, match=rf"^Linear: .*{key}\[{index}\] \(the {role} scale\) is "):
        target.load_state_dict(state)
    after = target.state_dict()["_extra_state"]
    for name in ("scale_fwd", "scale_bwd", "amax_history_fwd", "amax_history_bwd"):
        assert torch.equal(after[name], before[name])
    with autocast(recipe=DelayedScaling()):
        assert target(torch.randn(8, 64)).isfinite().all()


def test_a_bad_scale_of_a_further_gemm_is_refused_naming_it_and_nothing_loads():
    """LayerNormMLP's fc2 state sits in the module's dict under ``fc2``: its bad scale is
    named ``fc2.scale_fwd[..]``, and fc1's good state is not loaded either."""
    from transformer_engine_ops.modules.layernorm_mlp import LayerNormMLP

    torch.manual_seed(0)
    state = _delayed_state(LayerNormMLP(64, 128))
    state["_extra_state"]["scale_fwd"] *= 2  # fc1's, valid
    state["_extra_state"]["fc2"]["scale_fwd"][0] = 0.0
    target = LayerNormMLP(64, 128)
    before = _delayed_state(target)["_extra_state"]
    with pytest.raises(
        ValueError, match=r"^LayerNormMLP: .*fc2\.scale_fwd\[0\] \(the input scale\)"
    ):
        target.load_state_dict(state)
    assert torch.equal(target.state_dict()["_extra_state"]["scale_fwd"], before["scale_fwd"])


def test_a_non_finite_amax_history_loads_as_saved():
    """An overflowing step records a non-finite amax, which the scale update skips: such
    a state is valid and round-trips."""
    torch.manual_seed(0)
    state = _delayed_state(Linear(64, 32))
    state["_extra_state"]["amax_history_fwd"][0, 0] = float("inf")
    target = Linear(64, 32)
    target.load_state_dict(state)
    loaded = target.state_dict()["_extra_state"]
    assert torch.equal(loaded["amax_history_fwd"], state["_extra_state"]["amax_history_fwd"])
