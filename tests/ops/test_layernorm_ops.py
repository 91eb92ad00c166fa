"""The generated layernorm ops: opcheck both ways and fake-vs-real flat layouts."""

from __future__ import annotations

import pytest
import torch
from family_op_cases import capture_bundle, check_fake_layouts, check_opcheck

import transformer_engine_ops as te
from transformer_engine_ops.generated import layernorm as g

NAME = "layernorm"
FLAT = (g.flatten_layer_norm_fwd_args, g.flatten_layer_norm_bwd_args)


def _bundle(cls, requires_grad=True, grad_enabled=True, **kwargs):
    module = cls(64, params_dtype=torch.bfloat16, **kwargs)
    module.requires_grad_(requires_grad)
    x = torch.randn(4, 8, 64).to(torch.bfloat16).requires_grad_(requires_grad)
    with torch.set_grad_enabled(grad_enabled):
        return capture_bundle(module, x, "bf16")


CASES = {
    "layernorm": dict(cls=te.LayerNorm),
    "rmsnorm": dict(cls=te.RMSNorm),
    "layernorm-zero_centered": dict(cls=te.LayerNorm, zero_centered_gamma=True),
    "layernorm-frozen": dict(cls=te.LayerNorm, requires_grad=False),
    "rmsnorm-no_grad": dict(cls=te.RMSNorm, grad_enabled=False),
}


@pytest.mark.parametrize("case", list(CASES))
def test_opcheck(case):
    fwd = _bundle(**CASES[case])
    if fwd.is_grad_enabled and (fwd.input_requires_grad or fwd.weight_requires_grad):
        check_opcheck(g, NAME, *FLAT, fwd)
    else:
        torch.library.opcheck(g.layernorm_fwd, FLAT[0](fwd))


@pytest.mark.parametrize("case", ["layernorm", "rmsnorm", "layernorm-zero_centered"])
def test_fake_layout_matches_real(case):
    check_fake_layouts(g, NAME, *FLAT, _bundle(**CASES[case]))


def test_rmsnorm_with_a_bias_is_refused_by_the_kernel():
    fwd = _bundle(te.RMSNorm)
    fwd.bias = torch.zeros(64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="LayerNormFwdArgs.bias: RMSNorm has no bias"):
        g.layernorm_fwd(*FLAT[0](fwd))


def test_a_wrong_normalization_is_refused_at_flatten():
    fwd = _bundle(te.LayerNorm)
    fwd.normalization = "BatchNorm"
    with pytest.raises(ValueError, match="LayerNormFwdArgs.normalization"):
        FLAT[0](fwd)
