"""Compiled Linear at degenerate shapes (batch 1, batch 0, 1-D input, one feature,
dynamic batch down to 1) equals eager under every recipe that takes the shape."""

from __future__ import annotations

import pytest
import torch
from module_cases import graph_breaks, recipe_context

from transformer_engine_ops import autocast
from transformer_engine_ops.modules.linear import Linear
from transformer_engine_ops.recipe import NVFP4BlockScaling, QParams

AOT = "aot_eager"

# (input shape, in_features, out_features)
DEGENERATE = [
    ((1, 64), 64, 32),
    ((64,), 64, 32),
    ((0, 64), 64, 32),
    ((4, 1), 1, 32),
    ((4, 64), 64, 1),
    ((1, 1), 1, 1),
]
# Recipes whose formats take M, K of any size (MXFP8 needs multiples of 32; NVFP4 even K).
ANY_SHAPE_RECIPES = ["bf16", "fp8_current", "fp8_block"]


def _run(model, x, recipe):
    for p in model.parameters():
        p.grad = None
    x = x.detach().clone().requires_grad_(True)
    with recipe_context(recipe):
        y = model(x)
    y.float().sum().backward()
    return y.detach(), x.grad, [p.grad for p in model.parameters()]


def _assert_equal(got, want):
    assert torch.equal(got[0], want[0])
    assert torch.equal(got[1], want[1])
    for g, w in zip(got[2], want[2], strict=True):
        assert torch.equal(g, w)


@pytest.mark.parametrize("recipe", ANY_SHAPE_RECIPES)
@pytest.mark.parametrize(("shape", "fin", "fout"), DEGENERATE, ids=str)
def test_compiled_linear_at_degenerate_shapes_equals_eager(recipe, shape, fin, fout):
    torch.manual_seed(0)
    model = Linear(fin, fout, params_dtype=torch.bfloat16)
    x = torch.randn(shape).to(torch.bfloat16)
    eager = _run(model, x, recipe)
    got = _run(torch.compile(model, fullgraph=True, backend=AOT), x, recipe)
    assert graph_breaks() == 0
    _assert_equal(got, eager)


@pytest.mark.parametrize("recipe", ANY_SHAPE_RECIPES)
def test_dynamic_compile_at_batch_8_then_called_at_batch_1(recipe):
    torch.manual_seed(0)
    model = Linear(64, 32, params_dtype=torch.bfloat16)
    compiled = torch.compile(model, fullgraph=True, backend=AOT, dynamic=True)
    for batch in (8, 1, 0, 3):
        x = torch.randn(batch, 64).to(torch.bfloat16)
        _assert_equal(_run(compiled, x, recipe), _run(model, x, recipe))
    assert graph_breaks() == 0


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_nvfp4_4over6_linear_at_zero_tokens(compiled):
    """TE's NVFP4 4over6 recipe (2-D weight blocks) on an input of no tokens: the output
    is (0, out_features), the input gradient empty, the weight and bias gradients zero
    (TE's ``test_sanity_linear_with_zero_tokens``); the 4over6 quantize of an empty
    matrix once failed reshaping its zero per-block errors by -1."""
    torch.manual_seed(0)
    nvfp4 = NVFP4BlockScaling(
        disable_rht=True, disable_stochastic_rounding=True, nvfp4_4over6="all"
    )
    nvfp4.fp4_quant_fwd_weight = QParams(fp4_2d_quantization=True)
    model = Linear(64, 256, params_dtype=torch.bfloat16)
    run = torch.compile(model, fullgraph=True, backend=AOT) if compiled else model
    x = torch.randn(0, 64, dtype=torch.bfloat16, requires_grad=True)
    with autocast(recipe=nvfp4):
        y = run(x)
    y.sum().backward()
    assert y.shape == (0, 256)
    assert x.grad is not None and x.grad.shape == (0, 64)
    assert torch.equal(model.weight.grad, torch.zeros_like(model.weight))
    assert torch.equal(model.bias.grad, torch.zeros_like(model.bias))
