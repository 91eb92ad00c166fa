"""TransformerLayer with tensor parallelism (and sequence parallelism) on two gloo
ranks: compiled (fullgraph) bitwise equal to eager, one graph, no graph break; eager
close to the single-process layer. The cases are in ``dist_transformer_cases.py``."""

from __future__ import annotations

import pytest
from dist_launcher import assert_case_passed, assert_launch_finished, launch
from dist_transformer_cases import TRANSFORMER

WORLD = 2
LAUNCH_TIMEOUT_S = 400


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return launch(
        "gloo", TRANSFORMER, tmp_path_factory.mktemp("dist-transformer"), WORLD, LAUNCH_TIMEOUT_S
    )


@pytest.mark.distributed
@pytest.mark.parametrize("case", TRANSFORMER)
def test_two_ranks(result: dict, case: str) -> None:
    assert_case_passed(result, case)


@pytest.mark.distributed
def test_launch_finished_in_time(result: dict) -> None:
    assert_launch_finished(result, WORLD, LAUNCH_TIMEOUT_S)
