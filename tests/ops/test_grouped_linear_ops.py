"""The generated grouped_linear ops: opcheck both ways and fake-vs-real flat layouts,
every recipe x bias, with empty groups, and microbatches making or reusing the cached
weight workspaces."""

from __future__ import annotations

import dataclasses

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
from transformer_engine_ops.ops.grouped_linear import grouped_linear_forward

NAME = "grouped_linear"
FLAT = (g.flatten_grouped_linear_fwd_args, g.flatten_grouped_linear_bwd_args)


def _bundle(recipe="bf16", bias=True, splits=(32, 0, 32), frozen=False, caching=None):
    """A captured forward bundle; ``caching``: ``"first"`` (a microbatch making the
    weight workspaces) or ``"later"`` (one reusing the workspaces a first one made)."""
    module = te.GroupedLinear(3, 64, 32, bias=bias, params_dtype=torch.bfloat16)
    module.requires_grad_(not frozen)
    x = torch.randn(sum(splits), 64).to(torch.bfloat16).requires_grad_(True)
    fwd = capture_bundle(module, x, recipe, list(splits))
    if caching is None:
        return fwd
    first = dataclasses.replace(fwd, is_first_microbatch=True, cache_weight=True)
    if caching == "first":
        return first
    with torch.no_grad():
        _, made = grouped_linear_forward(first)
    assert all(m is not None for m in made)
    return dataclasses.replace(first, is_first_microbatch=False, weight_workspaces=list(made))


CASES = {
    f"{r}-{'bias' if b else 'nobias'}": dict(recipe=r, bias=b) for r in RECIPES for b in (1, 0)
}
CASES.update(
    {
        "one_group_takes_all-fp8_block": dict(recipe="fp8_block", splits=(0, 64, 0)),
        "frozen_weights-mxfp8": dict(recipe="mxfp8", frozen=True),
        "cache_first-fp8_current": dict(recipe="fp8_current", caching="first"),
        "cache_later-mxfp8": dict(recipe="mxfp8", caching="later"),
        "cache_later-nvfp4-nobias": dict(recipe="nvfp4", bias=False, caching="later"),
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
