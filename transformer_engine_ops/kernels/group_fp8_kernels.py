"""Triton kernels for FP8 current scaling with one scale per group of rows on CUDA.

The grouped GEMM (``ops/grouped_gemm.py``) quantizes each GEMM's input rows, each
output-gradient group and each stacked weight with its own current scale. As torch ops
that is a dozen passes over fp32 copies of the operand (widen, ``|x|`` with NaN and Inf
masked, the row amax, the Inf test, the scaled product, the clamp, the cast). Two
kernels do it in two passes over the operand as it is (bf16, fp16 or fp32):

1. :func:`row_amax`: each row's finite amax (NaN and +-Inf ignored) and whether it
   holds an Inf, in one read. The caller reduces the rows to their group's amax
   (``[rows]`` values, not ``[rows, K]``) and derives the scales with the quantizer's
   own ``_scale_of_amax``.
2. :func:`cast_rows`: each row times its own scale, rounded to FP8 codes, in one read
   and one uint8 write.

The backward's GEMMs without an FP8 kernel (the wgrad, and the dgrad of an E5M2
gradient) read the operands dequantized; :func:`dequantize_rows` makes them in one read
of the codes and one bf16 write, where the torch ops widen to fp32, scale and round in
three passes.

All are the torch reference's bits: max is exact in any order, the scaled product is
one fp32 multiply, the rounding to FP8 is ``_fp8_triton.fp8_code`` (c10's conversion
after the reference's clamp, which ``cuda_kernels`` uses and tests), an FP8 value is
built from its bits and a bf16 one is rounded to nearest even on the bits (a NaN stays
a NaN of its sign, its payload not kept, as CPU and CUDA conversions differ there). They run
unchanged under ``TRITON_INTERPRET=1`` on CPU tensors, which is how the tests check
them without a GPU. The grouped GEMM takes them for real CUDA tensors outside tracing
(:func:`eligible`); under tracing, fake tensors or on the CPU it runs the torch ops.

Triton is imported lazily: this module imports fine on a CPU-only torch without it.
"""

from __future__ import annotations

import functools
from typing import Any, Optional

import torch

from . import triton_support
from .cuda_kernels import fp8_constants

__all__ = [
    "available",
    "cast_rows",
    "dequantize_rows",
    "eligible",
    "row_amax",
    "unavailable_reason",
]

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
FP8_FORMATS = (torch.float8_e4m3fn, torch.float8_e5m2)
# Row amax: BR rows a program, read BK columns at a time. Row cast: BM x BK tiles (the
# per-tensor cast kernel's tile, cuda_kernels.BLOCK_M x BLOCK_K).
AMAX_ROWS = 8
AMAX_COLS = 256
AMAX_WARPS = 4
CAST_ROWS = 32
CAST_COLS = 128
CAST_WARPS = 2


@functools.cache
def unavailable_reason() -> Optional[str]:
    """Why the kernels cannot run here (None when Triton imports and the kernels build)."""
    return triton_support.unavailable_reason(_kernels)


def available() -> bool:
    """True when Triton is importable (the kernels are built on first use)."""
    return unavailable_reason() is None


def eligible(x: torch.Tensor) -> bool:
    """Whether ``x`` takes the kernels: a real CUDA tensor (or Parameter) with elements,
    of fp32, bf16 or fp16 (an operand to quantize) or uint8 (FP8 codes to dequantize),
    outside tracing and dispatch modes."""
    if type(x) not in (torch.Tensor, torch.nn.Parameter) or x.device.type != "cuda":
        return False
    if (x.dtype not in DTYPES and x.dtype != torch.uint8) or x.numel() == 0:
        return False
    return triton_support.launchable_here() and available()


@functools.cache
def _kernels(interpret: bool = False) -> tuple[Any, Any, Any]:
    from . import _group_fp8_triton

    return _group_fp8_triton.build(interpret)


def _matrix(fn: str, x: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """``(matrix, bf16 bits)``: ``x`` as the contiguous ``[M, K]`` matrix the kernels
    read (a bf16 one as its int16 bit patterns, widened exactly in the kernel), after
    the checks."""
    triton_support.check_runnable(fn, x.device, unavailable_reason)
    if x.dim() != 2:
        raise ValueError(f"{fn}: needs a 2-D [rows, K] tensor, got {tuple(x.shape)}")
    if x.dtype not in DTYPES:
        raise TypeError(f"{fn}: cannot quantize dtype {x.dtype}")
    x = x.detach().contiguous()
    if x.dtype == torch.bfloat16:
        return x.view(torch.int16), True
    return x, False


def _tiles(m: int, k: int) -> tuple[int, int, int]:
    """The grid of the cast and dequantize kernels over an ``m x k`` matrix."""
    return ((m + CAST_ROWS - 1) // CAST_ROWS, (k + CAST_COLS - 1) // CAST_COLS, 1)


def row_amax(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(amax, has_inf)`` of each row of ``x`` ``[M, K]``: fp32 ``[M]``, the finite
    amax (NaN and +-Inf ignored, 0 for an empty row), and bool ``[M]``, whether the row
    holds a +-Inf."""
    x, bf16_bits = _matrix("row_amax", x)
    m, k = x.shape
    words = torch.empty(m, dtype=torch.int32, device=x.device)
    if m and k:
        amax_kernel = _kernels(x.device.type != "cuda")[0]
        grid = ((m + AMAX_ROWS - 1) // AMAX_ROWS, 1, 1)
        with triton_support.on_its_device(x):
            amax_kernel(
                grid,
                (x, words, m, k),
                (("BF16_BITS", bf16_bits), ("BR", AMAX_ROWS), ("BK", AMAX_COLS)),
                num_warps=AMAX_WARPS,
            )
    elif m:
        words.zero_()
    amax = (words & 0x7FFFFFFF).view(torch.float32)
    return amax, words < 0


@functools.cache
def _cast_constexprs(fp8_dtype: torch.dtype, bf16_bits: bool) -> tuple[tuple[str, Any], ...]:
    """The cast kernel's constexprs, built once per configuration (a host-bound path)."""
    bits = fp8_constants(fp8_dtype, 0.0)[2]
    return (*bits.items(), ("BF16_BITS", bf16_bits), ("BM", CAST_ROWS), ("BK", CAST_COLS))


def cast_rows(x: torch.Tensor, scale: torch.Tensor, fp8_dtype: torch.dtype) -> torch.Tensor:
    """uint8 FP8 codes ``[M, K]`` of ``x`` ``[M, K]``, row ``i`` times ``scale[i]``
    (fp32 ``[M]``): the reference's ``cast_to_fp8(x.float() * scale[:, None])``."""
    fn = "cast_rows"
    x, bf16_bits = _matrix(fn, x)
    m, k = x.shape
    if tuple(scale.shape) != (m,) or scale.dtype != torch.float32:
        raise ValueError(
            f"{fn}: scale must be fp32 of shape ({m},), got {scale.dtype} {tuple(scale.shape)}"
        )
    if fp8_dtype not in FP8_FORMATS:
        raise TypeError(f"{fn}: not an FP8 dtype: {fp8_dtype}")
    codes = torch.empty((m, k), dtype=torch.uint8, device=x.device)
    if m and k:
        cast_kernel = _kernels(x.device.type != "cuda")[1]
        with triton_support.on_its_device(x):
            cast_kernel(
                _tiles(m, k),
                (x, scale.contiguous(), codes, m, k),
                _cast_constexprs(fp8_dtype, bf16_bits),
                num_warps=CAST_WARPS,
            )
    return codes


@functools.cache
def _dequantize_constexprs(fp8_dtype: torch.dtype, bf16: bool) -> tuple[tuple[str, Any], ...]:
    """The dequantize kernel's constexprs, built once per configuration."""
    e4m3 = fp8_dtype == torch.float8_e4m3fn
    return (("E4M3", e4m3), ("BF16_OUT", bf16), ("BM", CAST_ROWS), ("BK", CAST_COLS))


def dequantize_rows(
    codes: torch.Tensor, fp8_dtype: torch.dtype, scale_inv: torch.Tensor, out_dtype: torch.dtype
) -> torch.Tensor:
    """``out_dtype`` (bf16 or fp32) values ``[M, K]`` of uint8 FP8 codes ``[M, K]``,
    row ``i`` times ``scale_inv[i]`` (fp32 ``[M]``): the reference's
    ``(codes.view(fp8_dtype).float() * scale_inv[:, None]).to(out_dtype)``, in one read
    of the codes and one write (a NaN is a NaN of its sign; its payload is not kept)."""
    fn = "dequantize_rows"
    triton_support.check_runnable(fn, codes.device, unavailable_reason)
    if codes.dim() != 2 or codes.dtype != torch.uint8:
        raise ValueError(
            f"{fn}: needs 2-D uint8 codes [rows, K], got {codes.dtype} {tuple(codes.shape)}"
        )
    m, k = codes.shape
    if tuple(scale_inv.shape) != (m,) or scale_inv.dtype != torch.float32:
        raise ValueError(
            f"{fn}: scale_inv must be fp32 of shape ({m},), got {scale_inv.dtype} "
            f"{tuple(scale_inv.shape)}"
        )
    if fp8_dtype not in FP8_FORMATS:
        raise TypeError(f"{fn}: not an FP8 dtype: {fp8_dtype}")
    if out_dtype not in (torch.bfloat16, torch.float32):
        raise TypeError(f"{fn}: writes bf16 or fp32, not {out_dtype}")
    out = torch.empty((m, k), dtype=out_dtype, device=codes.device)
    if m and k:
        kernel = _kernels(codes.device.type != "cuda")[2]
        bf16 = out_dtype == torch.bfloat16
        with triton_support.on_its_device(codes):
            kernel(
                _tiles(m, k),
                (
                    codes.contiguous(),
                    scale_inv.contiguous(),
                    out.view(torch.int16) if bf16 else out,
                    m,
                    k,
                ),
                _dequantize_constexprs(fp8_dtype, bf16),
                num_warps=CAST_WARPS,
            )
    return out
