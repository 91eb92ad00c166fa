"""The generated grouped_linear ops: opcheck both ways and fake-vs-real flat layouts,
every recipe x bias, with empty groups."""

from __future__ import annotations

import pytest
import torch
from family_op_cases import (
    RECIPES,
    backward_bundle,
    capture_bundle,
    check_fake_layouts,
    check_opcheck,
)

import transformer_engine_ops as te
from transformer_engine_ops.generated import grouped_linear as g

NAME = "grouped_linear"
FLAT = (g.flatten_grouped_linear_fwd_args, g.flatten_grouped_linear_bwd_args)


def _bundle(recipe="bf16", bias=True, splits=(32, 0, 32), frozen=False):
    module = te.GroupedLinear(3, 64, 32, bias=bias, params_dtype=torch.bfloat16)
    module.requires_grad_(not frozen)
    x = torch.randn(sum(splits), 64).to(torch.bfloat16).requires_grad_(True)
    return capture_bundle(module, x, recipe, list(splits))


CASES = {
    f"{r}-{'bias' if b else 'nobias'}": dict(recipe=r, bias=b) for r in RECIPES for b in (1, 0)
}
CASES.update(
    {
        "one_group_takes_all-fp8_block": dict(recipe="fp8_block", splits=(0, 64, 0)),
        "frozen_weights-mxfp8": dict(recipe="mxfp8", frozen=True),
    }
)


@pytest.mark.parametrize("case", list(CASES))
def test_opcheck(case):
    check_opcheck(g, NAME, *FLAT, _bundle(**CASES[case]))


@pytest.mark.parametrize("case", list(CASES))
def test_fake_layout_matches_real(case):
    check_fake_layouts(g, NAME, *FLAT, _bundle(**CASES[case]))


def test_a_quantizer_list_of_the_wrong_length_is_named():
    fwd = _bundle()
    fwd.input_quantizers = [None, None]
    with pytest.raises(ValueError, match="input_quantizers: expected num_gemms=3 entries"):
        g.grouped_linear_fwd(*FLAT[0](fwd))


@pytest.mark.parametrize(("bias", "count"), [(True, 1 + 3 + 3), (False, 1 + 3 + 1)])
def test_backward_returns_one_gradient_per_weight_and_bias(bias, count):
    bwd = backward_bundle(g, NAME, _bundle(bias=bias))
    with torch.no_grad():
        flat = g.grouped_linear_bwd(*FLAT[1](bwd))
    assert len(flat) == count  # dgrad, one per weight, one per bias (or one absent slot)
