"""The generated grouped_linear ops: opcheck both ways and fake-vs-real flat layouts,
every recipe x bias, with empty groups, microbatches making or reusing the cached
weight workspaces, and the recipe's ``backward_override``."""

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
from transformer_engine_ops.ops.linear import BackwardOverride

NAME = "grouped_linear"
FLAT = (g.flatten_grouped_linear_fwd_args, g.flatten_grouped_linear_bwd_args)


def _bundle(
    recipe="bf16", bias=True, splits=(32, 0, 32), frozen=False, caching=None, override=None
):
    """A captured forward bundle; ``caching``: ``"first"`` (a microbatch making the
    weight workspaces) or ``"later"`` (one reusing the workspaces a first one made);
    ``override``: the recipe's ``backward_override``."""
    module = te.GroupedLinear(3, 64, 32, bias=bias, params_dtype=torch.bfloat16)
    module._grouped_gemm_serves = lambda *args: False  # the loop op's bundle
    module.requires_grad_(not frozen)
    x = torch.randn(sum(splits), 64).to(torch.bfloat16).requires_grad_(True)
    fwd = capture_bundle(module, x, recipe, list(splits))
    if override is not None:
        fwd = dataclasses.replace(fwd, backward_override=BackwardOverride(override))
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
        "high_precision-fp8_current": dict(recipe="fp8_current", override="high_precision"),
        "dequantized-mxfp8": dict(recipe="mxfp8", override="dequantized"),
        "dequantized-cache_later-fp8_block": dict(
            recipe="fp8_block", override="dequantized", caching="later"
        ),
        "high_precision-cache_first-nvfp4": dict(
            recipe="nvfp4", override="high_precision", caching="first"
        ),
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


def test_only_the_grouped_ops_are_kept_out_of_cuda_graphs():
    """Their kernels read ``m_splits`` on the host: a CUDA graph would replay the row
    split it captured for every later ``m_splits`` (and under ``mode="reduce-overhead"``
    the host-side tensor would flow through a graph). The declaration's reason tags both
    ops; Inductor partitions its CUDA graphs around them. Other ops stay capturable."""
    from transformer_engine_ops.generated import linear as lin

    for op in (g.grouped_linear_fwd, g.grouped_linear_bwd):
        assert torch.Tag.cudagraph_unsafe in op.tags, op
    assert "m_splits" in g.CUDAGRAPH_UNSAFE
    for op in (lin.linear_fwd, lin.linear_bwd):
        assert torch.Tag.cudagraph_unsafe not in op.tags, op
