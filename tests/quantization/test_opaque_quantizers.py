"""TE's four tensorless quantizer classes as torch opaque value types, as TE registers
them: a user's own ``torch.library`` schema names one, and a compiled call passes an
instance as a constant guarded by its equality (this package's own ops take the
quantizer's text instead; their compiled tests are the modules' own)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from quant_cases import QUANTIZERS, random_input
from torch._dynamo.testing import CompileCounterWithBackend
from torch._library.opaque_object import get_opaque_type_name, is_opaque_value_type

from transformer_engine_ops.quantization import (
    Float8BlockQuantizer,
    Float8CurrentScalingQuantizer,
    Float8Quantizer,
    MXFP8Quantizer,
    NVFP4Quantizer,
)
from transformer_engine_ops.quantization.quantizer import fx_dtype

REGISTERED = (Float8CurrentScalingQuantizer, MXFP8Quantizer, Float8BlockQuantizer, NVFP4Quantizer)

# One op a class, as a user writes it: quantize and dequantize inside the op.
_LIB = torch.library.Library("teops_opaque_quantizer_test", "DEF")
_QDQ = {}
for _cls in REGISTERED:
    _name = f"qdq_{_cls.__name__}"
    _LIB.define(f"{_name}(Tensor x, {get_opaque_type_name(_cls)} q) -> Tensor")
    _LIB.impl(_name, lambda x, q: q(x).dequantize(), "CompositeExplicitAutograd")
    torch.library.register_fake(f"{_LIB.ns}::{_name}", lambda x, q: torch.empty_like(x), lib=_LIB)
    _QDQ[_cls] = getattr(getattr(torch.ops, _LIB.ns), _name)


@pytest.mark.parametrize("cls", REGISTERED, ids=lambda c: c.__name__)
def test_each_tensorless_class_is_an_opaque_value_type(cls):
    assert is_opaque_value_type(cls)
    assert get_opaque_type_name(cls) == f"{cls.__module__}.{cls.__qualname__}"


def test_delayed_scaling_quantizer_is_no_opaque_value():
    # Its scale and amax history change on every call: no graph constant (value_opaque).
    assert not is_opaque_value_type(Float8Quantizer)
    with pytest.raises(ValueError, match="not registered"):
        get_opaque_type_name(Float8Quantizer)


def test_fx_dtype_names_torch_dtypes_only():
    assert fx_dtype("float8_e4m3fn") is torch.float8_e4m3fn
    with pytest.raises(ValueError, match="no dtype 'nn'"):
        fx_dtype("nn")


@pytest.mark.parametrize("name", list(QUANTIZERS))
def test_a_users_op_takes_a_quantizer_under_fullgraph(name):
    """Inductor's graph names the quantizer by its ``__fx_repr__`` and the op runs the
    same quantize as eagerly: the same bits."""
    q = QUANTIZERS[name]
    op = _QDQ[type(q)]
    x = random_input((64, 128), seed=3, dtype=torch.bfloat16)
    expected = op(x, q)
    torch._dynamo.reset()
    got = torch.compile(lambda t: op(t, q), fullgraph=True)(x)
    assert torch.equal(got, expected)


def test_a_compiled_call_is_guarded_on_the_quantizers_value():
    counter = CompileCounterWithBackend("aot_eager")
    op = _QDQ[Float8CurrentScalingQuantizer]
    x = random_input((32, 64), seed=5)

    @torch.compile(backend=counter, fullgraph=True)
    def run(t, q):
        return op(t, q)

    torch._dynamo.reset()
    q = Float8CurrentScalingQuantizer()
    assert torch.equal(run(x, q), op(x, q))
    assert torch.equal(run(x, dataclasses.replace(q)), op(x, q))  # an equal value
    assert counter.frame_count == 1
    other = Float8CurrentScalingQuantizer(fp8_dtype=torch.float8_e5m2)
    assert torch.equal(run(x, other), op(x, other))  # another value: another graph
    assert counter.frame_count == 2


def test_a_quantizer_changed_by_set_usage_compiles_with_its_new_value():
    q = MXFP8Quantizer()
    q.set_usage(rowwise=True, columnwise=False)
    op = _QDQ[MXFP8Quantizer]
    x = random_input((64, 64), seed=7, dtype=torch.bfloat16)
    torch._dynamo.reset()
    got = torch.compile(lambda t: op(t, q), fullgraph=True)(x)
    assert torch.equal(got, op(x, q))
