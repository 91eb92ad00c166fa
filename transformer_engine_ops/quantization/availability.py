"""TE's availability queries (``te.is_fp8_available`` and its kin), and the refusal of a
recipe the GPU in use cannot run natively.

On CUDA the queries answer as TE 2.20 does for the current device, with TE's reasons:
per-tensor FP8 (delayed and current scaling) from compute capability 8.9 (Ada with a
torch for CUDA 12.1+), FP8 block scaling from 9.0 under a torch for CUDA 12.9+, MXFP8
and NVFP4 from 10.0 (MXFP8 not on 12.0+ yet). A module whose weights are on such a CUDA
device refuses, at its forward, a recipe whose quantizers need a format the device
lacks (``RuntimeError`` naming the recipe and TE's reason; TE refuses at
``autocast`` entry, which here cannot know whether the modules run on the CPU).

This package can still run such a recipe there, emulated: its quantizers' reference
kernels, and GEMMs on dequantized operands (several times slower than bf16). One switch allows it, the environment variable
``TEOPS_EMULATE_UNSUPPORTED_RECIPES=1`` (``0`` or unset: refuse); the queries then
answer True with a reason saying the format is emulated. The GPU tests and benchmarks
turn it on to run every recipe on Hopper.

On the CPU every format runs through the reference kernels, which is what they are
for (the CPU is this package's test bed): the queries answer True, and nothing is
refused.
"""

from __future__ import annotations

import functools
import os
from typing import Optional, Union

import torch

from .float8 import Float8CurrentScalingQuantizer, Float8Quantizer
from .float8_block import Float8BlockQuantizer
from .mxfp8 import MXFP8Quantizer
from .nvfp4 import NVFP4Quantizer
from .quantizer import Quantizer
from .recipes import DelayedScalingRequest, Float8CurrentScaling, Recipe

# The environment variable that lets a CUDA device emulate what it cannot run natively.
EMULATION_SWITCH = "TEOPS_EMULATE_UNSUPPORTED_RECIPES"

# Each format TE asks the device about, and its name in this package's messages.
FORMAT_NAMES = {
    "fp8": "FP8 per-tensor scaling",
    "fp8_block": "FP8 block scaling",
    "mxfp8": "MXFP8 block scaling",
    "nvfp4": "NVFP4 block scaling",
}

# A CUDA device as the support rules read it: compute capability, name, and the CUDA
# version torch was built for ((0, 0) when unknown, e.g. a ROCm build).
CudaTarget = tuple[tuple[int, int], str, tuple[int, int]]


# What the CPU answers for a compute capability: it runs every format TE runs on its
# newest data-center GPU (Blackwell, 10.0), emulated. TE's own tests gate features on
# the capability (``sm_80plus``, FP8 attention on 9.0 to 11.x), and on the CPU, the
# test bed, no format is unavailable.
CPU_COMPUTE_CAPABILITY = (10, 0)


def get_device_compute_capability() -> tuple[int, int]:
    """The current CUDA device's compute capability ``(major, minor)``, as TE's; without
    a CUDA device, :data:`CPU_COMPUTE_CAPABILITY`, the capability whose formats the CPU
    runs (all of them, emulated)."""
    if not torch.cuda.is_available():
        return CPU_COMPUTE_CAPABILITY
    major, minor = torch.cuda.get_device_capability()
    return major, minor


def _cuda_target(device_index: Optional[int] = None) -> Optional[CudaTarget]:
    """CUDA device ``device_index`` (None: the current one) as the support rules read
    it, or None without CUDA (the CPU)."""
    if not torch.cuda.is_available():
        return None
    if device_index is None:
        device_index = torch.cuda.current_device()
    return _device_target(device_index)


@functools.cache
def _device_target(device_index: int) -> CudaTarget:
    major, minor = torch.cuda.get_device_capability(device_index)
    version = torch.version.cuda
    cuda = tuple(int(p) for p in version.split(".")[:2]) if version else (0, 0)
    return (major, minor), torch.cuda.get_device_name(device_index), (cuda[0], cuda[1])


def _native(fmt: str, target: CudaTarget) -> tuple[bool, str]:
    """TE 2.20's answer for ``fmt`` on ``target``, with its reason (empty if it runs).
    TE's Ada check of the cuBLASLt version (12.1.3) is left out: torch's wheels for CUDA
    12.1 and later bring a newer one. CUDA versions compare as numbers, not as TE's
    ``float(torch.version.cuda)`` (which reads 12.10 as 12.1)."""
    capability, _, cuda = target
    if fmt == "fp8":
        if capability >= (9, 0):
            return True, ""
        if capability < (8, 9):
            return False, "Device compute capability 8.9 or higher required for FP8 execution."
        if cuda < (12, 1):
            return False, "Cuda version 12.1 or higher required for FP8 execution on Ada."
        return True, ""
    if fmt == "mxfp8":
        if capability >= (12, 0):
            return (
                False,
                "MXFP8 (for all gemm layouts) is not supported on 12.0+ architectures yet.",
            )
        if capability >= (10, 0):
            return True, ""
        return False, "Device compute capability 10.0 or higher required for MXFP8 execution."
    if fmt == "nvfp4":
        if capability >= (10, 0):
            return True, ""
        return False, "Device compute capability 10.0 or higher required for NVFP4 execution."
    if fmt == "fp8_block":
        if capability >= (9, 0) and cuda >= (12, 9):
            return True, ""
        return (
            False,
            "FP8 block scaled GEMM requires compute capability 9.0 or higher and CUDA >= 12.9.",
        )
    raise ValueError(f"unknown format {fmt!r}; expected one of {sorted(FORMAT_NAMES)}")


def emulation_enabled() -> bool:
    """Whether ``TEOPS_EMULATE_UNSUPPORTED_RECIPES`` lets a CUDA device emulate the
    formats it cannot run natively (``1``; ``0`` or unset: it refuses them)."""
    value = os.environ.get(EMULATION_SWITCH, "")
    if value in ("", "0"):
        return False
    if value == "1":
        return True
    raise ValueError(
        f"{EMULATION_SWITCH}={value!r}: expected 1 (emulate the recipes this GPU cannot "
        "run natively) or 0 (refuse them)"
    )


def _device_words(target: Optional[CudaTarget]) -> str:
    if target is None:
        return "the CPU"
    (major, minor), name, _ = target
    return f"{name} (compute capability {major}.{minor})"


def format_support(fmt: str, device_index: Optional[int] = None) -> tuple[bool, str]:
    """Whether ``fmt`` (a key of :data:`FORMAT_NAMES`) runs on CUDA device
    ``device_index`` (None: the current one; the CPU without CUDA), and why: TE's answer
    on CUDA, True when emulation is switched on (the reason says so), True on the CPU."""
    target = _cuda_target(device_index)
    name = FORMAT_NAMES[fmt]
    if target is None:
        return True, (
            f"{name} runs emulated on the CPU (this package's reference kernels: quantize, "
            "dequantize, multiply in higher precision)"
        )
    native, reason = _native(fmt, target)
    if native:
        return True, ""
    if emulation_enabled():
        return True, (
            f"{name} runs emulated on {_device_words(target)} ({EMULATION_SWITCH}=1); "
            f"natively: {reason}"
        )
    return False, reason


def _query(fmt: str, return_reason: bool) -> Union[bool, tuple[bool, str]]:
    available, reason = format_support(fmt)
    return (available, reason) if return_reason else available


def is_fp8_available(return_reason: bool = False) -> Union[bool, tuple[bool, str]]:
    """Per-tensor FP8 (delayed and current scaling): TE's answer on CUDA (compute
    capability 8.9 or newer); True on the CPU."""
    return _query("fp8", return_reason)


def is_mxfp8_available(return_reason: bool = False) -> Union[bool, tuple[bool, str]]:
    """MXFP8: TE's answer on CUDA (compute capability 10.x or 11.x); True on the CPU."""
    return _query("mxfp8", return_reason)


def is_fp8_block_scaling_available(return_reason: bool = False) -> Union[bool, tuple[bool, str]]:
    """FP8 block scaling: TE's answer on CUDA (compute capability 9.0 or newer under a
    torch for CUDA 12.9+); True on the CPU."""
    return _query("fp8_block", return_reason)


def is_nvfp4_available(return_reason: bool = False) -> Union[bool, tuple[bool, str]]:
    """NVFP4: TE's answer on CUDA (compute capability 10.0 or newer); True on the CPU."""
    return _query("nvfp4", return_reason)


def is_bf16_available(return_reason: bool = False) -> Union[bool, tuple[bool, str]]:
    """Whether bf16 compute runs here: torch's answer for the current CUDA device (TE's
    rule), and True on the CPU, where torch computes bf16."""
    if torch.cuda.is_available():
        available = torch.cuda.is_bf16_supported()
        reason = "" if available else f"bf16 is not supported on {_device_words(_cuda_target())}"
    else:
        available, reason = True, "bf16 runs on the CPU"
    return (available, reason) if return_reason else available


def get_default_recipe() -> Recipe:
    """The recipe ``te.autocast()`` uses when given none: ``Float8CurrentScaling()`` on
    every device (TE picks by GPU: MXFP8 on Blackwell, delayed scaling before; here
    delayed scaling runs eagerly only, and current scaling compiles everywhere)."""
    return Float8CurrentScaling()


# --- the refusal of a recipe a module's device cannot run ------------------------------


def quantizer_format(quantizer: Quantizer) -> Optional[str]:
    """The format (a key of :data:`FORMAT_NAMES`) TE asks the device about for
    ``quantizer``; None for a quantizer of no such format."""
    if isinstance(quantizer, (Float8Quantizer, Float8CurrentScalingQuantizer)):
        return "fp8"
    if isinstance(quantizer, DelayedScalingRequest):  # a module's own Float8Quantizer
        return "fp8"
    if isinstance(quantizer, Float8BlockQuantizer):
        return "fp8_block"
    if isinstance(quantizer, MXFP8Quantizer):
        return "mxfp8"
    if isinstance(quantizer, NVFP4Quantizer):
        return "nvfp4"
    return None


@torch.compiler.assume_constant_result
def recipe_refusal(needs: tuple[tuple[str, str], ...], device_index: int) -> str:
    """Why a module whose weights are on CUDA device ``device_index`` cannot run a
    recipe whose quantizers need the formats ``needs`` (``(format, what needs it)``
    pairs: ``("mxfp8", "MXFP8BlockScaling")``, ``("nvfp4", "CustomRecipe (its weight
    quantizer NVFP4Quantizer)")``), or ``""`` where it can (natively, or emulated with
    the switch on). A constant while tracing: the device and the switch are read when
    a graph is traced."""
    for fmt, owner in needs:
        available, reason = format_support(fmt, device_index)
        if not available:
            return (
                f"{owner} cannot run natively on {_device_words(_cuda_target(device_index))}: "
                f"{reason} Set {EMULATION_SWITCH}=1 to run it emulated (reference quantize "
                "kernels and GEMMs on dequantized operands, several times slower than bf16)"
            )
    return ""
