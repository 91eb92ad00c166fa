"""Comm-GEMM overlap (``runtime/comm_overlap.py``) on two ranks: sequence-parallel
Linear (column, row), LayerNormMLP and TransformerLayer, bf16 and FP8 current scaling, overlap off vs on.
Compiled (fullgraph) equals eager overlapped bit for bit everywhere; on gloo the
overlapped step falls back to the plain collectives, bitwise equal to the
non-overlapped step; on NCCL (``-m "gpu and distributed"``, two CUDA devices) the
GEMMs run fused with their collectives (bf16: all four SP sites; FP8: the
reduce-scatters) and agree within bf16 rounding. On gloo the ``emulated`` cases also run
the fused path's wiring inside the ops, the fused ops computed by their definitions. The cases are in
``dist_overlap_cases.py``."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from dist_launcher import (
    assert_case_passed,
    assert_launch_finished,
    backend_params,
    launch_per_backend,
)
from dist_overlap_cases import EMULATED, OVERLAP

WORLD = 2
LAUNCH_TIMEOUT_S = 270

BACKENDS = backend_params(WORLD, pytest.mark.slow)


@pytest.fixture(scope="module")
def launches(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], dict]:
    """One launch per backend, made on first use and shared by the module's tests."""
    return launch_per_backend(tmp_path_factory, "dist-overlap", _cases, WORLD, LAUNCH_TIMEOUT_S)


def _cases(backend: str) -> list[str]:
    return OVERLAP + EMULATED if backend == "gloo" else OVERLAP


def _params() -> list:
    params = []
    for backend in BACKENDS:
        (name,) = backend.values
        for case in _cases(name):
            params.append(pytest.param(name, case, marks=backend.marks, id=f"{name}-{case}"))
    return params


@pytest.mark.parametrize(("backend", "case"), _params())
def test_two_ranks(launches, backend: str, case: str) -> None:
    result = launches(backend)
    assert_case_passed(result, case)
    infos = [records[case]["info"] for records in result["ranks"]]
    if case.startswith("overlap-emulated-"):  # the fused path, its ops stood in for
        for info in infos:
            assert info["fused_reason"] is None and info["fused_calls"], info
    elif backend == "gloo":
        for info in infos:
            assert "NCCL" in info["fused_reason"] and not info["fused_calls"], info
    else:
        for info in infos:
            assert info["fused_reason"] is None and info["fused_calls"], info


@pytest.mark.parametrize("backend", BACKENDS)
def test_launch_finished_in_time(launches, backend: str) -> None:
    assert_launch_finished(launches(backend), WORLD, LAUNCH_TIMEOUT_S)
