"""Deeply nested source is a positioned error, at once, never a RecursionError or a crash.

libcst builds, walks and prints its trees recursively, and so does the reader's
annotation walk: a 3000-way ``None | ... | torch.Tensor`` union raised RecursionError
after ~10 s, and 10000 levels crash libcst's native parser (SIGSEGV). ``codegen/nesting.py``
measures every text before libcst parses it; the reader bounds the chain of type
aliases an annotation expands. Each shape below is built at the size the issue named
or beyond, and must be refused where it nests too deeply, quickly.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from codegen_support import REPO_ROOT, subprocess_env

from codegen import nesting
from codegen.errors import CodegenError
from codegen.reader import read_source

_MODULE = """\
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

import torch

from transformer_engine_ops.runtime.declaration import OpDeclaration
{aliases}

def helper(a, b, c):
    if a:
        for _ in b:
            return {body}


@dataclass
class FwdArgs:
    inp: torch.Tensor
    x: {annotation} = {default}


@dataclass
class BwdArgs:
    grad_outputs: list[torch.Tensor]


OP = OpDeclaration(name="deep", forward=FwdArgs, backward=BwdArgs, grad_fields=("inp",))
"""


def _module(
    annotation: str = "Optional[int]", default: str = "None", body: str = "0", aliases: str = ""
) -> str:
    return _MODULE.format(annotation=annotation, default=default, body=body, aliases=aliases)


def _line(text: str, start: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if line.lstrip().startswith(start))


def _union(n: int) -> str:
    return " | ".join(["None"] * (n - 1) + ["torch.Tensor"])


def _nested(generic: str, n: int, inner: str) -> str:
    return f"{generic}[" * n + inner + "]" * n


def _alias_chain(n: int) -> str:
    lines = ["A0 = Optional[torch.Tensor]"] + [f"A{i} = Optional[A{i - 1}]" for i in range(1, n)]
    return "\n" + "\n".join(lines) + "\n"


STATEMENT = f"this statement nests deeper than {nesting.MAX_LEVELS} levels"
STRING = f"the string annotation nests deeper than {nesting.MAX_LEVELS} levels"
ALIASES = f"the annotation nests deeper than {nesting.MAX_LEVELS} levels, counting the type aliases"

# name -> (module text, the line's first word, message). Python's own parser refuses
# 200 nested brackets (corpus: annotation_nested_too_deep.py), so brackets nest 199 here.
DEEP = {
    "union_3000": (_module(annotation=_union(3000)), "x:", STATEMENT),
    "union_3000_string": (_module(annotation=f'"{_union(3000)}"'), "x:", STRING),
    "optional_199": (
        _module(annotation=_nested("Optional", 199, "torch.Tensor")),
        "x:",
        STATEMENT,
    ),
    "optional_1500_string": (
        _module(annotation=f'"{_nested("Optional", 1500, "torch.Tensor")}"'),
        "x:",
        STRING,
    ),
    "list_199": (_module(annotation=_nested("List", 199, "torch.Tensor")), "x:", STATEMENT),
    "list_199_string": (
        _module(annotation=f'"{_nested("List", 199, "torch.Tensor")}"'),
        "x:",
        STRING,
    ),
    "attribute_chain_3000": (_module(annotation="torch" + ".a" * 3000), "x:", STATEMENT),
    "or_chain_default_3000": (_module(default=" or ".join(["a"] * 3000)), "x:", STATEMENT),
    "concatenated_strings_default_3000": (
        _module(default=" ".join(['"a"'] * 3000)),
        "x:",
        STATEMENT,
    ),
    "sum_in_a_function_3000": (_module(body=" + ".join(["1"] * 3000)), "return", STATEMENT),
    "lambdas_with_parameters_200": (_module(default="lambda a, b: " * 200 + "0"), "x:", STATEMENT),
    "f_string_field_3000": (
        _module(default='f"{' + " or ".join(["a"] * 3000) + '}"'),
        "x:",
        STATEMENT,
    ),
    "alias_chain_200": (_module(annotation="A199", aliases=_alias_chain(200)), "x:", ALIASES),
}


@pytest.mark.parametrize("name", list(DEEP))
def test_deep_nesting_is_a_positioned_error_at_once(name: str, repo_config) -> None:
    text, start, message = DEEP[name]
    began = time.perf_counter()
    with pytest.raises(CodegenError) as raised:
        read_source("pkg/deep.py", text, repo_config)
    error = raised.value
    report = str(error)  # positions are resolved here, walking the module's tree
    elapsed = time.perf_counter() - began
    assert message in error.message, report
    assert error.location.line == _line(text, start), report
    assert error.location.column >= 1
    assert re.match(r"^pkg/deep\.py:\d+:\d+: error: .+\n  hint: \S", report), report
    assert elapsed < 3, f"{elapsed:.1f} s"  # the RecursionError took ~10 s to come


@pytest.mark.parametrize(
    "name", ["or_chain_default_10000", "concatenated_strings_default_10000", "union_10000"]
)
def test_what_crashed_libcsts_parser_is_reported_by_the_cli(name: str, tmp_path: Path) -> None:
    """10000 levels crashed libcst's native parser (SIGSEGV), so through a subprocess."""
    default = {
        "or_chain_default_10000": " or ".join(["a"] * 10000),
        "concatenated_strings_default_10000": " ".join(['"a"'] * 10000),
    }
    text = (
        _module(annotation=_union(10000))
        if name == "union_10000"
        else _module(default=default[name])
    )
    (tmp_path / "pyproject.toml").write_text(
        (REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"), encoding="utf-8"
    )
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "deep.py").write_text(text, encoding="utf-8")

    result = subprocess.run(
        [sys.executable, "-m", "codegen", "--root", str(tmp_path), "--source", "pkg/deep.py"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        env=subprocess_env(),
        timeout=120,
    )

    assert result.returncode == 1, (result.returncode, result.stderr[-2000:])
    assert "Traceback" not in result.stderr
    line = _line(text, "x:")
    assert re.match(rf"^pkg/deep\.py:{line}:\d+: error: {STATEMENT}", result.stderr), result.stderr


# Each shape at the deepest size the bound accepts is read without a RecursionError,
# from a stack already ~300 frames deep (a test runner's is ~100): the bound leaves room.
ACCEPTED = {
    "union": lambda n: _module(annotation=_union(n)),
    "optional": lambda n: _module(annotation=_nested("Optional", n, "torch.Tensor")),
    "optional_string": lambda n: _module(annotation=f'"{_nested("Optional", n, "torch.Tensor")}"'),
    "or_chain": lambda n: _module(default=" or ".join(["a"] * n)),
    "concatenated_strings": lambda n: _module(default=" ".join(['"a"'] * n)),
    "attribute_chain": lambda n: _module(default="a" + ".b" * n),
    "calls": lambda n: _module(default="f" + "()" * n),
    "lambdas": lambda n: _module(default="lambda a=" * n + "0" + ": 0" * n),
    "sum_in_a_function": lambda n: _module(body=" + ".join(["1"] * n)),
    "alias_chain": lambda n: _module(annotation=f"A{n - 1}", aliases=_alias_chain(n)),
}


def _refused(text: str, repo_config) -> bool:
    try:
        read_source("pkg/deep.py", text, repo_config)
    except CodegenError as exc:
        return "nests deeper than" in exc.message
    return False


def _deeper(frames: int, call):
    return call() if frames == 0 else _deeper(frames - 1, call)


@pytest.mark.parametrize("name", list(ACCEPTED))
def test_the_deepest_accepted_shape_reads_without_a_recursion_error(name: str, repo_config):
    make = ACCEPTED[name]
    low, high = 1, 199  # refused at 199 (200 brackets are a syntax error)
    assert _refused(make(high), repo_config)
    while low < high:  # the largest size the bound accepts
        middle = (low + high + 1) // 2
        low, high = (middle, high) if not _refused(make(middle), repo_config) else (low, middle - 1)
    text = make(low)

    def read() -> None:
        module = read_source("pkg/deep.py", text, repo_config)
        str(module.ops[0].forward.fields[1].location)  # walks the module's tree

    _deeper(300, read)


def test_the_statement_measure_finds_what_the_whole_text_measure_finds(monkeypatch) -> None:
    """Statements whose characters cannot reach the bound are not tokenized: with the
    bound lowered so real code reaches it, the first overflow is still found, at the same
    token, in every module of the project's packages and tests."""
    monkeypatch.setattr(nesting, "MAX_LEVELS", 20)
    paths = sorted(
        p
        for folder in ("codegen", "transformer_engine_ops", "tests/codegen", "tests/ops")
        for p in (REPO_ROOT / folder).rglob("*.py")
        if "corpus" not in p.parts
    )
    found = 0
    for path in paths:
        text = path.read_text(encoding="utf-8")
        whole = statements = None
        try:
            nesting._measure(text.replace("\r\n", "\n"), 0)
        except nesting._Overflow as at:
            whole = (at.row, at.col)
        try:
            nesting.check_module(str(path), text, ast.parse(text))
        except CodegenError as exc:
            statements = (exc.location.line, exc.location.column)
        assert statements == whole, path
        found += whole is not None
    assert found > len(paths) // 2  # the lowered bound is reached in most modules


def test_the_op_modules_nest_at_most_half_the_bound(monkeypatch) -> None:
    monkeypatch.setattr(nesting, "MAX_LEVELS", nesting.MAX_LEVELS // 2)
    for path in sorted((REPO_ROOT / "transformer_engine_ops" / "ops").glob("*.py")):
        text = path.read_text(encoding="utf-8")
        nesting.check_module(path.name, text, ast.parse(text))


# --- modules read with Python's `ast` alone (the names an op module imports) ----------

_HELPER_USER = _module(annotation="Optional[A]").replace(
    "from typing import List, Optional\n",
    "from typing import List, Optional\n\nfrom pkg.helper import A\n",
)


def _elif_chain(n: int) -> str:
    """`A` bound differently in each branch of a module-level `if` with n - 1 `elif`s."""
    return "X = 0\nif X == 0:\n    A = int\n" + "".join(
        f"elif X == {i}:\n    A = float\n" for i in range(1, n)
    )


@pytest.mark.parametrize(
    "helper,message",
    [
        (_elif_chain(1500), "which the branches of the module-level `if` at pkg/helper.py:3"),
        ("import torch\nA = torch" + ".a" * 2000 + "\n", "unknown type `torch.a.a.a"),
    ],
    ids=["elif_chain_1500", "attribute_chain_2000"],
)
@pytest.mark.parametrize("selected", ["--source", "a sources pattern"])
def test_a_long_chain_in_an_imported_module_is_no_recursion_error(
    helper: str, message: str, selected: str, tmp_path: Path, cli
) -> None:
    """Other modules are read with `ast` alone (their names), and the op modules a
    `sources` pattern matches too (whether they declare an op): an `elif` chain or an
    attribute chain there was walked recursively, a RecursionError past ~1000."""
    pyproject = (REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8")
    pyproject = re.sub(r"(?m)^sources = .*$", 'sources = ["pkg/*.py"]', pyproject)
    (tmp_path / "pyproject.toml").write_text(pyproject, encoding="utf-8")
    (tmp_path / "pkg").mkdir()
    # Naming the declaration form makes a pattern's selection read the helper too.
    helper = "# declares no OpDeclaration\n" + helper
    (tmp_path / "pkg" / "helper.py").write_text(helper, encoding="utf-8")
    (tmp_path / "pkg" / "op.py").write_text(_HELPER_USER, encoding="utf-8")
    argv = ["--source", "pkg/op.py"] if selected == "--source" else []

    result = cli("--root", str(tmp_path), "--check", *argv)

    assert result.rc == 1, result.err
    assert "Traceback" not in result.err
    line = _line(_HELPER_USER, "x:")
    assert re.match(rf"^pkg/op\.py:{line}:\d+: error: ", result.err), result.err
    assert message in result.err.splitlines()[0], result.err
