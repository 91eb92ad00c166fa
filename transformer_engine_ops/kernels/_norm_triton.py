"""The Triton kernels behind ``norm_kernels`` (imported only when Triton is present).

The forward runs one program per row: it reads the row once in its storage dtype, keeps
it in registers for the statistics (LayerNorm's variance is the mean of the squared
centered values, as the reference computes it, not ``E[x^2] - E[x]^2``), and writes the
normalized row once, rounded to the output dtype, with the row's ``mu`` and ``rsigma``.
The backward runs a fixed number of programs, each over a contiguous group of rows: per
row it writes ``dx`` (rounded once to ``x``'s dtype) and adds ``dy * xhat`` and ``dy`` into
fp32 column accumulators, which it stores as its row of two ``[programs, hidden]``
buffers; the caller sums each over programs. No atomics: the same rows give the
same bits. Formulas are the reference's (``layernorm._norm_forward`` /
``_norm_backward``); lanes past the row's end are masked out of every reduction.
"""

from __future__ import annotations

from typing import Any

import triton
import triton.language as tl

from ._triton_launch import launchers


@triton.jit
def _forward(
    x_ptr,
    w_ptr,
    b_ptr,  # read only with HAS_BIAS
    y_ptr,
    mu_ptr,  # written only with LAYERNORM
    rsigma_ptr,
    H,  # noqa: N803 - hidden (the row length)
    eps,
    LAYERNORM: tl.constexpr,  # noqa: N803
    HAS_BIAS: tl.constexpr,  # noqa: N803
    ZERO_CENTERED: tl.constexpr,  # noqa: N803
    BLOCK: tl.constexpr,  # noqa: N803 - a power of 2 >= H
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < H
    x = tl.load(x_ptr + row * H + cols, mask=mask, other=0.0).to(tl.float32)
    if LAYERNORM:
        mu = tl.sum(x, axis=0) / H
        centered = tl.where(mask, x - mu, 0.0)
        tl.store(mu_ptr + row, mu)
    else:
        centered = x
    rsigma = tl.rsqrt(tl.sum(centered * centered, axis=0) / H + eps)
    tl.store(rsigma_ptr + row, rsigma)
    gamma = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    if ZERO_CENTERED:
        gamma = gamma + 1.0
    y = centered * rsigma * gamma
    if HAS_BIAS:
        y = y + tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * H + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _backward(
    dy_ptr,
    dy_extra_ptr,  # read only with HAS_DY_EXTRA
    x_ptr,
    w_ptr,
    mu_ptr,  # read only with LAYERNORM
    rsigma_ptr,
    dx_ptr,  # written only with NEED_DGRAD
    dgamma_partial_ptr,  # [programs, H] fp32: each program's column sums of dy * xhat
    dbeta_partial_ptr,  # [programs, H] fp32: each program's column sums of dy
    rows,
    H,  # noqa: N803 - hidden (the row length)
    rows_per_program,
    LAYERNORM: tl.constexpr,  # noqa: N803
    HAS_DY_EXTRA: tl.constexpr,  # noqa: N803
    ZERO_CENTERED: tl.constexpr,  # noqa: N803
    NEED_DGRAD: tl.constexpr,  # noqa: N803
    BLOCK: tl.constexpr,  # noqa: N803 - a power of 2 >= H
):
    program = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < H
    gamma = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    if ZERO_CENTERED:
        gamma = gamma + 1.0
    dgamma = tl.zeros([BLOCK], dtype=tl.float32)
    dbeta = tl.zeros([BLOCK], dtype=tl.float32)
    first = program * rows_per_program
    # Row pointers advance by H per row (64-bit pointers: no 32-bit row * H product).
    start = first.to(tl.int64) * H
    dy_ptr += start
    dy_extra_ptr += start
    x_ptr += start
    dx_ptr += start
    mu_ptr += first
    rsigma_ptr += first
    for _ in range(0, tl.minimum(rows_per_program, rows - first)):
        dy = tl.load(dy_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        if HAS_DY_EXTRA:
            dy = dy + tl.load(dy_extra_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        x = tl.load(x_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        r = tl.load(rsigma_ptr).to(tl.float32)
        if LAYERNORM:
            mu = tl.load(mu_ptr).to(tl.float32)
            xhat = tl.where(mask, (x - mu) * r, 0.0)
        else:
            xhat = x * r
        dgamma += dy * xhat
        dbeta += dy
        if NEED_DGRAD:
            g = dy * gamma
            proj = tl.sum(g * xhat, axis=0) / H
            if LAYERNORM:
                g = g - tl.sum(g, axis=0) / H
            dx = r * (g - xhat * proj)
            tl.store(dx_ptr + cols, dx.to(dx_ptr.dtype.element_ty), mask=mask)
        dy_ptr += H
        dy_extra_ptr += H
        x_ptr += H
        dx_ptr += H
        mu_ptr += 1
        rsigma_ptr += 1
    offsets = program.to(tl.int64) * H + cols
    tl.store(dgamma_partial_ptr + offsets, dgamma, mask=mask)
    tl.store(dbeta_partial_ptr + offsets, dbeta, mask=mask)


def build(interpret: bool) -> tuple[Any, Any]:
    """Launchers of (forward, backward): ``launch(grid, args, constexprs, num_warps=...)``,
    compiled or for Triton's interpreter (CPU tensors)."""
    return launchers((_forward, _backward), interpret)  # type: ignore[return-value]
