"""A quantized value keeps the names of its present inner buffers (``inner_names``, read
by ``device``, ``inner_tensors`` and ``__tensor_flatten__``) instead of scanning its
buffers on every call: the kept names must match the buffers after every way a value is
built or changed."""

from __future__ import annotations

import copy
import io
import pickle

import pytest
import torch
from quant_cases import QUANTIZERS, random_input

from transformer_engine_ops.quantization import Float8CurrentScalingQuantizer
from transformer_engine_ops.quantization.quantizer import QuantizedData, QuantizedStorage

SHAPE = (32, 64)
USAGES = [(True, True), (True, False), (False, True)]


def buffers_present(v: QuantizedData) -> tuple[str, ...]:
    """The present buffers, found by scanning every inner name (what the kept names skip)."""
    return tuple(n for n in type(v).INNER_NAMES if getattr(v, n) is not None)


def assert_names_match_buffers(v: QuantizedData) -> None:
    present = buffers_present(v)
    assert present, "a quantized value holds at least one buffer"
    assert v.inner_names() == present
    assert [id(t) for t in v.inner_tensors()] == [id(getattr(v, n)) for n in present]
    assert v.__tensor_flatten__()[0] == list(present)
    assert v.device == getattr(v, present[0]).device
    assert (v.rowwise_usage, v.columnwise_usage) == (
        any(n in present for n in type(v).ROWWISE_NAMES),
        any(n in present for n in type(v).COLUMNWISE_NAMES),
    )


def quantized(name: str, rowwise: bool, columnwise: bool, internal: bool) -> QuantizedData:
    q = QUANTIZERS[name].with_usage(rowwise=rowwise, columnwise=columnwise)
    return q.with_internal(internal).quantize(random_input(SHAPE))


@pytest.mark.parametrize("internal", [True, False], ids=["storage", "wrapper"])
@pytest.mark.parametrize("rowwise,columnwise", USAGES)
@pytest.mark.parametrize("name", list(QUANTIZERS))
def test_quantize_and_make_empty_keep_the_present_names(name, rowwise, columnwise, internal):
    v = quantized(name, rowwise, columnwise, internal)
    assert_names_match_buffers(v)
    q = v.quantizer
    assert_names_match_buffers(q.make_empty(SHAPE, dtype=torch.float32, device="cpu"))


@pytest.mark.parametrize("internal", [True, False], ids=["storage", "wrapper"])
@pytest.mark.parametrize("rowwise,columnwise", USAGES)
@pytest.mark.parametrize("name", list(QUANTIZERS))
def test_rebuilds_from_inner_buffers_keep_the_present_names(name, rowwise, columnwise, internal):
    v = quantized(name, rowwise, columnwise, internal)
    names, ctx = v.__tensor_flatten__()
    inner = {n: getattr(v, n) for n in names}
    assert_names_match_buffers(type(v).__tensor_unflatten__(inner, ctx, None, None))
    if isinstance(v, QuantizedStorage):
        rebuilt = type(v)._from_flat(names, [inner[n] for n in names], ctx)
        assert_names_match_buffers(rebuilt)
    assert_names_match_buffers(copy.deepcopy(v))
    assert_names_match_buffers(pickle.loads(pickle.dumps(v)))


@pytest.mark.parametrize("name", list(QUANTIZERS))
def test_dropping_a_usage_updates_the_present_names(name):
    for internal in (True, False):
        for keep_rowwise in (True, False):
            v = quantized(name, True, True, internal)
            v.update_usage(rowwise_usage=keep_rowwise, columnwise_usage=not keep_rowwise)
            assert_names_match_buffers(v)
            assert v.rowwise_usage is keep_rowwise


@pytest.mark.parametrize("internal", [True, False], ids=["storage", "wrapper"])
def test_deriving_a_usage_updates_the_present_names(internal):
    # FP8 per-tensor derives one usage from the other exactly (a transpose).
    for rowwise in (True, False):
        v = quantized("fp8_current_e4m3", rowwise, not rowwise, internal)
        v.update_usage(rowwise_usage=True, columnwise_usage=True)
        assert_names_match_buffers(v)
        assert v.rowwise_usage and v.columnwise_usage


@pytest.mark.parametrize("name", list(QUANTIZERS))
def test_wrapper_dispatch_rules_keep_the_present_names(name):
    v = quantized(name, True, False, False)
    for made in (v.detach(), v.clone(), v.to("cpu"), torch.ops.aten.alias(v)):
        assert type(made) is type(v)
        assert_names_match_buffers(made)
    dst = quantized(name, True, False, False)
    dst.copy_(random_input(SHAPE, seed=3))
    assert_names_match_buffers(dst)


def test_a_saved_and_loaded_wrapper_keeps_the_present_names():
    v = quantized("fp8_current_e4m3", False, True, False)
    buf = io.BytesIO()
    torch.save({"w": v}, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)["w"]
    assert_names_match_buffers(loaded)
    assert loaded.inner_names() == ("_transpose", "_scale_inv")


def test_an_unpickled_value_derives_its_names_from_its_buffers():
    """A pickle made before the names were kept (no ``_present_names`` in its state)."""
    v = Float8CurrentScalingQuantizer(internal=True).quantize(random_input(SHAPE))
    state = dict(v.__dict__)
    del state["_present_names"]
    restored = object.__new__(type(v))
    restored.__setstate__(state)
    assert_names_match_buffers(restored)


def test_bad_inner_buffers_are_still_refused_by_name():
    q = Float8CurrentScalingQuantizer(internal=True)
    v = q.quantize(random_input(SHAPE))
    cls = type(v)
    with pytest.raises(ValueError, match=r"unknown inner buffers \['_bogus'\]"):
        cls(
            {"_data": v._data, "_scale_inv": v._scale_inv, "_bogus": v._data},
            quantizer=q,
            dtype=torch.float32,
        )
    with pytest.raises(ValueError, match="neither rowwise nor columnwise data given"):
        cls({"_scale_inv": v._scale_inv}, quantizer=q, dtype=torch.float32, shape=SHAPE)
    with pytest.raises(ValueError, match=r"missing inner buffers \['_scale_inv'\]"):
        cls({"_data": v._data}, quantizer=q, dtype=torch.float32)
