"""Recipes take TE 2.20.2's arguments (names, positions, defaults); quantizer and recipe
configuration is validated at construction; what is not implemented is refused by name."""

from __future__ import annotations

import enum
import inspect

import pytest
import torch

from transformer_engine_ops.quantization import (
    DelayedScaling,
    Float8BlockQuantizer,
    Float8BlockScaling,
    Float8CurrentScaling,
    Float8CurrentScalingQuantizer,
    Float8Quantizer,
    Format,
    MXFP8BlockScaling,
    NVFP4BlockScaling,
    NVFP4Quantizer,
)
from transformer_engine_ops.quantization.recipes import MMParams

# TE 2.20.2's constructor arguments, in order, with their defaults (environment unset).
TE_SIGNATURES = {
    DelayedScaling: [
        ("margin", 0),
        ("fp8_format", Format.HYBRID),
        ("amax_history_len", 1024),
        ("amax_compute_algo", "max"),
        ("scaling_factor_compute_algo", None),
        ("reduce_amax", True),
        ("fp8_dpa", False),
        ("fp8_mha", False),
        ("backward_override", None),
    ],
    Float8CurrentScaling: [
        ("use_power_2_scales", False),
        ("fp8_format", Format.HYBRID),
        ("fp8_gemm_fprop", MMParams(use_split_accumulator=False)),
        ("fp8_gemm_dgrad", MMParams(use_split_accumulator=True)),
        ("fp8_gemm_wgrad", MMParams(use_split_accumulator=True)),
        ("fp8_dpa", False),
        ("fp8_mha", False),
        ("backward_override", None),
    ],
    MXFP8BlockScaling: [
        ("margin", 0),
        ("fp8_format", Format.E4M3),
        ("fp8_dpa", False),
        ("fp8_mha", False),
        ("backward_override", None),
        ("enable_2d_quantization", False),
    ],
    Float8BlockScaling: [
        ("use_f32_scales", False),
        ("fp8_format", Format.E4M3),
        ("x_block_scaling_dim", 1),
        ("w_block_scaling_dim", 2),
        ("grad_block_scaling_dim", 1),
        ("fp8_gemm_fprop", MMParams(use_split_accumulator=True)),
        ("fp8_gemm_dgrad", MMParams(use_split_accumulator=True)),
        ("fp8_gemm_wgrad", MMParams(use_split_accumulator=True)),
        ("fp8_dpa", False),
        ("fp8_mha", False),
        ("backward_override", None),
    ],
    NVFP4BlockScaling: [
        ("disable_rht", False),
        ("disable_stochastic_rounding", False),
        ("disable_2d_quantization", False),
        ("row_scaled_activation", False),
        ("nvfp4_4over6", "none"),
        ("nvfp4_4over6_e4m3_use_256", "all"),
        ("nvfp4_4over6_err_mode", "MAE"),
        ("fp4_format", Format.E2M1),
        ("fp8_format", Format.E4M3),
        ("fp8_dpa", False),
        ("fp8_mha", False),
        ("backward_override", None),
    ],
}


@pytest.mark.parametrize("cls", list(TE_SIGNATURES), ids=lambda c: c.__name__)
def test_recipe_positional_arguments_and_defaults_are_te_2_20_2s(cls):
    params = [
        p
        for p in inspect.signature(cls).parameters.values()
        if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
    ]
    assert [(p.name, p.default) for p in params] == TE_SIGNATURES[cls]


def test_delayed_scaling_positional_order_is_margin_then_format():
    recipe = DelayedScaling(0, Format.E4M3)
    assert recipe.margin == 0 and recipe.fp8_format is Format.E4M3
    with pytest.raises(TypeError, match="margin must be an int"):
        DelayedScaling(Format.HYBRID, 0)
    with pytest.raises(TypeError, match="fp8_format must be a Format"):
        DelayedScaling(0, 0)


def test_te_keywords_reach_the_quantizers():
    assert Float8CurrentScaling(use_power_2_scales=True).make_quantizer("input").force_pow_2_scales
    blocks = Float8BlockScaling(use_f32_scales=True).make_quantizer("input")
    assert not blocks.force_pow_2_scales
    hybrid = MXFP8BlockScaling(fp8_format=Format.HYBRID)
    assert hybrid.make_quantizer("grad_output").fp8_dtype == torch.float8_e5m2
    fprop = MMParams(use_split_accumulator=True)
    assert Float8CurrentScaling(fp8_gemm_fprop=fprop).gemm_configs()[0] == fprop
    assert Float8CurrentScaling(backward_override="dequantized").backward_override == "dequantized"


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: Float8CurrentScaling(fp8_dpa=True), "fp8_dpa=True"),
        (lambda: Float8BlockScaling(fp8_mha=True), "fp8_mha=True"),
        (lambda: MXFP8BlockScaling(margin=2), "margin=2"),
    ],
)
def test_unimplemented_te_values_raise_not_implemented_naming_them(make, match):
    with pytest.raises(NotImplementedError, match=match):
        make()


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: DelayedScaling(fp8_format=Format.E5M2), "fp8_format must be one of"),
        (lambda: DelayedScaling(backward_override="dequantized"), "backward_override=None"),
        (lambda: Float8CurrentScaling(backward_override="fast"), "backward_override must be"),
        (lambda: Float8BlockScaling(x_block_scaling_dim=2), "2D by 2D"),
        (
            lambda: Float8BlockScaling(fp8_gemm_dgrad=MMParams(use_split_accumulator=False)),
            "split accumulator",
        ),
        (lambda: NVFP4BlockScaling(fp8_format=Format.HYBRID), "fp8_format"),
        (lambda: NVFP4BlockScaling(nvfp4_4over6_err_mode="L1"), "nvfp4_4over6_err_mode"),
        (
            lambda: NVFP4BlockScaling(row_scaled_activation=True),
            "row_scaled_activation=True with the random Hadamard transform of the input",
        ),
        (
            lambda: NVFP4BlockScaling(nvfp4_4over6="activations"),
            "nvfp4_4over6='activations' with the random Hadamard transform of the input",
        ),
    ],
)
def test_values_te_refuses_raise_value_error(make, match):
    with pytest.raises(ValueError, match=match):
        make()


@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (lambda: Float8BlockQuantizer(block_len=2.5), TypeError, "block_len must be an int"),
        (lambda: Float8BlockQuantizer(block_len=True), TypeError, "block_len must be an int"),
        (lambda: Float8BlockQuantizer(block_len=2**40), ValueError, "block_len must be in"),
        (lambda: Float8BlockQuantizer(block_len=0), ValueError, "block_len must be in"),
        (lambda: Float8BlockQuantizer(force_pow_2_scales="yes"), TypeError, "force_pow_2"),
        (lambda: Float8BlockQuantizer(block_scaling_dim=3), ValueError, "block_scaling_dim"),
        (lambda: Float8BlockQuantizer(amax_epsilon=-1.0), ValueError, "amax_epsilon"),
        (lambda: Float8BlockQuantizer(amax_epsilon=float("nan")), ValueError, "amax_epsilon"),
        (lambda: Float8CurrentScalingQuantizer(force_pow_2_scales=1), TypeError, "force_pow_2"),
        (lambda: Float8CurrentScalingQuantizer(rowwise_usage="no"), TypeError, "rowwise_usage"),
        (lambda: Float8Quantizer(amax_history_len=1.5), TypeError, "amax_history_len"),
        (lambda: Float8Quantizer(margin=-1), ValueError, "margin"),
        (lambda: NVFP4Quantizer(with_2d_quantization=None), TypeError, "with_2d_quantization"),
        (lambda: Float8BlockScaling(block_len=2.5), TypeError, "block_len"),
        (lambda: Float8BlockScaling(x_block_scaling_dim=True), TypeError, "x_block_scaling_dim"),
        (lambda: Float8CurrentScaling(use_power_2_scales="yes"), TypeError, "use_power_2"),
        (lambda: DelayedScaling(amax_history_len=0), ValueError, "amax_history_len"),
    ],
)
def test_bad_configuration_is_refused_at_construction(make, error, match):
    with pytest.raises(error, match=match):
        make()


class _Len(enum.IntEnum):
    SIXTEEN = 16


def test_int_enum_configuration_becomes_an_exact_int():
    q = Float8BlockQuantizer(block_len=_Len.SIXTEEN)
    assert type(q.block_len) is int and q.block_len == 16
    assert q == Float8BlockQuantizer(block_len=16)
    assert type(Float8BlockScaling(block_len=_Len.SIXTEEN).block_len) is int
    code, _ = q.__fx_repr__()
    assert "block_len=16" in code


def test_compiled_linear_with_an_int_enum_block_len_equals_eager():
    from transformer_engine_ops.modules.autocast import autocast
    from transformer_engine_ops.modules.linear import Linear

    torch.manual_seed(0)
    model = Linear(64, 32, params_dtype=torch.bfloat16)
    x = torch.randn(4, 64).to(torch.bfloat16)
    with autocast(recipe=Float8BlockScaling(block_len=_Len.SIXTEEN)):
        want = model(x)
        got = torch.compile(model, fullgraph=True, backend="aot_eager")(x)
    assert torch.equal(got, want)


def test_te_recipe_namespace_exposes_the_recipe_classes():
    import transformer_engine_ops as te

    for name in (
        "Format",
        "DelayedScaling",
        "Float8CurrentScaling",
        "MXFP8BlockScaling",
        "Float8BlockScaling",
        "NVFP4BlockScaling",
    ):
        assert getattr(te.recipe, name) is getattr(
            __import__("transformer_engine_ops.quantization", fromlist=[name]), name
        )
