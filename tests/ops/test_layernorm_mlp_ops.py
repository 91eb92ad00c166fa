"""The generated layernorm_mlp ops: opcheck both ways, fake-vs-real flat layouts,
every recipe x bias, gated activations, quantized weights, frozen stages."""

from __future__ import annotations

import pytest
import torch
from family_op_cases import RECIPES, capture_bundle, check_fake_layouts, check_opcheck

import transformer_engine_ops as te
from transformer_engine_ops.generated import layernorm_mlp as g

NAME = "layernorm_mlp"
FLAT = (g.flatten_layer_norm_mlp_fwd_args, g.flatten_layer_norm_mlp_bwd_args)


def _bundle(recipe="bf16", bias=True, model_init=False, frozen=(), cache=None, **kwargs):
    def build():
        return te.LayerNormMLP(64, 64, bias=bias, params_dtype=torch.bfloat16, **kwargs)

    if model_init:
        with te.quantized_model_init(recipe=RECIPES[recipe]()):
            module = build()
    else:
        module = build()
    for name in frozen:
        getattr(module, name).requires_grad_(False)
    x = torch.randn(2, 32, 64).to(torch.bfloat16).requires_grad_(True)
    fwd = capture_bundle(module, x, recipe)
    if cache is None:
        return fwd
    # Weight caching: the first microbatch quantizes and keeps both weights (cache_weight);
    # a later one reads the kept workspaces instead of quantizing.
    fwd.cache_weight, fwd.is_first_microbatch = True, cache == "first"
    if cache == "later":
        with te.autocast(recipe=RECIPES[recipe]()):
            module(x, is_first_microbatch=True)
        fwd.fc1_weight_workspace = module._fc1_weight_workspace
        fwd.fc2_weight_workspace = module._fc2_weight_workspace
        assert fwd.fc1_weight_workspace is not None and fwd.fc2_weight_workspace is not None
    return fwd


CASES = {
    f"{r}-{'bias' if b else 'nobias'}": dict(recipe=r, bias=b) for r in RECIPES for b in (1, 0)
}
CASES.update(
    {
        "swiglu-ln_out-fp8_current": dict(
            recipe="fp8_current", activation="swiglu", return_layernorm_output=True
        ),
        "srelu-rmsnorm-mxfp8": dict(recipe="mxfp8", activation="srelu", normalization="RMSNorm"),
        "quantized_weights-fp8_block": dict(recipe="fp8_block", model_init=True),
        **{
            f"cached_{when}-{r}": dict(recipe=r, cache=when)
            for when in ("first", "later")
            for r in ("fp8_current", "mxfp8", "nvfp4")
        },
        "cached_later-frozen_fc1-fp8_block": dict(
            recipe="fp8_block", cache="later", frozen=("layer_norm_weight", "fc1_weight")
        ),
        "frozen_fc1-nvfp4": dict(
            recipe="nvfp4", frozen=("layer_norm_weight", "layer_norm_bias", "fc1_weight")
        ),
        # TE's checkpoint: the backward recomputes norm, fc1 and the activation.
        **{f"checkpoint-{r}": dict(recipe=r, checkpoint=True) for r in RECIPES},
        "checkpoint-swiglu-ln_out-mxfp8": dict(
            recipe="mxfp8", activation="swiglu", return_layernorm_output=True, checkpoint=True
        ),
        "checkpoint-cached_first-fp8_current": dict(
            recipe="fp8_current", cache="first", checkpoint=True
        ),
        "checkpoint-cached_later-nvfp4": dict(recipe="nvfp4", cache="later", checkpoint=True),
        "checkpoint-frozen_fc1-fp8_block": dict(
            recipe="fp8_block", frozen=("layer_norm_weight", "fc1_weight"), checkpoint=True
        ),
    }
)


@pytest.mark.parametrize("case", list(CASES))
def test_opcheck(case):
    check_opcheck(g, NAME, *FLAT, _bundle(**CASES[case]))


@pytest.mark.parametrize("case", list(CASES))
def test_fake_layout_matches_real(case):
    check_fake_layouts(g, NAME, *FLAT, _bundle(**CASES[case]))


def test_weights_that_do_not_fit_the_activation_are_named():
    fwd = _bundle(activation="swiglu")
    fwd.activation = "gelu"  # fc1 now has twice the features fc2 takes
    with pytest.raises(ValueError, match="do not fit activation='gelu'"):
        g.layernorm_mlp_fwd(*FLAT[0](fwd))
