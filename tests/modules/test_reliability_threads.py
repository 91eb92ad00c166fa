"""Recipe contexts are per thread, as ``torch.autocast`` is: threads training at once
under different recipes each get their own single-threaded result."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from module_cases import (
    RECIPES,
    graph_breaks,
    make_input,
    make_mlp,
    recipe_context,
    run_in_threads,
    step,
    unique_graphs,
)
from torch._subclasses.fake_tensor import FakeTensorMode

from transformer_engine_ops.modules.autocast import STATE, autocast
from transformer_engine_ops.modules.linear import Linear
from transformer_engine_ops.quantization import Float8CurrentScaling, MXFP8BlockScaling
from transformer_engine_ops.quantization.float8 import Float8Tensor

THREAD_RECIPES = ["bf16", "fp8_current", "mxfp8", "nvfp4", "fp8_block"]


def _assert_same(a, b):
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    for ga, gb in zip(a[2], b[2], strict=True):
        assert torch.equal(ga, gb)


def test_threads_under_different_recipes_each_match_their_single_threaded_result():
    x = make_input()
    alone = {name: step(make_mlp(), x, name) for name in THREAD_RECIPES}

    # Models are built here: the global RNG their init draws from is shared by threads.
    names = [f"{name}#{i}" for name in THREAD_RECIPES for i in range(2)]
    models = {n: make_mlp() for n in names}

    def train(n):
        return [step(models[n], x, n.split("#")[0]) for _ in range(3)]

    together = run_in_threads(train, names)
    for n, runs in together.items():
        for got in runs:
            _assert_same(got, alone[n.split("#")[0]])


def test_a_context_entered_on_another_thread_is_invisible_here():
    entered, release = threading.Event(), threading.Event()
    seen = {}

    def other():
        with autocast(recipe=RECIPES["nvfp4"]()):
            seen["other"] = STATE.autocast.recipe
            entered.set()
            release.wait()

    t = threading.Thread(target=other, daemon=True)
    try:
        with autocast(recipe=MXFP8BlockScaling()):
            t.start()
            entered.wait()
            assert isinstance(STATE.autocast.recipe, MXFP8BlockScaling)
        # This thread exits first; the other thread's exit must not restore into ours.
        assert STATE.autocast is None
    finally:
        release.set()
        t.join()
    assert STATE.autocast is None
    assert type(seen["other"]).__name__ == "NVFP4BlockScaling"


@pytest.mark.threads
def test_one_compiled_model_called_from_threads_uses_each_threads_recipe():
    x = make_input()
    model = make_mlp()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    for name in ["fp8_current", "bf16", "fp8_block"]:
        want = step(model, x, name)
        # Compiled on this thread first: on torch 2.11 a compile on a thread that then
        # exits breaks later compiles (docs/design.md); the thread reuses this graph.
        step(compiled, x, name)
        got = run_in_threads(lambda n: step(compiled, x, n), [name])[name]
        _assert_same(got, want)
    assert graph_breaks() == 0


# --- what a trace reads comes from the call itself ------------------------------------
# A compiled call rebuilds its outputs, and its autograd node its saved values, from the
# result layout of that very call. With a process-wide "layout the op's kernel wrote
# last", another thread's kernel finishing between a traced call's fake kernel and the
# rebuild replaced the layout: a raw uint8 buffer instead of a Float8Tensor, and an
# unquantized backward baked into the graph. These tests put that other thread's call
# exactly there, after every fake run of the op on this thread.


@contextlib.contextmanager
def _another_thread_calls_linear_after_each_fake_run(
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[list[int]]:
    torch.manual_seed(3)
    other = Linear(64, 32, params_dtype=torch.bfloat16)
    x = torch.randn(16, 64).to(torch.bfloat16)
    compiled = torch.compile(other, fullgraph=True, backend="aot_eager")
    # Compiled alone, here, with the default grad mode and no recipe, as each new
    # thread starts: the interleaved calls hit this graph and never compile (Dynamo
    # compiles one frame at a time, and on torch 2.11 a compile on a thread that then
    # exits breaks later compiles: docs/design.md).
    assert torch.is_grad_enabled() and STATE.autocast is None
    compiled(x)
    calls = [0]
    here = threading.get_ident()
    dispatch = FakeTensorMode.dispatch

    def dispatch_then_interleave(mode: Any, func: Any, *args: Any, **kwargs: Any) -> Any:
        out = dispatch(mode, func, *args, **kwargs)
        if threading.get_ident() == here and func.name().startswith("teops::linear_fwd"):
            thread = threading.Thread(target=compiled, args=(x,))
            thread.start()
            thread.join()
            calls[0] += 1
        return out

    with monkeypatch.context() as patch:
        patch.setattr(FakeTensorMode, "dispatch", dispatch_then_interleave)
        yield calls
    assert calls[0] > 0


def _fp8_linear(seed: int) -> Linear:
    torch.manual_seed(seed)
    return Linear(64, 32, params_dtype=torch.bfloat16)


def _linear_input() -> torch.Tensor:
    return torch.randn(16, 64, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)


def _inner(value: Any) -> list[torch.Tensor]:
    names, _ = value.__tensor_flatten__()
    return [getattr(value, n) for n in names]


@pytest.mark.threads
def test_fp8_output_compiled_beside_another_thread_is_a_float8_tensor_equal_to_eager(
    monkeypatch,
):
    x = _linear_input()
    lin = _fp8_linear(0)
    with torch.no_grad(), autocast(recipe=Float8CurrentScaling()):
        want = lin(x, fp8_output=True)
    compiled = torch.compile(lin, fullgraph=True, backend="aot_eager")
    with (
        _another_thread_calls_linear_after_each_fake_run(monkeypatch),
        torch.no_grad(),
        autocast(recipe=Float8CurrentScaling()),
    ):
        got = compiled(x, fp8_output=True)
    assert type(got) is type(want) is Float8Tensor
    for a, b in zip(_inner(got), _inner(want), strict=True):
        assert torch.equal(a, b)


def _fp8_training_step(model: Any, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    x = x.clone().requires_grad_(True)
    model.zero_grad(set_to_none=True)
    with autocast(recipe=Float8CurrentScaling()):
        y = model(x)
    y.float().square().sum().backward()
    return y.detach(), x.grad, *(p.grad for p in model.parameters())


@pytest.mark.threads
def test_fp8_training_compiled_beside_another_thread_keeps_its_quantized_backward(
    monkeypatch,
):
    x = _linear_input()
    lin = _fp8_linear(0)
    want = _fp8_training_step(lin, x)
    compiled = torch.compile(lin, fullgraph=True, backend="aot_eager")
    with _another_thread_calls_linear_after_each_fake_run(monkeypatch):
        first = _fp8_training_step(compiled, x)
    later = _fp8_training_step(compiled, x)  # the same graph, no other thread
    for got in (first, later):
        for a, b in zip(got, want, strict=True):
            assert torch.equal(a, b)


# --- stress: many threads, every recipe, eager and compiled, at once ---------------------


def _stress_configs() -> list[tuple[str, str, bool, bool]]:
    """(recipe, mode, grad, fp8_output): training eager and compiled under every recipe,
    inference compiled, and a quantized output (inference, compiled) under each recipe
    that quantizes. DelayedScaling is eager-only and keeps per-module history: not here."""
    configs = []
    for recipe in THREAD_RECIPES:
        configs += [(recipe, "eager", True, False), (recipe, "compiled", True, False)]
        configs += [(recipe, "compiled", False, False)]
        if recipe != "bf16":
            configs += [(recipe, "compiled", False, True)]
    return configs


def _flat_result(value: Any) -> list[torch.Tensor]:
    """A result as plain tensors (a quantized output as its inner buffers, its type first)."""
    if isinstance(value, torch.Tensor) and type(value) is not torch.Tensor:
        return [torch.tensor(hash(type(value).__name__) % 997), *_inner(value)]
    return [value]


def _stress_call(model: Any, x: torch.Tensor, recipe: str, grad: bool, fp8_output: bool) -> list:
    if grad:
        out, dx, grads = step(model, x, recipe)
        return [out, dx, *grads]
    with torch.no_grad(), recipe_context(recipe):
        return _flat_result(model(x, fp8_output=fp8_output) if fp8_output else model(x))


@pytest.mark.slow
@pytest.mark.threads
def test_threads_over_every_recipe_eager_and_compiled_each_get_their_single_threaded_bits():
    configs = _stress_configs()
    assert len(configs) >= 8
    x = make_input()
    models = {}
    for i, (_, mode, _, _) in enumerate(configs):
        model = make_mlp()
        if mode == "compiled":
            model = torch.compile(model, fullgraph=True, backend="aot_eager")
        models[i] = model

    def call(i: int) -> list:
        recipe, _, grad, fp8_output = configs[i]
        # One compiled model per configuration, each a graph of the same code objects
        # (Dynamo's settings are per thread).
        with torch._dynamo.config.patch(recompile_limit=64):
            return _stress_call(models[i], x, recipe, grad, fp8_output)

    # Each configuration compiled and run alone first, here (torch.compile does not
    # promise concurrent compiles, and on torch 2.11 a compile on a thread that then
    # exits breaks later compiles: docs/design.md), with the default grad mode and no
    # recipe, as each new thread starts: the bits every thread must get, from graphs the
    # threads reuse.
    assert torch.is_grad_enabled() and STATE.autocast is None
    alone = {i: call(i) for i in models}
    graphs = unique_graphs()
    names = [f"{i}" for i in models]
    for _ in range(3):
        together = run_in_threads(lambda n: call(int(n)), names)
        for n, got in together.items():
            want = alone[int(n)]
            assert len(got) == len(want), configs[int(n)]
            for a, b in zip(got, want, strict=True):
                assert torch.equal(a, b), configs[int(n)]
    assert graph_breaks() == 0
    assert unique_graphs() == graphs
