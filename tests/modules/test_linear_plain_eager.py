"""``Linear``'s plain eager call (the op's declared ``plain_call``, ``linear_plain_call``
through ``_PlainLinear``, or torch's own ``linear`` for contiguous 16-bit CUDA tensors:
no recipe, one rank, plain 2-D tensors of one dtype) computes
what the op path computes, bit for bit, and keeps the same tensors for backward; any
other call takes the op path. ``call_linear`` tries it first."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
import torch

import transformer_engine_ops as te
from transformer_engine_ops.generated import linear as generated_linear
from transformer_engine_ops.ops import linear as linear_module

CUDA = [pytest.param("cuda", marks=[pytest.mark.gpu])] if torch.cuda.is_available() else []


def run(module: Any, x: torch.Tensor, *, create_graph: bool = False) -> tuple[list[Any], list[int]]:
    """Output, every gradient, and the bytes of each tensor kept for backward."""
    for p in module.parameters():
        p.grad = None
    kept: list[int] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        kept.append(t.numel() * t.element_size())
        return t

    x = x.detach().clone().requires_grad_(x.requires_grad)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = module(x)
    y = out[0] if isinstance(out, tuple) else out
    grads: list[Any] = []
    if y.requires_grad:
        leaves = [t for t in (x, *module.parameters()) if t.requires_grad]
        loss = y.float().square().sum()
        grads = list(
            torch.autograd.grad(loss, leaves, create_graph=create_graph, allow_unused=True)
        )
        if create_graph:  # second order, through the backward's own torch ops
            total = sum(g.float().sum() for g in grads if g is not None)
            grads += list(torch.autograd.grad(total, leaves, allow_unused=True))
    extra = [out[1]] if isinstance(out, tuple) else []
    return [y.detach(), *extra, *grads], kept


def both(module: Any, x: torch.Tensor, monkeypatch: pytest.MonkeyPatch, **kw: Any) -> list[int]:
    calls: list[int] = []
    real = generated_linear.linear_plain_call

    def counted(*fields: Any) -> Any:
        out = real(*fields)
        calls.extend([1] if out is not None else [])
        return out

    with monkeypatch.context() as m:
        m.setattr(generated_linear, "linear_plain_call", counted)
        fast, fast_kept = run(module, x, **kw)
    with monkeypatch.context() as m:
        m.setattr(generated_linear, "linear_plain_call", lambda *fields: None)
        slow, slow_kept = run(module, x, **kw)
    assert len(fast) == len(slow)
    for i, (a, b) in enumerate(zip(fast, slow, strict=True)):
        assert (a is None and b is None) or torch.equal(a, b), f"entry {i}"
    # The same tensors kept (torch's own autograd for linear saves them in another order).
    assert sorted(fast_kept) == sorted(slow_kept)
    return calls


@pytest.mark.parametrize("device", ["cpu", *CUDA])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize(
    "case",
    [
        "default",
        "no-bias",
        "frozen-weight",
        "frozen-bias",
        "input-no-grad",
        "return-bias",
        "transposed-input",
    ],
)
def test_the_plain_call_is_the_op_paths_bits(case, dtype, device, monkeypatch):
    torch.manual_seed(0)
    module = te.Linear(
        48,
        24,
        bias=case != "no-bias",
        return_bias=case == "return-bias",
        params_dtype=dtype,
        device=device,
    )
    if case == "frozen-weight":
        module.weight.requires_grad_(False)
    if case == "frozen-bias":
        module.bias.requires_grad_(False)
    x = torch.randn(33, 48, device=device).to(dtype)
    if case == "transposed-input":  # column-major: _PlainLinear, never torch's linear
        x = torch.randn(48, 33, device=device).to(dtype).t()
    x.requires_grad_(case != "input-no-grad")
    applied: list[int] = []
    real = linear_module._PlainLinear.apply
    monkeypatch.setattr(
        linear_module._PlainLinear, "apply", lambda *a: applied.append(1) or real(*a)
    )
    calls = both(module, x, monkeypatch)
    assert calls, "the plain path ran"
    # 16-bit contiguous CUDA tensors take torch's own autograd for linear; the rest
    # _PlainLinear.
    native = device == "cuda" and dtype == torch.bfloat16 and case != "transposed-input"
    assert bool(applied) is not native, applied


@pytest.mark.parametrize("rows", [0, 1, 7])
def test_batch_0_and_1_and_no_grad(rows, monkeypatch):
    module = te.Linear(16, 8)
    x = torch.randn(rows, 16, requires_grad=True)
    both(module, x, monkeypatch)
    with torch.no_grad():
        fast = module(x)
    with monkeypatch.context() as m:
        m.setattr(generated_linear, "linear_plain_call", lambda *fields: None)
        with torch.no_grad():
            slow = module(x)
    assert torch.equal(fast, slow) and not fast.requires_grad


def test_double_backward_matches_the_op_path(monkeypatch):
    module = te.Linear(16, 8, params_dtype=torch.float64)
    x = torch.randn(5, 16, dtype=torch.float64, requires_grad=True)
    both(module, x, monkeypatch, create_graph=True)


@pytest.mark.parametrize(
    "why",
    ["3-D input", "other dtype", "wrong features", "recipe", "microbatch"],
)
def test_every_other_call_takes_the_op_path(why, monkeypatch):
    """The op path serves (and reports) everything else: the same errors as before."""
    from module_cases import RECIPES

    module = te.Linear(16, 8)
    x = {
        "3-D input": torch.randn(2, 3, 16),
        "other dtype": torch.randn(4, 16, dtype=torch.float64),
        "wrong features": torch.randn(4, 15),
    }.get(why, torch.randn(4, 16))
    taken: list[int] = []
    real = linear_module._PlainLinear.apply
    monkeypatch.setattr(linear_module._PlainLinear, "apply", lambda *a: taken.append(1) or real(*a))
    if why == "wrong features":
        with pytest.raises(ValueError, match="expects 16 input features"):
            module(x)
    elif why == "recipe":
        with te.autocast(recipe=RECIPES["fp8_current"]()):
            module(x)
    elif why == "microbatch":
        module(x, is_first_microbatch=True)
    else:
        module(x)
    assert taken == []


@pytest.mark.parametrize("recipe", [None, "fp8_current"])
def test_a_bias_of_the_wrong_shape_is_an_error_not_a_broadcast(recipe):
    """A bias that is not one value per output feature is reported by the op path (the
    plain call declines it); ``addmm`` would broadcast a bias of shape (1,) silently."""
    from module_cases import RECIPES

    module = te.Linear(16, 8)
    module.bias = torch.nn.Parameter(torch.zeros(1))
    x = torch.randn(4, 16)
    with (
        te.autocast(recipe=RECIPES[recipe]()) if recipe else contextlib.nullcontext(),
        pytest.raises(ValueError, match=r"bias has shape \(1,\).*8 output features"),
    ):
        module(x)


def _own_frames(fn: Any) -> list[str]:
    """The functions of this package that ``fn()`` runs, in call order."""
    import sys

    frames: list[str] = []

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and "transformer_engine_ops" in frame.f_code.co_filename:
            frames.append(frame.f_code.co_qualname)

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return frames


def test_the_plain_call_runs_few_python_functions():
    """Host overhead, counted instead of timed (a timing test would be flaky on a shared
    machine): the Python functions of this package a plain forward and backward run.
    Each costs ~0.1-0.5 us on the host, which the GPU waits for at small shapes (issue
    24: eager within 1.3x ``torch.nn.Linear``). The counts were 24 and 14 before the
    module skipped the recipe lookups without a recipe and the plain call skipped
    ``gemm``'s checks; a new call on this path needs a reason. (15: ``autocast_enabled``
    holds the autocast device types as a literal, which a compiled call does not guard
    on every call as it did the module global the wrapper read before.)"""
    module = te.Linear(16, 8)
    x = torch.randn(4, 16, requires_grad=True)
    module(x).sum().backward()  # warm
    forward = _own_frames(lambda: module(x))
    y = module(x)
    dy = torch.ones_like(y)
    backward = _own_frames(lambda: y.backward(dy))
    assert "linear_plain_call" in forward and "_PlainLinear.forward" in forward
    assert len(forward) <= 15, forward
    assert len(backward) <= 12, backward
