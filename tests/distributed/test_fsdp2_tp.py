"""FSDP2 (``fully_shard``) over our modules, with our tensor parallelism inside on a
2x2 ``("dp", "tp")`` DeviceMesh and alone on four ranks: eager and compiled per layer
bitwise equal over three optimizer steps, close to the single-process model, FP8
(``quantized_model_init``) weights all-gathered as FP8 codes, and the refused
configurations. The cases are in ``dist_fsdp2_cases.py``; one launch per backend runs
them all: gloo on the CPU, and with ``-m "gpu and distributed"`` on a machine with four
CUDA devices, NCCL."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch
from dist_fsdp2_cases import FSDP2, WORLD
from dist_launcher import assert_case_passed, assert_launch_finished, launch

LAUNCH_TIMEOUT_S = 420

BACKENDS = [
    pytest.param("gloo", marks=[pytest.mark.distributed, pytest.mark.slow], id="gloo"),
    pytest.param(
        "nccl",
        marks=[
            pytest.mark.distributed,
            pytest.mark.slow,
            pytest.mark.gpu,
            pytest.mark.skipif(
                not torch.cuda.is_available() or torch.cuda.device_count() < WORLD,
                reason=f"needs {WORLD} CUDA devices",
            ),
        ],
        id="nccl",
    ),
]


@pytest.fixture(scope="module")
def launches(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str], dict]]:
    """One launch per backend, made on first use and shared by the module's tests."""
    done: dict[str, dict] = {}

    def get(backend: str) -> dict:
        if backend not in done:
            out = tmp_path_factory.mktemp(f"dist-fsdp2-{backend}")
            done[backend] = launch(backend, FSDP2, out, WORLD, LAUNCH_TIMEOUT_S)
        return done[backend]

    yield get


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", FSDP2)
def test_four_ranks(launches: Callable[[str], dict], backend: str, case: str) -> None:
    assert_case_passed(launches(backend), case)


@pytest.mark.parametrize("backend", BACKENDS)
def test_launch_finished_in_time(launches: Callable[[str], dict], backend: str) -> None:
    assert_launch_finished(launches(backend), WORLD, LAUNCH_TIMEOUT_S)
