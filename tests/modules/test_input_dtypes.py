"""Input dtypes: float64 computes in float64 (``gradcheck`` passes on every module, as
on ``torch.nn.Linear``); an integer, boolean or complex input is refused, as
``torch.nn.Linear`` refuses it, instead of being cast; so are ``m_splits`` that are not
integers, instead of being truncated."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from transformer_engine_ops.modules.grouped_linear import GroupedLinear
from transformer_engine_ops.modules.layernorm import LayerNorm, RMSNorm
from transformer_engine_ops.modules.layernorm_linear import LayerNormLinear
from transformer_engine_ops.modules.layernorm_mlp import LayerNormMLP
from transformer_engine_ops.modules.linear import Linear

F64 = torch.float64
SPLITS = [2, 0, 3]

# name -> (module factory, call taking the module and its input)
MODULES: dict[str, tuple[Callable[[], torch.nn.Module], Callable[[Any, torch.Tensor], Any]]] = {
    "Linear": (lambda: Linear(8, 6, params_dtype=F64), lambda m, x: m(x)),
    "LayerNorm": (lambda: LayerNorm(8, params_dtype=F64), lambda m, x: m(x)),
    "RMSNorm": (lambda: RMSNorm(8, params_dtype=F64), lambda m, x: m(x)),
    "LayerNormLinear": (lambda: LayerNormLinear(8, 6, params_dtype=F64), lambda m, x: m(x)),
    "LayerNormMLP": (lambda: LayerNormMLP(8, 16, params_dtype=F64), lambda m, x: m(x)),
    "GroupedLinear": (lambda: GroupedLinear(3, 8, 6, params_dtype=F64), lambda m, x: m(x, SPLITS)),
}


def _module(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    module = MODULES[name][0]()
    with torch.no_grad():  # non-trivial norm parameters and biases
        for p in module.parameters():
            p.add_(torch.randn(p.shape, dtype=p.dtype) * 0.1)
    return module


def _input(requires_grad: bool = True) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1)
    return torch.randn(5, 8, dtype=F64, generator=gen).requires_grad_(requires_grad)


@pytest.mark.parametrize("name", list(MODULES))
def test_float64_passes_gradcheck_for_input_and_parameters(name):
    module = _module(name)
    names = [n for n, _ in module.named_parameters()]
    params = tuple(p.detach().clone().requires_grad_(True) for p in module.parameters())

    def run(x: torch.Tensor, *values: torch.Tensor) -> torch.Tensor:
        state = dict(zip(names, values, strict=True))
        args = (x, SPLITS) if name == "GroupedLinear" else (x,)
        return torch.func.functional_call(module, state, args)

    assert run(_input(), *params).dtype == F64
    assert torch.autograd.gradcheck(run, (_input(), *params))


@pytest.mark.parametrize("name", list(MODULES))
def test_float64_compiled_equals_eager(name):
    module, call = _module(name), MODULES[name][1]
    compiled = torch.compile(module, backend="aot_eager", fullgraph=name != "GroupedLinear")

    def step(m: Any) -> tuple[torch.Tensor, ...]:
        module.zero_grad(set_to_none=True)
        x = _input()
        out = call(m, x)
        out.square().sum().backward()
        return (out.detach(), x.grad, *(p.grad for p in module.parameters()))

    eager, got = step(module), step(compiled)
    assert all(torch.equal(a, b) for a, b in zip(eager, got, strict=True))
    assert got[0].dtype == F64


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool, torch.complex64])
@pytest.mark.parametrize("name", list(MODULES))
def test_a_non_floating_input_is_refused_naming_the_module_and_dtype(name, dtype):
    module, call = _module(name), MODULES[name][1]
    with pytest.raises(TypeError, match=rf"{name}: input of dtype {dtype}; expected a floating"):
        call(module, torch.ones(5, 8, dtype=dtype))


@pytest.mark.parametrize(
    "m_splits,message",
    [
        (torch.tensor([2.0, 0.0, 3.0]), r"GroupedLinearFwdArgs\.m_splits: dtype torch\.float32"),
        (torch.tensor([2.5, 0.0, 2.5]), r"GroupedLinearFwdArgs\.m_splits: dtype torch\.float32"),
        (torch.tensor([True, False, True]), r"GroupedLinearFwdArgs\.m_splits: dtype torch\.bool"),
        ([2.5, 0, 2.5], r"GroupedLinear\.forward: m_splits\[0\] is 2\.5 \(float\)"),
        ([2, False, 3], r"GroupedLinear\.forward: m_splits\[1\] is False \(bool\)"),
    ],
    ids=["float_tensor", "fractional_tensor", "bool_tensor", "float_list", "bool_list"],
)
def test_m_splits_that_are_not_integers_are_refused(m_splits, message):
    module = _module("GroupedLinear")
    with pytest.raises(TypeError, match=message):
        module(_input(requires_grad=False), m_splits)


def test_integer_m_splits_of_any_integer_dtype_are_taken():
    module = _module("GroupedLinear")
    x = _input(requires_grad=False)
    want = module(x, SPLITS)
    assert torch.equal(module(x, torch.tensor(SPLITS, dtype=torch.int32)), want)
    assert torch.equal(module(x, tuple(torch.tensor(SPLITS).tolist())), want)
