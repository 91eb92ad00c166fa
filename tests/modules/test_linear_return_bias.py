"""``Linear(return_bias=True)`` as in TE: ``forward`` returns ``(out, bias)``, the GEMM
adds no bias, and the bias still receives its gradient through the caller's use of it;
eager and compiled agree bit for bit."""

from __future__ import annotations

import pytest
import torch
from module_cases import (
    assert_bitwise,
    graph_breaks,
    make_input,
    recipe_context,
    step,
    unique_graphs,
)
from torch._dynamo.utils import counters

import transformer_engine_ops as te

DTYPE = torch.bfloat16


def make(return_bias: bool, bias: bool = True, seed: int = 0) -> te.Linear:
    torch.manual_seed(seed)
    module = te.Linear(64, 32, bias=bias, return_bias=return_bias, params_dtype=DTYPE)
    if bias:
        with torch.no_grad():
            module.bias.copy_(torch.randn(32).to(DTYPE))
    return module


class AddsBias(torch.nn.Module):
    """The caller's side of ``return_bias``: adds the returned bias itself."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = make(return_bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, bias = self.linear(x)
        return out + bias


@pytest.mark.parametrize("recipe", ["bf16", "fp8_current", "mxfp8"])
def test_return_bias_returns_the_bias_unapplied_and_it_gets_its_gradient(recipe):
    module = make(return_bias=True)
    no_bias = te.Linear(64, 32, bias=False, params_dtype=DTYPE)
    with torch.no_grad():
        no_bias.weight.copy_(module.weight)
    x = make_input()
    with recipe_context(recipe):
        out, bias = module(x)
        expected = no_bias(x)
    assert torch.equal(out, expected), "the GEMM must not add the bias"
    assert bias.dtype == x.dtype and torch.equal(bias, module.bias)
    (out + bias).sum().backward()
    expected.sum().backward()
    # d(sum)/d(bias) is the number of rows (4 x 16 tokens), exact in bf16.
    assert torch.equal(module.bias.grad, torch.full((32,), 64.0, dtype=DTYPE))
    assert torch.equal(module.weight.grad, no_bias.weight.grad)


def test_return_bias_without_bias_returns_none():
    out, bias = make(return_bias=True, bias=False)(make_input())
    assert bias is None and out.shape == (4, 16, 32)


@pytest.mark.parametrize("recipe", ["bf16", "fp8_current"])
def test_return_bias_compiles_fullgraph_bitwise_equal_to_eager(recipe):
    torch._dynamo.reset()
    counters.clear()
    model = AddsBias()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    x = make_input()
    assert_bitwise(step(compiled, x, recipe), step(model, x, recipe))
    assert graph_breaks() == 0 and unique_graphs() == 1
