"""The Triton kernels behind ``activation_kernels`` (imported only when Triton is present).

One forward and one backward kernel cover every activation: ``ACT`` picks the unary
function (or the gate of a gated one), ``GATED`` whether it gates the first half of the
input's last dim with the second. Each program reads one row's ``BLOCK`` columns in
their storage dtype, computes in fp32 (TE's kernels do the same) and stores the result
rounded once to the output's dtype, so no widened copy of the input or the output is
ever materialized. Formulas are the reference's (``layernorm_mlp._unary``), written
with NaN-keeping selects where the reference's ``relu``/``clamp`` keep a NaN.
"""

from __future__ import annotations

from typing import Any

import triton
import triton.language as tl

from ._triton_launch import launchers

# ACT codes (activation_kernels.CODES maps each activation name to one, and GATED).
GELU = tl.constexpr(0)
RELU = tl.constexpr(1)
QGELU = tl.constexpr(2)
SRELU = tl.constexpr(3)
SILU = tl.constexpr(4)
SIGMOID = tl.constexpr(5)  # glu's gate
CLAMPED_SILU = tl.constexpr(6)  # clamped_swiglu (gated only)

# Numeric constants are literals in the kernels (sqrt(2 / pi) = 0.7978845608028654,
# GELU's 0.044715, QuickGELU's 1.702): a constexpr global times a tensor is no tensor
# under Triton's interpreter.


# Divisions are Triton's fp32 ``/`` (approximate, within 2 ulp; a denominator past
# 2**126 gives 0, below fp32's smallest normal result anyway) rather than ``div_rn``'s
# longer sequence: the kernels are memory bound only while their arithmetic stays short.


@triton.jit
def _sigmoid(x):
    # 1 / (1 + e^-x): +-Inf give 0 and 1, NaN stays NaN.
    return 1.0 / (1.0 + tl.exp(-x))


@triton.jit
def _value_and_slope(x, ACT: tl.constexpr):  # noqa: N803
    """``(f(x), f'(x))`` in fp32 (``layernorm_mlp._unary``'s formulas)."""
    if ACT == GELU:  # the tanh approximation, tanh(z) = 1 - 2 / (e^2z + 1)
        inner = 0.7978845608028654 * (x + 0.044715 * x * x * x)
        t = 1.0 - 2.0 / (tl.exp(2.0 * inner) + 1.0)
        f = 0.5 * x * (1.0 + t)
        slope = 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * x * x)
        d = 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * slope
    elif ACT == RELU:
        f = tl.where(x < 0.0, 0.0, x)  # a NaN stays NaN, as torch.relu's
        d = tl.where(x > 0.0, 1.0, 0.0)
    elif ACT == QGELU:
        s = _sigmoid(1.702 * x)
        f = x * s
        d = s + 1.702 * x * s * (1.0 - s)
    elif ACT == SRELU:
        r = tl.where(x < 0.0, 0.0, x)
        f = r * r
        d = 2.0 * r
    elif ACT == SILU:
        s = _sigmoid(x)
        f = x * s
        d = s + x * s * (1.0 - s)
    else:  # SIGMOID
        f = _sigmoid(x)
        d = f * (1.0 - f)
    return f, d


@triton.jit
def _clamped(a, b, limit):
    """clamped_swiglu's gate clamped above and linear half clamped to [-limit, limit]
    (NaNs kept, as torch.clamp keeps them)."""
    g = tl.where(a > limit, limit, a)
    lin = tl.where(b > limit, limit, tl.where(b < -limit, -limit, b))
    return g, lin


@triton.jit
def _forward(
    x_ptr,
    out_ptr,
    H,  # noqa: N803 - the output's last dim (half the input's when gated)
    limit,
    alpha,
    offset,
    ACT: tl.constexpr,  # noqa: N803
    GATED: tl.constexpr,  # noqa: N803
    BLOCK: tl.constexpr,  # noqa: N803
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < H
    if GATED:
        x_row = x_ptr + row * (2 * H)
        a = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
        b = tl.load(x_row + H + cols, mask=mask, other=0.0).to(tl.float32)
        if ACT == CLAMPED_SILU:
            g, lin = _clamped(a, b, limit)
            y = g * _sigmoid(alpha * g) * (lin + offset)
        else:
            fa, _ = _value_and_slope(a, ACT)
            y = fa * b
    else:
        x = tl.load(x_ptr + row * H + cols, mask=mask, other=0.0).to(tl.float32)
        y, _ = _value_and_slope(x, ACT)
    tl.store(out_ptr + row * H + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _backward(
    dy_ptr,
    x_ptr,
    dx_ptr,
    H,  # noqa: N803 - dy's last dim (half x's when gated)
    limit,
    alpha,
    offset,
    ACT: tl.constexpr,  # noqa: N803
    GATED: tl.constexpr,  # noqa: N803
    BLOCK: tl.constexpr,  # noqa: N803
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < H
    dy = tl.load(dy_ptr + row * H + cols, mask=mask, other=0.0).to(tl.float32)
    if GATED:
        x_row = x_ptr + row * (2 * H)
        a = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
        b = tl.load(x_row + H + cols, mask=mask, other=0.0).to(tl.float32)
        if ACT == CLAMPED_SILU:
            g, lin = _clamped(a, b, limit)
            s = _sigmoid(alpha * g)
            dg = (s + alpha * g * s * (1.0 - s)) * tl.where(a <= limit, 1.0, 0.0)
            dlin = g * s * tl.where((b >= -limit) & (b <= limit), 1.0, 0.0)
            da = dy * (lin + offset) * dg
            db = dy * dlin
        else:
            fa, dfa = _value_and_slope(a, ACT)
            da = dy * b * dfa
            db = dy * fa
        dx_row = dx_ptr + row * (2 * H)
        tl.store(dx_row + cols, da.to(dx_ptr.dtype.element_ty), mask=mask)
        tl.store(dx_row + H + cols, db.to(dx_ptr.dtype.element_ty), mask=mask)
    else:
        x = tl.load(x_ptr + row * H + cols, mask=mask, other=0.0).to(tl.float32)
        _, d = _value_and_slope(x, ACT)
        tl.store(dx_ptr + row * H + cols, (dy * d).to(dx_ptr.dtype.element_ty), mask=mask)


def build(interpret: bool) -> tuple[Any, Any]:
    """Launchers of (forward, backward): ``launch(grid, args, constexprs, num_warps=...)``,
    compiled or for Triton's interpreter (CPU tensors)."""
    return launchers((_forward, _backward), interpret)  # type: ignore[return-value]
