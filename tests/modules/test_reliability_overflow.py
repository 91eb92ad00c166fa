"""Overflow is detectable under every quantized recipe: an Inf or NaN in the output
gradient (or in the forward input or weight) reaches ``x.grad`` / ``weight.grad`` (or
the output) as non-finite values, so a GradScaler-style ``torch.isfinite`` check sees
it, eager and compiled. Before, an Inf saturated to the format's largest value and the
gradients stayed finite."""

from __future__ import annotations

import pytest
import torch
from module_cases import QUANTIZED, RECIPES

from transformer_engine_ops.modules.autocast import autocast
from transformer_engine_ops.modules.linear import Linear
from transformer_engine_ops.quantization import DelayedScaling

# Every quantized recipe; delayed scaling runs eagerly (it is refused under fullgraph).
ALL = [*QUANTIZED, "delayed"]
MODES = ["eager", "compiled"]
SPECIALS = {"inf": float("inf"), "-inf": -float("inf"), "nan": float("nan")}


def _recipe(name):
    return DelayedScaling() if name == "delayed" else RECIPES[name]()


def _model(name, mode):
    torch.manual_seed(0)
    model = Linear(64, 64, params_dtype=torch.bfloat16)
    if mode == "compiled":
        if name == "delayed":
            pytest.skip("DelayedScaling is refused under torch.compile(fullgraph=True)")
        return model, torch.compile(model, fullgraph=True, backend="aot_eager")
    return model, model


def _grads(name, mode, grad_output_special=None, x_special=None, weight_special=None):
    module, model = _model(name, mode)
    x = torch.randn(32, 64).to(torch.bfloat16)
    if x_special is not None:
        x[5, 7] = x_special
    if weight_special is not None:
        with torch.no_grad():
            module.weight[3, 9] = weight_special
    x.requires_grad_(True)
    with autocast(recipe=_recipe(name)):
        y = model(x)
    dy = torch.randn(32, 64).to(torch.bfloat16)
    if grad_output_special is not None:
        dy[11, 13] = grad_output_special
    y.backward(dy)
    return y.detach(), x.grad, module.weight.grad


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("special", list(SPECIALS))
@pytest.mark.parametrize("name", ALL)
def test_a_non_finite_output_gradient_makes_both_gradients_non_finite(name, special, mode):
    _, x_grad, w_grad = _grads(name, mode, grad_output_special=SPECIALS[special])
    assert not torch.isfinite(x_grad).all()
    assert not torch.isfinite(w_grad).all()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", ALL)
def test_finite_gradients_stay_finite(name, mode):
    y, x_grad, w_grad = _grads(name, mode)
    assert torch.isfinite(y).all() and torch.isfinite(x_grad).all()
    assert torch.isfinite(w_grad).all()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("where", ["input", "weight"])
@pytest.mark.parametrize("name", ALL)
def test_an_inf_in_the_forward_input_or_weight_makes_the_output_non_finite(name, where, mode):
    special = {"x_special" if where == "input" else "weight_special": float("inf")}
    y, _, _ = _grads(name, mode, **special)
    assert not torch.isfinite(y).all()


@pytest.mark.parametrize("name", QUANTIZED)
def test_compiled_overflow_equals_eager_bitwise(name):
    """Same non-finite pattern and same finite values, compiled and eager."""
    eager = _grads(name, "eager", grad_output_special=float("inf"))
    compiled = _grads(name, "compiled", grad_output_special=float("inf"))
    for a, b in zip(eager, compiled, strict=True):
        assert torch.equal(a.isnan(), b.isnan()) and torch.equal(a.isinf(), b.isinf())
        finite = torch.isfinite(a)
        assert torch.equal(a[finite], b[finite])
