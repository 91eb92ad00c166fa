"""Figure 3: wall time of ``python -m codegen`` and ``--check`` for every bundle.

Fresh interpreters, alternated with a bare ``python -c pass`` (interpreter start-up, the
floor) so machine noise hits all three; bytecode caching on, first round dropped. ``generate`` on an up-to-date tree reads every
source, renders every file and rewrites nothing; ``--check`` does the same and diffs.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from .common import bytecode_env, progress, stats, timed_subprocess
from .import_time import ROOT

COMMANDS = {
    "python -c pass": ["-c", "pass"],
    "python -m codegen": ["-m", "codegen"],
    "python -m codegen --check": ["-m", "codegen", "--check"],
}


def _timed(argv: list[str]) -> float:
    start = time.perf_counter()
    timed_subprocess([sys.executable, *argv], env={"PYTHONPATH": str(ROOT), **bytecode_env()})
    return time.perf_counter() - start


def run(rounds: int = 7, warmup: bool = True) -> dict[str, Any]:
    progress(f"figure 3: codegen wall time ({rounds} rounds)")
    samples: dict[str, list[float]] = {k: [] for k in COMMANDS}
    for i in range(rounds + int(warmup)):  # a warm-up round fills the caches; dropped
        for label, argv in COMMANDS.items():
            seconds = _timed(argv)
            if i >= int(warmup):
                samples[label].append(seconds * 1e3)
    result = {"wall_ms": {k: stats(v) for k, v in samples.items()}}
    w = result["wall_ms"]
    progress(
        f"  generate {w['python -m codegen']['median']:.0f} ms, "
        f"--check {w['python -m codegen --check']['median']:.0f} ms "
        f"(interpreter start {w['python -c pass']['median']:.0f} ms)"
    )
    return result
