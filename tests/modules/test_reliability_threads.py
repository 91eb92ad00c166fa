"""Recipe contexts are per thread, as ``torch.autocast`` is: threads training at once
under different recipes each get their own single-threaded result."""

from __future__ import annotations

import threading

import torch
from module_cases import RECIPES, graph_breaks, make_input, make_mlp, run_in_threads, step

from transformer_engine_ops.modules.autocast import STATE, autocast
from transformer_engine_ops.quantization import MXFP8BlockScaling

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


def test_one_compiled_model_called_from_threads_uses_each_threads_recipe():
    x = make_input()
    model = make_mlp()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    for name in ["fp8_current", "bf16", "fp8_block"]:
        want = step(model, x, name)
        got = run_in_threads(lambda n: step(compiled, x, n), [name])[name]
        _assert_same(got, want)
    assert graph_breaks() == 0
