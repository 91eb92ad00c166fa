"""FSDP2 (``fully_shard``) over our modules, with our tensor parallelism inside on a
2x2 ``("dp", "tp")`` DeviceMesh and alone on four ranks: eager and compiled per layer
bitwise equal over three optimizer steps, close to the single-process model, FP8
(``quantized_model_init``) weights all-gathered as FP8 codes, and the refused
configurations. The cases are in ``dist_fsdp2_cases.py``; one launch per backend runs
them all: gloo on the CPU, and with ``-m "gpu and distributed"`` on a machine with four
CUDA devices, NCCL."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from dist_fsdp2_cases import FSDP2, WORLD
from dist_launcher import (
    assert_case_passed,
    assert_launch_finished,
    backend_params,
    launch_per_backend,
)

LAUNCH_TIMEOUT_S = 420

BACKENDS = backend_params(WORLD, pytest.mark.slow)


@pytest.fixture(scope="module")
def launches(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], dict]:
    """One launch per backend, made on first use and shared by the module's tests."""
    return launch_per_backend(tmp_path_factory, "dist-fsdp2", FSDP2, WORLD, LAUNCH_TIMEOUT_S)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", FSDP2)
def test_four_ranks(launches: Callable[[str], dict], backend: str, case: str) -> None:
    assert_case_passed(launches(backend), case)


@pytest.mark.parametrize("backend", BACKENDS)
def test_launch_finished_in_time(launches: Callable[[str], dict], backend: str) -> None:
    assert_launch_finished(launches(backend), WORLD, LAUNCH_TIMEOUT_S)
