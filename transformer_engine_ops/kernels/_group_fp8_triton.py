"""The Triton kernels behind ``group_fp8_kernels`` (imported only when Triton is
present); the FP8 rounding is ``_fp8_triton.fp8_code``, shared with the per-tensor
current-scaling kernels."""

from __future__ import annotations

from typing import Any

import triton
import triton.language as tl

from ._fp8_triton import fp8_code
from ._triton_launch import launchers


@triton.jit
def widen(v, BF16_BITS: tl.constexpr):  # noqa: N803
    """fp32 values of a loaded tile; with ``BF16_BITS`` the tile holds bf16 bit patterns
    (int16), widened by placing them in the high half of an fp32 word: what the
    hardware conversion does, exact for subnormals too (Triton's interpreter flushes
    or truncates bf16 subnormals in its own conversion)."""
    if BF16_BITS:
        return (v.to(tl.int32) << 16).to(tl.float32, bitcast=True)
    return v.to(tl.float32)


def _row_amax(x_ptr, words_ptr, M, K, BF16_BITS: tl.constexpr, BR: tl.constexpr, BK: tl.constexpr):  # noqa: N803
    # One word per row: the fp32 bits of its finite amax (NaN and +-Inf ignored; a
    # non-negative float orders like its int32 bits), the sign bit set when the row
    # holds an Inf.
    rows = tl.program_id(0) * BR + tl.arange(0, BR).to(tl.int64)
    acc = tl.zeros((BR, BK), dtype=tl.float32)
    infs = tl.zeros((BR, BK), dtype=tl.int32)
    for start in range(0, K, BK):
        cols = start + tl.arange(0, BK).to(tl.int64)
        mask = (rows[:, None] < M) & (cols[None, :] < K)
        v = tl.load(x_ptr + rows[:, None] * K + cols[None, :], mask=mask, other=0)
        a = tl.abs(widen(v, BF16_BITS))
        acc = tl.maximum(acc, tl.where(a < float("inf"), a, 0.0))
        infs = tl.maximum(infs, tl.where(a == float("inf"), 1, 0))
    bits = tl.max(acc, axis=1).to(tl.int32, bitcast=True)
    tl.store(words_ptr + rows, bits | (tl.max(infs, axis=1) << 31), mask=rows < M)


def _cast_rows(
    x_ptr,
    scale_ptr,
    data_ptr,
    M,  # noqa: N803
    K,  # noqa: N803
    FMAX_BITS: tl.constexpr,  # noqa: N803
    SHIFT: tl.constexpr,  # noqa: N803
    MIN_NORMAL_BITS: tl.constexpr,  # noqa: N803
    DENORM_BITS: tl.constexpr,  # noqa: N803
    REBIAS: tl.constexpr,  # noqa: N803
    BF16_BITS: tl.constexpr,  # noqa: N803
    BM: tl.constexpr,  # noqa: N803
    BK: tl.constexpr,  # noqa: N803
):
    # One tile: each row scaled by its own fp32 scale, rounded to FP8 codes.
    rows = tl.program_id(0) * BM + tl.arange(0, BM).to(tl.int64)
    cols = tl.program_id(1) * BK + tl.arange(0, BK).to(tl.int64)
    mask = (rows[:, None] < M) & (cols[None, :] < K)
    x = tl.load(x_ptr + rows[:, None] * K + cols[None, :], mask=mask, other=0)
    scale = tl.load(scale_ptr + rows, mask=rows < M, other=1.0)
    x = widen(x, BF16_BITS)
    code = fp8_code(x, x * scale[:, None], FMAX_BITS, SHIFT, MIN_NORMAL_BITS, DENORM_BITS, REBIAS)
    tl.store(data_ptr + rows[:, None] * K + cols[None, :], code, mask=mask)


def build(interpret: bool) -> tuple[Any, Any]:
    """Launchers of (row amax, row cast): ``launch(grid, args, constexprs,
    num_warps=...)``, compiled or for Triton's interpreter (CPU tensors)."""
    return launchers((_row_amax, _cast_rows), interpret)  # type: ignore[return-value]
