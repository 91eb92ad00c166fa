"""Malformed op modules give one positioned error with a hint, and write nothing.

Each file in corpus/ is one malformed op module whose first line states the expected
report: ``# expect: LINE:COL message fragment``. Files starting with ``_`` are valid
helpers that a case reads alongside (see ``EXTRA_SOURCES``).

``TREE_CASES`` are the malformed inputs that are not one file's text: unsafe settings
(``output_dir``, ``namespace``), odd or colliding source paths, symlinks planted in or
around the output folder. Each is run as generate, ``--check`` and ``--diff``; every run
must report the setting or the ``path:line:col``, and leave the temporary root *and its
parent* byte-identical (files, folders and symlinks alike).
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from codegen_support import (
    CORPUS,
    LINEAR,
    OPS_DIR,
    OUTPUT_DIR,
    REPO_ROOT,
    copy_essentials,
    snapshot,
    subprocess_env,
)

from codegen.bundle_reader import MAX_SCHEMA_ARGUMENTS
from codegen.errors import CodegenError
from codegen.model import SourceModule
from codegen.pipeline import generate
from codegen.reader import read_source
from codegen.safety import check_generated_names

EXPECT = re.compile(r"^# expect: (?P<line>\d+):(?P<col>\d+) (?P<fragment>.+)$")
# Cases that need a second module: the error is reported in the case's own file.
EXTRA_SOURCES = {"duplicate_op_name.py": ("_duplicate_op_support.py",)}


@dataclass(frozen=True)
class Case:
    name: str
    line: int
    col: int
    fragment: str

    @property
    def source(self) -> str:
        return f"{CORPUS}/{self.name}"

    def argv(self) -> list[str]:
        extra = [f"{CORPUS}/{name}" for name in EXTRA_SOURCES.get(self.name, ())]
        return [arg for rel in (self.source, *extra) for arg in ("--source", rel)]


def _cases() -> list[Case]:
    cases = []
    for path in sorted((REPO_ROOT / CORPUS).glob("*.py")):
        if path.name.startswith("_"):
            continue
        first = path.read_bytes().split(b"\n", 1)[0].decode("utf-8")  # a case may be Latin-1
        match = EXPECT.match(first)
        assert match, f"{path.name}: first line must be `# expect: LINE:COL fragment`"
        cases.append(
            Case(path.name, int(match["line"]), int(match["col"]), match["fragment"].strip())
        )
    return cases


CASES = _cases()


def _assert_reported(case: Case, rc: int, out: str, err: str) -> None:
    assert rc == 1, (rc, out, err)
    assert "Traceback" not in out + err
    lines = err.splitlines()
    position = f"{re.escape(case.source)}:{case.line}:{case.col}"
    assert re.match(rf"^{position}: error: ", lines[0]), err
    assert case.fragment in lines[0], err
    assert re.match(r"^  hint: \S", lines[1]), err


@pytest.fixture(scope="module")
def corpus_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A repo copy holding the corpus at its repo-relative path, so reports name it alike."""
    root = copy_essentials(tmp_path_factory.mktemp("corpus") / "root")
    shutil.copytree(REPO_ROOT / CORPUS, root / CORPUS)
    return root


def test_corpus_is_large_enough() -> None:
    assert len(CASES) >= 18
    assert len({(c.line, c.col, c.fragment) for c in CASES}) >= 18


@pytest.mark.parametrize("case", CASES, ids=[c.name.removesuffix(".py") for c in CASES])
def test_malformed_module_is_reported_at_its_position(case: Case, corpus_root: Path, cli) -> None:
    ours_before = snapshot(corpus_root.parent)  # the root and everything beside it
    repo_before = snapshot(REPO_ROOT / OUTPUT_DIR)

    result = cli("--root", str(corpus_root), *case.argv())

    _assert_reported(case, result.rc, result.out, result.err)
    assert "nothing was written" in result.err
    assert snapshot(corpus_root.parent) == ours_before
    assert snapshot(REPO_ROOT / OUTPUT_DIR) == repo_before


@pytest.mark.parametrize("name", ["syntax_error.py", "mixed_union_pipe.py"])
def test_malformed_module_fails_end_to_end_without_traceback(name: str) -> None:
    """`python -m codegen` on the real repo: exit code, stderr, generated/ untouched."""
    (case,) = [c for c in CASES if c.name == name]
    before = snapshot(REPO_ROOT / OUTPUT_DIR)

    result = subprocess.run(
        [sys.executable, "-m", "codegen", "--root", str(REPO_ROOT), *case.argv()],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        env=subprocess_env(),
        timeout=120,
    )

    _assert_reported(case, result.returncode, result.stdout, result.stderr)
    assert snapshot(REPO_ROOT / OUTPUT_DIR) == before


def test_corpus_helper_modules_are_valid(corpus_root: Path, cli) -> None:
    """The helpers fail nothing on their own, so a case's error is the case's."""
    for helper in sorted((corpus_root / CORPUS).glob("_*.py")):
        result = cli("--root", str(corpus_root), "--diff", "--source", f"{CORPUS}/{helper.name}")
        assert result.rc == 0, result.err


# --- cases that are a tree, not one file's text -------------------------------------------

VALID_OP = f"{CORPUS}/_duplicate_op_support.py"  # a small valid op module
SETTINGS = re.escape("pyproject.toml: [tool.transformer_engine_ops.codegen] ")


@dataclass(frozen=True)
class TreeCase:
    """``setup(root)`` plants the bad input and returns extra argv; ``report`` is a regex
    for the first stderr line (``{root}`` and ``{outer}`` are filled in, escaped)."""

    name: str
    setup: Callable[[Path], list[str]]
    rc: int
    report: str


def _set(key: str, value: str) -> Callable[[Path], list[str]]:
    def setup(root: Path) -> list[str]:
        path = root / "pyproject.toml"
        text = path.read_text(encoding="utf-8")
        text, n = re.subn(rf"(?m)^{key} = .*$", lambda _: f"{key} = {json.dumps(value)}", text)
        assert n == 1, key
        path.write_text(text, encoding="utf-8")
        return []

    return setup


def _edit(pattern: str, replacement: str) -> Callable[[Path], list[str]]:
    """Replace the one match of ``pattern`` (multiline) in pyproject.toml."""

    def setup(root: Path) -> list[str]:
        path = root / "pyproject.toml"
        text, n = re.subn(
            pattern, lambda _: replacement, path.read_text(encoding="utf-8"), flags=re.M | re.S
        )
        assert n == 1, pattern
        path.write_text(text, encoding="utf-8")
        return []

    return setup


_SOURCES_LIST = r"^sources = \[.*?\]$"
_KINDS_TABLE = r"^\[tool\.transformer_engine_ops\.codegen\.kinds\].*\Z"
_CODEGEN_TABLES = r"^\[tool\.transformer_engine_ops\.codegen\].*\Z"


def _then(*steps: Callable[[Path], list[str]]) -> Callable[[Path], list[str]]:
    return lambda root: [arg for step in steps for arg in step(root)]


def _symlink(rel: str, target: str) -> Callable[[Path], list[str]]:
    """``root/rel`` -> ``target`` (relative to ``root/rel``'s folder), replacing a file."""

    def setup(root: Path) -> list[str]:
        link = root / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.exists():
            link.unlink()
        link.symlink_to(target)
        return []

    return setup


def _plant(rel: str) -> Callable[[Path], list[str]]:
    """A valid op module copied to ``rel``, not passed on the command line."""

    def setup(root: Path) -> list[str]:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO_ROOT / VALID_OP, root / rel)
        return []

    return setup


# The op modules listed one by one, as this project's pyproject.toml did before patterns.
def _generated_modules() -> tuple[str, ...]:
    """Every op module this project generates from, by name: ``MODULES`` of the
    checked-in ``generated/__init__.py``, read as text (so a new op module is listed)."""
    text = (REPO_ROOT / "transformer_engine_ops/generated/__init__.py").read_text()
    (node,) = [
        n.value
        for n in ast.parse(text).body
        if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", None) == "MODULES"
    ]
    return tuple(ast.literal_eval(node))


_LISTED = "sources = [" + ", ".join(f'"{OPS_DIR}/{name}.py"' for name in _generated_modules()) + "]"


def _source(rel: str) -> Callable[[Path], list[str]]:
    """A valid op module copied to ``rel`` (relative to the root), passed as ``--source``."""

    def setup(root: Path) -> list[str]:
        path = root / rel
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(REPO_ROOT / VALID_OP, path)
        return ["--source", rel]

    return setup


def _te_layout(runtime: str, value_bundle_type: str = "pkg.runtime.Bundle") -> Callable:
    """A `te_layout` table (TE-layout output for every op module) in pyproject.toml."""

    def setup(root: Path) -> list[str]:
        path = root / "pyproject.toml"
        table = (
            "\n[tool.transformer_engine_ops.codegen.te_layout]\n"
            f"runtime = {json.dumps(runtime)}\n"
            f"value_bundle_type = {json.dumps(value_bundle_type)}\n"
        )
        path.write_text(path.read_text(encoding="utf-8") + table, encoding="utf-8")
        return []

    return setup


def _configured_op(name: str) -> Callable[[Path], list[str]]:
    """An op declared in the configuration (`ops`), for a source a pattern selects."""

    def setup(root: Path) -> list[str]:
        path = root / "pyproject.toml"
        table = (
            "\n[[tool.transformer_engine_ops.codegen.ops]]\n"
            f'source = "{OPS_DIR}/_fused.py"\n'
            f"name = {json.dumps(name)}\n"
            'forward = "FwdArgs"\nbackward = "BwdArgs"\ngrad_fields = []\n'
        )
        text = path.read_text(encoding="utf-8")
        anchor = "[tool.transformer_engine_ops.codegen.kinds]"
        path.write_text(text.replace(anchor, table.lstrip("\n") + "\n" + anchor), "utf-8")
        return []

    return setup


def _setting(key: str, value: object, problem: str) -> str:
    return rf"^error: .*{SETTINGS}{re.escape(key)} = {re.escape(json.dumps(value, ensure_ascii=False))}: {problem}"


def _at(path: str, problem: str) -> str:
    return rf"^{re.escape(path)}:1:1: error: {problem}"


def _hand_written(rel: str, text: str = "HAND_WRITTEN = True\n") -> Callable[[Path], list[str]]:
    def setup(root: Path) -> list[str]:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text, encoding="utf-8")
        return []

    return setup


OUTSIDE_OP = "../outside_op.py"
TREE_CASES = [
    # output_dir: outside the root, absolute, through a symlink, onto or around a source.
    TreeCase(
        "output_dir_climbs_out",
        _set("output_dir", "../escaped"),
        2,
        _setting("output_dir", "../escaped", "climbs out of the project root"),
    ),
    TreeCase(
        "output_dir_climbs_out_midway",
        _set("output_dir", "transformer_engine_ops/../../escaped"),
        2,
        _setting("output_dir", "transformer_engine_ops/../../escaped", "climbs out"),
    ),
    TreeCase(
        "output_dir_absolute",
        _set("output_dir", "/tmp/codegen_escaped"),
        2,
        _setting("output_dir", "/tmp/codegen_escaped", "an absolute path"),
    ),
    TreeCase(
        "output_dir_is_the_source_folder",
        _set("output_dir", "transformer_engine_ops/ops"),
        2,
        _setting(
            "output_dir",
            "transformer_engine_ops/ops",
            r"holds the op module transformer_engine_ops/ops/\w+\.py",
        ),
    ),
    TreeCase(
        "output_dir_contains_the_source_folder",
        _set("output_dir", "transformer_engine_ops"),
        2,
        _setting("output_dir", "transformer_engine_ops", "holds the op module"),
    ),
    TreeCase(
        "output_dir_is_the_root",
        _set("output_dir", "."),
        2,
        _setting("output_dir", ".", "the folder name"),
    ),
    TreeCase(
        "output_dir_not_an_identifier",
        _set("output_dir", "gen-out"),
        2,
        _setting("output_dir", "gen-out", 'the folder name "gen-out" is not an identifier'),
    ),
    TreeCase(
        "output_dir_is_a_symlink_out_of_the_root",
        _then(_symlink("gen", "../elsewhere"), _set("output_dir", "gen")),
        2,
        _setting("output_dir", "gen", re.escape("passes through the symlink gen -> ../elsewhere")),
    ),
    TreeCase(
        "output_dir_under_a_symlinked_folder",
        _then(_symlink("pkg", "../elsewhere"), _set("output_dir", "pkg/generated")),
        2,
        _setting("output_dir", "pkg/generated", "passes through the symlink pkg -> "),
    ),
    TreeCase(
        "output_dir_onto_hand_written_code",
        _then(
            _hand_written("transformer_engine_ops/runtime/__init__.py"),
            _set("output_dir", "transformer_engine_ops/runtime"),
        ),
        2,
        r"^error: transformer_engine_ops/runtime/__init__\.py exists and is not generated",
    ),
    # The atomic write never goes through a symlink at the target.
    TreeCase(
        "generated_file_is_a_symlink",
        _symlink(f"{OUTPUT_DIR}/linear.py", "../../../outside.txt"),
        2,
        rf"^error: {re.escape(OUTPUT_DIR)}/linear\.py is a symlink",
    ),
    # namespace: pasted into op names in generated code.
    TreeCase(
        "namespace_with_a_dash",
        _set("namespace", "te-ops"),
        2,
        _setting("namespace", "te-ops", "not an identifier"),
    ),
    TreeCase(
        "namespace_injection",
        _set("namespace", 'teops", __import__("os").system("touch M"), "'),
        2,
        _setting("namespace", 'teops", __import__("os").system("touch M"), "', "not an identifier"),
    ),
    TreeCase(
        "namespace_not_ascii",
        _set("namespace", "téops"),
        2,
        _setting("namespace", "téops", "not an identifier"),
    ),
    # Settings of the wrong TOML type: an error naming the key, never a traceback, and
    # never a string split into characters.
    TreeCase(
        "sources_a_string",
        _edit(_SOURCES_LIST, 'sources = "transformer_engine_ops/ops/linear.py"'),
        2,
        r"^error: .*pyproject\.toml: \[tool\.transformer_engine_ops\.codegen\] sources must be "
        r'a list, got "transformer_engine_ops/ops/linear\.py" \(a string\)',
    ),
    TreeCase(
        "kinds_a_string",
        _then(
            _edit(_KINDS_TABLE, ""),
            _edit(r"^meta_type = .*?$", 'meta_type = "str"\nkinds = "quantizer"'),
        ),
        2,
        r"^error: .*\] kinds must be a table, got \"quantizer\" \(a string\)",
    ),
    TreeCase(
        "kinds_entry_a_number",
        _edit(r"^quantizer = \[.*?\]$", "quantizer = 5"),
        2,
        r"^error: .*\] kinds\.quantizer must be a list, got 5 \(an? integer\)",
    ),
    TreeCase(
        "kinds_entry_a_string",
        _edit(r"^quantizer = \[.*?\]$", 'quantizer = "pkg.Quantizer"'),
        2,
        r'^error: .*\] kinds\.quantizer must be a list, got "pkg\.Quantizer" \(a string\)',
    ),
    TreeCase(
        "codegen_table_a_string",
        _edit(_CODEGEN_TABLES, '[tool.transformer_engine_ops]\ncodegen = "x"\n'),
        2,
        r"^error: .*pyproject\.toml: tool\.transformer_engine_ops\.codegen must be a table "
        r'\(\[tool\.transformer_engine_ops\.codegen\]\), got "x" \(a string\)',
    ),
    # Op modules no entry of `sources` selects: reported, never silently skipped.
    TreeCase(
        "op_module_not_listed_in_sources",
        _then(_edit(_SOURCES_LIST, _LISTED), _plant(f"{OPS_DIR}/new_op.py")),
        1,
        rf"^{re.escape(OPS_DIR)}/new_op\.py:23:1: error: this module declares an op, but no "
        "entry of `sources` selects it",
    ),
    TreeCase(
        "sources_empty",  # would remove every generated file as stale
        _edit(_SOURCES_LIST, "sources = []"),
        2,
        _setting("sources", [], "lists no op module"),
    ),
    TreeCase(
        "source_pattern_selects_no_op_module",
        _edit(_SOURCES_LIST, 'sources = ["transformer_engine_ops/runtime/*.py"]'),
        1,
        _at(
            "transformer_engine_ops/runtime/*.py",
            re.escape("this pattern in `sources` matches no module that declares an op"),
        ),
    ),
    TreeCase(
        "source_pattern_climbs_out",
        _edit(_SOURCES_LIST, 'sources = ["../*.py"]'),
        1,
        _at("../*.py", "a pattern in `sources` must stay inside the project root"),
    ),
    TreeCase(
        "namespace_a_keyword",
        _set("namespace", "class"),
        2,
        _setting("namespace", "class", "not an identifier"),
    ),
    # te_layout: `runtime` is pasted into an import line of each TE-layout module,
    # `value_bundle_type` into its schema string literals (a keyword there ended in
    # "ruff could not format the generated code (a template bug)" with no detail).
    TreeCase(
        "te_layout_runtime_of_keywords",
        _te_layout("class.import"),
        2,
        _setting("te_layout.runtime", "class.import", "not a module's dotted name"),
    ),
    TreeCase(
        "te_layout_runtime_one_name",
        _te_layout("custom_op"),
        2,
        _setting("te_layout.runtime", "custom_op", "not a module's dotted name"),
    ),
    TreeCase(
        "te_layout_runtime_injection",
        _te_layout("os import system; system('touch M'); from x.y"),
        2,
        _setting(
            "te_layout.runtime",
            "os import system; system('touch M'); from x.y",
            "not a module's dotted name",
        ),
    ),
    TreeCase(
        "te_layout_value_bundle_type_a_keyword",
        _te_layout("pkg.runtime", "pkg.None"),
        2,
        _setting("te_layout.value_bundle_type", "pkg.None", "not a dotted name of identifiers"),
    ),
    TreeCase(
        "te_layout_value_bundle_type_with_a_quote",
        _te_layout("pkg.runtime", 'Bundle", "x'),
        2,
        _setting("te_layout.value_bundle_type", 'Bundle", "x', "not a dotted name of identifiers"),
    ),
    # ops: a configured op's name makes its registered and generated names.
    TreeCase(
        "configured_op_name_a_keyword",
        _configured_op("class"),
        2,
        _setting("ops[0].name", "class", "not an identifier"),
    ),
    TreeCase(
        "configured_op_name_not_ascii",
        _configured_op("línear"),
        2,
        _setting("ops[0].name", "línear", "not an identifier"),
    ),
    # Source paths: they become a module name, an output file name and header text.
    TreeCase(
        "source_file_name_with_a_dash",
        _source("ops_extra/my-op.py"),
        1,
        _at("ops_extra/my-op.py", '"my-op" in the op module\'s path is not an identifier'),
    ),
    TreeCase(
        "source_file_name_with_a_space",
        _source("ops_extra/my op.py"),
        1,
        _at("ops_extra/my op.py", '"my op" in the op module\'s path is not an identifier'),
    ),
    TreeCase(
        "source_file_name_not_ascii",
        _source("ops_extra/línear.py"),
        1,
        _at("ops_extra/línear.py", '"línear" in the op module\'s path is not an identifier'),
    ),
    TreeCase(
        "source_file_name_a_keyword",
        _source("ops_extra/class.py"),
        1,
        _at("ops_extra/class.py", '"class" in the op module\'s path is not an identifier'),
    ),
    TreeCase(
        "source_file_name_with_a_quote",
        _source('ops_extra/a".py'),
        1,
        _at(
            'ops_extra/a".py', re.escape('"a\\"" in the op module') + "'s path is not an identifier"
        ),
    ),
    TreeCase(
        "source_folder_with_a_dash",
        _source("ops-extra/my_op.py"),
        1,
        _at("ops-extra/my_op.py", '"ops-extra" in the op module\'s path is not an identifier'),
    ),
    TreeCase(
        "source_not_a_python_file",
        _source("ops_extra/my_op.txt"),
        1,
        _at("ops_extra/my_op.txt", r"an op module must be a `\.py` file"),
    ),
    TreeCase(
        "source_named_init",
        _source("ops_extra/__init__.py"),
        1,
        _at("ops_extra/__init__.py", "an op module named `__init__.py`"),
    ),
    TreeCase(
        "source_outside_the_root",
        lambda root: ["--source", OUTSIDE_OP],
        1,
        _at(OUTSIDE_OP, "the op module lies outside the project root"),
    ),
    TreeCase(
        "source_outside_the_root_absolute",
        lambda root: ["--source", str(root.parent / "outside_op.py")],
        1,
        r"^{outer}/outside_op\.py:1:1: error: the op module lies outside the project root",
    ),
    TreeCase(
        "source_symlinked_out_of_the_root",
        _then(
            _symlink("ops_extra/linked_op.py", "../../outside_op.py"),
            _source("ops_extra/linked_op.py"),
        ),
        1,
        _at("ops_extra/linked_op.py", "the op module resolves outside the project root"),
    ),
    TreeCase(
        "source_inside_the_output_folder",
        _source(f"{OUTPUT_DIR}/extra_op.py"),
        1,
        _at(f"{OUTPUT_DIR}/extra_op.py", "the op module lies inside the output folder"),
    ),
    TreeCase(
        "two_sources_with_one_file_name",
        _then(_source("aaa/linear.py"), _source(LINEAR)),
        1,
        _at(LINEAR, "this op module and aaa/linear.py would both generate `linear.py`"),
    ),
    TreeCase(
        "two_sources_with_one_file_name_but_case",
        _then(_source("aaa/Linear.py"), _source(LINEAR)),
        1,
        _at(LINEAR, "this op module and aaa/Linear.py would both generate `linear.py`"),
    ),
]


def test_tree_cases_cover_the_issue_list() -> None:
    assert len(TREE_CASES) >= 25
    assert len({c.name for c in TREE_CASES}) == len(TREE_CASES)


@pytest.mark.parametrize("mode", ["generate", "--check", "--diff"])
@pytest.mark.parametrize("case", TREE_CASES, ids=[c.name for c in TREE_CASES])
def test_unsafe_tree_is_refused_and_nothing_is_written_anywhere(
    case: TreeCase, mode: str, tmp_path: Path, cli
) -> None:
    outer = tmp_path / "outer"
    root = copy_essentials(outer / "root")
    (outer / "outside.txt").write_text("outside the project: must never change\n", "utf-8")
    (outer / "elsewhere").mkdir()
    shutil.copy(REPO_ROOT / VALID_OP, outer / "outside_op.py")
    argv = case.setup(root)
    before = snapshot(tmp_path)  # the root, its parent and everything beside it

    result = cli("--root", str(root), *([] if mode == "generate" else [mode]), *argv)

    assert result.rc == case.rc, (result.rc, result.out, result.err)
    assert "Traceback" not in result.out + result.err
    first = result.err.splitlines()[0]
    report = case.report.format(root=re.escape(str(root)), outer=re.escape(str(outer)))
    assert re.match(report, first), first
    if case.rc == 1:
        assert re.match(r"^  hint: \S", result.err.splitlines()[1]), result.err
    assert "nothing was written" in result.err
    assert snapshot(tmp_path) == before


def test_a_valid_te_layout_setting_generates_formatted_modules(tmp_path: Path, cli) -> None:
    """What the te_layout checks accept renders into code ruff formats: the runtime's
    import line and the value-bundle type in the schema strings."""
    root = copy_essentials(tmp_path / "root")
    _te_layout("pkg.runtime.custom_op", "pkg.runtime.custom_op.OpaqueValueBundle")(root)

    result = cli("--root", str(root))

    assert result.rc == 0, result.err
    te_linear = (root / OUTPUT_DIR / "te_linear.py").read_text(encoding="utf-8")
    assert "from pkg.runtime import custom_op as _te\n" in te_linear
    assert '"pkg.runtime.custom_op.OpaqueValueBundle _simple_meta"' in te_linear


def test_a_formatter_failure_names_the_generated_file_and_quotes_its_line() -> None:
    """ruff's parse error (silenced by --quiet before) names the generated file, not
    the temporary name it was formatted under, and the line it could not parse."""
    from codegen.render import FormatterError, format_python

    sources = {
        "pkg/generated/a.py": "x = 1\n",
        "pkg/generated/te_b.py": "y = 2\nfrom class import x\n",
    }
    with pytest.raises(FormatterError) as raised:
        format_python(sources)
    message = str(raised.value)
    assert "pkg/generated/te_b.py:2:" in message, message
    assert "\n    from class import x" in message, message


def test_a_planted_temp_file_symlink_is_never_followed(tmp_path: Path, cli) -> None:
    """The old write went through `generated/.linear.py.tmp`; a link planted there (to a
    file outside the root) must stay as it is, its target untouched, and no temp file
    may be left behind."""
    outer = tmp_path / "outer"
    root = copy_essentials(outer / "root")
    target = outer / "outside.txt"
    target.write_text("outside the project: must never change\n", "utf-8")
    planted = root / OUTPUT_DIR / ".linear.py.tmp"
    planted.symlink_to("../../../outside.txt")
    linear = root / LINEAR
    linear.write_text(
        linear.read_text("utf-8").replace(
            "    fp8_output: bool\n", "    fp8_output: bool\n    x: int\n", 1
        ),
        "utf-8",
    )
    before = snapshot(tmp_path)
    mode_before = (root / OUTPUT_DIR / "linear.py").stat().st_mode

    result = cli("--root", str(root))

    assert result.rc == 0, result.err
    assert f"wrote {OUTPUT_DIR}/linear.py" in result.out
    after = snapshot(tmp_path)
    changed = {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
    assert changed == {f"outer/root/{OUTPUT_DIR}/linear.py", f"outer/root/{OUTPUT_DIR}/SCHEMAS.md"}
    assert planted.is_symlink() and target.read_text("utf-8").startswith("outside the project")
    assert not (root / OUTPUT_DIR / "linear.py").is_symlink()
    assert (root / OUTPUT_DIR / "linear.py").stat().st_mode == mode_before, "mode is kept"


# --- the generated-name check on its own (whatever emit aliases) ------------------------

_USER = SourceModule("pkg/op.py", "pkg.op", "", ())


@pytest.mark.parametrize(
    "code,message",
    [
        (
            "from pkg.op import _b\nfrom transformer_engine_ops.runtime import boundary as _b\n",
            "`pkg.op._b` is imported into the generated module as `_b`, which clashes with "
            "the import of `transformer_engine_ops.runtime.boundary`",
        ),
        (
            "from pkg.op import lin_fwd\nlin_fwd = 1\n",
            "as `lin_fwd`, which clashes with the generated `lin_fwd = ...`",
        ),
        (
            "from pkg.op import slot\ndef unflatten(*slots):\n    slot = iter(slots).__next__\n",
            "as `slot`, which clashes with a local name in the generated `unflatten`",
        ),
        (
            "import torch\nfrom pkg.op import torch\n",
            "`pkg.op.torch` is imported into the generated module as `torch`",
        ),
        (
            "def spec_x_fwd():\n    pass\nspec_x_fwd = 1\n",
            "would define `spec_x_fwd` twice",
        ),
    ],
    ids=["import_vs_import", "import_vs_assignment", "import_vs_local", "plain_import", "twice"],
)
def test_generated_name_check_reports_every_kind_of_clash(code: str, message: str) -> None:
    with pytest.raises(CodegenError) as raised:
        check_generated_names(_USER, code)
    assert message in str(raised.value)
    assert str(raised.value).startswith("pkg/op.py:1:1: error: ")


def test_generated_name_check_accepts_the_generated_modules() -> None:
    for path in sorted((REPO_ROOT / OUTPUT_DIR).glob("*.py")):
        check_generated_names(_USER, path.read_text(encoding="utf-8"))


# --- forms the generator once refused or misread, read right ------------------------------

_ACCEPTED_HEAD = """\
from __future__ import annotations

import dataclasses
from dataclasses import KW_ONLY, dataclass
from typing import Optional

import torch

from transformer_engine_ops.runtime.declaration import OpDeclaration

try:
    from torch.distributed import ProcessGroup
except ImportError:  # TE's own form: the body is what runs wherever torch has it
    ProcessGroup = None
"""

_ACCEPTED_BODY = """
@dataclass
class FwdArgs:
    inp: torch.Tensor
    _: KW_ONLY
    scale: float = 1.0
    group: Optional[ProcessGroup] = None
    tags: int = dataclasses.field(default=0, init=True)
{wide}

@dataclass
class BwdArgs:
    grad_outputs: list[torch.Tensor]


OP = OpDeclaration(name="{name}", forward=FwdArgs, backward=BwdArgs, grad_fields=("inp",))
"""


def _accepted_source(name: str, wide: int = 0) -> str:
    extra = "\n".join(f"    w{i}: int = 0" for i in range(wide))
    return _ACCEPTED_HEAD + _ACCEPTED_BODY.format(wide=extra, name=name)


def test_try_import_wins_over_its_except_fallback_and_kw_only_is_no_field(
    repo_config, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`_: KW_ONLY` adds no field and the fields after it keep their slots; a `try`
    import resolves to what it imports, not to the `except` fallback (was "unknown type")."""
    package = "accepted_forms"
    source = f"{package}/ops.py"
    (tmp_path / package).mkdir()
    (tmp_path / source).write_text(_accepted_source("accepted_forms"), encoding="utf-8")
    config = dataclasses.replace(
        repo_config,
        root=tmp_path,
        sources=(source,),
        output_dir=f"{package}/generated",
        exports=None,
    )
    import torch  # only here: the rest of this file never needs it

    generated = generate(config, [source])
    (bundle,) = [b for m in generated.modules for op in m.ops for b in (op.forward,)]
    assert [f.name for f in bundle.fields] == ["inp", "scale", "group", "tags"]
    assert bundle.field("group").type.kind.value == "process group"
    for rel, text in generated.files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    ops = importlib.import_module(f"{package}.ops")
    glue = importlib.import_module(f"{package}.generated.ops")

    args = ops.FwdArgs(torch.ones(2), scale=5.0, tags=3)
    back = glue.unflatten_fwd_args(*glue.flatten_fwd_args(args))

    assert (back.scale, back.group, back.tags) == (5.0, None, 3)
    assert "float scale" in glue.FORWARD_SCHEMA and "str? group" in glue.FORWARD_SCHEMA


def test_a_bundle_at_the_dispatcher_limit_is_accepted(repo_config) -> None:
    """64 schema arguments (inp, scale, group, tags and 60 more) read; 65 are refused in
    the corpus (too_many_slots.py)."""
    text = _accepted_source("at_limit", wide=MAX_SCHEMA_ARGUMENTS - 4)
    module = read_source("pkg/at_limit.py", text, repo_config)
    slots = sum(len(f.slots) for f in module.ops[0].forward.fields)
    assert slots == MAX_SCHEMA_ARGUMENTS
    with pytest.raises(CodegenError, match=f"needs {MAX_SCHEMA_ARGUMENTS + 1} schema arguments"):
        read_source("pkg/over.py", _accepted_source("over", wide=61), repo_config)
