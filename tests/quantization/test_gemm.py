"""gemm: forward (TN), dgrad (NN) and wgrad (NT) agree with an fp32 reference."""

from __future__ import annotations

import pytest
import torch
from quant_cases import QUANTIZERS, error_bound, random_input

from transformer_engine_ops.quantization import Float8CurrentScalingQuantizer, gemm
from transformer_engine_ops.quantization.gemm import LAYOUTS

M, N, K = 32, 64, 96  # multiples of 32 so every format takes every operand


def operands(q, seed=0):
    weight = random_input((N, K), seed=seed)
    inp = random_input((2, M // 2, K), seed=seed + 1)
    grad = random_input((2, M // 2, N), seed=seed + 2)
    return weight, inp, grad


def product_bound(qa, a, qb, b, left, right):
    """|Q(a) Q(b) - a b| <= Ea|b| + |a|Eb + Ea Eb for elementwise bounds Ea, Eb."""
    ea, eb = error_bound(qa, a), error_bound(qb, b)
    la, ra = left(a.abs(), ea), right(b.abs(), eb)
    return la[0] @ ra[1] + la[1] @ ra[0] + la[1] @ ra[1] + 1e-5 * (la[0] @ ra[0]) + 1e-6


CASES = {
    # layout: (A, B, reference, how A and B enter the product as (left, right))
    "TN": lambda w, x, g: (w, x, x.reshape(-1, K) @ w.t()),
    "NN": lambda w, x, g: (w, g, g.reshape(-1, N) @ w),
    "NT": lambda w, x, g: (x, g, g.reshape(-1, N).t() @ x.reshape(-1, K)),
}


def as_matrices(layout):
    if layout == "TN":
        return (lambda b, e: (b.reshape(-1, K), e.reshape(-1, K))), (lambda a, e: (a.t(), e.t()))
    if layout == "NN":
        return (lambda b, e: (b.reshape(-1, N), e.reshape(-1, N))), (lambda a, e: (a, e))
    return (lambda b, e: (b.reshape(-1, N).t(), e.reshape(-1, N).t())), (
        lambda a, e: (a.reshape(-1, K), e.reshape(-1, K))
    )


@pytest.mark.parametrize("layout", list(CASES))
@pytest.mark.parametrize("name", list(QUANTIZERS))
def test_quantized_gemm_is_within_the_format_bound_of_fp32(name, layout):
    q = QUANTIZERS[name]
    w, x, g = operands(q)
    a, b, ref = CASES[layout](w, x, g)
    out = gemm(q.quantize(a), q.quantize(b), layout=layout, out_dtype=torch.float32)
    left_of_b, right_of_a = as_matrices(layout)
    bound = product_bound(q, b, q, a, left_of_b, right_of_a)
    expected_shape = {"TN": (2, M // 2, N), "NN": (2, M // 2, K), "NT": (N, K)}[layout]
    assert out.shape == expected_shape
    assert bool(((out.reshape(bound.shape) - ref).abs() <= bound).all())


@pytest.mark.parametrize("layout", list(CASES))
def test_plain_operands_multiply_in_fp32_and_add_bias(layout):
    w, x, g = operands(None)
    a, b, ref = CASES[layout](w, x, g)
    bias = torch.randn(ref.shape[-1])
    out = gemm(a.bfloat16(), b.bfloat16(), layout=layout, out_dtype=torch.bfloat16, bias=bias)
    expected = (
        CASES[layout](w.bfloat16().float(), x.bfloat16().float(), g.bfloat16().float())[2] + bias
    ).bfloat16()
    assert out.dtype == torch.bfloat16
    assert torch.equal(out.reshape(expected.shape), expected)


CUDA = [pytest.param("cuda", marks=[pytest.mark.gpu])] if torch.cuda.is_available() else []


@pytest.mark.parametrize("device", ["cpu", *CUDA])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("layout", ["TN", "NN", "NT"])
@pytest.mark.parametrize("with_bias", [False, True], ids=["no-bias", "bias"])
def test_plain_product_is_the_branch_gemm_takes(layout, dtype, device, with_bias):
    """``plain_product`` (Linear's plain eager call) skips ``gemm``'s checks, not its
    math: on 2-D operands of one dtype and device it returns ``gemm``'s bits."""
    from transformer_engine_ops.quantization.gemm import plain_product

    a, b, _ = CASES[layout](*(t.reshape(-1, t.shape[-1]) for t in operands(None)))
    a, b = a.to(device, dtype), b.to(device, dtype)
    rows = {"TN": N, "NN": K, "NT": K}[layout]
    bias = torch.randn(rows, device=device).to(dtype) if with_bias else None
    expected = gemm(a, b, layout=layout, out_dtype=dtype, bias=bias)
    assert torch.equal(plain_product(a, b, layout, bias, dtype), expected)


def test_mixed_plain_and_quantized_operands():
    w, x, _ = operands(None)
    qw = QUANTIZERS["mxfp8_e4m3"].quantize(w)
    out = gemm(qw, x, layout="TN", out_dtype=torch.float32)
    assert torch.equal(out, (x.reshape(-1, K) @ qw.dequantize().t()).reshape(2, M // 2, N))


def test_gemm_is_deterministic():
    q = QUANTIZERS["nvfp4_1d"]
    w, x, _ = operands(q)
    outs = [gemm(q.quantize(w), q.quantize(x), out_dtype=torch.float32) for _ in range(2)]
    assert torch.equal(outs[0], outs[1])


def test_gemm_needs_the_usage_its_layout_reads():
    w, _, g = operands(None)
    rowwise_only = QUANTIZERS["mxfp8_e4m3"].with_usage(columnwise=False).quantize(w)
    with pytest.raises(ValueError, match="has no columnwise data"):
        gemm(rowwise_only, g, layout="NN", out_dtype=torch.float32)


def test_gemm_rejects_bad_layouts_shapes_and_devices():
    w, x, _ = operands(None)
    with pytest.raises(ValueError, match="layout must be one of"):
        gemm(w, x, layout="TT", out_dtype=torch.float32)
    with pytest.raises(ValueError, match="mismatched shapes"):
        gemm(w, x[..., :-1], layout="TN", out_dtype=torch.float32)
    with pytest.raises(ValueError, match="share one device"):
        gemm(w, x.to("meta"), layout="TN", out_dtype=torch.float32)
    with pytest.raises(ValueError, match="cpu or cuda"):
        gemm(w.to("meta"), x.to("meta"), layout="TN", out_dtype=torch.float32)


@pytest.mark.parametrize("device", ["cpu", *CUDA])
@pytest.mark.parametrize("layout", ["TN", "NN", "NT"])
def test_per_tensor_fp8_reads_a_missing_usage_from_the_other(layout, device):
    """Per-tensor FP8 has one scale: a value holding one usage only (a weight quantized
    rowwise under ``torch.no_grad``) serves a layout reading the other with the bits of
    the value holding both (TE makes the transpose from the codes); on CUDA through
    ``torch._scaled_mm`` as well."""
    from transformer_engine_ops.quantization.gemm import _scaled_mm_operands

    w, x, g = (t.to(device) for t in operands(None))
    a, b = {"TN": (w, x), "NN": (w, g), "NT": (x, g)}[layout]
    q = Float8CurrentScalingQuantizer()
    # Each operand without the usage its layout reads.
    lacking = {False: dict(rowwise=False), True: dict(columnwise=False)}
    a_col, b_col = LAYOUTS[layout]
    want = gemm(q.quantize(a), q.quantize(b), layout=layout, out_dtype=torch.float32)
    qa = q.with_usage(**lacking[a_col]).quantize(a)
    qb = q.with_usage(**lacking[b_col]).quantize(b)
    if device == "cuda":
        assert _scaled_mm_operands(qa, qb, layout) is not None  # the FP8 path is taken
    assert torch.equal(gemm(qa, qb, layout=layout, out_dtype=torch.float32), want)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("layout", list(CASES))
@pytest.mark.parametrize("fp8_dtypes", [("e4m3", "e4m3"), ("e4m3", "e5m2")])
def test_scaled_mm_path_agrees_with_the_cpu_path(layout, fp8_dtypes):
    dtypes = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
    qa = Float8CurrentScalingQuantizer(fp8_dtype=dtypes[fp8_dtypes[0]])
    qb = Float8CurrentScalingQuantizer(fp8_dtype=dtypes[fp8_dtypes[1]])
    w, x, g = operands(None)
    a, b, ref = CASES[layout](w, x, g)
    cpu = gemm(qa.quantize(a), qb.quantize(b), layout=layout, out_dtype=torch.float32)
    qa_cuda, qb_cuda = qa.quantize(a.cuda()), qb.quantize(b.cuda())
    from transformer_engine_ops.quantization.gemm import _scaled_mm_operands

    assert _scaled_mm_operands(qa_cuda, qb_cuda, layout) is not None  # the FP8 path is taken
    cuda = gemm(qa_cuda, qb_cuda, layout=layout, out_dtype=torch.float32).cpu()
    left_of_b, right_of_a = as_matrices(layout)
    bound = product_bound(qb, b, qa, a, left_of_b, right_of_a)
    # Hopper's FP8 tensor cores accumulate with fewer bits than fp32, so the two paths
    # differ slightly; both must stay within the format's bound of the exact product.
    assert bool(((cuda.reshape(bound.shape) - ref).abs() <= bound).all())
    assert bool(((cuda - cpu).reshape(bound.shape).abs() <= bound).all())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("layout", list(CASES))
@pytest.mark.parametrize("name", list(QUANTIZERS))
def test_cuda_bf16_output_of_every_format_agrees_with_the_cpu_path(name, layout):
    """bf16 out on CUDA: FP8 through _scaled_mm's epilogue, block formats dequantized to
    bf16 and one bf16 GEMM; within the format's bound plus one bf16 rounding."""
    q = QUANTIZERS[name]
    w, x, g = operands(q)
    a, b, ref = CASES[layout](w, x, g)
    bias = torch.randn(ref.shape[-1]).bfloat16() if layout != "NT" else None
    cpu = gemm(q.quantize(a), q.quantize(b), layout=layout, out_dtype=torch.float32)
    cuda = gemm(
        q.quantize(a.cuda()),
        q.quantize(b.cuda()),
        layout=layout,
        out_dtype=torch.bfloat16,
        bias=None if bias is None else bias.cuda(),
    )
    assert cuda.dtype == torch.bfloat16 and cuda.shape == cpu.shape
    cpu = cpu if bias is None else cpu + bias.float()
    left_of_b, right_of_a = as_matrices(layout)
    bound = product_bound(q, b, q, a, left_of_b, right_of_a).reshape(cpu.shape)
    diff = (cuda.cpu().float() - cpu).abs()
    assert bool((diff <= 2 * bound + cpu.abs() * 2.0**-7).all())
