"""``te.make_graphed_callables``: TE's arguments, a clear error on the CPU, and (on a
GPU) a captured Linear replaying eager's bits under a recipe."""

from __future__ import annotations

import pytest
import torch

import transformer_engine_ops as te
from transformer_engine_ops import recipe


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU's answer")
def test_cpu_raises_naming_cuda() -> None:
    module = te.Linear(32, 32)
    with pytest.raises(RuntimeError, match="CUDA graphs need a CUDA device"):
        te.make_graphed_callables(module, (torch.randn(32, 32),), enabled=True)


def test_unimplemented_arguments_are_named() -> None:
    module = te.Linear(32, 32)
    sample = (torch.randn(32, 32),)
    with pytest.raises(NotImplementedError, match="retain_graph_in_backward, pre_warmup_hook"):
        te.make_graphed_callables(
            module, sample, retain_graph_in_backward=True, pre_warmup_hook=print
        )
    with pytest.raises(NotImplementedError, match="DelayedScaling under CUDA graphs"):
        te.make_graphed_callables(module, sample, enabled=True, recipe=recipe.DelayedScaling())
    with pytest.raises(ValueError, match="pass recipe or fp8_recipe"):
        te.make_graphed_callables(
            module,
            sample,
            fp8_recipe=recipe.Float8CurrentScaling(),
            recipe=recipe.Float8CurrentScaling(),
        )


def test_deprecated_fp8_names_warn() -> None:
    module = te.Linear(32, 32)
    with pytest.warns(DeprecationWarning, match="fp8_enabled is deprecated"):
        try:
            te.make_graphed_callables(module, (torch.randn(32, 32),), fp8_enabled=True)
        except RuntimeError:
            assert not torch.cuda.is_available()


@pytest.mark.gpu
@pytest.mark.parametrize(
    "make_recipe",
    [None, recipe.Float8CurrentScaling, recipe.MXFP8BlockScaling, recipe.Float8BlockScaling],
    ids=["bf16", "current", "mxfp8", "block"],
)
def test_graphed_linear_replays_eager_bits(make_recipe: object) -> None:
    torch.manual_seed(0)
    module = te.Linear(128, 128, params_dtype=torch.bfloat16, device="cuda")
    x = torch.randn(128, 128, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    fp8 = make_recipe is not None
    graphed = te.make_graphed_callables(
        module,
        (x.detach().clone().requires_grad_(),),
        enabled=fp8,
        recipe=make_recipe and make_recipe(),
    )
    with te.autocast(enabled=fp8, recipe=make_recipe and make_recipe()):
        expected = module(x)
    expected.float().sum().backward()
    expected_grads = (x.grad.clone(), module.weight.grad.clone())
    x.grad = None
    module.weight.grad = None
    module.bias.grad = None
    got = graphed(x)
    got.float().sum().backward()
    assert torch.equal(got, expected)
    assert torch.equal(x.grad, expected_grads[0])
    assert torch.equal(module.weight.grad, expected_grads[1])
