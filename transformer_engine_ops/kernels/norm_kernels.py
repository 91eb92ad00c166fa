"""Fused Triton RMSNorm / LayerNorm kernels on CUDA, forward and backward.

The reference norm (``layernorm._norm_forward`` / ``_norm_backward`` on torch ops)
widens the input to fp32 and runs each step of the formula as its own ATen kernel: in
a profile of the H200's compiled Llama-8B-sized layer the two RMSNorms cost ~1.5 ms a
train step of copies, ``mul``, ``sum``, ``mean``, ``pow`` and ``add`` kernels, against
~0.19 ms for Inductor's fused RMSNorm in a plain torch block. Here the forward reads each
row once in its storage dtype, computes in fp32 and writes the output once rounded to
the requested dtype, with the row's ``mu`` (LayerNorm) and ``rsigma``; the backward
reads ``dy`` (plus ``dy_extra``), ``x`` and the statistics once, writes ``dx`` once in
``x``'s dtype (no fp32 copy for a cast to read) and sums ``dgamma``/``dbeta`` without
atomics, in per-program partial sums reduced by one ``sum`` (the same rows give the same
bits).

The kernels are what ``_norm_forward``/``_norm_backward`` run on CUDA, and those
functions are ``@exact`` pieces: eagerly they run the kernel, and a call lowered into
Inductor records them as one op that runs the same kernel, so compiled equals eager bit
for bit. The CPU, fake tensors, tracing, float64 and rows longer than
:data:`MAX_HIDDEN` keep the reference ops. The kernels' bits are not the reference's
(other summation orders, Triton's ``rsqrt``); tests bound the difference against a
float64 reference (``tests/ops/test_norm_kernels.py``).

Triton is imported lazily: this module imports fine on a CPU-only torch without it.
"""

from __future__ import annotations

import functools
from typing import Any, Optional

import torch

from . import triton_support

__all__ = [
    "DTYPES",
    "MAX_HIDDEN",
    "available",
    "eligible",
    "fused_norm_backward",
    "fused_norm_forward",
    "unavailable_reason",
]

DTYPES = (torch.float32, torch.bfloat16, torch.float16)

# A row is one block of registers (no loop over column chunks): up to 16384 columns,
# 16 warps holding 32 fp32 values per thread and tensor. Longer rows take the reference.
MAX_HIDDEN = 16384

# Tensors the kernels take: plain ones and the modules' norm weights, no subclass (fake,
# functional, quantized or distributed tensors).
_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)

# The backward's program count: about four per SM of an H200 (132 SMs), fixed so the
# partial sums' grouping, and so the bits, depend on the row count only.
BACKWARD_PROGRAMS = 528


@functools.cache
def unavailable_reason() -> Optional[str]:
    """Why the kernels cannot run here (None when Triton imports and kernels build)."""
    return triton_support.unavailable_reason(_kernels)


def available() -> bool:
    """True when Triton is importable (the kernels are built on first use)."""
    return unavailable_reason() is None


def eligible(
    x: torch.Tensor, *tensors: Optional[torch.Tensor], out_dtype: torch.dtype = torch.float32
) -> bool:
    """Whether a norm of the rows of ``x`` (2-D, ``hidden`` from 1 to
    :data:`MAX_HIDDEN`) with the other ``tensors`` (None for those absent) into
    ``out_dtype`` takes the kernels: real CUDA tensors (or parameters) of fp32, bf16 or
    fp16 outside tracing. Under ``torch.compile``, fake tensors, functionalization or
    any dispatch mode the reference ops run (they trace; a kernel launch would not); a
    lowered call records the piece that calls this as one op, whose real kernel then
    runs here as eager does."""
    if out_dtype not in DTYPES:
        return False
    for t in (x, *tensors):
        if t is None:
            continue
        if type(t) not in _PLAIN_TENSORS or t.device.type != "cuda" or t.dtype not in DTYPES:
            return False
    # Sizes after the types: a traced tensor's symbolic size is never compared (a guard).
    if x.dim() != 2 or not 1 <= x.shape[1] <= MAX_HIDDEN:
        return False
    return triton_support.launchable_here() and available()


@functools.cache
def _kernels(interpret: bool = False) -> tuple[Any, Any]:
    """(forward, backward) launchers, compiled or for Triton's interpreter."""
    from . import _norm_triton

    return _norm_triton.build(interpret)


@functools.cache
def _launch_shape(hidden: int) -> tuple[int, int]:
    """``(BLOCK, warps)`` for rows of ``hidden``: the row in one power-of-2 block, a
    warp per 256 columns (1 to 16)."""
    block = max(16, 1 << (hidden - 1).bit_length())
    return block, min(max(block // 256, 1), 16)


def _check(fn: str, x: torch.Tensor, named: dict[str, Optional[torch.Tensor]]) -> int:
    """``hidden`` of a norm call on ``x``; a bad argument raises naming it. ``named``
    maps each other argument's name to it (None where absent); those named ``weight``,
    ``bias``, ``mu``, ``rsigma`` must be shaped as the reference's, the rest as ``x``."""
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        raise ValueError(f"{fn}: x must be a 2-D tensor (rows, hidden), got {_shape(x)}")
    rows, hidden = x.shape
    if not 1 <= hidden <= MAX_HIDDEN:
        raise ValueError(f"{fn}: x's hidden size {hidden} is outside 1..{MAX_HIDDEN}")
    expected = {"weight": (hidden,), "bias": (hidden,), "mu": (rows,), "rsigma": (rows,)}
    for name, t in {"x": x, **named}.items():
        if t is None:
            continue
        if t.dtype not in DTYPES:
            raise TypeError(f"{fn}: {name} is {t.dtype}; expected fp32, bf16 or fp16")
        if t.device != x.device:
            raise ValueError(f"{fn}: {name} is on {t.device}, x on {x.device}")
        shape = expected.get(name, (rows, hidden))
        if tuple(t.shape) != shape:
            raise ValueError(f"{fn}: {name} has shape {_shape(t)}, expected {shape}")
    triton_support.check_runnable(fn, x.device, unavailable_reason)
    return hidden


def _shape(t: Any) -> str:
    return str(tuple(t.shape)) if isinstance(t, torch.Tensor) else type(t).__name__


def _aligned(t: torch.Tensor) -> torch.Tensor:
    """``t`` contiguous at a 16-byte-aligned address. Triton compiles another kernel for
    an unaligned pointer, whose register layout, and so the order of a row's sums, may
    differ: eager and a compiled graph must run the same kernel whatever their buffers'
    offsets (a fresh allocation is aligned; only a view at an odd offset is copied)."""
    t = t.contiguous()
    return t if t.data_ptr() % 16 == 0 else t.clone()


def fused_norm_forward(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor],
    layernorm: bool,
    eps: float,
    zero_centered_gamma: bool,
    out_dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(y, mu, rsigma)`` of the rows of ``x``, as ``layernorm._norm_forward``: fp32
    math, ``y`` in ``out_dtype``, ``mu`` and ``rsigma`` fp32 per row (``mu`` 0-element
    for RMSNorm); ``gamma`` is ``weight`` (plus 1 with ``zero_centered_gamma``) and
    ``bias`` is added in fp32."""
    fn = "fused_norm_forward"
    if out_dtype not in DTYPES:
        raise TypeError(f"{fn}: out_dtype {out_dtype} is not fp32, bf16 or fp16")
    hidden = _check(fn, x, {"weight": weight, "bias": bias})
    rows = x.shape[0]
    y = torch.empty((rows, hidden), dtype=out_dtype, device=x.device)
    mu = torch.empty(rows if layernorm else 0, dtype=torch.float32, device=x.device)
    rsigma = torch.empty(rows, dtype=torch.float32, device=x.device)
    if rows == 0:
        return y, mu, rsigma
    forward, _ = _kernels(x.device.type != "cuda")
    block, warps = _launch_shape(hidden)
    x = _aligned(x)
    args = (
        x,
        _aligned(weight),
        x if bias is None else _aligned(bias),  # unread without HAS_BIAS
        y,
        mu if layernorm else rsigma,  # unwritten for RMSNorm
        rsigma,
        hidden,
        float(eps),
    )
    constexprs = (
        ("LAYERNORM", bool(layernorm)),
        ("HAS_BIAS", bias is not None),
        ("ZERO_CENTERED", bool(zero_centered_gamma)),
        ("BLOCK", block),
    )
    with triton_support.on_its_device(x):
        forward((rows, 1, 1), args, constexprs, num_warps=warps)
    return y, mu, rsigma


def fused_norm_backward(
    dy: torch.Tensor,
    dy_extra: Optional[torch.Tensor],
    x: torch.Tensor,
    weight: torch.Tensor,
    mu: Optional[torch.Tensor],
    rsigma: torch.Tensor,
    zero_centered_gamma: bool,
    need_dgrad: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dx, dgamma, dbeta)`` for the rows ``x`` normalized with ``mu`` (LayerNorm;
    None for RMSNorm) and ``rsigma``, as ``layernorm._norm_backward``: fp32 math, ``dx``
    rounded once to ``x``'s dtype and shaped as ``x`` (0-element without
    ``need_dgrad``), ``dgamma``/``dbeta`` fp32 of shape ``(hidden,)``; the output
    gradient is ``dy``, plus ``dy_extra`` (summed in fp32)."""
    fn = "fused_norm_backward"
    named = {"dy": dy, "dy_extra": dy_extra, "weight": weight, "mu": mu, "rsigma": rsigma}
    hidden = _check(fn, x, named)
    rows = x.shape[0]
    dx = torch.empty((rows, hidden) if need_dgrad else 0, dtype=x.dtype, device=x.device)
    if rows == 0:
        zeros = torch.zeros(hidden, dtype=torch.float32, device=x.device)
        return dx, zeros, zeros.clone()
    rows_per_program = -(-rows // BACKWARD_PROGRAMS)
    programs = -(-rows // rows_per_program)
    partial = torch.empty((2, programs, hidden), dtype=torch.float32, device=x.device)
    _, backward = _kernels(x.device.type != "cuda")
    block, warps = _launch_shape(hidden)
    dy, rsigma = _aligned(dy), _aligned(rsigma)
    args = (
        dy,
        dy if dy_extra is None else _aligned(dy_extra),  # unread without HAS_DY_EXTRA
        _aligned(x),
        _aligned(weight),
        rsigma if mu is None else _aligned(mu),  # unread for RMSNorm
        rsigma,
        dx if need_dgrad else partial,  # unwritten without NEED_DGRAD
        partial[0],
        partial[1],
        rows,
        hidden,
        rows_per_program,
    )
    constexprs = (
        ("LAYERNORM", mu is not None),
        ("HAS_DY_EXTRA", dy_extra is not None),
        ("ZERO_CENTERED", bool(zero_centered_gamma)),
        ("NEED_DGRAD", bool(need_dgrad)),
        ("BLOCK", block),
    )
    with triton_support.on_its_device(x):
        backward((programs, 1, 1), args, constexprs, num_warps=warps)
    # Two reductions, not one of both: a piece returns fresh tensors, not views of one.
    return dx, partial[0].sum(0), partial[1].sum(0)
