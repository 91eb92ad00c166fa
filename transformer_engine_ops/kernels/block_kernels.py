"""A fused Triton quantize for FP8 block scaling (``Float8BlockQuantizer``) on CUDA.

The reference (``float8_block.py`` + ``encoding.py``: blocks, amaxes, scales, casts,
transposes and padded scale layouts as dozens of torch ops and fp32 copies) stays the
ground truth; this kernel (``_fp8_block_triton.py``) writes the same buffers bit for bit
from one read of the input. One program per (BM x BK) tile:

* the tile's block amaxes (NaN and +-Inf ignored) and Inf flags: 1 x b blocks along K
  for the rowwise data, b x 1 blocks along M for the columnwise data (the transpose's
  1 x b blocks: a tile b rows tall holds whole ones), or b x b blocks (2-D);
* each block's scale as ``encoding.scale_from_amax`` and its scale-inverse (``1 /
  scale`` correctly rounded, +Inf for a block holding an Inf), the codes rounded as
  c10's FP8 conversion: the helpers ``_fp8_triton`` uses for current scaling;
* the rowwise codes, the transposed (columnwise) codes (for 2-D the transpose of the
  rowwise ones), and the scale-inverses straight into the stored padded layouts of
  ``float8_block._pad_scale_inv``, their zero padding written by the edge tiles, so
  every buffer comes from ``torch.empty``.

Block lengths that are powers of two up to 128 (tiles are powers of two, multiples of
the block along each dim the blocks run); other lengths take the reference
(:func:`supports`). Like ``cuda_kernels``, traced under a lowering the kernel is
recorded as one op (``teops_quantization::fp8_block_quantize``), so a block-scaled op
call lowers into Inductor on CUDA (``Float8BlockQuantizer.lowers_bitwise_on``) with the
same kernel eager runs.

Triton is imported lazily: this module imports fine on a CPU-only torch without it.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Optional

import torch

from ..quantization.encoding import ceil_div, round_up, transposed_shape
from ..runtime import _torch_private as _private
from ..runtime import lowering
from ..runtime.library import op_library
from . import cuda_kernels, triton_support

__all__ = ["available", "eligible", "fused_quantize", "supports", "unavailable_reason"]

# Launch configuration per (2-D blocks, rowwise, columnwise): (BM, BK, warps); BM is
# raised to the block length where blocks run along M (columnwise 1-D, 2-D), BK where
# they run along K (rowwise 1-D, 2-D). ``python -m benchmarks.block_quantize`` sweeps
# others on CUDA.
TILES: dict[tuple[bool, bool, bool], tuple[int, int, int]] = {
    (False, True, False): (32, 128, 4),
    (False, False, True): (128, 64, 4),
    (False, True, True): (128, 128, 8),
    (True, True, False): (128, 128, 8),
    (True, False, True): (128, 128, 8),
    (True, True, True): (128, 128, 8),
}
MAX_BLOCK_LEN = 128
_INPUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@functools.cache
def unavailable_reason() -> Optional[str]:
    """Why the kernel cannot run here (None when Triton imports and it builds)."""
    return triton_support.unavailable_reason(_kernel)


def available() -> bool:
    """True when Triton is importable (the kernel is built on first use)."""
    return unavailable_reason() is None


def supports(block_len: int) -> bool:
    """Whether the kernel handles this block length: a power of two up to 128."""
    return 0 < block_len <= MAX_BLOCK_LEN and block_len & (block_len - 1) == 0


def eligible(x: torch.Tensor, block_len: int) -> bool:
    """Whether ``x`` takes the kernel: a real CUDA tensor of fp32, bf16 or fp16 outside
    tracing, a supported block length. Under ``torch.compile``, fake tensors,
    functionalization or any dispatch mode the reference ops run (a launch would not
    trace), except a fake tensor traced for a lowered op call (recorded as one op)."""
    if not supports(block_len) or x.dtype not in _INPUT_DTYPES:
        return False
    return triton_support.takes_recorded_kernel(x, available)


@functools.cache
def _kernel(interpret: bool = False) -> Any:
    """The block quantize launcher, compiled or for Triton's interpreter."""
    from . import _fp8_block_triton

    return _fp8_block_triton.build(interpret)


@functools.lru_cache(maxsize=256)
def _constexprs(
    fp8_dtype: torch.dtype,
    force_pow_2: bool,
    block_len: int,
    two_d: bool,
    rowwise: bool,
    columnwise: bool,
    pack_t: bool,
    bm: int,
    bk: int,
) -> tuple[tuple[str, Any], ...]:
    """The kernel's constexprs as the launcher's hashable ``(name, value)`` pairs."""
    return (
        *cuda_kernels.fp8_constants(fp8_dtype, 0.0)[2].items(),
        ("FORCE_POW2", force_pow_2),
        ("B", block_len),
        ("TWO_D", two_d),
        ("ROWWISE", rowwise),
        ("COLUMNWISE", columnwise),
        ("PACK_T", pack_t),
        ("BM", bm),
        ("BK", bk),
    )


def tile(block_len: int, two_d: bool, rowwise: bool, columnwise: bool) -> tuple[int, int, int]:
    """(BM, BK, warps) of a launch: :data:`TILES`, each edge at least the block length
    along which blocks run."""
    bm, bk, warps = TILES[(two_d, rowwise, columnwise)]
    if two_d or columnwise:
        bm = max(bm, block_len)
    if two_d or rowwise:
        bk = max(bk, block_len)
    return bm, bk, warps


def scale_inv_shape(rows: Any, cols: Any, block_len: int, dim: int) -> tuple[Any, Any]:
    """Stored scale-inverse shape of a (rows, cols) matrix whose blocks run along cols
    (``float8_block._scale_inv_shape``)."""
    if dim == 2:
        return ceil_div(rows, block_len), round_up(ceil_div(cols, block_len), 4)
    return ceil_div(cols, block_len), round_up(rows, 4)


_NAME = "fp8_block_quantize"


def fused_quantize(
    x: torch.Tensor,
    fp8_dtype: torch.dtype,
    block_len: int,
    block_scaling_dim: int,
    force_pow_2: bool,
    epsilon: float,
    rowwise: bool,
    columnwise: bool,
    *,
    launch: Optional[tuple[int, int, int]] = None,
) -> dict[str, torch.Tensor]:
    """The inner buffers of ``Float8BlockQuantizer._quantize_impl`` for ``x``, fused:
    ``_rowwise_data`` / ``_rowwise_scale_inv`` when ``rowwise``, ``_columnwise_data`` /
    ``_columnwise_scale_inv`` when ``columnwise``, bit for bit the reference's.

    ``x`` is a CUDA tensor (or, under ``TRITON_INTERPRET=1``, a CPU one) of fp32, bf16
    or fp16 with at least one dim. ``launch`` overrides the (BM, BK, warps) of
    :func:`tile` (powers of two, multiples of the block as there; the benchmark's sweep).
    """
    if fp8_dtype not in (torch.float8_e4m3fn, torch.float8_e5m2):
        raise TypeError(f"{_NAME}: not an FP8 dtype: {fp8_dtype}")
    if x.dtype not in _INPUT_DTYPES:
        raise TypeError(f"{_NAME}: cannot quantize dtype {x.dtype}")
    if x.dim() < 1:
        raise ValueError(f"{_NAME}: needs at least one dim")
    if not supports(block_len):
        raise ValueError(f"{_NAME}: block_len must be a power of two <= 128, got {block_len}")
    if block_scaling_dim not in (1, 2):
        raise ValueError(f"{_NAME}: block_scaling_dim must be 1 or 2, got {block_scaling_dim}")
    if not (rowwise or columnwise):
        raise ValueError(f"{_NAME}: asks for no usage")
    device = x.device
    triton_support.check_runnable(_NAME, device, unavailable_reason)
    config = (block_len, block_scaling_dim, force_pow_2, epsilon, rowwise, columnwise)
    if isinstance(x, _private.FakeTensor):  # traced for a lowered op call (see eligible)
        return _recorded(x, fp8_dtype, *config)
    if device.type == "cuda" and device.index != _private.cuda_current_device():
        with torch.cuda.device(device):  # Triton launches on the current device
            return fused_quantize(x, fp8_dtype, *config, launch=launch)
    shape = x.shape
    k = shape[-1]
    two_d_shape = len(shape) == 2
    m = shape[0] if two_d_shape else math.prod(shape[:-1])
    dim = block_scaling_dim
    two_d = dim == 2
    out: dict[str, torch.Tensor] = {}
    empty = m == 0 or k == 0
    data = row_si = t_arg = col_si = None
    pack_t = columnwise and m % 4 == 0
    if rowwise:
        data = out["_rowwise_data"] = torch.empty(shape, dtype=torch.uint8, device=device)
        alloc = torch.zeros if empty else torch.empty
        row_si = alloc(scale_inv_shape(m, k, block_len, dim), dtype=torch.float32, device=device)
        out["_rowwise_scale_inv"] = row_si
    if columnwise:
        if pack_t and two_d_shape and not empty:
            # Made as the int32 words the kernel stores, viewed as the (k, m) codes.
            t_arg = torch.empty((k, m // 4), dtype=torch.int32, device=device)
            out["_columnwise_data"] = t_arg.view(torch.uint8)
        else:
            t = torch.empty(transposed_shape(shape), dtype=torch.uint8, device=device)
            out["_columnwise_data"] = t
            t_arg = t.view(-1).view(torch.int32) if pack_t and not empty else t
        alloc = torch.zeros if empty else torch.empty
        col_si = alloc(scale_inv_shape(k, m, block_len, dim), dtype=torch.float32, device=device)
        out["_columnwise_scale_inv"] = col_si
    if empty:
        return out
    # A usage left out: its arguments are never read (constexpr-pruned); pass a buffer
    # already made rather than allocate one.
    dummy = row_si if row_si is not None else col_si
    x2 = x  # read by the kernel only: no autograd history is made from it
    if not two_d_shape or not x.is_contiguous():
        x2 = x.detach().reshape(m, k).contiguous()
    if launch is None:
        bm, bk, warps = tile(block_len, two_d, rowwise, columnwise)
    else:
        bm, bk, warps = launch
        # Edges of at least 4 (the scale padding, the packed transpose) and whole blocks.
        need_m = max(4, block_len if two_d or columnwise else 1)
        need_k = max(4, block_len if two_d or rowwise else 1)
        if any(e & (e - 1) for e in (bm, bk)) or bm % need_m or bk % need_k:
            raise ValueError(f"{_NAME}: tile {bm}x{bk} does not fit {block_len}-long blocks")
    fmax, eps32, _ = cuda_kernels.fp8_constants(fp8_dtype, float(epsilon))
    _kernel(device.type != "cuda")(
        (triton_cdiv(m, bm), triton_cdiv(k, bk), 1),
        (
            x2,
            dummy if data is None else data,
            dummy if row_si is None else row_si,
            dummy if t_arg is None else t_arg,
            dummy if col_si is None else col_si,
            m,
            k,
            fmax,
            eps32,
        ),
        _constexprs(
            fp8_dtype,
            bool(force_pow_2),
            block_len,
            two_d,
            bool(rowwise),
            bool(columnwise),
            pack_t,
            bm,
            bk,
        ),
        num_warps=warps,
    )
    return out


_KEYS = ("_rowwise_data", "_rowwise_scale_inv", "_columnwise_data", "_columnwise_scale_inv")


def _recorded(x: torch.Tensor, *config: Any) -> dict[str, torch.Tensor]:
    """:func:`fused_quantize` of a fake tensor (``config``: its arguments after ``x``) as
    one recorded op call."""
    outputs = _quantize_op()(x, *config)
    rowwise, columnwise = config[-2:]
    wanted = (rowwise, rowwise, columnwise, columnwise)
    return {name: t for name, t, keep in zip(_KEYS, outputs, wanted, strict=True) if keep}


_OP_SCHEMA = (
    "fp8_block_quantize(Tensor x, ScalarType fp8_dtype, int block_len, int block_scaling_dim, "
    "bool force_pow_2, float epsilon, bool rowwise, bool columnwise) "
    "-> (Tensor, Tensor, Tensor, Tensor)"
)


@functools.cache
def _quantize_op() -> Any:
    """``teops_quantization::fp8_block_quantize``: :func:`fused_quantize` as one custom
    op (its arguments in its order; a usage left out as 0-element tensors), what a
    lowered graph records. Defined when ``runtime/lowering.py`` joins Inductor; on a
    ``Library`` with no autograd layer (its input never requires grad)."""

    def kernel(x: torch.Tensor, *config: Any) -> tuple[torch.Tensor, ...]:
        buffers = fused_quantize(x, *config)
        return tuple(buffers[n] if n in buffers else x.new_empty(0, dtype=_dtype(n)) for n in _KEYS)

    def fake(x: torch.Tensor, *config: Any) -> tuple[torch.Tensor, ...]:
        _, block_len, dim, _, _, rowwise, columnwise = config
        shape = tuple(x.shape)
        k = shape[-1]
        m = math.prod(shape[:-1])
        return (
            x.new_empty(shape if rowwise else (0,), dtype=torch.uint8),
            x.new_empty(
                scale_inv_shape(m, k, block_len, dim) if rowwise else (0,), dtype=torch.float32
            ),
            x.new_empty(tuple(transposed_shape(shape)) if columnwise else (0,), dtype=torch.uint8),
            x.new_empty(
                scale_inv_shape(k, m, block_len, dim) if columnwise else (0,), dtype=torch.float32
            ),
        )

    lib = op_library("teops_quantization")
    lib.define(_OP_SCHEMA)
    lib.impl(_NAME, kernel, "CompositeExplicitAutograd")
    torch.library.register_fake(f"teops_quantization::{_NAME}", fake, lib=lib)
    return torch.ops.teops_quantization.fp8_block_quantize.default


def _dtype(name: str) -> torch.dtype:
    return torch.float32 if name.endswith("scale_inv") else torch.uint8


lowering.records(_quantize_op)


def triton_cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b
