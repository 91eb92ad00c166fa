"""`make demo`'s GPT (two ``te.TransformerLayer``), bf16 on Inductor: every AdamW step
compiled equal to eager bit for bit (logits, loss, every gradient), zero graph breaks,
one graph; at each vector width Inductor can generate here and with scalar code, so the
claim holds on every host whatever ISA ATen's kernels use (tests/modules/inductor_widths.py).
The other recipes run in ``make demo``."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from inductor_widths import inductor_width, width_params

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "demo"))
import gpt_demo  # noqa: E402, I001


@pytest.mark.slow
@pytest.mark.parametrize("width", width_params())
def test_demo_gpt_compiles_bit_identical_to_eager(width: int | None) -> None:
    with inductor_width(width):
        result = gpt_demo.run("bf16", None)
    assert result["breaks"] == 0 and result["compiles"] == 1
    assert result["out_diff"] == 0 and result["grad_diff"] == 0
    assert result["last_loss"] < result["first_loss"]
