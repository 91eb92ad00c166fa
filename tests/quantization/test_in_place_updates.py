"""An in-place op on a quantized tensor updates it: the stored value becomes
``quantize(op(dequantize(w)))``, bit for bit, in the same object, quantizer and buffers
(TE's rule for quantized parameters). Nothing is dropped: an op whose result cannot be
requantized raises naming the op and leaves the tensor as it was."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from quant_cases import QUANTIZERS, random_input

from transformer_engine_ops.quantization import Float8Quantizer
from transformer_engine_ops.quantization.quantizer import QuantizedTensor, Quantizer

SHAPE = (32, 64)
FORMATS = {**QUANTIZERS, "fp8_delayed": None}  # delayed scaling: a fresh stateful one each


def _quantizer(name: str) -> Quantizer:
    return Float8Quantizer(amax_history_len=4) if name == "fp8_delayed" else FORMATS[name]


def _operands(dtype: torch.dtype) -> dict[str, torch.Tensor]:
    return {
        "g": random_input(SHAPE, seed=11, dtype=dtype) * 0.1,
        "a": random_input(SHAPE, seed=12, dtype=dtype),
        "b": random_input(SHAPE, seed=13, dtype=dtype).abs() + 0.5,
        "mask": random_input(SHAPE, seed=14) > 0,
    }


def _gen_normal(t: torch.Tensor, o: dict[str, torch.Tensor]) -> Any:
    return t.normal_(0.0, 0.02, generator=torch.Generator().manual_seed(5))


# name -> op applied to the tensor written (quantized, or its plain dequantized copy).
IN_PLACE_OPS: dict[str, Callable[[torch.Tensor, dict[str, torch.Tensor]], Any]] = {
    "add_": lambda t, o: t.add_(o["g"], alpha=-0.1),
    "sub_": lambda t, o: t.sub_(o["g"]),
    "mul_": lambda t, o: t.mul_(0.9),
    "mul_tensor": lambda t, o: t.mul_(o["b"]),
    "div_": lambda t, o: t.div_(o["b"]),
    "addcdiv_": lambda t, o: t.addcdiv_(o["a"], o["b"], value=-0.01),
    "addcmul_": lambda t, o: t.addcmul_(o["a"], o["g"], value=0.3),
    "lerp_": lambda t, o: t.lerp_(o["a"], 0.25),
    "clamp_": lambda t, o: t.clamp_(-0.5, 0.5),
    "neg_": lambda t, o: t.neg_(),
    "copy_": lambda t, o: t.copy_(o["a"]),
    "copy_broadcast": lambda t, o: t.copy_(o["a"][0]),
    "copy_from_fp64": lambda t, o: t.copy_(o["a"].double()),
    "zero_": lambda t, o: t.zero_(),
    "fill_": lambda t, o: t.fill_(0.25),
    "masked_fill_": lambda t, o: t.masked_fill_(o["mask"], 0.0),
    "index_put_": lambda t, o: t.index_put_((torch.tensor([0, 3]),), o["a"][:2]),
    "normal_": _gen_normal,
    "out=": lambda t, o: torch.add(o["a"], o["g"], out=t),
    "_foreach_add_": lambda t, o: torch._foreach_add_([t], [o["g"]], alpha=-0.1),
    "_foreach_sub_": lambda t, o: torch._foreach_sub_([t], [o["g"]]),
    "_foreach_mul_": lambda t, o: torch._foreach_mul_([t], 0.99),
    "_foreach_div_": lambda t, o: torch._foreach_div_([t], [o["b"]]),
    "_foreach_addcdiv_": lambda t, o: torch._foreach_addcdiv_([t], [o["a"]], [o["b"]], [-0.01]),
    "_foreach_addcmul_": lambda t, o: torch._foreach_addcmul_([t], [o["a"]], [o["g"]], 0.5),
    "_foreach_lerp_": lambda t, o: torch._foreach_lerp_([t], [o["a"]], 0.1),
    "_foreach_clamp_max_": lambda t, o: torch._foreach_clamp_max_([t], 0.3),
    "_foreach_copy_": lambda t, o: torch._foreach_copy_([t], [o["a"]]),
    "_foreach_zero_": lambda t, o: torch._foreach_zero_([t]),
}


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


def assert_same_buffers(got: QuantizedTensor, want: Any) -> None:
    assert got.inner_names() == want.inner_names()
    for name in got.inner_names():
        assert torch.equal(bits(getattr(got, name)), bits(getattr(want, name))), name


def _state(q: Quantizer) -> list[torch.Tensor]:
    return [q.scale, q.amax_history] if isinstance(q, Float8Quantizer) else []


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("op", list(IN_PLACE_OPS))
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_in_place_op_stores_the_requantized_result_bitwise(fmt, op, dtype):
    quantizer = _quantizer(fmt)
    w = quantizer.quantize(random_input(SHAPE, seed=1, dtype=dtype))
    operands = _operands(dtype)
    # The rule, on plain tensors: quantize(op(dequantize(w))); a delayed-scaling
    # quantizer from the same state (a snapshot) sees the same quantize calls.
    reference = w.quantizer.snapshot() if fmt == "fp8_delayed" else w.quantizer
    value = w.dequantize().contiguous()  # as w presents itself (normal_ fills in order)
    IN_PLACE_OPS[op](value, operands)
    want = reference.with_internal(True).quantize(value)

    buffers = [t.untyped_storage().data_ptr() for t in w.inner_tensors()]
    quantizer_before, version = w.quantizer, w._version
    with torch.no_grad():
        returned = IN_PLACE_OPS[op](w, operands)

    assert_same_buffers(w, want)
    assert w.quantizer is quantizer_before and w.dtype == dtype and w.shape == SHAPE
    assert [t.untyped_storage().data_ptr() for t in w.inner_tensors()] == buffers
    assert w._version > version
    if isinstance(returned, torch.Tensor):
        assert returned is w
    for got_state, want_state in zip(_state(w.quantizer), _state(reference), strict=True):
        assert torch.equal(got_state, want_state)


@pytest.mark.parametrize("fmt", ["fp8_current_e4m3", "mxfp8_e4m3", "nvfp4_1d", "fp8_block_2d"])
def test_foreach_op_requantizes_each_quantized_tensor_and_updates_the_plain_ones(fmt):
    q = FORMATS[fmt]
    w1, w2 = q.quantize(random_input(SHAPE, seed=1)), q.quantize(random_input(SHAPE, seed=2))
    plain = random_input(SHAPE, seed=3)
    grads = [random_input(SHAPE, seed=s) for s in (4, 5, 6)]
    want = [t.dequantize().add(g, alpha=-0.5) for t, g in zip((w1, w2), grads, strict=False)]
    want_plain = plain.add(grads[2], alpha=-0.5)
    torch._foreach_add_([w1, w2, plain], grads, alpha=-0.5)
    assert_same_buffers(w1, q.with_internal(True).quantize(want[0]))
    assert_same_buffers(w2, q.with_internal(True).quantize(want[1]))
    assert torch.equal(plain, want_plain)


def test_a_quantized_tensor_passed_twice_is_one_value():
    q = FORMATS["fp8_current_e4m3"]
    w = q.quantize(random_input(SHAPE, seed=1))
    want = q.with_internal(True).quantize(w.dequantize() * 2)
    w.add_(w)
    assert_same_buffers(w, want)


def test_an_in_place_op_that_only_reads_a_quantized_tensor_leaves_it_alone():
    q = FORMATS["mxfp8_e4m3"]
    w = q.quantize(random_input(SHAPE, seed=1))
    before = [t.clone() for t in w.inner_tensors()]
    version = w._version
    exp_avg = torch.zeros(SHAPE)
    exp_avg.lerp_(w, 0.1)
    assert torch.equal(exp_avg, torch.zeros(SHAPE).lerp_(w.dequantize(), 0.1))
    assert w._version == version
    assert all(torch.equal(a, b) for a, b in zip(w.inner_tensors(), before, strict=True))


def test_data_and_detach_alias_the_quantized_buffers():
    q = FORMATS["fp8_block_1d"]
    p = torch.nn.Parameter(q.quantize(random_input(SHAPE, seed=1)))
    want = q.with_internal(True).quantize(p.dequantize() + 1)
    p.data.add_(1.0)
    assert_same_buffers(p, want)
    want = q.with_internal(True).quantize(p.dequantize() * 0.5)
    p.detach().mul_(0.5)
    assert_same_buffers(p, want)


def test_a_leaf_parameter_keeps_torchs_in_place_rules():
    p = torch.nn.Parameter(FORMATS["nvfp4_1d"].quantize(random_input(SHAPE, seed=1)))
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        p.add_(1.0)
    with torch.no_grad():
        p.add_(1.0)
    assert p.requires_grad and isinstance(p, torch.nn.Parameter) and p.is_leaf


@pytest.mark.parametrize(
    "op",
    [
        lambda w: w.resize_(64, 32 * 2),
        lambda w: w.unsqueeze_(0),
        lambda w: w.set_(torch.zeros(SHAPE)),
    ],
    ids=["resize_", "unsqueeze_", "set_"],
)
def test_an_op_that_cannot_be_requantized_raises_naming_it_and_changes_nothing(op):
    w = FORMATS["fp8_current_e4m3"].quantize(random_input(SHAPE, seed=1))
    before = [t.clone() for t in w.inner_tensors()]
    with pytest.raises(RuntimeError, match=r"aten\.(resize_|unsqueeze_|set_)"):
        op(w)
    assert w.shape == SHAPE
    assert all(torch.equal(a, b) for a, b in zip(w.inner_tensors(), before, strict=True))


def test_out_of_place_ops_and_new_tensors_like_it_are_plain_tensors_of_its_dtype():
    """What an optimizer builds from a parameter (its state) is high precision."""
    w = FORMATS["mxfp8_e4m3"].quantize(random_input(SHAPE, seed=1, dtype=torch.bfloat16))
    for made in (
        torch.zeros_like(w, memory_format=torch.preserve_format),
        torch.ones_like(w),
        torch.full_like(w, 0.1),
        torch.empty_like(w),
        w.mul(0.5),
        w + w,
        torch._foreach_mul([w], 2.0)[0],
    ):
        assert type(made) is torch.Tensor and made.dtype == torch.bfloat16
    assert torch.equal(w.mul(0.5), w.dequantize().mul(0.5))


def test_quantize_takes_a_plain_tensor_of_its_shape():
    w = FORMATS["fp8_current_e4m3"].quantize(random_input(SHAPE, seed=1))
    with pytest.raises(ValueError, match=r"Float8Tensor.quantize_: value of shape \(64, 32\)"):
        w.quantize_(torch.zeros(64, 32))
    with pytest.raises(TypeError, match="takes a plain tensor, got Float8Tensor"):
        w.quantize_(w.clone())


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_copy_from_a_quantized_tensor_of_the_same_format_copies_its_codes(fmt):
    """Loading a state dict into quantized parameters round-trips bit for bit."""
    dst = _quantizer(fmt).quantize(random_input(SHAPE, seed=1))
    src = _quantizer(fmt).quantize(random_input(SHAPE, seed=2))
    state = [t.clone() for t in _state(dst.quantizer)]
    version = dst._version
    with torch.no_grad():
        dst.copy_(src)
    assert_same_buffers(dst, src)
    assert dst._version > version
    assert all(torch.equal(a, b) for a, b in zip(_state(dst.quantizer), state, strict=True))


def test_copy_from_another_format_requantizes_its_value():
    dst = FORMATS["fp8_current_e4m3"].quantize(random_input(SHAPE, seed=1))
    src = FORMATS["mxfp8_e4m3"].quantize(random_input(SHAPE, seed=2))
    dst.copy_(src)
    assert_same_buffers(
        dst, FORMATS["fp8_current_e4m3"].with_internal(True).quantize(src.dequantize())
    )


# ----- views: a write through a view of a quantized tensor reaches it -----


def _set_columns(t: torch.Tensor) -> None:
    t[:, :4] = 1.0


# name -> a write into a view of the tensor (quantized, or its plain dequantized copy).
VIEW_WRITES: dict[str, Callable[[torch.Tensor], Any]] = {
    "row_zero_": lambda t: t[0].zero_(),
    "slice_assign": _set_columns,
    "t_mul_": lambda t: t.t().mul_(2.0),
    "view_strided_add_": lambda t: t.view(-1)[::3].add_(0.5),
    "split_copy_": lambda t: t.split(16)[1].copy_(torch.full((16, 64), -0.25)),
    "view_of_view_fill_": lambda t: t[2:6][1].fill_(3.0),
}


@pytest.mark.parametrize("write", list(VIEW_WRITES))
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_a_write_through_a_view_requantizes_the_whole_tensor(fmt, write):
    quantizer = _quantizer(fmt)
    w = quantizer.quantize(random_input(SHAPE, seed=1))
    reference = w.quantizer.snapshot() if fmt == "fp8_delayed" else w.quantizer
    value = w.dequantize().contiguous()  # as w presents itself
    VIEW_WRITES[write](value)
    want = reference.with_internal(True).quantize(value)
    version = w._version
    with torch.no_grad():
        VIEW_WRITES[write](w)
    assert_same_buffers(w, want)
    assert w._version > version


def test_a_view_reads_the_current_value_and_other_ops_on_it_are_plain():
    q = FORMATS["fp8_block_2d"]
    w = q.quantize(random_input(SHAPE, seed=1))
    row, cols = w[3], w.t()[:5]
    w.mul_(0.5)
    assert torch.equal(row.clone(), w.dequantize()[3])
    assert torch.equal(cols * 1, w.dequantize().t()[:5])
    assert type(row + 1) is torch.Tensor and type(torch.cat([row, row])) is torch.Tensor
    assert repr(row).startswith("QuantizedView(of Float8BlockwiseQTensor")


def test_a_view_of_a_parameter_carries_its_gradient():
    p = torch.nn.Parameter(FORMATS["mxfp8_e4m3"].quantize(random_input(SHAPE, seed=1)))
    x = random_input((8, 64), seed=2)
    (x @ p[:16].t()).sum().backward()
    want = torch.zeros(SHAPE)
    want[:16] = x.sum(0)
    assert type(p.grad) is torch.Tensor and torch.equal(p.grad, want)


def test_changing_a_views_shape_in_place_raises_naming_the_op():
    w = FORMATS["nvfp4_1d"].quantize(random_input(SHAPE, seed=1))
    with pytest.raises(RuntimeError, match=r"aten\.unsqueeze_.*view of a quantized tensor"):
        w[0].unsqueeze_(0)


@pytest.mark.xfail(
    torch.__version__ < (2, 13),
    reason="torch 2.11's Dynamo fails to clone the plain view it traced (a FakeTensor "
    "copy_ error in its clone_input); torch 2.13 compiles it",
    strict=True,
)
def test_a_compiled_graph_reads_views_of_a_quantized_tensor_as_plain_values():
    w = FORMATS["fp8_current_e4m3"].quantize(random_input(SHAPE, seed=1))
    x = random_input((4, 64), seed=2)
    matmul = torch.compile(lambda x, w: x @ w[:16].t(), backend="aot_eager", fullgraph=True)
    assert torch.equal(matmul(x, w), x @ w.dequantize()[:16].t())
