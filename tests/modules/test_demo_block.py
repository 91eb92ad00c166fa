"""`make demo`'s check, for its transformer-style block in bf16 and FP8 current scaling
on Inductor: every SGD step compiled equal to eager bit for bit (output, input and
parameter gradients), zero graph breaks, one graph."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "demo"))
import linear_demo  # noqa: E402


@pytest.mark.parametrize("name", ["bf16", "Float8CurrentScaling"])
def test_demo_block_compiles_bit_identical_to_eager(name):
    recipe = dict(linear_demo.RECIPES)[name]
    result = linear_demo.run("block", linear_demo.Block, name, recipe)
    assert result["breaks"] == 0 and result["compiles"] == 1
    assert result["out_diff"] == 0 and result["grad_diff"] == 0
