"""Figure 4: compile time and graph counts of the 8-layer MLP, ours vs torch.nn.Linear.

For each configuration (``torch.nn.Linear`` bf16, our ``Linear`` bf16, our ``Linear``
under FP8 current scaling) and each round: ``torch._dynamo.reset()``, a fresh model,
``torch.compile(fullgraph=True)``, and the wall time of the first training step
(forward + backward: dynamo, AOT autograd and Inductor for both graphs). Inductor's and
AOT autograd's on-disk caches are disabled so every round compiles cold. Then 10 more
steps at the same shape (recompiles must stay 0), and separately 5 batch sizes with the
batch dimension marked dynamic (exactly one graph wanted).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import torch
from torch._dynamo.utils import counters

from .common import progress, ratio_stats, stats
from .models import SHAPES, make_input, make_model, train_step

CONFIGS = (("torch", "bf16"), ("ours", "bf16"), ("ours", "fp8"))
DYNAMIC_BATCHES = (32, 48, 64, 96, 128)


@contextlib.contextmanager
def _cold_caches() -> Iterator[None]:
    """Every compile from scratch while the figure runs (and only then)."""
    with (
        torch._inductor.config.patch(force_disable_caches=True, fx_graph_cache=False),
        torch._functorch.config.patch(enable_autograd_cache=False),
    ):
        yield


def _graphs() -> int:
    return int(counters["stats"]["unique_graphs"])


def _breaks() -> int:
    return int(sum(counters["graph_break"].values()))


def compile_once(kind: str, recipe: str, rows: int, hidden: int, steps: int) -> dict[str, Any]:
    torch._dynamo.reset()
    counters.clear()
    model = make_model(kind, hidden)
    compiled = torch.compile(model, fullgraph=True)
    x = make_input(rows, hidden)
    start = time.perf_counter()
    train_step(compiled, x, recipe)
    first = time.perf_counter() - start
    graphs_first = _graphs()
    for _ in range(steps):
        train_step(compiled, x, recipe)
    return {
        "first_step_s": first,
        "graphs_after_first": graphs_first,
        "graphs_after_steps": _graphs(),
        "recompiles": _graphs() - graphs_first,
        "graph_breaks": _breaks(),
        "model": model,
        "compiled": compiled,
    }


def dynamic_batches(kind: str, recipe: str, hidden: int) -> dict[str, Any]:
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(make_model(kind, hidden), fullgraph=True)
    start = time.perf_counter()
    for rows in DYNAMIC_BATCHES:
        x = make_input(rows, hidden)
        torch._dynamo.mark_dynamic(x, 0)
        train_step(compiled, x, recipe)
    return {
        "graphs": _graphs(),
        "graph_breaks": _breaks(),
        "seconds": time.perf_counter() - start,
    }


def _warm_up(hidden: int) -> None:
    """One throwaway compile: the process-wide first-use costs (Inductor imports, the
    C++ toolchain probe) then hit no contender."""
    progress("  warm-up compile (not measured)")
    torch._dynamo.reset()
    model = torch.compile(make_model("torch", hidden), fullgraph=True)
    train_step(model, make_input(4, hidden), "bf16")
    torch._dynamo.reset()


def run(
    rounds: int = 3,
    shape: str = "small",
    steps: int = 10,
    dynamic: bool = True,
    configs: tuple[tuple[str, str], ...] = CONFIGS,
) -> tuple[dict[str, Any], dict[tuple[str, str], Any]]:
    """Results, and the last round's (eager model, compiled model) per config for reuse."""
    with _cold_caches():
        return _run(rounds, shape, steps, dynamic, configs)


def _run(
    rounds: int,
    shape: str,
    steps: int,
    dynamic: bool,
    configs: tuple[tuple[str, str], ...],
) -> tuple[dict[str, Any], dict[tuple[str, str], Any]]:
    rows, hidden = SHAPES[shape]
    progress(
        f"figure 4: compile time, {len(configs)} configs x {rounds} rounds, "
        f"{rows}x{hidden}, 8 layers"
    )
    first: dict[str, list[float]] = {}
    counts: dict[str, dict[str, int]] = {}
    models: dict[tuple[str, str], Any] = {}
    _warm_up(hidden)
    for r in range(rounds):
        for kind, recipe in configs:
            name = f"{kind}/{recipe}"
            out = compile_once(kind, recipe, rows, hidden, steps)
            first.setdefault(name, []).append(out["first_step_s"])
            counts[name] = {
                k: out[k]
                for k in ("graphs_after_first", "graphs_after_steps", "recompiles", "graph_breaks")
            }
            models[(kind, recipe)] = (out["model"], out["compiled"])
            progress(
                f"  round {r + 1}/{rounds} {name}: first step {out['first_step_s']:.2f} s, "
                f"graphs {out['graphs_after_first']} -> {out['graphs_after_steps']} "
                f"after {steps} steps, breaks {out['graph_breaks']}"
            )
    base = first.get("torch/bf16")
    result: dict[str, Any] = {
        "shape": [rows, hidden],
        "steps": steps,
        "first_step_s": {k: stats(v) for k, v in first.items()},
        "ratio_vs_torch": {
            k: ratio_stats(v, base) for k, v in first.items() if base and k != "torch/bf16"
        },
        "counts": counts,
    }
    if dynamic:
        result["dynamic_batches"] = list(DYNAMIC_BATCHES)
        result["dynamic"] = {}
        for kind, recipe in configs:
            d = dynamic_batches(kind, recipe, hidden)
            result["dynamic"][f"{kind}/{recipe}"] = d
            progress(
                f"  dynamic batch {kind}/{recipe}: {d['graphs']} graph(s) over "
                f"{len(DYNAMIC_BATCHES)} sizes, {d['seconds']:.1f} s"
            )
    return result, models
