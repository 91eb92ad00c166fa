"""The test device of a conformance run, as the rewritten TE tests see it.

Copied beside the rewritten tests. ``DEVICE`` is ``"cpu"`` or ``"cuda"``
(``TEOPS_CONFORMANCE_DEVICE``, set by the runner). ``cuda`` stands where TE's tests
write ``torch.cuda``: on CUDA it is ``torch.cuda`` itself; on the CPU it is a namespace
whose functions mean the same for the CPU: ``synchronize`` waits for nothing (CPU
kernels finish before they return), the generator functions act on the CPU generator,
``is_available`` answers that the test device is there, ``current_device`` names it.
The functions with no CPU counterpart (CUDA graphs, streams, allocator statistics) raise;
the runner skips the tests that reach them on the CPU, naming the function.
"""

from __future__ import annotations

import os
import platform
from typing import Any, NoReturn

import torch

DEVICE = os.environ.get("TEOPS_CONFORMANCE_DEVICE", "")
if DEVICE not in ("cpu", "cuda"):
    raise RuntimeError(
        f"TEOPS_CONFORMANCE_DEVICE={DEVICE!r}: the conformance runner sets it to 'cpu' or 'cuda'"
    )


class HostCuda:
    """``torch.cuda`` as TE's tests use it, for a run on the CPU."""

    @staticmethod
    def is_available() -> bool:
        return True

    @staticmethod
    def synchronize(device: Any = None) -> None:
        return None

    @staticmethod
    def manual_seed(seed: int) -> None:
        torch.manual_seed(seed)

    @staticmethod
    def manual_seed_all(seed: int) -> None:
        torch.manual_seed(seed)

    @staticmethod
    def get_rng_state(device: Any = None) -> torch.Tensor:
        return torch.get_rng_state()

    @staticmethod
    def set_rng_state(state: torch.Tensor, device: Any = None) -> None:
        torch.set_rng_state(state)

    @staticmethod
    def current_device() -> str:
        return DEVICE

    @staticmethod
    def device_count() -> int:
        return 1

    @staticmethod
    def get_device_name(device: Any = None) -> str:
        return platform.processor() or platform.machine() or "cpu"

    @staticmethod
    def is_bf16_supported(including_emulation: bool = True) -> bool:
        return True

    def __getattr__(self, name: str) -> NoReturn:
        raise AttributeError(
            f"torch.cuda.{name} has no CPU counterpart in the conformance runner's device "
            "shim (conformance/shim/_teops_device.py)"
        )


cuda: Any = torch.cuda if DEVICE == "cuda" else HostCuda()
