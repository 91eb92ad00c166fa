"""``Linear(save_original_input=True)``, TE's: the unquantized input is kept for the
backward, which quantizes it again for the weight gradient. The gradients are the bits
of ``save_original_input=False`` in every recipe, eager and compiled; what is kept is
the input itself (no quantized copy); TE's refusals (delayed scaling) and its
``backward_override`` rules hold."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from module_cases import QUANTIZED, RECIPES, assert_bitwise, cloned, graph_breaks, step

import transformer_engine_ops as te
from transformer_engine_ops.modules.linear import _save_original_input_allowed
from transformer_engine_ops.ops.linear import LINEAR, linear_backward, linear_forward
from transformer_engine_ops.quantization import NVFP4Quantizer

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.memory import SavedTensors  # noqa: E402

AOT = "aot_eager"
CUDA = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
DEVICES = [pytest.param("cpu"), pytest.param("cuda", marks=CUDA)]


def _layer(save_original_input: bool, bias: bool = True) -> te.Linear:
    torch.manual_seed(0)
    return te.Linear(
        64, 32, bias=bias, params_dtype=torch.bfloat16, save_original_input=save_original_input
    )


def _input(seed: int = 1) -> torch.Tensor:
    return torch.randn(4, 16, 64, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("recipe", list(RECIPES))
def test_gradients_are_the_bits_of_the_quantized_input_kept(recipe, device):
    x = _input().to(device)
    got = cloned(step(_layer(True).to(device), x, recipe))
    assert_bitwise(got, cloned(step(_layer(False).to(device), x, recipe)))


@pytest.mark.parametrize("recipe", QUANTIZED)
def test_compiled_equals_eager(recipe):
    layer, x = _layer(True), _input()
    eager = step(layer, x, recipe)
    got = step(torch.compile(layer, fullgraph=True, backend=AOT), x, recipe)
    assert graph_breaks() == 0
    assert_bitwise(got, eager)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("recipe", ["fp8_current", "mxfp8"])
def test_compiled_on_inductor_equals_eager(recipe, device):
    layer, x = _layer(True, bias=False).to(device), _input().to(device)
    eager = cloned(step(_layer(False, bias=False).to(device), x, recipe))
    assert_bitwise(cloned(step(torch.compile(layer, fullgraph=True), x, recipe)), eager)


@pytest.mark.parametrize("recipe", ["fp8_current", "nvfp4"])
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_graphs_replay_the_requantization(recipe):
    layer, x = _layer(True).cuda(), _input().cuda()
    eager = cloned(step(_layer(False).cuda(), x, recipe))
    compiled = torch.compile(layer, fullgraph=True, mode="reduce-overhead")
    for _ in range(3):
        assert_bitwise(cloned(step(compiled, x, recipe)), eager)


def _saved(layer: te.Linear, x: torch.Tensor, recipe: str, compiled: bool) -> SavedTensors:
    run = torch.compile(layer, fullgraph=True, backend=AOT) if compiled else layer
    record = SavedTensors()
    with record.hooks(), te.autocast(recipe=RECIPES[recipe]()):
        run(x)
    return record


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("recipe", QUANTIZED)
def test_the_input_itself_is_kept_instead_of_a_quantized_copy(recipe, compiled):
    # The input needs no gradient, so only the weight gradient's input is kept.
    x = _input()
    kept = _saved(_layer(True), x, recipe, compiled)
    plain = _saved(_layer(False), x, recipe, compiled)
    x_ptr = x.untyped_storage().data_ptr()
    # TE's trade: the input itself (its producer holds it anyway), no copy of it...
    assert kept.saved == [(x.numel() * x.element_size(), x_ptr)]
    # ... where without save_original_input a quantized copy (smaller) is kept.
    assert all(ptr != x_ptr for _, ptr in plain.saved)
    assert 0 < sum(n for n, _ in plain.saved) < x.numel() * x.element_size()


def test_without_a_recipe_nothing_changes():
    x = _input()
    record_a, record_b = SavedTensors(), SavedTensors()
    with record_a.hooks():
        a = step(_layer(True), x, "bf16")
    with record_b.hooks():
        b = step(_layer(False), x, "bf16")
    assert_bitwise(a, b)
    assert [n for n, _ in record_a.saved] == [n for n, _ in record_b.saved]


def test_delayed_scaling_is_refused_as_in_te():
    layer, x = _layer(True), _input().requires_grad_(True)
    with te.autocast(recipe=te.recipe.DelayedScaling()):
        with pytest.raises(
            ValueError, match="DelayedScaling recipe is not supported with save_original_input"
        ):
            layer(x)
        with torch.no_grad():  # no backward: nothing is kept, nothing to refuse (TE's test)
            layer(x)


@pytest.mark.parametrize("override", ["high_precision", "dequantized"])
def test_backward_override_decides_what_is_kept_as_in_te(override):
    x = _input()
    recipe = dataclasses.replace(te.recipe.Float8CurrentScaling(), backward_override=override)

    def run(keep: bool) -> tuple[Any, ...]:
        layer, xi = _layer(keep), x.clone().requires_grad_(True)
        with te.autocast(recipe=recipe):
            y = layer(xi)
        y.float().sum().backward()
        return y.detach(), xi.grad, [p.grad for p in layer.parameters()]

    assert_bitwise(run(True), run(False))


def test_a_quantizer_that_cannot_requantize_is_ignored_with_te_s_warning():
    stochastic = NVFP4Quantizer(stochastic_rounding=True)
    with pytest.warns(UserWarning, match="Ignoring save_original_input=True"):
        assert _save_original_input_allowed(stochastic) is False
    assert _save_original_input_allowed(NVFP4Quantizer()) is True


def _op_bundle(**changes: Any) -> Any:
    from transformer_engine_ops.ops.linear import linear_examples

    recipe = te.recipe.Float8CurrentScaling()
    return dataclasses.replace(linear_examples(recipe, torch.device("cpu"))[0], **changes)


def _op_grads(fwd: Any) -> tuple[Any, ...]:
    outputs, saved = linear_forward(fwd)
    bwd = LINEAR.backward_args(fwd, outputs, saved)
    bwd.grad_outputs = [torch.ones_like(outputs[0])]
    return (outputs[0], *linear_backward(bwd))


def test_an_unquantized_backward_reads_the_input_as_the_forward_kept_it():
    """No grad-output quantizer: the kept input is rowwise and dequantized for wgrad;
    the original input is quantized rowwise again in the backward, same bits."""
    base = _op_bundle(grad_output_quantizer=None)
    plain = _op_grads(base)
    original = _op_grads(dataclasses.replace(base, save_original_input=True))
    for a, b in zip(plain, original, strict=True):
        assert torch.equal(a, b)


def test_the_op_refuses_a_stateful_input_quantizer_by_field():
    delayed = te.recipe.DelayedScaling().make_quantizer("input")
    fwd = _op_bundle(input_quantizer=delayed, save_original_input=True)
    with pytest.raises(ValueError, match="LinearFwdArgs.save_original_input"):
        linear_forward(fwd)
