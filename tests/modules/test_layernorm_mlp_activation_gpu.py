"""LayerNormMLP's fused activation kernels on CUDA (``kernels/activation_kernels.py``): for
every activation, eager and compiled (aot_eager, Inductor, CUDA graphs) run the same
kernel, so they are bitwise equal; the CUDA module agrees with the CPU reference within
rounding; and the kernels are what actually runs, eagerly and in a compiled graph.

Run on a GPU machine with ``pytest -m gpu tests/modules/test_layernorm_mlp_activation_gpu.py``.
"""

from __future__ import annotations

import copy
import typing

import pytest
import torch
from family_cases import make, make_input
from module_cases import assert_bitwise, cloned, graph_breaks, step
from torch._dynamo.utils import counters

from transformer_engine_ops.kernels import activation_kernels
from transformer_engine_ops.ops.layernorm_mlp import Activation

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

ACTIVATIONS = typing.get_args(Activation)
# clamped_swiglu with limits the random inputs cross (TE's default 7 hardly clamps).
PARAMS = {"clamped_swiglu": {"limit": 0.75, "alpha": 1.25, "glu_linear_offset": 0.5}}


def _module(activation: str, dtype: torch.dtype = torch.bfloat16) -> torch.nn.Module:
    params = PARAMS.get(activation)
    kwargs = {"activation_params": params} if params else {}
    return make("layernorm_mlp", activation=activation, dtype=dtype, **kwargs)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_compiled_equals_eager_bitwise_on_cuda(activation, backend):
    module, x = _module(activation).cuda(), make_input().cuda()
    eager = cloned(step(module, x, "bf16"))
    got = cloned(step(torch.compile(module, fullgraph=True, backend=backend), x, "bf16"))
    assert graph_breaks() == 0
    assert_bitwise(got, eager)


@pytest.mark.parametrize("activation", ["swiglu", "gelu", "clamped_swiglu"])
def test_fp8_current_scaling_runs_the_kernels_bitwise(activation):
    """Under FP8 current scaling (lowered on CUDA: the quantize and the activation each
    recorded as an op running eager's kernel) the activation output feeds fc2's quantize."""
    module, x = _module(activation).cuda(), make_input().cuda()
    eager = cloned(step(module, x, "fp8_current"))
    got = cloned(step(torch.compile(module, fullgraph=True), x, "fp8_current"))
    assert graph_breaks() == 0
    assert_bitwise(got, eager)


def test_dynamic_shapes_run_the_kernels_bitwise():
    """One graph with a symbolic sequence length: the kernels get each call's sizes."""
    module = _module("swiglu").cuda()
    compiled = torch.compile(module, fullgraph=True, dynamic=True)
    for seq in (16, 24, 40):
        x = make_input(seq=seq).cuda()
        assert_bitwise(cloned(step(compiled, x, "bf16")), cloned(step(module, x, "bf16")))
    assert graph_breaks() == 0


@pytest.mark.parametrize("activation", ["swiglu", "gelu"])
def test_cuda_graphs_run_the_kernels_bitwise(activation):
    module, x = _module(activation).cuda(), make_input().cuda()
    eager = cloned(step(module, x, "bf16"))
    compiled = torch.compile(module, fullgraph=True, mode="reduce-overhead")
    skips = counters["inductor"]["cudagraph_skips"]
    for _ in range(3):
        got = cloned(step(compiled, x, "bf16"))
        torch.cuda.synchronize()
        assert_bitwise(got, eager)
    assert counters["inductor"]["cudagraph_skips"] == skips


# (dtype, relative tolerance of the difference to the largest reference value): fp32
# differs by the GEMMs' summation order and the kernels' exp; bf16 by its rounding of
# every intermediate the two devices round at different points.
TOLERANCES = [(torch.float32, 1e-4), (torch.bfloat16, 3e-2)]


@pytest.mark.parametrize(("dtype", "tolerance"), TOLERANCES)
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_cuda_agrees_with_the_cpu_reference(activation, dtype, tolerance):
    cpu = _module(activation, dtype)
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
def test_the_kernels_are_what_runs(monkeypatch, backend):
    """Eagerly and in a compiled graph (an op node, or a lowered call's exact pieces),
    the forward and backward kernels run, once each per step."""
    calls = {"forward": 0, "backward": 0}

    def counting(kind: str, fn: typing.Any) -> typing.Any:
        def call(*args: typing.Any) -> typing.Any:
            calls[kind] += 1
            return fn(*args)

        return call

    for kind in calls:
        name = f"fused_activation_{kind}"
        monkeypatch.setattr(
            activation_kernels, name, counting(kind, getattr(activation_kernels, name))
        )
    module, x = _module("swiglu").cuda(), make_input().cuda()
    if backend != "eager":
        module = torch.compile(module, fullgraph=True, backend=backend)
    step(module, x, "bf16")  # a compiled first step traces (fake tensors: no kernel)
    before = dict(calls)
    step(module, x, "bf16")
    assert calls["forward"] - before["forward"] == 1
    assert calls["backward"] - before["backward"] == 1
