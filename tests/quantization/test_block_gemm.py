"""FP8 block operands for cuBLAS's block-scaled GEMM (quantization/float8_block_gemm.py).

The layout conversion runs on CPU tensors: each scale handed to ``torch._scaled_mm`` is
checked against torch's own acceptance rules (ScaledBlas.cpp's
``is_blockwise_1x128_scaling`` / ``is_blockwise_128x128_scaling``, both row-stride
variants torch versions use), against the stored buffer (a view: no copy per GEMM), and
by expanding it over its operand as cuBLAS does: the scaled FP8 operands must equal
the dequantized ones bit for bit, for TE's three layouts.
"""

from __future__ import annotations

import functools
import math

import pytest
import torch

from transformer_engine_ops.quantization import (
    Float8BlockQuantizer,
    Float8CurrentScalingQuantizer,
    gemm,
)
from transformer_engine_ops.quantization.float8_block_gemm import (
    block_scaled_mm_operands,
    qualifies,
    runs_on,
)
from transformer_engine_ops.quantization.quantizer import QuantizedData

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
# Every layout's contraction (K, N, tokens) is a multiple of 4 whole blocks.
TOKENS, N, K = 512, 512, 1024


def quantizer(dim, fp8_dtype=E4M3, pow2=True):
    return Float8BlockQuantizer(fp8_dtype=fp8_dtype, block_scaling_dim=dim, force_pow_2_scales=pow2)


@functools.cache
def operands(layout, a_dim, b_dim, *, a_dtype=E4M3, b_dtype=E4M3, pow2=True, k=K, device="cpu"):
    """Quantized (A, B) of ``layout``, both usages, values spread over many magnitudes
    (so the blocks' scales differ). Cached: no test changes them."""
    gen = torch.Generator().manual_seed(0)

    def rand(*shape):
        scale = torch.exp2(torch.randint(-8, 8, shape, generator=gen).float())
        return (torch.randn(*shape, generator=gen) * scale).to(device)

    weight, inp, grad = rand(N, k), rand(2, TOKENS // 2, k), rand(2, TOKENS // 2, N)
    a, b = {"TN": (weight, inp), "NN": (weight, grad), "NT": (inp, grad)}[layout]
    return (
        quantizer(a_dim, a_dtype, pow2).quantize(a),
        quantizer(b_dim, b_dtype, pow2).quantize(b),
    )


# --- torch's acceptance rules for block scales (ScaledBlas.cpp), as a specification ---


def _size_stride(scale, dim, size, stride):
    return scale.size(dim) == size and (size <= 1 or scale.stride(dim) == stride)


def accepted_1x128(t_shape, scale):
    rows, cols = t_shape
    return (
        scale.dtype == torch.float32
        and scale.dim() == 2
        and _size_stride(scale, 0, rows, 1)
        and _size_stride(scale, 1, math.ceil(cols / 128), rows)
    )


def accepted_128x128(t_shape, scale, padded_row_stride):
    rows, cols = t_shape
    col_blocks = math.ceil(cols / 128)
    stride = -(-col_blocks // 4) * 4 if padded_row_stride else col_blocks
    return (
        scale.dtype == torch.float32
        and scale.dim() == 2
        and _size_stride(scale, 0, math.ceil(rows / 128), stride)
        and _size_stride(scale, 1, col_blocks, 1)
    )


def accepted(t_shape, scale, dim):
    if dim == 1:
        return accepted_1x128(t_shape, scale)
    return accepted_128x128(t_shape, scale, True) and accepted_128x128(t_shape, scale, False)


def expand(scale, shape, dim):
    """A ``_scaled_mm`` scale (a-form) expanded to one entry per element of ``shape``."""
    rows, cols = shape
    full = scale.repeat_interleave(128, dim=1)
    if dim == 2:
        full = full.repeat_interleave(128, dim=0)
    return full[:rows, :cols]


def dequantized_matrices(A, B, layout):
    """(left, right) with ``gemm(A, B) = left @ right``, from the dequantized usages."""
    a_col, b_col = {"TN": (False, False), "NN": (True, False), "NT": (True, True)}[layout]
    a = QuantizedData.dequantize_usage(A, columnwise=a_col, dtype=torch.float32)
    b = QuantizedData.dequantize_usage(B, columnwise=b_col, dtype=torch.float32)
    b2 = b.reshape(-1, b.shape[-1])
    if layout == "TN":
        return b2, a.t()
    if layout == "NN":
        return b2, a
    return b2.t(), a.reshape(-1, a.shape[-1])


# (A's dim, B's dim): TE's fprop and dgrad (a 128x128 weight), its wgrad, and the reverse.
COMBOS = [(2, 1), (1, 1), (1, 2)]


@pytest.mark.parametrize("pow2", [True, False])
@pytest.mark.parametrize("dims", COMBOS)
@pytest.mark.parametrize("layout", ["TN", "NN", "NT"])
def test_scaled_operands_equal_the_dequantized_operands_bitwise(layout, dims, pow2):
    A, B = operands(layout, *dims, pow2=pow2)
    ops = block_scaled_mm_operands(A, B, layout)
    assert ops is not None
    a, b, scale_a, scale_b = ops
    left, right = dequantized_matrices(A, B, layout)
    assert a.dtype == E4M3 and b.dtype == E4M3
    assert a.shape == left.shape and b.shape == right.shape
    assert a.stride(1) == 1 and b.stride(0) == 1  # row-major a, column-major b
    b_dim, a_dim = dims[1], dims[0]
    assert accepted(a.shape, scale_a, b_dim)
    assert accepted(b.t().shape, scale_b.t(), a_dim)
    assert torch.equal(a.float() * expand(scale_a, a.shape, b_dim), left)
    assert torch.equal((b.t().float() * expand(scale_b.t(), b.t().shape, a_dim)).t(), right)


@pytest.mark.parametrize("dims", COMBOS)
@pytest.mark.parametrize("layout", ["TN", "NN", "NT"])
def test_operands_are_views_of_the_stored_buffers(layout, dims):
    """No copy per GEMM: every tensor handed to cuBLAS shares its stored buffer's memory."""
    A, B = operands(layout, *dims)
    a, b, scale_a, scale_b = block_scaled_mm_operands(A, B, layout)
    stored = {
        t.data_ptr()
        for v in (A, B)
        for t in (
            v._rowwise_data,
            v._rowwise_scale_inv,
            v._columnwise_data,
            v._columnwise_scale_inv,
        )
    }
    assert {a.data_ptr(), b.data_ptr(), scale_a.data_ptr(), scale_b.data_ptr()} <= stored


@pytest.mark.parametrize("dim", [1, 2])
@pytest.mark.parametrize("shape", [(256, 512), (6, 512), (130, 5), (3, 7, 200), (1, 128)])
def test_stored_scales_are_row_major(shape, dim):
    """The GEMM-ready layout TE stores (a 1-D scale is made transposed: stored row-major),
    for quantized and derived usages."""
    v = quantizer(dim).quantize(torch.randn(*shape))
    assert v._rowwise_scale_inv.is_contiguous() and v._columnwise_scale_inv.is_contiguous()
    if dim == 2:
        for keep_rowwise in (True, False):
            w = quantizer(2).with_usage(rowwise=keep_rowwise, columnwise=not keep_rowwise)
            w = w.quantize(torch.randn(*shape))
            w.update_usage(rowwise_usage=True, columnwise_usage=True)
            assert w._rowwise_scale_inv.is_contiguous()
            assert w._columnwise_scale_inv.is_contiguous()
            assert w._rowwise_scale_inv.data_ptr() != w._columnwise_scale_inv.data_ptr()


def test_hybrid_operands_e4m3_by_e5m2_qualify_and_e5m2_by_e5m2_does_not():
    A, B = operands("NN", 1, 1, a_dtype=E4M3, b_dtype=E5M2)
    a, b, _, _ = block_scaled_mm_operands(A, B, "NN")
    assert a.dtype == E5M2 and b.dtype == E4M3
    A, B = operands("NT", 1, 1, a_dtype=E5M2, b_dtype=E5M2)
    assert block_scaled_mm_operands(A, B, "NT") is None


@pytest.mark.parametrize(
    ("rows", "cols", "n", "dims", "taken"),
    [
        (200, 512, 256, (1, 2), True),  # rows need not be 128-blocks (ran on the H200)
        (4, 128, 16, (1, 1), True),
        (202, 512, 256, (1, 2), False),  # 1x128 scale row stride not 16-byte aligned
        (256, 1008, 256, (1, 1), False),  # a partial last block along the contraction
        (256, 384, 256, (1, 2), False),  # 3 blocks: 128x128 scale rows not 16-byte apart
        (256, 384, 256, (1, 1), True),  # ... which only a 128x128 scale has
        (256, 512, 200, (1, 1), False),  # b's other dim not a multiple of 16
        (256, 512, 256, (2, 2), False),  # no 128x128 by 128x128 GEMM
        (0, 512, 256, (1, 1), False),  # empty: the dequantized path
    ],
)
def test_which_shapes_take_the_block_scaled_gemm(rows, cols, n, dims, taken):
    assert qualifies(rows, cols, n, dims) is taken


def test_other_operands_are_not_taken():
    A, B = operands("TN", 2, 1)
    assert (
        block_scaled_mm_operands(
            A, Float8CurrentScalingQuantizer().quantize(torch.randn(8, K)), "TN"
        )
        is None
    )
    assert block_scaled_mm_operands(A, torch.randn(8, K), "TN") is None
    small_blocks = Float8BlockQuantizer(block_len=64, block_scaling_dim=1).quantize(
        torch.randn(8, K)
    )
    assert block_scaled_mm_operands(A, small_blocks, "TN") is None
    rowwise_only = (
        quantizer(2).with_usage(rowwise=True, columnwise=False).quantize(torch.randn(N, K))
    )
    grad = quantizer(1).quantize(torch.randn(8, N))
    assert block_scaled_mm_operands(rowwise_only, grad, "NN") is None  # dgrad reads columnwise


@pytest.mark.parametrize(
    ("cuda", "hip", "capability", "runs"),
    [
        ("13.0", None, (9, 0), True),  # the H200's torch 2.11+cu130
        ("12.9", None, (9, 0), True),
        ("12.6", None, (9, 0), False),  # torch refuses block scales below CUDA 12.9
        ("13.0", None, (10, 0), False),  # Blackwell: no 1x128/128x128 fp32-scale GEMM
        ("13.0", None, (8, 9), False),  # Ada: per-tensor FP8 scaling only
        (None, "7.0", (9, 4), False),  # ROCm
        (None, None, (9, 0), False),  # a CPU-only build
    ],
)
def test_only_hopper_under_cuda_12_9_runs_the_block_scaled_gemm(
    monkeypatch, cuda, hip, capability, runs
):
    monkeypatch.setattr(torch.version, "cuda", cuda)
    monkeypatch.setattr(torch.version, "hip", hip)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: capability)
    runs_on.cache_clear()
    try:
        assert runs_on(0) is runs
    finally:
        runs_on.cache_clear()


def test_the_cpu_gemm_keeps_the_dequantized_path():
    """The block-scaled GEMM is CUDA's; on the CPU gemm multiplies the dequantized values."""
    A, B = operands("TN", 2, 1)
    left, right = dequantized_matrices(A, B, "TN")
    out = gemm(A, B, layout="TN", out_dtype=torch.float32)
    assert torch.equal(out.reshape(-1, N), left @ right)


# --- on the H200: the native GEMM against the dequantized product -----------------------

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.fixture
def scaled_mm_calls(monkeypatch):
    """The ``torch._scaled_mm`` calls gemm makes (their scale shapes), recorded."""
    from transformer_engine_ops.runtime import _torch_private

    calls = []
    real = _torch_private.scaled_mm

    def spy(a, b, **kwargs):
        calls.append((tuple(kwargs["scale_a"].shape), tuple(kwargs["scale_b"].shape)))
        return real(a, b, **kwargs)

    monkeypatch.setattr(_torch_private, "scaled_mm", spy)
    return calls


def within_fp8_gemm_tolerance(out, left, right, bias, out_dtype):
    """``out`` against the fp32 product of the dequantized operands: Hopper accumulates
    FP8 products with fewer bits than fp32 (promoted to fp32 every few steps with the
    split accumulator), then rounds once to ``out_dtype``. A misread scale is off by
    whole powers of two (the operands span 2**-8..2**8), far outside this bound."""
    ref = left @ right
    if bias is not None:
        ref = ref + bias.float()
    rounding = 2.0**-8 if out_dtype != torch.float32 else 0.0
    bound = 2.0**-10 * (left.abs() @ right.abs()) + rounding * ref.abs()
    return bool(((out.float().reshape(ref.shape) - ref).abs() <= bound).all())


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("pow2", [True, False])
@pytest.mark.parametrize("dims", COMBOS)
@pytest.mark.parametrize("layout", ["TN", "NN", "NT"])
def test_cuda_block_scaled_gemm_agrees_with_the_dequantized_product(
    layout, dims, pow2, out_dtype, scaled_mm_calls
):
    assert runs_on(torch.cuda.current_device()), "needs Hopper and torch for CUDA 12.9+"
    A, B = operands(layout, *dims, pow2=pow2, device="cuda")
    left, right = dequantized_matrices(A, B, layout)
    bias = None
    if layout != "NT":  # a bias of the output's dtype: the epilogue's (bf16), added in fp32
        bias = torch.randn(right.shape[1], device="cuda").to(out_dtype)
    out = gemm(A, B, layout=layout, out_dtype=out_dtype, bias=bias)
    assert len(scaled_mm_calls) == 1  # the native GEMM ran
    assert out.dtype == out_dtype
    assert within_fp8_gemm_tolerance(out, left, right, bias, out_dtype)
    assert torch.equal(gemm(A, B, layout=layout, out_dtype=out_dtype, bias=bias), out)


@pytest.mark.gpu
@needs_cuda
def test_cuda_hybrid_dgrad_e5m2_gradient_takes_the_block_scaled_gemm(scaled_mm_calls):
    A, B = operands("NN", 2, 1, b_dtype=E5M2, device="cuda")
    left, right = dequantized_matrices(A, B, "NN")
    out = gemm(A, B, layout="NN", out_dtype=torch.bfloat16)
    assert len(scaled_mm_calls) == 1
    assert within_fp8_gemm_tolerance(out, left, right, None, torch.bfloat16)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("k", [384, 1008])
def test_cuda_shapes_the_block_gemm_does_not_take_are_dequantized(k, scaled_mm_calls):
    """384: three blocks under a 128x128 weight; 1008: a partial last block."""
    A, B = operands("TN", 2, 1, k=k, device="cuda")
    left, right = dequantized_matrices(A, B, "TN")
    out = gemm(A, B, layout="TN", out_dtype=torch.bfloat16)
    assert scaled_mm_calls == []
    assert within_fp8_gemm_tolerance(out, left, right, None, torch.bfloat16)
