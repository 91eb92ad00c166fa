"""Recipes are mutable, as TE's are: a field changed in place between two ``te.autocast``
entries takes effect at the next entry, eagerly and compiled (a recompile, never a
stale graph), exactly as a freshly constructed recipe of those values would; nothing
made before the change (memoized quantizers, a module's delayed-scaling state) changes
with it."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

import transformer_engine_ops as te
from transformer_engine_ops.modules.autocast import STATE, RecipeQuantizers
from transformer_engine_ops.quantization.recipes import ROLES
from transformer_engine_ops.recipe import (
    DelayedScaling,
    Float8BlockScaling,
    Float8CurrentScaling,
    MXFP8BlockScaling,
    NVFP4BlockScaling,
    QParams,
)

autocast_module = importlib.import_module("transformer_engine_ops.modules.autocast")
DTYPE = torch.bfloat16


def _nvfp4() -> NVFP4BlockScaling:
    return NVFP4BlockScaling(disable_rht=True, disable_stochastic_rounding=True)


def _set_weight_qparams(r: NVFP4BlockScaling) -> None:
    r.fp4_quant_fwd_weight = QParams()


def _set_weight_qparams_field(r: NVFP4BlockScaling) -> None:
    r.fp4_quant_fwd_weight.fp4_2d_quantization = False


def _set(name: str, value: Any) -> Callable[[Any], None]:
    return lambda r: setattr(r, name, value)


# id -> (the recipe before, the change made in place, the same values constructed afresh)
CASES: dict[str, tuple[Callable[[], Any], Callable[[Any], None], Callable[[], Any]]] = {
    "fp8_current-pow2": (
        Float8CurrentScaling,
        _set("use_power_2_scales", True),
        lambda: Float8CurrentScaling(use_power_2_scales=True),
    ),
    "fp8_current-epsilon": (
        Float8CurrentScaling,
        _set("amax_epsilon", 0.5),
        lambda: Float8CurrentScaling(amax_epsilon=0.5),
    ),
    "fp8_block-f32_scales": (
        Float8BlockScaling,
        _set("use_f32_scales", True),
        lambda: Float8BlockScaling(use_f32_scales=True),
    ),
    "mxfp8-2d": (
        MXFP8BlockScaling,
        _set("enable_2d_quantization", True),
        lambda: MXFP8BlockScaling(enable_2d_quantization=True),
    ),
    "nvfp4-qparams_replaced": (
        _nvfp4,
        _set_weight_qparams,
        lambda: NVFP4BlockScaling(
            disable_rht=True, disable_stochastic_rounding=True, disable_2d_quantization=True
        ),
    ),
    "nvfp4-qparams_field": (
        _nvfp4,
        _set_weight_qparams_field,
        lambda: NVFP4BlockScaling(
            disable_rht=True, disable_stochastic_rounding=True, disable_2d_quantization=True
        ),
    ),
}


@pytest.fixture(autouse=True)
def empty_memo():
    autocast_module._MEMO.clear()
    yield
    autocast_module._MEMO.clear()


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        te.Linear(64, 64, params_dtype=DTYPE), te.Linear(64, 32, params_dtype=DTYPE)
    )
    with torch.no_grad():  # rows of other magnitudes, so 2-D tiles and 1-D blocks differ
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(torch.logspace(-2, 1, p.shape[0])[:, None].to(p.dtype))
    return model


def make_input() -> torch.Tensor:
    gen = torch.Generator().manual_seed(1)
    return (torch.randn(32, 64, generator=gen) * 3.3).to(DTYPE)


def under(recipe: Any, model: torch.nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    def fn(x: torch.Tensor) -> torch.Tensor:
        with te.autocast(recipe=recipe):
            return model(x)

    return fn


def run(fn: Callable[[torch.Tensor], torch.Tensor], model: torch.nn.Module, x: torch.Tensor):
    """Output, input grad and parameter grads of one step."""
    for p in model.parameters():
        p.grad = None
    x = x.detach().clone().requires_grad_(True)
    y = fn(x)
    y.float().pow(2).sum().backward()
    return [y.detach(), x.grad, *[p.grad for p in model.parameters()]]


def assert_bitwise(got: list[Any], expected: list[Any]) -> None:
    assert len(got) == len(expected)
    for i, (a, b) in enumerate(zip(got, expected, strict=True)):
        assert torch.equal(a, b), f"entry {i} differs"


def codes(made: RecipeQuantizers) -> list[Any]:
    return [getattr(made, role)._teops_code for role in ROLES]


@pytest.mark.parametrize("case", list(CASES))
def test_a_recipe_changed_in_place_acts_as_a_fresh_one_eagerly(case):
    before, change, fresh = CASES[case]
    model, x = make_model(), make_input()
    recipe = before()
    with te.autocast(recipe=recipe):
        old = STATE.autocast
    first = run(under(recipe, model), model, x)
    change(recipe)
    with te.autocast(recipe=recipe):
        new = STATE.autocast
    assert codes(new) != codes(old)  # the change reached the quantizers
    assert codes(new) == codes(RecipeQuantizers.from_recipe(fresh()))
    assert codes(old) == codes(RecipeQuantizers.from_recipe(before()))  # untouched
    assert old.recipe == before()  # a snapshot, not the object changed since
    assert new.recipe == recipe and new.recipe is not recipe
    assert_bitwise(run(under(recipe, model), model, x), run(under(fresh(), model), model, x))
    assert_bitwise(run(under(before(), model), model, x), first)


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_a_recipe_changed_in_place_recompiles(case):
    before, change, fresh = CASES[case]
    model, x = make_model(), make_input()
    recipe = before()
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(under(recipe, model), fullgraph=True, backend=counter)
    assert_bitwise(run(compiled, model, x), run(under(before(), model), model, x))
    assert counter.frame_count == 1
    change(recipe)
    assert_bitwise(run(compiled, model, x), run(under(fresh(), model), model, x))
    # A stale graph would have been reused silently. (A float field that changed is
    # traced twice: Dynamo first makes it dynamic, and recipe_key specializes it.)
    recompiled = counter.frame_count
    assert recompiled > 1
    run(compiled, model, x)
    assert counter.frame_count == recompiled  # unchanged since: the graph is reused


@pytest.mark.slow
def test_the_seed_recipes_changed_after_construction_compile_bitwise_equal_to_eager():
    """TE's compile tests set ``fp4_quant_*`` after construction (4over6 and row-scaled
    variants); a compiled call follows each value the recipe holds at the call."""
    model, x = make_model(), make_input()
    recipe = NVFP4BlockScaling(disable_rht=True, disable_stochastic_rounding=True)
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(under(recipe, model), fullgraph=True, backend=counter)
    steps = [
        lambda r: setattr(r, "nvfp4_4over6", "all"),
        lambda r: setattr(r, "fp4_quant_fwd_weight", QParams()),
        lambda r: setattr(r, "row_scaled_activation", True),
    ]
    for change in [lambda r: None, *steps]:
        change(recipe)
        fresh = NVFP4BlockScaling(
            disable_rht=True,
            disable_stochastic_rounding=True,
            disable_2d_quantization=not recipe.fp4_quant_fwd_weight.fp4_2d_quantization,
            nvfp4_4over6=recipe.nvfp4_4over6,
            row_scaled_activation=recipe.row_scaled_activation,
        )
        assert_bitwise(run(compiled, model, x), run(under(fresh, model), model, x))
    assert counter.frame_count == 1 + len(steps)


def test_delayed_scaling_changed_in_place_rebuilds_the_module_state():
    """A module's delayed-scaling state is rebuilt when the recipe's value changes (here
    its margin), keeping the amax history, as with a new recipe of that value."""
    x = make_input()
    changed, fresh_model = make_model(), make_model()
    recipe = DelayedScaling(amax_history_len=4)
    for _ in range(2):
        run(under(recipe, changed), changed, x)
        run(under(DelayedScaling(amax_history_len=4), fresh_model), fresh_model, x)
    recipe.margin = 3
    for _ in range(2):  # the first step uses the kept scales, which the margin then updates
        got = run(under(recipe, changed), changed, x)
        margin_3 = DelayedScaling(amax_history_len=4, margin=3)
        assert_bitwise(got, run(under(margin_3, fresh_model), fresh_model, x))
    unchanged = make_model()
    for _ in range(4):
        plain = run(under(DelayedScaling(amax_history_len=4), unchanged), unchanged, x)
    assert not torch.equal(plain[0], got[0])  # the margin changed the scales


def test_quantizers_made_before_a_change_keep_their_recipe():
    recipe = Float8CurrentScaling()
    made = RecipeQuantizers.from_recipe(recipe)
    assert made.recipe is not recipe  # a snapshot
    recipe.use_power_2_scales = True
    assert made.recipe == Float8CurrentScaling()
    assert RecipeQuantizers.from_recipe(Float8CurrentScaling()) is made


@pytest.mark.parametrize(
    "recipe, change, error, match",
    [
        (
            Float8CurrentScaling,
            _set("fp8_format", "E4M3"),
            TypeError,
            r"Float8CurrentScaling: fp8_format must be a Format, got 'E4M3'",
        ),
        (
            DelayedScaling,
            _set("amax_history_len", 0),
            ValueError,
            r"DelayedScaling: amax_history_len",
        ),
        (
            _nvfp4,
            _set("fp4_quant_fwd_inp", "none"),
            TypeError,
            r"NVFP4BlockScaling\.fp4_quant_fwd_inp must be a QParams, got 'none'",
        ),
        (
            _nvfp4,
            lambda r: setattr(r.fp4_quant_bwd_grad, "stochastic_rounding", 1),
            TypeError,
            r"NVFP4BlockScaling\.fp4_quant_bwd_grad: QParams: stochastic_rounding must be a bool",
        ),
        (
            lambda: NVFP4BlockScaling(disable_rht=True, row_scaled_activation=True),
            _set("fp4_quant_fwd_inp", QParams(random_hadamard_transform=True)),
            ValueError,
            r"row_scaled_activation=True with the random Hadamard transform of the input",
        ),
    ],
)
def test_a_bad_value_assigned_is_refused_at_the_next_autocast_naming_the_field(
    recipe, change, error, match
):
    made = recipe()
    with te.autocast(recipe=made):
        pass
    change(made)
    with pytest.raises(error, match=match):
        with te.autocast(recipe=made):
            pass
