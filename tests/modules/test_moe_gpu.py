"""The MoE helpers, router and GroupedLinear's grouped GEMM on CUDA: the per-token sum's
Triton kernel against the torch path, the helpers against their CPU results, the grouped
GEMM against the per-GEMM loop (bf16 and FP8 current scaling), a whole MoE layer step
(``demo/moe_demo.py``'s) without a host synchronization, and under
``mode="reduce-overhead"`` in CUDA graphs that replay differently routed batches with
eager's results."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import pytest
import torch

import transformer_engine_ops as te
import transformer_engine_ops.modules.grouped_linear as grouped_linear_module
from transformer_engine_ops import recipe
from transformer_engine_ops.kernels import moe_kernels
from transformer_engine_ops.ops import _moe
from transformer_engine_ops.router import fused_topk_with_score_function

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "demo"))
import moe_demo  # noqa: E402, I001

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

CUDA = "cuda"
HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9
needs_hopper = pytest.mark.skipif(not HOPPER, reason="torch's grouped GEMMs need sm_90+")
SIZES = dict(hidden=256, experts=8, topk=2, ffn=128, tokens=512)
RECIPES = {"bf16": None, "fp8_current": recipe.Float8CurrentScaling}


def _context(name):
    make = RECIPES[name]
    return te.autocast(recipe=make()) if make is not None else contextlib.nullcontext()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("counts", [False, True])
@pytest.mark.parametrize("weights", [False, True])
def test_token_sum_kernel_against_the_torch_path(dtype, counts, weights):
    assert moe_kernels.available(), moe_kernels.unavailable_reason()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3000, 1500, generator=g).to(dtype)
    rows = torch.randint(-1, 3000, (700, 6), generator=g)
    c = torch.randint(0, 7, (700,), generator=g) if counts else None
    w = torch.rand(700, 6, generator=g) if weights else None
    on_cuda = [None if t is None else t.to(CUDA) for t in (x, rows, c, w)]
    got = moe_kernels.token_sum(*on_cuda, torch.float32).cpu()
    want = _moe.token_sum(x, rows, c, w, torch.float32)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_helpers_on_cuda_match_the_cpu():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(300, 64, generator=g).to(torch.bfloat16)
    logits = torch.randn(300, 16, generator=g)
    results = {}
    for device in ("cpu", CUDA):
        # detached first: on the CPU ``.to`` returns the tensor itself, which would then
        # require grad, and its CUDA copy would be a non-leaf without ``.grad``
        xi = x.detach().to(device).requires_grad_(True)
        li = logits.detach().to(device).requires_grad_(True)
        probs, rmap = fused_topk_with_score_function(
            li, 4, False, None, None, None, "sigmoid", None
        )
        out, pprobs, row_id_map = te.moe_permute_with_probs(xi, probs, rmap, 1200)
        back = te.moe_unpermute(out * 2, row_id_map, merging_probs=probs, restore_shape=x.shape)
        back.float().square().sum().backward()
        results[device] = [t.detach().cpu() for t in (out, row_id_map, back, xi.grad, li.grad)]
    cpu, cuda = results["cpu"], results[CUDA]
    assert torch.equal(cpu[0], cuda[0]) and torch.equal(cpu[1], cuda[1])
    for a, b in zip(cpu[2:], cuda[2:], strict=True):
        torch.testing.assert_close(a.float(), b.float(), rtol=2e-2, atol=1e-3)


@needs_hopper
@pytest.mark.parametrize("name", list(RECIPES))
def test_grouped_gemm_serves_cuda_and_matches_the_loop(name, monkeypatch):
    torch.manual_seed(0)
    module = te.GroupedLinear(4, 256, 128, bias=False, params_dtype=torch.bfloat16, device=CUDA)
    x = torch.randn(300, 256, device=CUDA).to(torch.bfloat16)
    splits = torch.tensor([100, 0, 150, 50], device=CUDA)
    calls = {"grouped_gemm": 0}
    original = grouped_linear_module.call_grouped_gemm

    def counted(**kwargs):
        calls["grouped_gemm"] += 1
        return original(**kwargs)

    def step(loop: bool):
        module.zero_grad(set_to_none=True)
        xi = x.clone().requires_grad_(True)
        with monkeypatch.context() as m:
            if loop:
                m.setattr(te.GroupedLinear, "_grouped_gemm_serves", lambda *a: False)
            else:
                m.setattr(grouped_linear_module, "call_grouped_gemm", counted)
            with _context(name):
                y = module(xi, splits)
        y.float().square().sum().backward()
        return [y, xi.grad, *[p.grad for p in module.parameters()]]

    got, want = step(False), step(True)
    assert calls["grouped_gemm"] == 1
    for a, b in zip(got, want, strict=True):
        scale = b.float().abs().max().item()
        assert (a.float() - b.float()).abs().max().item() <= 0.02 * scale + 1e-3
    assert torch.count_nonzero(got[3]) == 0  # the empty group's weight gradient


def _step(layer, x, name):
    for p in layer.parameters():
        p.grad = None
    x = x.detach().clone().requires_grad_(True)
    with _context(name):
        out = layer(x)
    out.backward(torch.ones_like(out))
    params = getattr(layer, "_orig_mod", layer).parameters()
    return [out.detach().clone(), x.grad.clone(), *[p.grad.clone() for p in params]]


@needs_hopper
@pytest.mark.parametrize("name", list(RECIPES))
def test_a_moe_layer_step_does_not_synchronize(name):
    torch.manual_seed(0)
    layer = moe_demo.MoELayer(
        SIZES["hidden"], SIZES["experts"], SIZES["topk"], SIZES["ffn"], device=CUDA
    )
    x = torch.randn(SIZES["tokens"], SIZES["hidden"], device=CUDA).to(torch.bfloat16)
    _step(layer, x, name)  # lazy initializations (Triton builds, cuBLAS handles)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        _step(layer, x, name)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()


@needs_hopper
@pytest.mark.parametrize("single", [False, True], ids=["per_expert", "single_grouped"])
@pytest.mark.parametrize("name", list(RECIPES))
def test_reduce_overhead_replays_differently_routed_batches_as_eager(name, single, monkeypatch):
    from torch._dynamo.utils import counters

    monkeypatch.setenv("NVTE_GROUPED_LINEAR_SINGLE_PARAM", "1")
    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    layer = moe_demo.MoELayer(
        SIZES["hidden"],
        SIZES["experts"],
        SIZES["topk"],
        SIZES["ffn"],
        device=CUDA,
        single_grouped_weight=single,
    )
    compiled = torch.compile(layer, fullgraph=True, mode="reduce-overhead")
    routings = set()
    for seed in range(5):
        g = torch.Generator(device=CUDA).manual_seed(seed)
        x = torch.randn(SIZES["tokens"], SIZES["hidden"], generator=g, device=CUDA)
        x = x.to(torch.bfloat16)
        routings.add(tuple(layer.route(x)[1].sum(0).tolist()))
        got, want = _step(compiled, x, name), _step(layer, x, name)
        for a, b in zip(got, want, strict=True):
            assert torch.equal(a, b)
    assert len(routings) > 1
    assert counters["inductor"]["cudagraph_skips"] == 0
    assert sum(counters["graph_break"].values()) == 0


def test_quantile_balancing_in_a_cuda_graph_after_an_eager_call():
    """TE's rule: the bounds read eagerly once, a CUDA graph replays the router."""
    logits = torch.randn(8, 16, device=CUDA)
    bias = torch.zeros(16, device=CUDA)
    hist = torch.zeros(16, 32, dtype=torch.int32, device=CUDA)
    bounds = torch.tensor([-1.0, 1.0], device=CUDA)

    def router():
        return fused_topk_with_score_function(
            logits,
            4,
            False,
            None,
            None,
            None,
            "sigmoid",
            bias,
            qb_histogram=hist,
            qb_bin_bounds=bounds,
            qb_histogram_mode="two_kernel",
        )

    router()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        probs, routing = router()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.isfinite(probs).all()
    assert routing.sum().item() == 8 * 4
