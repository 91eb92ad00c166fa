"""Fused Triton activation kernels for LayerNormMLP on CUDA, forward and backward.

The reference activation (``layernorm_mlp.activation_forward`` / ``activation_backward``
on torch ops) widens fc1's 16-bit output to fp32, runs each step of the formula as its
own ATen kernel and narrows the result: on the H200's Llama-8B-sized layer that was
~5.6 ms a train step of ``mul``, ``copy_``, ``sigmoid``, ``add`` and ``sub`` kernels
(docs/transformer.md). Here one kernel reads the input once in its storage dtype,
computes in fp32 (as TE's kernels do) and writes the output once, rounded to the
requested dtype: the forward ``y = f(x)`` (gated: ``f(a) * b`` of the two halves of the
last dim), the backward ``dx = dy * f'(x)`` (gated: both halves' gradients into one
buffer, no ``cat``). Every activation LayerNormMLP takes is covered (:data:`CODES`).

The kernel is what ``activation_forward``/``activation_backward`` run on CUDA, and those
functions are the op's ``@exact`` pieces: eagerly they run the kernel, and a call
lowered into Inductor records them as one op that runs the same kernel, so compiled
equals eager bit for bit. The CPU, fake tensors, tracing and float64 keep the reference
ops. The kernel's bits are not the reference's (its ``exp`` and the reference's
``sigmoid``/``tanh`` round differently); tests bound the difference against a float64
reference (``tests/ops/test_activation_kernels.py``).

Triton is imported lazily: this module imports fine on a CPU-only torch without it.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Optional

import torch

from . import triton_support

__all__ = [
    "CODES",
    "available",
    "eligible",
    "fused_activation_backward",
    "fused_activation_forward",
    "unavailable_reason",
]

# name -> (the kernels' ACT code, gated): _activation_triton's GELU, RELU, QGELU, SRELU,
# SILU, SIGMOID (glu's gate) and CLAMPED_SILU.
CODES: dict[str, tuple[int, bool]] = {
    "gelu": (0, False),
    "relu": (1, False),
    "qgelu": (2, False),
    "srelu": (3, False),
    "silu": (4, False),
    "geglu": (0, True),
    "reglu": (1, True),
    "qgeglu": (2, True),
    "sreglu": (3, True),
    "swiglu": (4, True),
    "glu": (5, True),
    "clamped_swiglu": (6, True),
}
DTYPES = (torch.float32, torch.bfloat16, torch.float16)

# One program per row and BLOCK output columns: a row of the Llama-8B layer's SwiGLU
# (14336 columns) is 14 programs; rows go on the grid's first axis (up to 2**31 - 1),
# column blocks on the second (at most 65535: 67M columns).
BLOCK = 1024
WARPS = 4


@functools.cache
def unavailable_reason() -> Optional[str]:
    """Why the kernels cannot run here (None when Triton imports and kernels build)."""
    return triton_support.unavailable_reason(_kernels)


def available() -> bool:
    """True when Triton is importable (the kernels are built on first use)."""
    return unavailable_reason() is None


def eligible(out_dtype: torch.dtype, *tensors: torch.Tensor) -> bool:
    """Whether an activation of ``tensors`` into ``out_dtype`` takes the kernel: real
    CUDA tensors of fp32, bf16 or fp16 outside tracing. Under ``torch.compile``, fake
    tensors, functionalization or any dispatch mode the reference ops run (they trace; a
    kernel launch would not); a lowered call records the piece that calls this as one
    op, whose real kernel then runs here as eager does."""
    if out_dtype not in DTYPES:
        return False
    for x in tensors:
        if type(x) is not torch.Tensor or x.device.type != "cuda" or x.dtype not in DTYPES:
            return False
    return triton_support.launchable_here() and available()


@functools.cache
def _kernels(interpret: bool = False) -> tuple[Any, Any]:
    """(forward, backward) launchers, compiled or for Triton's interpreter."""
    from . import _activation_triton

    return _activation_triton.build(interpret)


@functools.cache
def _constexprs(name: str, block: int) -> tuple[tuple[str, Any], ...]:
    act, gated = CODES[name]
    return (("ACT", act), ("GATED", gated), ("BLOCK", block))


def _check(
    fn: str,
    name: str,
    x: torch.Tensor,
    out_dtype: torch.dtype,
    config: tuple[int, int],
    dy: Optional[torch.Tensor] = None,
) -> tuple[bool, int]:
    """``(gated, output columns)`` of an activation call (a backward's with ``dy``); a bad
    argument raises naming it."""
    if len(config) != 2 or any(type(n) is not int or n < 1 or n & (n - 1) for n in config):
        raise ValueError(
            f"{fn}: config={config!r}; expected (columns per program, warps), both powers of 2"
        )
    if name not in CODES:
        raise ValueError(f"{fn}: unknown activation {name!r}; expected one of {', '.join(CODES)}")
    if out_dtype not in DTYPES:
        raise TypeError(f"{fn}: out_dtype {out_dtype} is not fp32, bf16 or fp16")
    for t in (x,) if dy is None else (x, dy):
        if t.dtype not in DTYPES:
            raise TypeError(f"{fn}: cannot take a {t.dtype} tensor (fp32, bf16 or fp16)")
        if t.device != x.device:
            raise ValueError(f"{fn}: tensors on {x.device} and {t.device}")
    if x.dim() < 1:
        raise ValueError(f"{fn}: needs at least one dim, got a 0-dim tensor")
    gated = CODES[name][1]
    cols = x.shape[-1]
    if gated and cols % 2:
        raise ValueError(
            f"{fn}: {name} gates one half of the last dim with the other; "
            f"x {tuple(x.shape)} has an odd last dim"
        )
    h = cols // 2 if gated else cols
    if dy is not None and tuple(dy.shape) != (*x.shape[:-1], h):
        raise ValueError(
            f"{fn}: dy {tuple(dy.shape)} does not fit x {tuple(x.shape)} for {name} "
            f"(expected {(*x.shape[:-1], h)})"
        )
    triton_support.check_runnable(fn, x.device, unavailable_reason)
    return gated, h


def _launch(
    kernel: Any, name: str, rows: int, cols: int, args: tuple[Any, ...], config: tuple[int, int]
) -> None:
    block, warps = config
    if rows == 0 or cols == 0:
        return
    grid = (rows, (cols + block - 1) // block, 1)
    kernel(grid, args, _constexprs(name, block), num_warps=warps)


def fused_activation_forward(
    name: str,
    x: torch.Tensor,
    out_dtype: torch.dtype,
    limit: float = 7.0,
    alpha: float = 1.702,
    offset: float = 1.0,
    *,
    config: tuple[int, int] = (BLOCK, WARPS),
) -> torch.Tensor:
    """``name``'s activation of ``x`` in fp32, rounded once to ``out_dtype``: shaped as
    ``x`` with the last dim halved for a gated activation. ``limit``, ``alpha`` and
    ``offset`` are clamped_swiglu's (the others do not read them); ``config`` is the
    launch's (columns per program, warps), for ``benchmarks.activation_kernels``."""
    gated, h = _check("fused_activation_forward", name, x, out_dtype, config)
    out = torch.empty((*x.shape[:-1], h), dtype=out_dtype, device=x.device)
    rows = math.prod(x.shape[:-1])
    forward, _ = _kernels(x.device.type != "cuda")
    with triton_support.on_its_device(x):
        args = (x.contiguous(), out, h, float(limit), float(alpha), float(offset))
        _launch(forward, name, rows, h, args, config)
    return out


def fused_activation_backward(
    name: str,
    dy: torch.Tensor,
    x: torch.Tensor,
    out_dtype: torch.dtype,
    limit: float = 7.0,
    alpha: float = 1.702,
    offset: float = 1.0,
    *,
    config: tuple[int, int] = (BLOCK, WARPS),
) -> torch.Tensor:
    """The gradient of :func:`fused_activation_forward` at ``x`` given the output's
    gradient ``dy``, computed in fp32 and rounded once to ``out_dtype``: shaped as ``x``
    (``config`` as there)."""
    gated, h = _check("fused_activation_backward", name, x, out_dtype, config, dy)
    dx = torch.empty(x.shape, dtype=out_dtype, device=x.device)
    rows = math.prod(x.shape[:-1])
    _, backward = _kernels(x.device.type != "cuda")
    with triton_support.on_its_device(x):
        args = (dy.contiguous(), x.contiguous(), dx, h, float(limit), float(alpha), float(offset))
        _launch(backward, name, rows, h, args, config)
    return dx
