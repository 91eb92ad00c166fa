"""The Triton kernels behind ``grouped_fp8_gemm`` (imported only when Triton is present):
grouped GEMMs of FP8 codes, E4M3 or E5M2 on either side, with one scale inverse per
group and operand."""

from __future__ import annotations

from typing import Any

import triton
import triton.language as tl

from ._group_fp8_triton import bf16_bits
from ._triton_launch import launchers


@triton.jit
def as_fp8(codes, E4M3: tl.constexpr):  # noqa: N803
    """A tile of uint8 codes as the FP8 values they encode (a bit cast; one return, as
    Triton checks every return's type even where a constexpr picks the branch)."""
    if E4M3:
        values = codes.to(tl.float8e4nv, bitcast=True)
    else:
        values = codes.to(tl.float8e5, bitcast=True)
    return values


@triton.jit
def store_scaled(out_ptr, offsets, mask, acc, scale, OUT_BF16: tl.constexpr):  # noqa: N803
    """``acc * scale`` (one fp32 multiply) stored as fp32, or rounded to bf16 on the bits
    (to nearest even; Triton's interpreter truncates in its own conversion)."""
    v = acc * scale
    if OUT_BF16:
        tl.store(out_ptr + offsets, bf16_bits(v), mask=mask)
    else:
        tl.store(out_ptr + offsets, v, mask=mask)


@triton.jit
def group_rows(ends_ptr, g):
    """``(first row, end row)`` of group ``g``: the int32 row offsets hold each group's
    end, a group starts where the one before it ends."""
    start = tl.load(ends_ptr + g - 1, mask=g > 0, other=0)
    return start.to(tl.int64), tl.load(ends_ptr + g).to(tl.int64)


def _row_grouped(
    a_ptr,
    b_ptr,
    a_inv_ptr,
    b_inv_ptr,
    ends_ptr,
    tile_ends_ptr,
    out_ptr,
    C,  # noqa: N803
    R,  # noqa: N803
    G,  # noqa: N803
    s_am,
    s_ar,
    s_bg,
    s_bc,
    s_br,
    A_E4M3: tl.constexpr,  # noqa: N803
    B_E4M3: tl.constexpr,  # noqa: N803
    OUT_BF16: tl.constexpr,  # noqa: N803
    GP: tl.constexpr,  # noqa: N803
    BM: tl.constexpr,  # noqa: N803
    BC: tl.constexpr,  # noqa: N803
    BR: tl.constexpr,  # noqa: N803
    IMPRECISE: tl.constexpr,  # noqa: N803
):
    # out[m, c] = sum_r a[m, r] b[g, c, r] * a_inv[g] * b_inv[g], m in group g. Program
    # (t, j) takes row tile t of the groups' row tiles (each group's rows cut into BM
    # tiles, the groups one after another: tile_ends holds each group's end) and the
    # columns j * BC ...; programs past the last tile return at once.
    t = tl.program_id(0)
    gs = tl.arange(0, GP)
    tile_ends = tl.load(tile_ends_ptr + gs, mask=gs < G, other=2147483647)
    g = tl.sum((tile_ends <= t).to(tl.int32), axis=0)
    if g < G:
        first_tile = tl.load(tile_ends_ptr + g - 1, mask=g > 0, other=0)
        start, end = group_rows(ends_ptr, g)
        rows = start + (t - first_tile).to(tl.int64) * BM + tl.arange(0, BM).to(tl.int64)
        cols = tl.program_id(1).to(tl.int64) * BC + tl.arange(0, BC).to(tl.int64)
        b_base = b_ptr + g.to(tl.int64) * s_bg
        acc = tl.zeros((BM, BC), dtype=tl.float32)
        for r0 in range(0, R, BR):
            rr = r0 + tl.arange(0, BR).to(tl.int64)
            a = tl.load(
                a_ptr + rows[:, None] * s_am + rr[None, :] * s_ar,
                mask=(rows[:, None] < end) & (rr[None, :] < R),
                other=0,
            )
            b = tl.load(
                b_base + rr[:, None] * s_br + cols[None, :] * s_bc,
                mask=(rr[:, None] < R) & (cols[None, :] < C),
                other=0,
            )
            acc = tl.dot(as_fp8(a, A_E4M3), as_fp8(b, B_E4M3), acc, max_num_imprecise_acc=IMPRECISE)
        scale = tl.load(a_inv_ptr + g) * tl.load(b_inv_ptr + g)
        mask = (rows[:, None] < end) & (cols[None, :] < C)
        store_scaled(out_ptr, rows[:, None] * C + cols[None, :], mask, acc, scale, OUT_BF16)


def _group_reduced(
    a_ptr,
    b_ptr,
    a_inv_ptr,
    b_inv_ptr,
    ends_ptr,
    out_ptr,
    P,  # noqa: N803
    C,  # noqa: N803
    s_am,
    s_ap,
    s_bm,
    s_bc,
    A_E4M3: tl.constexpr,  # noqa: N803
    B_E4M3: tl.constexpr,  # noqa: N803
    OUT_BF16: tl.constexpr,  # noqa: N803
    BP: tl.constexpr,  # noqa: N803
    BC: tl.constexpr,  # noqa: N803
    BR: tl.constexpr,  # noqa: N803
    IMPRECISE: tl.constexpr,  # noqa: N803
):
    # out[g, p, c] = sum_{m in group g} a[m, p] b[m, c] * a_inv[g] * b_inv[g]. Program
    # (g, i, j) reduces group g's rows for the tile (i * BP ..., j * BC ...); an empty
    # group writes zeros.
    g = tl.program_id(0)
    start, end = group_rows(ends_ptr, g)
    ps = tl.program_id(1).to(tl.int64) * BP + tl.arange(0, BP).to(tl.int64)
    cs = tl.program_id(2).to(tl.int64) * BC + tl.arange(0, BC).to(tl.int64)
    acc = tl.zeros((BP, BC), dtype=tl.float32)
    for r0 in range(start, end, BR):
        rr = r0 + tl.arange(0, BR).to(tl.int64)
        a = tl.load(
            a_ptr + rr[None, :] * s_am + ps[:, None] * s_ap,
            mask=(rr[None, :] < end) & (ps[:, None] < P),
            other=0,
        )
        b = tl.load(
            b_ptr + rr[:, None] * s_bm + cs[None, :] * s_bc,
            mask=(rr[:, None] < end) & (cs[None, :] < C),
            other=0,
        )
        acc = tl.dot(as_fp8(a, A_E4M3), as_fp8(b, B_E4M3), acc, max_num_imprecise_acc=IMPRECISE)
    scale = tl.load(a_inv_ptr + g) * tl.load(b_inv_ptr + g)
    mask = (ps[:, None] < P) & (cs[None, :] < C)
    offsets = g.to(tl.int64) * P * C + ps[:, None] * C + cs[None, :]
    store_scaled(out_ptr, offsets, mask, acc, scale, OUT_BF16)


def build(interpret: bool) -> tuple[Any, Any]:
    """Launchers of (row-grouped GEMM, group-reduced GEMM): ``launch(grid, args,
    constexprs, num_warps=..., num_stages=...)``, compiled or for Triton's interpreter."""
    return launchers((_row_grouped, _group_reduced), interpret)  # type: ignore[return-value]
