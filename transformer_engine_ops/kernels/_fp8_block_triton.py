"""The Triton kernel behind ``block_kernels`` (imported only when Triton is present).

One program quantizes one (BM x BK) tile of the input, read once: block amaxes, scales
and codes for whichever usages are asked, stored straight into the quantizer's layouts.
The scale and rounding are ``_fp8_triton``'s helpers (one emulation of the reference
for both FP8 recipes); see ``block_kernels`` for what is computed and why bit for bit.
"""

from __future__ import annotations

from typing import Any

import triton
import triton.language as tl

from ._fp8_triton import fp8_code, fp8_scale
from ._triton_launch import launchers


@triton.jit
def _block_max(a, BM: tl.constexpr, BK: tl.constexpr, RB: tl.constexpr, CB: tl.constexpr):  # noqa: N803
    """Maximum of each RB x CB block of the (BM, BK) tile ``a``: (BM // RB, BK // CB)."""
    if (RB == 1 or RB == BM) and (CB == 1 or CB == BK):  # no reshape needed
        if RB == BM:
            a = tl.max(a, axis=0, keep_dims=True)
        if CB == BK:
            a = tl.max(a, axis=1, keep_dims=True)
    else:
        a = tl.max(tl.max(tl.reshape(a, (BM // RB, RB, BK // CB, CB)), axis=3), axis=1)
    return a


@triton.jit
def _block_mul(x, s, BM: tl.constexpr, BK: tl.constexpr, RB: tl.constexpr, CB: tl.constexpr):  # noqa: N803
    """Each RB x CB block of ``x`` (BM, BK) times its entry of ``s`` (BM // RB, BK // CB)."""
    if (RB == 1 or RB == BM) and (CB == 1 or CB == BK):  # ``s`` broadcasts
        v = x * s
    else:
        v = tl.reshape(tl.reshape(x, (BM // RB, RB, BK // CB, CB)) * s[:, None, :, None], (BM, BK))
    return v


@triton.jit
def _scale_inv(scale, inf):
    """The stored scale-inverse: ``1 / scale`` correctly rounded, +Inf for a block
    holding an Inf (the reference's ``torch.where(block_has_inf(...), inf, 1 / scale)``)."""
    inv = tl.math.div_rn(tl.zeros_like(scale) + 1.0, scale)
    return tl.where(inf > 0, float("inf"), inv)


@triton.jit
def _store_transposed(
    t_ptr,
    code,
    rows,
    cols,
    mask,
    M,  # noqa: N803
    K,  # noqa: N803
    PACK_T: tl.constexpr,  # noqa: N803
    BM: tl.constexpr,  # noqa: N803
    BK: tl.constexpr,  # noqa: N803
):
    """Store the tile's (BM, BK) codes at ``t[cols, rows]`` of the (K, M) transpose;
    with ``PACK_T`` (``t_ptr`` an int32 view, M a multiple of 4) four codes of a
    transposed row per little-endian word (~1.5x faster, as ``_fp8_triton``)."""
    if PACK_T:
        shifts = (tl.arange(0, 4) * 8)[None, :, None]
        words = tl.sum(tl.reshape(code.to(tl.int32), (BM // 4, 4, BK)) << shifts, axis=1)
        wrows = tl.program_id(0) * (BM // 4) + tl.arange(0, BM // 4).to(tl.int64)
        wmask = (wrows[:, None] < M // 4) & (cols[None, :] < K)
        tl.store(
            t_ptr + cols[:, None] * (M // 4) + wrows[None, :], tl.trans(words), mask=tl.trans(wmask)
        )
    else:
        tl.store(t_ptr + cols[:, None] * M + rows[None, :], tl.trans(code), mask=tl.trans(mask))


def _block_quantize(
    x_ptr,
    data_ptr,
    row_si_ptr,
    t_ptr,
    col_si_ptr,
    M,  # noqa: N803
    K,  # noqa: N803
    fmax,
    epsilon,
    FMAX_BITS: tl.constexpr,  # noqa: N803
    SHIFT: tl.constexpr,  # noqa: N803
    MIN_NORMAL_BITS: tl.constexpr,  # noqa: N803
    DENORM_BITS: tl.constexpr,  # noqa: N803
    REBIAS: tl.constexpr,  # noqa: N803
    FORCE_POW2: tl.constexpr,  # noqa: N803
    B: tl.constexpr,  # noqa: N803
    TWO_D: tl.constexpr,  # noqa: N803
    ROWWISE: tl.constexpr,  # noqa: N803
    COLUMNWISE: tl.constexpr,  # noqa: N803
    PACK_T: tl.constexpr,  # noqa: N803
    BM: tl.constexpr,  # noqa: N803
    BK: tl.constexpr,  # noqa: N803
):
    pid_m = tl.program_id(0)
    pid_k = tl.program_id(1)
    rows = pid_m * BM + tl.arange(0, BM).to(tl.int64)
    cols = pid_k * BK + tl.arange(0, BK).to(tl.int64)
    mask = (rows[:, None] < M) & (cols[None, :] < K)
    x = tl.load(x_ptr + rows[:, None] * K + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    a = tl.abs(x)
    # The amax ignores NaN and +-Inf (NaN < inf is False too); an Inf marks its block.
    finite = tl.where(a < float("inf"), a, 0.0)
    inf = (a == float("inf")).to(tl.int32)
    # Padded scale-inverse extents: rows of M, columns of K, and their block counts.
    m_pad = (M + 3) // 4 * 4
    k_pad = (K + 3) // 4 * 4
    mb = (M + B - 1) // B
    kb = (K + B - 1) // B
    if TWO_D:
        # B x B blocks: one scale for both usages; the columnwise codes are the
        # transpose of the rowwise ones.
        scale = fp8_scale(_block_max(finite, BM, BK, B, B), fmax, epsilon, FORCE_POW2)
        inv = _scale_inv(scale, _block_max(inf, BM, BK, B, B))
        code = fp8_code(
            x,
            _block_mul(x, scale, BM, BK, B, B),
            FMAX_BITS,
            SHIFT,
            MIN_NORMAL_BITS,
            DENORM_BITS,
            REBIAS,
        )
        brow = pid_m * (BM // B) + tl.arange(0, BM // B).to(tl.int64)
        bcol = pid_k * (BK // B) + tl.arange(0, BK // B).to(tl.int64)
        bmask = (brow[:, None] < mb) & (bcol[None, :] < kb)
        # The zero padding past the last block column (row) of the stored scales is
        # written by the programs of the last tile column (row).
        pad = tl.arange(0, 4).to(tl.int64)
        if ROWWISE:
            tl.store(data_ptr + rows[:, None] * K + cols[None, :], code, mask=mask)
            kb_pad = (kb + 3) // 4 * 4
            tl.store(row_si_ptr + brow[:, None] * kb_pad + bcol[None, :], inv, mask=bmask)
            if pid_k == tl.num_programs(1) - 1:
                pcol = kb + pad
                pmask = (brow[:, None] < mb) & (pcol[None, :] < kb_pad)
                zeros = tl.zeros((BM // B, 4), dtype=tl.float32)
                tl.store(row_si_ptr + brow[:, None] * kb_pad + pcol[None, :], zeros, mask=pmask)
        if COLUMNWISE:
            _store_transposed(t_ptr, code, rows, cols, mask, M, K, PACK_T, BM, BK)
            mb_pad = (mb + 3) // 4 * 4
            tl.store(col_si_ptr + bcol[None, :] * mb_pad + brow[:, None], inv, mask=bmask)
            if pid_m == tl.num_programs(0) - 1:
                prow = mb + pad
                pmask = (prow[:, None] < mb_pad) & (bcol[None, :] < kb)
                zeros = tl.zeros((4, BK // B), dtype=tl.float32)
                tl.store(col_si_ptr + bcol[None, :] * mb_pad + prow[:, None], zeros, mask=pmask)
    else:
        if ROWWISE:
            # 1 x B blocks along K: stored scale-inverses (ceil(K / B), ru(M, 4)) at
            # [k // B, m]; the rows past M of the tile write the padding's zeros.
            scale = fp8_scale(_block_max(finite, BM, BK, 1, B), fmax, epsilon, FORCE_POW2)
            inv = _scale_inv(scale, _block_max(inf, BM, BK, 1, B))
            code = fp8_code(
                x,
                _block_mul(x, scale, BM, BK, 1, B),
                FMAX_BITS,
                SHIFT,
                MIN_NORMAL_BITS,
                DENORM_BITS,
                REBIAS,
            )
            tl.store(data_ptr + rows[:, None] * K + cols[None, :], code, mask=mask)
            bcol = pid_k * (BK // B) + tl.arange(0, BK // B).to(tl.int64)
            inv = tl.where(rows[:, None] < M, inv, 0.0)
            smask = (rows[:, None] < m_pad) & (bcol[None, :] < kb)
            tl.store(row_si_ptr + bcol[None, :] * m_pad + rows[:, None], inv, mask=smask)
        if COLUMNWISE:
            # B x 1 blocks along M (the columnwise matrix's 1 x B blocks): stored
            # scale-inverses (ceil(M / B), ru(K, 4)) at [m // B, k].
            scale = fp8_scale(_block_max(finite, BM, BK, B, 1), fmax, epsilon, FORCE_POW2)
            inv = _scale_inv(scale, _block_max(inf, BM, BK, B, 1))
            code = fp8_code(
                x,
                _block_mul(x, scale, BM, BK, B, 1),
                FMAX_BITS,
                SHIFT,
                MIN_NORMAL_BITS,
                DENORM_BITS,
                REBIAS,
            )
            _store_transposed(t_ptr, code, rows, cols, mask, M, K, PACK_T, BM, BK)
            brow = pid_m * (BM // B) + tl.arange(0, BM // B).to(tl.int64)
            inv = tl.where(cols[None, :] < K, inv, 0.0)
            smask = (brow[:, None] < mb) & (cols[None, :] < k_pad)
            tl.store(col_si_ptr + brow[:, None] * k_pad + cols[None, :], inv, mask=smask)


def build(interpret: bool) -> Any:
    """The launcher of the block quantize kernel: ``launch(grid, args, constexprs,
    num_warps=...)``, compiled or for Triton's interpreter (CPU tensors)."""
    return launchers((_block_quantize,), interpret)[0]
