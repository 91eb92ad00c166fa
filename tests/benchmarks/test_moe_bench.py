"""The MoE bench (``benchmarks/moe.py``) runs at tiny sizes on the CPU: its three bf16
layers (ours, the per-expert loop, the hand-written ``torch._grouped_mm`` layer) compute
the same output from the same weights, every contender is timed, and the report renders
its rows. Its numbers are not checked."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import moe  # noqa: E402


def _layers():
    cfg = moe.QUICK
    ours = moe._layer(cfg, "cpu")
    x = torch.randn(cfg["tokens"], cfg["hidden"]).to(torch.bfloat16)
    return ours, moe.LoopLayer(ours), moe.GroupedMMLayer(ours), x


def test_the_three_bf16_layers_compute_the_same_output():
    ours, loop, grouped, x = _layers()
    splits = ours.route(x)[1].sum(0).tolist()
    assert moe._check_same_layer(ours, loop, grouped, x, splits) <= 0.05 * ours(x).abs().max()


def test_the_layers_have_the_same_gradients():
    ours, loop, grouped, x = _layers()
    splits = ours.route(x)[1].sum(0).tolist()
    grads = []
    for layer, args in ((ours, ()), (loop, (splits,)), (grouped, ())):
        xi = x.detach().clone().requires_grad_(True)
        layer(xi, *args).float().square().sum().backward()
        grads.append(xi.grad.float())
    scale = grads[0].abs().max().item()
    for g in grads[1:]:
        assert (g - grads[0]).abs().max().item() <= 0.05 * scale


@pytest.mark.slow
def test_quick_run_times_every_contender_and_reports():
    results = moe.run(quick=True, device="cpu")
    train = results["train_step"]
    assert set(train["seconds"]) == {
        "ours_bf16",
        "ours_bf16_per_expert_weights",
        "ours_fp8_current",
        "ours_fp8_block",
        "loop_bf16",
        "grouped_mm_bf16",
    }
    rows = moe.report_targets(results)
    assert len(rows) == len(moe.GOALS) + 2
    assert any("MoE layer train step" in line for line in moe.report_lines(results))
