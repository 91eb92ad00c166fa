"""``te.autocast`` entered inside the compiled function, as TE users write it: every
module of the Linear family under every recipe compiles without a graph break and equals
eager bit for bit; nesting costs nothing; the graph is guarded on the recipe's value;
per-thread state stays per thread; eager code after a graph break inside the region sees
the recipe; delayed scaling is refused naming it; torch.func transforms are refused."""

from __future__ import annotations

import copy
import dataclasses
import warnings
from typing import Any

import pytest
import torch
from module_cases import RECIPES, graph_breaks, run_in_threads, unique_graphs
from torch._dynamo.testing import CompileCounter

import transformer_engine_ops as te
from transformer_engine_ops.modules.autocast import STATE
from transformer_engine_ops.quantization import DelayedScaling, Float8CurrentScaling
from transformer_engine_ops.runtime.fallback import EagerFallbackWarning

AOT = "aot_eager"
MODULES = ["linear", "layernorm_linear", "layernorm_mlp", "grouped_linear"]
RECIPE_NAMES = [name for name, factory in RECIPES.items() if factory is not None]
SPLITS = [32, 0, 96]


def make(kind: str, seed: int = 0) -> torch.nn.Module:
    """A bf16 module of ``kind`` with seeded, non-trivial parameters."""
    torch.manual_seed(seed)
    dtype = torch.bfloat16
    if kind == "linear":
        module = te.Linear(64, 32, params_dtype=dtype)
    elif kind == "layernorm_linear":
        module = te.LayerNormLinear(64, 32, params_dtype=dtype)
    elif kind == "layernorm_mlp":
        module = te.LayerNormMLP(64, 128, params_dtype=dtype)
    elif kind == "grouped_linear":
        module = te.GroupedLinear(3, 64, 32, params_dtype=dtype)
    else:
        raise ValueError(kind)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_((torch.randn(p.shape, generator=gen) * 0.1).to(p.dtype))
    return module


def call(module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    if isinstance(module, te.GroupedLinear):
        return module(x, SPLITS)
    return module(x)


def make_input(seed: int = 1) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(128, 64, generator=gen).to(torch.bfloat16)


def run(fn: Any, module: torch.nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    """One forward and backward of ``fn(x)``: output, input grad, every parameter grad."""
    module.zero_grad(set_to_none=True)
    x = x.detach().clone().requires_grad_(True)
    y = fn(x)
    y.float().square().sum().backward()
    return [y.detach(), x.grad, *[p.grad for p in module.parameters()]]


def assert_bitwise(got: list[torch.Tensor], expected: list[torch.Tensor]) -> None:
    assert len(got) == len(expected)
    for i, (a, b) in enumerate(zip(got, expected, strict=True)):
        assert a is not None and b is not None, f"entry {i} has no value"
        assert torch.equal(a, b), f"entry {i} differs"


def under(recipe: Any, module: torch.nn.Module) -> Any:
    def fn(x: torch.Tensor) -> torch.Tensor:
        with te.autocast(recipe=recipe):
            return call(module, x)

    return fn


@pytest.mark.slow
@pytest.mark.parametrize("recipe", RECIPE_NAMES)
@pytest.mark.parametrize("kind", MODULES)
def test_autocast_inside_compiles_without_graph_break_bitwise_equal_to_eager(kind, recipe):
    module, x = make(kind), make_input()
    fn = under(RECIPES[recipe](), module)
    counter = CompileCounter()
    compiled = torch.compile(fn, fullgraph=True, backend=counter)
    expected = run(fn, module, x)
    for _ in range(2):  # the second call reuses the graph
        assert_bitwise(run(compiled, module, x), expected)
    assert counter.frame_count == 1
    assert graph_breaks() == 0
    assert STATE.autocast_cell == [None]


@pytest.mark.slow
@pytest.mark.parametrize("kind", MODULES)
def test_autocast_inside_compiles_on_inductor_bitwise_equal_to_eager(kind):
    module, x = make(kind), make_input()
    fn = under(RECIPES["mxfp8"](), module)
    compiled = torch.compile(fn, fullgraph=True, backend="inductor")
    assert_bitwise(run(compiled, module, x), run(fn, module, x))
    assert graph_breaks() == 0


def test_nested_autocasts_cost_no_graph_break_and_each_layer_uses_its_recipe():
    first, second = make("linear", seed=0), make("layernorm_linear", seed=1)
    outer, inner, after = (
        RECIPES["fp8_current"](),
        RECIPES["mxfp8"](),
        RECIPES["fp8_block"](),
    )
    third = make("linear", seed=2)
    third_in = torch.nn.Linear(32, 64, dtype=torch.bfloat16)  # back to 64 features

    def fn(x):
        with te.autocast(recipe=outer):
            h = first(x)
            with te.autocast(recipe=inner):
                h = second(third_in(h))
            h = first(third_in(h))
        with te.autocast(recipe=after):
            h = third(third_in(h))
        with te.autocast(enabled=False):
            return first(third_in(h))

    params = torch.nn.ModuleList([first, second, third, third_in])
    counter = CompileCounter()
    compiled = torch.compile(fn, fullgraph=True, backend=counter)
    x = make_input()
    assert_bitwise(run(compiled, params, x), run(fn, params, x))
    assert counter.frame_count == 1
    assert graph_breaks() == 0

    # Each region's recipe reached its layer: the same function without the inner region
    # computes something else.
    def without_inner(x):
        with te.autocast(recipe=outer):
            h = second(third_in(first(x)))
            h = first(third_in(h))
        with te.autocast(recipe=after):
            h = third(third_in(h))
        with te.autocast(enabled=False):
            return first(third_in(h))

    assert not torch.equal(run(without_inner, params, x)[0], run(fn, params, x)[0])


def test_the_default_recipe_inside_a_compiled_function_is_fp8_current_scaling():
    module, x = make("linear"), make_input()

    def fn(x):
        with te.autocast():
            return module(x)

    compiled = torch.compile(fn, fullgraph=True, backend=AOT)
    assert_bitwise(run(compiled, module, x), run(under(Float8CurrentScaling(), module), module, x))
    assert graph_breaks() == 0


def test_an_outer_eager_autocast_is_restored_after_a_compiled_inner_one():
    module, x = make("linear"), make_input()
    fn = under(RECIPES["mxfp8"](), module)
    compiled = torch.compile(fn, fullgraph=True, backend=AOT)
    with te.autocast(recipe=RECIPES["fp8_block"]()):
        before = STATE.autocast
        compiled(x)
        assert STATE.autocast is before
    assert STATE.autocast is None


def test_a_graph_is_reused_at_any_nesting_depth_of_autocast():
    module, x = make("linear"), make_input()
    counter = CompileCounter()
    compiled = torch.compile(module, fullgraph=True, backend=counter)
    with te.autocast(recipe=Float8CurrentScaling()):
        compiled(x)
        with te.autocast(recipe=RECIPES["mxfp8"]()):
            with te.autocast(recipe=Float8CurrentScaling()):
                compiled(x)
    assert counter.frame_count == 1


def test_a_changed_recipe_field_recompiles_and_an_equal_recipe_object_does_not():
    module, x = make("linear"), make_input()
    recipe = Float8CurrentScaling()
    fn = under(recipe, module)
    counter = CompileCounter()
    compiled = torch.compile(fn, fullgraph=True, backend=counter)
    assert_bitwise(run(compiled, module, x), run(fn, module, x))
    assert counter.frame_count == 1

    # Recipes are mutable, as TE's are: a field changed in place recompiles.
    recipe.use_power_2_scales = True
    assert_bitwise(run(compiled, module, x), run(fn, module, x))
    assert counter.frame_count == 2  # a stale graph would have been reused silently

    # The graph is guarded on the recipe's value, not on the object: a new equal
    # recipe passed in reuses the graph.
    def with_recipe(x, recipe):
        with te.autocast(recipe=recipe):
            return module(x)

    counter = CompileCounter()
    compiled = torch.compile(with_recipe, fullgraph=True, backend=counter)
    for _ in range(3):
        compiled(x, Float8CurrentScaling(amax_epsilon=0.5))
    assert counter.frame_count == 1
    compiled(x, Float8CurrentScaling(amax_epsilon=0.25))
    assert counter.frame_count == 2


@pytest.mark.threads
def test_threads_entering_autocast_inside_one_compiled_function_each_get_their_recipe():
    module, x = make("layernorm_linear"), make_input()

    def fn(x, recipe):
        with te.autocast(recipe=recipe):
            return module(x)

    compiled = torch.compile(fn, fullgraph=True, backend=AOT)
    with torch.no_grad():
        expected = {name: fn(x, RECIPES[name]()) for name in RECIPE_NAMES}
        # Each recipe's graph is compiled here, on this thread, before the threads run
        # them together: on torch 2.11 a compile on a thread that then exits breaks
        # later compiles (docs/design.md). The threads must not compile again.
        for name in RECIPE_NAMES:
            compiled(x, RECIPES[name]())
        frames = unique_graphs()

        def call(name: str) -> torch.Tensor:
            with torch.no_grad():
                return compiled(x, RECIPES[name]())

        got = run_in_threads(call, RECIPE_NAMES)
    assert unique_graphs() == frames
    for name in RECIPE_NAMES:
        assert torch.equal(got[name], expected[name]), name
    assert graph_breaks() == 0
    assert STATE.autocast_cell == [None]


def test_eager_code_after_a_graph_break_inside_the_region_sees_the_recipe():
    """The recipe entered in the graph reaches the eager call behind a graph break
    (a differentiable ``fp8_output``, run eagerly): it returns the recipe's FP8 output."""
    module, x = make("linear"), make_input()

    def fn(x):
        with te.autocast(recipe=Float8CurrentScaling()):
            return module(x, fp8_output=True)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", EagerFallbackWarning)
        got = torch.compile(fn, backend=AOT)(x)
    expected = fn(x)
    assert type(got) is type(expected)
    with torch.no_grad():
        assert torch.equal(got.dequantize(), expected.dequantize())
    assert graph_breaks() >= 1
    assert STATE.autocast_cell == [None]


@pytest.mark.parametrize("kind", MODULES)
def test_delayed_scaling_inside_fullgraph_raises_naming_it(kind):
    module, x = make(kind), make_input()
    fn = under(DelayedScaling(), module)
    with pytest.raises(torch._dynamo.exc.Unsupported, match="DelayedScaling"):
        torch.compile(fn, fullgraph=True, backend=AOT)(x)
    assert STATE.autocast_cell == [None]


@pytest.mark.slow
@pytest.mark.parametrize("kind", MODULES)
def test_delayed_scaling_inside_a_compiled_function_runs_eagerly_step_after_step(kind):
    """Without fullgraph the region runs eagerly (warning with the reason): outputs,
    gradients and the scaling state equal eager's over steps whose scales update."""
    module = make(kind)
    twin = copy.deepcopy(module)
    recipe = DelayedScaling(amax_history_len=4)
    compiled = torch.compile(under(recipe, module), backend=AOT)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for seed in range(3):
            x = make_input(seed)
            assert_bitwise(run(compiled, module, x), run(under(recipe, twin), twin, x))
    assert any(
        issubclass(w.category, EagerFallbackWarning) and "DelayedScaling" in str(w.message)
        for w in caught
    )
    got, expected = module.get_extra_state(), twin.get_extra_state()
    for key, value in expected.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(got[key], value), key
    assert STATE.autocast_cell == [None]


@dataclasses.dataclass
class _TaggedRecipe(Float8CurrentScaling):
    tags: list = dataclasses.field(default_factory=list)


def test_a_recipe_that_is_not_a_value_runs_eagerly_inside_compile_naming_the_field():
    """A graph cannot be guarded on a list: fullgraph=True raises naming the field;
    otherwise the region runs eagerly (warning) and equals eager."""
    module, x = make("linear"), make_input()
    fn = under(_TaggedRecipe(tags=[1]), module)
    with pytest.raises(torch._dynamo.exc.Unsupported, match=r"_TaggedRecipe\.tags is a list"):
        torch.compile(fn, fullgraph=True, backend=AOT)(x)
    torch._dynamo.reset()
    with pytest.warns(EagerFallbackWarning, match=r"_TaggedRecipe\.tags is a list"):
        got = run(torch.compile(fn, backend=AOT), module, x)
    assert_bitwise(got, run(fn, module, x))
    assert STATE.autocast_cell == [None]


@pytest.mark.parametrize("transform", ["grad", "vmap"])
def test_autocast_under_a_torch_func_transform_is_refused_naming_it(transform):
    module, x = make("linear"), make_input().float()

    def loss(x):
        with te.autocast(recipe=Float8CurrentScaling()):
            return module(x.to(torch.bfloat16)).float().sum()

    fn = torch.func.grad(loss) if transform == "grad" else torch.func.vmap(loss)
    arg = x if transform == "grad" else x.view(2, 64, 64)
    with pytest.raises(RuntimeError, match=r"te\.autocast inside a torch\.func transform"):
        fn(arg)
    assert STATE.autocast_cell == [None]
