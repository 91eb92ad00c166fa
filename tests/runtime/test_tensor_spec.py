"""TensorSpec describes real quantized values exactly, without touching memory."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from transformer_engine_ops.quantization import (
    Float8BlockQuantizer,
    Float8CurrentScalingQuantizer,
    MXFP8Quantizer,
    NVFP4Quantizer,
)
from transformer_engine_ops.quantization.quantizer import QuantizedStorage, QuantizedTensor
from transformer_engine_ops.runtime.tensor_spec import TensorSpec, to_tensor_spec

FORMATS = {
    "fp8_current": Float8CurrentScalingQuantizer(),
    "mxfp8": MXFP8Quantizer(),
    "nvfp4": NVFP4Quantizer(),
    "nvfp4_2d": NVFP4Quantizer(with_2d_quantization=True),
    "fp8_block_1d": Float8BlockQuantizer(block_scaling_dim=1),
    "fp8_block_2d": Float8BlockQuantizer(block_scaling_dim=2),
}
USAGES = {"both": (True, True), "rowwise": (True, False), "columnwise": (False, True)}
FORMS = {"wrapper": False, "storage": True}
SHAPE = (2, 32, 64)

MATRIX = [(f, u, form) for f in FORMATS for u in USAGES for form in FORMS]


def quantizer(fmt, usage, form):
    rowwise, columnwise = USAGES[usage]
    q = FORMATS[fmt].with_usage(rowwise=rowwise, columnwise=columnwise)
    return q.with_internal(FORMS[form])


def layout_of(value):
    return [
        (n, tuple(getattr(value, n).shape), getattr(value, n).dtype) for n in value.inner_names()
    ]


@pytest.mark.parametrize("fmt,usage,form", MATRIX)
def test_fake_create_tensor_matches_a_real_quantized_value(fmt, usage, form):
    q = quantizer(fmt, usage, form)
    real = q.quantize(torch.randn(SHAPE))
    spec = TensorSpec(SHAPE, torch.float32, quantizer=q, device="cpu")
    with FakeTensorMode():
        fake = spec.create_tensor()
        assert all(isinstance(t, FakeTensor) for t in fake.inner_tensors())
        assert type(fake) is type(real)
        assert layout_of(fake) == layout_of(real)
        assert tuple(fake.shape) == SHAPE and fake.dtype == torch.float32
    assert spec.inner_names() == real.inner_names()
    assert spec.create_metadata() == real.__tensor_flatten__()[1]
    assert to_tensor_spec(real) == spec


@pytest.mark.parametrize("fmt,usage,form", MATRIX)
def test_flatten_unflatten_round_trips_bit_exactly(fmt, usage, form):
    q = quantizer(fmt, usage, form)
    real = q.quantize(torch.randn(SHAPE))
    names, ctx = real.__tensor_flatten__()
    hash(ctx)  # rides in a value-opaque constant
    inner = {n: getattr(real, n) for n in names}
    for outer_size in (SHAPE, None):
        back = type(real).__tensor_unflatten__(inner, ctx, outer_size, None)
        assert type(back) is type(real) and back.inner_names() == real.inner_names()
        for n in names:
            assert torch.equal(getattr(back, n), getattr(real, n))
        if outer_size is None and fmt.startswith("nvfp4") and usage == "columnwise":
            assert tuple(back.shape) == (64, 64)  # documented: 2-D (M, K)
        else:
            assert tuple(back.shape) == SHAPE
            assert torch.equal(back.dequantize(), real.dequantize())


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_assemble_rebuilds_from_inner_tensors_in_order(fmt):
    q = FORMATS[fmt]
    real = q.quantize(torch.randn(SHAPE))
    spec = to_tensor_spec(real)
    rebuilt = spec.assemble(real.inner_tensors())
    assert torch.equal(rebuilt.dequantize(), real.dequantize())
    with pytest.raises(ValueError, match="expected"):
        spec.assemble(real.inner_tensors()[:-1])


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_create_tensor_with_a_symbolic_batch_dim(fmt):
    from torch._dynamo.source import ConstantSource
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv

    shape_env = ShapeEnv()
    symbol = shape_env.create_symbol(64, ConstantSource("batch"), dynamic_dim=DimDynamic.DYNAMIC)
    batch = shape_env.create_symintnode(symbol, hint=64)
    q = FORMATS[fmt].with_usage(columnwise=False)
    spec = TensorSpec((batch, 64), torch.bfloat16, quantizer=q, device="cpu")
    with FakeTensorMode(shape_env=shape_env):
        fake = spec.create_tensor()
    real = q.quantize(torch.randn(64, 64))
    assert isinstance(fake.shape[0], torch.SymInt)
    hinted = [(n, tuple(int(d) for d in s), d) for n, s, d in layout_of(fake)]
    assert hinted == layout_of(real)
    hash(spec.create_metadata())


def test_plain_spec_is_one_inner_tensor():
    spec = TensorSpec((3, 4), torch.bfloat16, requires_grad=True, device="cpu")
    assert spec.inner_names() == ("data",) and spec.create_metadata() is None
    with FakeTensorMode():
        t = spec.create_tensor()
        assert isinstance(t, FakeTensor) and t.shape == (3, 4) and t.requires_grad
    x = torch.ones(3, 4)
    assert spec.assemble([x]) is x
    assert to_tensor_spec(torch.ones(3, 4, dtype=torch.bfloat16, requires_grad=True)) == spec


def test_spec_usage_follows_the_tensor_after_update_usage():
    t = FORMATS["fp8_current"].quantize(torch.randn(4, 8))
    t.update_usage(columnwise_usage=False)
    spec = to_tensor_spec(t)
    assert spec.inner_names() == ("_data", "_scale_inv")
    assert spec.with_usage(columnwise=True).inner_names() == ("_data", "_transpose", "_scale_inv")


def test_wrapper_spec_keeps_requires_grad_and_storage_has_none():
    q = FORMATS["mxfp8"]
    p = torch.nn.Parameter(q.quantize(torch.randn(32, 64)))
    assert to_tensor_spec(p).requires_grad
    spec = TensorSpec((32, 64), torch.float32, quantizer=q, requires_grad=True, device="cpu")
    with FakeTensorMode():
        assert spec.create_tensor().requires_grad
    storage = q.with_internal(True).quantize(torch.randn(32, 64))
    assert isinstance(storage, QuantizedStorage) and not to_tensor_spec(storage).requires_grad
    assert isinstance(p, QuantizedTensor)


def test_make_empty_allocates_the_spec_layout():
    q = FORMATS["nvfp4"]
    empty = q.make_empty((32, 64), dtype=torch.bfloat16, device="cpu")
    assert layout_of(empty) == [(n, tuple(s), d) for n, s, d in q.inner_layout((32, 64))]
    assert empty.dtype == torch.bfloat16
