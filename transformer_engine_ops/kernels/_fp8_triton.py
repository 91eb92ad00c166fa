"""The Triton kernels behind ``cuda_kernels`` (imported only when Triton is present).

Written with the plain ``triton.language`` subset that every Triton shipped with torch
2.11-2.14 compiles; see ``cuda_kernels`` for what they compute and why bit for bit.
The scale and rounding helpers (``fp8_scale``, ``fp8_code``) are shared with the FP8
block-scaling kernels (``_fp8_block_triton.py``): one emulation of the reference.
"""

from __future__ import annotations

from typing import Any

import triton
import triton.language as tl

from ._triton_launch import launchers


@triton.jit
def fp8_scale(amax, fmax, epsilon, FORCE_POW2: tl.constexpr):  # noqa: N803
    """``encoding.scale_from_amax`` of a (finite, non-negative) fp32 amax: epsilon
    clamp, a correctly rounded ``fmax / amax`` (1 for a zero or infinite amax), Inf ->
    FP32_MAX, and with ``FORCE_POW2`` truncated to 2**floor(log2(scale)) (the scale is
    a normal number here, so that is its exponent bits)."""
    amax = tl.maximum(amax, epsilon)
    degenerate = (amax == 0.0) | (amax == float("inf"))
    safe = tl.where(degenerate, 1.0, amax)
    scale = tl.where(degenerate, 1.0, tl.math.div_rn(tl.zeros_like(safe) + fmax, safe))
    scale = tl.minimum(scale, 3.4028234663852886e38)  # Inf -> FP32_MAX
    if FORCE_POW2:
        scale = (scale.to(tl.int32, bitcast=True) & 0x7F800000).to(tl.float32, bitcast=True)
    return scale


@triton.jit
def fp8_code(
    x,
    v,
    FMAX_BITS: tl.constexpr,  # noqa: N803
    SHIFT: tl.constexpr,  # noqa: N803
    MIN_NORMAL_BITS: tl.constexpr,  # noqa: N803
    DENORM_BITS: tl.constexpr,  # noqa: N803
    REBIAS: tl.constexpr,  # noqa: N803
):
    """uint8 FP8 codes of ``v = x * scale`` (fp32), as the reference's clamp and c10's
    conversion: saturating (Inf too), nearest even, NaN -> 0x7F with ``x``'s sign."""
    bits = v.to(tl.int32, bitcast=True)
    mag = bits & 0x7FFFFFFF
    is_nan = mag > 0x7F800000
    mag = tl.where(mag > FMAX_BITS, FMAX_BITS, mag)  # the reference's clamp (Inf too)
    # Subnormal results: an fp32 addition rounds the low bits to nearest even.
    denorm = tl.full(mag.shape, DENORM_BITS, tl.int32).to(tl.float32, bitcast=True)
    sub = (mag.to(tl.float32, bitcast=True) + denorm).to(tl.int32, bitcast=True) - DENORM_BITS
    # Normal results: rebias the exponent and round to nearest even on the bits.
    odd = (mag >> SHIFT) & 1
    normal = (mag + REBIAS + odd) >> SHIFT
    code = tl.where(mag < MIN_NORMAL_BITS, sub, normal)
    code = tl.where(is_nan, 0x7F, code)
    # The sign of the product; a NaN's is its input's (a GPU multiply drops it).
    negative = tl.where(is_nan, x.to(tl.int32, bitcast=True) < 0, bits < 0)
    return (code | tl.where(negative, 0x80, 0)).to(tl.uint8)


def _amax(x_ptr, partial_ptr, n, BLOCK: tl.constexpr):  # noqa: N803
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    infs = tl.zeros((BLOCK,), dtype=tl.int32)
    for start in range(pid * BLOCK, n, nprog * BLOCK):
        offs = start + tl.arange(0, BLOCK).to(tl.int64)
        v = tl.load(x_ptr + offs, mask=offs < n, other=0.0).to(tl.float32)
        a = tl.abs(v)
        # NaN < inf and Inf < inf are False: neither counts (the reference's finite_abs).
        acc = tl.maximum(acc, tl.where(a < float("inf"), a, 0.0))
        infs = tl.maximum(infs, tl.where(a == float("inf"), 1, 0))
    # One word per program, no atomics (so nothing to zero first): the bits of its
    # finite amax (a non-negative float orders like its int32 bits, sign bit clear),
    # the sign bit set when its chunks hold an Inf (the reference's has_inf).
    bits = tl.max(acc, axis=0).to(tl.int32, bitcast=True)
    tl.store(partial_ptr + pid, bits | (tl.max(infs, axis=0) << 31))


def _amax_colsum(x_ptr, partial_ptr, colsum_ptr, M, K, ROWS, BR: tl.constexpr, BK: tl.constexpr):  # noqa: N803
    # The amax pass over a 2-D tensor in (ROWS x BK) blocks, one program each, that also
    # sums each column of its block in fp32 (TE's bgrad_quantize: the bias gradient of
    # an output gradient from the pass that reads it anyway). Same words as _amax.
    pid_r = tl.program_id(0)
    pid_k = tl.program_id(1)
    cols = pid_k * BK + tl.arange(0, BK).to(tl.int64)
    acc = tl.zeros((BR, BK), dtype=tl.float32)
    infs = tl.zeros((BR, BK), dtype=tl.int32)
    sums = tl.zeros((BR, BK), dtype=tl.float32)
    for r in range(0, ROWS, BR):
        rows = pid_r * ROWS + r + tl.arange(0, BR).to(tl.int64)
        mask = (rows[:, None] < M) & (cols[None, :] < K)
        v = tl.load(x_ptr + rows[:, None] * K + cols[None, :], mask=mask, other=0.0)
        v = v.to(tl.float32)
        a = tl.abs(v)
        acc = tl.maximum(acc, tl.where(a < float("inf"), a, 0.0))
        infs = tl.maximum(infs, tl.where(a == float("inf"), 1, 0))
        sums += v  # NaN and Inf propagate, as in a plain sum
    bits = tl.max(tl.max(acc, axis=1), axis=0).to(tl.int32, bitcast=True)
    inf = tl.max(tl.max(infs, axis=1), axis=0)
    tl.store(partial_ptr + pid_r * tl.num_programs(1) + pid_k, bits | (inf << 31))
    tl.store(colsum_ptr + pid_r * K + cols, tl.sum(sums, axis=0), mask=cols < K)


def _cast_transpose(
    x_ptr,
    partial_ptr,
    data_ptr,
    t_ptr,
    scale_inv_ptr,
    M,  # noqa: N803
    K,  # noqa: N803
    fmax,
    epsilon,
    n_partial,
    colsum_ptr,
    bgrad_ptr,
    n_colsum,
    PARTIAL_BLOCK: tl.constexpr,  # noqa: N803
    FMAX_BITS: tl.constexpr,  # noqa: N803
    SHIFT: tl.constexpr,  # noqa: N803
    MIN_NORMAL_BITS: tl.constexpr,  # noqa: N803
    DENORM_BITS: tl.constexpr,  # noqa: N803
    REBIAS: tl.constexpr,  # noqa: N803
    FORCE_POW2: tl.constexpr,  # noqa: N803
    ROWWISE: tl.constexpr,  # noqa: N803
    COLUMNWISE: tl.constexpr,  # noqa: N803
    PACK_T: tl.constexpr,  # noqa: N803
    BGRAD: tl.constexpr,  # noqa: N803
    BM: tl.constexpr,  # noqa: N803
    BK: tl.constexpr,  # noqa: N803
):
    pid_m = tl.program_id(0)
    pid_k = tl.program_id(1)
    # --- one tile, loaded first: its load is in flight while the scale is derived ------
    rows = pid_m * BM + tl.arange(0, BM).to(tl.int64)
    cols = pid_k * BK + tl.arange(0, BK).to(tl.int64)
    mask = (rows[:, None] < M) & (cols[None, :] < K)
    x = tl.load(x_ptr + rows[:, None] * K + cols[None, :], mask=mask, other=0.0)
    # --- the amax, from the amax kernel's per-program words (max is exact in any order)
    p = tl.arange(0, PARTIAL_BLOCK)
    words = tl.load(partial_ptr + p, mask=p < n_partial, other=0)
    amax = tl.max(words & 0x7FFFFFFF, axis=0).to(tl.float32, bitcast=True)
    has_inf = tl.min(words, axis=0) < 0
    scale = fp8_scale(amax, fmax, epsilon, FORCE_POW2)
    if (pid_m == 0) & (pid_k == 0):
        # An Inf in the tensor: scale_inv +Inf, so the value dequantizes non-finite.
        inv = tl.math.div_rn(tl.zeros_like(scale) + 1.0, scale)
        inv = tl.where(has_inf, float("inf"), inv)
        tl.store(scale_inv_ptr, inv)
    if BGRAD:
        if pid_m == 0:
            # The bias gradient of these columns: _amax_colsum's n_colsum partial sums
            # (its column blocks are these tiles' columns), added in row-group order.
            cols = pid_k * BK + tl.arange(0, BK).to(tl.int64)
            total = tl.zeros((BK,), dtype=tl.float32)
            for g in range(0, n_colsum, 16):
                groups = g + tl.arange(0, 16).to(tl.int64)
                part = tl.load(
                    colsum_ptr + groups[:, None] * K + cols[None, :],
                    mask=(groups[:, None] < n_colsum) & (cols[None, :] < K),
                    other=0.0,
                )
                total += tl.sum(part, axis=0)
            tl.store(bgrad_ptr + cols, total, mask=cols < K)
    # --- scale, round to FP8, store rowwise and/or transposed --------------------------
    x = x.to(tl.float32)
    code = fp8_code(x, x * scale, FMAX_BITS, SHIFT, MIN_NORMAL_BITS, DENORM_BITS, REBIAS)
    # PACK_T: four consecutive codes of a transposed row stored as one little-endian
    # int32 (t_ptr then points at an int32 view and M is a multiple of 4): the
    # transpose moves 32-bit words instead of bytes (~1.5x faster on an H200).
    if ROWWISE:
        tl.store(data_ptr + rows[:, None] * K + cols[None, :], code, mask=mask)
    if COLUMNWISE:
        if PACK_T:
            shifts = (tl.arange(0, 4) * 8)[None, :, None]
            words = tl.sum(tl.reshape(code.to(tl.int32), (BM // 4, 4, BK)) << shifts, axis=1)
            wrows = pid_m * (BM // 4) + tl.arange(0, BM // 4).to(tl.int64)
            wmask = (wrows[:, None] < M // 4) & (cols[None, :] < K)
            tl.store(
                t_ptr + cols[:, None] * (M // 4) + wrows[None, :],
                tl.trans(words),
                mask=tl.trans(wmask),
            )
        else:
            tl.store(t_ptr + cols[:, None] * M + rows[None, :], tl.trans(code), mask=tl.trans(mask))


def build(interpret: bool) -> tuple[Any, Any, Any]:
    """Launchers of (amax, amax + column sums, cast + transpose): ``launch(grid, args,
    constexprs, num_warps=...)``, compiled or for Triton's interpreter (CPU tensors)."""
    return launchers((_amax, _amax_colsum, _cast_transpose), interpret)  # type: ignore[return-value]
