"""The generated layernorm_linear ops: opcheck both ways, fake-vs-real flat layouts,
every recipe x bias, quantized weights, the second output."""

from __future__ import annotations

import pytest
import torch
from family_op_cases import RECIPES, capture_bundle, check_fake_layouts, check_opcheck

import transformer_engine_ops as te
from transformer_engine_ops.generated import layernorm_linear as g

NAME = "layernorm_linear"
FLAT = (g.flatten_layer_norm_linear_fwd_args, g.flatten_layer_norm_linear_bwd_args)


def _bundle(recipe="bf16", bias=True, model_init=False, in_features=64, **kwargs):
    def build():
        return te.LayerNormLinear(in_features, 32, bias=bias, params_dtype=torch.bfloat16, **kwargs)

    if model_init:
        with te.quantized_model_init(recipe=RECIPES[recipe]()):
            module = build()
    else:
        module = build()
    x = torch.randn(4, 32, in_features).to(torch.bfloat16).requires_grad_(True)
    return capture_bundle(module, x, recipe)


CASES = {
    f"{r}-{'bias' if b else 'nobias'}": dict(recipe=r, bias=b) for r in RECIPES for b in (1, 0)
}
CASES.update(
    {
        "rmsnorm-ln_out-mxfp8": dict(
            recipe="mxfp8", normalization="RMSNorm", return_layernorm_output=True
        ),
        "ln_out-bf16": dict(return_layernorm_output=True),
        "k256-fp8_block": dict(recipe="fp8_block", in_features=256),
        "quantized_weight-nvfp4": dict(recipe="nvfp4", model_init=True),
    }
)


@pytest.mark.parametrize("case", list(CASES))
def test_opcheck(case):
    check_opcheck(g, NAME, *FLAT, _bundle(**CASES[case]))


@pytest.mark.parametrize("case", list(CASES))
def test_fake_layout_matches_real(case):
    check_fake_layouts(g, NAME, *FLAT, _bundle(**CASES[case]))


def test_weight_that_does_not_fit_the_input_is_named():
    fwd = _bundle()
    fwd.weight = torch.zeros(32, 48, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="expected \\(out_features, 64\\)"):
        g.layernorm_linear_fwd(*FLAT[0](fwd))
