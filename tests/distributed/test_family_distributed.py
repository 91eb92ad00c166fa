"""LayerNormLinear column-parallel and LayerNormMLP (fc1 column-, fc2 row-parallel),
with and without sequence parallelism, on two gloo ranks: compiled (fullgraph) bitwise
equal to eager, one graph, no graph break; eager close to the single-process module.
The cases are in ``dist_family_cases.py``; one launch runs them all."""

from __future__ import annotations

import pytest
from dist_family_cases import FAMILY
from dist_launcher import assert_case_passed, assert_launch_finished, launch

WORLD = 2
LAUNCH_TIMEOUT_S = 270


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return launch("gloo", FAMILY, tmp_path_factory.mktemp("dist-family"), WORLD, LAUNCH_TIMEOUT_S)


@pytest.mark.distributed
@pytest.mark.parametrize("case", FAMILY)
def test_two_ranks(result: dict, case: str) -> None:
    assert_case_passed(result, case)


@pytest.mark.distributed
def test_launch_finished_in_time(result: dict) -> None:
    assert_launch_finished(result, WORLD, LAUNCH_TIMEOUT_S)
