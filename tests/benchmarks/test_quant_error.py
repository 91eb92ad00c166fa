"""``python -m benchmarks.quant_error``: each recipe's GEMM error against float64.

A quick run at a small size checks what the figure must show whatever the data (bf16
below FP8 below NVFP4; stochastic rounding's mean of draws nearer than one draw, a
deterministic recipe's draws all equal); the doc's table has one row per recipe.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import quant_error  # noqa: E402

MEAN = f"wgrad, mean of {quant_error.DRAWS}"


def _table_rows(text: str) -> dict[str, list[str]]:
    body = text.split(quant_error.BEGIN, 1)[1].split(quant_error.END, 1)[0]
    rows = [line.strip("|").split("|") for line in body.splitlines() if line.startswith("| ")]
    return {cells[0].strip(): [c.strip() for c in cells[1:]] for cells in rows[1:]}


def test_the_doc_table_has_one_row_per_recipe_and_eight_columns():
    rows = _table_rows((ROOT / "docs" / "quantization.md").read_text())
    assert list(rows) == [label for label, _ in quant_error.recipes()]
    assert all(len(cells) == 8 and all("e-" in c for c in cells) for cells in rows.values())
    assert (ROOT / "docs" / "quantization_error.png").stat().st_size > 10_000


@pytest.mark.slow
def test_a_quick_run_orders_the_formats_and_writes_the_table_and_figure(tmp_path):
    doc = tmp_path / "quantization.md"
    doc.write_text(f"before\n{quant_error.BEGIN}\nold\n{quant_error.END}\nafter\n")
    quant_error.main(["--quick", "--out", str(tmp_path)])
    text = doc.read_text()
    assert text.startswith("before\n") and text.endswith("after\n") and "old" not in text
    assert (tmp_path / "quantization_error.png").stat().st_size > 10_000
    rows = {label: [float(c) for c in cells] for label, cells in _table_rows(text).items()}
    labels = list(rows)
    bf16, fp8, nvfp4 = rows[labels[0]], rows[labels[2]], rows[labels[5]]
    for i in range(8):
        assert bf16[i] < fp8[i] < nvfp4[i], (i, bf16[i], fp8[i], nvfp4[i])
    stochastic = {"NVFP4 default: RHT, SR on grads, 2-D weights", "NVFP4, SR on grads only"}
    for label, cells in rows.items():
        for wgrad, mean in ((cells[2], cells[3]), (cells[6], cells[7])):
            if label in stochastic:
                assert mean < wgrad, label
            else:
                assert mean == wgrad, label


def test_a_doc_without_markers_is_refused(tmp_path):
    doc = tmp_path / "quantization.md"
    doc.write_text("no markers here\n")
    with pytest.raises(SystemExit, match="no .* markers"):
        quant_error.write_doc(doc, "table")
