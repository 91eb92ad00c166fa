"""The fused norm kernels on CUDA (``kernels/norm_kernels.py``) inside the modules: for
te.LayerNorm, te.RMSNorm, LayerNormLinear and LayerNormMLP (both normalizations), eager
and compiled (aot_eager, Inductor, CUDA graphs) run the same kernels, so they are
bitwise equal; the CUDA modules agree with the CPU reference within rounding; and the
kernels are what actually runs, eagerly and in a compiled graph.

Run on a GPU machine with ``pytest -m gpu tests/modules/test_norm_kernels_gpu.py``.
"""

from __future__ import annotations

import copy
import typing

import pytest
import torch
from family_cases import make, make_input
from module_cases import assert_bitwise, cloned, graph_breaks, recipe_context, step
from torch._dynamo.utils import counters

from transformer_engine_ops.kernels import norm_kernels

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

# (family_cases kind, its keyword arguments): each module with each normalization, and
# zero-centered gamma.
MODULES = [
    ("layernorm", {}),
    ("layernorm", {"zero_centered_gamma": True}),
    ("rmsnorm", {}),
    ("rmsnorm", {"zero_centered_gamma": True}),
    ("layernorm_linear", {}),
    ("layernorm_linear", {"normalization": "RMSNorm"}),
    ("layernorm_mlp", {}),
    ("layernorm_mlp", {"normalization": "RMSNorm", "activation": "swiglu"}),
]
IDS = [f"{kind}-{'-'.join(f'{k}={v}' for k, v in kwargs.items())}" for kind, kwargs in MODULES]


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize(("kind", "kwargs"), MODULES, ids=IDS)
def test_compiled_equals_eager_bitwise_on_cuda(kind, kwargs, backend):
    module, x = make(kind, **kwargs).cuda(), make_input().cuda()
    eager = cloned(step(module, x, "bf16"))
    got = cloned(step(torch.compile(module, fullgraph=True, backend=backend), x, "bf16"))
    assert graph_breaks() == 0
    assert_bitwise(got, eager)


def _step_with_norm_output(model: typing.Any, x: torch.Tensor) -> tuple[typing.Any, ...]:
    """``module_cases.step`` for a LayerNormLinear that returns its norm output too: the
    loss reads both, so the norm's backward adds the norm output's own gradient."""
    params = list(getattr(model, "_orig_mod", model).parameters())
    for p in params:
        p.grad = None
    x = x.detach().clone().requires_grad_(True)
    with recipe_context("bf16"):
        out, ln_out = model(x)
    (out.float().sum() + (ln_out.float() * 0.5).sum()).backward()
    return (
        torch.cat([out.reshape(-1), ln_out.reshape(-1)]).detach(),
        x.grad,
        [p.grad for p in params],
    )


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_returned_norm_output_runs_the_kernels_bitwise(backend):
    """``return_layernorm_output``: the backward kernel adds the two output gradients."""
    module = make("layernorm_linear", return_layernorm_output=True).cuda()
    x = make_input().cuda()
    eager = cloned(_step_with_norm_output(module, x))
    compiled = torch.compile(module, fullgraph=True, backend=backend)
    assert_bitwise(cloned(_step_with_norm_output(compiled, x)), eager)
    assert graph_breaks() == 0


@pytest.mark.parametrize("kind", ["layernorm_linear", "layernorm_mlp"])
def test_fp8_current_scaling_runs_the_kernels_bitwise(kind):
    """Under FP8 current scaling the norm output feeds fc1's quantize."""
    module, x = make(kind, normalization="RMSNorm").cuda(), make_input().cuda()
    eager = cloned(step(module, x, "fp8_current"))
    got = cloned(step(torch.compile(module, fullgraph=True), x, "fp8_current"))
    assert graph_breaks() == 0
    assert_bitwise(got, eager)


def test_dynamic_shapes_run_the_kernels_bitwise():
    """One graph with a symbolic sequence length: the kernels get each call's sizes."""
    module = make("layernorm_mlp", normalization="RMSNorm", activation="swiglu").cuda()
    compiled = torch.compile(module, fullgraph=True, dynamic=True)
    for seq in (16, 24, 40):
        x = make_input(seq=seq).cuda()
        assert_bitwise(cloned(step(compiled, x, "bf16")), cloned(step(module, x, "bf16")))
    assert graph_breaks() == 0


@pytest.mark.parametrize("kind", ["rmsnorm", "layernorm_linear"])
def test_cuda_graphs_run_the_kernels_bitwise(kind):
    module, x = make(kind).cuda(), make_input().cuda()
    eager = cloned(step(module, x, "bf16"))
    compiled = torch.compile(module, fullgraph=True, mode="reduce-overhead")
    skips = counters["inductor"]["cudagraph_skips"]
    for _ in range(3):
        got = cloned(step(compiled, x, "bf16"))
        torch.cuda.synchronize()
        assert_bitwise(got, eager)
    assert counters["inductor"]["cudagraph_skips"] == skips


# (dtype, relative tolerance of the difference to the largest reference value): fp32
# differs by summation orders and Triton's rsqrt; bf16 by its rounding of every
# intermediate the two devices round at different points.
TOLERANCES = [(torch.float32, 1e-4), (torch.bfloat16, 3e-2)]


@pytest.mark.parametrize(("dtype", "tolerance"), TOLERANCES)
@pytest.mark.parametrize(("kind", "kwargs"), MODULES, ids=IDS)
def test_cuda_agrees_with_the_cpu_reference(kind, kwargs, dtype, tolerance):
    cpu = make(kind, dtype=dtype, **kwargs)
    cuda = copy.deepcopy(cpu).cuda()
    x = make_input(dtype=dtype)
    ref_out, ref_dx, ref_grads = step(cpu, x, None)
    out, dx, grads = step(cuda, x.cuda(), None)
    pairs = [("output", out, ref_out), ("input grad", dx, ref_dx)]
    pairs += [(f"grad {i}", g, r) for i, (g, r) in enumerate(zip(grads, ref_grads, strict=True))]
    for what, got, ref in pairs:
        scale = ref.float().abs().max().item()
        diff = (got.cpu().float() - ref.float()).abs().max().item()
        assert diff <= tolerance * max(scale, 1e-30), f"{what}: {diff} apart (scale {scale})"


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
@pytest.mark.parametrize("kind", ["rmsnorm", "layernorm_linear", "layernorm_mlp"])
def test_the_kernels_are_what_runs(monkeypatch, kind, backend):
    """Eagerly and in a compiled graph (an op node, or a lowered call's exact pieces),
    the forward and backward kernels run, once each per step."""
    calls = {"forward": 0, "backward": 0}

    def counting(direction: str, fn: typing.Any) -> typing.Any:
        def call(*args: typing.Any) -> typing.Any:
            calls[direction] += 1
            return fn(*args)

        return call

    for direction in calls:
        name = f"fused_norm_{direction}"
        monkeypatch.setattr(norm_kernels, name, counting(direction, getattr(norm_kernels, name)))
    module, x = make(kind).cuda(), make_input().cuda()
    if backend != "eager":
        module = torch.compile(module, fullgraph=True, backend=backend)
    step(module, x, "bf16")  # a compiled first step traces (fake tensors: no kernel)
    before = dict(calls)
    step(module, x, "bf16")
    assert calls["forward"] - before["forward"] == 1
    assert calls["backward"] - before["backward"] == 1
