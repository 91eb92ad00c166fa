"""Shared measurement helpers: interleaved torch.utils.benchmark timings, stats, progress.

Every figure is a median over repeated *rounds*; within a round each contender is
measured once, in turn, so slow drifts of the machine hit all of them. A comparison is
the median of the per-round ratios (baseline / ours) measured in the same process.
"""

from __future__ import annotations

import datetime
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

_START = time.perf_counter()

# The parts of ``python -m benchmarks --device cuda`` beside the step shapes
# (``benchmarks.gpu.run``), and those it runs by default (tp needs two GPUs).
GPU_DEFAULT_PARTS = (
    "quantization",
    "op_overhead",
    "memory",
    "sustained",
    "transformer_layer",
    "moe",
    "torchao",
    "paired",
)
GPU_PARTS = (*GPU_DEFAULT_PARTS, "tp")


def progress(message: str) -> None:
    """One progress line with the elapsed wall time of the run."""
    print(f"[{time.perf_counter() - _START:6.1f}s] {message}", flush=True)


def stats(samples: Sequence[float]) -> dict[str, Any]:
    """Median and spread (min, max, interquartile range) of repeated measurements."""
    xs = sorted(samples)
    if len(xs) >= 4:
        q = statistics.quantiles(xs, n=4, method="inclusive")
        q1, q3 = q[0], q[2]
    else:
        q1, q3 = xs[0], xs[-1]
    return {
        "median": statistics.median(xs),
        "min": xs[0],
        "max": xs[-1],
        "q1": q1,
        "q3": q3,
        "n": len(xs),
        "samples": list(samples),
    }


def ratio_stats(numerators: Sequence[float], denominators: Sequence[float]) -> dict[str, Any]:
    """Stats of the per-round ratios numerator / denominator (paired, same round)."""
    return stats([a / b for a, b in zip(numerators, denominators, strict=True)])


def interleaved(
    contenders: dict[str, Callable[[], Any]],
    rounds: int,
    min_run_time: float,
    label: str = "",
) -> dict[str, list[float]]:
    """Per-round median seconds per call of each contender, measured in turn.

    Each measurement is ``torch.utils.benchmark.Timer.blocked_autorange``: it picks the
    block size, times blocks for ``min_run_time`` and reports their median.
    """
    # Imported here: ``torch.utils.benchmark`` pulls in setuptools, after which Dynamo
    # traces ``torch.nn.Linear`` ~2.4x slower; figure 10's child processes import this
    # module and must not carry that into the baseline they time.
    from torch.utils import benchmark

    timers = {
        name: benchmark.Timer("fn()", globals={"fn": fn}, label=label, sub_label=name)
        for name, fn in contenders.items()
    }
    out: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(rounds):
        for name, timer in timers.items():
            out[name].append(timer.blocked_autorange(min_run_time=min_run_time).median)
    return out


def paired_ratio(
    ours: Callable[[], Any],
    baseline: Callable[[], Any],
    pairs: int = 300,
    block: int = 10,
    sync: Callable[[], None] = lambda: None,
    seed: int = 0,
) -> dict[str, Any]:
    """ours / baseline over ``pairs`` pairs of back-to-back blocks of ``block`` calls
    (synchronized wall time), the order alternating from pair to pair: a ratio near 1
    at a host-bound step, where a round of ``interleaved`` (each contender timed for a
    fraction of a second in turn) spreads by 10-20% with the host's drift. Reports the
    stats of the per-pair ratios and a 95% bootstrap interval of their median."""

    def timed(fn: Callable[[], Any]) -> float:
        sync()
        started = time.perf_counter()
        for _ in range(block):
            fn()
        sync()
        return (time.perf_counter() - started) / block

    for _ in range(10):  # warm both
        timed(ours)
        timed(baseline)
    ratios, ours_s, base_s = [], [], []
    for i in range(pairs):
        if i % 2:
            a = timed(ours)
            b = timed(baseline)
        else:
            b = timed(baseline)
            a = timed(ours)
        ratios.append(a / b)
        ours_s.append(a)
        base_s.append(b)
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(1000))
    out = stats(ratios)
    del out["samples"]
    out["ci95"] = [medians[24], medians[974]]
    out["ours_s"] = statistics.median(ours_s)
    out["baseline_s"] = statistics.median(base_s)
    out["pairs"], out["block"] = pairs, block
    return out


def host_seconds(fn: Callable[[], Any], rounds: int = 7) -> dict[str, Any]:
    """Host time of one call of ``fn`` with a CUDA device kept busy: each round queues a
    ~50 ms sleep kernel, then times the call on the host (it never waits for the device
    unless it synchronizes). A step whose host time nears its synchronized time is bound
    by the host: its figure moves with the host's speed, not the GPU's."""
    samples = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        torch.cuda._sleep(100_000_000)  # ~50 ms at the H200's clock
        started = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - started)
        torch.cuda.synchronize()
    return stats(samples)


def kernel_group(name: str) -> str:
    """The kind of a CUDA kernel, from its name: what a step's GPU time is spent on."""
    low = name.lower()
    if any(k in low for k in ("gemm", "sm90", "cutlass", "nvjet", "xmma", "cublas")):
        return "gemm"
    if any(k in low for k in ("flash", "fmha", "attention", "sdpa")):
        return "attention"
    if "_amax" in low:
        return "fp8 amax"
    if "_cast_transpose" in low:
        return "fp8 cast+transpose"
    if low.startswith("triton_"):
        return "inductor fused"
    return "other"


def busy_time(spans: list[tuple[float, float]]) -> float:
    """The length of the union of ``(start, end)`` intervals: concurrent kernels count once."""
    busy, reach = 0.0, float("-inf")
    for start, end in sorted(spans):
        if end > reach:
            busy += end - max(start, reach)
            reach = end
    return busy


def kernel_profile(fn: Callable[[], Any], steps: int = 3) -> dict[str, Any]:
    """``fn``'s kernels per call on a CUDA device (``torch.profiler``): how many it
    launches, the GPU's busy time (the union of the kernels' intervals, so concurrent
    kernels count once) and the kernel time by :func:`kernel_group`, per call."""
    spans: list[tuple[float, float]] = []
    groups: dict[str, float] = {}
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            fn()
        torch.cuda.synchronize()
    for evt in prof.events():
        # "## Call CompiledFxGraph ##" and other user annotations span many kernels.
        if evt.device_type == torch.autograd.DeviceType.CUDA and not evt.name.startswith("## "):
            spans.append((evt.time_range.start, evt.time_range.end))
            kind = kernel_group(evt.name)
            groups[kind] = groups.get(kind, 0.0) + evt.device_time / steps / 1e3
    return {
        "kernels_per_step": len(spans) / steps,
        "gpu_busy_ms_per_step": busy_time(spans) / steps / 1e3,
        "kernel_ms_by_group": {k: round(v, 3) for k, v in sorted(groups.items())},
    }


def timed_subprocess(argv: list[str], env: dict[str, str] | None = None) -> str:
    """Run a child process to completion (check=True) and return its stdout."""
    proc = subprocess.run(
        argv, check=True, capture_output=True, text=True, env={**os.environ, **(env or {})}
    )
    return proc.stdout


_PYCACHE: list[str] = []


def bytecode_env() -> dict[str, str]:
    """Child-process environment with bytecode caching on, in a private cache folder.

    This machine's environment may set PYTHONDONTWRITEBYTECODE, which makes every fresh
    interpreter recompile every module it imports (about 35 ms for this package alone);
    a user's installation has ``.pyc`` files, so the figures are taken with a cache
    (filled by a dropped warm-up run; kept out of the source tree).
    """
    if not _PYCACHE:
        import tempfile

        _PYCACHE.append(tempfile.mkdtemp(prefix="teops-bench-pycache-"))
    return {"PYTHONDONTWRITEBYTECODE": "", "PYTHONPYCACHEPREFIX": _PYCACHE[0]}


def machine_info() -> dict[str, Any]:
    """The header facts of a results file: machine, torch version, date."""
    info: dict[str, Any] = {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "platform": platform.platform(),
        "processor": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "executable": sys.executable,
        "commit": source_commit(),
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
        info["cuda"] = torch.version.cuda
    return info


def source_commit() -> str | None:
    """The checkout's commit (``-dirty`` when tracked files differ from it), or None
    outside a git work tree: the code a results file measured."""
    root = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short=10", "HEAD"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return f"{head}-dirty" if dirty else head


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def measured_on(part: dict[str, Any] | None) -> list[str]:
    """A report section's line naming the run its figures come from, where the part was
    merged from a standalone bench's results file (which records its machine)."""
    m = (part or {}).get("machine")
    if not m:
        return []
    where = m.get("gpu") or f"{m.get('processor')}, {m.get('cpu_count')} cores"
    commit = f"commit `{m['commit']}`" if m.get("commit") else "commit not recorded"
    return [f"Measured {m['date']}, {commit}, {where}, torch {m['torch']}.", ""]


def on_gpu(part: dict[str, Any] | None) -> str:
    """`` (GPU name)`` for a target row's label, where the part records its machine."""
    m = (part or {}).get("machine") or {}
    return f" ({m['gpu']})" if m.get("gpu") else ""
