"""The Linear family on CUDA: every module x every compiling recipe, compiled (inductor
and CUDA graphs) bitwise equal to eager, without graph breaks or cudagraph skips.

Run on a GPU machine with ``pytest -m gpu tests/modules/test_family_gpu.py``.
"""

from __future__ import annotations

import pytest
import torch
from family_cases import make, make_input
from module_cases import QUANTIZED, assert_bitwise, cloned, graph_breaks, step, unique_graphs
from torch._dynamo.utils import counters

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

MODULES = ["layernorm", "rmsnorm", "layernorm_linear", "layernorm_mlp"]


def _module_and_input(kind: str) -> tuple:
    return make(kind).cuda(), make_input().cuda()


@pytest.mark.parametrize("recipe", ["bf16", *QUANTIZED])
@pytest.mark.parametrize("kind", MODULES)
def test_family_module_compiles_on_cuda_bitwise(kind, recipe):
    module, x = _module_and_input(kind)
    eager = cloned(step(module, x, recipe))
    got = cloned(step(torch.compile(module, fullgraph=True), x, recipe))
    assert graph_breaks() == 0
    assert unique_graphs() == 1
    assert_bitwise(got, eager)


@pytest.mark.parametrize("recipe", ["bf16", "fp8_current"])
@pytest.mark.parametrize("kind", ["layernorm_linear", "layernorm_mlp"])
def test_family_module_cuda_graphs_do_not_skip(kind, recipe):
    module, x = _module_and_input(kind)
    eager = cloned(step(module, x, recipe))
    compiled = torch.compile(module, fullgraph=True, mode="reduce-overhead")
    skips = counters["inductor"]["cudagraph_skips"]
    for _ in range(3):
        got = cloned(step(compiled, x, recipe))
        torch.cuda.synchronize()
        assert_bitwise(got, eager)
    assert counters["inductor"]["cudagraph_skips"] == skips
    assert graph_breaks() == 0
