"""What the Triton kernel modules share before Triton is imported: whether the kernels
run under Triton's interpreter, and why they cannot run here. Importable without Triton
(CPU-only torch installs), unlike ``quantization/_triton_launch.py``."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, Optional

import torch

from . import _torch_private as _private

__all__ = ["interpreting", "launchable_here", "unavailable_reason"]


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


def launchable_here() -> bool:
    """Whether a raw kernel launch may run now: not while Dynamo traces, and under no
    dispatch mode (fake tensors, functionalization), where the reference ops must run
    instead because they trace and a launch would not."""
    return not torch.compiler.is_compiling() and _private.current_dispatch_mode() is None
