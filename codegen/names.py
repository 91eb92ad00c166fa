"""Static name resolution: what a name in a source module means; imports nothing.

Every name is resolved through the file's own imports (``from torch import Tensor as T``
is still ``torch.Tensor``), then across the modules under the source root (re-exports
through ``__init__``, ``alias = some.Name`` in another module), and every entity keeps its
``path:line:col``. Module-level ``if``/``try``/``with`` blocks are walked: names defined in
any branch count.
"""

from __future__ import annotations

import ast
import builtins
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import libcst as cst
from libcst.metadata import CodeRange, MetadataWrapper, PositionProvider

from .config import Config
from .errors import CodegenError, Location
from .parsing import LibcstBudgetExceeded, decode_source, parse_module

ENUM_BASES = {"enum.Enum", "enum.IntEnum", "enum.StrEnum"}


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
class SourceFile:
    """Per-file reading state: positions and the module-level names for resolution."""

    path: str
    module: str
    positions: Mapping[cst.CSTNode, CodeRange]
    names: dict[str, str]  # module-level name -> qualified name
    aliases: dict[str, cst.BaseExpression]  # module-level `Alias = <annotation>`
    # Names the branches of a module-level `if` bind differently -> that `if`.
    ambiguous: dict[str, cst.If] = field(default_factory=dict)
    expanding: tuple[str, ...] = ()
    resolver: Resolver | None = field(default=None, repr=False)
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


def module_statements(body: Sequence[cst.CSTNode]) -> Iterator[cst.CSTNode]:
    """Module-level statements, with every branch of ``if``/``try``/``with`` walked.

    A ``try`` yields its ``except`` handlers before its body, so where a table keeps the
    last binding of a name the body's wins over the fallback (``try: from x import T``
    / ``except ImportError: T = None`` means ``x.T``, as wherever ``x`` is installed).
    """
    for statement in body:
        if isinstance(statement, cst.If):
            branch: cst.If | cst.Else | None = statement
            while branch is not None:
                yield from module_statements(_block(branch.body))
                branch = branch.orelse if isinstance(branch, cst.If) else None
        elif isinstance(statement, cst.Try | cst.TryStar):
            for handler in statement.handlers:
                yield from module_statements(_block(handler.body))
            yield from module_statements(_block(statement.body))
            for extra in (statement.orelse, statement.finalbody):
                if extra is not None:
                    yield from module_statements(_block(extra.body))
        elif isinstance(statement, cst.With):
            yield from module_statements(_block(statement.body))
        else:
            yield statement


def module_small_statements(body: Sequence[cst.CSTNode]) -> Iterator[cst.BaseSmallStatement]:
    for statement in module_statements(body):
        if isinstance(statement, cst.SimpleStatementLine | cst.SimpleStatementSuite):
            yield from statement.body


def relative_base(package: str, relative: int, base: str) -> str:
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
                dotted = dotted_name(alias.name) or ""
                if alias.asname is not None:
                    local = dotted_name(alias.asname.name) or dotted  # type: ignore[arg-type]
                    yield local, (dotted, "")
                else:
                    head = dotted.split(".", 1)[0]
                    yield head, (head, "")
        elif isinstance(small, cst.ImportFrom) and not isinstance(small.names, cst.ImportStar):
            base = dotted_name(small.module) if small.module is not None else ""
            if small.relative:
                base = relative_base(package, len(small.relative), base or "")
            for alias in small.names:
                name = alias.name.value  # type: ignore[union-attr]
                local = dotted_name(alias.asname.name) if alias.asname else name  # type: ignore[union-attr]
                yield local or name, (f"{base}.{name}", "")
        elif isinstance(small, cst.Assign | cst.AnnAssign):
            targets = small.targets if isinstance(small, cst.Assign) else [small]
            value = "" if small.value is None else code_of(small.value)
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


def ast_module_statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    for statement in body:
        if isinstance(statement, ast.If):
            for branch in _ast_if_branches(statement):
                yield from ast_module_statements(branch)
        elif isinstance(statement, ast.Try | getattr(ast, "TryStar", ast.Try)):
            for handler in statement.handlers:  # first, so the body's bindings win
                yield from ast_module_statements(handler.body)
            yield from ast_module_statements(statement.body)
            yield from ast_module_statements(statement.orelse)
            yield from ast_module_statements(statement.finalbody)
        elif isinstance(statement, ast.With):
            yield from ast_module_statements(statement.body)
        else:
            yield statement


def ast_dotted_name(node: ast.expr) -> str | None:
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
                bound = {n: b for s in ast_module_statements(branch) for n, b in _ast_bindings(s)}
                for name, binding in bound.items():
                    if first.setdefault(name, binding) != binding:
                        conflicts[name] = statement.lineno
                conflicts.update(_ast_branch_conflicts(branch))
        elif isinstance(statement, ast.Try | getattr(ast, "TryStar", ast.Try) | ast.With):
            for block in ("body", "orelse", "finalbody"):
                conflicts.update(_ast_branch_conflicts(getattr(statement, block, [])))
    return conflicts


class AmbiguousName(Exception):
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


class Resolver:
    """Static name resolution across the modules under one source root; imports nothing.

    Modules are found as ``a/b/c.py`` or ``a/b/c/__init__.py`` under the root and
    read with Python's ``ast`` (fast; names only). A module-level type alias in
    another module is expanded from that module's libcst tree, read on demand.
    """

    def __init__(self, root: Path, config: Config) -> None:
        self._root, self._config = root, config
        self._paths: dict[str, str | None] = {}
        self._tables: dict[str, dict[str, _Definition]] = {}
        self._files: dict[str, SourceFile] = {}
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
        for statement in ast_module_statements(tree.body):
            if isinstance(statement, ast.ClassDef):
                bases = [ast_dotted_name(b) or "" for b in statement.bases]
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
                    base = relative_base(package, statement.level, base)
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
                    dotted = ast_dotted_name(value) if value is not None else None
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
                        enum = any(self.canonical(b) in ENUM_BASES for b in resolved)
                    except AmbiguousName:
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
        ``AmbiguousName`` at a name the branches of an ``if`` bind differently.
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
                raise AmbiguousName(qualname, definition.target)
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

    def alias(self, qualname: str) -> tuple[SourceFile, cst.BaseExpression] | None:
        """The libcst file and expression of a type alias defined in another module."""
        _, definition, module, path = self._step(qualname)
        if definition is None or definition.how != "alias":
            return None
        if module not in self._files:
            try:
                text = decode_source(path, (self._root / path).read_bytes())
                self._files[module] = parse_file(path, text, self)
            except LibcstBudgetExceeded:
                raise
            except (CodegenError, OSError):
                return None
        file = self._files[module]
        node = file.aliases.get(qualname.rpartition(".")[2])
        return None if node is None else (file, node)


class Enums:
    """The enum classes a field may name: the file's own, and those the resolver finds."""

    def __init__(self, local: frozenset[str], resolver: Resolver | None, module: str) -> None:
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


def dotted_name(node: cst.BaseExpression) -> str | None:
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        head = dotted_name(node.value)
        return None if head is None else f"{head}.{node.attr.value}"
    return None


def code_of(node: cst.CSTNode) -> str:
    return cst.Module(body=[]).code_for_node(node)


def base_names(file: SourceFile, cls: cst.ClassDef) -> list[str]:
    names = []
    for base in cls.bases:
        dotted = dotted_name(base.value)
        names.append(file.qualify(dotted, base.value) if dotted else code_of(base.value))
    return names


def parse_file(path: str, text: str, resolver: Resolver | None) -> SourceFile:
    """A source file parsed (see :func:`parsing.parse_module`), with its module-level names."""
    tree = parse_module(path, text)
    # The tree is ours alone, so the wrapper need not deep-copy it.
    wrapper = MetadataWrapper(tree, unsafe_skip_copy=True)
    positions = _Positions(wrapper)
    body: Sequence[cst.CSTNode] = wrapper.module.body
    aliases = {
        small.targets[0].target.value: small.value
        for small in module_small_statements(body)
        if isinstance(small, cst.Assign)
        and len(small.targets) == 1
        and isinstance(small.targets[0].target, cst.Name)
        and isinstance(small.value, cst.Subscript | cst.BinaryOperation)
    }
    module, package = module_of(path)
    names, ambiguous = _module_names(body, module, package)
    file = SourceFile(path, module, positions, names, aliases, ambiguous)
    file.resolver = resolver
    file.body = body
    return file
