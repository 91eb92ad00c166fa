"""FSDP2 (``fully_shard``) over our modules, with our tensor parallelism inside on a
2x2 ``("dp", "tp")`` DeviceMesh and alone on four ranks, over gloo: eager and compiled
per layer bitwise equal over three optimizer steps, close to the single-process model,
FP8 (``quantized_model_init``) weights all-gathered as FP8 codes, and the refused
configurations. The cases are in ``dist_fsdp2_cases.py``; one launch runs them all."""

from __future__ import annotations

import pytest
from dist_fsdp2_cases import FSDP2, WORLD
from dist_launcher import assert_case_passed, assert_launch_finished, launch

LAUNCH_TIMEOUT_S = 420

pytestmark = [pytest.mark.distributed, pytest.mark.slow]


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return launch("gloo", FSDP2, tmp_path_factory.mktemp("dist-fsdp2"), WORLD, LAUNCH_TIMEOUT_S)


@pytest.mark.parametrize("case", FSDP2)
def test_four_ranks(result: dict, case: str) -> None:
    assert_case_passed(result, case)


def test_launch_finished_in_time(result: dict) -> None:
    assert_launch_finished(result, WORLD, LAUNCH_TIMEOUT_S)
