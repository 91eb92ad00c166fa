"""``te.recipe.CustomRecipe``: TE 2.20.2's quantizer factory, asked with TE's
``QuantizerRole`` of each slot of each module (its module type, tensor type and the
module's name; LayerNormMLP's fc1/fc2 and their inner boundary as TE labels them), the
answers kept per recipe value and roles. Eager and compiled (``fullgraph=True``, no
graph break) are bitwise equal for every module; a factory answering as a built-in
recipe gives that recipe's bits; what is not this library's quantizer (or TE's
``IdentityQuantizer``, ``DelayedScalingRequest``) is refused naming the role."""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch
from module_cases import graph_breaks, unique_graphs
from torch._dynamo.utils import counters

import transformer_engine_ops as te
from transformer_engine_ops.quantization import Float8CurrentScaling, MXFP8BlockScaling
from transformer_engine_ops.recipe import CustomRecipe, QuantizerRole

E4M3 = torch.float8_e4m3fn
AOT = "aot_eager"


def mixed_factory(role: QuantizerRole | None) -> te.Quantizer:
    """MXFP8 weights, FP8 block-scaled gradients, current-scaled FP8 elsewhere; NVFP4
    for whatever is named ``*.fc2`` (name-dependent, as TE's examples)."""
    if role is not None and role.name.endswith("fc2"):
        return te.NVFP4Quantizer(with_rht=False, with_post_rht_amax=False)
    if role is not None and role.tensor_type == "weight":
        return te.MXFP8Quantizer(fp8_dtype=E4M3)
    if role is not None and role.tensor_type == "grad_output":
        return te.Float8BlockQuantizer(fp8_dtype=torch.float8_e5m2, block_scaling_dim=1)
    return te.Float8CurrentScalingQuantizer(fp8_dtype=E4M3)


def as_current_scaling(role: QuantizerRole | None) -> te.Quantizer:
    """What ``Float8CurrentScaling()`` makes for each role (HYBRID: E5M2 gradients)."""
    if role is not None and role.tensor_type == "grad_output":
        return Float8CurrentScaling().make_quantizer("grad_output")
    return Float8CurrentScaling().make_quantizer("input")


MODULES = {
    "linear": lambda: te.Linear(64, 32, params_dtype=torch.bfloat16, name="proj"),
    "layernorm_linear": lambda: te.LayerNormLinear(64, 32, params_dtype=torch.bfloat16),
    "layernorm_mlp": lambda: te.LayerNormMLP(64, 64, params_dtype=torch.bfloat16, name="mlp"),
    "grouped_linear": lambda: te.GroupedLinear(2, 64, 32, params_dtype=torch.bfloat16),
}


def _module(kind: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return MODULES[kind]()


def _call(module: Any, kind: str, x: torch.Tensor) -> torch.Tensor:
    return module(x, [32, 32]) if kind == "grouped_linear" else module(x)


def _step(module: Any, kind: str, recipe: Any, seed: int = 1) -> list[torch.Tensor]:
    """Output, input gradient and every parameter gradient of one step."""
    gen = torch.Generator().manual_seed(seed)
    inner = getattr(module, "_orig_mod", module)
    device = next(inner.parameters()).device
    x = torch.randn(64, 64, generator=gen).to(device, torch.bfloat16).requires_grad_(True)
    for p in inner.parameters():
        p.grad = None
    with te.autocast(recipe=recipe):
        y = _call(module, kind, x)
    y.float().square().sum().backward()
    return [y.detach(), x.grad, *(p.grad for p in inner.parameters())]


def _assert_equal(a: list[torch.Tensor], b: list[torch.Tensor]) -> None:
    assert len(a) == len(b)
    for i, (u, v) in enumerate(zip(a, b, strict=True)):
        assert torch.equal(u, v), f"tensor {i} differs"


# --- construction ----------------------------------------------------------------------


def test_te_arguments_and_defaults():
    r = CustomRecipe(qfactory=mixed_factory)
    assert (r.fp8_format, r.fp8_dpa, r.fp8_mha, r.quantization_alignment) == (
        te.recipe.Format.HYBRID,
        False,
        False,
        128,
    )
    assert r.custom() and not Float8CurrentScaling.custom()
    assert (
        str(QuantizerRole("linear", "input", "qkv"))
        == "module_type=linear|tensor_type=input|name=qkv"
    )
    assert str(QuantizerRole()) == "QuantizerRole()"
    assert te.QuantizerRole is QuantizerRole


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(qfactory=None), ValueError, "requires `qfactory`"),
        (
            dict(qfactory=mixed_factory, quantization_alignment=0),
            ValueError,
            "quantization_alignment",
        ),
        (dict(qfactory=mixed_factory, fp8_dpa=True), NotImplementedError, "fp8_dpa"),
        (dict(qfactory=mixed_factory, backward_override="x"), ValueError, "backward_override"),
    ],
    ids=["no-factory", "alignment", "fp8_dpa", "backward_override"],
)
def test_bad_arguments_are_refused_naming_them(kwargs, error, match):
    with pytest.raises(error, match=match):
        CustomRecipe(**kwargs)


# --- roles -------------------------------------------------------------------------------


def _roles_asked_in_order(kind: str) -> list[Any]:
    asked: list[Any] = []

    def factory(role):
        asked.append(role)
        return mixed_factory(role)

    module = _module(kind)
    _step(module, kind, CustomRecipe(qfactory=factory))
    return asked


def _roles_asked(kind: str) -> set[Any]:
    return set(_roles_asked_in_order(kind))


def _role(module_type: str, tensor_type: str, name: str = "") -> QuantizerRole:
    return QuantizerRole(module_type, tensor_type, name)


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("linear", {_role("linear", t, "proj") for t in ("input", "weight", "grad_output")}),
        ("layernorm_linear", {_role("linear", t) for t in ("input", "weight", "grad_output")}),
        (
            "layernorm_mlp",
            {
                _role("linear", t, f"mlp.{fc}")
                for t in ("input", "weight", "grad_output")
                for fc in ("fc1", "fc2")
            },
        ),
        (
            "grouped_linear",
            {_role("grouped_linear", t) for t in ("input", "weight", "grad_output")},
        ),
    ],
)
def test_each_module_asks_with_tes_roles(kind, expected):
    asked = _roles_asked(kind)
    # None: the module's output and input gradient (TE's boundary slots).
    assert asked - {None} == expected
    assert None in asked


def test_only_the_module_asks_each_of_its_roles_once():
    """TE's count for one Linear step: input, weight and grad_output once each, None
    twice (output and input gradient); the recipe itself asks nothing."""
    asked = _roles_asked_in_order("linear")
    expected = [_role("linear", t, "proj") for t in ("input", "weight", "grad_output")]
    assert sorted(r.tensor_type for r in asked if r is not None) == sorted(
        r.tensor_type for r in expected
    )
    assert set(asked) - {None} == set(expected)
    assert asked.count(None) == 2


def test_factory_is_asked_once_per_recipe_value_and_roles():
    asked: list[Any] = []

    def factory(role):
        asked.append(role)
        return mixed_factory(role)

    module = _module("linear")
    recipe = CustomRecipe(qfactory=factory)
    _step(module, "linear", recipe)
    first = len(asked)
    _step(module, "linear", recipe, seed=2)
    _step(module, "linear", CustomRecipe(qfactory=factory), seed=3)  # an equal value
    assert len(asked) == first


# --- numerics ----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", list(MODULES))
def test_a_factory_answering_as_current_scaling_gives_its_bits(kind):
    custom = _step(_module(kind), kind, CustomRecipe(qfactory=as_current_scaling))
    builtin = _step(_module(kind), kind, Float8CurrentScaling())
    _assert_equal(custom, builtin)


@pytest.mark.parametrize("kind", list(MODULES))
def test_compiled_is_bitwise_equal_to_eager_without_graph_breaks(kind):
    recipe = CustomRecipe(qfactory=mixed_factory)
    eager = _step(_module(kind), kind, recipe)
    compiled = torch.compile(_module(kind), fullgraph=True, backend=AOT)
    _assert_equal(_step(compiled, kind, recipe), eager)
    _assert_equal(_step(compiled, kind, recipe, seed=2), _step(_module(kind), kind, recipe, seed=2))
    assert graph_breaks() == 0
    assert unique_graphs() == 1


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("kind", list(MODULES))
def test_compiled_on_inductor_on_cuda_is_bitwise_equal_to_eager(kind):
    recipe = CustomRecipe(qfactory=mixed_factory)
    eager = _step(_module(kind).cuda(), kind, recipe)
    compiled = torch.compile(_module(kind).cuda(), fullgraph=True, backend="inductor")
    _assert_equal(_step(compiled, kind, recipe), eager)
    assert graph_breaks() == 0


def test_per_name_quantizers_differ_from_a_uniform_recipe():
    # fc2 is NVFP4 (by name), fc1 not: the result is neither all-MXFP8 nor all-FP8.
    mixed = _step(_module("layernorm_mlp"), "layernorm_mlp", CustomRecipe(qfactory=mixed_factory))
    for builtin in (Float8CurrentScaling(), MXFP8BlockScaling()):
        other = _step(_module("layernorm_mlp"), "layernorm_mlp", builtin)
        assert not torch.equal(mixed[0], other[0])


def test_another_factory_recompiles():
    module = torch.compile(_module("linear"), fullgraph=True, backend=AOT)
    a = _step(module, "linear", CustomRecipe(qfactory=mixed_factory))
    b = _step(module, "linear", CustomRecipe(qfactory=as_current_scaling))
    assert unique_graphs() == 2
    _assert_equal(b, _step(_module("linear"), "linear", Float8CurrentScaling()))
    assert not torch.equal(a[0], b[0])


def test_quantized_model_init_quantizes_each_weight_with_its_roles_quantizer():
    with te.quantized_model_init(recipe=CustomRecipe(qfactory=mixed_factory)):
        module = _module("layernorm_mlp")
    assert isinstance(module.fc1_weight, te.MXFP8Tensor)
    assert isinstance(module.fc2_weight, te.NVFP4Tensor)  # named mlp.fc2
    eager = _step(module, "layernorm_mlp", CustomRecipe(qfactory=mixed_factory))
    assert all(torch.isfinite(t).all() for t in eager)


# --- refused -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "error", "match"),
    [
        (None, ValueError, r"qfactory\(None\) returned None"),
        ("a TE quantizer", NotImplementedError, "returned a builtins.str"),
        (
            te.IdentityQuantizer(dtype=torch.float32),
            NotImplementedError,
            r"IdentityQuantizer\(dtype=torch.float32\): casting a slot's operand",
        ),
    ],
    ids=["none", "not-ours", "identity-cast"],
)
def test_what_is_not_a_quantizer_of_ours_is_refused_naming_the_role(answer, error, match):
    def factory(role):
        return answer if role is None else mixed_factory(role)

    with pytest.raises(error, match=match):
        _step(_module("linear"), "linear", CustomRecipe(qfactory=factory))


def test_a_factory_that_is_not_a_plain_function_runs_eagerly_and_fullgraph_names_it():
    recipe = CustomRecipe(qfactory=functools.partial(mixed_factory))
    eager = _step(_module("linear"), "linear", recipe)
    compiled = torch.compile(_module("linear"), fullgraph=True, backend=AOT)
    with pytest.raises(Exception, match="qfactory"):
        _step(compiled, "linear", recipe)
    counters.clear()
    relaxed = torch.compile(_module("linear"), backend=AOT)
    _assert_equal(_step(relaxed, "linear", recipe), eager)
