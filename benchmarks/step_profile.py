"""Where one training step's GPU time goes: kernel time by kind, from ``torch.profiler``.

``python -m benchmarks.step_profile [--rows 4096] [--hidden 8192] [--recipe fp8_current]
[--mode eager|compiled]`` builds figure 6's 8-layer MLP of our ``Linear``, warms it up,
profiles a few steps and prints one JSON object: the step's wall time (median of the
profiled steps) and the summed CUDA kernel time per step, grouped (GEMMs, our FP8
amax and cast + transpose kernels, other elementwise) and by kernel name.

``--host`` profiles the host instead (``cProfile`` over the same steps): where the
Python time of an eager or compiled step goes, by function (own time and cumulative),
the question when a step is bound by the CPU enqueuing kernels rather than by the GPU.

``--queued`` answers whether it is: the host time of a step measured while the GPU is
kept busy (a ~1 s ``torch.cuda._sleep`` queued first, so the host never waits for the
GPU) against the step's synchronized wall time; a host time close to the wall time
means the GPU waits for the host.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import defaultdict
from typing import Any

import torch

from .common import busy_time, kernel_group
from .gpu import RECIPES, _build

STEPS = 5


def _warm_step(rows: int, hidden: int, recipe: str, mode: str) -> tuple[Any, dict[str, Any]]:
    """Figure 6's training step of our 8-layer MLP, built and run three times (compiled,
    CUDA graph recorded and replayed); ``(None, what failed)`` when it could not be."""
    from .models import make_input

    x = make_input(rows, hidden, device="cuda")
    step, info = _build("ours", recipe, mode, hidden, x)
    if step is not None:
        for _ in range(3):
            step()
        torch.cuda.synchronize()
    return step, info


def _what(rows: int, hidden: int, recipe: str, mode: str) -> dict[str, Any]:
    return {"rows": rows, "hidden": hidden, "recipe": recipe, "mode": mode}


def profile(rows: int, hidden: int, recipe: str, mode: str) -> dict[str, Any]:
    step, info = _warm_step(rows, hidden, recipe, mode)
    if step is None:
        return {"failed": info}
    walls = []
    acts = [torch.profiler.ProfilerActivity.CUDA, torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=acts, record_shapes=True) as prof:
        for _ in range(STEPS):
            started = time.perf_counter()
            step()
            torch.cuda.synchronize()
            walls.append(time.perf_counter() - started)
    by_name: dict[str, float] = defaultdict(float)
    spans = []
    for evt in prof.events():
        # "## Call CompiledFxGraph ##" and other user annotations span many kernels.
        if evt.device_type == torch.autograd.DeviceType.CUDA and not evt.name.startswith("## "):
            by_name[evt.name] += evt.device_time / STEPS
            spans.append((evt.time_range.start, evt.time_range.end))
    busy = busy_time(spans)  # concurrent kernels count once
    groups: dict[str, float] = defaultdict(float)
    for name, us in by_name.items():
        groups[kernel_group(name)] += us
    top = sorted(by_name.items(), key=lambda kv: -kv[1])[:25]
    # aten ops by the GPU time of the kernels they launched, with their input shapes
    ops = [
        (f"{e.key} {e.input_shapes}"[:160], e.device_time_total / STEPS)
        for e in prof.key_averages(group_by_input_shape=True)
        if e.key.startswith("aten::") and e.device_time_total > 0
    ]
    ops.sort(key=lambda kv: -kv[1])
    return {
        **_what(rows, hidden, recipe, mode),
        "step_ms_median_profiled": statistics.median(walls) * 1e3,
        "kernel_ms_per_step": sum(by_name.values()) / 1e3,
        "gpu_busy_ms_per_step": busy / STEPS / 1e3,
        "kernels_per_step": len(spans) / STEPS,
        "groups_ms": {k: v / 1e3 for k, v in sorted(groups.items())},
        "top_kernels_us": {k[:120]: round(v, 1) for k, v in top},
        "top_aten_ops_us": {k: round(v, 1) for k, v in ops[:30]},
        "info": {k: v for k, v in info.items() if k != "warnings"},
    }


def host_profile(rows: int, hidden: int, recipe: str, mode: str, top: int = 40) -> dict[str, Any]:
    """The step's host time by Python function (cProfile), seconds per step."""
    import cProfile
    import pstats

    step, info = _warm_step(rows, hidden, recipe, mode)
    if step is None:
        return {"failed": info}
    steps = 20
    profiler = cProfile.Profile()
    started = time.perf_counter()
    profiler.enable()
    for _ in range(steps):
        step()
    profiler.disable()
    torch.cuda.synchronize()
    wall = (time.perf_counter() - started) / steps
    stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]

    def name(key: tuple[str, int, str]) -> str:
        path, line, func = key
        return f"{path.rsplit('/', 2)[-2:][-1] if '/' in path else path}:{line}({func})"

    rows_ = [
        (name(k), v[0] / steps, v[2] / steps * 1e6, v[3] / steps * 1e6) for k, v in stats.items()
    ]
    own = sorted(rows_, key=lambda r: -r[2])[:top]
    cum = sorted(rows_, key=lambda r: -r[3])[:top]
    return {
        **_what(rows, hidden, recipe, mode),
        "step_ms_under_cprofile": wall * 1e3,
        "own_us_per_step": {r[0]: [round(r[1], 1), round(r[2], 1)] for r in own},
        "cumulative_us_per_step": {r[0]: [round(r[1], 1), round(r[3], 1)] for r in cum},
    }


def queued_host_time(
    rows: int, hidden: int, recipe: str, mode: str, rounds: int = 5, queued: int = 4
) -> dict[str, Any]:
    """Host ms per step with the GPU kept busy, against the synchronized ms per step
    (medians over ``rounds``). Each round queues a sleep kernel of ~1 s, then enqueues
    ``queued`` steps behind it, timed on the host, then times ``2 * queued`` steps with a
    synchronize. A step that synchronizes itself would wait for the sleep: reported."""
    step, info = _warm_step(rows, hidden, recipe, mode)
    if step is None:
        return {"failed": info}
    cycles = 2_000_000_000  # ~1 s at the H200's 1.98 GHz; longer when it clocks down
    hosts, walls = [], []
    for _ in range(rounds):
        torch.cuda.synchronize()
        torch.cuda._sleep(cycles)
        started = time.perf_counter()
        for _ in range(queued):
            step()
        hosts.append((time.perf_counter() - started) / queued)
        torch.cuda.synchronize()
        started = time.perf_counter()
        for _ in range(2 * queued):
            step()
        torch.cuda.synchronize()
        walls.append((time.perf_counter() - started) / (2 * queued))
    return {
        **_what(rows, hidden, recipe, mode),
        "host_ms_per_step": statistics.median(hosts) * 1e3,
        "host_ms_samples": [round(h * 1e3, 2) for h in hosts],
        "step_ms": statistics.median(walls) * 1e3,
        "step_ms_samples": [round(w * 1e3, 2) for w in walls],
        # The queued steps waited for the sleep: the step synchronizes with the GPU.
        "synchronizes": max(hosts) > 0.5,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--hidden", type=int, default=8192)
    parser.add_argument("--recipe", default="fp8_current", choices=sorted(RECIPES))
    parser.add_argument("--mode", default="eager", choices=("eager", "compiled", "reduce-overhead"))
    parser.add_argument("--host", action="store_true", help="profile the host (cProfile)")
    parser.add_argument(
        "--queued", action="store_true", help="host time per step with the GPU kept busy"
    )
    args = parser.parse_args()
    run = host_profile if args.host else queued_host_time if args.queued else profile
    print(json.dumps(run(args.rows, args.hidden, args.recipe, args.mode), indent=1), flush=True)


if __name__ == "__main__":
    main()
