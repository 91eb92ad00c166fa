"""Read op modules statically with libcst: bundles, enums and op declarations.

Nothing here imports the code it reads. Every name is resolved through the
file's own imports (``from torch import Tensor as T`` is still ``torch.Tensor``),
then across the modules under the source root (re-exports through ``__init__``,
``alias = some.Name`` in another module), and every entity keeps its ``path:line:col``.
Module-level ``if``/``try``/``with`` blocks are walked: names defined in any branch count.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import contextvars
import io
import keyword
import re
import tokenize
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import libcst as cst
from libcst.metadata import CodeRange, MetadataWrapper, PositionProvider

from . import kinds, nesting
from .config import Config, ConfiguredOp, DeclarationForm
from .errors import CodegenError, Location
from .model import (
    GRAD_OUTPUT_FIELD,
    GRAD_OUTPUTS_FIELD,
    Bundle,
    EagerWhen,
    Field,
    Impls,
    Op,
    Problem,
    SourceModule,
    TypeExpr,
)
from .safety import is_identifier

_DATACLASS = "dataclasses.dataclass"
_ENUM_BASES = {"enum.Enum", "enum.IntEnum", "enum.StrEnum"}
_CLASSVAR = {"typing.ClassVar"}
_KW_ONLY = "dataclasses.KW_ONLY"
_FIELD = "dataclasses.field"
# torch's dispatcher keeps one bit per schema argument in a 64-bit set
# (DispatchKeyExtractor::makeBitsetForDispatchArgs, c10::utils::bitset::NUM_BITS(), the
# same in torch 2.11 to 2.14): `Library.define` refuses a schema with more arguments.
MAX_SCHEMA_ARGUMENTS = 64
# Class-body statements that would bind fields the generator cannot see statically.
_CONTROL_FLOW = {
    cst.If: "an `if`",
    cst.For: "a `for`",
    cst.While: "a `while`",
    cst.Try: "a `try`",
    cst.TryStar: "a `try`",
    cst.With: "a `with`",
    cst.Match: "a `match`",
}
_IMPL_KEYS = ("forward_impl", "backward_impl", "forward_spec", "backward_spec", "setup_context")


def module_name(path: str) -> str:
    """``transformer_engine_ops/ops/linear.py`` -> ``transformer_engine_ops.ops.linear``."""
    return path.removesuffix(".py").replace("/", ".")


class _Positions(Mapping[cst.CSTNode, CodeRange]):
    """libcst positions of a module, computed on the first look-up (see Location)."""

    def __init__(self, wrapper: MetadataWrapper) -> None:
        self._wrapper = wrapper
        self._resolved: Mapping[cst.CSTNode, CodeRange] | None = None

    def _table(self) -> Mapping[cst.CSTNode, CodeRange]:
        if self._resolved is None:
            self._resolved = self._wrapper.resolve(PositionProvider)
        return self._resolved

    def __getitem__(self, node: cst.CSTNode) -> CodeRange:
        return self._table()[node]

    def __iter__(self) -> Iterator[cst.CSTNode]:
        return iter(self._table())

    def __len__(self) -> int:
        return len(self._table())


@dataclass
class _File:
    """Per-file reading state: positions and the module-level names for resolution."""

    path: str
    module: str
    positions: Mapping[cst.CSTNode, CodeRange]
    names: dict[str, str]  # module-level name -> qualified name
    aliases: dict[str, cst.BaseExpression]  # module-level `Alias = <annotation>`
    # Names the branches of a module-level `if` bind differently -> that `if`.
    ambiguous: dict[str, cst.If] = field(default_factory=dict)
    expanding: tuple[str, ...] = ()
    resolver: _Resolver | None = field(default=None, repr=False)
    body: Sequence[cst.CSTNode] = ()

    def loc(self, node: cst.CSTNode) -> Location:
        def position() -> tuple[int, int]:
            start = self.positions[node].start
            return start.line, start.column + 1

        return Location(self.path, resolve=position)

    def resolves(self, dotted: str) -> bool:
        head = dotted.split(".", 1)[0]
        return head in self.names or (head == dotted and head in _BUILTINS)

    def check_unambiguous(self, dotted: str, node: cst.CSTNode, what: str = "") -> None:
        """Refuse a name whose meaning depends on which branch of an ``if`` runs."""
        head = dotted.partition(".")[0]
        branches = self.ambiguous.get(head)
        if branches is not None:
            raise CodegenError(
                self.loc(node),
                f"{what or f'`{head}`'} is bound differently in the branches of the "
                f"module-level `if` at {self.loc(branches)}; the generator reads source, "
                "it does not evaluate conditions",
                f"bind `{head}` once, outside the `if` (or alike in every branch)",
            )

    def qualify(self, dotted: str, node: cst.CSTNode) -> str:
        self.check_unambiguous(dotted, node)
        head, _, rest = dotted.partition(".")
        if head in self.names:
            return self.names[head] + (f".{rest}" if rest else "")
        if not rest and head in _BUILTINS:
            return f"builtins.{head}"
        raise CodegenError(
            self.loc(node),
            f"cannot resolve `{dotted}`: it is neither imported nor defined in this file",
            f"import `{head}` or define it at module level",
        )


_BUILTINS = frozenset(n for n in dir(builtins) if not n.startswith("_"))


def _block(node: cst.BaseSuite) -> Sequence[cst.CSTNode]:
    """The statements of an indented block, or a one-line suite as one statement."""
    return node.body if isinstance(node, cst.IndentedBlock) else [node]


def _statements(body: Sequence[cst.CSTNode]) -> Iterator[cst.CSTNode]:
    """Module-level statements, with every branch of ``if``/``try``/``with`` walked.

    A ``try`` yields its ``except`` handlers before its body, so where a table keeps the
    last binding of a name the body's wins over the fallback (``try: from x import T``
    / ``except ImportError: T = None`` means ``x.T``, as wherever ``x`` is installed).
    """
    for statement in body:
        if isinstance(statement, cst.If):
            branch: cst.If | cst.Else | None = statement
            while branch is not None:
                yield from _statements(_block(branch.body))
                branch = branch.orelse if isinstance(branch, cst.If) else None
        elif isinstance(statement, cst.Try | cst.TryStar):
            for handler in statement.handlers:
                yield from _statements(_block(handler.body))
            yield from _statements(_block(statement.body))
            for extra in (statement.orelse, statement.finalbody):
                if extra is not None:
                    yield from _statements(_block(extra.body))
        elif isinstance(statement, cst.With):
            yield from _statements(_block(statement.body))
        else:
            yield statement


def _small_statements(body: Sequence[cst.CSTNode]) -> Iterator[cst.BaseSmallStatement]:
    for statement in _statements(body):
        if isinstance(statement, cst.SimpleStatementLine | cst.SimpleStatementSuite):
            yield from statement.body


def _relative_base(package: str, relative: int, base: str) -> str:
    parent = package.rsplit(".", relative - 1)[0] if relative > 1 else package
    return f"{parent}.{base}" if base else parent


# A binding: the qualified name a module-level name gets, and what distinguishes two
# bindings with one qualified name (an assignment's value: `A = int` vs `A = float`).
_Binding = tuple[str, str]


@dataclass
class _NameTable:
    """Module-level names (see :func:`_module_names`); ``ambiguous`` maps each name the
    branches of an ``if`` bind differently to that ``if``."""

    names: dict[str, str] = field(default_factory=dict)
    identity: dict[str, _Binding] = field(default_factory=dict)
    ambiguous: dict[str, cst.If] = field(default_factory=dict)

    def bind(self, name: str, binding: _Binding) -> None:
        self.names[name], self.identity[name] = binding[0], binding
        self.ambiguous.pop(name, None)

    def merge(self, other: _NameTable) -> None:
        for name, binding in other.identity.items():
            self.bind(name, binding)
        self.ambiguous.update(other.ambiguous)


def _bindings(statement: cst.CSTNode, module: str, package: str) -> Iterator[tuple[str, _Binding]]:
    """The names one class, function or simple statement binds, with their bindings."""
    if isinstance(statement, cst.ClassDef | cst.FunctionDef):
        name = statement.name.value
        yield name, (f"{module}.{name}", f"def@{id(statement)}")
        return
    if not isinstance(statement, cst.SimpleStatementLine | cst.SimpleStatementSuite):
        return
    for small in statement.body:
        if isinstance(small, cst.Import):
            for alias in small.names:
                dotted = _dotted(alias.name) or ""
                if alias.asname is not None:
                    local = _dotted(alias.asname.name) or dotted  # type: ignore[arg-type]
                    yield local, (dotted, "")
                else:
                    head = dotted.split(".", 1)[0]
                    yield head, (head, "")
        elif isinstance(small, cst.ImportFrom) and not isinstance(small.names, cst.ImportStar):
            base = _dotted(small.module) if small.module is not None else ""
            if small.relative:
                base = _relative_base(package, len(small.relative), base or "")
            for alias in small.names:
                name = alias.name.value  # type: ignore[union-attr]
                local = _dotted(alias.asname.name) if alias.asname else name  # type: ignore[union-attr]
                yield local or name, (f"{base}.{name}", "")
        elif isinstance(small, cst.Assign | cst.AnnAssign):
            targets = small.targets if isinstance(small, cst.Assign) else [small]
            value = "" if small.value is None else _code(small.value)
            for target in targets:
                if isinstance(target.target, cst.Name):
                    name = target.target.value
                    yield name, (f"{module}.{name}", value)


def _name_table(body: Sequence[cst.CSTNode], module: str, package: str) -> _NameTable:
    """Bindings in statement order. The branches of an ``if`` are alternatives: a name
    they bind alike is bound, one they bind differently is ambiguous (the generator
    never evaluates a condition). A ``try`` body wins over its ``except`` fallback."""
    table = _NameTable()
    for statement in body:
        if isinstance(statement, cst.If):
            branches: list[_NameTable] = []
            branch: cst.If | cst.Else | None = statement
            while branch is not None:
                branches.append(_name_table(_block(branch.body), module, package))
                branch = branch.orelse if isinstance(branch, cst.If) else None
            merged = _NameTable()
            for taken in branches:
                merged.ambiguous.update(taken.ambiguous)
            for taken in branches:
                for name, binding in taken.identity.items():
                    first = merged.identity.get(name)
                    if first is None:
                        merged.names[name], merged.identity[name] = binding[0], binding
                    elif first != binding:
                        merged.ambiguous[name] = statement
            table.merge(merged)
        elif isinstance(statement, cst.Try | cst.TryStar):
            for handler in statement.handlers:
                table.merge(_name_table(_block(handler.body), module, package))
            table.merge(_name_table(_block(statement.body), module, package))
            for extra in (statement.orelse, statement.finalbody):
                if extra is not None:
                    table.merge(_name_table(_block(extra.body), module, package))
        elif isinstance(statement, cst.With):
            table.merge(_name_table(_block(statement.body), module, package))
        else:
            for name, binding in _bindings(statement, module, package):
                table.bind(name, binding)
    return table


def _module_names(
    body: Sequence[cst.CSTNode], module: str, package: str
) -> tuple[dict[str, str], dict[str, cst.If]]:
    """What each module-level name means (imports resolved, local definitions qualified),
    and the names the branches of an ``if`` bind differently.

    Annotations are evaluated in module scope, so this table is all name resolution
    needs (libcst's ScopeProvider would also work, at twice the cost of a whole run).
    """
    table = _name_table(body, module, package)
    return table.names, table.ambiguous


def module_of(path: str) -> tuple[str, str]:
    """(module, package) of a source path: a package's ``__init__.py`` is the package."""
    module = module_name(path)
    if module.endswith(".__init__"):
        module = module.removesuffix(".__init__")
        return module, module
    return module, module.rpartition(".")[0]


def _ast_statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    for statement in body:
        if isinstance(statement, ast.If):
            for branch in _ast_if_branches(statement):
                yield from _ast_statements(branch)
        elif isinstance(statement, ast.Try | getattr(ast, "TryStar", ast.Try)):
            for handler in statement.handlers:  # first, so the body's bindings win
                yield from _ast_statements(handler.body)
            yield from _ast_statements(statement.body)
            yield from _ast_statements(statement.orelse)
            yield from _ast_statements(statement.finalbody)
        elif isinstance(statement, ast.With):
            yield from _ast_statements(statement.body)
        else:
            yield statement


def _ast_dotted(node: ast.expr) -> str | None:
    attributes = []
    while isinstance(node, ast.Attribute):  # a loop: a chain may be thousands long
        attributes.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(attributes)])


def _ast_bindings(statement: ast.stmt) -> Iterator[tuple[str, tuple[object, ...]]]:
    """The names one statement binds, each with what tells two bindings apart."""
    if isinstance(statement, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
        yield statement.name, ("def", statement.lineno, statement.col_offset)
    elif isinstance(statement, ast.Import):
        for alias in statement.names:
            yield alias.asname or alias.name.split(".", 1)[0], ("import", alias.name)
    elif isinstance(statement, ast.ImportFrom):
        for alias in statement.names:
            if alias.name != "*":
                where = (statement.level, statement.module, alias.name)
                yield alias.asname or alias.name, ("from", *where)
    elif isinstance(statement, ast.Assign | ast.AnnAssign):
        targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
        value = "" if statement.value is None else ast.dump(statement.value)
        for target in targets:
            if isinstance(target, ast.Name):
                yield target.id, ("value", value)


def _ast_if_branches(node: ast.If) -> list[list[ast.stmt]]:
    """The bodies of an ``if``, its ``elif``s and its ``else``, in order (a loop: other
    modules are read with ``ast`` alone, unbounded, and an ``elif`` chain may be long)."""
    branches = [node.body]
    while len(node.orelse) == 1 and isinstance(node.orelse[0], ast.If):
        node = node.orelse[0]
        branches.append(node.body)
    if node.orelse:
        branches.append(node.orelse)
    return branches


def _ast_branch_conflicts(body: list[ast.stmt]) -> dict[str, int]:
    """Module-level names the branches of an ``if`` bind differently -> that ``if``'s line
    (the generator reads every branch and evaluates no condition)."""
    conflicts: dict[str, int] = {}
    for statement in body:
        if isinstance(statement, ast.If):
            first: dict[str, tuple[object, ...]] = {}
            for branch in _ast_if_branches(statement):
                bound = {n: b for s in _ast_statements(branch) for n, b in _ast_bindings(s)}
                for name, binding in bound.items():
                    if first.setdefault(name, binding) != binding:
                        conflicts[name] = statement.lineno
                conflicts.update(_ast_branch_conflicts(branch))
        elif isinstance(statement, ast.Try | getattr(ast, "TryStar", ast.Try) | ast.With):
            for block in ("body", "orelse", "finalbody"):
                conflicts.update(_ast_branch_conflicts(getattr(statement, block, [])))
    return conflicts


class _AmbiguousName(Exception):
    """A name another module binds differently in the branches of an ``if``."""

    def __init__(self, qualname: str, where: str) -> None:
        super().__init__(qualname)
        self.qualname, self.where = qualname, where


@dataclass(frozen=True)
class _Definition:
    """What one module-level name of another module is, read with ``ast``.

    ``how`` is ``"defined"`` (a class, function or plain variable: the name is
    canonical), ``"enum"`` (a class deriving from an Enum), ``"import"`` (``target``
    is the imported qualified name), ``"ref"`` (``name = some.dotted.Name``: ``target``
    is the dotted text, resolved in the module), ``"alias"`` (``Name = <annotation>``)
    or ``"ambiguous"`` (bound differently in the branches of an ``if``: ``target`` is
    ``path:line`` of that ``if``).
    """

    how: str
    target: str = ""


class _Resolver:
    """Static name resolution across the modules under one source root; imports nothing.

    Modules are found as ``a/b/c.py`` or ``a/b/c/__init__.py`` under the root and
    read with Python's ``ast`` (fast; names only). A module-level type alias in
    another module is expanded from that module's libcst tree, read on demand.
    """

    def __init__(self, root: Path, config: Config) -> None:
        self._root, self._config = root, config
        self._paths: dict[str, str | None] = {}
        self._tables: dict[str, dict[str, _Definition]] = {}
        self._files: dict[str, _File] = {}
        self.expanding: tuple[str, ...] = ()

    def _path(self, module: str) -> str | None:
        """Root-relative path of a module's file, or None when it is not under the root."""
        if module not in self._paths:
            rel = module.replace(".", "/")
            found = None
            # `from .x import y` in a top-level module names `.x`: no module (Python says
            # "beyond top-level package"), and as `/x.py` a path out of the root.
            candidates = (f"{rel}.py", f"{rel}/__init__.py") if all(module.split(".")) else ()
            for candidate in candidates:
                if (self._root / candidate).is_file():
                    found = candidate
                    break
            self._paths[module] = found
        return self._paths[module]

    def _table(self, module: str, path: str) -> dict[str, _Definition]:
        if module in self._tables:
            return self._tables[module]
        table: dict[str, _Definition] = {}
        self._tables[module] = table
        try:
            tree = ast.parse((self._root / path).read_bytes(), filename=path)
        except (OSError, SyntaxError, ValueError, RecursionError, MemoryError):
            return table  # unreadable: its names stay as written
        _, package = module_of(path)
        imports: dict[str, str] = {}
        for statement in _ast_statements(tree.body):
            if isinstance(statement, ast.ClassDef):
                bases = [_ast_dotted(b) or "" for b in statement.bases]
                table[statement.name] = _Definition("class", ",".join(bases))
            elif isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef):
                table[statement.name] = _Definition("defined")
            elif isinstance(statement, ast.Import):
                for alias in statement.names:
                    if alias.asname:
                        imports[alias.asname] = alias.name
                        table[alias.asname] = _Definition("import", alias.name)
                    else:
                        head = alias.name.split(".", 1)[0]
                        imports[head] = head
            elif isinstance(statement, ast.ImportFrom):
                base = statement.module or ""
                if statement.level:
                    base = _relative_base(package, statement.level, base)
                for alias in statement.names:
                    if alias.name != "*":
                        local = alias.asname or alias.name
                        imports[local] = f"{base}.{alias.name}"
                        table[local] = _Definition("import", f"{base}.{alias.name}")
            elif isinstance(statement, ast.Assign | ast.AnnAssign):
                targets = (
                    statement.targets if isinstance(statement, ast.Assign) else [statement.target]
                )
                value = statement.value
                for target in targets:
                    if not isinstance(target, ast.Name):
                        continue
                    dotted = _ast_dotted(value) if value is not None else None
                    if dotted is not None and len(targets) == 1:
                        table[target.id] = _Definition("ref", dotted)
                    elif isinstance(value, ast.Subscript | ast.BinOp) and len(targets) == 1:
                        table[target.id] = _Definition("alias")
                    else:
                        table[target.id] = _Definition("defined")
        # Class bases and `ref` targets resolve through the module's own imports.
        for name, definition in list(table.items()):
            if definition.how in ("class", "ref"):
                resolved = []
                for dotted in filter(None, definition.target.split(",")):
                    head, _, rest = dotted.partition(".")
                    if head in imports:
                        resolved.append(imports[head] + (f".{rest}" if rest else ""))
                    elif head in table and table[head].how != "import":
                        resolved.append(f"{module}.{dotted}")
                    else:
                        resolved.append(f"builtins.{dotted}" if not rest else dotted)
                if definition.how == "ref":
                    table[name] = _Definition("ref", resolved[0] if resolved else "")
                else:
                    try:
                        enum = any(self.canonical(b) in _ENUM_BASES for b in resolved)
                    except _AmbiguousName:
                        enum = False
                    table[name] = _Definition("enum" if enum else "defined")
        for name, line in _ast_branch_conflicts(tree.body).items():
            table[name] = _Definition("ambiguous", f"{path}:{line}")
        return table

    def _split(self, qualname: str) -> tuple[str, str, list[str]] | None:
        """(module, path, attributes) for the longest module prefix under the root."""
        parts = qualname.split(".")
        for cut in range(len(parts) - 1, 0, -1):
            module = ".".join(parts[:cut])
            path = self._path(module)
            if path is not None:
                return module, path, parts[cut:]
        return None

    def _step(self, qualname: str) -> tuple[str, _Definition | None, str, str]:
        """One resolution step: (qualname, its definition, module, path)."""
        split = self._split(qualname)
        if split is None:
            return qualname, None, "", ""
        module, path, attrs = split
        definition = self._table(module, path).get(attrs[0])
        if definition is None or len(attrs) > 1 and definition.how != "import":
            return qualname, None, module, path
        return qualname, definition, module, path

    def canonical(self, qualname: str, stop_at: str = "") -> str:
        """Follow imports and ``name = other.Name`` to where a name is defined.

        Stops at a configured kind name, at a module outside the root and at the
        reading module itself (``stop_at``: its own tables already resolved it). Raises
        ``_AmbiguousName`` at a name the branches of an ``if`` bind differently.
        """
        seen = set()
        while qualname not in seen:
            seen.add(qualname)
            if self._config.kind_of(qualname) is not None:
                return qualname
            if stop_at and qualname.rpartition(".")[0] == stop_at:
                return qualname
            qualname, definition, module, _ = self._step(qualname)
            if definition is not None and definition.how == "ambiguous":
                raise _AmbiguousName(qualname, definition.target)
            if definition is None or definition.how not in ("import", "ref"):
                return qualname
            rest = qualname[len(module) + 1 :].split(".")[1:]
            qualname = ".".join([definition.target, *rest])
        return qualname

    def configured(self, qualname: str) -> bool:
        return self._config.kind_of(qualname) is not None

    def is_enum(self, qualname: str) -> bool:
        _, definition, _, _ = self._step(qualname)
        return definition is not None and definition.how == "enum"

    def alias(self, qualname: str) -> tuple[_File, cst.BaseExpression] | None:
        """The libcst file and expression of a type alias defined in another module."""
        _, definition, module, path = self._step(qualname)
        if definition is None or definition.how != "alias":
            return None
        if module not in self._files:
            try:
                text = decode_source(path, (self._root / path).read_bytes())
                self._files[module] = _parse_file(path, text, self)
            except LibcstBudgetExceeded:
                raise
            except (CodegenError, OSError):
                return None
        file = self._files[module]
        node = file.aliases.get(qualname.rpartition(".")[2])
        return None if node is None else (file, node)


class _Enums:
    """The enum classes a field may name: the file's own, and those the resolver finds."""

    def __init__(self, local: frozenset[str], resolver: _Resolver | None, module: str) -> None:
        self._local, self._resolver, self._module = local, resolver, module

    def __contains__(self, qualname: object) -> bool:
        if qualname in self._local:
            return True
        # Another module's class, unless configured as a kind (no need to read its module).
        return (
            isinstance(qualname, str)
            and self._resolver is not None
            and qualname.rpartition(".")[0] != self._module
            and not self._resolver.configured(qualname)
            and self._resolver.is_enum(qualname)
        )


def _dotted(node: cst.BaseExpression) -> str | None:
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        head = _dotted(node.value)
        return None if head is None else f"{head}.{node.attr.value}"
    return None


def _type_expr(
    file: _File,
    node: cst.BaseExpression,
    anchor: cst.CSTNode | None = None,
    in_literal: bool = False,
    depth: int = 0,
) -> TypeExpr:
    """Convert an annotation expression; ``anchor`` positions nodes parsed from a string.

    ``depth`` counts the calls above this one, through the type aliases expanded on
    the way: each module's text is bounded on its own (nesting.py), a chain of aliases
    is bounded here, so the walks of the result (kinds.classify, kinds.render) are too.
    """
    where = file.loc(anchor if anchor is not None else node)
    if depth > nesting.MAX_LEVELS:
        raise CodegenError(
            where,
            f"the annotation nests deeper than {nesting.MAX_LEVELS} levels, counting the "
            "type aliases it expands",
            "define the aliases with less nesting",
        )
    deeper = depth + 1
    if in_literal:
        if isinstance(node, cst.SimpleString | cst.ConcatenatedString):
            return TypeExpr("<literal>", where, value=node.evaluated_value)
        if isinstance(node, cst.Integer):
            return TypeExpr("<literal>", where, value=int(node.value))
        if isinstance(node, cst.Name) and node.value in ("True", "False"):
            return TypeExpr("<literal>", where, value=node.value == "True")  # type: ignore[union-attr]
    if isinstance(node, cst.SimpleString | cst.ConcatenatedString):
        # A forward reference: libcst does not resolve these, so parse and resolve here.
        text = node.evaluated_value
        if isinstance(text, str):
            nesting.check_annotation(text, where)
        try:
            # Python's parser first: it bounds the nesting libcst would recurse into.
            ast.parse(text, mode="eval") if isinstance(text, str) else None
            parsed = cst.parse_expression(text) if isinstance(text, str) else None
        except (cst.ParserSyntaxError, SyntaxError, ValueError, RecursionError, MemoryError):
            parsed = None
        if parsed is None:
            raise CodegenError(
                where,
                f"cannot parse the string annotation {_shorten(text)!r}",
                "write the annotation without quotes",
            )
        return _string_type_expr(file, parsed, anchor or node, text, deeper)
    if isinstance(node, cst.Ellipsis):
        return TypeExpr("...", where)
    if isinstance(node, cst.List):
        return TypeExpr(
            "<list>",
            where,
            tuple(_type_expr(file, e.value, anchor, depth=deeper) for e in node.elements),
        )
    # (libcst.matchers would read nicer but costs 0.4 s of import time per run.)
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.BitOr):
        assert isinstance(node, cst.BinaryOperation)
        left = _type_expr(file, node.left, anchor, depth=deeper)
        right = _type_expr(file, node.right, anchor, depth=deeper)
        members = tuple(
            a for side in (left, right) for a in (side.args if side.name == "<union>" else (side,))
        )
        return TypeExpr("<union>", where, members)
    dotted = _dotted(node)
    if dotted is not None:
        if dotted == "None":
            return TypeExpr("None", where)
        if dotted in file.aliases:
            file.check_unambiguous(dotted, anchor or node)
            return _expand_alias(file, dotted, anchor or node, deeper)
        qualname = file.qualify(dotted, anchor or node)
        if file.resolver is not None:
            try:
                qualname = file.resolver.canonical(qualname, stop_at=file.module)
            except _AmbiguousName as exc:
                raise CodegenError(
                    where,
                    f"`{dotted}` is `{exc.qualname}`, which the branches of the module-level "
                    f"`if` at {exc.where} bind differently; the generator reads source, it "
                    "does not evaluate conditions",
                    f"bind `{exc.qualname.rpartition('.')[2]}` once in its module, outside "
                    "the `if`",
                ) from None
            if qualname.rpartition(".")[0] != file.module:  # local aliases: expanded above
                expansion = _expand_foreign_alias(file.resolver, qualname, where, deeper)
                if expansion is not None:
                    return expansion
        return TypeExpr(qualname, where)
    if isinstance(node, cst.Subscript):
        base = _type_expr(file, node.value, anchor, depth=deeper)
        literal = base.name in {"typing.Literal", "typing_extensions.Literal"}
        args = []
        for element in node.slice:
            if not isinstance(element.slice, cst.Index):
                raise CodegenError(file.loc(anchor or element), "slices are not annotations")
            args.append(
                _type_expr(file, element.slice.value, anchor, in_literal=literal, depth=deeper)
            )
        return TypeExpr(base.name, where, tuple(args))
    raise CodegenError(
        where,
        f"unsupported annotation syntax `{_code(node)}`",
        "use a name, a subscripted generic or `X | None`",
    )


def _expand_alias(file: _File, name: str, use: cst.CSTNode, depth: int) -> TypeExpr:
    """A module-level type alias reads as what it stands for, positioned at its use."""
    if name in file.expanding:
        raise CodegenError(
            file.loc(use),
            f"type alias `{name}` refers to itself",
            "define the alias without recursion",
        )
    file.expanding += (name,)
    try:
        return _type_expr(file, file.aliases[name], use, depth=depth)
    finally:
        file.expanding = file.expanding[:-1]


def _expand_foreign_alias(
    resolver: _Resolver, qualname: str, use: Location, depth: int
) -> TypeExpr | None:
    """A type alias defined in another module under the source root, read where it is defined."""
    if resolver.configured(qualname):
        return None
    found = resolver.alias(qualname)
    if found is None:
        return None
    if qualname in resolver.expanding:
        raise CodegenError(
            use, f"type alias `{qualname}` refers to itself", "define the alias without recursion"
        )
    other, node = found
    resolver.expanding += (qualname,)
    try:
        return _type_expr(other, node, depth=depth)
    finally:
        resolver.expanding = resolver.expanding[:-1]


def _string_type_expr(
    file: _File, parsed: cst.BaseExpression, anchor: cst.CSTNode, text: str, depth: int
) -> TypeExpr:
    try:
        return _type_expr(file, parsed, anchor, depth=depth)
    except CodegenError as exc:
        raise CodegenError(
            exc.location, f"in string annotation {_shorten(text)!r}: {exc.message}", exc.hint
        ) from None


def _shorten(text: object, limit: int = 80) -> object:
    """A long text cut for an error message (an annotation can be kilobytes)."""
    return text if not isinstance(text, str) or len(text) <= limit else text[: limit - 3] + "..."


def _code(node: cst.CSTNode) -> str:
    return cst.Module(body=[]).code_for_node(node)


def _is_dataclass(file: _File, cls: cst.ClassDef) -> bool:
    for decorator in cls.decorators:
        target = decorator.decorator
        if isinstance(target, cst.Call):
            target = target.func
        dotted = _dotted(target)
        if (
            dotted is not None
            and file.resolves(dotted)
            and file.qualify(dotted, target) == _DATACLASS
        ):
            return True
    return False


def _base_names(file: _File, cls: cst.ClassDef) -> list[str]:
    names = []
    for base in cls.bases:
        dotted = _dotted(base.value)
        names.append(file.qualify(dotted, base.value) if dotted else _code(base.value))
    return names


def _read_bundle(file: _File, cls: cst.ClassDef, config: Config, enums: frozenset[str]) -> Bundle:
    name = cls.name.value
    bases = [b for b in _base_names(file, cls) if b != "builtins.object"]
    if bases:
        raise CodegenError(
            file.loc(cls.bases[0]),
            f"bundle `{name}` derives from `{bases[0]}`: inherited fields are invisible "
            "to the generator",
            "declare every field in the bundle class itself",
        )
    if not is_identifier(name):
        raise CodegenError(
            file.loc(cls.name),
            f"bundle name `{name}` is not an ASCII identifier",
            "name the bundle with ASCII letters, digits and `_`: generated names are built from it",
        )
    fields: list[Field] = []
    seen: dict[str, Location] = {}
    for statement in cls.body.body:
        flow = _CONTROL_FLOW.get(type(statement))
        if flow is not None:
            raise CodegenError(
                file.loc(statement),
                f"the body of bundle `{name}` holds {flow} statement: the fields it binds "
                "depend on control flow the generator does not evaluate",
                "declare every field at the top level of the class body",
            )
        if not isinstance(statement, cst.SimpleStatementLine):
            continue
        for small in statement.body:
            if isinstance(small, cst.Assign | cst.AugAssign):
                target = small.targets[0].target if isinstance(small, cst.Assign) else small.target
                raise CodegenError(
                    file.loc(target),
                    f"`{_code(target)}` in bundle `{name}` has no annotation, so it is not "
                    "a dataclass field",
                    "annotate it (for example `x: int = 0`), or mark it ClassVar",
                )
            if not isinstance(small, cst.AnnAssign):
                continue
            fields_or_none = _read_field(file, name, small, config, enums, seen)
            if fields_or_none is not None:
                fields.append(fields_or_none)
    if not fields:
        raise CodegenError(
            file.loc(cls.name),
            f"bundle `{name}` has no fields",
            "a bundle needs at least one annotated field",
        )
    count = sum(len(f.slots) for f in fields)
    if count > MAX_SCHEMA_ARGUMENTS:
        raise CodegenError(
            file.loc(cls.name),
            f"bundle `{name}` needs {count} schema arguments; torch's dispatcher allows at "
            f"most {MAX_SCHEMA_ARGUMENTS} per op (torch 2.11 to 2.14)",
            "split the bundle, or group values into one field of a configured `value` type",
        )
    return Bundle(name, f"{file.module}.{name}", tuple(fields), file.loc(cls.name))


def _read_field(
    file: _File,
    bundle: str,
    node: cst.AnnAssign,
    config: Config,
    enums: frozenset[str],
    seen: dict[str, Location],
) -> Field | None:
    if not isinstance(node.target, cst.Name):
        raise CodegenError(
            file.loc(node.target),
            f"`{_code(node.target)}` is not a field name",
            "bundle fields are plain names",
        )
    name = node.target.value
    where = file.loc(node.target)
    expr = _type_expr(file, node.annotation.annotation)
    if expr.name in _CLASSVAR or expr.name == _KW_ONLY:
        return None  # KW_ONLY marks the fields after it keyword-only; unflatten names them
    if not is_identifier(name):
        raise CodegenError(
            where,
            f"field name `{bundle}.{name}` is not an ASCII identifier",
            "name fields with ASCII letters, digits and `_` (Python folds some other "
            "letters into ASCII ones, so two spellings could mean one field)",
        )
    _check_init(file, bundle, name, node.value)
    if "__" in name:
        raise CodegenError(
            where,
            f"field `{bundle}.{name}` contains `__`, which separates a field from "
            "its extra slots (`x__inner`, `x__meta`)",
            "rename the field without a double underscore",
        )
    if name.startswith("_") or keyword.iskeyword(name):
        raise CodegenError(
            where,
            f"field `{bundle}.{name}` cannot be a schema argument name",
            "use a public name that does not start with `_`",
        )
    if name in seen:
        raise CodegenError(
            where,
            f"field `{bundle}.{name}` is declared twice (first at {seen[name]})",
            "remove one of them",
        )
    seen[name] = where
    ftype = kinds.classify(expr, config, enums)
    slots = kinds.slots_for(name, ftype, config)
    default = None if node.value is None else _code(node.value)
    return Field(name, kinds.render(expr), ftype, slots, where, default)


def _check_init(file: _File, bundle: str, name: str, value: cst.BaseExpression | None) -> None:
    """Refuse ``field(init=...)`` other than ``init=True``.

    An ``init=False`` field is no constructor argument: unflatten (which builds the bundle
    through its constructor) could not pass it, and a value set after construction would
    be lost at the op boundary, so it is refused rather than silently reset.
    """
    if not isinstance(value, cst.Call):
        return
    callee = _dotted(value.func)
    if callee is None or not file.resolves(callee) or file.qualify(callee, value.func) != _FIELD:
        return
    for arg in value.args:
        if arg.keyword is not None and arg.keyword.value == "init":
            if not (isinstance(arg.value, cst.Name) and arg.value.value == "True"):
                raise CodegenError(
                    file.loc(arg),
                    f"field `{bundle}.{name}` is declared with `{_code(arg)}`: it is not a "
                    "constructor argument, so it cannot cross the op boundary",
                    "drop `init=False` (make it a field), or make it a ClassVar or a property",
                )


class _BundleReader:
    """Reads each bundle class an op names, once; a bundle must be a local @dataclass."""

    def __init__(
        self, file: _File, classes: dict[str, cst.ClassDef], config: Config, enums: _Enums
    ) -> None:
        self._file, self._classes, self._config, self._enums = file, classes, config, enums
        self._cache: dict[str, Bundle] = {}

    def __call__(self, key: str, name: str, where: Location) -> Bundle:
        if name in self._cache:
            return self._cache[name]
        cls = self._classes.get(name)
        if cls is None:
            raise CodegenError(
                where,
                f"`{key}={name}` names no bundle class defined in this file",
                "define the bundle as a @dataclass in the op module, or fix the name",
            )
        self._file.check_unambiguous(name, cls.name, f"bundle `{name}`")
        if not _is_dataclass(self._file, cls):
            raise CodegenError(
                self._file.loc(cls.name),
                f"`{name}` is named as the {key} bundle but is not a @dataclass",
                f"decorate `{name}` with @dataclass",
            )
        bundle = _read_bundle(self._file, cls, self._config, self._enums)  # type: ignore[arg-type]
        self._cache[name] = bundle
        return bundle


def _literal_strings(file: _File, node: cst.BaseExpression, key: str) -> tuple[str, ...]:
    if isinstance(node, cst.Tuple | cst.List):
        values = []
        for element in node.elements:
            if not isinstance(element.value, cst.SimpleString):
                break
            values.append(str(element.value.evaluated_value))
        else:
            return tuple(values)
    raise CodegenError(
        file.loc(node), f"`{key}` must be a tuple of string literals", f'write {key}=("a", "b")'
    )


def _literal_reason(file: _File, node: cst.BaseExpression, key: str) -> str:
    if isinstance(node, cst.SimpleString | cst.ConcatenatedString):
        value = node.evaluated_value
        if isinstance(value, str) and value.strip():
            return value
    raise CodegenError(
        file.loc(node),
        f"`{key}` must be a non-empty string literal (the reason)",
        f'write {key}="why a CUDA graph must not capture this op"',
    )


def _literal_bool(file: _File, node: cst.BaseExpression, key: str) -> bool:
    if isinstance(node, cst.Name) and node.value in ("True", "False"):
        return node.value == "True"
    raise CodegenError(file.loc(node), f"`{key}` must be True or False", f"write {key}=True")


def _check_grad_fields(
    forward: Bundle, grad_fields: tuple[str, ...], places: Sequence[Location], whole: Location
) -> None:
    for grad, where in zip(grad_fields, places, strict=True):
        field = forward.field(grad)
        if field is None:
            raise CodegenError(
                where,
                f"gradient field `{grad}` is not a field of `{forward.name}`",
                f"name fields of {forward.name}",
            )
        if not kinds.may_receive_gradient(field.type):
            raise CodegenError(
                where,
                f"gradient field `{forward.name}.{grad}` is a {field.type.kind.value}, "
                "which cannot receive a gradient",
                "only tensor and tensor-or-quantized fields, and lists of them, receive gradients",
            )
    if len(set(grad_fields)) != len(grad_fields):
        raise CodegenError(whole, "`grad_fields` repeats a field", "name each gradient field once")


def _check_grad_receiver(backward: Bundle) -> None:
    """Exactly one backward field receives the forward outputs' gradients.

    ``grad_outputs: List[torch.Tensor]`` receives all of them; TE's form,
    ``grad_output: Optional[torch.Tensor]``, the first output's.
    """
    grad_outputs = backward.field(GRAD_OUTPUTS_FIELD)
    grad_output = backward.field(GRAD_OUTPUT_FIELD)
    all_grads = grad_outputs is not None and (
        grad_outputs.type.kind is kinds.Kind.TENSOR_LIST and not grad_outputs.type.optional
    )
    first_grad = grad_output is not None and grad_output.type.kind is kinds.Kind.TENSOR
    if all_grads == first_grad:  # neither, both, or a wrong kind
        raise CodegenError(
            backward.location,
            f"backward bundle `{backward.name}` needs one field receiving the forward "
            f"outputs' gradients: `{GRAD_OUTPUTS_FIELD}: List[torch.Tensor]` (all of "
            f"them) or `{GRAD_OUTPUT_FIELD}: Optional[torch.Tensor]` (the first)",
            f"add `{GRAD_OUTPUTS_FIELD}: List[torch.Tensor]` to {backward.name}",
        )


def _read_declaration(
    file: _File,
    call: cst.Call,
    form: DeclarationForm,
    read_bundle: _BundleReader,
    functions: dict[str, cst.FunctionDef],
) -> Op:
    where = file.loc(call)
    callee = form.short
    given: dict[str, cst.BaseExpression] = {}
    for arg in call.args:
        if arg.keyword is None:
            raise CodegenError(
                file.loc(arg),
                f"{callee} takes keyword arguments only",
                f"name each argument: {', '.join(form.keywords)}",
            )
        key = form.keywords.get(arg.keyword.value)
        if key is None:
            raise CodegenError(
                file.loc(arg.keyword),
                f"unknown {callee} argument `{arg.keyword.value}`",
                f"expected one of: {', '.join(form.keywords)}",
            )
        given[key] = arg.value
    kw = form.keyword_for
    for key in ("name", "forward", "backward", "grad_fields"):
        if key not in given:
            raise CodegenError(
                where, f"{callee} lacks `{kw(key)}`", f"add {kw(key)}=... to the declaration"
            )
    name_node = given["name"]
    if (
        not isinstance(name_node, cst.SimpleString)
        or not str(name_node.evaluated_value).isidentifier()
    ):
        raise CodegenError(
            file.loc(name_node),
            f"`{kw('name')}` must be a string literal identifier",
            f'write {kw("name")}="my_op"',
        )
    op_name = str(name_node.evaluated_value)

    def bundle(key: str) -> Bundle:
        node = given[key]
        if not isinstance(node, cst.Name):
            raise CodegenError(
                file.loc(node), f"`{kw(key)}` must name a bundle class", f"write {kw(key)}=MyArgs"
            )
        return read_bundle(kw(key), node.value, file.loc(node))

    forward, backward = bundle("forward"), bundle("backward")
    grad_fields = _literal_strings(file, given["grad_fields"], kw("grad_fields"))
    # _literal_strings checked the node: a tuple/list of strings, one element per name.
    grad_nodes = given["grad_fields"].elements  # type: ignore[attr-defined]
    _check_grad_fields(
        forward,
        grad_fields,
        [file.loc(g.value) for g in grad_nodes],
        file.loc(given["grad_fields"]),
    )
    impl_keys = [k for k in _IMPL_KEYS if k in form.keywords.values()]
    present = [k for k in impl_keys if k in given]
    impls = None
    if present:
        missing = [kw(k) for k in impl_keys if k not in given]
        if missing:
            raise CodegenError(
                where,
                f"{callee} names {', '.join(kw(k) for k in present)} but not {', '.join(missing)}",
                f"give all {len(impl_keys)} implementation functions, or none",
            )
        names = {}
        for key in impl_keys:
            node = given[key]
            if not isinstance(node, cst.Name) or node.value not in functions:
                raise CodegenError(
                    file.loc(node),
                    f"`{kw(key)}` must name a function defined in this file",
                    f"define `def {_code(node)}(...)` at module level",
                )
            names[key] = node.value
        _check_grad_receiver(backward)
        if form.registration:
            impls = Impls(**names)
    lowers = _literal_bool(file, given["lowers"], kw("lowers")) if "lowers" in given else False
    if lowers and impls is None and form.registration:
        raise CodegenError(
            file.loc(given["lowers"]),
            f"`{kw('lowers')}=True` needs the implementation functions Inductor would trace",
            f"give {', '.join(kw(k) for k in impl_keys)}, or drop {kw('lowers')}",
        )
    eager_when = (
        _eager_conditions(file, given["eager_when"], kw("eager_when"), forward)
        if "eager_when" in given
        else ()
    )
    cudagraph_unsafe = (
        _literal_reason(file, given["cudagraph_unsafe"], kw("cudagraph_unsafe"))
        if "cudagraph_unsafe" in given
        else None
    )
    if cudagraph_unsafe is not None and lowers:
        raise CodegenError(
            file.loc(given["cudagraph_unsafe"]),
            f"`{kw('cudagraph_unsafe')}` on an op with `{kw('lowers')}=True`: a lowered op is "
            "traced into Inductor's graph, so no op node is left to keep out of a CUDA graph",
            f"drop `{kw('lowers')}=True`, or make the kernel graph-safe and drop "
            f"`{kw('cudagraph_unsafe')}`",
        )
    plain_call = None
    plain_fields: tuple[str, ...] = ()
    plain_problem = None
    if "plain_call" in given:
        node = given["plain_call"]
        if impls is None or not isinstance(node, cst.Name) or node.value not in functions:
            raise CodegenError(
                file.loc(node),
                f"`{kw('plain_call')}` must name a function defined in this file, beside the "
                "implementation functions",
                f"define `def {_code(node)}(*, field, ...)` at module level and give the impls",
            )
        plain_call = node.value
        try:
            plain_fields = _plain_call_fields(file, functions[plain_call], forward)
        except LibcstBudgetExceeded:
            raise
        except CodegenError as e:
            plain_problem = Problem(e.location, e.message, e.hint)
    return Op(
        op_name,
        forward,
        backward,
        grad_fields,
        impls,
        where,
        lowers=lowers,
        eager_when=eager_when,
        plain_call=plain_call,
        plain_fields=plain_fields,
        plain_problem=plain_problem,
        cudagraph_unsafe=cudagraph_unsafe,
    )


def _plain_call_fields(file: _File, fn: cst.FunctionDef, forward: Bundle) -> tuple[str, ...]:
    """The forward fields a ``plain_call`` reads: its parameters, in its order, each
    named after a field (the generated entry passes them positionally, a keyword call
    costing ~3x as much, before any bundle is built)."""
    params = fn.params
    hint = f"write `def {fn.name.value}({', '.join(f.name for f in forward.fields[:2])}, ...)`"
    if params.kwonly_params or not isinstance(params.star_arg, cst.MaybeSentinel):
        raise CodegenError(
            file.loc(fn.name),
            f"plain call `{fn.name.value}` must take plain parameters named after fields of "
            f"{forward.name} (no `*`: the entry passes them positionally)",
            hint,
        )
    if params.star_kwarg is not None:
        raise CodegenError(
            file.loc(params.star_kwarg),
            f"plain call `{fn.name.value}` must name each field it reads, not take **kwargs",
            hint,
        )
    names = []
    for param in (*params.posonly_params, *params.params):
        name = param.name.value
        if forward.field(name) is None:
            raise CodegenError(
                file.loc(param.name),
                f"plain call parameter `{name}` is no field of {forward.name}",
                f"name a field of {forward.name}, or read it another way",
            )
        if param.default is not None:
            raise CodegenError(
                file.loc(param.default),
                f"plain call parameter `{name}` has a default: the entry always passes the field",
                f"drop the default of `{name}`",
            )
        names.append(name)
    return tuple(names)


_QUANTIZED_TERM = re.compile(r"quantized\((\w+)\)")


def _eager_conditions(
    file: _File, node: cst.BaseExpression, key: str, forward: Bundle
) -> tuple[EagerWhen, ...]:
    """``eager_when``: a tuple of ``("condition", "reason")`` string pairs; a condition is
    forward fields joined by `` and ``, each bare (truthy) or ``quantized(field)``."""
    hint = f'write {key}=(("fp8_output and is_grad_enabled", "why"), ...)'
    if not isinstance(node, cst.Tuple | cst.List):
        raise CodegenError(file.loc(node), f"`{key}` must be a tuple of (condition, reason)", hint)
    entries = []
    for element in node.elements:
        pair = element.value
        if not (
            isinstance(pair, cst.Tuple)
            and len(pair.elements) == 2
            and all(
                isinstance(e.value, cst.SimpleString | cst.ConcatenatedString)
                for e in pair.elements
            )
        ):
            raise CodegenError(
                file.loc(pair),
                f"each `{key}` entry must be a (condition, reason) string pair",
                hint,
            )
        condition, reason = (str(e.value.evaluated_value) for e in pair.elements)  # type: ignore[attr-defined]
        terms = []
        for term in condition.split(" and "):
            term = term.strip()
            match = _QUANTIZED_TERM.fullmatch(term)
            name = match.group(1) if match else term
            if not name.isidentifier() or forward.field(name) is None:
                raise CodegenError(
                    file.loc(pair.elements[0].value),
                    f"`{key}` condition term `{term}` is not a field of `{forward.name}`",
                    "join forward fields with ` and `; `quantized(field)` tests for a quantized value",
                )
            terms.append((name, match is not None))
        if not reason.strip():
            raise CodegenError(file.loc(pair.elements[1].value), f"`{key}` reason is empty", hint)
        entries.append(EagerWhen(tuple(terms), reason))
    return tuple(entries)


def _configured_op(file: _File, op: ConfiguredOp, read_bundle: _BundleReader) -> Op:
    """An op the configuration declares for this file: boundary only, positioned at its bundles."""
    top = Location(file.path, 1, 1)
    forward = read_bundle("forward", op.forward, top)
    backward = read_bundle("backward", op.backward, top)
    _check_grad_fields(forward, op.grad_fields, [forward.location] * len(op.grad_fields), top)
    return Op(op.name, forward, backward, op.grad_fields, None, forward.location)


def _syntax_error(path: str, text: str, exc: cst.ParserSyntaxError) -> CodegenError:
    """Position a syntax error the way Python does.

    libcst's native parser reports column 0 and often the line after the error, so
    the position and message come from Python's own parser (``ast.parse`` compiles
    nothing and runs nothing); libcst's are kept only when Python accepts the text.
    """
    hint = "fix the Python syntax; the generator reads this file as text"
    try:
        ast.parse(text, filename=path)
    except SyntaxError as py:
        if py.lineno:
            return CodegenError(
                Location(path, py.lineno, py.offset or 1), f"syntax error: {py.msg}", hint
            )
    except ValueError:  # e.g. a NUL byte (Python < 3.12 raises ValueError for it)
        pass
    message = str(exc.message).rstrip(".")
    return CodegenError(
        Location(path, exc.raw_line, exc.raw_column + 1), f"syntax error: {message}", hint
    )


def decode_source(path: str, data: bytes) -> str:
    """A source file's text, decoded as Python decodes it (UTF-8 unless a coding cookie
    says otherwise); an undecodable byte is an error at its position."""
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    except SyntaxError as exc:
        raise CodegenError(
            Location(path, 1, 1), f"bad encoding declaration: {exc.msg}", "save it as UTF-8"
        ) from None
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as exc:
        line_start = data.rfind(b"\n", 0, exc.start) + 1
        where = Location(path, data.count(b"\n", 0, exc.start) + 1, exc.start - line_start + 1)
        raise CodegenError(
            where,
            f"byte 0x{data[exc.start]:02x} is not valid {exc.encoding.upper()}",
            "save the file as UTF-8 (Python reads source as UTF-8 unless a "
            "`# -*- coding: ... -*-` line says otherwise)",
        ) from None


class LibcstBudgetExceeded(CodegenError):
    """A module libcst would parse past the bound :func:`libcst_budget` sets."""


# What libcst may still parse in the current context ([bytes left, the bound]); None:
# no bound. A context variable, so concurrent readings (threads, tasks) never share one.
_LIBCST_BUDGET: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar(
    "libcst_budget", default=None
)


@contextlib.contextmanager
def libcst_budget(limit: int) -> Iterator[None]:
    """Bound the bytes libcst parses in the block (op modules and the modules whose type
    aliases they use): libcst takes seconds and hundreds of MiB per MiB of source, so an
    untrusted tree (a revision under review) is read within a bound. A module past it is
    ``LibcstBudgetExceeded`` at its path, never skipped."""
    token = _LIBCST_BUDGET.set([limit, limit])
    try:
        yield
    finally:
        _LIBCST_BUDGET.reset(token)


def _charge_libcst(path: str, text: str) -> None:
    budget = _LIBCST_BUDGET.get()
    if budget is None:
        return
    budget[0] -= len(text.encode("utf-8", "surrogatepass"))
    if budget[0] < 0:
        raise LibcstBudgetExceeded(
            Location(path, 1, 1),
            f"with this module, libcst would parse more than the {budget[1]} bytes it may "
            "parse here",
            "the bound on an untrusted tree (docs/review.md, Bounds)",
        )


def _parse_file(path: str, text: str, resolver: _Resolver | None) -> _File:
    # Python's parser first: it refuses nesting deeper than it can compile (200 brackets)
    # with a position; then no statement may nest deeper than libcst's recursive tree
    # building and walking, and this module's, can follow (nesting.py). The text is
    # charged to the context's libcst budget first, before either parser reads it.
    _charge_libcst(path, text)
    tree: ast.Module | None = None
    try:
        tree = ast.parse(text, filename=path)
    except SyntaxError as exc:
        raise CodegenError(
            Location(path, exc.lineno or 1, exc.offset or 1),
            f"syntax error: {exc.msg}",
            "fix the Python syntax; the generator reads this file as text",
        ) from None
    except (RecursionError, MemoryError):
        pass  # nested beyond what Python's parser builds: measured on its tokens
    except ValueError:  # a NUL byte (Python < 3.12): libcst's report below
        return _parse_libcst(path, text, resolver)
    nesting.check_module(path, text, tree)
    return _parse_libcst(path, text, resolver)


def _parse_libcst(path: str, text: str, resolver: _Resolver | None) -> _File:
    try:
        tree = cst.parse_module(text)
    except cst.ParserSyntaxError as exc:
        raise _syntax_error(path, text, exc) from None
    # The tree is ours alone, so the wrapper need not deep-copy it.
    wrapper = MetadataWrapper(tree, unsafe_skip_copy=True)
    positions = _Positions(wrapper)
    body: Sequence[cst.CSTNode] = wrapper.module.body
    aliases = {
        small.targets[0].target.value: small.value
        for small in _small_statements(body)
        if isinstance(small, cst.Assign)
        and len(small.targets) == 1
        and isinstance(small.targets[0].target, cst.Name)
        and isinstance(small.value, cst.Subscript | cst.BinaryOperation)
    }
    module, package = module_of(path)
    names, ambiguous = _module_names(body, module, package)
    file = _File(path, module, positions, names, aliases, ambiguous)
    file.resolver = resolver
    file.body = body
    return file


def read_source(
    path: str, text: str, config: Config, source_root: Path | None = None
) -> SourceModule:
    """Read one op module; raise ``CodegenError`` at the first problem.

    ``source_root`` is where the modules it imports are found for static name
    resolution (default: the configured source root, else the project root).
    """
    reading = config.reading
    root = source_root or reading.source_root or config.root
    resolver = _Resolver(root, config)
    file = _parse_file(path, text, resolver)
    body = file.body
    statements = list(_statements(body))

    classes = [s for s in statements if isinstance(s, cst.ClassDef)]
    local_enums = frozenset(
        f"{file.module}.{c.name.value}"
        for c in classes
        if any(b in _ENUM_BASES for b in _base_names(file, c))
    )
    enums = _Enums(local_enums, resolver, file.module)
    functions = {s.name.value: s for s in statements if isinstance(s, cst.FunctionDef)}
    read_bundle = _BundleReader(file, {c.name.value: c for c in classes}, config, enums)

    ops: list[Op] = []
    for small in _small_statements(body):
        value = small.value if isinstance(small, cst.Assign | cst.AnnAssign | cst.Expr) else None
        if not isinstance(value, cst.Call):
            continue
        callee = _dotted(value.func)
        if callee is None or not file.resolves(callee):
            continue
        qualname = file.qualify(callee, value.func)
        try:
            canonical = resolver.canonical(qualname, stop_at=file.module)
        except _AmbiguousName:
            canonical = qualname  # not a declaration form: read as written
        form = reading.form_for(qualname) or reading.form_for(canonical)
        if form is None:
            continue
        if ops:
            raise CodegenError(
                file.loc(value),
                f"a second {form.short} in one op module",
                f"move it to its own module (the first is at {ops[0].location})",
            )
        ops.append(_read_declaration(file, value, form, read_bundle, functions))
    configured = reading.op_for(path)
    if configured is not None:
        if ops:
            raise CodegenError(
                ops[0].location,
                f"this file declares an op and the configuration declares `{configured.name}` "
                "for it too",
                "remove one of the two declarations",
            )
        ops.append(_configured_op(file, configured, read_bundle))
    if not ops:
        raise CodegenError(
            Location(path, 1, 1),
            "no OpDeclaration found in this op module",
            "declare the op: NAME = OpDeclaration(name=..., forward=..., ...)",
        )
    return SourceModule(path, file.module, text, tuple(ops))


def declaration_position(
    path: str, text: str, config: Config, source_root: Path | None = None
) -> tuple[int, int] | None:
    """Where a module declares an op (line, column), or None if it declares none.

    A quick look with Python's ``ast`` (no libcst, no bundle read) that tells op modules
    from helpers among the files a ``sources`` pattern matches or a source's folder
    holds: a module-level call of a configured declaration form, or an op the
    configuration declares for ``path``. Text Python cannot parse counts as an op
    module, so the full read reports it rather than skipping it.
    """
    reading = config.reading
    if reading.op_for(path) is not None:
        return (1, 1)
    if not any(form.short in text for form in reading.forms):
        return None
    try:
        tree = ast.parse(text, filename=path)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return (1, 1)
    module, package = module_of(path)
    local: dict[str, str] = {}
    statements = list(_ast_statements(tree.body))
    for statement in statements:
        if isinstance(statement, ast.Import):
            for alias in statement.names:
                head = alias.name.split(".", 1)[0]
                local[alias.asname or head] = alias.name if alias.asname else head
        elif isinstance(statement, ast.ImportFrom):
            base = statement.module or ""
            if statement.level:
                base = _relative_base(package, statement.level, base)
            for alias in statement.names:
                local[alias.asname or alias.name] = f"{base}.{alias.name}"
    resolver = _Resolver(source_root or reading.source_root or config.root, config)
    for statement in statements:
        value = getattr(statement, "value", None)
        if not isinstance(statement, ast.Assign | ast.AnnAssign | ast.Expr):
            continue
        if not isinstance(value, ast.Call):
            continue
        dotted = _ast_dotted(value.func)
        if dotted is None:
            continue
        head, _, rest = dotted.partition(".")
        qualname = local.get(head, f"{module}.{head}") + (f".{rest}" if rest else "")
        try:
            canonical = resolver.canonical(qualname)
        except _AmbiguousName:
            return (1, 1)  # the full read reports it
        if reading.form_for(qualname) or reading.form_for(canonical):
            return (statement.lineno, statement.col_offset + 1)
    return None
