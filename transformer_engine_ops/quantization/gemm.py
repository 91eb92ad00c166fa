"""One GEMM entry point with TE's ``general_gemm`` conventions.

``layout`` names how A and B enter (T: transposed) and which data each operand reads:

* ``"TN"`` (forward): ``out = B @ A^T``; A the weight (N, K), B the input (..., K).
  Reads A rowwise, B rowwise. Result (..., N).
* ``"NN"`` (dgrad): ``out = B @ A``; A the weight (N, K), B grad_output (..., N).
  Reads A columnwise, B rowwise. Result (..., K).
* ``"NT"`` (wgrad): ``out = B^T @ A``; A the input (..., K), B grad_output (..., N).
  Reads A and B columnwise. Result (N, K).

Operands are plain tensors or quantized values of any format. On the CPU (and for formats
or shapes ``torch._scaled_mm`` cannot take) operands are dequantized, multiplied in fp32,
the bias (last dim of the result) added in fp32, and the result cast to ``out_dtype``.
On CUDA:

* two per-tensor FP8 operands with dims that are multiples of 16 go through
  ``torch._scaled_mm`` on the buffers the layout reads (rowwise ``_data`` or the
  columnwise ``_transpose``, viewed column-major where cuBLAS wants it: no transpose
  copies);
* two FP8 block operands of 128-element blocks (1x128 by 128x128, 1x128 by 1x128 or
  128x128 by 1x128) go through ``torch._scaled_mm``'s block-scaled cuBLAS GEMM
  (Hopper with torch built for CUDA 12.9+: ``float8_block_gemm.runs_on``; Blackwell has
  no such GEMM) on the same buffers, their stored scales passed as views
  (float8_block_gemm.py), when the contraction is whole 128-blocks (a multiple of 4
  blocks with a 128x128 operand), the other dim of the second operand a multiple of 16
  and the rows of the first a multiple of 4 (``float8_block_gemm.qualifies``); always
  with the split accumulator (cuBLAS has no fast one for block scales);
* for either FP8 GEMM, a bf16/fp16 ``out_dtype`` is produced by the GEMM's epilogue
  (bias of that dtype included); any other output is fp32 out, then the fp32 bias add
  and cast;
* two plain bf16/fp16 operands with an output of their dtype run as one native GEMM
  (``addmm``);
* other quantized operands (MXFP8, NVFP4, FP8 block shapes the block GEMM does not take,
  or a mix of formats) with a bf16/fp16 ``out_dtype``: Hopper has no GEMM for these, so
  each operand is dequantized to bf16 (exact for MXFP8 and power-of-two FP8 block
  scales, one bf16 rounding of the fp32 value otherwise) and multiplied by one bf16
  GEMM, fp32 accumulation inside.
"""

from __future__ import annotations

import math
from typing import Any, Optional, Union

import torch

from ..runtime import _torch_private as _private
from ..runtime import lowering
from ..runtime.precision import math_dtype
from . import float8_block_gemm
from .float8 import _Float8Data
from .quantizer import QuantizedData

__all__ = ["LAYOUTS", "gemm"]

Operand = Union[torch.Tensor, QuantizedData]

# layout -> (A reads columnwise, B reads columnwise)
LAYOUTS: dict[str, tuple[bool, bool]] = {
    "TN": (False, False),
    "NN": (True, False),
    "NT": (True, True),
}


def _as_fp32(x: Operand, columnwise: bool) -> torch.Tensor:
    if isinstance(x, QuantizedData):
        return QuantizedData.dequantize_usage(x, columnwise=columnwise, dtype=torch.float32)
    return x.float()


_BF16 = torch.bfloat16
_HALF = (torch.bfloat16, torch.float16)


def _as_bf16(x: Operand, layout: str, which: int) -> torch.Tensor:
    """Operand ``which`` (0: A, 1: B) of ``layout`` as a bf16 tensor of its logical shape."""
    if isinstance(x, QuantizedData):
        columnwise = LAYOUTS[layout][which]
        return QuantizedData.dequantize_usage(x, columnwise=columnwise, dtype=_BF16)
    return x.to(_BF16)


def _check(A: Operand, B: Operand, layout: str, bias: Optional[torch.Tensor]) -> None:
    # Called for every quantized GEMM: messages are built only when a check fails.
    if layout not in LAYOUTS:
        raise ValueError(f"gemm: layout must be one of {tuple(LAYOUTS)}, got {layout!r}")
    for name, x in (("A", A), ("B", B)):
        if not isinstance(x, (torch.Tensor, QuantizedData)):
            raise TypeError(f"gemm: {name} must be a tensor or quantized value, got {type(x)}")
        if len(x.shape) < (2 if name == "A" and layout != "NT" else 1):
            raise ValueError(f"gemm {layout}: {name} has too few dims, shape {tuple(x.shape)}")
    device = A.device
    if B.device != device or (bias is not None and bias.device != device):
        devices = {A.device, B.device} | ({bias.device} if bias is not None else set())
        raise ValueError(f"gemm: operands must share one device, got {sorted(map(str, devices))}")
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"gemm: runs on cpu or cuda operands, got {A.device}")
    a_shape, b_shape = A.shape, B.shape
    if layout == "TN":
        if a_shape[-1] != b_shape[-1]:
            what = f"A (N, K)={tuple(a_shape)} and B (..., K)={tuple(b_shape)}"
            raise ValueError(f"gemm {layout}: mismatched shapes {what}")
    elif layout == "NN":
        if a_shape[0] != b_shape[-1]:
            what = f"A (N, K)={tuple(a_shape)}, B (..., N)={tuple(b_shape)}"
            raise ValueError(f"gemm {layout}: mismatched shapes {what}")
    elif a_shape[:-1] != b_shape[:-1]:
        what = f"A (..., K)={tuple(a_shape)} and B (..., N)={tuple(b_shape)}"
        raise ValueError(f"gemm {layout}: mismatched shapes {what}")


def _native_cuda_dtype(A: Operand, B: Operand, out_dtype: torch.dtype) -> Optional[torch.dtype]:
    """The 16-bit dtype two plain CUDA operands share with the output, if any.

    Such a product runs as one cuBLAS GEMM in that dtype (fp32 accumulation inside, as
    TE's GEMM), not upcast to fp32 first: at 4096x8192 the upcast costs 13x the GEMM.
    """
    if isinstance(A, QuantizedData) or isinstance(B, QuantizedData) or A.device.type != "cuda":
        return None
    dtype = A.dtype
    if dtype in (torch.bfloat16, torch.float16) and B.dtype == dtype == out_dtype:
        return dtype
    return None


def _matrices(
    A: Operand, B: Operand, layout: str, native: Optional[torch.dtype] = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(left, right) matrices with ``out = left @ right``: fp32, or ``native`` as is."""
    a_col, b_col = LAYOUTS[layout]
    a = A if native is not None else _as_fp32(A, a_col)
    b = B if native is not None else _as_fp32(B, b_col)
    b2 = b.reshape(-1, b.shape[-1])
    if layout == "TN":
        return b2, a.t()
    if layout == "NN":
        return b2, a
    return b2.t(), a.reshape(-1, a.shape[-1])


def _out_shape(A: Operand, B: Operand, layout: str) -> tuple[Any, ...]:
    if layout == "TN":
        return (*B.shape[:-1], A.shape[0])
    if layout == "NN":
        return (*B.shape[:-1], A.shape[-1])
    return (B.shape[-1], A.shape[-1])


def _scaled_mm_operands(A: Operand, B: Operand, layout: str) -> Optional[tuple[Any, ...]]:
    """(a, b, scale_a, scale_b) for ``torch._scaled_mm`` with ``out = a @ b``, or None."""
    if not (isinstance(A, _Float8Data) and isinstance(B, _Float8Data)):
        return None
    if A.device.type != "cuda":
        return None
    fa, fb = A._quantizer.fp8_dtype, B._quantizer.fp8_dtype
    if fa == fb == torch.float8_e5m2:
        return None  # cuBLAS has no E5M2 x E5M2 FP8 GEMM
    ka, kb = A.shape[-1], B.shape[-1]
    # Storages are not tensors: count rows from the logical shape.
    ma = math.prod(A.shape[:-1])
    mb = math.prod(B.shape[:-1])
    if any(d % 16 != 0 or d == 0 for d in (ka, kb, ma, mb)):
        return None
    # A 2-D buffer already has the matrix shape its reshape would give: no call for it.
    if layout == "TN":  # (M, K) @ (K, N): B data, A data viewed column-major
        a, b = _codes(B, mb, kb), _codes(A, ma, ka).t()
    elif layout == "NN":  # (M, N) @ (N, K): B data, A transpose (K, N) viewed column-major
        a, b = _codes(B, mb, kb), _transposed_codes(A, ma, ka).t()
    else:  # (N, M) @ (M, K): B transpose, A transpose (K, M) viewed column-major
        a, b = _transposed_codes(B, mb, kb), _transposed_codes(A, ma, ka).t()
    # ``_scale_inv`` is (1,) (one element: tensorwise scaling, the same GEMM as a 0-d
    # scale; passing it as is saves two reshape calls a GEMM on a host-bound path).
    return a.view(fb), b.view(fa), B._scale_inv, A._scale_inv


@lowering.exact("addmm(Tensor bias, Tensor a, Tensor b) -> Tensor")
def _addmm(bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``torch.addmm(bias, a, b)``, the bias added in the GEMM's epilogue (fp32, one
    rounding); whole in a lowered graph, where Inductor would otherwise split it into a
    GEMM and a separately rounded bias add (runtime/lowering.py)."""
    return torch.addmm(bias, a, b)


def _codes(x: _Float8Data, rows: Any, cols: Any) -> torch.Tensor:
    """``x``'s rowwise codes as a (rows, cols) matrix; made from its transpose where it
    holds none (a weight quantized rowwise only, under ``torch.no_grad``, read by a
    training step: one scale, so the same codes, as TE makes them)."""
    if x._data is not None:
        return _matrix(x._data, rows, cols)
    return x._transpose.reshape(cols, rows).t().contiguous()


def _transposed_codes(x: _Float8Data, rows: Any, cols: Any) -> torch.Tensor:
    """``x``'s columnwise codes as a (cols, rows) matrix; made from its rowwise codes
    where it holds no transpose (see :func:`_codes`)."""
    if x._transpose is not None:
        return _matrix(x._transpose, cols, rows)
    return x._data.reshape(rows, cols).t().contiguous()


def _matrix(t: torch.Tensor, rows: Any, cols: Any) -> torch.Tensor:
    """``t.reshape(rows, cols)``; ``t`` itself when it is 2-D (it then has that shape:
    the callers' ``rows`` is the product of every dim but the last, ``cols`` the last)."""
    return t if t.dim() == 2 else t.reshape(rows, cols)


def _shaped(out: torch.Tensor, out_shape: tuple[Any, ...]) -> torch.Tensor:
    """``out.reshape(out_shape)``; ``out`` itself when the shape is 2-D (a 2-D product
    already has it: same rows, same columns)."""
    return out if len(out_shape) == 2 else out.reshape(out_shape)


# Exact types of plain operands (a subclass, e.g. a quantized wrapper, takes the general path).
_PLAIN = (torch.Tensor, torch.nn.Parameter)
_FP32 = torch.float32


def _traced_plain(A: Any, B: Any) -> bool:
    """Whether ``A`` and ``B`` are the fake tensors of a lowered trace (runtime/lowering.py)
    standing for plain tensors: they take :func:`_plain_gemm` as the real ones do, so the
    trace records the same calls (a quantized value reaches it as its storage, not a
    tensor)."""
    return type(A) is _private.FakeTensor and type(B) is _private.FakeTensor and lowering.tracing()


def _plain_gemm(
    A: torch.Tensor,
    B: torch.Tensor,
    layout: str,
    out_dtype: torch.dtype,
    bias: Optional[torch.Tensor],
) -> Optional[torch.Tensor]:
    """:func:`gemm` of two plain CPU tensors, or of two plain CUDA tensors that share a
    16-bit dtype with the output, with the same result as the general path, in as few
    tensor calls as possible (a small GEMM is dominated by them). None for any other
    case, or any operands the general path's checks would refuse (it then reports them)."""
    device = A.device
    if B.device != device or (bias is not None and bias.device != device):
        return None
    a_shape, b_shape = A.shape, B.shape
    if len(b_shape) < 1:
        return None
    if layout == "TN":
        if len(a_shape) != 2 or a_shape[1] != b_shape[-1]:
            return None
    elif layout == "NN":
        if len(a_shape) != 2 or a_shape[0] != b_shape[-1]:
            return None
    elif layout != "NT" or len(a_shape) < 1 or a_shape[:-1] != b_shape[:-1]:
        return None
    kind, dtype = device.type, A.dtype
    if kind == "cuda" and dtype in _HALF and B.dtype == dtype == out_dtype:
        if bias is not None and bias.dtype != dtype:
            bias = bias.to(dtype)
        b2 = B if len(b_shape) == 2 else B.reshape(-1, b_shape[-1])
        a2 = A if layout != "NT" or len(a_shape) == 2 else A.reshape(-1, a_shape[-1])
        out = half_product(a2, b2, layout, bias)
        if len(b_shape) != 2 and layout != "NT":
            out = out.reshape(_out_shape(A, B, layout))
        return out
    if kind not in ("cpu", "cuda"):
        return None
    # The general path's fp32 branch (every CPU product, any other CUDA one).
    b2 = B if len(b_shape) == 2 else B.reshape(-1, b_shape[-1])
    a2 = A if len(a_shape) == 2 else A.reshape(-1, a_shape[-1])
    out = _fp32_gemm(a2, b2, bias, layout, out_dtype)
    if len(b_shape) != 2 and layout != "NT":
        out = out.reshape(_out_shape(A, B, layout))
    return out


def half_product(
    A: torch.Tensor, B: torch.Tensor, layout: str, bias: Optional[torch.Tensor]
) -> torch.Tensor:
    """:func:`gemm` of 2-D CUDA operands (and bias) sharing a 16-bit dtype with the
    output: what the general path's native branch computes (``addmm(bias, left,
    right)`` or ``left @ right``) without its no-op calls (``linear`` of a 2-D input
    without a bias is ``mm(input, weight.t())``). ``Linear``'s plain eager call runs it
    directly, having checked its operands once for all three GEMMs."""
    if layout == "TN":
        return torch.nn.functional.linear(B, A) if bias is None else _addmm(bias, B, A.t())
    if layout == "NN":
        return torch.mm(B, A) if bias is None else _addmm(bias, B, A)
    return torch.mm(B.t(), A) if bias is None else _addmm(bias, B.t(), A)


def plain_product(
    A: torch.Tensor,
    B: torch.Tensor,
    layout: str,
    bias: Optional[torch.Tensor],
    dtype: torch.dtype,
) -> torch.Tensor:
    """:func:`gemm` of 2-D plain operands (and bias) of one CPU or CUDA device, all of
    ``dtype``, with a ``dtype`` output: the branch :func:`gemm` itself takes for them
    (:func:`half_product` for 16-bit CUDA operands, else the fp32 product), without
    its checks. ``Linear``'s plain eager call runs it, having checked its operands once
    for all three GEMMs: on the host-bound small shapes the checks cost ~1 us a GEMM."""
    if A.is_cuda and dtype in _HALF:
        return half_product(A, B, layout, bias)
    return _fp32_gemm(A, B, bias, layout, dtype)


@lowering.exact(
    "fp32_gemm(Tensor a, Tensor b, Tensor? bias, str layout, ScalarType out_dtype) -> Tensor"
)
def _fp32_gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    bias: Optional[torch.Tensor],
    layout: str,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    """The general path's fp32 product of 2-D operands: fp32 operands, product, fp32 bias
    add, cast (float64 throughout when an operand is float64). Whole in a lowered graph (runtime/lowering.py), where Inductor would fuse
    the bias add into the GEMM (CUDA), and older Inductors fold the cast of one GEMM's
    output and the widening of the next one's operand into nothing, whatever
    ``emulate_precision_casts`` says."""
    dtype = math_dtype(a.dtype, b.dtype)  # float64 operands keep their precision
    # (``.to`` of the same dtype returns the tensor itself, after ~1 us of argument
    # parsing: three GEMMs a layer, two operands each)
    if a.dtype != dtype:
        a = a.to(dtype)
    if b.dtype != dtype:
        b = b.to(dtype)
    # ``torch.mm`` is what ``@`` dispatches to (``linear`` without a bias is
    # ``mm(b, a.t())`` without a Python-side transposed view).
    if layout == "TN":
        out = torch.nn.functional.linear(b, a)
    elif layout == "NN":
        out = torch.mm(b, a)
    else:
        out = torch.mm(b.t(), a)
    if bias is not None:
        # Out of place: a lowered graph that traces this piece (``lowering="rounding"``)
        # must be functional.
        out = out + (bias if bias.dtype == dtype else bias.to(dtype))
    return out if out_dtype is dtype else out.to(out_dtype)


def gemm(
    A: Operand,
    B: Operand,
    *,
    layout: str = "TN",
    out_dtype: torch.dtype,
    bias: Optional[torch.Tensor] = None,
    use_split_accumulator: bool = True,
) -> torch.Tensor:
    """Matrix product of plain or quantized operands (see the module docstring)."""
    if (type(A) in _PLAIN and type(B) in _PLAIN) or _traced_plain(A, B):
        out = _plain_gemm(A, B, layout, out_dtype, bias)
        if out is not None:
            return out
    _check(A, B, layout, bias)
    out_shape = _out_shape(A, B, layout)
    fp8 = _scaled_mm_operands(A, B, layout)
    fast_accum = not use_split_accumulator
    if fp8 is None and A.device.type == "cuda" and float8_block_gemm.runs_on(A.device.index):
        fp8 = float8_block_gemm.block_scaled_mm_operands(A, B, layout)
        if fp8 is not None:
            # cuBLAS's block-scaled GEMM has no fast-accumulation mode (torch refuses
            # it); TE's recipe asks for the split accumulator there anyway.
            fast_accum = False
    if fp8 is not None:
        a, b, scale_a, scale_b = fp8
        if out_dtype in _HALF and (bias is None or bias.dtype == out_dtype):
            # The epilogue rounds (and adds the bias) in fp32, then writes out_dtype.
            out = _private.scaled_mm(
                a,
                b,
                scale_a=scale_a,
                scale_b=scale_b,
                bias=bias,
                out_dtype=out_dtype,
                use_fast_accum=fast_accum,
            )
            return _shaped(out, out_shape)
        out = _private.scaled_mm(
            a,
            b,
            scale_a=scale_a,
            scale_b=scale_b,
            out_dtype=torch.float32,
            use_fast_accum=fast_accum,
        )
    elif (native := _native_cuda_dtype(A, B, out_dtype)) is not None:
        left, right = _matrices(A, B, layout, native)
        if bias is not None:
            return _addmm(bias.to(native), left, right).reshape(out_shape)
        return (left @ right).reshape(out_shape)
    elif A.device.type == "cuda" and out_dtype in _HALF:
        # MXFP8, NVFP4, and FP8 block shapes cuBLAS does not take: dequantize to bf16,
        # one native GEMM.
        left, right = _matrices(_as_bf16(A, layout, 0), _as_bf16(B, layout, 1), layout, _BF16)
        out = _addmm(bias.to(_BF16), left, right) if bias is not None else left @ right
        return out.to(out_dtype).reshape(out_shape)
    else:
        left, right = _matrices(A, B, layout)
        out = left @ right
    if bias is not None:
        out = out + bias.float()
    if out.dtype != out_dtype:  # ``.to`` of the same dtype returns ``out`` itself
        out = out.to(out_dtype)
    return _shaped(out, out_shape)
