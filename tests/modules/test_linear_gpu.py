"""Linear under torch.compile on CUDA: bitwise agreement with eager (bf16 and every
quantized recipe that compiles), and CUDA graphs (mode="reduce-overhead") without
cudagraph skips.

Run on a GPU machine with ``pytest -m gpu tests/modules/test_linear_gpu.py``.
"""

from __future__ import annotations

import pytest
import torch
from module_cases import (
    QUANTIZED,
    assert_bitwise,
    cloned,
    graph_breaks,
    make_input,
    make_mlp,
    step,
    unique_graphs,
)
from torch._dynamo.utils import counters

from transformer_engine_ops.modules.autocast import autocast

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

# DelayedScaling is refused under compile (its scaling state cannot cross the op).
CUDA_RECIPES = ["bf16", *QUANTIZED]


def _inputs() -> tuple:
    return make_mlp(device="cuda"), make_input(device="cuda")


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("recipe", CUDA_RECIPES)
def test_compiled_mlp_on_cuda_is_bitwise_equal_to_eager(recipe, backend):
    model, x = _inputs()
    eager = cloned(step(model, x, recipe))
    compiled = torch.compile(model, fullgraph=True, backend=backend)
    got = cloned(step(compiled, x, recipe))
    assert graph_breaks() == 0, dict(counters["graph_break"])
    assert unique_graphs() == 1
    assert_bitwise(got, eager)


@pytest.mark.parametrize("recipe", CUDA_RECIPES)
def test_reduce_overhead_cuda_graphs_do_not_skip(recipe):
    model, x = _inputs()
    eager = cloned(step(model, x, recipe))  # eager warm-up
    compiled = torch.compile(model, fullgraph=True, mode="reduce-overhead")
    skips = counters["inductor"]["cudagraph_skips"]
    for _ in range(3):
        got = cloned(step(compiled, x, recipe))
        torch.cuda.synchronize()
        assert_bitwise(got, eager)
    assert counters["inductor"]["cudagraph_skips"] == skips
    assert graph_breaks() == 0


@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_fp8_inference_compiles_on_cuda_bitwise(mode):
    """FP8 current scaling under no_grad: one graph, no breaks, eager's exact output."""
    from transformer_engine_ops.quantization import Float8CurrentScaling

    model, x = _inputs()
    compiled = torch.compile(model, fullgraph=True, mode=mode)
    with torch.no_grad(), autocast(recipe=Float8CurrentScaling()):
        expected = model(x).clone()
        for _ in range(3):
            got = compiled(x).clone()
            assert torch.equal(got, expected)
    assert graph_breaks() == 0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_cuda_bias_gradient_is_the_fp32_column_sum_rounded_once(dtype):
    """On CUDA a 16-bit output gradient's bias gradient is one ``sum`` kernel; it must
    write the bits of the fp32 column sum rounded once (what the CPU computes), for
    every shape class: empty, single row or column, ragged, strided, wide, tall."""
    from transformer_engine_ops.ops.linear import _bias_grad

    gen = torch.Generator().manual_seed(0)
    shapes = [(0, 7), (1, 1), (3, 5), (64, 255), (1031, 2053), (4096, 1), (2, 100000)]
    for rows, cols in shapes:
        for scale in (1e-3, 1.0, 1e3):
            dy = (torch.randn(rows, cols, generator=gen) * scale).to(dtype).cuda()
            for view in (dy, dy.t().contiguous().t(), dy[:, : max(cols - 1, 1)]):
                want = view.sum(0, dtype=torch.float32).to(dtype)
                got = _bias_grad(view, dtype)
                assert got.dtype == dtype and got.shape == want.shape
                assert torch.equal(got.view(torch.int16), want.view(torch.int16)), (
                    rows,
                    cols,
                    scale,
                    view.stride(),
                )
