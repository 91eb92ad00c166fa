"""`make demo`'s check, for its transformer-style block in bf16 and FP8 current scaling
on Inductor (its plain op calls lowered), and bf16 with every op call kept as a node:
every SGD step compiled equal to eager bit for bit (output, input and parameter
gradients), zero graph breaks, one graph; bf16 also at every vector width Inductor can
generate here and with scalar code (tests/modules/inductor_widths.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from inductor_widths import inductor_width, width_params

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "demo"))
import linear_demo  # noqa: E402, I001


def _check(name: str, backend: object) -> None:
    recipe = dict(linear_demo.RECIPES).get(name)
    result = linear_demo.run("block", linear_demo.Block, name, recipe, backend)
    assert result["breaks"] == 0 and result["compiles"] == 1
    assert result["out_diff"] == 0 and result["grad_diff"] == 0


@pytest.mark.parametrize("width", width_params())
def test_demo_block_bf16_compiles_bit_identical_to_eager(width: int | None) -> None:
    with inductor_width(width):
        _check("bf16", linear_demo.BACKEND)


def test_demo_block_fp8_compiles_bit_identical_to_eager() -> None:
    _check("Float8CurrentScaling", linear_demo.BACKEND)


def test_demo_block_op_nodes_compile_bit_identical_to_eager() -> None:
    _check(linear_demo.OP_NODES, linear_demo.inductor_backend(lowering="off"))
