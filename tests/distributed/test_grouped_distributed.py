"""GroupedLinear column- and row-parallel, with and without sequence parallelism, on two
gloo ranks: compiled (fullgraph) bitwise equal to eager, one graph, no graph break; each
rank's eager results close to the single-process module on what the rank holds (TE's
GroupedLinear leaves the collectives to the caller). The cases are in
``dist_grouped_cases.py``; one launch runs them all."""

from __future__ import annotations

import pytest
from dist_grouped_cases import GROUPED
from dist_launcher import launch

WORLD = 2
LAUNCH_TIMEOUT_S = 270


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return launch("gloo", GROUPED, tmp_path_factory.mktemp("dist-grouped"), WORLD, LAUNCH_TIMEOUT_S)


@pytest.mark.distributed
@pytest.mark.parametrize("case", GROUPED)
def test_two_ranks(result: dict, case: str) -> None:
    for rank, records in enumerate(result["ranks"]):
        if "__init__" in records:
            pytest.fail(f"rank {rank} could not start:\n{records['__init__']['error']}")
        record = records.get(case)
        assert record is not None, (
            f"rank {rank} has no record of {case!r} (timed out: {result['timed_out']})"
        )
        assert record["ok"], f"rank {rank}:\n{record['error']}"


@pytest.mark.distributed
def test_launch_finished_in_time(result: dict) -> None:
    assert not result["timed_out"], f"the launch hit its {LAUNCH_TIMEOUT_S} s deadline"
    assert result["exitcodes"] == [0] * WORLD, result["exitcodes"]
