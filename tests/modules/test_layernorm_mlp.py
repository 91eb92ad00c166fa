"""LayerNormMLP: every recipe x bias compiled bitwise equal to eager, every activation
against the plain formula, dynamic batch sizes, TE's constructor and state-dict keys."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from family_cases import (
    FFN,
    HIDDEN,
    assert_close_to_reference,
    compile_and_compare,
    make,
    make_input,
    reference_step,
    step,
)
from module_cases import RECIPES, assert_bitwise, graph_breaks, recipe_context, unique_graphs

import transformer_engine_ops as te

KIND = "layernorm_mlp"
AOT = "aot_eager"
ACTIVATIONS = [
    "gelu",
    "relu",
    "qgelu",
    "srelu",
    "silu",
    "glu",
    "swiglu",
    "geglu",
    "qgeglu",
    "reglu",
    "sreglu",
]


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("recipe", list(RECIPES))
def test_compiled_is_bitwise_equal_to_eager(recipe, bias):
    compile_and_compare(make(KIND, bias=bias), recipe)


@pytest.mark.parametrize(("recipe", "activation"), [("bf16", "gelu"), ("fp8_current", "swiglu")])
def test_compiled_on_inductor_is_bitwise_equal_to_eager(recipe, activation):
    compile_and_compare(make(KIND, activation=activation), recipe, backend="inductor")


@pytest.mark.parametrize("activation", [a for a in ACTIVATIONS if a not in ("relu", "reglu")])
def test_bf16_eager_matches_the_torch_formula(activation):
    module, x = make(KIND, activation=activation), make_input()
    got = step(module, x, "bf16")
    assert_close_to_reference(got, reference_step(module, KIND, x), rtol=3e-2)


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_fp32_eager_matches_the_torch_formula_tightly(activation):
    # ReLU's derivative jumps at 0: in bf16 a pre-activation rounded across 0 flips a
    # whole gradient term, so the gated/ungated ReLU formulas are pinned down in fp32.
    module = make(KIND, activation=activation, dtype=torch.float32)
    x = make_input(dtype=torch.float32)
    got = step(module, x, "bf16")  # no recipe: the module's own dtype
    assert_close_to_reference(got, reference_step(module, KIND, x), rtol=1e-4)


@pytest.mark.parametrize("activation", ["qgelu", "srelu", "silu", "geglu", "reglu", "sreglu"])
def test_every_activation_compiles_bitwise_equal_to_eager(activation):
    compile_and_compare(make(KIND, activation=activation, normalization="RMSNorm"), "mxfp8")


def test_gated_activation_doubles_fc1_only():
    module = te.LayerNormMLP(HIDDEN, FFN, activation="swiglu")
    assert tuple(module.fc1_weight.shape) == (2 * FFN, HIDDEN)
    assert tuple(module.fc1_bias.shape) == (2 * FFN,)
    assert tuple(module.fc2_weight.shape) == (HIDDEN, FFN)


@pytest.mark.parametrize("recipe", ["bf16", "nvfp4"])
def test_dynamic_batch_sizes_share_one_graph(recipe):
    module = make(KIND)
    compiled = torch.compile(module, fullgraph=True, backend=AOT, dynamic=True)
    for batch in (2, 3, 5, 6, 8):
        x = make_input(batch=batch, seed=batch)
        assert_bitwise(step(compiled, x, recipe), step(module, x, recipe))
    assert unique_graphs() == 1
    assert graph_breaks() == 0


def test_return_layernorm_output_and_bias_come_in_te_order():
    module = make(KIND, return_layernorm_output=True, return_bias=True)
    plain = make(KIND)
    x = make_input()
    out, bias, ln_out = module(x)
    assert torch.equal(bias, module.fc2_bias)
    assert tuple(ln_out.shape) == tuple(x.shape)
    assert torch.allclose(out.float() + bias.float(), plain(x).float(), atol=2e-2, rtol=1e-2)
    compiled = torch.compile(module, fullgraph=True, backend=AOT)
    c_out, _, c_ln = compiled(x)
    assert torch.equal(c_out, out) and torch.equal(c_ln, ln_out)
    assert graph_breaks() == 0


def test_frozen_norm_and_fc1_still_train_fc2_under_compile():
    module, x = make(KIND), make_input()
    for name in ("layer_norm_weight", "layer_norm_bias", "fc1_weight", "fc1_bias"):
        getattr(module, name).requires_grad_(False)
    eager = step(module, x, "fp8_current")
    got = step(torch.compile(module, fullgraph=True, backend=AOT), x, "fp8_current")
    assert graph_breaks() == 0
    assert torch.equal(got[0], eager[0]) and torch.equal(got[1], eager[1])
    for a, b in zip(got[2], eager[2], strict=True):
        assert (a is None) == (b is None)
        assert a is None or torch.equal(a, b)


@pytest.mark.parametrize("recipe", ["fp8_block"])
def test_quantized_model_init_weights_compile_and_match_eager(recipe):
    with te.quantized_model_init(recipe=RECIPES[recipe]()):
        module = make(KIND)
    assert type(module.fc1_weight.data) is not torch.Tensor
    assert type(module.fc2_weight.data) is not torch.Tensor
    compile_and_compare(module, recipe)


def test_no_grad_inference_matches_training_forward():
    module, x = make(KIND), make_input()
    with recipe_context("mxfp8"):
        y = module(x)
        with torch.no_grad():
            assert torch.equal(module(x), y)


# --- TE's constructor and state dict ----------------------------------------------------


def test_te_positional_arguments_mean_what_they_mean_in_te():
    # TE: (hidden_size, ffn_hidden_size, eps, sequence_parallel, return_bias, ...,
    #      init_method, bias, normalization, activation)
    m = te.LayerNormMLP(64, 128, 1e-3, False, True, None, None, 1, None, False, "RMSNorm", "relu")
    assert (m.eps, m.return_bias, m.normalization, m.activation) == (1e-3, True, "RMSNorm", "relu")
    assert m.fc1_bias is None and m.fc2_bias is None


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(ub_bulk_wgrad=True),
        dict(symmetric_ar_type="multimem_all_reduce"),
    ],
    ids=lambda kw: next(iter(kw)),
)
def test_unimplemented_arguments_raise_naming_them(kwargs):
    with pytest.raises(NotImplementedError, match=next(iter(kwargs))):
        te.LayerNormMLP(64, 128, **kwargs)


def test_jit_warmup_sizes_are_accepted_and_change_nothing():
    """TE's ``seq_length``/``micro_batch_size`` only size its JIT warm-up (TE's
    test_deferred_init.py passes them)."""
    torch.manual_seed(0)
    plain = te.LayerNormMLP(64, 128, device="cpu")
    torch.manual_seed(0)
    sized = te.LayerNormMLP(64, 128, seq_length=2048, micro_batch_size=2, device="cpu")
    x = torch.randn(4, 64)
    assert torch.equal(plain(x), sized(x))


def test_unknown_activation_is_named():
    with pytest.raises(ValueError, match="activation must be one of"):
        te.LayerNormMLP(64, 128, activation="tanh")


@pytest.mark.parametrize("bias", [True, False])
def test_state_dict_has_te_keys_and_loads_strictly_both_ways(bias):
    a, b = make(KIND, bias=bias), make(KIND, bias=bias, seed=7)
    state = a.state_dict()
    # TE 2.20.2's LayerNormMLP(64, 128): names and shapes (no fc biases without bias).
    expected = {
        "layer_norm_weight": (64,),
        "layer_norm_bias": (64,),
        "fc1_weight": (128, 64),
        "fc2_weight": (64, 128),
        "_extra_state": (0,),
    }
    if bias:
        expected.update(fc1_bias=(128,), fc2_bias=(64,))
    assert {k: tuple(v.shape) for k, v in state.items()} == expected
    b.load_state_dict(state, strict=True)
    x = make_input()
    assert torch.equal(b(x), a(x))
    a.load_state_dict(b.state_dict(), strict=True)


# --- the recipe's GEMM settings -------------------------------------------------------


def _captured_bundle(module, monkeypatch, recipe):
    from transformer_engine_ops.modules import layernorm_mlp
    from transformer_engine_ops.ops.layernorm_mlp import LayerNormMLPFwdArgs

    seen = []

    def record(keep: Any = None, **fields: Any) -> tuple[int]:
        seen.append(LayerNormMLPFwdArgs(**fields))
        return (0,)

    monkeypatch.setattr(layernorm_mlp, "call_layernorm_mlp", record)
    with te.autocast(recipe=recipe):
        module(make_input())
    return seen[0]


@pytest.mark.parametrize("split", [True, False])
def test_the_recipes_gemm_settings_reach_both_gemms(split, monkeypatch):
    mm = te.recipe.MMParams(use_split_accumulator=split)
    recipe = te.recipe.Float8CurrentScaling(fp8_gemm_fprop=mm, fp8_gemm_dgrad=mm, fp8_gemm_wgrad=mm)
    args = _captured_bundle(make(KIND), monkeypatch, recipe)
    assert args.fprop_gemm == args.dgrad_gemm == args.wgrad_gemm == mm


@pytest.mark.parametrize("override", ["high_precision", "dequantized"])
def test_a_recipes_backward_override_is_refused_by_name_as_in_te(override):
    module = make(KIND)
    with te.autocast(recipe=te.recipe.Float8CurrentScaling(backward_override=override)):
        with pytest.raises(NotImplementedError, match=f"backward_override='{override}'"):
            module(make_input())
