"""Golden output for a bundle pair that uses every field kind, and the CLI's tables.

The golden files under golden/ are the generator's exact output for
fixtures/every_kind.py. After an intended change to the generator or its templates,
review the diff and regenerate them with::

    UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/codegen -k golden -p no:cacheprovider
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from codegen_support import EVERY_KIND, REPO_ROOT

from codegen.config import Config
from codegen.model import Kind
from codegen.pipeline import generate

GOLDEN = Path(__file__).resolve().parent / "golden"
META = "str"  # a quantized description crosses as its canonical text
QUANTIZER = "str"  # quantizers and value types cross as their canonical text
GEMM = "str"
NONE = "(none: must be None)"

# The specification the fixture is written against: field -> (kind, schema slots).
EXPECTED_FORWARD = {
    "x": ("tensor", "Tensor x"),
    "maybe_x": ("tensor", "Tensor? maybe_x"),
    "aliased": ("tensor", "Tensor aliased"),
    "forward_ref": ("tensor", "Tensor? forward_ref"),
    "pipe_tensor": ("tensor", "Tensor? pipe_tensor"),
    "xs": ("tensor list", "Tensor[] xs"),
    "w": ("tensor-or-quantized", f"Tensor? w, Tensor[] w__inner, {META} w__meta"),
    "maybe_w": (
        "tensor-or-quantized",
        f"Tensor? maybe_w, Tensor[] maybe_w__inner, {META} maybe_w__meta",
    ),
    "flag": ("scalar", "bool flag"),
    "maybe_flag": ("scalar", "bool? maybe_flag"),
    "count": ("scalar", "SymInt count"),
    "maybe_count": ("scalar", "SymInt? maybe_count"),
    "scale": ("scalar", "float scale"),
    "maybe_scale": ("scalar", "float? maybe_scale"),
    "label": ("scalar", "str label"),
    "maybe_label": ("scalar", "str? maybe_label"),
    "dtype": ("scalar", "ScalarType dtype"),
    "maybe_dtype": ("scalar", "ScalarType? maybe_dtype"),
    "device": ("scalar", "Device device"),
    "maybe_device": ("scalar", "Device? maybe_device"),
    "shape": ("size", "SymInt[] shape"),
    "dims": ("size", "SymInt[] dims"),
    "alias_shape": ("size", "SymInt[] alias_shape"),
    "maybe_shape": ("size", "SymInt[]? maybe_shape"),
    "color": ("enum", "str color"),
    "maybe_color": ("enum", "str? maybe_color"),
    "mode": ("literal", "str mode"),
    "rounding": ("literal", "str? rounding"),
    "quantizer": ("quantizer", f"{QUANTIZER} quantizer"),
    "maybe_quantizer": ("quantizer", f"{QUANTIZER}? maybe_quantizer"),
    "group": ("process group", "str? group"),
    "tp_group": ("process group", "str? tp_group"),
    "gemm": ("value", f"{GEMM} gemm"),
    "maybe_gemm": ("value", f"{GEMM}? maybe_gemm"),
    "anything": ("unsupported", NONE),
    "hook": ("unsupported", NONE),
    "window": ("int tuple", "SymInt[2] window"),
    "maybe_window": ("int tuple", "SymInt[3]? maybe_window"),
    "splits": ("int list", "SymInt[] splits"),
    "maybe_splits": ("int list", "SymInt[]? maybe_splits"),
    "weights": (
        "tensor-or-quantized list",
        f"Tensor?[] weights, Tensor[] weights__inner, {META}[] weights__meta",
    ),
    "maybe_weights": (
        "tensor-or-quantized list",
        f"Tensor?[]? maybe_weights, Tensor[] maybe_weights__inner, {META}[] maybe_weights__meta",
    ),
    "quantizers": ("quantizer list", f"{QUANTIZER}?[] quantizers"),
    "maybe_quantizers": ("quantizer list", f"{QUANTIZER}?[]? maybe_quantizers"),
    "generator": ("unsupported", NONE),
    "extra": ("unsupported", NONE),
    "type": ("scalar", "SymInt type"),
}
EXPECTED_BACKWARD = {
    "grad_outputs": ("tensor list", "Tensor[] grad_outputs"),
    "saved": ("tensor list", "Tensor[]? saved"),
    "maybe_dims": ("size", "SymInt[]? maybe_dims"),
    "color": ("enum", "str color"),
    "gemm": ("value", f"{GEMM} gemm"),
}


@pytest.fixture(scope="module")
def every_kind_files(repo_config: Config) -> dict[str, str]:
    return generate(repo_config, [EVERY_KIND]).files


def _compare_with_golden(text: str, golden: Path) -> None:
    if os.environ.get("UPDATE_GOLDEN") == "1":
        golden.write_text(text, encoding="utf-8")
    assert golden.exists(), f"{golden} is missing: run with UPDATE_GOLDEN=1"
    expected = golden.read_text(encoding="utf-8")
    assert text == expected, f"{golden.name} differs from the generator's output; see docstring"


def test_every_kind_module_matches_golden(every_kind_files: dict[str, str]) -> None:
    _compare_with_golden(
        every_kind_files["transformer_engine_ops/generated/every_kind.py"], GOLDEN / "every_kind.py"
    )


def test_every_kind_schemas_doc_matches_golden(every_kind_files: dict[str, str]) -> None:
    _compare_with_golden(
        every_kind_files["transformer_engine_ops/generated/SCHEMAS.md"],
        GOLDEN / "every_kind.SCHEMAS.md",
    )


def test_fixture_exercises_every_kind() -> None:
    kinds = {kind for kind, _ in (*EXPECTED_FORWARD.values(), *EXPECTED_BACKWARD.values())}
    assert kinds == {kind.value for kind in Kind}


def _explain_rows(out: str) -> dict[str, tuple[str, str]]:
    title, header, *rows = out.splitlines()
    assert re.split(r"\s{2,}", header.strip()) == ["field", "annotation", "kind", "slots"]
    cells = [re.split(r"\s{2,}", row.strip()) for row in rows]
    assert all(len(c) == 4 for c in cells), rows
    names = [c[0] for c in cells]
    assert len(names) == len(set(names)), "one row per field"
    return {c[0]: (c[2], c[3]) for c in cells}


@pytest.mark.parametrize(
    "bundle,expected",
    [("EveryKindFwdArgs", EXPECTED_FORWARD), ("EveryKindBwdArgs", EXPECTED_BACKWARD)],
)
def test_explain_prints_one_row_per_field_with_kind_and_slots(
    cli, bundle: str, expected: dict[str, tuple[str, str]]
) -> None:
    result = cli("--root", str(REPO_ROOT), "--source", EVERY_KIND, "explain", bundle)
    assert result.rc == 0, result.err
    assert result.out.startswith(f"{bundle} ({EVERY_KIND}:")
    rows = _explain_rows(result.out)
    assert list(rows) == list(expected), "rows in source order"
    assert rows == expected


def test_explain_names_the_known_bundles_for_an_unknown_one(cli) -> None:
    result = cli("--root", str(REPO_ROOT), "--source", EVERY_KIND, "explain", "NoSuchArgs")
    assert result.rc == 2
    assert "no bundle named 'NoSuchArgs'" in result.err
    assert "EveryKindBwdArgs, EveryKindFwdArgs" in result.err


def test_explain_spells_annotations_as_written(cli) -> None:
    result = cli("--root", str(REPO_ROOT), "--source", EVERY_KIND, "explain", "EveryKindFwdArgs")
    annotations = {
        line.split()[0]: re.split(r"\s{2,}", line.strip())[1]
        for line in result.out.splitlines()[2:]
    }
    assert annotations["dims"] == "Tuple[int, ...]"
    assert annotations["alias_shape"] == "Tuple[int, ...]"
    assert annotations["pipe_tensor"] == "Tensor | None"
    assert annotations["mode"] == "Literal['fast', 'exact']"


def test_kinds_prints_the_kind_table(cli) -> None:
    result = cli("kinds")
    assert result.rc == 0
    header, rule, *rows = result.out.splitlines()
    assert header == "| annotation | kind | schema slots | crossing | gradient |"
    assert rule == "|---|---|---|---|---|"
    cells = [[c.strip() for c in row.strip("|").split(" | ")] for row in rows]
    assert all(len(c) == 5 for c in cells), rows
    assert {c[1] for c in cells} == {kind.value for kind in Kind}
    slots = [(c[1], c[2]) for c in cells]
    assert ("process group", "`str?`") in slots
    assert ("scalar", "`bool`, `SymInt`, `float`, `str` (+`?`)") in slots
    gradients = {c[1]: c[4] for c in cells}
    assert gradients["tensor"] == "one gradient"
    assert gradients["tensor list"] == "one gradient per element"
    assert gradients["scalar"] == "never"


def test_documented_kind_table_is_the_generated_one(cli) -> None:
    doc = (REPO_ROOT / "docs" / "codegen.md").read_text(encoding="utf-8")
    table = cli("kinds").out
    assert table in doc, "docs/codegen.md's kind table differs from `python -m codegen kinds`"


def test_kinds_needs_no_project(cli, tmp_path: Path) -> None:
    assert cli("--root", str(tmp_path / "nowhere"), "kinds").rc == 0
