"""Checks on every name and path that reaches generated code or the file system.

Nothing the generator writes comes from an unchecked string: the namespace and the
module names derived from source paths are ASCII identifiers, the output folder is a
real folder inside the project root that holds no op module, every source is a ``.py``
file inside the root with a distinct output name, and no name the generated module
defines shadows a name it imports from the user's code.
"""

from __future__ import annotations

import ast
import json
import keyword
import os
import posixpath
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

from .errors import CodegenError, ConfigError, Location
from .model import SourceModule

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Output names the generator writes besides one module per source.
RESERVED_STEMS = ("__init__",)


def _quote(value: object) -> str:
    """A value as TOML/JSON would spell it: quoted, control characters escaped."""
    return json.dumps(value, ensure_ascii=False)


def is_identifier(text: object) -> bool:
    """An ASCII Python identifier that is not a keyword (safe in code, paths and schemas)."""
    return (
        isinstance(text, str) and bool(_IDENTIFIER.fullmatch(text)) and not keyword.iskeyword(text)
    )


def is_dotted_name(text: object) -> bool:
    return isinstance(text, str) and all(is_identifier(part) for part in text.split("."))


# --- configuration ---------------------------------------------------------------------


def setting_error(
    pyproject: Path, table: str, key: str, value: object, problem: str
) -> ConfigError:
    """``.../pyproject.toml: [table] key = "value": problem``, the value as TOML spells it."""
    return ConfigError(f"{pyproject}: [{table}] {key} = {_quote(value)}: {problem}")


def output_dir_problem(
    root: Path, value: object, sources: Iterable[str], source_root: Path | None = None
) -> str | None:
    """Why ``value`` cannot be the output folder, or None when it can.

    ``sources`` are relative to ``source_root`` (default: the project root)."""
    if not isinstance(value, str) or not value:
        return "give a folder relative to the project root, e.g. `mypkg/generated`"
    if value.startswith(("/", "\\")) or re.match(r"[A-Za-z]:", value):
        return "an absolute path; give a folder relative to the project root"
    parts = value.split("/")
    if ".." in parts:
        return "climbs out of the project root with `..`; give a folder inside it"
    bad = next((p for p in parts if not is_identifier(p)), None)
    if bad is not None:
        return (
            f"the folder name {_quote(bad)} is not an identifier; the generated package "
            "must be importable, so write it as `a/b/generated` with identifier names"
        )
    here = root
    for part in parts:
        here = here / part
        if here.is_symlink():
            return (
                f"passes through the symlink {here.relative_to(root).as_posix()} -> "
                f"{os.readlink(here)}; the generator never writes through a symlink, so point "
                "output_dir at a real folder inside the project root"
            )
        if here.exists() and not here.is_dir():
            return f"{here.relative_to(root).as_posix()} is not a folder"
    if not (root / value).resolve().is_relative_to(root.resolve()):
        return "resolves outside the project root"
    out = (root / value).resolve()
    base = source_root or root
    for source in sorted(sources):
        if Path(source).is_absolute():
            continue  # refused with its position when sources are read
        if any(c in source for c in "*?["):  # a pattern: its literal folder
            literal = [p for p in Path(source).parent.parts if not any(c in p for c in "*?[")]
            folder = base.joinpath(*literal).resolve()
            found = sorted(
                p.relative_to(base).as_posix()
                for p in base.glob(source)
                if p.name != "__init__.py" and p.is_file()
            )
            inside = found and folder.is_relative_to(out)
            where = f"{found[0]} (matched by {source})" if inside else None
        else:
            where = source if (base / source).resolve().is_relative_to(out) else None
        if where is not None:
            return (
                f"holds the op module {where}: generating there would overwrite "
                "hand-written code; give the generated code a folder of its own"
            )
    return None


# --- sources ---------------------------------------------------------------------------


def normalize_source(
    root: Path, given: str, output_dir: str, source_root: Path | None = None
) -> str:
    """The relative POSIX path of a source; ``CodegenError`` at ``given:1:1`` if unfit.

    The path becomes a module name in an import line, the output's file name and a
    string in the header, so it must be a ``.py`` file inside the source root (the
    project root unless given) whose folders and stem are identifiers, not a package
    ``__init__`` and not inside the output folder ``root/output_dir``.
    """
    out = (root / output_dir).resolve()
    root = source_root or root
    where = Location(given, 1, 1)
    path = Path(given)
    if path.is_absolute():
        try:
            path = path.relative_to(root)
        except ValueError:
            raise CodegenError(
                where,
                "the op module lies outside the project root",
                f"move it under {root} (its generated import must resolve from there)",
            ) from None
    rel = posixpath.normpath(path.as_posix())
    if rel == ".." or rel.startswith("../"):
        raise CodegenError(
            where,
            "the op module lies outside the project root",
            "move it under the project root (its generated import must resolve from there)",
        )
    if not (root / rel).resolve().is_relative_to(root.resolve()):
        raise CodegenError(
            where,
            "the op module resolves outside the project root (through a symlink)",
            "point the source at the real file inside the project root",
        )
    if not rel.endswith(".py"):
        raise CodegenError(where, "an op module must be a `.py` file", "rename it to `<name>.py`")
    parts = rel.removesuffix(".py").split("/")
    bad = next((p for p in parts if not is_identifier(p)), None)
    if bad is not None:
        raise CodegenError(
            where,
            f"{_quote(bad)} in the op module's path is not an identifier, so the module "
            "cannot be imported by name",
            "rename it with ASCII letters, digits and `_` only (no space, dash or accent)",
        )
    if parts[-1] in RESERVED_STEMS:
        raise CodegenError(
            where,
            "an op module named `__init__.py`: its output would replace the generated "
            "package's own `__init__.py`",
            "move the bundles into a module of their own, e.g. `ops/my_op.py`",
        )
    if (root / rel).resolve().is_relative_to(out):
        raise CodegenError(
            where,
            f"the op module lies inside the output folder `{output_dir}`",
            "keep op modules out of output_dir: the generator owns that folder",
        )
    return rel


def check_output_names(paths: Sequence[str]) -> None:
    """Two sources whose outputs would share one file (case-insensitively) are an error."""
    first: dict[str, str] = {}
    for rel in paths:
        stem = rel.rsplit("/", 1)[-1].casefold()
        if stem in first:
            raise CodegenError(
                Location(rel, 1, 1),
                f"this op module and {first[stem]} would both generate "
                f"`{rel.rsplit('/', 1)[-1]}` in the output folder",
                "give op modules distinct file names",
            )
        first[stem] = rel


# --- generated names -------------------------------------------------------------------


def check_generated_names(module: SourceModule, code: str) -> None:
    """No name in the generated module may mean two things.

    ``code`` is the rendered (unformatted) module. A module-level name bound twice where
    one binding imports user code (an impl named ``_b`` or like the generated
    ``<op>_fwd``, a bundle named ``Any``), a function-local name in a generated function
    that hides such an import, and a name two generated definitions share (an op named
    ``spec_foo`` beside a bundle ``FooFwd``: both make ``spec_foo_fwd``) are errors at
    the user's name. Code that does not parse is left to the formatter's report.
    """
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return
    imported: dict[str, str] = {}  # local name -> qualified name
    defined: dict[str, str] = {}  # module-level generated name -> what defines it
    # A forward field may be named like an import of the generated module's own (`torch`,
    # `Any`; user names are imported under aliases): the functions taking the fields as
    # parameters read what it hides under an alias (emit.Spelling).
    fields = {f.name for op in module.ops for f in op.forward.fields}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module != "__future__":
            for alias in node.names:
                local, qualname = alias.asname or alias.name, f"{node.module}.{alias.name}"
                if local in imported:
                    first, second = sorted(
                        (imported[local], qualname), key=lambda q: not _is_users(module, q)
                    )
                    _clash(module, local, first, f"the import of `{second}`")
                imported[local] = qualname
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                local = alias.asname or alias.name.split(".")[0]
                if local in imported:
                    _clash(module, local, imported[local], f"the import of `{alias.name}`")
                imported[local] = alias.name
            continue
        bound: list[tuple[str, str]] = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.append((node.name, f"the generated definition of `{node.name}`"))
            for local in sorted(_locals(node) - fields):
                if local in imported:
                    where = f"a local name in the generated `{node.name}`"
                    _clash(module, local, imported[local], where)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        bound.append((name.id, f"the generated `{name.id} = ...`"))
        for name, what in bound:
            if name in imported:
                _clash(module, name, imported[name], what)
            if name in defined:
                raise CodegenError(
                    module.ops[0].location if module.ops else Location(module.path, 1, 1),
                    f"the generated module would define `{name}` twice: as {defined[name]} "
                    f"and as {what}",
                    "rename the op or a bundle: generated names are built from both",
                )
            defined[name] = what


def _clash(module: SourceModule, name: str, qualname: str, what: str) -> None:
    raise CodegenError(
        _user_location(module, qualname),
        f"`{qualname}` is imported into the generated module as `{name}`, "
        f"which clashes with {what}",
        f"rename `{name}` in your code: the generated module defines and imports "
        "these names itself",
    )


def _locals(fn: ast.AST) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(fn):
        if node is not fn and isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return names


def _user_location(module: SourceModule, qualname: str) -> Location:
    """Where the user's code introduces ``qualname``: a bundle, a field's type, or the op."""
    for op in module.ops:
        for bundle in (op.forward, op.backward):
            if bundle.qualname == qualname:
                return bundle.location
            for field in bundle.fields:
                if field.type.python_type == qualname:
                    return field.location
    return module.ops[0].location if module.ops else Location(module.path, 1, 1)


def _is_users(module: SourceModule, qualname: str) -> bool:
    """Whether ``qualname`` comes from the op module or names a type its bundles use."""
    return qualname.startswith(f"{module.module}.") or any(
        qualname in (bundle.qualname, *(f.type.python_type for f in bundle.fields))
        for op in module.ops
        for bundle in (op.forward, op.backward)
    )
