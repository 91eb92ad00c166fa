"""Start ``world_size`` local ranks once, run a list of cases, collect their records.

Loopback only (MASTER_ADDR=127.0.0.1, a free port), ``torch.multiprocessing`` spawn,
and a hard deadline: ranks still alive at the deadline are terminated (by the pids
this launcher started) and the records written so far are returned, so a hang shows
up as failed cases, never as a stuck test session.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(
    backend: str, names: list[str], out_dir: Path, world_size: int = 2, timeout_s: float = 240
) -> dict[str, Any]:
    """Run ``names`` on ``world_size`` ranks; return ``{"ranks": [records per rank],
    "exitcodes": [...], "seconds": wall time, "timed_out": bool}``."""
    env = {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        # Two ranks share the CPU: one intra-op thread each, no compile worker pool.
        "OMP_NUM_THREADS": "1",
        "TORCHINDUCTOR_COMPILE_THREADS": "1",
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    start = time.perf_counter()
    try:
        from dist_cases import worker  # imported here: the children import it by name

        context = mp.start_processes(
            worker,
            args=(world_size, backend, str(out_dir), names),
            nprocs=world_size,
            join=False,
            start_method="spawn",
        )
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    deadline = start + timeout_s
    timed_out = False
    while True:
        try:
            if context.join(timeout=max(0.1, min(5.0, deadline - time.perf_counter()))):
                break
        except mp.ProcessRaisedException:
            # A rank raised (reported in its records); the others were terminated.
            break
        except mp.ProcessExitedException:
            break
        if time.perf_counter() >= deadline:
            timed_out = True
            for p in context.processes:
                if p.is_alive():
                    p.terminate()
            for p in context.processes:
                p.join(10)
                if p.is_alive():
                    p.kill()
            break
    ranks = []
    for rank in range(world_size):
        path = out_dir / f"rank{rank}.json"
        ranks.append(json.loads(path.read_text()) if path.exists() else {})
    return {
        "ranks": ranks,
        "exitcodes": [p.exitcode for p in context.processes],
        "seconds": round(time.perf_counter() - start, 1),
        "timed_out": timed_out,
    }


def assert_case_passed(result: dict, case: str) -> None:
    """Fail naming the rank when a rank could not start, has no record of ``case`` or
    recorded it failed."""
    for rank, records in enumerate(result["ranks"]):
        if "__init__" in records:
            pytest.fail(f"rank {rank} could not start:\n{records['__init__']['error']}")
        record = records.get(case)
        assert record is not None, (
            f"rank {rank} has no record of {case!r} (timed out: {result['timed_out']})"
        )
        assert record["ok"], f"rank {rank}:\n{record['error']}"


def assert_launch_finished(result: dict, world: int, timeout_s: float) -> None:
    assert not result["timed_out"], f"the launch hit its {timeout_s} s deadline"
    assert result["exitcodes"] == [0] * world, result["exitcodes"]


def backend_params(world: int, *marks: Any) -> list[Any]:
    """``backend`` parameters: gloo on the CPU; NCCL on ``world`` CUDA devices, marked
    ``gpu`` and skipped with the reason where the machine has fewer. Both carry
    ``distributed`` and ``marks``."""
    return [
        pytest.param("gloo", marks=[pytest.mark.distributed, *marks], id="gloo"),
        pytest.param(
            "nccl",
            marks=[
                pytest.mark.distributed,
                *marks,
                pytest.mark.gpu,
                pytest.mark.skipif(
                    not torch.cuda.is_available() or torch.cuda.device_count() < world,
                    reason=f"needs {world} CUDA devices",
                ),
            ],
            id="nccl",
        ),
    ]


def launch_per_backend(
    tmp_path_factory: pytest.TempPathFactory,
    prefix: str,
    cases: Sequence[str] | Callable[[str], Sequence[str]],
    world: int,
    timeout_s: float,
) -> Callable[[str], dict[str, Any]]:
    """``get(backend)``: one launch of ``cases`` (or ``cases(backend)``) per backend, made
    on first use and kept by the returned function, so a module-scoped fixture returning
    it shares each launch among the module's tests."""
    done: dict[str, dict[str, Any]] = {}

    def get(backend: str) -> dict[str, Any]:
        if backend not in done:
            names = list(cases(backend) if callable(cases) else cases)
            out = tmp_path_factory.mktemp(f"{prefix}-{backend}")
            done[backend] = launch(backend, names, out, world, timeout_s)
        return done[backend]

    return get
