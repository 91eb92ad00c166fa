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


def _custom_stochastic() -> recipe.CustomRecipe:
    """A CustomRecipe whose output-gradient quantizer is NVFP4 with stochastic rounding
    (FP8 current scaling elsewhere)."""

    def factory(role: object) -> object:
        if role is not None and role.tensor_type == "grad_output":
            return te.NVFP4Quantizer(stochastic_rounding=True)
        return te.Float8CurrentScalingQuantizer()

    return recipe.CustomRecipe(qfactory=factory)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU's answer")
@pytest.mark.parametrize(
    "make_recipe", [recipe.NVFP4BlockScaling, _custom_stochastic], ids=["nvfp4", "custom"]
)
def test_stochastic_rounding_is_not_refused(make_recipe: object) -> None:
    """Its pair is drawn on the CUDA device's generator, which a replay advances (the
    gpu test below): only the missing CUDA device stops the call here."""
    module = te.Linear(32, 32)
    with pytest.raises(RuntimeError, match="CUDA graphs need a CUDA device"):
        te.make_graphed_callables(
            module, (torch.randn(32, 32),), enabled=True, recipe=make_recipe()
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
    [
        None,
        recipe.Float8CurrentScaling,
        recipe.MXFP8BlockScaling,
        recipe.Float8BlockScaling,
        recipe.NVFP4BlockScaling,
        _custom_stochastic,
    ],
    ids=["bf16", "current", "mxfp8", "block", "nvfp4", "custom-stochastic"],
)
def test_graphed_linear_replays_eager_bits(make_recipe: object) -> None:
    """Every replay gives eager's output and gradients for the same generator state:
    with stochastic rounding (NVFP4, the CustomRecipe) each replay draws the pair an
    eager call would draw, never the one captured."""
    torch.manual_seed(0)
    module = te.Linear(128, 128, params_dtype=torch.bfloat16, device="cuda")
    x = torch.randn(128, 128, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    dy = torch.randn(128, 128, dtype=torch.bfloat16, device="cuda")
    fp8 = make_recipe is not None
    graphed = te.make_graphed_callables(
        module,
        (x.detach().clone().requires_grad_(),),
        enabled=fp8,
        recipe=make_recipe and make_recipe(),
    )

    def step(run: object, seed: int) -> tuple[torch.Tensor, ...]:
        torch.cuda.manual_seed(seed)
        out = run(x)
        out.backward(dy)
        grads = (out.detach(), x.grad.clone(), module.weight.grad.clone())
        x.grad = module.weight.grad = module.bias.grad = None
        return grads

    def eager(t: torch.Tensor) -> torch.Tensor:
        with te.autocast(enabled=fp8, recipe=make_recipe and make_recipe()):
            return module(t)

    replays = []
    for seed in range(3):
        expected, got = step(eager, seed), step(graphed, seed)
        for a, b in zip(got, expected, strict=True):
            assert torch.equal(a, b), seed
        replays.append(got[1])
    if make_recipe in (recipe.NVFP4BlockScaling, _custom_stochastic):
        assert not torch.equal(replays[0], replays[1])  # the bits follow the generator
