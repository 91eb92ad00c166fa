"""The op's call paths: eager calls skip the fake and the re-dispatch, traced ones do not.

An eager call of ``teops::linear_fwd`` with real tensors runs the impls directly (its
autograd node keeps the backward bundle; no spec function, no flatten of the backward
bundle); under fake tensors the op re-dispatches to its fake kernel, and the autograd
node splits the result by the layout that fake kernel described for the call.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from linear_cases import make_fwd_args
from torch._subclasses.fake_tensor import FakeTensorMode

from tests.bundles import fields_by_name
from transformer_engine_ops.generated import linear as g
from transformer_engine_ops.runtime import custom_ops
from transformer_engine_ops.runtime.keep import Keep


def _counting(monkeypatch: pytest.MonkeyPatch, name: str) -> list[int]:
    calls = [0]
    fn = getattr(g, name)

    def counted(*args: Any) -> Any:
        calls[0] += 1
        return fn(*args)

    monkeypatch.setattr(g, name, counted)
    return calls


@pytest.mark.parametrize("recipe", ["bf16", "fp8_current"])
def test_eager_op_autograd_runs_no_spec_and_no_backward_flatten(monkeypatch, recipe):
    spec = _counting(monkeypatch, "linear_forward_spec")
    flatten_bwd = _counting(monkeypatch, "flatten_linear_bwd_args")
    ref = make_fwd_args(recipe)
    (out_ref,), _ = g.linear_eager(ref)
    out_ref.sum().backward()
    args = make_fwd_args(recipe)
    (out,), _ = g.linear_compiled(g.flatten_linear_fwd_args(args))
    out.sum().backward()
    assert spec[0] == 0 and flatten_bwd[0] == 0
    assert torch.equal(out, out_ref)
    for field in ("inp", "weight", "bias"):
        assert torch.equal(getattr(args, field).grad, getattr(ref, field).grad), field


def test_no_grad_op_call_runs_the_kernel_once(monkeypatch):
    kernel = _counting(monkeypatch, "linear_forward")
    args = make_fwd_args("bf16", requires_grad=False)
    with torch.no_grad():
        flat = g.linear_fwd(*g.flatten_linear_fwd_args(args))
    assert kernel[0] == 1
    assert torch.equal(flat[0], g.linear_eager(args)[0][0])


@pytest.mark.parametrize("recipe", ["bf16", "fp8_current"])
def test_fake_op_autograd_splits_by_the_fake_kernels_layout(recipe):
    """Under fake tensors with grads, the op goes through its fake kernel; the saved
    values (a quantized input under FP8) are rebuilt from the recorded layout."""
    args = make_fwd_args(recipe)
    slots = g.flatten_linear_fwd_args(args)
    mode = FakeTensorMode()

    def fake(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            return mode.from_tensor(v)
        return [fake(t) for t in v] if isinstance(v, list) else v

    fake_slots = [fake(v) for v in slots]
    custom_ops.begin_call(g.FORWARD_OP)
    with mode:
        flat = g.linear_fwd(*fake_slots)
        out = flat[0]
        assert out.requires_grad and out.shape == (*args.inp.shape[:-1], args.weight.shape[0])
        out.sum().backward()
    outs, saved = custom_ops.result_layouts(g.FORWARD_OP)
    assert outs == (("tensor",),)
    assert [s[0] for s in saved] == (["storage", "storage"] if recipe != "bf16" else ["none"] * 2)
    assert fake_slots[3].grad is not None and fake_slots[3].grad.shape == args.inp.shape


# --- keeping saved values across calls (``Keep``: TE's weight workspace) -------------


def _buffers(value: Any) -> list[torch.Tensor]:
    return list(value._inner_dict().values())


def test_compiled_keeping_hands_out_the_saved_weight_detached_as_eager_saves_it():
    ref = make_fwd_args("fp8_current", cache_weight=True)
    (out_ref,), saved_ref = g.linear_eager(ref)
    args = make_fwd_args("fp8_current", cache_weight=True)
    (out,), (weight,) = g.linear_compiled(g.flatten_linear_fwd_args(args), (1,))
    assert torch.equal(out, out_ref)
    assert type(weight) is type(saved_ref[1]) and not weight.requires_grad
    assert all(not t.requires_grad for t in _buffers(weight))
    for a, b in zip(_buffers(weight), _buffers(saved_ref[1]), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize(
    ("kept", "error", "text"),
    [
        ((0,), TypeError, "saved value 0 is a bare quantized storage"),
        ((2,), IndexError, r"no saved value 2 to keep \(this call saved 2\)"),
    ],
)
def test_compiled_keeping_refuses_what_a_call_cannot_keep(kept, error, text):
    args = make_fwd_args("fp8_current", cache_weight=True)
    with pytest.raises(error, match=text):
        g.linear_compiled(g.flatten_linear_fwd_args(args), kept)


@pytest.mark.slow  # one compile
def test_call_with_keep_hands_the_same_values_to_into_eager_and_compiled():
    torch._dynamo.reset()
    kept: dict[str, tuple[Any, ...]] = {}

    def call(args: Any, where: str) -> torch.Tensor:
        def into(values: tuple[Any, ...]) -> None:
            kept[where] = values

        return g.call_linear(**fields_by_name(args), keep=Keep((1,), into))[0]

    out_ref = call(make_fwd_args("fp8_current", cache_weight=True), "eager")
    compiled = torch.compile(call, fullgraph=True, backend="aot_eager")
    out = compiled(make_fwd_args("fp8_current", cache_weight=True), "compiled")
    assert torch.equal(out, out_ref)
    (got,), (want,) = kept["compiled"], kept["eager"]
    assert type(got) is type(want)
    for a, b in zip(_buffers(got), _buffers(want), strict=True):
        assert torch.equal(a, b)
