"""The package's public names: one hand-written list, the rest generated from it.

``_EXPORTS`` in the package's ``__init__.py`` maps each public name to the module that
defines it (``"Linear": ".modules.linear"``; ``"recipe": "."`` for a subpackage); a key
``"<subpackage>.<Name>"`` exports the name from that subpackage only. The package computes ``__all__`` from it and imports each name on first use (PEP 562). From
the same list, read statically (never imported), the generator writes

* ``_exports.py`` beside it: every name as a plain import, which the package imports
  only under ``TYPE_CHECKING`` so type checkers and IDEs see the names;
* ``<subpackage>/__init__.py`` for each configured subpackage: the names defined in its
  modules, imported, and its ``__all__``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from dataclasses import dataclass

import jinja2

from .errors import CodegenError, Location
from .safety import is_dotted_name, is_identifier

EXPORTS_NAME = "_EXPORTS"
TYPING_FILE = "_exports.py"


@dataclass(frozen=True)
class Export:
    name: str
    module: str  # relative to the package: "." or ".a.b"
    location: Location
    scope: str | None = None  # the one subpackage that exports it; None: the package too


def read(path: str, text: str) -> tuple[Export, ...]:
    """The ``_EXPORTS`` dict literal of ``text`` (the file at ``path``), checked."""
    try:
        tree = ast.parse(text, filename=path)
    except SyntaxError as exc:
        raise CodegenError(
            Location(path, exc.lineno or 1, (exc.offset or 0) + 1),
            f"cannot parse the export list's file: {exc.msg}",
            "fix the syntax error",
        ) from None
    assigned = [
        node
        for node in tree.body
        if isinstance(node, ast.Assign | ast.AnnAssign)
        and any(
            isinstance(t, ast.Name) and t.id == EXPORTS_NAME
            for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
        )
    ]
    if len(assigned) != 1 or assigned[0].value is None:
        raise CodegenError(
            Location(path, 1, 1),
            f"expected one module-level `{EXPORTS_NAME} = {{...}}`, found {len(assigned)}",
            f'write `{EXPORTS_NAME} = {{"Name": ".defining.module", ...}}` once',
        )
    table = assigned[0].value
    if not isinstance(table, ast.Dict):
        raise CodegenError(
            _loc(path, table),
            f"`{EXPORTS_NAME}` must be a dict literal",
            'write {"Name": ".defining.module", ...}',
        )
    exports: list[Export] = []
    seen: dict[str, Location] = {}
    for key, value in zip(table.keys, table.values, strict=True):
        if key is None:
            raise CodegenError(
                _loc(path, value), f"`**` in `{EXPORTS_NAME}`", "list each name as a literal"
            )
        where = _loc(path, key)
        parts = key.value.split(".") if isinstance(key, ast.Constant) else []
        if not (
            isinstance(key.value, str) and 1 <= len(parts) <= 2 and all(map(is_identifier, parts))
        ):  # type: ignore[union-attr]
            raise CodegenError(
                where,
                f"a key of `{EXPORTS_NAME}` is not a string literal identifier",
                'write the public name as a string: "Linear" (or "modules.Name" for a name '
                "only a subpackage exports)",
            )
        name = key.value  # type: ignore[union-attr]
        if name in seen:
            raise CodegenError(
                where, f"`{name}` is exported twice (first at {seen[name]})", "remove one"
            )
        seen[name] = where
        module = value.value if isinstance(value, ast.Constant) else None
        if not _is_relative_module(module):
            raise CodegenError(
                _loc(path, value),
                f"`{EXPORTS_NAME}[{name!r}]` must be a relative module path string",
                'write the defining module from the package: ".modules.linear" (or "." '
                "for a subpackage of that name)",
            )
        scope = parts[0] if len(parts) == 2 else None
        if scope is not None and not module.startswith(f".{scope}."):  # type: ignore[union-attr]
            raise CodegenError(
                _loc(path, value),
                f"`{name}` is exported by the subpackage `{scope}` but defined in `{module}`",
                f'define it in a module of `{scope}` (".{scope}.module")',
            )
        exports.append(Export(parts[-1], module, where, scope))  # type: ignore[arg-type]
    return tuple(exports)


def _is_relative_module(module: object) -> bool:
    return isinstance(module, str) and (
        module == "." or (module.startswith(".") and is_dotted_name(module[1:]))
    )


def _loc(path: str, node: ast.AST) -> Location:
    return Location(path, getattr(node, "lineno", 1), getattr(node, "col_offset", 0) + 1)


def _imports(exports: Iterable[Export], strip: str = "") -> list[tuple[str, list[str]]]:
    """(module, sorted names) pairs, by module; ``strip`` is removed from each module."""
    by_module: dict[str, list[str]] = {}
    for export in exports:
        module = export.module
        by_module.setdefault("." + module[len(strip) :] if strip else module, []).append(
            export.name
        )
    return [(m, sorted(names)) for m, names in sorted(by_module.items())]


def render(
    source: str,
    exports: tuple[Export, ...],
    subpackages: tuple[str, ...],
    env: jinja2.Environment,
    format_version: int,
) -> dict[str, str]:
    """Relative path -> unformatted text of the typing imports and each subpackage's
    ``__init__.py``; ``source`` is the package's ``__init__.py``."""
    package = source.rsplit("/", 1)[0]
    template = env.get_template("exports.py.j2")
    files = {
        f"{package}/{TYPING_FILE}": template.render(
            source_path=source,
            format_version=format_version,
            docstring="The package's public names as imports, for type checkers and IDEs: "
            "the package imports\nthis file only under ``TYPE_CHECKING`` and imports each "
            "name on first use at run time.",
            imports=_imports(e for e in exports if e.scope is None),
            names=sorted(e.name for e in exports if e.scope is None),
        )
    }
    for sub in subpackages:
        prefix = f".{sub}."
        inside = [e for e in exports if e.module.startswith(prefix) and e.scope in (None, sub)]
        if not inside:
            raise CodegenError(
                Location(source, 1, 1),
                f"`{EXPORTS_NAME}` names no module of the subpackage `{sub}`, whose "
                "`__init__.py` the generator writes",
                f'export a name from it ("Name": "{prefix}module") or drop `{sub}` from '
                "exports.subpackages",
            )
        files[f"{package}/{sub}/__init__.py"] = template.render(
            source_path=source,
            format_version=format_version,
            docstring=f"The names ``{EXPORTS_NAME}`` exports from this subpackage's modules.",
            imports=_imports(inside, strip=prefix),
            names=sorted(e.name for e in inside),
        )
    return files
