"""``create_graph=True`` under a quantized recipe is refused with a clear error instead
of returning a gradient silently detached from the graph."""

from __future__ import annotations

import pytest
import torch
from module_cases import QUANTIZED, RECIPES

from transformer_engine_ops.modules.autocast import autocast
from transformer_engine_ops.modules.linear import Linear


@pytest.mark.parametrize("recipe", QUANTIZED)
def test_create_graph_under_a_quantized_recipe_is_refused_eagerly(recipe):
    model = Linear(64, 64, params_dtype=torch.bfloat16)
    x = torch.randn(32, 64).to(torch.bfloat16).requires_grad_(True)
    with autocast(recipe=RECIPES[recipe]()):
        y = model(x)
    with pytest.raises(RuntimeError, match="create_graph=True .* not supported under a quantized"):
        torch.autograd.grad(y.float().sum(), x, create_graph=True)


@pytest.mark.parametrize("recipe", QUANTIZED)
def test_create_graph_compiled_gives_the_first_gradient_and_refuses_the_second(recipe):
    """Compiled, the op cannot see ``create_graph`` (AOTAutograd runs the traced backward
    with grad mode off and exposes no create_graph flag; ``_current_graph_task_id`` is not
    traceable), so the first call cannot raise. It is still sound: the gradient equals
    the ``create_graph=False`` one, and any attempt to differentiate it raises (torch's
    AOTAutograd refuses double backward), so no wrong second derivative comes back.
    On torch 2.11 the op does see it and refuses the first call with its own error."""
    model = Linear(64, 64, params_dtype=torch.bfloat16)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    x = torch.randn(32, 64).to(torch.bfloat16).requires_grad_(True)

    def first_grad(create_graph):
        with autocast(recipe=RECIPES[recipe]()):
            y = compiled(x)
        return torch.autograd.grad(y.float().sum(), x, create_graph=create_graph)[0]

    if torch.__version__ < (2, 12):
        # torch 2.11's AOTAutograd runs the compiled backward with grad mode on under
        # create_graph, so the op's own check sees it and refuses at once.
        with pytest.raises(RuntimeError, match="create_graph=True .* not supported under a"):
            first_grad(create_graph=True)
        return
    g = first_grad(create_graph=True)
    assert torch.equal(g.detach(), first_grad(create_graph=False))
    with pytest.raises(RuntimeError, match="double backward|does not require grad"):
        g.float().pow(2).sum().backward()
    with pytest.raises(RuntimeError, match="not have been used|does not require grad"):
        torch.autograd.grad(g.float().pow(2).sum(), x)


def test_create_graph_without_a_recipe_still_works():
    model = Linear(8, 8)
    x = torch.randn(4, 8, requires_grad=True)
    (g,) = torch.autograd.grad(model(x).pow(2).sum(), x, create_graph=True)
    assert g.requires_grad
