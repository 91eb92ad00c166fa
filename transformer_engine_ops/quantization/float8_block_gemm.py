"""FP8 block-scaled operands as cuBLAS's block-scaled FP8 GEMM takes them.

``torch._scaled_mm(a, b, scale_a, scale_b)`` (torch 2.11+, CUDA 12.9+, Hopper) multiplies
``a`` (R, C) row-major by ``b`` (C, N) column-major (``b.t()`` is a row-major (N, C)
buffer), contracting C, and picks each operand's scaling mode from its scale's shape and
strides. For an operand read as a row-major (rows, C) buffer, its scale is:

* 1x128 blocks: (rows, ceil(C/128)) with strides (1, rows) ("outer-dim-major"), entry
  ``[r, c // 128]``;
* 128x128 blocks: (ceil(rows/128), ceil(C/128)) row-major, entry ``[r // 128, c // 128]``;
  cuBLAS reads its rows 16 bytes apart, and torch versions check either the unpadded
  row stride or the one padded to 4 blocks: both agree (and cuBLAS is right) when
  ceil(C/128) is a multiple of 4, the only case taken here;

``scale_a`` is the scale of ``a``, ``scale_b`` the transpose of the scale of the (N, C)
buffer ``b.t()``. FP8 block values already store their scales in TE's GEMM-ready layout
(float8_block.py): 1x128 scales as (ceil(C/128), ru(rows, 4)) indexed ``[c // 128, r]``,
128x128 ones as (ceil(rows/128), ru(ceil(C/128), 4)) indexed ``[r // 128, c // 128]``, so
for the shapes taken here each scale is a view of the stored one (no copy, no kernel):
the first transposed, the second as is.

TE's layouts (``general_gemm``): ``"TN"`` (fprop) reads the input rowwise as ``a`` and the
weight rowwise as ``b.t()``; ``"NN"`` (dgrad) the output gradient rowwise and the
weight's columnwise (transposed) data; ``"NT"`` (wgrad) the output gradient's and the
input's columnwise data, contracting the tokens. TE's recipe gives 1x128 x 128x128 for
fprop and dgrad and 1x128 x 1x128 for wgrad; 128x128 x 1x128 is taken too, 128x128 x
128x128 never (cuBLAS has no such GEMM; the recipe refuses it).
"""

from __future__ import annotations

import functools
import math
from typing import Any, Optional

import torch

from .encoding import ceil_div
from .float8_block import _Float8BlockData
from .quantizer import QuantizedData

__all__ = ["BLOCK", "block_scaled_mm_operands", "operand_scale", "qualifies", "runs_on"]

# The one block edge cuBLAS's block-scaled FP8 GEMM has.
BLOCK = 128

# layout -> (A reads columnwise, B reads columnwise), as gemm.LAYOUTS.
_READS = {"TN": (False, False), "NN": (True, False), "NT": (True, True)}


@functools.cache
def runs_on(device_index: int) -> bool:
    """Whether CUDA device ``device_index`` runs cuBLAS's block-scaled FP8 GEMM: a Hopper
    GPU (compute capability 9.x; Blackwell's cuBLAS has no 1x128/128x128 fp32 scales, TE
    emulates them there) under a torch built against CUDA 12.9 or later (torch refuses
    block scales below). Cached per device: a fact of the hardware and the build."""
    cuda = torch.version.cuda
    if torch.version.hip is not None or cuda is None:
        return False
    if tuple(int(part) for part in cuda.split(".")[:2]) < (12, 9):
        return False
    return torch.cuda.get_device_capability(device_index)[0] == 9


def _stored_scale(stored: torch.Tensor, rows: Any, cols: Any, dim: int) -> torch.Tensor:
    """The stored scale-inverses of a (rows, cols) buffer without padding, contiguous:
    (ceil(cols/128), rows) for 1x128 blocks, (ceil(rows/128), ceil(cols/128)) for
    128x128 ones. ``stored`` itself when :func:`qualifies` holds (no padding then)."""
    col_blocks = ceil_div(cols, BLOCK)
    want = (col_blocks, rows) if dim == 1 else (ceil_div(rows, BLOCK), col_blocks)
    # Slicing costs ~6 us of host time: skipped when the shape is already the one wanted.
    s = stored
    if stored.shape[0] != want[0] or stored.shape[1] != want[1]:
        s = stored[: want[0], : want[1]]
    return s if s.is_contiguous() else s.contiguous()


def operand_scale(stored: torch.Tensor, rows: Any, cols: Any, dim: int) -> torch.Tensor:
    """The stored scale-inverses of a (rows, cols) buffer (blocks along cols) as
    ``torch._scaled_mm``'s ``scale_a`` for that buffer (``scale_b`` is its transpose for
    ``b.t()``): a view of ``stored`` when :func:`qualifies` holds, else a copy."""
    s = _stored_scale(stored, rows, cols, dim)
    return s.t() if dim == 1 else s


def _transposed_operand_scale(stored: torch.Tensor, rows: Any, cols: Any, dim: int) -> torch.Tensor:
    """``operand_scale(...).t()`` with no transpose of a transpose (a host call saved)."""
    s = _stored_scale(stored, rows, cols, dim)
    return s if dim == 1 else s.t()


def qualifies(rows: Any, cols: Any, n: Any, dims: tuple[int, int]) -> bool:
    """Whether ``a`` (rows, cols) times ``b`` (cols, n) with these block dims (1: 1x128,
    2: 128x128; ``a``'s first) runs as one block-scaled cuBLAS GEMM here.

    cuBLAS wants the contraction and ``b``'s dims 16-byte aligned (torch checks cols and
    n are multiples of 16). Taken more narrowly, so no layout here is one torch versions
    or cuBLAS read differently: whole 128-blocks along the contraction (a partial last
    block is untested on the H200), rows a multiple of 4 (the 1x128 scale's row stride
    is rows; 200 rows ran on the H200), and with a 128x128 operand a multiple of 4 blocks
    along the contraction (see the module docstring). Other shapes take the dequantized
    path."""
    if rows <= 0 or cols <= 0 or n <= 0 or dims == (2, 2):
        return False
    if cols % BLOCK != 0 or n % 16 != 0 or rows % 4 != 0:
        return False
    return 2 not in dims or (cols // BLOCK) % 4 == 0


def _buffer(value: _Float8BlockData, columnwise: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(data, stored scale-inverses) of the usage ``columnwise`` selects."""
    if columnwise:
        return value._columnwise_data, value._columnwise_scale_inv
    return value._rowwise_data, value._rowwise_scale_inv


def block_scaled_mm_operands(
    A: QuantizedData, B: QuantizedData, layout: str
) -> Optional[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]:
    """(a, b, scale_a, scale_b) with ``gemm(A, B, layout=layout) = a @ b`` under
    ``torch._scaled_mm``, or None when the operands are not two FP8 block values of
    128-element blocks that cuBLAS multiplies natively (see :func:`qualifies`; also E5M2
    by E5M2, which cuBLAS has no GEMM for, and a usage the layout reads that is absent:
    the dequantized path then reports it). Device-independent, so the layouts are
    checked on CPU tensors; :func:`gemm` calls it for CUDA operands only."""
    if not (isinstance(A, _Float8BlockData) and isinstance(B, _Float8BlockData)):
        return None
    qa, qb = A._quantizer, B._quantizer
    if qa.block_len != BLOCK or qb.block_len != BLOCK:
        return None
    fa, fb = qa.fp8_dtype, qb.fp8_dtype
    if fa == fb == torch.float8_e5m2:
        return None
    a_col, b_col = _READS[layout]
    if not (A.columnwise_usage if a_col else A.rowwise_usage):
        return None
    if not (B.columnwise_usage if b_col else B.rowwise_usage):
        return None
    ma, ka = math.prod(A.shape[:-1]), A.shape[-1]
    mb, kb = math.prod(B.shape[:-1]), B.shape[-1]
    # mat1 is B's buffer (rows, C), mat2 the transpose of A's buffer (n, C).
    if layout == "TN":  # (M, K) @ (K, N): B rowwise, A rowwise (N, K)
        rows, n, c = mb, ma, kb
    elif layout == "NN":  # (M, N) @ (N, K): B rowwise, A columnwise (K, N)
        rows, n, c = mb, ka, kb
    else:  # (N, M) @ (M, K): B columnwise (N, M), A columnwise (K, M)
        rows, n, c = kb, ka, mb
    dims = (qb.block_scaling_dim, qa.block_scaling_dim)
    if not qualifies(rows, c, n, dims):
        return None
    b_data, b_scale = _buffer(B, b_col)
    a_data, a_scale = _buffer(A, a_col)
    mat1 = b_data if b_data.dim() == 2 else b_data.reshape(rows, c)
    mat2 = a_data if a_data.dim() == 2 else a_data.reshape(n, c)
    return (
        mat1.view(fb),
        mat2.view(fa).t(),
        operand_scale(b_scale, rows, c, dims[0]),
        _transposed_operand_scale(a_scale, n, c, dims[1]),
    )
