"""Modules reach ops only through the generated ``call_<op>`` (docs/op_contract.md, "The
calling side"): they import nothing from ``runtime/custom_ops.py`` and, from the
generated modules, only ``call_<op>`` and bundle types. Read from the source (AST), so
an import inside a function or under ``if TYPE_CHECKING`` counts too."""

from __future__ import annotations

import ast
import importlib
import typing
from pathlib import Path

import pytest

import transformer_engine_ops

PACKAGE = Path(transformer_engine_ops.__file__).resolve().parent
MODULES = sorted((PACKAGE / "modules").glob("*.py"))
GENERATED = sorted(p.stem for p in (PACKAGE / "generated").glob("*.py") if p.stem != "__init__")


def _absolute(node: ast.ImportFrom, path: Path) -> str:
    """The dotted module an ``ImportFrom`` in ``path`` (a file of ``modules/``) reads."""
    if node.level == 0:
        return node.module or ""
    parts = ["transformer_engine_ops", "modules"][: 2 - (node.level - 1)]
    return ".".join([*parts, *([node.module] if node.module else [])])


def _imports(path: Path) -> list[tuple[str, str, int]]:
    """(module, name, line) of every import in ``path`` (``import a.b``: name "")."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.ImportFrom):
            module = _absolute(node, path)
            found += [(module, alias.name, node.lineno) for alias in node.names]
            found += [(f"{module}.{alias.name}", "", node.lineno) for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [(alias.name, "", node.lineno) for alias in node.names]
    return found


def _calls(stem: str) -> set[str]:
    """The ``call_<op>`` entries of ``generated/<stem>.py`` (an op module may name its op
    apart from its file: ``attention.py`` declares ``dot_product_attention``)."""
    generated = importlib.import_module(f"transformer_engine_ops.generated.{stem}")
    return {name for name in dir(generated) if name.startswith("call_")}


def _allowed_generated_names(stem: str) -> set[str]:
    """``call_<op>`` and the op's two bundle types (what its unflatten functions return)."""
    generated = importlib.import_module(f"transformer_engine_ops.generated.{stem}")
    bundles = {
        typing.get_type_hints(getattr(generated, name))["return"].__name__
        for name in dir(generated)
        if name.startswith("unflatten_")
    }
    return {*_calls(stem), *bundles}


def violations(path: Path) -> list[str]:
    """What in ``path`` breaks the rule, as ``path:line: why``."""
    problems = []
    for module, name, line in _imports(path):
        where = f"{path.name}:{line}"
        if module == "transformer_engine_ops.runtime.custom_ops" or module.endswith(
            ".runtime.custom_ops"
        ):
            problems.append(f"{where}: imports runtime/custom_ops.py")
        for stem in GENERATED:
            target = f"transformer_engine_ops.generated.{stem}"
            if module == target and name and name not in _allowed_generated_names(stem):
                problems.append(f"{where}: imports {name} from generated/{stem}.py")
            elif module == target and not name:
                problems.append(f"{where}: imports generated/{stem}.py as a module")
        if module == "transformer_engine_ops.generated" and name in GENERATED:
            problems.append(f"{where}: imports generated/{name}.py as a module")
    return problems


@pytest.mark.parametrize("path", MODULES, ids=[p.name for p in MODULES])
def test_a_module_reaches_ops_only_through_call_op(path):
    assert violations(path) == []


def test_every_op_is_reached_through_its_call():
    """Each generated op is imported by some module, and only as ``call_<op>``."""
    used = {
        name
        for path in MODULES
        for module, name, _ in _imports(path)
        if module.startswith("transformer_engine_ops.generated.")
    }
    calls = {stem: _calls(stem) for stem in GENERATED}
    assert all(len(names) == 1 for names in calls.values()), calls
    assert set().union(*calls.values()) <= used


@pytest.mark.parametrize(
    "source",
    [
        "from ..runtime.custom_ops import registration_error\n",
        "from ..runtime import custom_ops\n",
        "import transformer_engine_ops.runtime.custom_ops\n",
        "from ..generated.linear import linear_eager\n",
        "from ..generated import linear\n",
        "def f():\n    from ..generated.linear import linear_compiled\n",
    ],
)
def test_the_rule_catches_a_bypass(tmp_path, source):
    path = tmp_path / "bypass.py"
    path.write_text(source, encoding="utf-8")
    assert violations(path) != []
