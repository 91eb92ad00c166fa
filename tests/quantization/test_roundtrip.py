"""Quantize -> dequantize stays within each format's documented bound; bad input fails."""

from __future__ import annotations

import pytest
import torch
from quant_cases import (
    COMMON_SHAPES,
    QUANTIZERS,
    RAGGED_SHAPES,
    error_bound,
    random_input,
    usable_for,
)

from transformer_engine_ops.quantization import (
    Float8BlockQuantizer,
    Float8CurrentScalingQuantizer,
    Float8Quantizer,
    MXFP8Quantizer,
    NVFP4Quantizer,
)
from transformer_engine_ops.quantization.quantizer import QuantizedStorage, QuantizedTensor

SHAPE_CASES = [
    (name, shape) for name in QUANTIZERS for shape in COMMON_SHAPES + RAGGED_SHAPES[name]
]


def assert_within_bound(q, x, y):
    assert y.shape == x.shape and y.dtype == x.dtype
    err = (y.float() - x.float()).abs()
    bound = error_bound(q, x)
    assert bool((err <= bound).all()), f"max excess {(err - bound).max().item()}"


@pytest.mark.parametrize("name,shape", SHAPE_CASES)
def test_roundtrip_error_within_bound_for_each_usage(name, shape):
    q = usable_for(QUANTIZERS[name], shape)
    x = random_input(shape, seed=len(shape))
    t = q.quantize(x)
    for columnwise, present in ((False, q.rowwise_usage), (True, q.columnwise_usage)):
        if present:
            assert_within_bound(q, x, t.dequantize_usage(columnwise=columnwise))


@pytest.mark.parametrize("name", list(QUANTIZERS))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_inputs_dequantize_to_their_dtype(name, dtype):
    x = random_input((32, 64), dtype=dtype)
    y = QUANTIZERS[name].quantize(x).dequantize()
    assert y.dtype == dtype
    err = (y.float() - x.float()).abs()
    assert bool((err <= error_bound(QUANTIZERS[name], x) + x.float().abs() * 2**-7).all())


@pytest.mark.parametrize("name", list(QUANTIZERS))
def test_rowwise_only_and_columnwise_only_hold_only_their_buffers(name):
    x = random_input((32, 64))
    for rowwise, columnwise in ((True, False), (False, True)):
        q = QUANTIZERS[name].with_usage(rowwise=rowwise, columnwise=columnwise)
        t = q.quantize(x)
        assert (t.rowwise_usage, t.columnwise_usage) == (rowwise, columnwise)
        assert t.inner_names() == tuple(n for n, _, _ in q.inner_layout(x.shape))
        assert_within_bound(q, x, t.dequantize())


@pytest.mark.parametrize("name", list(QUANTIZERS))
def test_internal_gives_storage_and_default_gives_wrapper(name):
    x = random_input((32, 64))
    storage = QUANTIZERS[name].with_internal(True).quantize(x)
    wrapper = QUANTIZERS[name].quantize(x)
    assert isinstance(storage, QuantizedStorage) and not isinstance(storage, torch.Tensor)
    assert isinstance(wrapper, QuantizedTensor)
    assert storage.shape == wrapper.shape == x.shape
    assert storage.dtype == wrapper.dtype == x.dtype
    assert torch.equal(storage.dequantize(), wrapper.dequantize())


@pytest.mark.parametrize("name", list(QUANTIZERS))
def test_quantization_is_deterministic(name):
    x = random_input((32, 64))
    a, b = QUANTIZERS[name].quantize(x), QUANTIZERS[name].quantize(x.clone())
    for n in a.inner_names():
        assert torch.equal(getattr(a, n), getattr(b, n))


# ----- NaN / Inf (docs/quantization.md) -----


def with_specials(shape):
    x = random_input(shape)
    x[0, 0] = float("nan")
    x[17, 20] = float("inf")
    x[18, 40] = -float("inf")
    return x


def overflow_scope(q, columnwise):
    """(rows, cols) of the logical-matrix region one scale covers: an Inf anywhere in it
    makes the whole region dequantize non-finite (None: the whole tensor)."""
    if isinstance(q, (Float8CurrentScalingQuantizer, Float8Quantizer)):
        return None
    if isinstance(q, MXFP8Quantizer):
        block = (1, 32)
    elif isinstance(q, NVFP4Quantizer):
        block = (16, 16) if q.with_2d_quantization else (1, 16)
    else:
        block = q.block_shape()
    return block[::-1] if columnwise else block


def expected_non_finite(q, x, columnwise):
    """Where ``dequantize(quantize(x))`` must be non-finite: the NaN elements (their
    whole block for NVFP4, which has no NaN code) and every scale region holding an Inf."""
    scope = overflow_scope(q, columnwise)
    mask = torch.isnan(x)
    if isinstance(q, NVFP4Quantizer):
        scope_nan = scope
    else:
        scope_nan = (1, 1)
    for bad, region in ((torch.isinf(x), scope), (torch.isnan(x), scope_nan)):
        for r, c in bad.nonzero().tolist():
            if region is None:
                mask[:] = True
            else:
                rb, cb = region
                mask[r // rb * rb : (r // rb + 1) * rb, c // cb * cb : (c // cb + 1) * cb] = True
    return mask


@pytest.mark.parametrize("columnwise", [False, True], ids=["rowwise", "columnwise"])
@pytest.mark.parametrize("name", list(QUANTIZERS))
def test_nan_stays_and_inf_makes_its_scale_region_non_finite(name, columnwise):
    """Overflow is detectable: an Inf never saturates silently into finite values; NaN
    stays in its element (its block for NVFP4); everything else is finite and in bound."""
    q = QUANTIZERS[name].with_usage(rowwise=not columnwise, columnwise=columnwise)
    x = with_specials((32, 64))
    y = q.quantize(x).dequantize()
    mask = expected_non_finite(q, x, columnwise)
    assert torch.equal(~torch.isfinite(y), mask)
    assert bool(((y - x).abs() <= error_bound(q, x))[~mask].all())


@pytest.mark.parametrize("name", list(QUANTIZERS))
def test_without_inf_nothing_changes(name):
    """Only a NaN planted: NaN stays NaN, the other elements are finite and in bound."""
    q = QUANTIZERS[name]
    x = random_input((32, 64))
    x[0, 0] = float("nan")
    y = q.quantize(x).dequantize()
    mask = expected_non_finite(q, x, columnwise=False)
    assert torch.equal(~torch.isfinite(y), mask)
    assert bool(((y - x).abs() <= error_bound(q, x))[~mask].all())


@pytest.mark.parametrize("name", list(QUANTIZERS))
def test_all_zero_input_dequantizes_to_zero(name):
    x = torch.zeros(32, 64)
    assert torch.equal(QUANTIZERS[name].quantize(x).dequantize(), x)


# ----- delayed scaling -----


def test_delayed_scaling_uses_the_previous_amax_then_matches_current_scaling():
    x = random_input((16, 32))
    delayed = Float8Quantizer(amax_history_len=4)
    first = delayed.quantize(x)  # scale 1: values beyond 448 would saturate
    assert first._scale_inv.item() == 1.0
    second = delayed.quantize(x)
    current = Float8CurrentScalingQuantizer().quantize(x)
    assert torch.equal(second._data, current._data)
    assert torch.equal(second._scale_inv, current._scale_inv)
    # TE's history layout: slot 0 collects the next step's amax, older steps roll back.
    amax = x.abs().max().item()
    assert delayed.amax_history.tolist() == [0.0, 0.0, amax, amax]


def test_delayed_scaling_usage_copies_share_one_state():
    q = Float8Quantizer(amax_history_len=2)
    rowwise = q.with_usage(columnwise=False)
    rowwise.quantize(torch.full((4, 4), 3.0))
    assert q.amax_history.tolist() == [0.0, 3.0] and rowwise.scale is q.scale
    assert torch.equal(q.scale, torch.tensor([448.0]) / 3.0)


# ----- usage changes -----


@pytest.mark.parametrize(
    "q",
    [Float8CurrentScalingQuantizer(), Float8BlockQuantizer(block_scaling_dim=2, block_len=16)],
    ids=["fp8_current", "fp8_block_2d"],
)
def test_update_usage_recreates_the_missing_layout_exactly(q):
    x = random_input((48, 40))
    full = q.quantize(x)
    for keep_rowwise in (True, False):
        t = q.with_usage(rowwise=keep_rowwise, columnwise=not keep_rowwise).quantize(x)
        t.update_usage(rowwise_usage=True, columnwise_usage=True)
        for n in full.inner_names():
            assert torch.equal(getattr(t, n), getattr(full, n)), n


@pytest.mark.parametrize("name", ["mxfp8_e4m3", "nvfp4_1d", "fp8_block_1d"])
def test_update_usage_refuses_layouts_that_need_the_original_values(name):
    t = QUANTIZERS[name].with_usage(columnwise=False).quantize(random_input((32, 64)))
    with pytest.raises(RuntimeError, match="cannot create columnwise"):
        t.update_usage(columnwise_usage=True)


@pytest.mark.parametrize("name", list(QUANTIZERS))
def test_update_usage_drops_buffers(name):
    t = QUANTIZERS[name].quantize(random_input((32, 64)))
    t.update_usage(columnwise_usage=False)
    assert not t.columnwise_usage and t.quantizer.columnwise_usage is False
    assert all(getattr(t, n) is None for n in t.COLUMNWISE_NAMES)
    if t.USAGES_SHARE_VALUES:  # per-tensor FP8: the rowwise codes serve, exactly
        assert torch.equal(t.dequantize_usage(columnwise=True), t.dequantize())
    else:
        with pytest.raises(ValueError, match="has no columnwise data"):
            t.dequantize_usage(columnwise=True)


# ----- wrapper tensor behaviour -----


def test_wrapper_falls_back_to_dequantized_math():
    x = random_input((32, 64))
    t = QUANTIZERS["mxfp8_e4m3"].quantize(x)
    assert torch.equal(t + 1, t.dequantize() + 1)
    assert torch.equal(torch.matmul(t, torch.ones(64, 2)), t.dequantize() @ torch.ones(64, 2))


def test_wrapper_can_be_a_parameter_and_keeps_its_format_through_detach_and_clone():
    x = random_input((32, 64))
    t = QUANTIZERS["nvfp4_1d"].quantize(x)
    p = torch.nn.Parameter(t)
    assert isinstance(p, type(t)) and p.requires_grad
    for other in (p.detach(), p.clone()):
        assert type(other) is type(t)
        assert torch.equal(other.dequantize(), t.dequantize())
    assert "NVFP4Tensor" in repr(p)


def test_dequantize_of_a_parameter_passes_the_gradient_straight_through():
    p = torch.nn.Parameter(QUANTIZERS["fp8_current_e4m3"].quantize(random_input((4, 8))))
    (p.dequantize() * 3).sum().backward()
    assert torch.equal(p.grad, torch.full((4, 8), 3.0))


def test_copy_into_a_wrapper_requantizes_with_its_quantizer():
    q = QUANTIZERS["fp8_block_1d"]
    dst = q.quantize(torch.zeros(8, 256))
    src = random_input((8, 256))
    with torch.no_grad():
        dst.copy_(src)
    assert torch.equal(dst.dequantize(), q.quantize(src).dequantize())


# ----- bad input -----


@pytest.mark.parametrize("name", list(QUANTIZERS))
@pytest.mark.parametrize("dtype", [torch.int32, torch.float64, torch.uint8])
def test_unsupported_dtype_is_a_type_error_naming_the_format(name, dtype):
    q = QUANTIZERS[name]
    with pytest.raises(TypeError, match=f"{q.format_name}.*cannot quantize dtype"):
        q.quantize(torch.zeros(32, 64, dtype=dtype))


@pytest.mark.parametrize(
    "q,shape,message",
    [
        (
            MXFP8Quantizer(),
            (32, 48),
            "MXFP8 rowwise usage needs the last dim K to be a multiple of 32",
        ),
        (MXFP8Quantizer(), (3, 64), "MXFP8 columnwise usage needs .* M to be a multiple of 32"),
        (NVFP4Quantizer(), (4, 7), "NVFP4 rowwise usage .* last dim must be even"),
        (NVFP4Quantizer(), (3, 8), "NVFP4 columnwise usage .* must be even"),
        (Float8CurrentScalingQuantizer(), (), "at least one dimension"),
    ],
)
def test_shape_the_format_cannot_take_is_a_value_error(q, shape, message):
    with pytest.raises(ValueError, match=message):
        q.quantize(torch.zeros(shape))
    with pytest.raises(ValueError, match=message):
        q.inner_layout(shape)


@pytest.mark.parametrize("name", list(QUANTIZERS))
def test_device_the_reference_cannot_serve_is_a_value_error(name):
    q = QUANTIZERS[name]
    with pytest.raises(ValueError, match=f"{q.format_name}.*cpu or cuda.*meta"):
        q.quantize(torch.zeros(32, 64, device="meta"))


def test_invalid_quantizer_configs_are_rejected():
    with pytest.raises(TypeError, match="fp8_dtype"):
        Float8CurrentScalingQuantizer(fp8_dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="block_scaling_dim"):
        Float8BlockQuantizer(block_scaling_dim=3)
    with pytest.raises(ValueError, match="at least one of rowwise_usage"):
        MXFP8Quantizer(rowwise_usage=False, columnwise_usage=False)
