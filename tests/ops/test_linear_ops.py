"""The generated Linear ops: opcheck, fake-vs-real output layout, and field checks."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
from linear_cases import CONFIGS, make_bwd_args, make_fwd_args
from torch._subclasses.fake_tensor import FakeTensorMode

from transformer_engine_ops.generated import linear as g
from transformer_engine_ops.runtime import boundary as _b
from transformer_engine_ops.runtime.custom_ops import is_none_sentinel


def _params() -> list[Any]:
    return [pytest.param(kwargs, id=name) for name, kwargs in CONFIGS]


# --- opcheck ----------------------------------------------------------------------


@pytest.mark.parametrize("kwargs", _params())
def test_opcheck_forward(kwargs):
    args = make_fwd_args(**kwargs)
    torch.library.opcheck(g.linear_fwd, g.flatten_linear_fwd_args(args))


@pytest.mark.parametrize("kwargs", _params())
def test_opcheck_backward(kwargs):
    fwd = make_fwd_args(**kwargs)
    bwd = make_bwd_args(fwd)
    torch.library.opcheck(g.linear_bwd, g.flatten_linear_bwd_args(bwd))


# --- fake layout == real layout ------------------------------------------------------


def _strides(t: torch.Tensor) -> tuple[int | None, ...]:
    # A stride of a size-1 dimension never matters (opcheck ignores it too).
    return tuple(st if n > 1 else None for n, st in zip(t.shape, t.stride(), strict=False))


def _layout(flat: list[torch.Tensor]) -> list[tuple[Any, ...]]:
    """Count (list length), shape, meaningful strides, dtype and absence of each slot."""
    return [(tuple(t.shape), _strides(t), t.dtype, is_none_sentinel(t)) for t in flat]


def _fake_slots(mode: FakeTensorMode, slots: tuple[Any, ...]) -> list[Any]:
    def fake(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            return mode.from_tensor(v)
        if isinstance(v, list):
            return [fake(t) for t in v]
        return v

    return [fake(v) for v in slots]


def _real_and_fake(op: Any, slots: tuple[Any, ...]) -> tuple[list, list]:
    with torch.no_grad():
        real = op(*slots)
    mode = FakeTensorMode()
    fake_slots = _fake_slots(mode, slots)
    with mode, torch.no_grad():
        fake = op(*fake_slots)
    assert all(isinstance(t, torch._subclasses.fake_tensor.FakeTensor) for t in fake)
    return real, fake


FAKE_CONFIGS = _params() + [
    pytest.param(dict(recipe=r, fp8_output=True, grad_enabled=False), id=f"{r}-fp8_output")
    for r in ("fp8_current", "mxfp8", "nvfp4", "fp8_block")
]


@pytest.mark.parametrize("kwargs", FAKE_CONFIGS)
def test_fake_forward_layout_matches_real(kwargs):
    args = make_fwd_args(**kwargs)
    real, fake = _real_and_fake(g.linear_fwd, g.flatten_linear_fwd_args(args))
    assert len(real) == len(fake) > 0
    assert _layout(fake) == _layout(real)


@pytest.mark.parametrize("kwargs", _params())
def test_fake_backward_layout_matches_real(kwargs):
    bwd = make_bwd_args(make_fwd_args(**kwargs))
    real, fake = _real_and_fake(g.linear_bwd, g.flatten_linear_bwd_args(bwd))
    assert len(real) == len(fake) == 3  # dgrad, wgrad, bgrad
    assert _layout(fake) == _layout(real)
    rg = kwargs.get("requires_grad", True)
    expect_dgrad = rg
    assert is_none_sentinel(real[0]) != expect_dgrad


def test_frozen_weight_still_gets_bias_grad():
    """TE once dropped the bias grad when the weight was frozen: both kernels keep it."""
    fwd = make_fwd_args("fp8_current")
    fwd.weight_requires_grad = False
    fwd.weight.requires_grad_(False)
    real, fake = _real_and_fake(g.linear_bwd, g.flatten_linear_bwd_args(make_bwd_args(fwd)))
    assert [is_none_sentinel(t) for t in real] == [False, True, False]
    assert _layout(fake) == _layout(real)


# --- the op against the implementation ------------------------------------------------


@pytest.mark.parametrize("recipe", ["bf16", "fp8_current", "mxfp8", "nvfp4", "fp8_block"])
def test_op_autograd_matches_direct_implementation(recipe):
    """teops::linear_fwd's output and grads equal the generated eager path's."""
    ref = make_fwd_args(recipe)
    (out_ref,), _ = g.linear_eager(ref)
    out_ref.sum().backward()
    op_args = make_fwd_args(recipe)
    (out,), _ = g.linear_compiled(g.flatten_linear_fwd_args(op_args))
    out.sum().backward()
    assert torch.equal(out, out_ref)
    for field in ("inp", "weight", "bias"):
        assert torch.equal(getattr(op_args, field).grad, getattr(ref, field).grad), field


def test_quantized_wrapper_weight_enters_through_dispatch():
    """A QuantizedTensor weight is rewritten to its inner buffers by the dispatch rule."""
    wrapper = make_fwd_args("fp8_current", weight_form="wrapper", requires_grad=False)
    storage = make_fwd_args("fp8_current", weight_form="storage", requires_grad=False)
    slots = g.flatten_linear_fwd_args(wrapper)
    assert _b.decode_meta(slots[2]).tag == "tensor"  # the subclass rides in the Tensor? slot
    out_w = g.linear_fwd(*slots)[0]
    out_s = g.linear_fwd(*g.flatten_linear_fwd_args(storage))[0]
    assert torch.equal(out_w, out_s)


# --- bad values at run time -----------------------------------------------------------


BAD_FIELDS = [
    ("inp", 3, TypeError, "LinearFwdArgs.inp: expected Tensor, got int"),
    ("weight", 3, TypeError, "LinearFwdArgs.weight: expected Tensor or a quantized storage"),
    ("tp_group", 3, TypeError, "LinearFwdArgs.tp_group: expected ProcessGroup, got int"),
    ("wgrad_store", object(), TypeError, "LinearFwdArgs.wgrad_store: this field cannot cross"),
    ("parallel_mode", "diagonal", ValueError, "LinearFwdArgs.parallel_mode: expected one of"),
    ("tp_size", 1.0, TypeError, "LinearFwdArgs.tp_size: expected int or SymInt, got float"),
    ("input_quantizer", "fp8", TypeError, "LinearFwdArgs.input_quantizer: expected Quantizer"),
    ("activation_dtype", "bf16", TypeError, "LinearFwdArgs.activation_dtype: expected dtype"),
    # Fields whose flatten tests the exact type inline before the full check.
    ("fp8_output", 1, TypeError, "LinearFwdArgs.fp8_output: expected bool, got int"),
    ("is_first_microbatch", "no", TypeError, "LinearFwdArgs.is_first_microbatch: expected bool"),
    ("bias", 3, TypeError, "LinearFwdArgs.bias: expected Tensor or None, got int"),
]


@pytest.mark.parametrize(
    ("field", "value", "exc", "message"), BAD_FIELDS, ids=[b[0] for b in BAD_FIELDS]
)
def test_flatten_rejects_a_wrong_kind_value(field, value, exc, message):
    args = dataclasses.replace(make_fwd_args("fp8_current"), **{field: value})
    with pytest.raises(exc) as info:
        g.flatten_linear_fwd_args(args)
    assert message in str(info.value)
    assert "got" in str(info.value)


def test_flatten_fast_path_falls_back_to_the_full_check_for_subclasses():
    """The inline exact-type test only short-cuts; what the full check accepts (a
    Parameter for a Tensor, a bool for an int, a SymInt-compatible int) still passes,
    unchanged."""
    args = make_fwd_args("bf16")
    param = torch.nn.Parameter(args.inp.detach().clone())
    args = dataclasses.replace(args, inp=param, tp_size=True)
    slots = g.flatten_linear_fwd_args(args)
    names = [row.slot for row in g.FORWARD_SLOTS]
    assert slots[names.index("inp")] is param
    assert slots[names.index("tp_size")] is True


def test_compiled_call_names_a_bad_field():
    """Under torch.compile the flatten's checks still name the field (Dynamo traces
    the inline test and the fallback check that raises; with ``fullgraph=True`` Dynamo
    reports the raised TypeError inside its own error, message included)."""
    args = dataclasses.replace(make_fwd_args("bf16"), fp8_output=1)

    @torch.compile(backend="eager", fullgraph=True)
    def call(a):
        return g.linear_compiled(g.flatten_linear_fwd_args(a))

    torch._dynamo.reset()
    with pytest.raises((TypeError, torch._dynamo.exc.TorchDynamoException)) as info:
        call(args)
    assert "LinearFwdArgs.fp8_output: expected bool, got int" in str(info.value)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("tp_group", 3, "LinearBwdArgs.tp_group: expected ProcessGroup, got int"),
        ("main_grad_func", lambda: None, "LinearBwdArgs.main_grad_func: this field cannot"),
        ("inp_shape", 3, "LinearBwdArgs.inp_shape: expected torch.Size or a tuple of ints"),
        ("grad_outputs", [3], "LinearBwdArgs.grad_outputs: expected a list of Tensors"),
    ],
)
def test_flatten_backward_rejects_a_wrong_kind_value(field, value, message):
    bwd = make_bwd_args(make_fwd_args("bf16"))
    setattr(bwd, field, value)
    with pytest.raises(TypeError, match="got") as info:
        g.flatten_linear_bwd_args(bwd)
    assert message in str(info.value)


def test_unsupported_userbuffers_flag_is_refused_by_the_kernel():
    args = make_fwd_args("bf16")
    args.ub_overlap_ag_fprop = True
    with pytest.raises(ValueError, match="LinearFwdArgs.ub_overlap_ag_fprop"):
        g.linear_fwd(*g.flatten_linear_fwd_args(args))


def test_flatten_unflatten_round_trip_keeps_every_field():
    args = make_fwd_args("mxfp8", weight_form="storage")
    back = g.unflatten_linear_fwd_args(*g.flatten_linear_fwd_args(args))
    for f in dataclasses.fields(args):
        a, b = getattr(args, f.name), getattr(back, f.name)
        if f.name == "weight":
            assert type(a) is type(b)
            assert all(
                torch.equal(x, y)
                for x, y in zip(a.inner_tensors(), b.inner_tensors(), strict=False)
            )
        else:
            assert a is b or a == b, f.name
