"""Triton kernels for NVFP4 quantization on CUDA, bit for bit the reference's buffers.

The H200 has no FP4 tensor cores: GEMMs take the dequantized operands (``gemm.py``),
and these kernels only quantize. The reference (``nvfp4.py`` with ``encoding.py``,
``hadamard.py`` and ``philox.py``) stays the ground truth and runs wherever these do
not (CPU tensors, tracing, no Triton); every configuration TE 2.20.2 ships is covered:
1x16 blocks with E4M3 block scales and the fp32 global scale, 16x16 weight blocks,
row-scaled data, 4over6, the random Hadamard transform on columnwise data (its amax
after the transform), and stochastic rounding with the reference's Philox bits.

Per stored matrix (the rowwise data reads ``x`` (M, K), the columnwise data ``x.T``
(K, M) through strides, never a copy) two kernels (``_nvfp4_triton.py``):

1. ``_row_amax``: the finite amax of each row (after the transform where it is taken
   after it). The per-tensor amax is their maximum (exact in any order, taken by one
   torch ``amax``); row-scaled data keeps them.
2. ``_quantize``: one program per 16 rows x 128 columns: the global scale from the
   amax (``scale_from_amax``), each block's amax and E4M3 scale code (the NaN code for
   a block holding a NaN or Inf), the E2M1 codes (nearest even, stochastic from
   Philox4x32-10 at the element's counter, or the better of 4over6's two candidates),
   packed two per byte; scale codes into a zeroed padded buffer.

Bit-exactness rests on doing what the reference does in the same order: every
division correctly rounded, the transform's and 4over6's sums in index order, no
fused multiply-add (launched with ``enable_fp_fusion=False``), FP8 rounding on the
bits. The reference's divisions are by tensors, never by Python scalars: CUDA's
``tensor / scalar`` multiplies by the reciprocal, which would make the reference's own
bits depend on the device. Checked under ``TRITON_INTERPRET=1`` on CPU tensors and, on
CUDA, against the CPU reference (``tests/quantization/test_nvfp4_kernels.py``).

Triton is imported lazily: this module imports fine on a CPU-only torch without it.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Optional

import torch

from ..quantization.encoding import ceil_div, matrix_dims, round_up
from ..quantization.hadamard import sign_mask
from ..runtime import _torch_private as _private
from . import cuda_kernels, triton_support

if TYPE_CHECKING:
    from ..quantization.quantizer import Quantizer

__all__ = ["amax_stats", "available", "eligible", "quantize", "unavailable_reason"]

# Rows and 16-element blocks per program (16 rows: one 16x16 block row in 2-D mode).
BLOCK_ROWS = 16
BLOCKS = 8
WARPS = 4
_INPUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@functools.cache
def unavailable_reason() -> Optional[str]:
    """Why the kernels cannot run here (None when Triton imports and kernels build)."""
    return triton_support.unavailable_reason(_kernels)


def available() -> bool:
    """True when Triton is importable (the kernels are built on first use)."""
    return unavailable_reason() is None


def eligible(x: torch.Tensor) -> bool:
    """Whether ``x`` takes the Triton path: a real, non-empty CUDA tensor of fp32, bf16
    or fp16 outside tracing. Under ``torch.compile``, fake tensors, functionalization
    or any dispatch mode the reference ops run (they trace; a kernel launch would not).
    NVFP4 op calls never lower into Inductor, so a compiled graph runs its op's real
    kernel, which takes this path as eager does."""
    kind = type(x)
    if kind is not torch.Tensor and kind is not torch.nn.Parameter:
        return False
    if x.device.type != "cuda" or x.dtype not in _INPUT_DTYPES or x.numel() == 0:
        return False
    return triton_support.launchable_here() and available()


@functools.cache
def _kernels(interpret: bool = False) -> tuple[Any, Any]:
    """(row amax, quantize) launchers, compiled or for Triton's interpreter."""
    from . import _nvfp4_triton

    return _nvfp4_triton.build(interpret)


@functools.cache
def _quantize_constexprs(
    stream: int,
    rht: bool,
    stochastic: bool,
    two_d: bool,
    four_over_six: bool,
    mse: bool,
    random_signs: bool,
) -> tuple[tuple[str, Any], ...]:
    """The quantize kernel's constexprs as hashable ``(name, value)`` pairs."""
    e4m3_bits = cuda_kernels.fp8_constants(torch.float8_e4m3fn, 0.0)[2]
    return (
        ("STREAM", stream),
        ("RHT", rht),
        ("SIGN_MASK", sign_mask(random_signs)),
        ("STOCHASTIC", stochastic),
        ("TWO_D", two_d),
        ("FOUR_OVER_SIX", four_over_six),
        ("MSE", mse),
        *e4m3_bits.items(),
        ("BR", BLOCK_ROWS),
        ("NB", BLOCKS),
        ("enable_fp_fusion", False),  # a compile option: no fused multiply-add
    )


@functools.cache
def _amax_constexprs(rht: bool, random_signs: bool) -> tuple[tuple[str, Any], ...]:
    return (
        ("RHT", rht),
        ("SIGN_MASK", sign_mask(random_signs)),
        ("BR", BLOCK_ROWS),
        ("NB", BLOCKS),
        ("enable_fp_fusion", False),
    )


def _row_amax(
    launch: Any, x2d: torch.Tensor, transposed: bool, rht: bool, random_signs: bool = True
) -> torch.Tensor:
    """Finite amax of each row of the stored matrix (``x2d`` or ``x2d.T``, transformed
    with ``rht``), (R,) fp32."""
    m, k = x2d.shape
    r, c, stride_r, stride_c = (k, m, 1, k) if transposed else (m, k, k, 1)
    out = torch.empty(r, dtype=torch.float32, device=x2d.device)
    launch(
        (ceil_div(r, BLOCK_ROWS), 1, 1),
        (x2d, out, r, c, stride_r, stride_c),
        _amax_constexprs(rht, random_signs),
        num_warps=WARPS,
    )
    return out


def _encode(
    launch: Any,
    q: Quantizer,
    x2d: torch.Tensor,
    transposed: bool,
    amax: torch.Tensor,
    rng_state: Optional[torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor]:
    """(packed codes (R, C/2), padded scale codes) of one stored matrix."""
    m, k = x2d.shape
    r, c, stride_r, stride_c = (k, m, 1, k) if transposed else (m, k, k, 1)
    device = x2d.device
    data = torch.empty((r, c // 2), dtype=torch.uint8, device=device)
    scale_rows, scale_cols = round_up(r, 128), round_up(ceil_div(c, 16), 4)
    scales = torch.zeros((scale_rows, scale_cols), dtype=torch.uint8, device=device)
    e4m3_max = q.nvfp4_e4m3_max
    launch(
        (ceil_div(r, BLOCK_ROWS), ceil_div(c, 16 * BLOCKS), 1),
        (
            x2d,
            amax,
            rng_state if rng_state is not None else amax,  # read only when stochastic
            data,
            scales,
            r,
            c,
            stride_r,
            stride_c,
            1 if q.row_scaled_nvfp4 else 0,
            scale_cols,
            float(e4m3_max * 6),
            float(e4m3_max * 6),  # 4over6's error: e2m1 * scale * amax / (6 * bound)
        ),
        _quantize_constexprs(
            1 if transposed else 0,
            transposed and q.with_rht,
            rng_state is not None,
            q.with_2d_quantization,
            q.nvfp4_use_4over6,
            q.nvfp4_4over6_err_mode == "MSE",
            q.with_random_sign_mask,
        ),
        num_warps=WARPS,
    )
    return data, scales


def quantize(
    q: Quantizer,
    x: torch.Tensor,
    rng_state: Optional[torch.Tensor],
    amaxes: Optional[tuple[torch.Tensor, torch.Tensor]] = None,
) -> dict[str, Optional[torch.Tensor]]:
    """The inner buffers of ``q``'s quantize of ``x`` (``rng_state`` the int64 (seed,
    offset) pair when ``q`` rounds stochastically, else None; ``amaxes`` the rowwise
    and columnwise per-tensor amaxes, fp32 (1,) each, to use instead of ``x``'s own, as
    a sharded tensor's reduced ones), equal bit for bit to the reference. ``x`` is a
    non-empty CUDA tensor (or, under ``TRITON_INTERPRET=1``, a CPU one) of fp32, bf16
    or fp16 whose shape ``q`` accepts."""
    name = f"{type(q).__name__} (Triton)"
    if (rng_state is not None) != q.stochastic_rounding:
        raise ValueError(f"{name}: rng_state must be given exactly when rounding stochastically")
    if amaxes is not None and q.row_scaled_nvfp4:
        raise ValueError(f"{name}: amaxes are per tensor; row-scaled data has one per row")
    _check_launchable(name, x)
    device = x.device
    if device.type == "cuda" and device.index != _private.cuda_current_device():
        with torch.cuda.device(device):  # Triton launches on the current device
            return quantize(q, x, rng_state, amaxes)
    amax_kernel, quantize_kernel = _kernels(device.type != "cuda")
    m, k = matrix_dims(x.shape)
    x2d = x.detach().reshape(m, k).contiguous()
    if rng_state is not None:
        rng_state = rng_state.to(device)

    def given(i: int) -> torch.Tensor:  # its own buffer: op outputs must not alias
        return amaxes[i].to(device=device, dtype=torch.float32).reshape(1).clone()

    inner: dict[str, Optional[torch.Tensor]] = {}
    plain_amax: Optional[torch.Tensor] = None  # the tensor's finite amax, once taken
    if q.rowwise_usage:
        if amaxes is not None:
            amax = given(0)
        else:
            amax = _row_amax(amax_kernel, x2d, False, False)
            if not q.row_scaled_nvfp4:
                amax = plain_amax = _tensor_amax(amax)
        data, scales = _encode(quantize_kernel, q, x2d, False, amax, rng_state)
        inner["_rowwise_data"] = data.reshape(*x.shape[:-1], k // 2)
        inner["_rowwise_scale_inv"] = scales
        inner["_amax_rowwise"] = amax
    if q.columnwise_usage:
        post_rht = q.with_rht and q.with_post_rht_amax
        if amaxes is not None:
            amax = given(1)
        elif post_rht or q.row_scaled_nvfp4 or plain_amax is None:
            amax = _row_amax(amax_kernel, x2d, True, post_rht, q.with_random_sign_mask)
            if not q.row_scaled_nvfp4:
                amax = _tensor_amax(amax)
        else:
            amax = plain_amax.clone()  # its own buffer: op outputs must not alias
        data, scales = _encode(quantize_kernel, q, x2d, True, amax, rng_state)
        inner["_columnwise_data"] = data
        inner["_columnwise_scale_inv"] = scales
        inner["_amax_columnwise"] = amax
    return inner


def amax_stats(q: Quantizer, x: torch.Tensor) -> torch.Tensor:
    """``q.amax_stats(x)`` from the row-amax kernel: fp32 (2,), the finite amax of
    ``x`` and of its columnwise data (after the transform with ``with_post_rht_amax``
    and a columnwise usage); the reference's bits (a maximum is exact in any order, the
    transform is summed in the reference's order)."""
    name = f"{type(q).__name__}.amax_stats (Triton)"
    _check_launchable(name, x)
    device = x.device
    if device.type == "cuda" and device.index != _private.cuda_current_device():
        with torch.cuda.device(device):  # Triton launches on the current device
            return amax_stats(q, x)
    amax_kernel, _ = _kernels(device.type != "cuda")
    x2d = x.detach().reshape(matrix_dims(x.shape)).contiguous()
    rowwise = _tensor_amax(_row_amax(amax_kernel, x2d, False, False))
    columnwise = rowwise
    if q.columnwise_usage and q.with_rht and q.with_post_rht_amax:
        columnwise = _tensor_amax(_row_amax(amax_kernel, x2d, True, True, q.with_random_sign_mask))
    return torch.cat([rowwise, columnwise])


def _tensor_amax(row_amax: torch.Tensor) -> torch.Tensor:
    """The per-tensor amax (1,) from the amax of each row (0 when there are none)."""
    return torch.cat([row_amax, row_amax.new_zeros(1)]).amax().reshape(1)


def _check_launchable(name: str, x: torch.Tensor) -> None:
    """Raise, naming ``name``, when the kernels cannot take ``x`` here."""
    if x.dtype not in _INPUT_DTYPES:
        raise TypeError(f"{name}: cannot quantize dtype {x.dtype}")
    if x.numel() == 0:
        raise ValueError(f"{name}: nothing to quantize in shape {tuple(x.shape)}")
    triton_support.check_runnable(name, x.device, unavailable_reason)
