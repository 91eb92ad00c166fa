"""Where stochastic rounding's (seed, offset) pair is drawn: torch's CPU generator for
CPU tensors, the CUDA device's own generator for CUDA tensors (graph-safe, so a
CUDA-graph replay draws afresh), each consumed once per draw, eagerly and compiled."""

from __future__ import annotations

import pytest
import torch

from transformer_engine_ops.quantization.stochastic import draw_rng_state


def _draws(device: str, compiled: bool) -> list[torch.Tensor]:
    x = torch.ones(4, device=device)

    def fn(t: torch.Tensor) -> torch.Tensor:
        return draw_rng_state(t, t.device)

    if compiled:
        fn = torch.compile(fn, fullgraph=True, backend="aot_eager")
    return [fn(x) for _ in range(3)]


def test_a_cpu_draw_consumes_the_cpu_generator_once_eagerly_and_compiled():
    torch.manual_seed(5)
    eager = _draws("cpu", compiled=False)
    after_eager = torch.get_rng_state()
    torch.manual_seed(5)
    compiled = _draws("cpu", compiled=True)
    assert torch.equal(torch.get_rng_state(), after_eager)
    for a, b in zip(eager, compiled, strict=True):
        assert a.dtype == torch.int64 and a.shape == (2,) and a.device.type == "cpu"
        assert torch.equal(a, b)
    assert not torch.equal(eager[0], eager[1])


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_a_cuda_draw_uses_the_device_generator_not_the_cpu_one(compiled):
    cpu_state = torch.get_rng_state()
    torch.cuda.manual_seed(7)
    first = _draws("cuda", compiled)
    cuda_after = torch.cuda.get_rng_state()
    assert torch.equal(torch.get_rng_state(), cpu_state)  # the CPU generator is untouched
    torch.cuda.manual_seed(7)
    again = _draws("cuda", not compiled)  # the other mode consumes the generator alike
    assert torch.equal(torch.cuda.get_rng_state(), cuda_after)
    for a, b in zip(first, again, strict=True):
        assert a.device.type == "cuda" and a.dtype == torch.int64 and a.shape == (2,)
        assert torch.equal(a, b)
    assert not torch.equal(first[0], first[1])


@pytest.mark.gpu
@cuda
def test_a_draw_captured_in_a_cuda_graph_draws_afresh_on_each_replay():
    x = torch.ones(4, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        draw_rng_state(x, x.device)  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        pair = draw_rng_state(x, x.device)
    replays = []
    for _ in range(3):
        graph.replay()
        replays.append(pair.clone())
    torch.cuda.synchronize()
    assert not torch.equal(replays[0], replays[1])
    assert not torch.equal(replays[1], replays[2])


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("use_reentrant", [False, True])
def test_checkpointing_a_cuda_module_redraws_the_same_pair(use_reentrant):
    """``torch.utils.checkpoint`` restores the CUDA generator of its tensor arguments'
    devices before the recomputation, so the recomputed forward draws the same pair and
    the gradients equal those of the plain module (default NVFP4 recipe: stochastic
    rounding of the gradients)."""
    import transformer_engine_ops as te

    torch.manual_seed(0)
    module = te.Linear(64, 64, params_dtype=torch.bfloat16, device="cuda")
    x = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16)

    def step(fn) -> list[torch.Tensor]:
        module.zero_grad(set_to_none=True)
        inp = x.clone().requires_grad_(True)
        torch.cuda.manual_seed(11)
        with te.autocast(recipe=te.recipe.NVFP4BlockScaling()):
            y = fn(inp)
        y.backward(torch.linspace(-2, 3, y.numel(), device="cuda").reshape(y.shape).to(y.dtype))
        return [y.detach(), inp.grad, module.weight.grad, module.bias.grad]

    plain = step(module)
    checkpointed = step(
        lambda t: torch.utils.checkpoint.checkpoint(module, t, use_reentrant=use_reentrant)
    )
    for a, b in zip(plain, checkpointed, strict=True):
        assert torch.equal(a, b)
