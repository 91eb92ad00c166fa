"""What a compiled call of our modules is guarded on. Dynamo checks every guard of a
compiled frame on each of its calls, before the graph (or its CUDA graph) runs: at a
small, host-bound step this check is a measurable part of the step (the
``reduce-overhead`` figure of docs/benchmarks.md). Each module global, attribute or method the traced path
reads adds guards; these tests keep what was removed from coming back and bound what a
layer adds, against ``torch.nn.Linear``."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from transformer_engine_ops.modules.layernorm import LayerNorm
from transformer_engine_ops.modules.layernorm_linear import LayerNormLinear
from transformer_engine_ops.modules.layernorm_mlp import LayerNormMLP
from transformer_engine_ops.modules.linear import Linear


def _guards(make: Any, layers: int) -> list[tuple[str, str]]:
    seen: list[list[tuple[str, str]]] = []

    def keep_all(entries: Any) -> list[bool]:
        seen.append([(e.name, e.guard_type) for e in entries])
        return [True] * len(entries)

    torch._dynamo.reset()
    model = torch.nn.Sequential(*[make() for _ in range(layers)])
    compiled = torch.compile(
        model, fullgraph=True, backend="eager", options={"guard_filter_fn": keep_all}
    )
    compiled(torch.randn(4, 16, requires_grad=True))
    assert len(seen) == 1, "one compiled frame"
    return seen[0]


def _per_layer(make: Any) -> float:
    return (len(_guards(make, 4)) - len(_guards(make, 1))) / 3


def test_a_layer_adds_few_guards_beyond_torch_nn_linear():
    """Per layer: torch.nn.Linear's parameters and hooks (12 on torch 2.13), plus our
    module's settings as one constant (``_op_settings``) and the parameters' types; 23
    on torch 2.13: 37 when each setting was an attribute of its own, 45 before the
    helpers were module functions."""
    ours = _per_layer(lambda: Linear(16, 16))
    theirs = _per_layer(lambda: torch.nn.Linear(16, 16))
    assert ours - theirs <= 12, (ours, theirs)


def test_no_guard_on_constants_types_or_method_lookups():
    guards = _guards(lambda: Linear(16, 16), 4)
    names = [name for name, _ in guards]
    # Constants the compiled path reads are literals in its code, not module globals.
    for constant in ("FORWARD_OP", "_TENSOR_CODE", "_NONE_CODE", "AUTOCAST_DEVICE_TYPES"):
        assert not any(constant in name for name in names), constant
    # No layer is guarded to have the first layer's class (``type(self)`` was read): an
    # aliasing guard, evaluated in Python, per layer.
    aliasing = [name for name, kind in guards if kind == "DUPLICATE_INPUT"]
    assert not any("_modules[" in name for name in aliasing), aliasing
    # The helpers are module functions: no per-layer "not in __dict__" guard for them.
    layer_1 = [name for name in names if "_modules['1']" in name]
    assert not any("_recipe_of_this_forward" in n or "_wgrad_flags" in n for n in layer_1)


def test_the_forward_unpacks_the_settings_in_their_declared_order():
    """``Linear.forward`` reads ``_op_settings`` into names in ``OP_SETTINGS``'s order:
    a reordering on one side only would hand the op one setting for another."""
    import ast
    import inspect
    import textwrap

    tree = ast.parse(textwrap.dedent(inspect.getsource(Linear.forward)))
    unpacks = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign)
        and isinstance(node.value, ast.Attribute)
        and node.value.attr == "_op_settings"
    ]
    assert len(unpacks) == 1
    names = tuple(elt.id for elt in unpacks[0].targets[0].elts)
    assert names == Linear.OP_SETTINGS


def test_a_setting_assigned_after_construction_takes_effect_eager_and_compiled():
    """The settings live in one tuple; assigning one rebuilds it, so the next call (and a
    compiled call, through its guard on the tuple) sees the new value."""
    torch.manual_seed(0)
    layer = Linear(16, 8)
    x = torch.randn(4, 16)
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    for run in (layer, compiled):
        layer.return_bias = False
        assert isinstance(run(x), torch.Tensor)
        layer.return_bias = True
        out, bias = run(x)
        assert torch.equal(bias, layer.bias)
        assert torch.equal(out + bias, torch.nn.functional.linear(x, layer.weight, layer.bias))
    assert layer._op_settings[Linear.OP_SETTINGS.index("return_bias")] is True
    assert layer.in_features == 16 and layer.out_features == 8 and layer.tp_size == 1


# One layer of each module whose forward the guard rules cover.
_MODULES = [
    lambda: Linear(16, 16),
    lambda: LayerNormLinear(16, 16),
    lambda: LayerNormMLP(16, 32),
    lambda: LayerNorm(16),
]
_MODULE_IDS = ["Linear", "LayerNormLinear", "LayerNormMLP", "LayerNorm"]


@pytest.mark.parametrize("make", _MODULES, ids=_MODULE_IDS)
def test_no_object_is_guarded_as_reached_two_ways(make):
    """Dynamo checks, in Python and on every call, that an object the trace reached
    through two sources is still one object: each layer's class where a forward read
    ``type(self)``, ``torch`` where a module and its generated op module both read it,
    the runtime module as ``_r`` and as its own functions' globals. The traced path
    reads each such object one way (module code imports ``is_tensor`` and
    ``is_grad_enabled``; generated code reads ``torch``), so the frame has no such check."""
    guards = _guards(make, 3)
    aliasing = [name for name, kind in guards if kind == "DUPLICATE_INPUT"]
    assert not aliasing, aliasing


@pytest.mark.parametrize("make", _MODULES, ids=_MODULE_IDS)
def test_the_common_values_cross_without_an_inlined_call(make):
    """Plain tensors, None and a ``Literal``'s choices pass the generated field checks
    inline, the output layout is applied with no call per output (only a quantized one
    reaches ``_rebuild_quantized``), and the recipe is read
    from its cell, not its property: each inlined function is a guard on its code in
    every call of the frame."""
    code_guards = [name for name, kind in _guards(make, 2) if kind == "CLOSURE_MATCH"]
    for helper in ("tensor_or_quantized", "_b.choice", "_b.check", "_rebuild", "fget"):
        assert not any(helper in name for name in code_guards), (helper, code_guards)


@pytest.mark.parametrize("make", _MODULES, ids=_MODULE_IDS)
def test_no_guard_reaches_through_a_closure_or_a_module_level_dict(make):
    """A forward wrapped by a decorator is guarded through the wrapper's closure cell
    (the wrapped code and each default), and a module-level dict of the no-recipe GEMM
    configurations was guarded key by key: each is a chain of checks on every call of
    the frame. The forwards test ``torch_autocast_on`` themselves and the GEMM fields
    are built per call from one shared configuration."""
    names = [name for name, _ in _guards(make, 2)]
    assert not any("__closure__" in n for n in names), names
    assert not any("_NO_RECIPE_GEMMS" in n for n in names), names


def test_a_forward_under_torch_autocast_casts_and_runs_with_it_off():
    """TE's rule, now a test at the top of each forward instead of a decorator: the
    input is cast to the autocast dtype, the module computes (and returns) that dtype,
    and its op runs with autocast off, eagerly and compiled alike."""
    layer = Linear(16, 8)
    x = torch.randn(4, 16)
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        eager, traced = layer(x), compiled(x)
    expected = torch.nn.functional.linear(
        x.bfloat16(), layer.weight.bfloat16(), layer.bias.bfloat16()
    )
    assert eager.dtype == traced.dtype == torch.bfloat16
    assert torch.equal(eager, traced)
    torch.testing.assert_close(eager, expected)


def test_the_settings_tuple_survives_copy_save_load_and_subclassing(tmp_path):
    """The settings live in the instance's ``__dict__``: a deep copy has its own (an
    assignment to one does not reach the other), a pickled module loads with them, a
    subclass inherits the descriptors, and a module whose settings were never assigned
    reports the missing attribute instead of returning a placeholder."""
    import copy

    layer = Linear(8, 4, return_bias=True)
    twin = copy.deepcopy(layer)
    twin.return_bias = False
    assert layer.return_bias is True and twin.return_bias is False
    torch.save(layer, tmp_path / "layer.pt")
    loaded = torch.load(tmp_path / "layer.pt", weights_only=False)
    assert loaded._op_settings == layer._op_settings

    class Sub(Linear):
        pass

    sub = Sub(8, 4)
    x = torch.randn(0, 8)  # batch 0 too
    assert sub(x).shape == (0, 4) and sub.out_features == 4
    bare = Linear.__new__(Linear)
    torch.nn.Module.__init__(bare)
    with pytest.raises(AttributeError, match="tp_size"):
        _ = bare.tp_size
