"""``autocast`` entered every step shares the quantizers of an equal stateless recipe
(``RecipeQuantizers.from_recipe``'s memo) and never those of a stateful one."""

from __future__ import annotations

import dataclasses
import importlib

import pytest
import torch
from module_cases import make_input, make_mlp, step, unique_graphs

from transformer_engine_ops.modules.autocast import STATE, RecipeQuantizers, autocast
from transformer_engine_ops.quantization import (
    DelayedScaling,
    Float8BlockScaling,
    Float8CurrentScaling,
    MXFP8BlockScaling,
    NVFP4BlockScaling,
)
from transformer_engine_ops.quantization.recipes import ROLES, Recipe

# The module (the package re-exports its ``autocast`` function under the same name).
autocast_module = importlib.import_module("transformer_engine_ops.modules.autocast")
AOT = "aot_eager"
STATELESS = [
    Float8CurrentScaling,
    MXFP8BlockScaling,
    Float8BlockScaling,
    lambda: NVFP4BlockScaling(disable_rht=True, disable_stochastic_rounding=True),
]


@pytest.fixture(autouse=True)
def empty_memo():
    autocast_module._MEMO.clear()
    yield
    autocast_module._MEMO.clear()


def quantizers(made: RecipeQuantizers) -> list:
    return [getattr(made, role) for role in ROLES]


@pytest.mark.parametrize("factory", STATELESS)
def test_an_equal_recipe_gets_the_same_quantizers(factory):
    first = RecipeQuantizers.from_recipe(factory())
    again = RecipeQuantizers.from_recipe(factory())  # a new, equal recipe object
    assert again is first
    assert first.compile_blocker is None


def test_autocast_entered_again_shares_the_quantizers():
    seen = []
    for _ in range(3):
        with autocast(recipe=Float8CurrentScaling()):
            seen.append(STATE.autocast)
    assert seen[0] is seen[1] is seen[2]


def test_a_changed_recipe_gets_other_quantizers():
    plain = RecipeQuantizers.from_recipe(Float8CurrentScaling())
    pow2 = RecipeQuantizers.from_recipe(Float8CurrentScaling(use_power_2_scales=True))
    assert pow2 is not plain
    assert pow2.recipe == Float8CurrentScaling(use_power_2_scales=True)
    for a, b in zip(quantizers(plain), quantizers(pow2), strict=True):
        assert a != b
        assert a._teops_code != b._teops_code  # what a compiled graph guards on
    assert RecipeQuantizers.from_recipe(Float8CurrentScaling()) is plain


def test_a_negative_zero_field_is_not_taken_for_positive_zero():
    """-0.0 == 0.0, so the recipes are equal, but their quantizers encode (and guard)
    differently: the memo must not hand one the other's quantizers."""
    positive = RecipeQuantizers.from_recipe(Float8CurrentScaling(amax_epsilon=0.0))
    negative = RecipeQuantizers.from_recipe(Float8CurrentScaling(amax_epsilon=-0.0))
    assert negative is not positive
    assert (
        negative.input._teops_code
        == Float8CurrentScaling(amax_epsilon=-0.0).make_quantizer("input")._teops_code
    )


def test_delayed_scaling_quantizers_are_never_shared():
    recipe = DelayedScaling()
    first = RecipeQuantizers.from_recipe(recipe)
    again = RecipeQuantizers.from_recipe(recipe)
    assert first.compile_blocker is not None  # stateful: keeps an amax history
    assert again is not first
    for a, b in zip(quantizers(first), quantizers(again), strict=True):
        assert a is not b
        assert a._state is not b._state
    assert autocast_module._MEMO == {}


@dataclasses.dataclass
class _TaggedRecipe(Float8CurrentScaling):
    tags: list = dataclasses.field(default_factory=list)  # unhashable field value


class _MutableRecipe(Recipe):  # not a dataclass: may change after use
    def __init__(self) -> None:
        self.inner = Float8CurrentScaling()

    def make_quantizer(self, role):
        return self.inner.make_quantizer(role)


@pytest.mark.parametrize("factory", [lambda: _TaggedRecipe(tags=[1]), _MutableRecipe])
def test_an_unhashable_or_mutable_recipe_is_made_afresh_each_time(factory):
    recipe = factory()
    first = RecipeQuantizers.from_recipe(recipe)
    again = RecipeQuantizers.from_recipe(recipe)
    assert again is not first
    assert quantizers(again) == quantizers(first)
    assert autocast_module._MEMO == {}


def test_the_memo_keeps_the_most_recently_used_recipes_only():
    size = autocast_module._MEMO_SIZE
    recipes = [Float8CurrentScaling(amax_epsilon=float(i)) for i in range(size + 1)]
    made = [RecipeQuantizers.from_recipe(r) for r in recipes[:size]]
    assert RecipeQuantizers.from_recipe(recipes[0]) is made[0]  # now the most recent
    RecipeQuantizers.from_recipe(recipes[size])  # evicts the least recent: recipes[1]
    assert len(autocast_module._MEMO) == size
    assert RecipeQuantizers.from_recipe(recipes[0]) is made[0]
    assert RecipeQuantizers.from_recipe(recipes[1]) is not made[1]


def test_the_same_recipe_re_entered_compiles_once_and_a_changed_one_recompiles():
    model, x = make_mlp(), make_input()
    compiled = torch.compile(model, fullgraph=True, backend=AOT)
    for _ in range(3):
        step(compiled, x, "fp8_current")  # memoized: the same quantizer objects
    assert unique_graphs() == 1
    autocast_module._MEMO.clear()
    step(compiled, x, "fp8_current")  # equal but new quantizer objects: guards on values
    assert unique_graphs() == 1
    with autocast(recipe=Float8CurrentScaling(use_power_2_scales=True)):
        step(compiled, x, None)
    assert unique_graphs() == 2
    step(compiled, x, "fp8_current")
    assert unique_graphs() == 2
