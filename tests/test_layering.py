"""The package's imports run one way: down the layer order of docs/architecture.md.

Every import statement of every module in transformer_engine_ops is read (module-level,
inside a function, under ``TYPE_CHECKING``; relative and absolute) and resolved to the
module it loads. Importing ``a.b.c`` from outside the package ``a.b`` also runs
``a/b/__init__.py``, so that package counts as imported too. An import of a module in a
higher layer fails the test, and so does a circle between modules (even within one
layer), each named by ``file:line``.
"""

from __future__ import annotations

import ast
import fnmatch
from pathlib import Path

import pytest

PACKAGE = "transformer_engine_ops"
ROOT = Path(__file__).resolve().parents[1] / PACKAGE

# Lowest first; a module may import its own layer and the layers before it. A module
# matches its most specific pattern (an exact name before a wildcard); "" is the package.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "torch fence, codec and constants",
        ("runtime", "runtime._torch_private", "runtime.codec", "constants"),
    ),
    (
        "quantized-tensor base",
        (
            "quantization",
            "quantization.quantizer",
            "quantization.encoding",
            "quantization.hadamard",
        ),
    ),
    ("op glue", ("runtime.*",)),
    ("kernels", ("kernels", "kernels.*")),
    ("quantization", ("quantization.*",)),
    ("ops", ("ops", "ops.*")),
    ("generated", ("generated", "generated.*")),
    (
        "modules",
        (
            "modules",
            "modules.*",
            "graph",
            "recipe",
            "router",
            "permutation",
            "custom_recipes",
            "custom_recipes.*",
        ),
    ),
    ("package", ("", "_exports")),
)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}
PACKAGES = {module_name(p) for p in ROOT.rglob("__init__.py")}


def layer_of(module: str) -> int:
    exact = [i for i, (_, pats) in enumerate(LAYERS) if module in pats]
    if exact:
        return exact[0]
    for i, (_, pats) in enumerate(LAYERS):
        if any("*" in p and fnmatch.fnmatchcase(module, p) for p in pats):
            return i
    raise AssertionError(f"{PACKAGE}.{module} is in no layer of tests/test_layering.py")


def imports_of(module: str, path: Path) -> list[tuple[str, int]]:
    """(imported module, line) for every import of a package module in ``path``."""
    is_package = path.name == "__init__.py"
    here = module.split(".") if module else []
    own = here if is_package else here[:-1]
    found: list[tuple[str, int]] = []

    def add(target: str, line: int) -> None:
        # the packages the import runs on the way, unless ``module`` is inside them
        parts = target.split(".")
        for n in range(1, len(parts)):
            parent = ".".join(parts[:n])
            if here[:n] != parts[:n]:
                found.append((parent, line))
        found.append((target, line))

    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == PACKAGE or alias.name.startswith(PACKAGE + "."):
                    add(alias.name.removeprefix(PACKAGE).lstrip("."), node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = own[: len(own) - node.level + 1] if node.level > 1 else list(own)
                target = ".".join(base + ([node.module] if node.module else []))
            elif node.module == PACKAGE or (node.module or "").startswith(PACKAGE + "."):
                target = node.module.removeprefix(PACKAGE).lstrip(".")
            else:
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}" if target else alias.name
                add(sub if sub in MODULES else target, node.lineno)
    return sorted({(t, line) for t, line in found if t != module and t in MODULES})


EDGES = {m: imports_of(m, p) for m, p in MODULES.items()}


def where(module: str, line: int) -> str:
    return f"{MODULES[module].relative_to(ROOT.parent)}:{line}"


def test_every_module_has_a_layer() -> None:
    for module in MODULES:
        layer_of(module)


def test_no_upward_import() -> None:
    upward = [
        f"{where(m, line)}: {PACKAGE}.{m} ({LAYERS[layer_of(m)][0]}) imports "
        f"{PACKAGE}.{t} ({LAYERS[layer_of(t)][0]})"
        for m, edges in EDGES.items()
        for t, line in edges
        if layer_of(t) > layer_of(m)
    ]
    assert not upward, "imports up the layer order:\n" + "\n".join(upward)


def test_no_import_circle() -> None:
    # Tarjan's strongly connected components; a component of two or more is a circle.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w, _ in EDGES[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for module in MODULES:
        if module not in index:
            visit(module)
    report = []
    for component in circles:
        members = set(component)
        report.append(
            "circle: "
            + ", ".join(
                f"{where(m, line)} -> {PACKAGE}.{t}"
                for m in component
                for t, line in EDGES[m]
                if t in members
            )
        )
    assert not report, "\n".join(report)


@pytest.mark.parametrize(
    ("source", "module", "expected"),
    [
        (
            "from ..quantization.quantizer import Quantizer\n",
            "runtime.boundary",
            {"quantization", "quantization.quantizer"},
        ),
        ("from . import lowering\n", "runtime.custom_ops", {"runtime.lowering"}),
        (
            "def f():\n    from .custom_ops import op_library\n",
            "runtime.lowering",
            {"runtime.custom_ops"},
        ),
        (
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..quantization.nvfp4 import X\n",
            "kernels.nvfp4_kernels",
            {"quantization", "quantization.nvfp4"},
        ),
        ("import transformer_engine_ops.ops.linear\n", "modules.linear", {"ops", "ops.linear"}),
        (
            "from transformer_engine_ops.runtime import codec, boundary\n",
            "ops.linear",
            {"runtime", "runtime.codec", "runtime.boundary"},
        ),
    ],
)
def test_reader_sees_every_form(
    tmp_path: Path, source: str, module: str, expected: set[str]
) -> None:
    """The reader resolves relative, absolute, function-local and TYPE_CHECKING imports."""
    path = tmp_path / "m.py"
    path.write_text(source)
    assert {t for t, _ in imports_of(module, path)} == expected
