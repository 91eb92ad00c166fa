"""Sequence-parallel communication as TE runs it, on two ranks: amax reduction over the
TP group and the FP8 all-gather (column-parallel input, forward and for wgrad;
row-parallel output gradient), for every recipe that runs sequence parallelism. The
cases (compiled equal to eager, bitwise equal to the single-process reference of the
same algorithm, the two gather options equal, bytes moved) are in
``dist_sp_fp8_cases.py``; one launch per backend runs them all: gloo on the CPU, NCCL
with ``-m "gpu and distributed"`` on two CUDA devices."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from dist_launcher import (
    assert_case_passed,
    assert_launch_finished,
    backend_params,
    launch_per_backend,
)
from dist_sp_fp8_cases import SP_FP8

WORLD = 2
LAUNCH_TIMEOUT_S = 270

BACKENDS = backend_params(WORLD, pytest.mark.slow)


@pytest.fixture(scope="module")
def launches(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], dict]:
    """One launch per backend, made on first use and shared by the module's tests."""
    return launch_per_backend(tmp_path_factory, "dist-sp-fp8", SP_FP8, WORLD, LAUNCH_TIMEOUT_S)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", SP_FP8)
def test_two_ranks(launches, backend: str, case: str) -> None:
    assert_case_passed(launches(backend), case)


@pytest.mark.parametrize("backend", BACKENDS)
def test_launch_finished_in_time(launches, backend: str) -> None:
    assert_launch_finished(launches(backend), WORLD, LAUNCH_TIMEOUT_S)
