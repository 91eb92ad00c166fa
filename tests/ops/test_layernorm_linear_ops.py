"""The generated layernorm_linear ops: opcheck both ways, fake-vs-real flat layouts,
every recipe x bias, quantized weights, the second output, the quantized output
(``fp8_output``), a cached weight workspace and the recipe's ``backward_override``."""

from __future__ import annotations

import contextlib

import pytest
import torch
from family_op_cases import RECIPES, capture_bundle, check_fake_layouts, check_opcheck

import transformer_engine_ops as te
from transformer_engine_ops.generated import layernorm_linear as g
from transformer_engine_ops.modules.autocast import STATE
from transformer_engine_ops.ops.layernorm_linear import LayerNormLinearFwdArgs

NAME = "layernorm_linear"
FLAT = (g.flatten_layer_norm_linear_fwd_args, g.flatten_layer_norm_linear_bwd_args)


def _bundle(
    recipe="bf16",
    bias=True,
    model_init=False,
    in_features=64,
    fp8_output=False,
    grad=True,
    workspace=False,
    override=None,
    **kwargs,
):
    def build():
        return te.LayerNormLinear(in_features, 32, bias=bias, params_dtype=torch.bfloat16, **kwargs)

    if model_init:
        with te.quantized_model_init(recipe=RECIPES[recipe]()):
            module = build()
    else:
        module = build()
    x = torch.randn(4, 32, in_features).to(torch.bfloat16).requires_grad_(True)
    if workspace:
        return _workspace_bundle(module, x, recipe)
    if override is not None:
        with te.autocast(recipe=RECIPES[recipe](backward_override=override)):
            return LayerNormLinearFwdArgs(**module._op_fields(x, STATE.autocast, None, False))
    with contextlib.nullcontext() if grad else torch.no_grad():
        return capture_bundle(module, x, recipe, None, fp8_output)


def _workspace_bundle(module, x, recipe):
    """The bundle of a later microbatch: the weight workspace the first one cached."""
    with te.autocast(recipe=RECIPES[recipe]()):
        module(x, is_first_microbatch=True)
        fwd = LayerNormLinearFwdArgs(**module._op_fields(x, STATE.autocast, False, False))
    # The forward reads the kept copy by the call's weight quantizer, as here.
    fwd.weight_workspace = module._weight_cache.read(fwd.weight_quantizer)
    assert fwd.weight_workspace is not None
    return fwd


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
        "workspace-fp8_current": dict(recipe="fp8_current", workspace=True),
        "workspace-mxfp8": dict(recipe="mxfp8", workspace=True),
        "high_precision-fp8_current": dict(recipe="fp8_current", override="high_precision"),
        "dequantized-mxfp8": dict(recipe="mxfp8", override="dequantized"),
        "dequantized-nvfp4-quantized_weight": dict(
            recipe="nvfp4", override="dequantized", model_init=True
        ),
        "high_precision-fp8_block-ln_out": dict(
            recipe="fp8_block", override="high_precision", return_layernorm_output=True
        ),
    }
)
CASES.update(
    {f"fp8_output-{r}": dict(recipe=r, fp8_output=True, grad=False) for r in RECIPES if r != "bf16"}
)
CASES["fp8_output-ln_out-fp8_block"] = dict(
    recipe="fp8_block", fp8_output=True, grad=False, return_layernorm_output=True
)
# As for the Linear op: a quantized user output has uint8 buffers, which opcheck's
# autograd tests cannot differentiate; its layout is checked against the fake.
OPCHECK_CASES = [c for c in CASES if not CASES[c].get("fp8_output")]


@pytest.mark.parametrize("case", OPCHECK_CASES)
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


def test_fp8_output_bundle_declares_a_quantized_output():
    fwd = _bundle("mxfp8", fp8_output=True, grad=False)
    assert fwd.fp8_output and fwd.output_quantizer is not None
    (out,), _ = g.layernorm_linear_forward(fwd)
    assert type(out).__name__ == "MXFP8Tensor"
