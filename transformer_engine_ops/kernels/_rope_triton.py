"""The Triton kernel behind ``rope_kernels`` (imported only when Triton is present).

One kernel serves the rotation and its transpose (the backward): each program takes one
token row of ``HEADS`` heads and ``BLOCK_D`` features, reads the row, the row read at
each feature's partner (``i + d'/2`` or ``i ^ 1`` when interleaved), the token's angles,
and writes the rotated row once. ``FUSED`` computes in fp32 and rounds once (TE's fused
kernel); otherwise ``cos``, ``sin``, each product and the sum round to the data's dtype
(TE's unfused path). Features past the rotated width are copied.

Forward: ``y_i = x_i cos(a_i) + s_i x_p sin(a_i)`` with ``s_i = -1`` on the first of each
pair; backward (``TRANSPOSE``): ``dx_i = g_i cos(a_i) - s_i g_p sin(a_p)``, the partner's
own angle, as the transpose of the forward's matrix reads it.
"""

from __future__ import annotations

from typing import Any

import triton
import triton.language as tl

from ._triton_launch import launchers


@triton.jit
def _rounded(x, DTYPE: tl.constexpr):  # noqa: N803
    """``x`` (fp32) rounded to ``DTYPE`` and widened back."""
    return x.to(DTYPE).to(tl.float32)


@triton.jit
def _rope(
    t_ptr,
    angles_ptr,
    out_ptr,
    HEADS,  # noqa: N803
    D,  # noqa: N803 - features per head
    ROT,  # noqa: N803 - rotated features (even, <= D)
    t_row_stride,
    t_head_stride,
    INTERLEAVED: tl.constexpr,  # noqa: N803
    FUSED: tl.constexpr,  # noqa: N803
    TRANSPOSE: tl.constexpr,  # noqa: N803
    BLOCK_H: tl.constexpr,  # noqa: N803
    BLOCK_D: tl.constexpr,  # noqa: N803
):
    row = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    half = ROT // 2
    if INTERLEAVED:
        partner = d ^ 1
        first = (d % 2) == 0
    else:
        first = d < half
        partner = tl.where(first, d + half, d - half)
    rotated = d < ROT
    in_row = (heads[:, None] < HEADS) & (d[None, :] < D)
    base = t_ptr + row * t_row_stride + heads[:, None] * t_head_stride
    x = tl.load(base + d[None, :], mask=in_row, other=0.0)
    xp = tl.load(base + partner[None, :], mask=in_row & rotated[None, :], other=0.0)
    a = tl.load(angles_ptr + row * ROT + d, mask=rotated, other=0.0).to(tl.float32)
    dtype = x.dtype
    xf = x.to(tl.float32)
    xpf = xp.to(tl.float32)
    if TRANSPOSE:
        ap = tl.load(angles_ptr + row * ROT + partner, mask=rotated, other=0.0).to(tl.float32)
        sign = tl.where(first, 1.0, -1.0)
        c = tl.cos(a)
        sp = tl.sin(ap)
    else:
        sign = tl.where(first, -1.0, 1.0)
        c = tl.cos(a)
        sp = tl.sin(a)
    if FUSED:
        y = xf * c[None, :] + sign[None, :] * (xpf * sp[None, :])
    else:
        cd = _rounded(c, dtype)
        sd = _rounded(sp, dtype)
        y = _rounded(
            _rounded(xf * cd[None, :], dtype) + sign[None, :] * _rounded(xpf * sd[None, :], dtype),
            dtype,
        )
    y = tl.where(rotated[None, :], y, xf)
    out = out_ptr + row * (HEADS * D) + heads[:, None] * D + d[None, :]
    tl.store(out, y.to(out_ptr.dtype.element_ty), mask=in_row)


def build(interpret: bool) -> tuple[Any]:
    """The launcher of the kernel: ``launch(grid, args, constexprs, num_warps=...)``,
    compiled or for Triton's interpreter (CPU tensors)."""
    return launchers((_rope,), interpret)  # type: ignore[return-value]
