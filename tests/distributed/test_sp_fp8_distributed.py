"""Sequence-parallel communication as TE runs it, on two gloo ranks: amax reduction
over the TP group and the FP8 all-gather (column-parallel input forward and for wgrad,
row-parallel output gradient), for every recipe that runs sequence parallelism. The
cases (compiled equal to eager, bitwise equal to the single-process reference of the
same algorithm, the two gather options equal, bytes moved) are in
``dist_sp_fp8_cases.py``; one launch runs them all."""

from __future__ import annotations

import pytest
from dist_launcher import assert_case_passed, assert_launch_finished, launch
from dist_sp_fp8_cases import SP_FP8

WORLD = 2
LAUNCH_TIMEOUT_S = 270


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return launch("gloo", SP_FP8, tmp_path_factory.mktemp("dist-sp-fp8"), WORLD, LAUNCH_TIMEOUT_S)


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.parametrize("case", SP_FP8)
def test_two_ranks(result: dict, case: str) -> None:
    assert_case_passed(result, case)


@pytest.mark.distributed
@pytest.mark.slow
def test_launch_finished_in_time(result: dict) -> None:
    assert_launch_finished(result, WORLD, LAUNCH_TIMEOUT_S)
