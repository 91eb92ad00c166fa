"""TE's ``custom_recipes.quantizer_factories`` and what their answers need: each
factory under ``CustomRecipe`` gives the bits of the built-in recipe it is named after;
``DelayedScalingRequest`` slots are answered by each module's own delayed-scaling
state; ``IdentityQuantizer`` slots stay in high precision."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import transformer_engine_ops as te
from transformer_engine_ops.custom_recipes.quantizer_factories import (
    current_scaling_factory,
    delayed_scaling_factory,
    float8_block_scaling_factory,
    high_precision_factory,
    mxfp8_factory,
    nvfp4_factory,
)
from transformer_engine_ops.recipe import (
    CustomRecipe,
    DelayedScaling,
    Float8BlockScaling,
    Float8CurrentScaling,
    Format,
    MXFP8BlockScaling,
    NVFP4BlockScaling,
    QuantizerRole,
)


def _pair(kind: str = "Linear") -> tuple[torch.nn.Module, torch.nn.Module]:
    torch.manual_seed(0)
    make = {
        "Linear": lambda: te.Linear(128, 128, params_dtype=torch.bfloat16, bias=False),
        "LayerNormMLP": lambda: te.LayerNormMLP(128, 128, params_dtype=torch.bfloat16),
        "GroupedLinear": lambda: te.GroupedLinear(2, 128, 128, params_dtype=torch.bfloat16),
    }[kind]
    ref, custom = make(), make()
    custom.load_state_dict(ref.state_dict())
    return ref, custom


def _steps(module: Any, recipe: Any, steps: int = 1) -> list[torch.Tensor]:
    """Output, input gradient and every parameter gradient of each step."""
    gen = torch.Generator().manual_seed(1)
    got = []
    for _ in range(steps):
        x = torch.randn(64, 128, generator=gen).bfloat16().requires_grad_(True)
        for p in module.parameters():
            p.grad = None
        with te.autocast(enabled=recipe is not None, recipe=recipe):
            y = module(x, [32, 32]) if isinstance(module, te.GroupedLinear) else module(x)
        y.float().sum().backward()
        got += [y.detach(), x.grad, *(p.grad for p in module.parameters())]
    return got


def _assert_equal(a: list[torch.Tensor], b: list[torch.Tensor]) -> None:
    assert len(a) == len(b)
    for i, (u, v) in enumerate(zip(a, b, strict=True)):
        assert torch.equal(u, v), f"tensor {i} differs"


@pytest.mark.parametrize(
    ("factory", "builtin"),
    [
        (current_scaling_factory, Float8CurrentScaling()),
        (mxfp8_factory, MXFP8BlockScaling()),
        (float8_block_scaling_factory, Float8BlockScaling()),
        (nvfp4_factory, NVFP4BlockScaling()),
    ],
    ids=["current", "mxfp8", "block", "nvfp4"],
)
@pytest.mark.parametrize("kind", ["Linear", "GroupedLinear"])
def test_a_factory_gives_its_built_in_recipe_s_bits(factory, builtin, kind):
    ref, custom = _pair(kind)
    torch.manual_seed(5)  # stochastic rounding draws from the default generator
    expected = _steps(ref, builtin)
    torch.manual_seed(5)
    _assert_equal(_steps(custom, CustomRecipe(qfactory=factory)), expected)


@pytest.mark.parametrize("kind", ["Linear", "LayerNormMLP", "GroupedLinear"])
def test_the_delayed_scaling_factory_gives_delayed_scaling_s_bits_and_state(kind):
    ref, custom = _pair(kind)
    expected = _steps(ref, DelayedScaling(), steps=3)
    _assert_equal(_steps(custom, CustomRecipe(qfactory=delayed_scaling_factory), steps=3), expected)
    ref_state, state = ref.state_dict()["_extra_state"], custom.state_dict()["_extra_state"]
    for key in ("scale_fwd", "amax_history_fwd", "scale_bwd", "amax_history_bwd"):
        assert torch.equal(state[key], ref_state[key]), key


def test_the_high_precision_factory_gives_the_unquantized_bits():
    ref, custom = _pair()
    _assert_equal(_steps(custom, CustomRecipe(qfactory=high_precision_factory)), _steps(ref, None))


def test_delayed_scaling_slots_mix_with_stateless_ones():
    """TE's mixed factory: the weight under delayed scaling, the rest current scaling."""

    def mixed(role: QuantizerRole | None) -> Any:
        if role is not None and role.tensor_type == "weight":
            return te.DelayedScalingRequest()
        return current_scaling_factory(role)

    _, custom = _pair()
    _steps(custom, CustomRecipe(qfactory=mixed), steps=2)
    state = custom.state_dict()["_extra_state"]
    assert float(state["scale_fwd"][1]) != 1.0  # the weight's scale was updated
    assert torch.equal(state["scale_fwd"][0::2], torch.ones(2))  # no input/output state


def test_unequal_delayed_scaling_requests_of_one_gemm_are_refused():
    def unequal(role: QuantizerRole | None) -> Any:
        length = 16 if role is not None and role.tensor_type == "weight" else 1024
        return te.DelayedScalingRequest(amax_history_len=length)

    _, custom = _pair()
    with pytest.raises(ValueError, match="DelayedScalingRequests .* must be equal"):
        _steps(custom, CustomRecipe(qfactory=unequal))


def test_a_request_is_checked_as_delayed_scaling_is():
    with pytest.raises(ValueError, match="fp8_format must be one of"):
        te.DelayedScalingRequest(fp8_format=Format.E5M2)
    assert te.DelayedScalingRequest(margin=2).recipe() == DelayedScaling(margin=2)


def test_quantized_model_init_under_the_delayed_scaling_factory_seeds_the_weight_state():
    with te.quantized_model_init(recipe=CustomRecipe(qfactory=delayed_scaling_factory)):
        module = te.Linear(64, 64)
    assert isinstance(module.weight, te.Float8Tensor)
    quantizer = module.weight.quantizer
    assert quantizer.owns_state and float(quantizer.scale) != 1.0  # seeded from the weight
    with te.autocast(recipe=CustomRecipe(qfactory=delayed_scaling_factory)):
        module(torch.randn(8, 64))


def test_quantized_model_init_under_the_high_precision_factory_keeps_plain_weights():
    with te.quantized_model_init(recipe=CustomRecipe(qfactory=high_precision_factory)):
        module = te.Linear(64, 64)
    assert type(module.weight) is torch.nn.Parameter


def test_a_request_slot_runs_eagerly_under_compile_and_fullgraph_names_it():
    recipe = CustomRecipe(qfactory=delayed_scaling_factory)
    _, custom = _pair()
    compiled = torch.compile(custom, fullgraph=True, backend="aot_eager")
    with pytest.raises(Exception, match="QuantizerRequest"):
        _steps(compiled, recipe)
    ref, custom = _pair()
    relaxed = torch.compile(custom, backend="aot_eager")
    _assert_equal(_steps(relaxed, recipe, steps=2), _steps(ref, recipe, steps=2))


def test_identity_quantizer_passes_its_tensor_through():
    x = torch.randn(4, 8)
    assert te.IdentityQuantizer()(x) is x
    assert te.IdentityQuantizer(dtype=torch.bfloat16).quantize(x).dtype == torch.bfloat16
    with pytest.raises(TypeError, match="dtype must be a float dtype"):
        te.IdentityQuantizer(dtype=torch.int8)


def test_the_names_are_te_s():
    for name in ("DelayedScalingRequest", "QuantizerRequest", "IdentityQuantizer"):
        assert name in te.__all__ and getattr(te, name) is not None
    assert issubclass(te.DelayedScalingRequest, te.QuantizerRequest)
    assert te.custom_recipes.quantizer_factories.nvfp4_factory is nvfp4_factory
