"""LayerNormMLP(activation="clamped_swiglu", activation_params=...): TE 2.20.2's GPT-OSS
SwiGLU. The activation and its gradient against TE's formula in float64 (autograd of
``clamp``, ``sigmoid``), the module against the plain formula, compiled bitwise equal to
eager under every recipe, and the parameters refused where TE has no meaning for them."""

from __future__ import annotations

import pytest
import torch
from family_cases import (
    FFN,
    HIDDEN,
    compile_and_compare,
    make,
    make_input,
    ref_clamped_swiglu,
    reference_step,
    step,
)
from module_cases import RECIPES

import transformer_engine_ops as te
from transformer_engine_ops.ops.layernorm_mlp import activation_backward, activation_forward

KIND = "layernorm_mlp"
PARAMS = {"limit": 0.75, "alpha": 1.25, "glu_linear_offset": 0.5}


def te_clamped_swiglu(x: torch.Tensor, limit: float, alpha: float, offset: float) -> torch.Tensor:
    """TE 2.20.2's definition (``LayerNormMLP``'s ONNX path, ``ClampedSwiGLU``)."""
    return ref_clamped_swiglu(x, {"limit": limit, "alpha": alpha, "glu_linear_offset": offset})


def _inputs(limit: float) -> torch.Tensor:
    """Values on both sides of ±limit and exactly on it, in both halves."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(16, 2 * 32, generator=gen, dtype=torch.float64) * 2 * limit
    x[0, :4] = torch.tensor([limit, -limit, limit * 1.5, -limit * 1.5], dtype=torch.float64)
    x[0, 32:36] = torch.tensor([limit, -limit, limit * 1.5, -limit * 1.5], dtype=torch.float64)
    return x


@pytest.mark.parametrize(
    ("limit", "alpha", "offset"), [(7.0, 1.702, 1.0), (0.75, 1.25, 0.5), (1.0, 2.0, 0.0)]
)
def test_activation_and_gradient_match_te_formula_in_float64(limit, alpha, offset):
    x = _inputs(limit).requires_grad_(True)
    want = te_clamped_swiglu(x, limit, alpha, offset)
    dy = torch.randn(want.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    (want_dx,) = torch.autograd.grad(want, x, dy)
    f64 = torch.float64
    got = activation_forward("clamped_swiglu", x.detach(), f64, limit, alpha, offset)
    got_dx = activation_backward("clamped_swiglu", dy, x.detach(), f64, limit, alpha, offset)
    assert got.dtype == got_dx.dtype == f64
    torch.testing.assert_close(got, want, rtol=0, atol=0)  # the same operations
    torch.testing.assert_close(got_dx, want_dx, rtol=1e-14, atol=1e-14)


def test_gradient_is_zero_where_both_halves_are_clamped():
    limit = 0.5
    x = torch.tensor([[2.0, 3.0]], dtype=torch.float64)  # gate above, linear above
    dx = activation_backward(
        "clamped_swiglu", torch.ones(1, 1, dtype=torch.float64), x, torch.float64, limit, 1.7, 1.0
    )
    assert torch.equal(dx, torch.zeros_like(x))


def test_module_matches_the_plain_formula_in_fp32():
    module = make(KIND, activation="clamped_swiglu", activation_params=PARAMS, dtype=torch.float32)
    x = make_input(dtype=torch.float32)
    got = step(module, x, "bf16")  # no recipe: the module's own dtype
    want = reference_step(module, KIND, x)
    for g, w in zip((got[0], got[1], *got[2]), (want[0], want[1], *want[2]), strict=True):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)


def test_defaults_are_tes():
    # TE: limit 7.0, alpha 1.702, glu_linear_offset 1.0 for what activation_params omits.
    module = make(KIND, activation="clamped_swiglu", activation_params={"alpha": 1.702})
    default = make(KIND, activation="clamped_swiglu")
    x = make_input()
    a, b = step(module, x, "bf16"), step(default, x, "bf16")
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert default.activation_params is None  # kept as given, as TE keeps it


@pytest.mark.parametrize("recipe", list(RECIPES))
def test_compiled_is_bitwise_equal_to_eager(recipe):
    compile_and_compare(make(KIND, activation="clamped_swiglu", activation_params=PARAMS), recipe)


def test_compiled_on_inductor_is_bitwise_equal_to_eager():
    module = make(KIND, activation="clamped_swiglu", activation_params=PARAMS)
    compile_and_compare(module, "fp8_current", backend="inductor")


def test_fc1_is_twice_the_ffn_size_as_for_every_gated_activation():
    module = te.LayerNormMLP(HIDDEN, FFN, activation="clamped_swiglu")
    assert tuple(module.fc1_weight.shape) == (2 * FFN, HIDDEN)
    assert tuple(module.fc2_weight.shape) == (HIDDEN, FFN)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(activation="gelu", activation_params={"limit": 1.0}), ValueError, "only read by"),
        (
            dict(activation="clamped_swiglu", activation_params={"beta": 1.0}),
            ValueError,
            "unknown keys \\['beta'\\]",
        ),
        (
            dict(activation="clamped_swiglu", activation_params={"limit": "7"}),
            TypeError,
            "activation_params\\['limit'\\]",
        ),
        (dict(activation="clamped_swiglu", activation_params=[7.0]), TypeError, "must be a dict"),
    ],
    ids=["other-activation", "unknown-key", "not-a-float", "not-a-dict"],
)
def test_bad_activation_params_are_refused_naming_them(kwargs, error, match):
    with pytest.raises(error, match=match):
        te.LayerNormMLP(HIDDEN, FFN, **kwargs)
