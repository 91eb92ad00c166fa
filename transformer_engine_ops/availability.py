"""TE's availability queries (``te.is_fp8_available`` and its kin), answered for this
package on this device.

TE answers whether its CUDA kernels run a format on the current GPU. This package runs
every format on the CPU and on any CUDA device: a per-tensor FP8 GEMM natively
(``torch._scaled_mm``) on a CUDA device of compute capability 8.9 or newer, an FP8 block
GEMM natively (cuBLAS's block-scaled one) on Hopper under a torch for CUDA 12.9+,
everything else through its reference kernels (quantize, then dequantize and multiply in higher
precision: the same numbers, slower). So every query answers True, and with
``return_reason=True`` the reason says which of the two runs the format here (TE gives an
empty reason when available; a script only tests the boolean).
"""

from __future__ import annotations

from typing import Union

import torch

from .quantization import float8_block_gemm
from .quantization.recipes import Float8CurrentScaling, Recipe

# The first compute capability whose cuBLAS runs a per-tensor FP8 GEMM.
_FP8_GEMM_CAPABILITY = (8, 9)


def get_device_compute_capability() -> tuple[int, int]:
    """The current CUDA device's compute capability ``(major, minor)``, as TE's.
    Without a CUDA device there is none: a RuntimeError says so rather than a made-up
    number a script would compare against."""
    if not torch.cuda.is_available():
        raise RuntimeError(
            "get_device_compute_capability: no CUDA device is available (this package "
            "runs every format on the CPU too; te.is_fp8_available() and its kin say how)"
        )
    major, minor = torch.cuda.get_device_capability()
    return major, minor


def _device_words() -> str:
    if not torch.cuda.is_available():
        return "the CPU"
    major, minor = get_device_compute_capability()
    return f"{torch.cuda.get_device_name()} (compute capability {major}.{minor})"


def _answer(format_name: str, native: bool, return_reason: bool) -> Union[bool, tuple[bool, str]]:
    if not return_reason:
        return True
    how = (
        "natively"
        if native
        else "emulated (this package's reference kernels: quantize, dequantize, "
        "multiply in higher precision)"
    )
    return True, f"{format_name} runs {how} on {_device_words()}"


def _native_fp8_gemm() -> bool:
    return torch.cuda.is_available() and get_device_compute_capability() >= _FP8_GEMM_CAPABILITY


def is_fp8_available(return_reason: bool = False) -> Union[bool, tuple[bool, str]]:
    """Per-tensor FP8 (delayed and current scaling): True; native on a CUDA device of
    compute capability 8.9 or newer, emulated elsewhere."""
    return _answer("FP8 per-tensor scaling", _native_fp8_gemm(), return_reason)


def is_mxfp8_available(return_reason: bool = False) -> Union[bool, tuple[bool, str]]:
    """MXFP8: True; emulated on every device (its GEMM dequantizes the operands)."""
    return _answer("MXFP8 block scaling", False, return_reason)


def is_fp8_block_scaling_available(return_reason: bool = False) -> Union[bool, tuple[bool, str]]:
    """FP8 block scaling: True; its GEMM native on Hopper under a torch for CUDA 12.9+
    (for shapes of whole 128-blocks, docs/quantization.md), emulated elsewhere."""
    native = torch.cuda.is_available() and float8_block_gemm.runs_on(torch.cuda.current_device())
    return _answer("FP8 block scaling", native, return_reason)


def is_nvfp4_available(return_reason: bool = False) -> Union[bool, tuple[bool, str]]:
    """NVFP4: True; emulated on every device."""
    return _answer("NVFP4 block scaling", False, return_reason)


def is_bf16_available(return_reason: bool = False) -> Union[bool, tuple[bool, str]]:
    """Whether bf16 compute runs here: torch's answer for the current CUDA device (TE's
    rule), and True on the CPU, where torch computes bf16."""
    if torch.cuda.is_available():
        available = torch.cuda.is_bf16_supported()
        reason = "" if available else f"bf16 is not supported on {_device_words()}"
    else:
        available, reason = True, "bf16 runs on the CPU"
    return (available, reason) if return_reason else available


def get_default_recipe() -> Recipe:
    """The recipe ``te.autocast()`` uses when given none: ``Float8CurrentScaling()`` on
    every device (TE picks by GPU: MXFP8 on Blackwell, delayed scaling before; here
    delayed scaling runs eagerly only, and current scaling compiles everywhere)."""
    return Float8CurrentScaling()
