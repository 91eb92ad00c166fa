"""The Triton kernels behind ``nvfp4_kernels`` (imported only when Triton is present).

Both kernels read one *stored matrix* ``S`` (R, C) through two strides: the rowwise
data's ``x`` (M, K), or the columnwise data's ``x.T`` (K, M), so no transpose is ever
materialized. Every value is computed exactly as the reference (``nvfp4.py``,
``encoding.py``, ``hadamard.py``, ``philox.py``) computes it: divisions with
``div_rn`` (Triton's ``/`` on fp32 is approximate), sums in the reference's index
order, FP8 and FP4 rounding on the fp32 bits, and launched with
``enable_fp_fusion=False`` so no multiply and add are fused into one rounding.
See ``nvfp4_kernels`` for what each computes.
"""

from __future__ import annotations

from typing import Any

import triton
import triton.language as tl

from ._triton_launch import launchers

FP32_MAX = tl.constexpr(3.4028234663852886e38)  # a global a kernel may read


@triton.jit
def _load_stored(
    x_ptr,
    rows,
    blocks,
    R,  # noqa: N803
    C,  # noqa: N803
    stride_r,
    stride_c,
    RHT: tl.constexpr,  # noqa: N803
    SIGN_MASK: tl.constexpr,  # noqa: N803
    BR: tl.constexpr,  # noqa: N803
    NB: tl.constexpr,  # noqa: N803
):
    """``S[rows, 16-element blocks]`` as fp32 (BR, NB, 16), zero outside; with ``RHT``
    every block multiplied by ``diag(signs) @ H16 / 4``, summed in index order."""
    j = tl.arange(0, 16)
    if RHT:
        acc = tl.zeros((BR, NB, 16), dtype=tl.float32)
        for i in tl.static_range(16):
            c = blocks * 16 + i
            mask = (rows[:, None] < R) & (c[None, :] < C)
            xi = tl.load(x_ptr + rows[:, None] * stride_r + c[None, :] * stride_c, mask=mask)
            xi = tl.where(mask, xi.to(tl.float32), 0.0)
            both = j & i
            parity = (both ^ (both >> 1) ^ (both >> 2) ^ (both >> 3)) & 1
            negative = parity ^ ((SIGN_MASK >> i) & 1)
            coef = tl.where(negative == 1, -0.25, 0.25)
            acc = acc + xi[:, :, None] * coef[None, None, :]
        return acc
    cols = blocks[:, None] * 16 + j[None, :]
    mask = (rows[:, None, None] < R) & (cols[None, :, :] < C)
    ptrs = x_ptr + rows[:, None, None] * stride_r + cols[None, :, :] * stride_c
    return tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _row_amax(
    x_ptr,
    amax_ptr,
    R,  # noqa: N803
    C,  # noqa: N803
    stride_r,
    stride_c,
    RHT: tl.constexpr,  # noqa: N803
    SIGN_MASK: tl.constexpr,  # noqa: N803
    BR: tl.constexpr,  # noqa: N803
    NB: tl.constexpr,  # noqa: N803
):
    # The finite amax (NaN and +-Inf ignored) of each row of S (after the transform
    # with RHT): max is exact in any order.
    rows = tl.program_id(0) * BR + tl.arange(0, BR).to(tl.int64)
    acc = tl.zeros((BR,), dtype=tl.float32)
    for start in range(0, C, NB * 16):
        blocks = start // 16 + tl.arange(0, NB).to(tl.int64)
        x = _load_stored(x_ptr, rows, blocks, R, C, stride_r, stride_c, RHT, SIGN_MASK, BR, NB)
        a = tl.abs(x)
        a = tl.where(a < float("inf"), a, 0.0)  # NaN < inf is False too
        acc = tl.maximum(acc, tl.max(tl.max(a, axis=2), axis=1))
    tl.store(amax_ptr + rows, acc, mask=rows < R)


@triton.jit
def _e4m3_code(
    v,
    FMAX_BITS: tl.constexpr,  # noqa: N803
    SHIFT: tl.constexpr,  # noqa: N803
    MIN_NORMAL_BITS: tl.constexpr,  # noqa: N803
    DENORM_BITS: tl.constexpr,  # noqa: N803
    REBIAS: tl.constexpr,  # noqa: N803
):
    """Non-negative fp32 -> E4M3 code, saturating at 448, nearest even (c10's
    ``fp8e4m3fn_from_fp32_value`` on the bits, as ``_fp8_triton``)."""
    mag = v.to(tl.int32, bitcast=True)
    mag = tl.where(mag > FMAX_BITS, FMAX_BITS, mag)
    denorm = tl.full(mag.shape, DENORM_BITS, tl.int32).to(tl.float32, bitcast=True)
    sub = (mag.to(tl.float32, bitcast=True) + denorm).to(tl.int32, bitcast=True) - DENORM_BITS
    odd = (mag >> SHIFT) & 1
    normal = (mag + REBIAS + odd) >> SHIFT
    return tl.where(mag < MIN_NORMAL_BITS, sub, normal)


@triton.jit
def _e4m3_value(code):
    """E4M3 code (0..0x7F) -> fp32 (0x7F is NaN)."""
    e = code >> 3
    m = code & 7
    normal = ((e + 120) << 23 | (m << 20)).to(tl.float32, bitcast=True)
    value = tl.where(e == 0, m.to(tl.float32) * 0.001953125, normal)
    return tl.where(code == 0x7F, float("nan"), value)


@triton.jit
def _e2m1_value(code):
    """4-bit E2M1 code -> fp32 (exact)."""
    c = code & 7
    e = c >> 1
    m = (c & 1).to(tl.float32)
    magnitude = tl.where(
        e == 0, m * 0.5, (2.0 + m) * (tl.full(e.shape, 1, tl.int32) << e).to(tl.float32) * 0.25
    )
    return tl.where((code & 8) != 0, -magnitude, magnitude)


@triton.jit
def _clamp_scaled(p):
    """The reference's ``nan_to_num(clamp(p, -6, 6), nan=0)``."""
    p = tl.where(p > 6.0, 6.0, p)
    p = tl.where(p < -6.0, -6.0, p)
    return tl.where(p != p, 0.0, p)


@triton.jit
def _e2m1_nearest(p):
    """``encoding.encode_e2m1``: nearest, ties to the even code, sign kept off zero."""
    a = tl.abs(p)
    code = (a > 0.25).to(tl.int32)
    code += (a >= 0.75).to(tl.int32)
    code += (a > 1.25).to(tl.int32)
    code += (a >= 1.75).to(tl.int32)
    code += (a > 2.5).to(tl.int32)
    code += (a >= 3.5).to(tl.int32)
    code += (a > 5.0).to(tl.int32)
    negative = (p.to(tl.int32, bitcast=True) < 0) & (code != 0)
    return code | tl.where(negative, 8, 0)


@triton.jit
def _mulhilo(a, b):
    return tl.umulhi(a, b), a * b


@triton.jit
def _uniform(flat, seed_ptr, STREAM: tl.constexpr):  # noqa: N803
    """``philox.uniform`` at flat indices ``flat`` (int64): element ``n`` takes word
    ``n % 4`` of Philox4x32-10 at counter ``(n // 4, stream, offset)``, keyed by the
    seed; its top 24 bits times ``2**-24``."""
    seed = tl.load(seed_ptr)
    offset = tl.load(seed_ptr + 1)
    zero = tl.zeros(flat.shape, dtype=tl.uint32)
    c0 = ((flat >> 2) & 0xFFFFFFFF).to(tl.uint32)
    c1 = zero + STREAM
    c2 = zero + (offset & 0xFFFFFFFF).to(tl.uint32)
    c3 = zero + ((offset >> 32) & 0xFFFFFFFF).to(tl.uint32)
    k0 = zero + (seed & 0xFFFFFFFF).to(tl.uint32)
    k1 = zero + ((seed >> 32) & 0xFFFFFFFF).to(tl.uint32)
    mul0 = tl.full(flat.shape, 0xD2511F53, tl.uint32)
    mul1 = tl.full(flat.shape, 0xCD9E8D57, tl.uint32)
    weyl0 = tl.full(flat.shape, 0x9E3779B9, tl.uint32)
    weyl1 = tl.full(flat.shape, 0xBB67AE85, tl.uint32)
    for _ in tl.static_range(10):
        hi0, lo0 = _mulhilo(c0, mul0)
        hi1, lo1 = _mulhilo(c2, mul1)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0 = k0 + weyl0
        k1 = k1 + weyl1
    word = flat & 3
    w = tl.where(word == 0, c0, tl.where(word == 1, c1, tl.where(word == 2, c2, c3)))
    return (w >> 8).to(tl.float32) * 5.9604644775390625e-08  # 2**-24


@triton.jit
def _e2m1_stochastic(p, u):
    """``encoding.encode_e2m1_stochastic``: up with probability ``(|p| - lo) / gap``."""
    a = tl.abs(p)
    lower = (a >= 0.5).to(tl.int32)
    lower += (a >= 1.0).to(tl.int32)
    lower += (a >= 1.5).to(tl.int32)
    lower += (a >= 2.0).to(tl.int32)
    lower += (a >= 3.0).to(tl.int32)
    lower += (a >= 4.0).to(tl.int32)
    lower += (a >= 6.0).to(tl.int32)
    lo = _e2m1_value(lower)
    hi = _e2m1_value(tl.minimum(lower + 1, 7))
    gap = hi - lo
    p_up = tl.where(gap > 0, tl.math.div_rn(a - lo, tl.where(gap > 0, gap, 1.0)), 0.0)
    code = lower + (u < p_up).to(tl.int32)
    negative = (p.to(tl.int32, bitcast=True) < 0) & (code != 0)
    return code | tl.where(negative, 8, 0)


@triton.jit
def _in_order_sum(values, index, N: tl.constexpr, AXIS: tl.constexpr):  # noqa: N803
    """Sum of ``values`` along ``AXIS`` (of length ``N``, positions ``index``) added in
    index order, as the reference's loop does (a tree reduction rounds differently):
    each step's masked sum has one non-zero term."""
    total = tl.sum(tl.where(index == 0, values, 0.0), axis=AXIS)
    for i in tl.static_range(1, N):
        total = total + tl.sum(tl.where(index == i, values, 0.0), axis=AXIS)
    return total


@triton.jit
def _quantize(
    x_ptr,
    amax_ptr,
    seed_ptr,
    data_ptr,
    scale_ptr,
    R,  # noqa: N803
    C,  # noqa: N803
    stride_r,
    stride_c,
    amax_stride,
    scale_cols,
    global_fmax,
    err_denominator,
    STREAM: tl.constexpr,  # noqa: N803
    RHT: tl.constexpr,  # noqa: N803
    SIGN_MASK: tl.constexpr,  # noqa: N803
    STOCHASTIC: tl.constexpr,  # noqa: N803
    TWO_D: tl.constexpr,  # noqa: N803
    FOUR_OVER_SIX: tl.constexpr,  # noqa: N803
    MSE: tl.constexpr,  # noqa: N803
    FMAX_BITS: tl.constexpr,  # noqa: N803
    SHIFT: tl.constexpr,  # noqa: N803
    MIN_NORMAL_BITS: tl.constexpr,  # noqa: N803
    DENORM_BITS: tl.constexpr,  # noqa: N803
    REBIAS: tl.constexpr,  # noqa: N803
    BR: tl.constexpr,  # noqa: N803
    NB: tl.constexpr,  # noqa: N803
):
    rows = tl.program_id(0) * BR + tl.arange(0, BR).to(tl.int64)
    blocks = tl.program_id(1) * NB + tl.arange(0, NB).to(tl.int64)
    j = tl.arange(0, 16)
    cols = blocks[:, None] * 16 + j[None, :]
    mask = (rows[:, None, None] < R) & (cols[None, :, :] < C)
    x = _load_stored(x_ptr, rows, blocks, R, C, stride_r, stride_c, RHT, SIGN_MASK, BR, NB)
    # --- the global (per-tensor or per-row) encode scale: encoding.scale_from_amax ---
    amax = tl.load(amax_ptr + rows * amax_stride, mask=rows < R, other=0.0)
    degenerate = (amax == 0.0) | (amax == float("inf"))
    safe = tl.where(degenerate, 1.0, amax)
    gs = tl.where(degenerate, 1.0, tl.math.div_rn(tl.zeros_like(safe) + global_fmax, safe))
    gs = tl.minimum(gs, FP32_MAX)[:, None]  # (BR, 1)
    # --- block amax and "holds a NaN or Inf", per 1x16 (or 16x16) block ---------------
    a = tl.abs(x)
    finite = a < float("inf")
    bamax = tl.max(tl.where(finite, a, 0.0), axis=2)  # (BR, NB)
    bad = tl.max(tl.where(finite, 0, 1), axis=2)
    if TWO_D:  # BR == 16: one block row
        bamax = tl.zeros_like(bamax) + tl.max(bamax, axis=0)[None, :]
        bad = tl.zeros_like(bad) + tl.max(bad, axis=0)[None, :]
    base = tl.math.div_rn(bamax, tl.zeros_like(bamax) + 6.0) * gs
    if FOUR_OVER_SIX:
        decode_global = tl.math.div_rn(tl.zeros_like(gs) + 1.0, gs)
        amax3 = amax[:, None, None]
        # map to 4 (the scale times 1.5) ...
        s4 = _e4m3_code(base * 1.5, FMAX_BITS, SHIFT, MIN_NORMAL_BITS, DENORM_BITS, REBIAS)
        s4 = tl.where(bad != 0, 0x7F, s4)
        bs4 = _e4m3_value(s4)
        e4 = tl.math.div_rn(tl.zeros_like(bs4) + 1.0, bs4 * decode_global)
        e4 = tl.where(bs4 > 0, tl.minimum(e4, FP32_MAX), 0.0)
        codes4 = _e2m1_nearest(_clamp_scaled(x * e4[:, :, None]))
        value4 = _e2m1_value(codes4) * bs4[:, :, None]
        diff4 = tl.math.div_rn(value4 * amax3, tl.zeros_like(value4) + err_denominator) - x
        # ... and map to 6 (the standard scale)
        s6 = _e4m3_code(base, FMAX_BITS, SHIFT, MIN_NORMAL_BITS, DENORM_BITS, REBIAS)
        s6 = tl.where(bad != 0, 0x7F, s6)
        bs6 = _e4m3_value(s6)
        e6 = tl.math.div_rn(tl.zeros_like(bs6) + 1.0, bs6 * decode_global)
        e6 = tl.where(bs6 > 0, tl.minimum(e6, FP32_MAX), 0.0)
        codes6 = _e2m1_nearest(_clamp_scaled(x * e6[:, :, None]))
        value6 = _e2m1_value(codes6) * bs6[:, :, None]
        diff6 = tl.math.div_rn(value6 * amax3, tl.zeros_like(value6) + err_denominator) - x
        if MSE:
            err4 = diff4 * diff4
            err6 = diff6 * diff6
        else:
            err4 = tl.abs(diff4)
            err6 = tl.abs(diff6)
        err4 = _in_order_sum(tl.where(mask, err4, 0.0), j[None, None, :], 16, 2)
        err6 = _in_order_sum(tl.where(mask, err6, 0.0), j[None, None, :], 16, 2)
        if TWO_D:  # the block's 16 rows, in row order
            r = tl.arange(0, BR)[:, None]
            err4 = tl.zeros_like(err4) + _in_order_sum(err4, r, BR, 0)[None, :]
            err6 = tl.zeros_like(err6) + _in_order_sum(err6, r, BR, 0)[None, :]
        pick4 = err4 < err6  # a tie keeps map-to-6
        codes = tl.where(pick4[:, :, None], codes4, codes6)
        scale_codes = tl.where(pick4, s4, s6)
    else:
        scale_codes = _e4m3_code(base, FMAX_BITS, SHIFT, MIN_NORMAL_BITS, DENORM_BITS, REBIAS)
        scale_codes = tl.where(bad != 0, 0x7F, scale_codes)
        block_scale = _e4m3_value(scale_codes)
        encode = tl.where(
            block_scale > 0, tl.math.div_rn(gs + tl.zeros_like(block_scale), block_scale), 0.0
        )
        scaled = _clamp_scaled(x * encode[:, :, None])
        if STOCHASTIC:
            flat = rows[:, None, None] * C + cols[None, :, :]
            codes = _e2m1_stochastic(scaled, _uniform(flat, seed_ptr, STREAM))
        else:
            codes = _e2m1_nearest(scaled)
    # --- store: two codes per byte (even element low), one scale code per block row ---
    pairs = tl.reshape(codes, (BR, NB, 8, 2))
    shifts = (tl.arange(0, 2) * 4)[None, None, None, :]
    packed = tl.sum(pairs << shifts, axis=3).to(tl.uint8)  # (BR, NB, 8)
    t = tl.arange(0, 8)
    byte_cols = blocks[:, None] * 8 + t[None, :]  # (NB, 8)
    byte_mask = (rows[:, None, None] < R) & (byte_cols[None, :, :] * 2 < C)
    tl.store(
        data_ptr + rows[:, None, None] * (C // 2) + byte_cols[None, :, :], packed, mask=byte_mask
    )
    scale_mask = (rows[:, None] < R) & (blocks[None, :] * 16 < C)
    tl.store(
        scale_ptr + rows[:, None] * scale_cols + blocks[None, :],
        scale_codes.to(tl.uint8),
        mask=scale_mask,
    )


def build(interpret: bool) -> tuple[Any, Any]:
    """Launchers of (row amax, quantize): ``launch(grid, args, constexprs,
    num_warps=...)``, compiled or for Triton's interpreter (CPU tensors)."""
    return launchers((_row_amax, _quantize), interpret)  # type: ignore[return-value]
