"""Fused Triton kernels for per-tensor FP8 current scaling on CUDA.

The reference path (``float8.py`` + ``encoding.py``: amax, scale, cast, transpose as
separate torch ops) stays the ground truth; these kernels reproduce it bit for bit
(``_data``, ``_transpose`` and ``_scale_inv``) in two passes over the input (the
kernels are in ``_fp8_triton.py``; ``_triton_launch.py`` launches them):

1. ``_amax``: finite amax (NaN and +-Inf ignored) of the whole tensor in chunks,
   one int32 word per program: the fp32 bits of its amax (non-negative floats order like
   their int32 bits), the sign bit set when its chunks hold an Inf. No atomics, so no
   buffer to zero first (a ``torch.zeros`` is a host call and a kernel of its own).
2. ``_cast_transpose``: every program reduces those words to the tensor's amax
   (max is exact in any order) and derives the scale from it exactly as
   ``encoding.scale_from_amax`` does (correctly rounded division, epsilon clamp,
   degenerate amax -> 1, Inf -> FP32_MAX, power-of-two truncation), casts one tile and
   stores it rowwise and/or transposed (columnwise; four codes per int32 word when the
   row count is a multiple of 4); program (0, 0) writes ``scale_inv``
   (+Inf when the tensor holds an Inf, as the reference: overflow stays detectable).

``fp8_current_scaling_quantize_bias_grad`` quantizes an output gradient and returns its
column sums (the bias gradient) from the same read (TE's ``bgrad_quantize``): its amax
pass (``_amax_colsum``) runs on 2-D blocks that also sum their columns in fp32, and the cast kernel's first
row of programs adds the blocks' sums. The buffers are the same bits; the sums are in a
fixed order (deterministic, not ``x.sum(0)``'s order).

The FP8 rounding is done on the fp32 bits with the same algorithm as c10's
``fp8e4m3fn_from_fp32_value`` / ``fp8e5m2_from_fp32_value`` (what the CPU ``.to()``
runs): saturation to the format's largest finite value (the reference clamps first),
round to nearest even, subnormals through an fp32 addition, NaN keeps its input's sign
(the reference's CPU multiply keeps a NaN's sign; a GPU multiply would not, so the
sign is taken from the input). It does not depend on the hardware conversion or on the
Triton version, and runs unchanged under ``TRITON_INTERPRET=1`` on CPU tensors, which
is how the tests check it without a GPU.

Triton is imported lazily: this module imports fine on a CPU-only torch without it.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Optional

import torch

from ..quantization.encoding import FP8_MAX, transposed_shape
from ..runtime import _torch_private as _private
from ..runtime import lowering
from ..runtime.library import op_library
from . import triton_support

__all__ = [
    "available",
    "eligible",
    "fp8_current_scaling_quantize",
    "fp8_current_scaling_quantize_bias_grad",
    "unavailable_reason",
]

# Launch configuration, the fastest of ``python -m benchmarks.fp8_tiles`` on an H200
# (4096x8192 and 8192x8192 bf16; docs/benchmarks.md): the cast + transpose kernel on
# 32x128 tiles with 2 warps, its transpose stored as int32 words of four codes where the
# row count allows (58 us at 4096x8192 against 88 us for bytes on 64x64 tiles; a bf16
# copy of the tensor takes 37 us); the amax kernel in chunks of 2048 on at most 1056
# programs with 8 warps (28 us against 35 us for 4096 on 1024). With the cast kernel
# reading one word per amax program, 1056 programs are still the fastest: one quantize
# of 4096x8192 takes 84 us, against 88, 99 and 126 us on 528, 264 and 132.
BLOCK_M = 32
BLOCK_K = 128
CAST_WARPS = 2
AMAX_BLOCK = 2048
AMAX_MAX_PROGRAMS = 1056
AMAX_WARPS = 8
# The amax + column-sum pass (an output gradient's bias gradient, fused): blocks of
# this many rows by BLOCK_K columns per loop step, about as many programs as above.
COLUMN_SUM_ROWS = 16
# The cast kernel reads every amax program's word in one block of this (power of 2) size.
PARTIAL_BLOCK = 1 << (AMAX_MAX_PROGRAMS - 1).bit_length()

# (mantissa bits, exponent bias) of each FP8 format.
_FORMATS = {torch.float8_e4m3fn: (3, 7), torch.float8_e5m2: (2, 15)}


@functools.cache
def unavailable_reason() -> Optional[str]:
    """Why the kernels cannot run here (None when Triton imports and kernels build)."""
    return triton_support.unavailable_reason(_kernels)


def available() -> bool:
    """True when Triton is importable (the kernels are built on first use)."""
    return unavailable_reason() is None


def eligible(x: torch.Tensor) -> bool:
    """Whether ``x`` should take the fused path: a real CUDA tensor outside tracing.

    Under ``torch.compile``, fake tensors, functionalization or any dispatch mode the
    reference ops run instead (they trace; a raw kernel launch would not).
    """
    return triton_support.takes_recorded_kernel(x, available)


@functools.cache
def _kernels(interpret: bool = False) -> tuple[Any, Any, Any]:
    """(amax, amax + column sums, cast + transpose) launchers, compiled or for Triton's
    interpreter."""
    from . import _fp8_triton

    return _fp8_triton.build(interpret)


@functools.lru_cache(maxsize=64)
def fp8_constants(fp8_dtype: torch.dtype, epsilon: float) -> tuple[float, float, dict[str, int]]:
    """(fmax, epsilon rounded to fp32 as the reference's clamp sees it, bit constants)."""
    fmax = FP8_MAX[fp8_dtype]
    mbits, bias = _FORMATS[fp8_dtype]
    eps32 = float(torch.tensor(epsilon, dtype=torch.float32))
    bits = {
        "FMAX_BITS": int(torch.tensor(fmax, dtype=torch.float32).view(torch.int32)),
        "SHIFT": 23 - mbits,
        "MIN_NORMAL_BITS": (127 - bias + 1) << 23,  # smallest normal FP8 value, fp32 bits
        "DENORM_BITS": ((127 - bias) + (23 - mbits) + 1) << 23,
        "REBIAS": ((bias - 127) << 23) + (1 << (22 - mbits)) - 1,  # exponent + half - 1
    }
    return fmax, eps32, bits


@functools.lru_cache(maxsize=256)
def _cast_constexprs(
    fp8_dtype: torch.dtype,
    force_pow_2: bool,
    rowwise: bool,
    columnwise: bool,
    pack_t: bool,
    bias_grad: bool,
) -> tuple[tuple[str, Any], ...]:
    """The cast kernel's constexprs as the launcher's hashable ``(name, value)`` pairs,
    built once per configuration (a quantize is on a host-bound path)."""
    return (
        ("PARTIAL_BLOCK", PARTIAL_BLOCK),
        *fp8_constants(fp8_dtype, 0.0)[2].items(),
        ("FORCE_POW2", force_pow_2),
        ("ROWWISE", rowwise),
        ("COLUMNWISE", columnwise),
        ("PACK_T", pack_t),
        ("BGRAD", bias_grad),
        ("BM", BLOCK_M),
        ("BK", BLOCK_K),
    )


_AMAX_CONSTEXPRS = (("BLOCK", AMAX_BLOCK),)
_COLSUM_CONSTEXPRS = (("BR", COLUMN_SUM_ROWS), ("BK", BLOCK_K))


def fp8_current_scaling_quantize(
    x: torch.Tensor,
    fp8_dtype: torch.dtype,
    *,
    epsilon: float = 0.0,
    force_pow_2: bool = False,
    rowwise: bool = True,
    columnwise: bool = True,
) -> dict[str, Optional[torch.Tensor]]:
    """The inner buffers of ``Float8CurrentScalingQuantizer`` for ``x``, fused.

    ``x`` is a CUDA tensor (or, under ``TRITON_INTERPRET=1``, a CPU one) of fp32, bf16
    or fp16 with at least one dim. Returns ``_data`` (uint8, ``x.shape``; None unless
    ``rowwise``), ``_transpose`` (uint8, ``(K, d0, ...)``; None unless ``columnwise``)
    and ``_scale_inv`` (fp32, ``(1,)``), equal bit for bit to the reference.
    """
    return fused_quantize(x, fp8_dtype, epsilon, force_pow_2, rowwise, columnwise, False)[0]


def fp8_current_scaling_quantize_bias_grad(
    x: torch.Tensor,
    fp8_dtype: torch.dtype,
    *,
    epsilon: float = 0.0,
    force_pow_2: bool = False,
    rowwise: bool = True,
    columnwise: bool = True,
) -> tuple[dict[str, Optional[torch.Tensor]], torch.Tensor]:
    """:func:`fp8_current_scaling_quantize` of a 2-D ``x`` (an output gradient) and its
    column sums in fp32 (the bias gradient), from the same pass over ``x`` (TE's
    ``bgrad_quantize``). The buffers are the reference's bits; the sums are fp32 sums of
    every column (NaN and Inf propagate) in a fixed order, not ``x.sum(0)``'s order."""
    if x.dim() != 2:
        raise ValueError(
            f"fp8_current_scaling_quantize_bias_grad: needs a 2-D tensor, got {tuple(x.shape)}"
        )
    buffers, bgrad = fused_quantize(x, fp8_dtype, epsilon, force_pow_2, rowwise, columnwise, True)
    assert bgrad is not None
    return buffers, bgrad


def _row_groups(m: int, k: int) -> tuple[int, int]:
    """(row groups, rows per group) of the amax + column-sum pass over an ``m x k``
    tensor (``m, k > 0``): about as many programs as the flat amax pass, each a multiple
    of its row block tall."""
    blocks = triton_cdiv(k, BLOCK_K)
    wanted = max(1, min(triton_cdiv(m, COLUMN_SUM_ROWS), AMAX_MAX_PROGRAMS // blocks))
    rows = triton_cdiv(triton_cdiv(m, wanted), COLUMN_SUM_ROWS) * COLUMN_SUM_ROWS
    return max(triton_cdiv(m, rows), 1), rows


_NAMES = {False: "fp8_current_scaling_quantize", True: "fp8_current_scaling_quantize_bias_grad"}


def fused_quantize(
    x: torch.Tensor,
    fp8_dtype: torch.dtype,
    epsilon: float,
    force_pow_2: bool,
    rowwise: bool,
    columnwise: bool,
    bias_grad: bool,
) -> tuple[dict[str, Optional[torch.Tensor]], Optional[torch.Tensor]]:
    """``(buffers, bias gradient or None)``: both entry points above in one positional
    call (what a quantizer calls; ``bias_grad`` needs a 2-D ``x``)."""
    name = _NAMES[bias_grad]
    if fp8_dtype not in _FORMATS:
        raise TypeError(f"{name}: not an FP8 dtype: {fp8_dtype}")
    if x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise TypeError(f"{name}: cannot quantize dtype {x.dtype}")
    if x.dim() < 1:
        raise ValueError(f"{name}: needs at least one dim")
    device = x.device
    triton_support.check_runnable(name, device, unavailable_reason)
    if isinstance(x, _private.FakeTensor):  # traced for a lowered op call (see eligible)
        return _recorded(x, fp8_dtype, epsilon, force_pow_2, rowwise, columnwise, bias_grad)
    if device.type == "cuda" and device.index != _private.cuda_current_device():
        # Triton launches on the current device: make it the tensor's.
        with torch.cuda.device(device):
            return fused_quantize(
                x, fp8_dtype, epsilon, force_pow_2, rowwise, columnwise, bias_grad
            )
    amax_kernel, colsum_kernel, cast_kernel = _kernels(device.type != "cuda")
    shape = x.shape
    k = shape[-1]
    two_d = len(shape) == 2
    m = shape[0] if two_d else math.prod(shape[:-1])
    x2 = x  # read by the kernels only: no autograd history is made from it
    if not two_d or not x.is_contiguous():
        x2 = x.detach().reshape(m, k).contiguous()
    n = m * k
    colsum = bgrad = None
    groups = 0
    if bias_grad:
        blocks = triton_cdiv(k, BLOCK_K)
        groups, rows = _row_groups(m, k) if n > 0 else (0, 0)
        if 0 < groups * blocks <= PARTIAL_BLOCK:
            bgrad = torch.empty(k, dtype=torch.float32, device=device)
        else:
            # Nothing to read, or more column blocks than the cast kernel's amax block
            # holds: the flat amax pass, and the column sums by torch.
            bgrad = x2.sum(0, dtype=torch.float32)
            groups = 0
    if groups:
        n_partial = groups * blocks
        partial = torch.empty(n_partial, dtype=torch.int32, device=device)
        colsum = torch.empty(groups, k, dtype=torch.float32, device=device)
        colsum_kernel(
            (groups, blocks, 1),
            (x2, partial, colsum, m, k, rows),
            _COLSUM_CONSTEXPRS,
            num_warps=AMAX_WARPS,
        )
    else:
        n_partial = min(triton_cdiv(n, AMAX_BLOCK), AMAX_MAX_PROGRAMS)
        partial = torch.empty(max(n_partial, 1), dtype=torch.int32, device=device)
        if n_partial > 0:
            amax_kernel((n_partial, 1, 1), (x2, partial, n), _AMAX_CONSTEXPRS, num_warps=AMAX_WARPS)
    data = torch.empty(shape, dtype=torch.uint8, device=device) if rowwise else None
    scale_inv = torch.empty(1, dtype=torch.float32, device=device)
    dummy = scale_inv  # never written when its usage is off (constexpr-pruned)
    # Four codes per int32 store in the transpose: each of its rows holds m codes.
    pack_t = columnwise and m % 4 == 0
    transpose = None
    t_arg = dummy
    if pack_t and two_d:
        # Made as the int32 words the kernel stores, viewed as the (k, m) codes.
        t_arg = torch.empty((k, m // 4), dtype=torch.int32, device=device)
        transpose = t_arg.view(torch.uint8)
    elif columnwise:
        transpose = torch.empty(transposed_shape(shape), dtype=torch.uint8, device=device)
        t_arg = transpose.view(-1).view(torch.int32) if pack_t else transpose
    fmax, eps32, _ = fp8_constants(fp8_dtype, float(epsilon))
    grid = (max(triton_cdiv(m, BLOCK_M), 1), max(triton_cdiv(k, BLOCK_K), 1), 1)
    cast_kernel(
        grid,
        (
            x2,
            partial,
            data if data is not None else dummy,
            t_arg,
            scale_inv,
            m,
            k,
            fmax,
            eps32,
            n_partial,
            colsum if colsum is not None else dummy,
            bgrad if colsum is not None else dummy,
            groups,
        ),
        _cast_constexprs(
            fp8_dtype,
            bool(force_pow_2),
            bool(rowwise),
            bool(columnwise),
            pack_t,
            colsum is not None,
        ),
        num_warps=CAST_WARPS,
    )
    return {"_data": data, "_transpose": transpose, "_scale_inv": scale_inv}, bgrad


def _recorded(x: torch.Tensor, *config: Any) -> tuple[dict[str, Any], Optional[torch.Tensor]]:
    """:func:`fused_quantize` of a fake tensor (``config``: its arguments after ``x``) as
    one recorded op call."""
    data, transpose, scale_inv, bgrad = _quantize_op()(x, *config)
    rowwise, columnwise, bias_grad = config[3:]
    buffers = {
        "_data": data if rowwise else None,
        "_transpose": transpose if columnwise else None,
        "_scale_inv": scale_inv,
    }
    return buffers, bgrad if bias_grad else None


_OP_SCHEMA = (
    "fp8_current_scaling_quantize(Tensor x, ScalarType fp8_dtype, float epsilon, "
    "bool force_pow_2, bool rowwise, bool columnwise, bool bias_grad) "
    "-> (Tensor, Tensor, Tensor, Tensor)"
)


@functools.cache
def _quantize_op() -> Any:
    """``teops_quantization::fp8_current_scaling_quantize``: :func:`fused_quantize` as one
    custom op (its arguments in its order), what a lowered graph records (a buffer a
    usage leaves out, and the bias gradient when not asked for, as 0-element tensors).
    Defined when ``runtime/lowering.py`` joins Inductor (a cached graph may call it with
    nothing traced); on a ``Library`` with no autograd layer (its input never requires
    grad), so Inductor's call of it costs one dispatch."""

    def kernel(x: torch.Tensor, *config: Any) -> tuple[torch.Tensor, ...]:
        buffers, bgrad = fused_quantize(x, *config)
        data, transpose = buffers["_data"], buffers["_transpose"]
        return (
            x.new_empty(0, dtype=torch.uint8) if data is None else data,
            x.new_empty(0, dtype=torch.uint8) if transpose is None else transpose,
            buffers["_scale_inv"],
            x.new_empty(0, dtype=torch.float32) if bgrad is None else bgrad,
        )

    def fake(x: torch.Tensor, *config: Any) -> tuple[torch.Tensor, ...]:
        rowwise, columnwise, bias_grad = config[3:]
        shape = tuple(x.shape)
        return (
            x.new_empty(shape if rowwise else (0,), dtype=torch.uint8),
            x.new_empty(tuple(transposed_shape(shape)) if columnwise else (0,), dtype=torch.uint8),
            x.new_empty((1,), dtype=torch.float32),
            x.new_empty((shape[-1],) if bias_grad else (0,), dtype=torch.float32),
        )

    lib = op_library("teops_quantization")
    lib.define(_OP_SCHEMA)
    lib.impl("fp8_current_scaling_quantize", kernel, "CompositeExplicitAutograd")
    torch.library.register_fake("teops_quantization::fp8_current_scaling_quantize", fake, lib=lib)
    return torch.ops.teops_quantization.fp8_current_scaling_quantize.default


lowering.records(_quantize_op)


def triton_cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b
