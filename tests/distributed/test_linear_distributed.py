"""Tensor- and sequence-parallel Linear on two ranks, eager and compiled.

One two-process launch per backend runs every case (each spawn costs seconds of
torch import); the tests below are parametrized over its records. On the CPU the
ranks talk through gloo; with ``-m "gpu and distributed"`` on a machine with two CUDA
devices the same cases run with NCCL, plus CUDA-graph (reduce-overhead) variants.

What each case checks is in ``dist_cases.py``: compiled (fullgraph) output and every
gradient bitwise equal to eager distributed, zero graph breaks, one graph; eager
distributed within tolerance of a single-process full-size Linear; an unused output
still runs its collective; bad configurations fail with a clear error on every rank.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from dist_cases import cases_for
from dist_launcher import backend_params, launch_per_backend

WORLD = 2
# Bounds the whole launch; each rank's collectives also time out (dist_cases.PG_TIMEOUT_S).
LAUNCH_TIMEOUT_S = 270

BACKENDS = backend_params(WORLD)


@pytest.fixture(scope="module")
def launches(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], dict]:
    """One launch per backend, made on first use and shared by the module's tests."""
    return launch_per_backend(tmp_path_factory, "dist", cases_for, WORLD, LAUNCH_TIMEOUT_S)


def _params() -> list:
    params = []
    for backend in BACKENDS:
        (name,) = backend.values
        for case in cases_for(name):
            params.append(pytest.param(name, case, marks=backend.marks, id=f"{name}-{case}"))
    return params


@pytest.mark.parametrize(("backend", "case"), _params())
def test_two_ranks(launches, backend: str, case: str) -> None:
    result = launches(backend)
    for rank, records in enumerate(result["ranks"]):
        if "__init__" in records:
            pytest.fail(f"rank {rank} could not start:\n{records['__init__']['error']}")
        record = records.get(case)
        if record is None:
            pytest.fail(
                f"rank {rank} has no record of {case!r} (timed out: {result['timed_out']}, "
                f"exit codes {result['exitcodes']}, after {result['seconds']} s)"
            )
        assert record["ok"], f"rank {rank}:\n{record['error']}"
        if "skipped" in record:
            pytest.skip(record["skipped"])
    infos = [records[case]["info"] for records in result["ranks"]]
    if case.startswith("error-"):
        # The same clear message on every rank.
        assert len({info["message"] for info in infos}) == 1, infos


@pytest.mark.parametrize("backend", BACKENDS)
def test_launch_finished_in_time(launches, backend: str) -> None:
    result = launches(backend)
    assert not result["timed_out"], f"the launch hit its {LAUNCH_TIMEOUT_S} s deadline"
    assert result["exitcodes"] == [0] * WORLD, result["exitcodes"]
    assert all(r.get("__done__", {}).get("ok") for r in result["ranks"])
