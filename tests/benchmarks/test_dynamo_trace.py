"""``python -m benchmarks.dynamo_trace``: Dynamo's trace of figure 10's MLP, attributed
to the functions it inlined (run as the docs run it, in a fresh process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _trace(*args: str) -> dict:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    argv = [sys.executable, "-m", "benchmarks.dynamo_trace", "--rows", "4", "--hidden", "16", *args]
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


@pytest.mark.slow
def test_the_calls_of_a_trace_are_attributed_to_the_generated_entry_and_the_module() -> None:
    out = _trace("--kind", "ours", "--recipe", "fp8", "--layers", "2", "--attribute")
    rows = {row["function"].split(":")[0]: row for row in out["by_function"]}
    assert out["cpu_ms_per_layer"] is None  # the profile hook's time is not the trace's
    entry, module = "call_linear (generated/linear.py", "forward (modules/linear.py"
    assert {entry, module, "<frame>"} <= set(rows)
    assert rows["<frame>"]["with_inlined"] == out["calls_per_layer"]
    assert rows[module]["with_inlined"] > rows[entry]["with_inlined"] > 0
    # each row is rounded on its own (calls / layers): up to half a call each above the total
    slack = len(out["by_function"]) / 2
    assert sum(row["own"] for row in out["by_function"]) <= out["calls_per_layer"] + slack


@pytest.mark.slow
def test_the_trace_time_is_reported_per_layer_without_attribution() -> None:
    out = _trace("--kind", "torch", "--layers", "2")
    assert out["layers"] == 2 and out["cpu_ms_per_layer"] > 0
    assert "by_function" not in out
