"""``quantized_model_init`` under ``torch.no_grad``: TE's inference weights.

TE quantizes a weight with its columnwise data (the backward's) only where gradients are
enabled (``test_inference_mode`` in TE's test_sanity.py): a module built under
``torch.no_grad()`` holds rowwise weights only, and an inference forward makes none.
Per-tensor FP8 trains from such a weight anyway (its one scale lets the backward read
the transpose of the rowwise codes, as TE makes it); the block formats refuse a
training forward that would need the columnwise data, naming the weight."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import transformer_engine_ops as te
from transformer_engine_ops import recipe
from transformer_engine_ops.quantization.quantizer import QuantizedTensor

MODULES: dict[str, Callable[[], torch.nn.Module]] = {
    "Linear": lambda: te.Linear(32, 32),
    "LayerNormLinear": lambda: te.LayerNormLinear(32, 32),
    "LayerNormMLP": lambda: te.LayerNormMLP(32, 32),
    "GroupedLinear": lambda: te.GroupedLinear(1, 32, 32),
}
RECIPES: dict[str, Callable[[], Any]] = {
    "fp8_delayed": recipe.DelayedScaling,
    "fp8_current": recipe.Float8CurrentScaling,
    "mxfp8": recipe.MXFP8BlockScaling,
    "fp8_block": recipe.Float8BlockScaling,
    "nvfp4": lambda: recipe.NVFP4BlockScaling(disable_rht=True),
}


def _build(name: str, make_recipe: Callable[[], Any], grad: bool) -> torch.nn.Module:
    torch.manual_seed(0)
    with torch.set_grad_enabled(grad), te.quantized_model_init(recipe=make_recipe()):
        return MODULES[name]()


def _call(name: str, module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    return module(x, [x.shape[0]]) if name == "GroupedLinear" else module(x)


def _usages(module: torch.nn.Module) -> list[tuple[str, bool, bool]]:
    weights = [(n, p) for n, p in module.named_parameters() if isinstance(p, QuantizedTensor)]
    assert weights, "no quantized weight"
    return [(n, p.rowwise_usage, p.columnwise_usage) for n, p in weights]


@pytest.mark.parametrize("recipe_name", sorted(RECIPES))
@pytest.mark.parametrize("name", sorted(MODULES))
def test_weights_built_without_grad_are_rowwise_only_and_stay_so(name, recipe_name):
    """TE's ``test_inference_mode``: after the build and after an inference-mode forward,
    every quantized weight holds rowwise data only (FP8: no transpose; the block formats:
    no columnwise data); built with gradients, it holds both."""
    make_recipe = RECIPES[recipe_name]
    module = _build(name, make_recipe, grad=False)
    assert all(row and not col for _, row, col in _usages(module))
    for _, param in module.named_parameters():
        if isinstance(param, QuantizedTensor):
            assert all(getattr(param, n) is None for n in param.COLUMNWISE_NAMES)
            assert all(getattr(param, n) is not None for n in param.ROWWISE_NAMES)
    with torch.inference_mode(), te.autocast(recipe=make_recipe()):
        out = _call(name, module, torch.zeros(32, 32))
    assert out.shape == (32, 32)
    assert all(row and not col for _, row, col in _usages(module))
    assert all(row and col for _, row, col in _usages(_build(name, make_recipe, grad=True)))


def _train_step(name: str, module: Any, x: torch.Tensor, make_recipe: Callable[[], Any]) -> list:
    x = x.detach().clone().requires_grad_()
    with te.autocast(recipe=make_recipe()):
        out = _call(name, module, x)
    out.sum().backward()
    return [out.detach(), x.grad, *(p.grad for p in module.parameters())]


@pytest.mark.parametrize(
    ("recipe_name", "compiled"),
    [("fp8_delayed", False), ("fp8_current", False), ("fp8_current", True)],
    ids=["fp8_delayed-eager", "fp8_current-eager", "fp8_current-compiled"],
)
@pytest.mark.parametrize("name", sorted(MODULES))
def test_per_tensor_fp8_trains_from_rowwise_only_weights(name, recipe_name, compiled):
    """The backward reads the transpose of the rowwise codes: the same bits as a module
    built with gradients (delayed scaling runs eagerly under torch.compile)."""
    make_recipe = RECIPES[recipe_name]
    x = torch.randn(32, 32, generator=torch.Generator().manual_seed(1))
    rowwise = _build(name, make_recipe, grad=False)
    run = torch.compile(rowwise, fullgraph=True, backend="aot_eager") if compiled else rowwise
    got = _train_step(name, run, x, make_recipe)
    want = _train_step(name, _build(name, make_recipe, grad=True), x, make_recipe)
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert torch.equal(g, w), i
    assert all(row and not col for _, row, col in _usages(rowwise))  # the weight is kept


@pytest.mark.parametrize("recipe_name", ["mxfp8", "fp8_block", "nvfp4"])
@pytest.mark.parametrize("name", sorted(MODULES))
def test_block_formats_refuse_a_backward_through_rowwise_only_weights(name, recipe_name):
    """Their columnwise scales cannot be made from the rowwise data: a training forward
    whose backward reads it is refused at the forward, naming the weight and the cause;
    one whose backward needs no input gradient of the GEMM runs (Linear, GroupedLinear:
    in the fused modules the GEMM's input gradient feeds the norm's, and fc1's weight
    gradient, so it is always needed)."""
    make_recipe = RECIPES[recipe_name]
    module = _build(name, make_recipe, grad=False)
    x = torch.randn(32, 32)
    with pytest.raises(ValueError, match=r"LinearFwdArgs\.weight: a \w+Tensor holding rowwise"):
        with te.autocast(recipe=make_recipe()):
            _call(name, module, x.clone().requires_grad_())
    if name not in ("Linear", "GroupedLinear"):
        return
    with te.autocast(recipe=make_recipe()):
        out = _call(name, module, x)
    out.sum().backward()
    assert all(p.grad is not None for p in module.parameters())
