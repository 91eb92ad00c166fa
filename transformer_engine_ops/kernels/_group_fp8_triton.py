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


@triton.jit
def fp8_value(code, E4M3: tl.constexpr):  # noqa: N803
    """fp32 values of uint8 FP8 codes, built from their bits (every FP8 value is an fp32
    one, so exact): E4M3 (no Inf; 0x7F and 0xFF NaN) or E5M2 (IEEE-like)."""
    c = code.to(tl.int32)
    sign = (c & 0x80) << 24
    if E4M3:
        e = (c >> 3) & 0xF
        m = c & 0x7
        normal = ((e + 120) << 23) | (m << 20)  # exponent e - 7 + 127
        sub = (m.to(tl.float32) * 0.001953125).to(tl.int32, bitcast=True)  # m * 2**-9
        mag = tl.where(e == 0, sub, normal)
        mag = tl.where((e == 15) & (m == 7), 0x7FC00000, mag)
    else:
        e = (c >> 2) & 0x1F
        m = c & 0x3
        normal = ((e + 112) << 23) | (m << 21)  # exponent e - 15 + 127
        sub = (m.to(tl.float32) * 0.0000152587890625).to(tl.int32, bitcast=True)  # m * 2**-16
        mag = tl.where(e == 0, sub, normal)
        mag = tl.where(e == 31, tl.where(m == 0, 0x7F800000, 0x7FC00000), mag)
    return (mag | sign).to(tl.float32, bitcast=True)


@triton.jit
def bf16_bits(v):
    """int16 bit patterns of fp32 ``v`` rounded to bf16, to nearest even (Inf and
    overflow to Inf as the hardware conversion; a NaN stays a quiet NaN of its sign),
    computed on the bits: Triton's interpreter truncates in its own conversion."""
    b = v.to(tl.int32, bitcast=True)
    rounded = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
    is_nan = (b & 0x7FFFFFFF) > 0x7F800000
    out = tl.where(is_nan, (b >> 16) | 0x40, rounded)
    return out.to(tl.int16)


def _dequantize_rows(
    codes_ptr,
    inv_ptr,
    out_ptr,
    M,  # noqa: N803
    K,  # noqa: N803
    E4M3: tl.constexpr,  # noqa: N803
    BF16_OUT: tl.constexpr,  # noqa: N803
    BM: tl.constexpr,  # noqa: N803
    BK: tl.constexpr,  # noqa: N803
):
    # One tile: each row's FP8 values times its scale inverse (one fp32 multiply), as
    # bf16 bit patterns or fp32.
    rows = tl.program_id(0) * BM + tl.arange(0, BM).to(tl.int64)
    cols = tl.program_id(1) * BK + tl.arange(0, BK).to(tl.int64)
    mask = (rows[:, None] < M) & (cols[None, :] < K)
    code = tl.load(codes_ptr + rows[:, None] * K + cols[None, :], mask=mask, other=0)
    inv = tl.load(inv_ptr + rows, mask=rows < M, other=1.0)
    v = fp8_value(code, E4M3) * inv[:, None]
    if BF16_OUT:
        tl.store(out_ptr + rows[:, None] * K + cols[None, :], bf16_bits(v), mask=mask)
    else:
        tl.store(out_ptr + rows[:, None] * K + cols[None, :], v, mask=mask)


def build(interpret: bool) -> tuple[Any, Any, Any]:
    """Launchers of (row amax, row cast, row dequantize): ``launch(grid, args,
    constexprs, num_warps=...)``, compiled or for Triton's interpreter (CPU tensors)."""
    return launchers((_row_amax, _cast_rows, _dequantize_rows), interpret)  # type: ignore[return-value]
