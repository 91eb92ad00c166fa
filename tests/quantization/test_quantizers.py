"""Quantizers are values: equality, hashing, FX repr, compile specialization; recipes."""

from __future__ import annotations

import dataclasses
import inspect
import pickle

import pytest
import torch
import torch._dynamo.testing
from quant_cases import QUANTIZERS, random_input

from transformer_engine_ops.quantization import (
    DelayedScaling,
    Float8BlockQuantizer,
    Float8BlockScaling,
    Float8CurrentScaling,
    Float8CurrentScalingQuantizer,
    Float8Quantizer,
    Format,
    MXFP8BlockScaling,
    MXFP8Quantizer,
    NVFP4BlockScaling,
    NVFP4Quantizer,
)
from transformer_engine_ops.quantization.quantizer import (
    Quantizer,
    require_value_opaque,
    value_opaque_reason,
)
from transformer_engine_ops.runtime import codec

# TE's assignable quantizer fields.
MUTABLE = ("rowwise_usage", "columnwise_usage", "internal", "with_amax_reduction")


def rebuilt(q):
    text, env = q.__fx_repr__()
    # Evaluated with the returned globals alone, as TE's test of value quantizers does.
    return eval(text, dict(env))


@pytest.mark.parametrize("name", list(QUANTIZERS))
def test_equal_configs_are_equal_and_hash_equal(name):
    q = QUANTIZERS[name]
    twin = dataclasses.replace(q)
    assert twin is not q and twin == q and hash(twin) == hash(q)


@pytest.mark.parametrize("name", list(QUANTIZERS))
def test_each_field_change_makes_a_different_quantizer(name):
    q = QUANTIZERS[name].with_usage(rowwise=True, columnwise=True)
    for field in dataclasses.fields(q):
        value = getattr(q, field.name)
        base = q
        if field.name == "nvfp4_e4m3_max":  # 256 is a 4over6 bound only
            base = dataclasses.replace(q, nvfp4_use_4over6=True)
            changed = dataclasses.replace(base, nvfp4_e4m3_max=256)
        elif field.name == "nvfp4_4over6_err_mode":
            changed = dataclasses.replace(q, nvfp4_4over6_err_mode="MSE")
        elif field.name == "row_scaled_nvfp4" and q.with_2d_quantization:
            continue  # TE refuses row-scaled 2-D blocks (tested with the NVFP4 options)
        elif isinstance(value, bool):
            changed = dataclasses.replace(q, **{field.name: not value})
        elif isinstance(value, (int, float)):
            new = 3 - value if field.name == "block_scaling_dim" else value * 2 + 1
            changed = dataclasses.replace(q, **{field.name: new})
        else:
            continue
        assert changed != base, field.name


def test_quantizers_of_different_formats_differ():
    values = list(QUANTIZERS.values())
    assert len(set(values)) == len(values)


@pytest.mark.parametrize("name", list(QUANTIZERS))
def test_fx_repr_evaluates_back_to_an_equal_quantizer(name):
    q = QUANTIZERS[name].with_usage(columnwise=False).with_internal(True)
    assert rebuilt(q) == q
    assert type(rebuilt(q)) is type(q)


@pytest.mark.parametrize("name", list(QUANTIZERS))
def test_fx_repr_globals_pickle(name):
    """The globals hold classes and functions, never a module or a dtype: FX's code
    generator takes those alone, and Inductor's FX graph cache pickles them."""
    _, env = QUANTIZERS[name].__fx_repr__()
    assert all(isinstance(v, type) or inspect.isfunction(v) for v in env.values())
    assert pickle.loads(pickle.dumps(env)) == env


@pytest.mark.parametrize("name", list(QUANTIZERS))
def test_every_stateless_quantizer_round_trips_through_its_boundary_text(name):
    q = QUANTIZERS[name]
    decoded = codec.decode(codec.code_of(q))
    assert decoded == q and type(decoded) is type(q)
    assert codec.code_of(dataclasses.replace(q)) == codec.code_of(q)
    assert value_opaque_reason(q) is None
    require_value_opaque(q)


@pytest.mark.parametrize("name", list(QUANTIZERS))
def test_a_configuration_field_other_than_te_s_mutable_ones_is_fixed(name):
    q = QUANTIZERS[name].copy()
    field = next(f for f in codec.field_names(type(q)) if f not in MUTABLE)
    with pytest.raises(dataclasses.FrozenInstanceError, match=f"cannot assign to '{field}'"):
        setattr(q, field, getattr(q, field))
    with pytest.raises(dataclasses.FrozenInstanceError, match="cannot delete"):
        del q.internal


@pytest.mark.parametrize("name", list(QUANTIZERS))
def test_te_s_mutable_attributes_change_ones_own_quantizer_and_its_value(name):
    """TE's ``set_usage`` and ``q.internal = ...`` change a quantizer one made: its
    value (equality, boundary text) and what it quantizes from then on."""
    q = QUANTIZERS[name].copy()
    before, code = q.copy(), codec.code_of(q)
    q.set_usage(rowwise=True, columnwise=False)
    q.internal = True
    assert (q.rowwise_usage, q.columnwise_usage, q.internal) == (True, False, True)
    assert q.get_usages() == {"rowwise": True, "columnwise": False}
    assert q != before and codec.code_of(q) != code
    assert codec.decode(codec.code_of(q)) == q
    value = q.quantize(random_input((32, 64)))
    assert isinstance(value, q.storage_cls)
    assert value.inner_names() == tuple(q.inner_tensor_specs((32, 64)))
    assert not value.columnwise_usage
    with pytest.raises(ValueError, match="at least one of rowwise_usage and columnwise_usage"):
        q.set_usage(rowwise=False)
    with pytest.raises(TypeError, match="internal must be a bool"):
        q.internal = 1


@pytest.mark.parametrize("name", list(QUANTIZERS))
def test_the_quantizer_a_value_holds_is_sealed(name):
    """Changing one's quantizer after quantizing leaves the value as it was; the value's
    own quantizer (shared, like the decoded and recipe ones) refuses to change."""
    q = QUANTIZERS[name].copy()
    value = q.quantize(random_input((32, 64)))
    q.set_usage(columnwise=False)
    assert value.quantizer.columnwise_usage and value.quantizer == QUANTIZERS[name]
    with pytest.raises(TypeError, match=r"shared .* change a copy"):
        value.quantizer.set_usage(columnwise=False)
    decoded = codec.decode(codec.code_of(QUANTIZERS[name]))
    with pytest.raises(TypeError, match="shared"):
        decoded.internal = True
    mine = value.quantizer.copy()
    mine.internal = True
    assert mine.internal and not value.quantizer.internal


def test_delayed_scaling_is_refused_as_value_opaque_with_its_reason():
    q = Float8Quantizer()
    assert codec.decode(codec.code_of(q)) is q  # stateful: crosses by identity
    assert "amax history" in value_opaque_reason(q)
    with pytest.raises(
        TypeError, match="Float8Quantizer is not a value-opaque quantizer.*amax history"
    ):
        require_value_opaque(q)
    with pytest.raises(TypeError, match="amax history"):
        q.__fx_repr__()
    assert q != Float8Quantizer() and q == q  # identity: it holds state


# ----- compile specialization through a custom op -----

_lib = torch.library.Library("teo_quantizer_test", "FRAGMENT")
_lib.define("qdq(Tensor x, str q) -> Tensor")


def _qdq(x, q):
    return codec.decode(q).with_internal(True).quantize(x).dequantize()


def _code(q):
    """What a generated flatten passes for a quantizer: its cached boundary text."""
    return q._teops_code


_lib.impl("qdq", _qdq, "CompositeExplicitAutograd")
torch.library.register_fake("teo_quantizer_test::qdq", lambda x, q: torch.empty_like(x), lib=_lib)


def test_a_function_taking_a_quantizer_recompiles_only_when_the_config_changes():
    counter = torch._dynamo.testing.CompileCounter()

    @torch.compile(fullgraph=True, backend=counter)
    def f(x, q):
        return torch.ops.teo_quantizer_test.qdq(x, _code(q)) * 2

    x = torch.randn(32, 64)
    f(x, Float8CurrentScalingQuantizer())
    f(x, Float8CurrentScalingQuantizer())  # equal value, new object
    assert counter.frame_count == 1
    f(x, Float8CurrentScalingQuantizer(force_pow_2_scales=True))
    assert counter.frame_count == 2
    f(x, Float8CurrentScalingQuantizer(force_pow_2_scales=True))
    f(x, Float8CurrentScalingQuantizer())
    assert counter.frame_count == 2


@pytest.mark.parametrize("name", ["mxfp8_e4m3", "nvfp4_2d", "fp8_block_1d"])
def test_compiled_custom_op_with_a_quantizer_matches_eager_bitwise(name):
    q = QUANTIZERS[name]
    f = torch.compile(
        lambda x, q: torch.ops.teo_quantizer_test.qdq(x, _code(q)) + 1,
        fullgraph=True,
        backend="aot_eager",
    )
    x = torch.randn(32, 64)
    assert torch.equal(f(x, q), _qdq(x, _code(q)) + 1)


@pytest.mark.parametrize("name", ["fp8_current_e4m3", "nvfp4_1d"])
def test_a_quantized_wrapper_is_a_compiled_graph_input(name):
    t = QUANTIZERS[name].quantize(torch.randn(32, 64))
    f = torch.compile(lambda t: t.dequantize() * 3 + t, fullgraph=True, backend="aot_eager")
    assert torch.equal(f(t), t.dequantize() * 3 + t.dequantize())


# ----- recipes -----

FORWARD = ("input", "weight", "output")
BACKWARD = ("grad_output", "grad_input", "grad_weight")


def test_hybrid_format_is_e4m3_forward_and_e5m2_for_grads():
    for recipe in (DelayedScaling(), Float8CurrentScaling()):
        for role in FORWARD:
            assert recipe.make_quantizer(role).fp8_dtype == torch.float8_e4m3fn
        for role in BACKWARD:
            assert recipe.make_quantizer(role).fp8_dtype == torch.float8_e5m2
    e4m3 = Float8CurrentScaling(fp8_format=Format.E4M3)
    assert e4m3.make_quantizer("grad_output").fp8_dtype == torch.float8_e4m3fn


def test_delayed_scaling_recipe_makes_stateful_quantizers():
    q = DelayedScaling(amax_history_len=16).make_quantizer("input")
    assert isinstance(q, Float8Quantizer) and q.amax_history.shape == (16,)


def test_block_recipes_follow_te_choices():
    blocks = Float8BlockScaling()
    assert blocks.make_quantizer("weight").block_scaling_dim == 2
    assert blocks.make_quantizer("input").block_scaling_dim == 1
    assert blocks.make_quantizer("grad_output").block_scaling_dim == 1
    assert isinstance(blocks.make_quantizer("input"), Float8BlockQuantizer)
    assert isinstance(MXFP8BlockScaling().make_quantizer("grad_output"), MXFP8Quantizer)
    nvfp4 = NVFP4BlockScaling(disable_rht=True, disable_stochastic_rounding=True)
    assert nvfp4.make_quantizer("weight") == NVFP4Quantizer(with_2d_quantization=True)
    assert nvfp4.make_quantizer("input") == NVFP4Quantizer()
    assert (
        not NVFP4BlockScaling(
            disable_2d_quantization=True, disable_rht=True, disable_stochastic_rounding=True
        )
        .make_quantizer("weight")
        .with_2d_quantization
    )


def test_recipes_make_equal_stateless_quantizers_on_every_call():
    for recipe in (
        Float8CurrentScaling(),
        MXFP8BlockScaling(),
        NVFP4BlockScaling(disable_rht=True, disable_stochastic_rounding=True),
        Float8BlockScaling(),
    ):
        for role in FORWARD + BACKWARD:
            q = recipe.make_quantizer(role)
            assert isinstance(q, Quantizer) and q == recipe.make_quantizer(role)


def test_unknown_role_is_a_value_error():
    with pytest.raises(ValueError, match="unknown quantizer role 'bias'"):
        MXFP8BlockScaling().make_quantizer("bias")


@pytest.mark.parametrize("name", list(QUANTIZERS))
def test_derived_quantizers_are_built_once_and_equal_a_fresh_replace(name):
    q = dataclasses.replace(QUANTIZERS[name])
    flipped = not q.columnwise_usage if q.rowwise_usage else q.columnwise_usage
    derived = q.with_usage(columnwise=flipped).with_internal(not q.internal)
    again = q.with_usage(columnwise=flipped).with_internal(not q.internal)
    assert again is derived
    fresh = dataclasses.replace(q, columnwise_usage=flipped, internal=not q.internal)
    assert derived == fresh and codec.code_of(derived) == codec.code_of(fresh)
    # The memo never reaches a pickle (a saved quantized tensor carries its quantizer).
    state = q.__getstate__()
    assert all(not k.startswith("_teops_derived") for k in state)


def test_a_derived_delayed_scaling_quantizer_shares_its_scaling_state():
    q = DelayedScaling(amax_history_len=4).make_quantizer("input")
    derived = q.with_internal(True)
    assert derived is q.with_internal(True)
    assert derived.amax_history is q.amax_history and derived.scale is q.scale
