"""TE's everyday defaults a user does not see fail: the default weight init, an
enclosing ``torch.autocast``, and ``device="meta"`` + ``to_empty()`` +
``reset_parameters()`` (also under ``quantized_model_init``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import transformer_engine_ops as te
from transformer_engine_ops import recipe
from transformer_engine_ops.quantization.quantizer import QuantizedTensor

# Every GEMM module, at sizes every recipe's weight quantizer accepts.
GEMM_MODULES: dict[str, Callable[..., torch.nn.Module]] = {
    "Linear": lambda **kw: te.Linear(64, 96, **kw),
    "LayerNormLinear": lambda **kw: te.LayerNormLinear(64, 96, **kw),
    "LayerNormMLP": lambda **kw: te.LayerNormMLP(64, 128, activation="swiglu", **kw),
    "GroupedLinear": lambda **kw: te.GroupedLinear(3, 64, 96, **kw),
}
WEIGHTS = {
    "Linear": ("weight",),
    "LayerNormLinear": ("weight",),
    "LayerNormMLP": ("fc1_weight", "fc2_weight"),
    "GroupedLinear": ("weight0", "weight1", "weight2"),
}


def _call(name: str, module: torch.nn.Module, x: torch.Tensor) -> Any:
    """``module(x)``; GroupedLinear's rows split in quarters, half of them to GEMM 1."""
    rows = x.shape[0] // 4
    return module(x, [rows, 2 * rows, rows]) if name == "GroupedLinear" else module(x)


@pytest.mark.parametrize("name", sorted(GEMM_MODULES))
def test_default_init_is_te_normal(name: str) -> None:
    """TE's default init is N(0, 0.023) for every GEMM weight (Linear used kaiming)."""
    torch.manual_seed(0)
    module = GEMM_MODULES[name]()
    for weight_name in WEIGHTS[name]:
        weight = getattr(module, weight_name).detach()
        assert abs(weight.mean().item()) < 0.003, weight_name
        assert weight.std().item() == pytest.approx(0.023, rel=0.05), weight_name
    for param_name, param in module.named_parameters():
        if "bias" in param_name:
            assert not param.detach().any(), param_name


def _norms_and_gemms() -> dict[str, Callable[..., torch.nn.Module]]:
    return {
        **GEMM_MODULES,
        "LayerNorm": lambda **kw: te.LayerNorm(64, **kw),
        "RMSNorm": lambda **kw: te.RMSNorm(64, **kw),
    }


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("name", sorted(_norms_and_gemms()))
def test_torch_autocast_sets_the_compute_dtype(name: str, compiled: bool) -> None:
    """Under ``torch.autocast(dtype=bfloat16)`` an fp32 module computes and returns
    bf16, exactly as it does on the input cast to bf16 (TE casts to the autocast dtype);
    gradients reach the fp32 parameters in fp32."""
    torch.manual_seed(0)
    module = _norms_and_gemms()[name]()
    x = torch.randn(4, 64)
    expected = _call(name, module, x.bfloat16())
    expected.float().sum().backward()
    expected_grads = [p.grad.clone() for p in module.parameters()]
    module.zero_grad(set_to_none=True)
    run = torch.compile(module, fullgraph=True, backend="aot_eager") if compiled else module
    xg = x.clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = _call(name, run, xg)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, expected)
    out.float().sum().backward()
    assert xg.grad is not None and xg.grad.dtype == torch.float32
    for param, grad in zip(module.parameters(), expected_grads, strict=True):
        assert param.grad.dtype == torch.float32
        assert torch.equal(param.grad, grad)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize(
    "make_recipe", [None, recipe.Float8CurrentScaling], ids=["bf16", "fp8_current"]
)
def test_transformer_layer_under_torch_autocast_returns_its_dtype(
    make_recipe: Callable[[], Any] | None, compiled: bool
) -> None:
    """TE's ``TransformerLayer`` casts its hidden states to the ``torch.autocast`` dtype,
    so its residual stream and output are bf16 for an fp32 input, equal to the layer on
    the input cast to bf16, under a quantization recipe too (TE's
    ``test_sanity_amp_and_nvfuser``: "AMP wrong output type")."""
    torch.manual_seed(0)
    layer = te.TransformerLayer(64, 128, 4, hidden_dropout=0.0, attention_dropout=0.0)
    x = torch.randn(8, 2, 64)
    fp8 = make_recipe is not None

    def run(module: torch.nn.Module, inp: torch.Tensor) -> torch.Tensor:
        with te.autocast(enabled=fp8, recipe=make_recipe() if fp8 else None):
            return module(inp)

    expected = run(layer, x.bfloat16())
    compiled_layer = torch.compile(layer, fullgraph=True, backend="aot_eager")
    xg = x.clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = run(compiled_layer if compiled else layer, xg)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, expected)
    out.float().sum().backward()
    assert xg.grad is not None and xg.grad.dtype == torch.float32


def test_autocast_off_inside_keeps_fp32_math() -> None:
    """The op runs with autocast off: an fp32 input under autocast(enabled=False) stays
    fp32 bit for bit, and a bf16 autocast does not lower a LayerNorm's fp32 statistics."""
    torch.manual_seed(0)
    module = te.LayerNorm(64)
    x = torch.randn(4, 64)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=False):
        assert torch.equal(module(x), module(x))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.equal(module(x), module(x.bfloat16()))


@pytest.mark.parametrize("name", sorted(GEMM_MODULES))
def test_meta_to_empty_reset_parameters_matches_a_real_build(name: str) -> None:
    """``device="meta"``, ``to_empty()``, ``reset_parameters()`` under one seed gives the
    module a real build gives under that seed (no NaN or garbage left)."""
    make = GEMM_MODULES[name]
    torch.manual_seed(3)
    reference = make()
    module = make(device="meta")
    module.to_empty(device="cpu")
    torch.manual_seed(3)
    module.reset_parameters()
    got, want = module.state_dict(), reference.state_dict()
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert torch.equal(got[key], value), key


def test_reset_parameters_keeps_plain_parameters_in_place() -> None:
    """An optimizer built before ``reset_parameters`` still holds the module's weights."""
    module = te.LayerNormMLP(64, 128)
    before = {name: id(p) for name, p in module.named_parameters()}
    with torch.no_grad():
        module.fc1_weight.fill_(float("nan"))
        module.layer_norm_weight.zero_()
    module.reset_parameters()
    assert {name: id(p) for name, p in module.named_parameters()} == before
    assert torch.isfinite(module.fc1_weight).all()
    assert torch.equal(module.layer_norm_weight, torch.ones(64))


@pytest.mark.parametrize(
    "make_recipe",
    [recipe.Float8CurrentScaling, recipe.DelayedScaling, recipe.MXFP8BlockScaling],
    ids=["current", "delayed", "mxfp8"],
)
@pytest.mark.parametrize("name", sorted(GEMM_MODULES))
def test_meta_build_under_quantized_model_init(name: str, make_recipe: Any) -> None:
    """A meta build under ``quantized_model_init`` (which used to raise) holds empty
    quantized weights; ``to_empty`` + ``reset_parameters`` quantizes the drawn weights
    again, equal to a real quantized build under the same seed, and the module runs."""
    make = GEMM_MODULES[name]
    torch.manual_seed(5)
    with te.quantized_model_init(recipe=make_recipe()):
        reference = make()
    with te.quantized_model_init(recipe=make_recipe()):
        module = make(device="meta")
    for weight_name in WEIGHTS[name]:
        weight = getattr(module, weight_name)
        assert isinstance(weight, QuantizedTensor) and weight.device.type == "meta"
    module.to_empty(device="cpu")
    torch.manual_seed(5)
    module.reset_parameters()
    for weight_name in WEIGHTS[name]:
        got, want = getattr(module, weight_name), getattr(reference, weight_name)
        assert type(got) is type(want)
        assert torch.equal(got.dequantize(), want.dequantize()), weight_name
    x = torch.randn(128, 64)  # MXFP8 blocks of 32 rows per GEMM
    with te.autocast(recipe=make_recipe()):
        assert torch.equal(_call(name, module, x), _call(name, reference, x))


ZERO_FEATURE_CASES = {
    "Linear-in0": (lambda: te.Linear(0, 32), 0, 32),
    "Linear-out0": (lambda: te.Linear(32, 0), 32, 0),
    "LayerNormLinear-out0": (lambda: te.LayerNormLinear(32, 0), 32, 0),
    "LayerNormMLP-ffn0": (lambda: te.LayerNormMLP(32, 0), 32, 32),
    "GroupedLinear-in0": (lambda: te.GroupedLinear(3, 0, 32), 0, 32),
    "GroupedLinear-out0": (lambda: te.GroupedLinear(3, 32, 0), 32, 0),
}
ALL_RECIPES = {
    "bf16": None,
    "delayed": recipe.DelayedScaling,
    "current": recipe.Float8CurrentScaling,
    "mxfp8": recipe.MXFP8BlockScaling,
    "block": recipe.Float8BlockScaling,
    "nvfp4": recipe.NVFP4BlockScaling,
}


@pytest.mark.parametrize("recipe_name", sorted(ALL_RECIPES))
@pytest.mark.parametrize("case", sorted(ZERO_FEATURE_CASES))
def test_zero_features_give_empty_outputs_and_zero_gradients(case: str, recipe_name: str) -> None:
    """``in_features=0``/``out_features=0`` (or no hidden features) under every recipe:
    the output is each GEMM's bias on its rows (or empty), the gradients zero or empty,
    a bias's gradient the output gradient's row sums (it used to be a reshape error)."""
    make, k, n = ZERO_FEATURE_CASES[case]
    make_recipe = ALL_RECIPES[recipe_name]
    torch.manual_seed(0)
    module = make()
    with torch.no_grad():
        for name, param in module.named_parameters():
            if "bias" in name and "layer_norm" not in name:
                param.normal_()
    x = torch.randn(32, k, requires_grad=True)
    with te.autocast(enabled=make_recipe is not None, recipe=make_recipe and make_recipe()):
        out = _call(case.split("-")[0], module, x)
    assert out.shape == (32, n) and out.dtype == torch.float32
    if case.startswith("GroupedLinear"):
        biases = [module.bias0, module.bias1, module.bias1, module.bias2]
        expected = torch.cat([b.detach().expand(8, n) for b in biases])
    elif case == "LayerNormMLP-ffn0":
        expected = module.fc2_bias.detach().expand(32, n)
    else:
        expected = module.bias.detach().expand(32, n) if k == 0 else torch.zeros(32, 0)
    assert torch.equal(out, expected)
    grad = torch.randn_like(out)
    out.backward(grad)
    assert x.grad is not None and not x.grad.any()
    for name, param in module.named_parameters():
        if param.grad is None or param.numel() == 0:
            continue
        if name in ("bias", "fc2_bias"):
            assert torch.equal(param.grad, grad.sum(0)), name
        elif name.startswith("bias"):
            assert param.grad.shape == param.shape, name
        else:
            assert not param.grad.any(), name


@pytest.mark.parametrize("case", ["Linear-in0", "Linear-out0", "LayerNormLinear-out0"])
def test_zero_features_compile(case: str) -> None:
    make, k, _ = ZERO_FEATURE_CASES[case]
    module = make()
    x = torch.randn(32, k)
    compiled = torch.compile(module, fullgraph=True, backend="aot_eager")
    with te.autocast(recipe=recipe.Float8CurrentScaling()):
        assert torch.equal(compiled(x), module(x))
