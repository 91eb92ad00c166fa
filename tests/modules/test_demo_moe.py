"""`make demo`'s MoE layer (router, permute, two GroupedLinear with SwiGLU, unpermute)
bf16 and FP8 current scaling on Inductor: every AdamW step compiled equal to eager bit
for bit (output, loss, every gradient) over changing routings, zero graph breaks, one
graph; at each vector width Inductor can generate here and with scalar code
(tests/modules/inductor_widths.py). FP8 block scaling (the per-expert loop) runs in
``make demo``."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from inductor_widths import inductor_width, width_params

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "demo"))
import moe_demo  # noqa: E402, I001


@pytest.mark.slow
@pytest.mark.parametrize("width", width_params())
@pytest.mark.parametrize("name", ["bf16", "Float8CurrentScaling"])
def test_demo_moe_compiles_bit_identical_to_eager(name: str, width: int | None) -> None:
    recipe = dict(moe_demo.RECIPES)[name]
    with inductor_width(width):
        result = moe_demo.run(name, recipe)
    assert result["breaks"] == 0 and result["compiles"] == 1
    assert result["routings"] > 1  # the routing changed between steps: one graph served all
    assert result["out_diff"] == 0 and result["grad_diff"] == 0
    assert result["last_loss"] < result["first_loss"]
