"""What the Triton kernel modules share before Triton is imported: whether the kernels
run under Triton's interpreter, and why they cannot run here. Importable without Triton
(CPU-only torch installs), unlike ``kernels/_triton_launch.py``."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from typing import Any, Optional

import torch

from ..runtime import _torch_private as _private
from ..runtime import lowering

__all__ = [
    "check_runnable",
    "interpreting",
    "launchable_here",
    "on_its_device",
    "takes_recorded_kernel",
    "unavailable_reason",
]


def interpreting() -> bool:
    """Whether ``TRITON_INTERPRET`` asks for Triton's interpreter (CPU tensors)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def unavailable_reason(build_kernels: Callable[[bool], Any]) -> Optional[str]:
    """Why a module's kernels cannot run here, or None once Triton imports and
    ``build_kernels(interpreting())`` has built them."""
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except Exception as exc:  # ImportError, or a broken install
        return f"triton is not importable ({type(exc).__name__}: {exc})"
    build_kernels(interpreting())
    return None


def check_runnable(
    caller: str, device: torch.device, unavailable: Callable[[], Optional[str]]
) -> None:
    """Refuse, naming ``caller``, a kernel entry point called where it cannot run: a
    non-CUDA ``device`` (CPU tensors only under ``TRITON_INTERPRET=1``), then a module
    whose kernels are unavailable (``unavailable``: its ``unavailable_reason``, asked only
    for a device the kernels could run on)."""
    if device.type != "cuda" and not interpreting():
        raise ValueError(
            f"{caller}: runs on CUDA tensors (CPU ones only under TRITON_INTERPRET=1), got {device}"
        )
    reason = unavailable()
    if reason is not None:
        raise RuntimeError(f"{caller}: {reason}")


def on_its_device(x: torch.Tensor) -> Any:
    """A context making ``x``'s CUDA device the current one for a launch (Triton launches
    on the current device); a no-op where it already is, or for a CPU tensor."""
    if x.device.type == "cuda" and x.device.index != _private.cuda_current_device():
        return torch.cuda.device(x.device)
    return contextlib.nullcontext()


def launchable_here() -> bool:
    """Whether a raw kernel launch may run now: not while Dynamo traces, and under no
    dispatch mode (fake tensors, functionalization), where the reference ops must run
    instead because they trace and a launch would not."""
    return not torch.compiler.is_compiling() and _private.current_dispatch_mode() is None


def takes_recorded_kernel(x: torch.Tensor, available: Callable[[], bool]) -> bool:
    """Whether ``x`` takes a quantize kernel that a lowered op call records as one op: a
    real CUDA tensor (or Parameter) outside tracing, or a fake CUDA tensor traced for a
    lowered call (runtime/lowering.py); under any other tracing, fake tensors,
    functionalization or a dispatch mode the reference ops run (they trace; a raw
    kernel launch would not)."""
    kind = type(x)
    if kind is not torch.Tensor and kind is not torch.nn.Parameter:
        return (
            lowering.tracing() and isinstance(x, _private.FakeTensor) and x.is_cuda and available()
        )
    if x.device.type != "cuda":  # a frozen weight reaches here as its Parameter
        return False
    return launchable_here() and available()
