"""Linear under autograd: repeated backward (retain_graph, create_graph) eager and
compiled, and saved tensors visible to saved-tensor hooks on the eager path."""

from __future__ import annotations

import pytest
import torch
from module_cases import RECIPES, recipe_context

from transformer_engine_ops.modules.linear import Linear

AOT = "aot_eager"


def _layer_and_input(dtype: torch.dtype = torch.float32) -> tuple[Linear, torch.Tensor]:
    torch.manual_seed(0)
    layer = Linear(32, 16, params_dtype=dtype)
    x = torch.randn(8, 32, dtype=dtype, requires_grad=True)
    return layer, x


def _reference(layer: Linear, x: torch.Tensor) -> torch.nn.Linear:
    ref = torch.nn.Linear(32, 16, dtype=x.dtype)
    with torch.no_grad():
        ref.weight.copy_(layer.weight)
        ref.bias.copy_(layer.bias)
    return ref


def _grads(*tensors: torch.Tensor) -> list[torch.Tensor]:
    out = [t.grad.clone() for t in tensors]
    for t in tensors:
        t.grad = None
    return out


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_two_backward_passes_with_retain_graph_match_torch_linear(compiled):
    layer, x = _layer_and_input(torch.float64)
    run = torch.compile(layer, fullgraph=True, backend=AOT) if compiled else layer
    y = run(x)
    y.sum().backward(retain_graph=True)
    (y * y).sum().backward()
    got = _grads(x, layer.weight, layer.bias)

    ref = _reference(layer, x)
    x_ref = x.detach().clone().requires_grad_(True)
    y_ref = ref(x_ref)
    y_ref.sum().backward(retain_graph=True)
    (y_ref * y_ref).sum().backward()
    want = [x_ref.grad, ref.weight.grad, ref.bias.grad]
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)  # our GEMM accumulates in fp32


@pytest.mark.parametrize("recipe", [r for r in RECIPES if r != "bf16"])
def test_quantized_eager_backward_runs_twice_with_the_same_grads(recipe):
    layer = Linear(64, 32, params_dtype=torch.bfloat16)
    x = torch.randn(4, 16, 64, dtype=torch.bfloat16, requires_grad=True)
    with recipe_context(recipe):
        y = layer(x)
    y.sum().backward(retain_graph=True)
    first = _grads(x, layer.weight, layer.bias)
    y.sum().backward()
    second = _grads(x, layer.weight, layer.bias)
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a, b)


def test_eager_double_backward_matches_torch_linear():
    layer, x = _layer_and_input(torch.float64)
    ref = _reference(layer, x)
    x_ref = x.detach().clone().requires_grad_(True)

    def second_order(module: torch.nn.Module, inp: torch.Tensor) -> list[torch.Tensor]:
        y = module(inp)
        (gx,) = torch.autograd.grad((y * y).sum(), inp, create_graph=True)
        return list(torch.autograd.grad(gx.pow(2).sum(), [inp, *module.parameters()]))

    for g, w in zip(second_order(layer, x), second_order(ref, x_ref), strict=True):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)  # our GEMM accumulates in fp32


def test_compiled_create_graph_first_order_grads_match_eager():
    layer, x = _layer_and_input()
    compiled = torch.compile(layer, fullgraph=True, backend=AOT)
    (g_eager,) = torch.autograd.grad(layer(x).pow(2).sum(), x, create_graph=True)
    (g_comp,) = torch.autograd.grad(compiled(x).pow(2).sum(), x, create_graph=True)
    assert torch.equal(g_eager, g_comp)


def test_compiled_double_backward_raises_a_clear_error():
    layer, x = _layer_and_input()
    compiled = torch.compile(layer, fullgraph=True, backend=AOT)
    (gx,) = torch.autograd.grad(compiled(x).pow(2).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="double backward|not implemented|derivative"):
        torch.autograd.grad(gx.sum(), x)


def _saved_bytes(fn) -> int:
    sizes: list[int] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        sizes.append(t.numel() * t.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(sizes)


@pytest.mark.parametrize("recipe", ["bf16", "fp8_current", "mxfp8"])
def test_eager_saved_tensors_are_seen_by_saved_tensor_hooks(recipe):
    layer = Linear(64, 32, params_dtype=torch.bfloat16)
    x = torch.randn(4, 16, 64, dtype=torch.bfloat16, requires_grad=True)

    def run() -> None:
        with recipe_context(recipe if recipe != "bf16" else None):
            layer(x)

    seen = _saved_bytes(run)
    layer = torch.compile(layer, fullgraph=True, backend=AOT)
    seen_compiled = _saved_bytes(run)
    # bf16 keeps the input (wgrad) and the weight (dgrad); the quantized recipes their
    # columnwise quantized copies (one byte an element, plus scales). Eager now saves
    # through save_for_backward like compiled does.
    assert seen >= 4 * 16 * 64 * (2 if recipe == "bf16" else 1)
    assert seen == seen_compiled


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_save_on_cpu_keeps_grads_bitwise(compiled):
    layer = Linear(64, 32, params_dtype=torch.bfloat16)
    run = torch.compile(layer, fullgraph=True, backend=AOT) if compiled else layer
    x = torch.randn(4, 16, 64, dtype=torch.bfloat16, requires_grad=True)
    run(x).sum().backward()
    want = _grads(x, layer.weight, layer.bias)
    with torch.autograd.graph.save_on_cpu():
        y = run(x)
    y.sum().backward()
    for g, w in zip(_grads(x, layer.weight, layer.bias), want, strict=True):
        assert torch.equal(g, w)
