"""The Triton kernel behind ``moe_kernels`` (imported only when Triton is present).

One program sums one token's rows over ``BLOCK`` features: it walks the token's row of
the table (``J`` slots; the first ``counts[t]`` of them when counts are given), skips a
slot holding -1, multiplies each row by the slot's weight when weights are given, and
adds in fp32; the sum is written once, in the output's dtype. The walk is sequential,
so every run adds in the same order.
"""

from __future__ import annotations

from typing import Any

import triton
import triton.language as tl

from ._triton_launch import launchers


@triton.jit
def _token_sum(
    x_ptr,
    rows_ptr,
    counts_ptr,
    weights_ptr,
    out_ptr,
    H,  # noqa: N803 - features
    J,  # noqa: N803 - slots per token
    x_row_stride,
    HAS_COUNTS: tl.constexpr,  # noqa: N803
    HAS_WEIGHTS: tl.constexpr,  # noqa: N803
    BLOCK: tl.constexpr,  # noqa: N803
):
    t = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = cols < H
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    if HAS_COUNTS:
        n = tl.load(counts_ptr + t).to(tl.int32)
    else:
        n = J
    for j in range(0, n):
        r = tl.load(rows_ptr + t * J + j).to(tl.int64)
        if r >= 0:
            v = tl.load(x_ptr + r * x_row_stride + cols, mask=inside, other=0.0).to(tl.float32)
            if HAS_WEIGHTS:
                v = v * tl.load(weights_ptr + t * J + j).to(tl.float32)
            acc = acc + v
    tl.store(out_ptr + t * H + cols, acc.to(out_ptr.dtype.element_ty), mask=inside)


def build(interpret: bool) -> tuple[Any]:
    """The launcher of the kernel: ``launch(grid, args, constexprs, num_warps=...)``,
    compiled or for Triton's interpreter (CPU tensors)."""
    return launchers((_token_sum,), interpret)  # type: ignore[return-value]
