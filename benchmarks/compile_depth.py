"""Figure 10: compile time versus depth, ours vs ``torch.nn.Linear``, cold caches.

An N-layer MLP (``models.MLP``: square ``hidden``-wide layers, ReLU between them, bf16
parameters) at 8, 32 and 64 layers; our ``Linear`` in bf16 and under FP8 current
scaling, ``torch.nn.Linear`` in bf16. Each measurement runs in a fresh interpreter
(``--child``) whose Inductor, FX-graph, AOTAutograd and Triton caches are off and pointed
at a fresh temporary folder, so nothing a previous compile wrote is read. The child
first compiles a one-layer ``torch.nn.Linear`` model at another shape (not measured: the
process-wide first-use costs, Inductor's imports and the C++ toolchain probe, that every
contender would pay once), resets Dynamo, then times the first training step (forward +
backward: Dynamo, AOTAutograd and Inductor for both graphs) of a fresh model under
``torch.compile(fullgraph=True)``. It reports the wall time, the CPU time (the process
and its C++ compiler runs: on a shared machine the steadier of the two), the sum of each of torch's
timed compile phases (``torch._dynamo.utils.compilation_time_metrics``) and the graph
count. Rounds interleave the contenders, so a drift of the machine hits all of them;
the ratio is the median of the per-round ratios ours / ``torch.nn.Linear`` at one depth.

``python -m benchmarks.compile_depth --child ... --profile FILE`` also writes a cProfile
of the measured step (the profile breakdown in docs/benchmarks.md was read from those).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .common import progress, ratio_stats, stats

DEPTHS = (8, 32, 64)
CONFIGS = (("torch", "bf16"), ("ours", "bf16"), ("ours", "fp8"))
HIDDEN = 128
ROWS = 64
# The goals at 32 and 64 layers: ours / torch.nn.Linear, first compiled step.
GOALS = {"bf16": 1.25, "fp8": 1.5}
GOAL_DEPTHS = (32, 64)
# torch's timed compile phases reported per measurement (seconds, summed over graphs).
PHASES = (
    "_compile.compile_inner",
    "OutputGraph.call_user_compiler",
    "create_aot_dispatcher_function",
    "compile_fx_inner",
    "GraphLowering.run",
    "GraphLowering.compile_to_module",
    "PyCodeCache.load_by_key_path",
)


def cold_cache_env(folder: str) -> dict[str, str]:
    """Environment of a child whose every compile cache is off and, where a cache
    folder is still consulted, empty (a fresh folder per measurement)."""
    return {
        "TORCHINDUCTOR_FORCE_DISABLE_CACHES": "1",
        "TORCHINDUCTOR_FX_GRAPH_CACHE": "0",
        "TORCHINDUCTOR_AUTOGRAD_CACHE": "0",
        "TORCHINDUCTOR_CACHE_DIR": os.path.join(folder, "inductor"),
        "TRITON_CACHE_DIR": os.path.join(folder, "triton"),
        # C++ compiles run as reaped child processes (not a long-lived worker pool), so
        # the CPU time of the measured step counts them (``_cpu_seconds``).
        "TORCHINDUCTOR_COMPILE_THREADS": "1",
    }


def _cpu_seconds() -> float:
    """CPU seconds of this process and its reaped children (the C++ compiler runs): a
    measure of the compile's work that a loaded machine does not stretch as it
    stretches the wall time."""
    import resource

    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _child(args: argparse.Namespace) -> dict[str, Any]:
    """One cold measurement in this (fresh) process."""
    import torch
    from torch._dynamo.utils import compilation_time_metrics, counters

    from .models import make_input, make_model, train_step

    torch.set_num_threads(args.threads)
    warm = torch.compile(make_model("torch", 16, layers=1), fullgraph=True)
    train_step(warm, make_input(4, 16), "bf16")
    torch._dynamo.reset()
    compilation_time_metrics.clear()
    counters.clear()

    model = make_model(args.kind, args.hidden, layers=args.layers)
    compiled = torch.compile(model, fullgraph=True)
    x = make_input(args.rows, args.hidden)
    profiler = None
    if args.profile:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    start, cpu_start = time.perf_counter(), _cpu_seconds()
    train_step(compiled, x, args.recipe)
    seconds, cpu = time.perf_counter() - start, _cpu_seconds() - cpu_start
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(args.profile)
    return {
        "first_step_s": seconds,
        "first_step_cpu_s": cpu,
        "phases_s": {k: sum(compilation_time_metrics.get(k, [])) for k in PHASES},
        "graphs": int(counters["stats"]["unique_graphs"]),
        "graph_breaks": int(sum(counters["graph_break"].values())),
    }


def measure(
    kind: str,
    recipe: str,
    layers: int,
    rows: int = ROWS,
    hidden: int = HIDDEN,
    threads: int = 2,
    profile: str | None = None,
) -> dict[str, Any]:
    """One cold first training step, measured in a fresh interpreter."""
    import subprocess

    from .common import bytecode_env

    argv = [sys.executable, "-m", "benchmarks.compile_depth", "--child"]
    argv += ["--kind", kind, "--recipe", recipe, "--layers", str(layers)]
    argv += ["--rows", str(rows), "--hidden", str(hidden), "--threads", str(threads)]
    if profile:
        argv += ["--profile", profile]
    root = Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory(prefix="teops-cold-compile-") as folder:
        env = {**os.environ, **bytecode_env(), **cold_cache_env(folder)}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=root)
    if proc.returncode != 0:
        raise RuntimeError(
            f"compile_depth child {kind}/{recipe} at {layers} layers failed "
            f"(exit {proc.returncode}):\n{proc.stderr[-4000:]}"
        )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run(
    depths: tuple[int, ...] = DEPTHS,
    rounds: int = 3,
    rows: int = ROWS,
    hidden: int = HIDDEN,
    configs: tuple[tuple[str, str], ...] = CONFIGS,
    threads: int = 2,
    fill_bytecode_cache: bool = True,
) -> dict[str, Any]:
    """Per depth and contender: first-step seconds, torch's phase times and graph
    counts, and the ratio to ``torch.nn.Linear`` (median of per-round ratios).
    ``fill_bytecode_cache``: one dropped run first, so no measured child compiles
    Python's bytecode (the smoke test skips it)."""
    progress(
        f"figure 10: compile time vs depth, {len(configs)} configs x {list(depths)} layers "
        f"x {rounds} rounds, {rows}x{hidden}, a fresh process each"
    )
    if fill_bytecode_cache:
        measure("torch", "bf16", 1, rows, hidden, threads)
    first: dict[str, dict[str, list[float]]] = {str(d): {} for d in depths}
    cpu: dict[str, dict[str, list[float]]] = {str(d): {} for d in depths}
    phases: dict[str, dict[str, dict[str, list[float]]]] = {str(d): {} for d in depths}
    counts: dict[str, dict[str, Any]] = {str(d): {} for d in depths}
    for r in range(rounds):
        for depth in depths:
            for kind, recipe in configs:
                name = f"{kind}/{recipe}"
                out = measure(kind, recipe, depth, rows, hidden, threads)
                first[str(depth)].setdefault(name, []).append(out["first_step_s"])
                cpu[str(depth)].setdefault(name, []).append(out["first_step_cpu_s"])
                per = phases[str(depth)].setdefault(name, {})
                for phase, seconds in out["phases_s"].items():
                    per.setdefault(phase, []).append(seconds)
                counts[str(depth)][name] = {
                    "graphs": out["graphs"],
                    "graph_breaks": out["graph_breaks"],
                }
                progress(
                    f"  round {r + 1}/{rounds} {depth:3d} layers {name}: "
                    f"{out['first_step_s']:.2f} s ({out['first_step_cpu_s']:.2f} s CPU), "
                    f"{out['graphs']} graph(s)"
                )
    result: dict[str, Any] = {
        "rows": rows,
        "hidden": hidden,
        "depths": list(depths),
        "rounds": rounds,
        "first_step_s": {d: {k: stats(v) for k, v in per.items()} for d, per in first.items()},
        "first_step_cpu_s": {d: {k: stats(v) for k, v in per.items()} for d, per in cpu.items()},
        "phases_s": {
            d: {k: {p: stats(v)["median"] for p, v in ph.items()} for k, ph in per.items()}
            for d, per in phases.items()
        },
        "counts": counts,
        "ratio_vs_torch": _ratios(first),
        "cpu_ratio_vs_torch": _ratios(cpu),
    }
    return result


def _ratios(seconds: dict[str, dict[str, list[float]]]) -> dict[str, dict[str, Any]]:
    """Per depth: each of our contenders over ``torch.nn.Linear``, round by round."""
    out: dict[str, dict[str, Any]] = {}
    for d, per in seconds.items():
        base = per.get("torch/bf16")
        if base:
            out[d] = {k: ratio_stats(v, base) for k, v in per.items() if k != "torch/bf16"}
    return out


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.compile_depth", description=__doc__)
    p.add_argument("--child", action="store_true", help="measure once in this process")
    p.add_argument("--kind", choices=("torch", "ours"), default="ours")
    p.add_argument("--recipe", choices=("bf16", "fp8"), default="bf16")
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--rows", type=int, default=ROWS)
    p.add_argument("--hidden", type=int, default=HIDDEN)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--profile", help="write a cProfile of the measured step to this file")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if args.child:
        print(json.dumps(_child(args)))
        return 0
    out = measure(
        args.kind, args.recipe, args.layers, args.rows, args.hidden, args.threads, args.profile
    )
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
