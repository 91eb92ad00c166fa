"""Grouped GEMMs of FP8 operands with one scale per group, as Triton kernels on CUDA.

The grouped GEMM's backward (``ops/grouped_gemm.py``) has FP8 operands that torch 2.11
has no grouped kernel for: an E5M2 output gradient (TE's HYBRID format) times the E4M3
weights (the dgrad), and the wgrad, whose reduction runs over each group's rows (torch's
FP8 kernel for that layout needs every group non-empty and a multiple of 16 rows). These
two kernels take the codes as they are, as TE's FP8 GEMMs do: the products of FP8
values are exact, summed by the tensor cores, and each group's result is scaled once by
the product of its two scale inverses.

* :func:`row_grouped_mm`: ``out[m] = a[m] @ b[g(m)]^T``, the rows of ``a`` in groups
  (the dgrad: ``dy [M, N]`` times each group's weight, ``[G, K, N]``).
* :func:`group_reduced_mm`: ``out[g] = a_g^T @ b_g`` over each group's rows (the wgrad:
  ``dy_g^T x_g``, ``[G, N, K]``; an empty group gives zeros).

The grouped GEMM does not call them yet: at the MoE bench's shapes on an H100 they lose
to its bf16 GEMMs of dequantized operands (docs/moe.md has the figures). The group row
ends are read on the device, so nothing synchronizes and a CUDA graph replays the call
with the row counts the device holds. The operands may be any strided views.

``split_accumulator`` is TE's ``use_split_accumulator``: Hopper's FP8 MMA keeps fewer
mantissa bits in its running sum than fp32; with True each reduction tile's partial sum
is promoted to an fp32 accumulator (Triton's ``max_num_imprecise_acc``), with False the
hardware accumulates the whole sum (faster).

They run unchanged under ``TRITON_INTERPRET=1`` on CPU tensors (the sums in fp32 there),
which is how the tests check them without a GPU.
"""

from __future__ import annotations

import functools
from typing import Any, Optional

import torch

from . import triton_support

__all__ = [
    "available",
    "eligible",
    "group_reduced_mm",
    "row_grouped_mm",
    "unavailable_reason",
]

FP8_FORMATS = (torch.float8_e4m3fn, torch.float8_e5m2)
OUT_DTYPES = (torch.bfloat16, torch.float32)
# Tiles: BM (rows) x BC (output columns), BR of the reduction at a time.
ROW_TILE = (128, 128, 128)
REDUCED_TILE = (128, 128, 128)
WARPS = 8
STAGES = 3


@functools.cache
def unavailable_reason() -> Optional[str]:
    """Why the kernels cannot run here (None when Triton imports and the kernels build)."""
    return triton_support.unavailable_reason(_kernels)


def available() -> bool:
    """True when Triton is importable (the kernels are built on first use)."""
    return unavailable_reason() is None


def eligible(x: torch.Tensor) -> bool:
    """Whether FP8 codes ``x`` take the kernels: a real CUDA tensor on a GPU with FP8
    tensor cores (compute capability 8.9 or later), outside tracing and dispatch modes."""
    if type(x) is not torch.Tensor or x.device.type != "cuda" or x.dtype != torch.uint8:
        return False
    if torch.cuda.get_device_capability(x.device) < (8, 9):
        return False
    return triton_support.launchable_here() and available()


@functools.cache
def _kernels(interpret: bool = False) -> tuple[Any, Any]:
    from . import _grouped_fp8_gemm_triton

    return _grouped_fp8_gemm_triton.build(interpret)


def _check(
    fn: str,
    operands: dict[str, tuple[torch.Tensor, torch.dtype, torch.Tensor]],
    dims: dict[str, int],
    ends: torch.Tensor,
    out_dtype: torch.dtype,
) -> int:
    """The number of groups, after checking each operand ``name: (codes, format,
    scale_inv)`` (``dims``: its number of dimensions) and the row ends."""
    triton_support.check_runnable(fn, ends.device, unavailable_reason)
    if ends.dim() != 1 or ends.dtype != torch.int32:
        raise ValueError(
            f"{fn}: group row ends must be 1-D int32, got {ends.dtype} {tuple(ends.shape)}"
        )
    groups = ends.shape[0]
    for name, (codes, fp8, inv) in operands.items():
        if codes.dtype != torch.uint8 or codes.dim() != dims[name]:
            raise ValueError(
                f"{fn}: {name} must be {dims[name]}-D uint8 FP8 codes, got {codes.dtype} "
                f"{tuple(codes.shape)}"
            )
        if fp8 not in FP8_FORMATS:
            raise TypeError(f"{fn}: {name}: not an FP8 dtype: {fp8}")
        if tuple(inv.shape) != (groups,) or inv.dtype != torch.float32:
            raise ValueError(
                f"{fn}: {name}'s scale_inv must be fp32 of shape ({groups},), got {inv.dtype} "
                f"{tuple(inv.shape)}"
            )
        if codes.device != ends.device or inv.device != ends.device:
            raise ValueError(f"{fn}: {name} is on {codes.device}, the row ends on {ends.device}")
    if out_dtype not in OUT_DTYPES:
        raise TypeError(f"{fn}: writes bf16 or fp32, not {out_dtype}")
    return groups


def _out(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> tuple[Any, Any]:
    """``(result, what the kernel writes)``: bf16 is written as its int16 bit patterns."""
    out = torch.empty(shape, dtype=dtype, device=device)
    return out, out.view(torch.int16) if dtype == torch.bfloat16 else out


def _launch(
    which: int,
    grid: tuple[int, int, int],
    a: tuple[torch.Tensor, torch.dtype, torch.Tensor],
    b: tuple[torch.Tensor, torch.dtype, torch.Tensor],
    ends: torch.Tensor,
    middle: tuple[Any, ...],
    sizes: tuple[Any, ...],
    tiles: tuple[tuple[str, int], ...],
    out_dtype: torch.dtype,
    split_accumulator: bool,
) -> None:
    """Launch kernel ``which`` (0: row-grouped, 1: group-reduced) on ``grid``: its
    arguments are the two operands' codes and scale inverses, the row ends, ``middle``
    (what the kernel reads between the row ends and the sizes: the output), ``sizes``
    (sizes and strides), then the formats, the output's dtype, ``tiles`` and the
    accumulation. ``split_accumulator`` asks Triton to promote the tensor cores' partial
    sums to fp32 every reduction tile (``max_num_imprecise_acc``; None: the hardware's
    accumulation, Triton's default)."""
    (a_codes, a_fp8, a_inv), (b_codes, b_fp8, b_inv) = a, b
    reduction_tile = tiles[-1][1]
    with triton_support.on_its_device(a_codes):
        _kernels(a_codes.device.type != "cuda")[which](
            grid,
            (a_codes, b_codes, a_inv.contiguous(), b_inv.contiguous(), ends.contiguous())
            + middle
            + sizes,
            (
                ("A_E4M3", a_fp8 == torch.float8_e4m3fn),
                ("B_E4M3", b_fp8 == torch.float8_e4m3fn),
                ("OUT_BF16", out_dtype == torch.bfloat16),
                *tiles,
                ("IMPRECISE", reduction_tile if split_accumulator else None),
            ),
            num_warps=WARPS,
            num_stages=STAGES,
        )


def row_grouped_mm(
    a: tuple[torch.Tensor, torch.dtype, torch.Tensor],
    b: tuple[torch.Tensor, torch.dtype, torch.Tensor],
    ends: torch.Tensor,
    out_dtype: torch.dtype,
    *,
    split_accumulator: bool,
) -> torch.Tensor:
    """``out [M, C]``: row ``m`` of group ``g`` is ``sum_r a[m, r] * b[g, c, r]`` times
    ``a_inv[g] * b_inv[g]``. ``a = (codes [M, R], format, scale_inv [G])``,
    ``b = (codes [G, C, R], format, scale_inv [G])``; ``ends`` int32 ``[G]``: each
    group's end row (the groups' rows one after another, ending at ``M``)."""
    fn = "row_grouped_mm"
    groups = _check(fn, {"a": a, "b": b}, {"a": 2, "b": 3}, ends, out_dtype)
    a_codes, b_codes = a[0], b[0]
    m, r = a_codes.shape
    if b_codes.shape[0] != groups or b_codes.shape[2] != r:
        raise ValueError(
            f"{fn}: b must be [{groups}, C, {r}] (groups, columns, reduction), got "
            f"{tuple(b_codes.shape)}"
        )
    c = b_codes.shape[1]
    out, written = _out((m, c), out_dtype, a_codes.device)
    if m == 0 or c == 0:
        return out
    if r == 0 or groups == 0:
        return out.zero_()
    bm, bc, br = ROW_TILE
    # Each group's rows in BM tiles, numbered across the groups (tile_ends: the running
    # count); at most M / BM + G tiles, so the grid's first dimension covers them all.
    counts = torch.diff(ends, prepend=ends.new_zeros(1))
    tile_ends = torch.cumsum((counts + (bm - 1)) // bm, 0, dtype=torch.int32)
    grid = ((m + bm - 1) // bm + groups, (c + bc - 1) // bc, 1)
    _launch(
        0,
        grid,
        a,
        b,
        ends,
        (tile_ends, written),
        (c, r, groups, *a_codes.stride(), *b_codes.stride()),
        (("GP", max(16, 1 << (groups - 1).bit_length())), ("BM", bm), ("BC", bc), ("BR", br)),
        out_dtype,
        split_accumulator,
    )
    return out


def group_reduced_mm(
    a: tuple[torch.Tensor, torch.dtype, torch.Tensor],
    b: tuple[torch.Tensor, torch.dtype, torch.Tensor],
    ends: torch.Tensor,
    out_dtype: torch.dtype,
    *,
    split_accumulator: bool,
) -> torch.Tensor:
    """``out [G, P, C]``: group ``g``'s ``sum_m a[m, p] * b[m, c]`` over its rows,
    times ``a_inv[g] * b_inv[g]`` (zeros for an empty group). ``a = (codes [M, P],
    format, scale_inv [G])``, ``b = (codes [M, C], format, scale_inv [G])``; ``ends``
    int32 ``[G]``: each group's end row."""
    fn = "group_reduced_mm"
    groups = _check(fn, {"a": a, "b": b}, {"a": 2, "b": 2}, ends, out_dtype)
    a_codes, b_codes = a[0], b[0]
    m, p = a_codes.shape
    if b_codes.shape[0] != m:
        raise ValueError(
            f"{fn}: a and b must have the same rows, got {tuple(a_codes.shape)} and "
            f"{tuple(b_codes.shape)}"
        )
    c = b_codes.shape[1]
    out, written = _out((groups, p, c), out_dtype, a_codes.device)
    if out.numel() == 0:
        return out
    if m == 0:
        return out.zero_()
    bp, bc, br = REDUCED_TILE
    grid = (groups, (p + bp - 1) // bp, (c + bc - 1) // bc)
    _launch(
        1,
        grid,
        a,
        b,
        ends,
        (written,),
        (p, c, *a_codes.stride(), *b_codes.stride()),
        (("BP", bp), ("BC", bc), ("BR", br)),
        out_dtype,
        split_accumulator,
    )
    return out
