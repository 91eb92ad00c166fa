"""Which TE tests reach a TE internal, read from their code (never by running them).

Each test module and helper is read with libcst (the original TE source, so lines are
TE's). Its module-level definitions are *units*: a function, a class (``C``, and each
method ``C.m`` with the class's decorators, bases and attributes), and a module-level
variable (every statement that binds or mutates it, ``fp8_recipes.append(...)``
included, and the conditions of the ``if``/``for``/``try`` around them). A unit *uses*:

* a TE name that ``symbols.resolve`` classifies as internal (``tex.quantize``,
  ``FP8GlobalStateManager.copy_forward_fp8_meta_tensors_for_recompute``,
  ``general_gemm``), scoped as Python scopes it (a parameter named ``recipe`` is not the
  imported ``recipe``);
* an attribute of ``symbols.INTERNAL_ATTRIBUTES`` read on a receiver other than
  ``self``/``cls`` (``linear.fp8_meta``), or named as a literal to
  ``hasattr``/``getattr``/``setattr``/``delattr``;
* a ``torch.cuda`` function of ``symbols.CUDA_ONLY`` (category ``cuda-only``).

and *links* to the units it refers to: module-level names of its module, names imported
from a sibling file (``from utils import ModelConfig``), and ``self.m`` inside a method.
A function's entries are every use reachable through links, each with the shortest
chain of units that reaches it, and with the conditions on the function's own parameters
under which the use (or the reference that leads to it) runs: ``if single_param and
not is_module_grouped_tensor_path_supported(...)`` reaches the internal only where the
parametrization has ``single_param`` true (conditions of the form ``p``, ``not p``,
``p == literal``, ``p is None``, ``p in (...)``, joined by ``and``, an ``else`` or the
right operand of ``and``/``or``; any other condition is taken to hold, so the skip errs
towards skipping).

It also lists the *availability sites*: the lines of ``pytest.skip(...)`` calls made
under a condition on an availability query (``is_*_available``,
``torch.cuda.is_available``, or a variable assigned from one) or whose reason is such a
variable; a test skipped at one of them skipped for availability.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import libcst as cst
from libcst.metadata import (
    MetadataWrapper,
    PositionProvider,
    QualifiedName,
    QualifiedNameProvider,
    QualifiedNameSource,
)

from . import symbols
from .symbols import Unclassified

_ATTRIBUTE_FUNCTIONS = ("hasattr", "getattr", "setattr", "delattr")
_RECEIVERS = ("self", "cls")


# A condition on a test parameter under which code runs: (parameter, op, literal), op one
# of truthy, falsy, eq, ne, is_none, not_none, in, not_in. A use carries the conjunction
# of the conditions around it that are of this form (the others are not known, so they
# are taken to hold).
Atom = tuple[str, str, Any]
Guards = tuple[Atom, ...]


@dataclass(frozen=True)
class Use:
    symbol: str  # the INTERNAL entry, ".attr", or "torch.cuda.X"
    category: str  # "internal" or "cuda-only"
    used: str  # as the code writes it
    where: str  # "file.py:line"
    guards: Guards = ()


@dataclass
class Unit:
    name: str
    function: bool = False
    uses: list[Use] = field(default_factory=list)
    # (module, unit, guards of the reference)
    links: set[tuple[str, str, Guards]] = field(default_factory=set)
    availability: bool = False  # calls an availability query directly

    def link(self, module: str, name: str, guards: Guards = ()) -> None:
        self.links.add((module, name, guards))


@dataclass
class ModuleFacts:
    units: dict[str, Unit] = field(default_factory=dict)
    availability_lines: set[int] = field(default_factory=set)


def _is_availability_name(name: str) -> bool:
    last = name.rsplit(".", 1)[-1]
    if name == "torch.cuda.is_available":
        return True
    if not symbols.is_te_name(name):
        return False
    return last.startswith("is_") and last.endswith("_available")


class _Reader:
    def __init__(self, module: str, source: str, siblings: Collection[str]) -> None:
        self.module = module
        self.file = f"{module}.py"
        self.siblings = siblings
        self.wrapper = MetadataWrapper(cst.parse_module(source))
        self.tree = self.wrapper.module
        self._qnames = self.wrapper.resolve(QualifiedNameProvider)
        self._positions = self.wrapper.resolve(PositionProvider)
        self.facts = ModuleFacts()
        self._guards: Guards = ()
        self.globals = self._module_names()
        self.classes = {
            stmt.name.value: _methods(stmt)
            for stmt in _module_level(self.tree.body)
            if isinstance(stmt, cst.ClassDef)
        }

    # -- metadata ----------------------------------------------------------------
    def qnames(self, node: cst.CSTNode) -> Collection[QualifiedName]:
        """Qualified names of a plain dotted chain (``a.b.c``) only: libcst also names
        ``f(x).y`` as ``f.y``."""
        if not isinstance(node, (cst.Name, cst.Attribute)) or not _is_chain(node):
            return set()
        value: Any = self._qnames.get(node, set())
        return value if isinstance(value, (set, frozenset)) else value()

    def line(self, node: cst.CSTNode) -> int:
        value: Any = self._positions[node]
        if not hasattr(value, "start"):
            value = value()
        return value.start.line

    def imported(self, node: cst.CSTNode) -> str | None:
        found = sorted(q.name for q in self.qnames(node) if q.source == QualifiedNameSource.IMPORT)
        return found[0] if found else None

    def te_name(self, node: cst.CSTNode) -> str | None:
        found = sorted(
            q.name
            for q in self.qnames(node)
            if q.source == QualifiedNameSource.IMPORT and symbols.is_te_name(q.name)
        )
        return found[0] if found else None

    def global_name(self, node: cst.Name) -> str | None:
        """The module-level name a Name refers to, if it refers to one."""
        for q in self.qnames(node):
            if q.source == QualifiedNameSource.LOCAL and q.name in self.globals:
                return q.name
        return None

    # -- units -------------------------------------------------------------------
    def unit(self, name: str, function: bool = False) -> Unit:
        found = self.facts.units.get(name)
        if found is None:
            found = self.facts.units[name] = Unit(name, function)
        found.function = found.function or function
        return found

    def _module_names(self) -> set[str]:
        names: set[str] = set()
        for stmt in _module_level(self.tree.body):
            names.update(_bound_names(stmt))
        return names

    def read(self) -> ModuleFacts:
        for stmt in self.tree.body:
            self._statement(stmt)
        for unit in list(self.facts.units.values()):
            if unit.function:
                self._availability_sites(unit.name)
        return self.facts

    def _statement(self, stmt: cst.CSTNode, header: str | None = None) -> None:
        if isinstance(stmt, cst.FunctionDef):
            unit = self.unit(stmt.name.value, function=True)
            self._collect(stmt, unit, params=_params(stmt))
            self._link_header(unit, header)
        elif isinstance(stmt, cst.ClassDef):
            self._class(stmt, header)
        elif isinstance(stmt, cst.SimpleStatementLine):
            for small in stmt.body:
                self._small(small, header)
        elif isinstance(stmt, (cst.If, cst.For, cst.While, cst.Try, cst.With)):
            bound = sorted(_bound_names(stmt))
            name = f"<{type(stmt).__name__.lower()} at line {self.line(stmt)}>"
            own = self.unit(name)
            for part in _header_parts(stmt):
                self._collect(part, own)
            self._link_header(own, header)
            for target in bound or ["<module>"]:
                self.unit(target).link(self.module, name)
            for inner in _inner_statements(stmt):
                self._statement(inner, header=name)
        else:
            self._collect(stmt, self.unit("<module>"))

    def _link_header(self, unit: Unit, header: str | None) -> None:
        if header is not None:
            unit.link(self.module, header)

    def _class(self, node: cst.ClassDef, header: str | None) -> None:
        cls = node.name.value
        whole = self.unit(cls)
        self._collect(node, whole, cls=cls, methods=_methods(node))
        self._link_header(whole, header)
        head = self.unit(f"{cls}.<class>")
        for part in (*node.decorators, *node.bases, *node.keywords):
            self._collect(part, head)
        methods = _methods(node)
        for stmt in _statements(node.body):
            if isinstance(stmt, cst.FunctionDef):
                continue
            self._collect(stmt, head, cls=cls, methods=methods)
        self._link_header(head, header)
        for stmt in _statements(node.body):
            if isinstance(stmt, cst.FunctionDef):
                method = self.unit(f"{cls}.{stmt.name.value}", function=True)
                self._collect(stmt, method, cls=cls, methods=methods, params=_params(stmt))
                method.link(self.module, head.name)

    def _small(self, small: cst.BaseSmallStatement, header: str | None) -> None:
        if isinstance(small, cst.ImportFrom) and small.module is not None and not small.relative:
            source = _dotted(small.module)
            if source in self.siblings and not isinstance(small.names, cst.ImportStar):
                for alias in small.names:
                    name = _dotted(alias.name)
                    bound = _dotted(alias.asname.name) if alias.asname else name
                    self.unit(bound).link(source, name)
            return
        if isinstance(small, cst.Import):
            return
        targets = sorted(_bound_names(small)) or ["<module>"]
        for target in targets:
            unit = self.unit(target)
            self._collect(small, unit)
            self._link_header(unit, header)

    # -- uses --------------------------------------------------------------------
    def _collect(
        self,
        node: cst.CSTNode,
        unit: Unit,
        cls: str | None = None,
        methods: Collection[str] = (),
        params: Collection[str] = (),
    ) -> None:
        """Record what ``node`` uses and links to; within a function, each with the
        conditions on the function's parameters under which it runs."""
        stack: list[tuple[cst.CSTNode, Guards]] = [(node, ())]
        while stack:
            current, guards = stack.pop()
            self._guards = guards
            if isinstance(current, (cst.Import, cst.ImportFrom)):
                continue
            if isinstance(current, cst.Attribute):
                stack.extend((n, guards) for n in self._attribute(current, unit, cls, methods))
                continue
            if isinstance(current, cst.Name):
                self._name(current, unit)
                continue
            if isinstance(current, cst.Call):
                self._call(current, unit)
            stack.extend(reversed(_guarded_children(current, guards, params)))

    def _use(self, unit: Unit, symbol: str, category: str, node: cst.CSTNode) -> None:
        used = self.tree.code_for_node(node)
        if len(used) > 80:
            used = used[:77] + "..."
        where = f"{self.file}:{self.line(node)}"
        unit.uses.append(Use(symbol, category, used, where, self._guards))

    def _te_use(self, unit: Unit, name: str, node: cst.CSTNode) -> None:
        if _is_availability_name(name):
            unit.availability = True
        try:
            res = symbols.resolve(name)
        except Unclassified:
            return  # the rewrite reports it
        if res.kind == "internal":
            self._use(unit, res.key, "internal", node)

    def _attribute(
        self, node: cst.Attribute, unit: Unit, cls: str | None, methods: Collection[str]
    ) -> list[cst.CSTNode]:
        te = self.te_name(node)
        if te is not None:
            self._te_use(unit, te, node)
            return []
        imported = self.imported(node)
        if imported is not None:
            if imported == "torch.cuda.is_available":
                unit.availability = True
            head, _, last = imported.rpartition(".")
            if head == "torch.cuda" and last in symbols.CUDA_ONLY:
                self._use(unit, imported, "cuda-only", node)
                return []
            root = imported.split(".", 1)[0]
            if root in self.siblings:
                unit.link(root, imported.split(".", 1)[1], self._guards)
                return []
        attr = node.attr.value
        receiver = node.value
        if isinstance(receiver, cst.Name) and receiver.value in _RECEIVERS:
            if cls is not None and attr in methods:
                unit.link(self.module, f"{cls}.{attr}", self._guards)
        elif isinstance(receiver, cst.Name) and attr in self.classes.get(
            self.global_name(receiver) or "", ()
        ):
            # `TestDeferredInit.get_module_args`: the method, not the whole class
            unit.link(self.module, f"{receiver.value}.{attr}", self._guards)
            return []
        elif attr in symbols.INTERNAL_ATTRIBUTES and imported is None:
            self._use(unit, f".{attr}", "internal", node)
        return [receiver]

    def _name(self, node: cst.Name, unit: Unit) -> None:
        te = self.te_name(node)
        if te is not None:
            self._te_use(unit, te, node)
            return
        imported = self.imported(node)
        if imported is not None:
            root, _, rest = imported.partition(".")
            if root in self.siblings and rest:
                unit.link(root, rest, self._guards)
            return
        name = self.global_name(node)
        if name is not None and name != unit.name:
            unit.link(self.module, name, self._guards)

    def _call(self, node: cst.Call, unit: Unit) -> None:
        if not isinstance(node.func, cst.Name) or node.func.value not in _ATTRIBUTE_FUNCTIONS:
            return
        if len(node.args) >= 2:
            value = _string(node.args[1].value)
            if value is not None and value in symbols.INTERNAL_ATTRIBUTES:
                self._use(unit, f".{value}", "internal", node)

    # -- availability ------------------------------------------------------------
    def _mentions_availability(self, node: cst.CSTNode, local: Collection[str]) -> bool:
        for sub in _walk(node):
            if isinstance(sub, (cst.Attribute, cst.Name)):
                name = self.te_name(sub) or self.imported(sub)
                if name is not None and _is_availability_name(name):
                    return True
            if isinstance(sub, cst.Name):
                if sub.value in local:
                    return True
                glob = self.global_name(sub)
                if glob is not None and self.facts.units.get(glob, Unit(glob)).availability:
                    return True
        return False

    def _availability_sites(self, name: str) -> None:
        node = self._function_node(name)
        if node is None:
            return
        local: set[str] = set()
        for sub in _walk(node):
            if isinstance(sub, cst.Assign) and self._mentions_availability(sub.value, local):
                for target in sub.targets:
                    local.update(_target_names(target.target))
        self._skips_under(node.body, [], local)

    def _skips_under(self, node: cst.CSTNode, tests: list[cst.CSTNode], local: set[str]) -> None:
        if isinstance(node, cst.If):
            self._skips_under(node.body, [*tests, node.test], local)
            if node.orelse is not None:
                self._skips_under(node.orelse, [*tests, node.test], local)
            return
        if isinstance(node, cst.Call) and self.imported(node.func) == "pytest.skip":
            parts = [*tests, *(arg.value for arg in node.args)]
            if any(self._mentions_availability(part, local) for part in parts):
                self.facts.availability_lines.add(self.line(node))
            return
        for child in node.children:
            self._skips_under(child, tests, local)

    def _function_node(self, name: str) -> cst.FunctionDef | None:
        cls, _, method = name.rpartition(".")
        for stmt in _module_level(self.tree.body):
            if not cls and isinstance(stmt, cst.FunctionDef) and stmt.name.value == name:
                return stmt
            if cls and isinstance(stmt, cst.ClassDef) and stmt.name.value == cls:
                for inner in _statements(stmt.body):
                    if isinstance(inner, cst.FunctionDef) and inner.name.value == method:
                        return inner
        return None


# -- guards ------------------------------------------------------------------------
def _params(node: cst.FunctionDef) -> frozenset[str]:
    p = node.params
    every = [*p.posonly_params, *p.params, *p.kwonly_params]
    return frozenset(param.name.value for param in every)


_NO_VALUE = object()


def _literal(node: cst.CSTNode) -> Any:
    if isinstance(node, cst.Name) and node.value in ("True", "False", "None"):
        return {"True": True, "False": False, "None": None}[node.value]
    if isinstance(node, (cst.SimpleString, cst.Integer, cst.Float)):
        value = node.evaluated_value
        return value if isinstance(value, (str, int, float)) else _NO_VALUE
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus):
        value = _literal(node.expression)
        return -value if isinstance(value, (int, float)) and value is not True else _NO_VALUE
    if isinstance(node, (cst.Tuple, cst.List, cst.Set)):
        values = tuple(_literal(e.value) for e in node.elements)
        return _NO_VALUE if any(v is _NO_VALUE for v in values) else values
    return _NO_VALUE


_NEGATE = {
    "truthy": "falsy",
    "falsy": "truthy",
    "eq": "ne",
    "ne": "eq",
    "is_none": "not_none",
    "not_none": "is_none",
    "in": "not_in",
    "not_in": "in",
}


def _atom(node: cst.CSTNode, params: Collection[str]) -> Atom | None:
    """A condition of the form ``p``, ``p == 1``, ``p is None``, ``p in ("a", "b")``
    on a parameter ``p``, or None."""
    if isinstance(node, cst.Name) and node.value in params:
        return (node.value, "truthy", None)
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Not):
        inner = _atom(node.expression, params)
        return (inner[0], _NEGATE[inner[1]], inner[2]) if inner else None
    if isinstance(node, cst.Comparison) and len(node.comparisons) == 1:
        left, target = node.left, node.comparisons[0]
        right, op = target.comparator, target.operator
        if not (isinstance(left, cst.Name) and left.value in params):
            if (
                isinstance(right, cst.Name)
                and right.value in params
                and isinstance(op, (cst.Equal, cst.NotEqual))
            ):
                left, right = right, left
            else:
                return None
        value = _literal(right)
        if value is _NO_VALUE:
            return None
        name = cst.ensure_type(left, cst.Name).value
        if isinstance(op, cst.Is) and value is None:
            return (name, "is_none", None)
        if isinstance(op, cst.IsNot) and value is None:
            return (name, "not_none", None)
        kinds = {cst.Equal: "eq", cst.NotEqual: "ne", cst.In: "in", cst.NotIn: "not_in"}
        kind = kinds.get(type(op))
        if kind in ("in", "not_in") and not isinstance(value, tuple):
            return None
        return (name, kind, value) if kind else None
    return None


def _holds(test: cst.CSTNode, params: Collection[str]) -> Guards:
    """The atoms that hold where ``test`` is true (those of an ``and``)."""
    if isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.And):
        return _holds(test.left, params) + _holds(test.right, params)
    atom = _atom(test, params)
    return (atom,) if atom else ()


def _fails(test: cst.CSTNode, params: Collection[str]) -> Guards:
    """The atoms that hold where ``test`` is false (those of a negated ``or``)."""
    if isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.Or):
        return _fails(test.left, params) + _fails(test.right, params)
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        return _holds(test.expression, params)
    atom = _atom(test, params)
    return ((atom[0], _NEGATE[atom[1]], atom[2]),) if atom else ()


def _guarded_children(
    node: cst.CSTNode, guards: Guards, params: Collection[str]
) -> list[tuple[cst.CSTNode, Guards]]:
    """A node's children, each with the conditions under which it runs: an ``if``'s
    body where its test holds, its ``else`` where it fails; the right operand of
    ``and``/``or`` where the left one holds/fails; likewise a conditional expression."""
    if not params:
        return [(child, guards) for child in node.children]
    if isinstance(node, cst.If):
        out = [(node.test, guards), (node.body, guards + _holds(node.test, params))]
        if node.orelse is not None:
            out.append((node.orelse, guards + _fails(node.test, params)))
        return out
    if isinstance(node, cst.IfExp):
        return [
            (node.test, guards),
            (node.body, guards + _holds(node.test, params)),
            (node.orelse, guards + _fails(node.test, params)),
        ]
    if isinstance(node, cst.BooleanOperation):
        left = _holds if isinstance(node.operator, cst.And) else _fails
        return [(node.left, guards), (node.right, guards + left(node.left, params))]
    return [(child, guards) for child in node.children]


# -- syntax helpers ----------------------------------------------------------------
def _is_chain(node: cst.CSTNode) -> bool:
    while isinstance(node, cst.Attribute):
        node = node.value
    return isinstance(node, cst.Name)


def _dotted(node: cst.CSTNode) -> str:
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        return f"{_dotted(node.value)}.{node.attr.value}"
    raise TypeError(type(node).__name__)


def _string(node: cst.CSTNode) -> str | None:
    if isinstance(node, cst.SimpleString):
        value = node.evaluated_value
        return value if isinstance(value, str) else None
    return None


def _walk(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        stack.extend(current.children)


def _statements(block: cst.BaseSuite) -> list[cst.CSTNode]:
    if isinstance(block, cst.IndentedBlock):
        return list(block.body)
    return [block]


def _inner_statements(stmt: cst.CSTNode) -> list[cst.CSTNode]:
    out: list[cst.CSTNode] = []
    blocks: list[cst.BaseSuite] = []
    if isinstance(stmt, (cst.If, cst.For, cst.While, cst.With, cst.Try)):
        blocks.append(stmt.body)
    if isinstance(stmt, cst.If) and stmt.orelse is not None:
        if isinstance(stmt.orelse, cst.If):
            out.append(stmt.orelse)
        else:
            blocks.append(stmt.orelse.body)
    if isinstance(stmt, (cst.For, cst.While, cst.Try)) and stmt.orelse is not None:
        blocks.append(stmt.orelse.body)
    if isinstance(stmt, cst.Try):
        blocks.extend(h.body for h in stmt.handlers)
        if stmt.finalbody is not None:
            blocks.append(stmt.finalbody.body)
    for block in blocks:
        out.extend(_statements(block))
    return out


def _header_parts(stmt: cst.CSTNode) -> list[cst.CSTNode]:
    if isinstance(stmt, (cst.If, cst.While)):
        return [stmt.test]
    if isinstance(stmt, cst.For):
        return [stmt.target, stmt.iter]
    if isinstance(stmt, cst.With):
        return list(stmt.items)
    if isinstance(stmt, cst.Try):
        return [h.type for h in stmt.handlers if h.type is not None]
    return []


def _module_level(body: Iterable[cst.CSTNode]) -> Iterator[cst.CSTNode]:
    for stmt in body:
        yield stmt
        if isinstance(stmt, (cst.If, cst.For, cst.While, cst.Try, cst.With)):
            yield from _module_level(_inner_statements(stmt))


def _methods(node: cst.ClassDef) -> set[str]:
    return {s.name.value for s in _statements(node.body) if isinstance(s, cst.FunctionDef)}


def _target_names(target: cst.CSTNode) -> set[str]:
    if isinstance(target, cst.Name):
        return {target.value}
    if isinstance(target, (cst.Tuple, cst.List)):
        out: set[str] = set()
        for element in target.elements:
            out |= _target_names(element.value)
        return out
    if isinstance(target, cst.StarredElement):
        return _target_names(target.value)
    if isinstance(target, (cst.Subscript, cst.Attribute)):
        base: cst.CSTNode = target.value
        while isinstance(base, (cst.Subscript, cst.Attribute)):
            base = base.value
        return {base.value} if isinstance(base, cst.Name) else set()
    return set()


def _bound_names(stmt: cst.CSTNode) -> set[str]:
    """Module-level names a statement binds or mutates (defs, assignments, the
    receiver of a method call statement such as ``fp8_recipes.append(...)``)."""
    if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
        return {stmt.name.value}
    if isinstance(stmt, cst.SimpleStatementLine):
        out: set[str] = set()
        for small in stmt.body:
            out |= _bound_names(small)
        return out
    if isinstance(stmt, cst.Assign):
        out = set()
        for target in stmt.targets:
            out |= _target_names(target.target)
        return out
    if isinstance(stmt, (cst.AugAssign, cst.AnnAssign)):
        return _target_names(stmt.target)
    if isinstance(stmt, cst.Expr) and isinstance(stmt.value, cst.Call):
        func = stmt.value.func
        if isinstance(func, cst.Attribute):
            return _target_names(func)
        return set()
    if isinstance(stmt, (cst.If, cst.For, cst.While, cst.Try, cst.With)):
        out = set()
        if isinstance(stmt, cst.For):
            out |= _target_names(stmt.target)
        for inner in _inner_statements(stmt):
            out |= _bound_names(inner)
        return out
    return set()


# -- the manifest ------------------------------------------------------------------
def _reach_unguarded(
    facts: Mapping[str, ModuleFacts], start: tuple[str, str], via: list[str], origin: str
) -> list[tuple[Use, list[str]]]:
    """Every use reachable from a unit, each symbol once, with the shortest chain."""
    seen = {start}
    queue: deque[tuple[tuple[str, str], list[str]]] = deque([(start, via)])
    found: dict[str, tuple[Use, list[str]]] = {}
    while queue:
        (module, name), chain = queue.popleft()
        unit = facts.get(module, ModuleFacts()).units.get(name)
        if unit is None:
            continue
        for use in unit.uses:
            found.setdefault(use.symbol, (use, chain))
        for link_module, link_name, _ in sorted(unit.links, key=repr):
            link = (link_module, link_name)
            if link not in seen:
                seen.add(link)
                label = link_name if link_module == origin else f"{link_module}.{link_name}"
                queue.append((link, [*chain, label]))
    return sorted(found.values(), key=lambda item: (len(item[1]), item[0].where))


def _reach(facts: Mapping[str, ModuleFacts], start: tuple[str, str]) -> list[dict[str, Any]]:
    """The entries of a function unit: each internal it uses directly, with the
    conditions around the use, and each one its references reach, with the
    conditions around the reference (deeper conditions are on other parameters: taken
    to hold). One entry per (symbol, conditions), the shortest chain first."""
    unit = facts.get(start[0], ModuleFacts()).units.get(start[1])
    if unit is None:
        return []
    reached: list[tuple[Use, list[str], Guards]] = [(use, [], use.guards) for use in unit.uses]
    for module, name, guards in sorted(unit.links, key=repr):
        label = name if module == start[0] else f"{module}.{name}"
        for use, via in _reach_unguarded(facts, (module, name), [label], start[0]):
            reached.append((use, via, guards))
    entries: dict[tuple[str, Guards], dict[str, Any]] = {}
    for use, via, guards in sorted(reached, key=lambda r: (len(r[1]), r[0].where)):
        key = (use.symbol, guards)
        if key in entries:
            continue
        entries[key] = {
            "symbol": use.symbol,
            "category": use.category,
            "used": use.used,
            "where": use.where,
            "via": via,
            "guards": [
                [name, op, list(value) if isinstance(value, tuple) else value]
                for name, op, value in guards
            ],
        }
    # unconditional entries first: they decide alone
    return sorted(entries.values(), key=lambda e: (bool(e["guards"]), len(e["via"])))


def analyze(sources: Mapping[str, str]) -> dict[str, Any]:
    """The manifest of a set of modules (stem -> source): for each module, ``units``
    (function qualname -> reachable TE internal and CUDA-only uses), the
    ``availability_lines``, and the ``import_time`` uses (module-level code that runs
    on import and reaches an internal, through the placeholders)."""
    siblings = set(sources)
    facts = {name: _Reader(name, src, siblings).read() for name, src in sources.items()}
    manifest: dict[str, Any] = {}
    for module, module_facts in facts.items():
        units: dict[str, list[dict[str, Any]]] = {}
        for name, unit in sorted(module_facts.units.items()):
            if not unit.function:
                continue
            entries = _reach(facts, (module, name))
            if entries:
                units[name] = entries
        import_time = [
            {"symbol": e["symbol"], "used": e["used"], "where": e["where"]}
            for e in _reach(facts, (module, "<module>"))
        ]
        manifest[module] = {
            "units": units,
            "availability_lines": sorted(module_facts.availability_lines),
            "import_time": import_time,
        }
    return manifest
