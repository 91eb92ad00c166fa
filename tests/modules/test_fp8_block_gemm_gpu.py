"""Linear and LayerNormMLP with Float8BlockScaling at shapes cuBLAS's block-scaled FP8
GEMM takes: every GEMM (fprop, dgrad, wgrad) runs natively, and compiled equals eager
bit for bit (both call the same GEMM inside the op).

Run on the H200 with ``pytest -m gpu tests/modules/test_fp8_block_gemm_gpu.py``.
"""

from __future__ import annotations

import pytest
import torch
from family_cases import randomize
from module_cases import assert_bitwise, cloned, graph_breaks, step, unique_graphs
from torch._dynamo.utils import counters

import transformer_engine_ops as te
from transformer_engine_ops.quantization import float8_block_gemm
from transformer_engine_ops.runtime import _torch_private

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

# Tokens, hidden and FFN sizes whose every contraction is a multiple of 4 whole blocks.
TOKENS, HIDDEN, OUT, FFN = 512, 1024, 512, 2048
# Native GEMMs in one training step: fprop, dgrad and wgrad per linear layer.
NATIVE_GEMMS = {"linear": 3, "layernorm_mlp": 6}


def make(kind: str) -> torch.nn.Module:
    torch.manual_seed(0)
    if kind == "linear":
        module = te.Linear(HIDDEN, OUT, params_dtype=torch.bfloat16, device="cuda")
    else:
        module = te.LayerNormMLP(HIDDEN, FFN, params_dtype=torch.bfloat16, device="cuda")
    return randomize(module)


def make_input() -> torch.Tensor:
    gen = torch.Generator().manual_seed(1)
    return torch.randn(2, TOKENS // 2, HIDDEN, generator=gen).to(torch.bfloat16).cuda()


@pytest.fixture
def scaled_mm_calls(monkeypatch) -> list[int]:
    """Counts the ``torch._scaled_mm`` calls the GEMMs make."""
    assert float8_block_gemm.runs_on(torch.cuda.current_device()), "needs Hopper, CUDA 12.9+"
    calls: list[int] = []
    real = _torch_private.scaled_mm

    def spy(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(_torch_private, "scaled_mm", spy)
    return calls


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("kind", ["linear", "layernorm_mlp"])
def test_compiled_block_scaled_step_is_bitwise_equal_to_eager(kind, backend, scaled_mm_calls):
    module, x = make(kind), make_input()
    eager = cloned(step(module, x, "fp8_block"))
    assert len(scaled_mm_calls) == NATIVE_GEMMS[kind]  # no GEMM was dequantized
    del scaled_mm_calls[:]
    got = cloned(step(torch.compile(module, fullgraph=True, backend=backend), x, "fp8_block"))
    assert len(scaled_mm_calls) >= NATIVE_GEMMS[kind]
    assert graph_breaks() == 0, dict(counters["graph_break"])
    assert unique_graphs() == 1
    assert_bitwise(got, eager)


@pytest.mark.parametrize("kind", ["linear", "layernorm_mlp"])
def test_block_scaled_step_under_cuda_graphs_is_bitwise_equal_to_eager(kind, scaled_mm_calls):
    module, x = make(kind), make_input()
    eager = cloned(step(module, x, "fp8_block"))
    assert len(scaled_mm_calls) == NATIVE_GEMMS[kind]
    compiled = torch.compile(module, fullgraph=True, mode="reduce-overhead")
    skips = counters["inductor"]["cudagraph_skips"]
    for _ in range(3):
        got = cloned(step(compiled, x, "fp8_block"))
        torch.cuda.synchronize()
        assert_bitwise(got, eager)
    assert counters["inductor"]["cudagraph_skips"] == skips
    assert graph_breaks() == 0


def test_native_block_scaled_linear_is_close_to_the_dequantized_one(scaled_mm_calls):
    """The same step with the dequantized GEMM (the native one refused): outputs and
    gradients agree within FP8 GEMM accumulation and bf16 rounding."""
    module, x = make("linear"), make_input()
    native = cloned(step(module, x, "fp8_block"))
    assert len(scaled_mm_calls) == NATIVE_GEMMS["linear"]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(float8_block_gemm, "qualifies", lambda *args: False)
        dequantized = cloned(step(module, x, "fp8_block"))
    flat_native = (native[0], native[1], *native[2])
    flat_dequantized = (dequantized[0], dequantized[1], *dequantized[2])
    for got, want in zip(flat_native, flat_dequantized, strict=True):
        scale = want.float().abs().max()
        assert (got.float() - want.float()).abs().max() <= 2.0**-6 * scale


@pytest.mark.parametrize("kind", ["linear", "layernorm_mlp"])
def test_block_quantize_kernel_runs_eager_and_compiled_with_the_same_bits(kind, monkeypatch):
    """The step's quantizes take the Triton kernel (block_kernels.py) eagerly and in the
    compiled graph's op calls (Inductor, fullgraph): bitwise equal to each other and to
    the step on the reference quantize."""
    from transformer_engine_ops.kernels import block_kernels

    calls: list[int] = []
    real = block_kernels.fused_quantize
    monkeypatch.setattr(
        block_kernels, "fused_quantize", lambda *a, **k: calls.append(1) or real(*a, **k)
    )
    module, x = make(kind), make_input()
    eager = cloned(step(module, x, "fp8_block"))
    assert calls, "the eager step did not take the block quantize kernel"
    del calls[:]
    got = cloned(step(torch.compile(module, fullgraph=True, backend="inductor"), x, "fp8_block"))
    assert calls, "the compiled step did not take the block quantize kernel"
    assert graph_breaks() == 0, dict(counters["graph_break"])
    assert_bitwise(got, eager)
    with pytest.MonkeyPatch.context() as mp:  # the reference quantize: the same bits
        mp.setattr(block_kernels, "eligible", lambda *args: False)
        assert_bitwise(cloned(step(module, x, "fp8_block")), eager)


@pytest.mark.parametrize("kind", ["linear", "layernorm_mlp"])
def test_block_scaled_calls_lower_into_inductor_bitwise(kind):
    """On CUDA a block-scaled op call lowers (``Float8BlockQuantizer.lowers_bitwise_on``):
    traced into Inductor's graph with the quantize recorded as one op
    (``block_kernels._recorded``) and the native block-scaled GEMM, the step bitwise
    equal to eager."""
    from torch._inductor.utils import fresh_cache

    from transformer_engine_ops.runtime import lowering

    module, x = make(kind), make_input()
    eager = cloned(step(module, x, "fp8_block"))
    torch._dynamo.reset()
    with fresh_cache(), lowering.recording() as lowered:
        compiled = torch.compile(module, fullgraph=True, backend="inductor")
        got = cloned(step(compiled, x, "fp8_block"))
    assert lowered, "no op call was lowered"
    assert graph_breaks() == 0, dict(counters["graph_break"])
    assert_bitwise(got, eager)
