"""Figure 11: what entering a compiled frame costs, ours against torch.nn.Linear.

Each call of a ``torch.compile``'d model first checks every guard of its frame, then
runs the graph. At a small, host-bound step (the H200's ``reduce-overhead`` figure)
that check is a visible part of the step, and it is where our ``Linear`` differs from
``torch.nn.Linear``: with every guard filtered out the two steps take the same time
(docs/benchmarks.md, figure 6's analysis). This figure times the entry alone: a model of ``layers`` layers compiled
with a backend that runs the graph once and then hands back the same outputs, so each
later call is Dynamo's frame entry and guard check plus a Python call. Ours and
``torch.nn.Linear`` are timed in turn, in blocks of ``calls`` calls, and the figure is
the median of the per-round differences (ours - theirs) and the guard entries of each
frame (as ``guard_filter_fn`` sees them). One thread, float32, ``rows x hidden`` input.
Importable without running: :func:`run` is what ``python -m benchmarks --only entry``
calls.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from transformer_engine_ops.modules.linear import Linear

from .common import progress, stats


def _replaying(gm: torch.fx.GraphModule, example_inputs: Any) -> Callable[..., Any]:
    """A backend whose compiled function runs the graph once, then returns its outputs:
    a later call costs the frame's entry and nothing of the graph."""
    outputs = None

    def run(*args: Any) -> Any:
        nonlocal outputs
        if outputs is None:
            outputs = gm(*args)
        return outputs

    return run


_FORWARD = (
    "def forward(self, x):\n    for layer in self.layers:\n        x = layer(x)\n    return x\n"
)


def _compiled(
    name: str, make: Callable[[], torch.nn.Module], layers: int, x: torch.Tensor
) -> tuple[Any, int]:
    """The compiled model and its frame's guard entries. Each contender's ``forward`` is
    its own code object: compiled frames are cached per code object, and a shared one
    (``nn.Sequential.forward``) would check the other contender's guards first."""
    counted: list[int] = []

    def keep_all(entries: Any) -> list[bool]:
        counted.append(len(entries))
        return [True] * len(entries)

    namespace: dict[str, Any] = {}
    exec(compile(_FORWARD, f"<entry: {name}>", "exec"), namespace)
    cls = type(f"Entry_{name}", (torch.nn.Module,), {"forward": namespace["forward"]})
    model = cls()
    model.layers = torch.nn.ModuleList([make() for _ in range(layers)])
    compiled = torch.compile(
        model,
        fullgraph=True,
        backend=_replaying,
        options={"guard_filter_fn": keep_all},
    )
    compiled(x)
    compiled(x)
    return compiled, counted[-1]


def _per_call_us(fn: Callable[[torch.Tensor], Any], x: torch.Tensor, calls: int) -> float:
    started = time.perf_counter()
    for _ in range(calls):
        fn(x)
    return (time.perf_counter() - started) / calls * 1e6


def run(
    layers: tuple[int, ...] = (1, 8),
    rows: int = 64,
    hidden: int = 256,
    rounds: int = 31,
    calls: int = 2000,
) -> dict[str, Any]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        x = torch.randn(rows, hidden, requires_grad=True)
        results: dict[str, Any] = {}
        for n in layers:
            torch._dynamo.reset()
            ours, ours_guards = _compiled("ours", lambda: Linear(hidden, hidden), n, x)
            theirs, their_guards = _compiled("torch", lambda: torch.nn.Linear(hidden, hidden), n, x)
            ours_us, theirs_us = [], []
            for _ in range(rounds):
                ours_us.append(_per_call_us(ours, x, calls))
                theirs_us.append(_per_call_us(theirs, x, calls))
            results[str(n)] = {
                "ours_us": stats(ours_us),
                "torch_us": stats(theirs_us),
                "gap_us": stats([a - b for a, b in zip(ours_us, theirs_us, strict=True)]),
                "guards": {"ours": ours_guards, "torch": their_guards},
            }
            progress(f"entry, {n} layer(s): gap {results[str(n)]['gap_us']['median']:.2f} us")
        return {"rows": rows, "hidden": hidden, "calls": calls, "layers": results}
    finally:
        torch.set_num_threads(threads)
        torch._dynamo.reset()
