"""Activation checkpointing under ``autocast``: the recompute (run by the backward,
outside the ``autocast`` that wrapped the forward) quantizes with the recipe of the
original forward, so gradients equal the non-checkpointed run, and the checkpointed
model keeps fewer saved bytes."""

from __future__ import annotations

import pytest
import torch
import torch.utils.checkpoint as checkpoint
from module_cases import QUANTIZED, RECIPES

import transformer_engine_ops as te
from transformer_engine_ops.modules.autocast import autocast
from transformer_engine_ops.modules.linear import Linear


def _model(layers: int = 4) -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        *[Linear(64, 64, params_dtype=torch.bfloat16) for _ in range(layers)]
    )


def _grads(model, recipe, x, reentrant, params=None, checkpoint_fn=checkpoint.checkpoint):
    x = x.detach().requires_grad_(True)
    with autocast(recipe=RECIPES[recipe]()):
        if reentrant is None:
            y = model(x)
        else:
            y = checkpoint_fn(model, x, use_reentrant=reentrant)
    y.float().pow(2).sum().backward()  # outside autocast, as usual
    parameters = list((params or model.parameters)())
    grads = [p.grad.clone() for p in parameters] + [x.grad.clone()]
    for p in parameters:
        p.grad = None
    return y.detach(), grads


@pytest.mark.parametrize("reentrant", [True, False])
@pytest.mark.parametrize("recipe", QUANTIZED)
def test_checkpointed_gradients_equal_the_plain_run_bitwise(recipe, reentrant):
    model = _model()
    x = torch.randn(32, 64).to(torch.bfloat16)
    y_ref, ref = _grads(model, recipe, x, None)
    y, got = _grads(model, recipe, x, reentrant)
    assert torch.equal(y, y_ref)
    for a, b in zip(got, ref, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("recipe", QUANTIZED)
def test_checkpoint_inside_a_fullgraph_compiled_region_equals_the_plain_run(recipe):
    """``torch.compile(fullgraph=True)`` over a ``use_reentrant=False`` checkpoint: the
    recompute is part of the compiled backward graph, with the forward's quantizers as
    graph constants, so it quantizes as the forward did (bitwise equal gradients)."""
    model = _model(2)
    x = torch.randn(32, 64).to(torch.bfloat16)
    y_ref, ref = _grads(model, recipe, x, None)
    compiled = torch.compile(
        lambda t: checkpoint.checkpoint(model, t, use_reentrant=False),
        fullgraph=True,
        backend="aot_eager",
    )
    y, got = _grads(compiled, recipe, x, None, params=model.parameters)
    assert torch.equal(y, y_ref)
    for a, b in zip(got, ref, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("reentrant", [True, False])
@pytest.mark.parametrize("recipe", QUANTIZED)
def test_te_checkpoint_of_a_compiled_module_from_eager_code_equals_the_plain_run(recipe, reentrant):
    """``te.checkpoint(torch.compile(model), x)`` with ``autocast`` around the forward
    and the backward outside it: the recompute re-enters the forward's recipe, meets
    the same recipe guard and reuses the forward's graph (bitwise equal gradients)."""
    model = _model(2)
    x = torch.randn(32, 64).to(torch.bfloat16)
    y_ref, ref = _grads(model, recipe, x, None)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    y, got = _grads(
        compiled, recipe, x, reentrant, params=model.parameters, checkpoint_fn=te.checkpoint
    )
    assert torch.equal(y, y_ref)
    for a, b in zip(got, ref, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("reentrant", [True, False])
def test_te_checkpoint_of_an_eager_model_equals_the_plain_run(reentrant):
    model = _model(2)
    x = torch.randn(32, 64).to(torch.bfloat16)
    y_ref, ref = _grads(model, "mxfp8", x, None)
    y, got = _grads(model, "mxfp8", x, reentrant, checkpoint_fn=te.checkpoint)
    assert torch.equal(y, y_ref)
    for a, b in zip(got, ref, strict=True):
        assert torch.equal(a, b)


def test_te_checkpoint_restores_the_callers_recipe_after_each_call():
    from transformer_engine_ops.modules.autocast import STATE

    model = _model(1)
    seen = []

    def run(t):
        seen.append(STATE.autocast)
        return model(t)

    x = torch.randn(4, 64).to(torch.bfloat16).requires_grad_(True)
    with autocast(recipe=RECIPES["fp8_current"]()):
        active = STATE.autocast
        y = te.checkpoint(run, x, use_reentrant=True)
        assert STATE.autocast is active
    y.float().sum().backward()  # outside autocast: the recompute sees the recorded recipe
    assert STATE.autocast is None
    assert seen == [active, active]


def _saved_bytes(model, x, use_checkpoint):
    total = [0]

    def pack(t):
        total[0] += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with autocast(recipe=RECIPES["fp8_current"]()):
            if use_checkpoint:
                y = checkpoint.checkpoint(model, x, use_reentrant=True)
            else:
                y = model(x)
    y.float().sum().backward()
    return total[0]


def test_a_checkpointed_8_layer_model_saves_fewer_bytes():
    model = _model(8)
    x = torch.randn(256, 64).to(torch.bfloat16).requires_grad_(True)
    plain = _saved_bytes(model, x, use_checkpoint=False)
    checkpointed = _saved_bytes(model, x, use_checkpoint=True)
    # Every layer's quantized input and weight vs the region's input alone.
    assert checkpointed * 4 < plain, (checkpointed, plain)
