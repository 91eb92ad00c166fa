"""A fused Triton rotary-embedding kernel for the ``rope`` op on CUDA, both directions.

As torch ops the rotation widens the rotated features, runs ``cos``, ``sin``, two
products, a ``cat`` for each half-rotation, a sum and a narrowing cast as separate
kernels, forward and backward, over every query and key element. Here one kernel reads
each element once (and its pair partner, from the same cache lines), computes ``cos`` and
``sin`` of the token's angles and writes the result once: TE's fused kernel does the
same. ``FUSED`` (fp32 math, one rounding) and the unfused precision (each step rounded
to the data's dtype) are both kept.

The ``rope`` op runs this kernel for real CUDA tensors eagerly and, being an op node,
compiled too: both run the same kernel, so they agree bit for bit. Its bits are not the
torch ops' (Triton's ``cos`` and ``sin``, a contracted multiply-add); tests bound the
difference against float64. The CPU, fake tensors, float64 and any tracing keep the
torch ops.

Triton is imported lazily: this module imports fine on a CPU-only torch without it.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Optional

import torch

from . import triton_support

__all__ = ["available", "eligible", "fused_rope", "unavailable_reason"]

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
ELEMENTS = 4096  # elements a program writes (heads x padded head dim)
WARPS = 4


@functools.cache
def unavailable_reason() -> Optional[str]:
    """Why the kernel cannot run here (None when Triton imports and the kernel builds)."""
    return triton_support.unavailable_reason(_kernels)


def available() -> bool:
    """True when Triton is importable (the kernel is built on first use)."""
    return unavailable_reason() is None


def eligible(t: torch.Tensor, angles: torch.Tensor) -> bool:
    """Whether the rotation of ``t`` by ``angles`` takes the kernel: real CUDA tensors
    (``t`` of fp32, bf16 or fp16, at least 2-D, unit stride in its last dim), angles
    shared by every head (``angles.shape[-2] == 1``), outside tracing."""
    for x in (t, angles):
        if type(x) is not torch.Tensor or x.device.type != "cuda":
            return False
    if t.dtype not in DTYPES or angles.dtype not in DTYPES or t.dim() < 2:
        return False
    if angles.shape[-2] != 1 or t.device != angles.device:
        return False
    return triton_support.launchable_here() and available()


@functools.cache
def _kernels(interpret: bool = False) -> tuple[Any]:
    from . import _rope_triton

    return _rope_triton.build(interpret)


def _rows(t: torch.Tensor) -> tuple[torch.Tensor, int, int, int]:
    """``(t, rows, row stride, head stride)``: ``t`` itself where its leading dims fold
    into one row dim and its last has unit stride, else a contiguous copy."""
    lead = t.shape[:-2]
    rows = math.prod(lead)
    if t.stride(-1) == 1 or t.shape[-1] == 1:
        stride = t.stride(-3) if t.dim() > 2 else 0
        folds = all(
            t.stride(i) == t.stride(i + 1) * t.shape[i + 1] or t.shape[i] == 1
            for i in range(t.dim() - 3)
        )
        if folds:
            return t, rows, stride, t.stride(-2)
    t = t.contiguous()
    return t, rows, (t.stride(-3) if t.dim() > 2 else 0), t.stride(-2)


def fused_rope(
    t: torch.Tensor, angles: torch.Tensor, interleaved: bool, fused: bool, transpose: bool
) -> torch.Tensor:
    """``t`` (``[..., heads, d]``) with its first ``angles.shape[-1]`` features rotated by
    ``angles`` (``[..., 1, d']``, broadcast against ``t``'s leading dims), or by the
    transposed rotation (``transpose``: the backward, ``t`` the output's gradient); a
    fresh contiguous tensor of ``t``'s dtype."""
    fn = "fused_rope"
    triton_support.check_runnable(fn, t.device, unavailable_reason)
    if t.dim() < 2 or angles.shape[-2] != 1:
        raise ValueError(
            f"{fn}: t [..., heads, d] and angles [..., 1, d'] expected, got t "
            f"{tuple(t.shape)}, angles {tuple(angles.shape)}"
        )
    heads, d, rot = t.shape[-2], t.shape[-1], angles.shape[-1]
    if rot % 2 or rot > d:
        raise ValueError(f"{fn}: the angles rotate {rot} features of {d}: must be even and fit")
    out = torch.empty(t.shape, dtype=t.dtype, device=t.device)
    t, rows, row_stride, head_stride = _rows(t)
    if out.numel() == 0:
        return out
    table = angles.expand(*t.shape[:-2], 1, rot).reshape(rows, rot).float().contiguous()
    block_d = triton_next_power_of_2(d)
    block_h = max(1, min(triton_next_power_of_2(heads), ELEMENTS // block_d))
    (kernel,) = _kernels(t.device.type != "cuda")
    constexprs = (
        ("INTERLEAVED", bool(interleaved)),
        ("FUSED", bool(fused)),
        ("TRANSPOSE", bool(transpose)),
        ("BLOCK_H", block_h),
        ("BLOCK_D", block_d),
    )
    grid = (rows, (heads + block_h - 1) // block_h, 1)
    with triton_support.on_its_device(t):
        kernel(
            grid,
            (t, table, out, heads, d, rot, row_stride, head_stride),
            constexprs,
            num_warps=WARPS,
        )
    return out


def triton_next_power_of_2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()
