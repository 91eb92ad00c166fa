"""The rewrite of one TE test file: its TE imports and TE-qualified references, and its
device. Nothing else in the file changes (libcst keeps every other byte).

Imports and references (``symbols.resolve`` decides each TE name):

* ``import transformer_engine.pytorch as te`` -> ``import transformer_engine_ops as te``;
  any TE module this package stands in for likewise (``MODULES``).
* ``from transformer_engine.pytorch import A, B`` -> ``from transformer_engine_ops import
  A, B``; a deep import of a public TE name (``from transformer_engine.pytorch.tensor
  .float8_tensor import Float8Quantizer``) likewise; a mapped name from its module here.
* A public TE name this package does not offer, or a ``MISSING`` entry, binds
  ``_teops_te.missing("<TE name>")``: a placeholder that fails the test using it.
* A TE internal binds ``_teops_te.internal("<entry>", "<TE name>")``: a placeholder;
  the tests reaching it are skipped at collection (``analysis``), so it never runs.
* A TE test-support helper comes from ``_teops_te`` (``from _teops_te import
  init_method_normal``).
* ``import transformer_engine`` (which binds only the namespace) is dropped, and every
  ``transformer_engine.<...>`` reference through it is rewritten as above
  (``transformer_engine.common.recipe.Format`` -> ``transformer_engine_ops.recipe.Format``).
  A reference whose resolution differs from its root's (``te.ops.Linear``,
  ``FP8GlobalStateManager.reset``) is rewritten the same way.

Device (``_teops_device.DEVICE`` is ``"cpu"`` or ``"cuda"``):

* ``x.cuda()`` -> ``x.to(_teops_device.DEVICE)``.
* ``torch.cuda`` -> ``_teops_device.cuda``: ``torch.cuda`` itself on CUDA; on the CPU a
  namespace whose functions act on the CPU (``synchronize`` waits for nothing,
  ``manual_seed``/``get_rng_state``/``set_rng_state`` act on the CPU generator,
  ``is_available`` answers that the test device is there).
* ``"cuda"`` where a device is named (``device=``, ``device_type=``, the first argument of
  ``torch.device``/``torch.autocast``/``.to``, a ``device`` parameter's default, an
  assignment to ``device`` or to ``[...]["device"]``) -> ``_teops_device.DEVICE``.
  A ``"cuda"`` elsewhere (a parametrize value compared later) is left as it is.
"""

from __future__ import annotations

import ast
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

import libcst as cst
from libcst.metadata import (
    MetadataWrapper,
    ParentNodeProvider,
    PositionProvider,
    QualifiedName,
    QualifiedNameProvider,
    QualifiedNameSource,
)

from . import symbols
from .symbols import Resolution, Unclassified

DEVICE_EXPR = "_teops_device.DEVICE"
CUDA_EXPR = "_teops_device.cuda"
_IMPORTS_MARKER = "__teops_conformance_imports__"


class RewriteError(ValueError):
    """A file the rewrite cannot handle; the message names ``path:line`` and why."""


@dataclass
class Rewritten:
    source: str
    rules: Counter[str] = field(default_factory=Counter)


def te_qualified_name(names: Collection[QualifiedName]) -> str | None:
    """The TE name an expression refers to through an import, if any."""
    found = sorted(
        q.name
        for q in names
        if q.source == QualifiedNameSource.IMPORT and symbols.is_te_name(q.name)
    )
    return found[0] if found else None


def imported_name(names: Collection[QualifiedName]) -> str | None:
    """The dotted name an expression refers to through any import, if any."""
    found = sorted(q.name for q in names if q.source == QualifiedNameSource.IMPORT)
    return found[0] if found else None


def dotted(node: cst.BaseExpression) -> str | None:
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        base = dotted(node.value)
        return f"{base}.{node.attr.value}" if base else None
    return None


def _string_value(node: cst.CSTNode) -> str | None:
    if isinstance(node, cst.SimpleString):
        try:
            value = ast.literal_eval(node.value)
        except (ValueError, SyntaxError):
            return None
        return value if isinstance(value, str) else None
    return None


def _call_str(func: str, *args: str) -> cst.BaseExpression:
    return cst.parse_expression(f"{func}({', '.join(repr(a) for a in args)})")


def chain_names(qnames: Collection[QualifiedName], node: cst.CSTNode) -> Collection[QualifiedName]:
    """The qualified names of a plain dotted chain (``a.b.c``); none for anything else
    (libcst also names ``f(x).y`` as ``f.y``, which is not a reference to ``f.y``)."""
    if isinstance(node, (cst.Name, cst.Attribute)) and dotted(node) is not None:
        return qnames
    return ()


class _Rewriter(cst.CSTTransformer):
    METADATA_DEPENDENCIES = (QualifiedNameProvider, PositionProvider, ParentNodeProvider)

    def __init__(self, path: str, offered: Mapping[str, frozenset[str]]) -> None:
        super().__init__()
        self.path = path
        self.offered = offered
        self.rules: Counter[str] = Counter()
        self.required: dict[str, None] = {}  # modules to import, in order
        self.errors: list[str] = []
        self.unclassified: set[str] = set()
        self.replace: dict[cst.CSTNode, cst.BaseExpression] = {}
        self.marker_placed = False
        self.depth = 0  # statement nesting: 0 at module level

    # -- helpers -----------------------------------------------------------------
    def _line(self, node: cst.CSTNode) -> int:
        return self.get_metadata(PositionProvider, node).start.line

    def _error(self, node: cst.CSTNode, message: str) -> None:
        self.errors.append(f"{self.path}:{self._line(node)}: {message}")

    def _qnames(self, node: cst.CSTNode) -> Collection[QualifiedName]:
        return chain_names(self.get_metadata(QualifiedNameProvider, node, set()), node)

    def _require(self, module: str) -> None:
        self.required.setdefault(module, None)

    def _is_offered(self, res: Resolution) -> bool:
        names = self.offered.get(res.module)
        return names is None or res.attr is None or res.attr in names

    def _placeholder(self, res: Resolution, name: str) -> cst.BaseExpression:
        self._require("_teops_te")
        if res.kind == "internal":
            if name == res.key:
                return _call_str("_teops_te.internal", res.key)
            return _call_str("_teops_te.internal", res.key, name)
        if res.kind == "missing" and name != res.key:
            return _call_str("_teops_te.missing", name, res.key)
        return _call_str("_teops_te.missing", name)

    def _resolve(self, node: cst.CSTNode, name: str) -> Resolution | None:
        try:
            return symbols.resolve(name)
        except Unclassified:
            # once per name that an import binds (its uses would repeat it)
            if not any(name.startswith(seen) for seen in self.unclassified):
                self.unclassified.add(name)
                self._error(
                    node,
                    f"TE name {name} is not classified: add it to conformance/symbols.py "
                    "(MAPPED, SUPPORT, INTERNAL or MISSING)",
                )
            return None

    def _expression_for(self, res: Resolution, name: str) -> cst.BaseExpression:
        """What stands for TE's ``res.key`` here, as an expression (imports required)."""
        if res.kind in ("internal", "missing") or not self._is_offered(res):
            return self._placeholder(res, name)
        self._require(res.module)
        return cst.parse_expression(res.target)

    # -- imports -----------------------------------------------------------------
    def visit_IndentedBlock(self, node: cst.IndentedBlock) -> None:
        self.depth += 1

    def leave_IndentedBlock(
        self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock
    ) -> cst.IndentedBlock:
        self.depth -= 1
        return updated_node

    def _rewrite_import(self, node: cst.Import) -> list[cst.BaseSmallStatement] | None:
        if not any(symbols.is_te_name(dotted(a.name) or "") for a in node.names):
            return None
        out: list[cst.BaseSmallStatement] = []
        for alias in node.names:
            name = dotted(alias.name) or ""
            if not symbols.is_te_name(name):
                out.append(cst.Import(names=[alias.with_changes(comma=cst.MaybeSentinel.DEFAULT)]))
                continue
            if alias.asname is None:
                root = name.split(".")[0]
                try:
                    res = symbols.resolve(root)
                except Unclassified:
                    # `import transformer_engine[.x]`: a namespace; its references are
                    # rewritten one by one.
                    self.rules["drop-namespace-import"] += 1
                    continue
                bound = root
            else:
                res = self._resolve(alias, name)
                if res is None:
                    continue
                bound = cst.ensure_type(alias.asname.name, cst.Name).value
            out.extend(self._bind(res, name, bound))
        return out

    def _bind(self, res: Resolution, name: str, bound: str) -> list[cst.BaseSmallStatement]:
        """Statements binding ``bound`` to what stands for TE's ``name`` here."""
        if res.kind in ("internal", "missing") or not self._is_offered(res):
            self.rules["bind-internal" if res.kind == "internal" else "bind-missing"] += 1
            value = self._placeholder(res, name)
            return [cst.Assign(targets=[cst.AssignTarget(cst.Name(bound))], value=value)]
        rest = name[len(res.key) :]
        target = res.target + rest
        module, _, attr = target.rpartition(".")
        if res.kind == "module" and not rest:
            self.rules["import-module"] += 1
            if not module:
                return [cst.parse_statement(f"import {target} as {bound}").body[0]]
            return [_from_import(module, attr, bound)]
        if res.kind == "module":
            # A name inside a mapped module: offered only if the module lists it.
            names = self.offered.get(res.target)
            if names is not None and rest[1:] not in names:
                self.rules["bind-missing"] += 1
                value = self._placeholder(Resolution("missing", name), name)
                return [cst.Assign(targets=[cst.AssignTarget(cst.Name(bound))], value=value)]
        self.rules["import-support" if res.kind == "support" else "import-name"] += 1
        return [_from_import(module, attr, bound)]

    def _rewrite_import_from(self, node: cst.ImportFrom) -> list[cst.BaseSmallStatement] | None:
        if node.relative or node.module is None:
            return None
        module = dotted(node.module) or ""
        if not symbols.is_te_name(module):
            return None
        if isinstance(node.names, cst.ImportStar):
            self._error(node, f"`from {module} import *` cannot be rewritten")
            return []
        out: list[cst.BaseSmallStatement] = []
        for alias in node.names:
            attr = cst.ensure_type(alias.name, cst.Name).value
            name = f"{module}.{attr}"
            bound = cst.ensure_type(alias.asname.name, cst.Name).value if alias.asname else attr
            res = self._resolve(alias, name)
            if res is not None:
                out.extend(self._bind(res, name, bound))
        return _merge_from_imports(out)

    def leave_SimpleStatementLine(
        self, original_node: cst.SimpleStatementLine, updated_node: cst.SimpleStatementLine
    ) -> cst.BaseStatement | cst.FlattenSentinel[cst.BaseStatement]:
        new_small: list[cst.BaseSmallStatement] = []
        changed = False
        for small in updated_node.body:
            replaced: list[cst.BaseSmallStatement] | None = None
            if isinstance(small, cst.Import):
                replaced = self._rewrite_import(small)
            elif isinstance(small, cst.ImportFrom):
                replaced = self._rewrite_import_from(small)
            if replaced is None:
                new_small.append(small)
            else:
                changed = True
                new_small.extend(replaced)
        if not changed:
            return updated_node
        if not new_small:
            new_small = [cst.Pass()]
        # One physical line at the original statement's last line: the blank lines
        # above it keep every later line where TE wrote it (failures and skips are
        # reported at TE's own line numbers).
        span = self._span(original_node)
        padding = [cst.EmptyLine(indent=False)] * (span - 1)
        line = updated_node.with_changes(
            body=[s.with_changes(semicolon=cst.MaybeSentinel.DEFAULT) for s in new_small],
            leading_lines=[*updated_node.leading_lines, *padding],
        )
        if self.depth == 0 and not self.marker_placed:
            self.marker_placed = True
            return cst.FlattenSentinel([cst.parse_statement(f"{_IMPORTS_MARKER}\n"), line])
        return line

    def _span(self, node: cst.CSTNode) -> int:
        pos = self.get_metadata(PositionProvider, node)
        return pos.end.line - pos.start.line + 1

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        """Prepend the imports the rewrite needs to the first rewritten line (or to the
        first simple statement after the header), on that same line."""
        imports = [
            cst.Import(names=[cst.ImportAlias(cst.parse_expression(m))]) for m in self.required
        ]
        body = list(updated_node.body)
        at = next((i for i, stmt in enumerate(body) if _is_marker(stmt)), None)
        if at is not None:
            del body[at]
        else:
            at = _header_end(body)
            while at < len(body) and not isinstance(body[at], cst.SimpleStatementLine):
                at += 1
        if imports:
            if at >= len(body):
                body.append(cst.SimpleStatementLine(body=imports))
            else:
                first = cst.ensure_type(body[at], cst.SimpleStatementLine)
                rest = [s for s in first.body if not isinstance(s, cst.Pass)]
                body[at] = first.with_changes(body=[*imports, *rest])
        return updated_node.with_changes(body=body)

    # -- references ----------------------------------------------------------------
    def visit_Import(self, node: cst.Import) -> bool:
        return False

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        return False

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        name = te_qualified_name(self._qnames(node))
        if name is None:
            return True
        self._plan_reference(node, name)
        return False

    def visit_Name(self, node: cst.Name) -> None:
        name = te_qualified_name(self._qnames(node))
        if name is None:
            return
        parent = self.get_metadata(ParentNodeProvider, node)
        if isinstance(parent, cst.Attribute) and parent.attr is node:
            return
        try:
            symbols.resolve(name.split(".")[0])
        except Unclassified:
            if "." not in name:
                self._error(node, f"`{name}` is used as a value; only its attributes can be mapped")

    def _plan_reference(self, node: cst.Attribute, name: str) -> None:
        chain = _chain(node)  # outermost first, the root Name last
        root = chain[-1]
        root_name = te_qualified_name(self._qnames(root)) or ""
        res = self._resolve(node, name)
        if res is None:
            return
        try:
            root_res: Resolution | None = symbols.resolve(root_name)
        except Unclassified:
            root_res = None
        if root_res is not None and root_res.key == res.key:
            return
        if (
            root_res is not None
            and root_res.kind not in ("internal", "missing")
            and res.kind not in ("internal", "missing")
            and root_res.target + res.key[len(root_name) :] == res.target
        ):
            return  # `te.DType` is already transformer_engine_ops.DType
        # The sub-chain that names exactly res.key is replaced.
        for sub in chain:
            if te_qualified_name(self._qnames(sub)) == res.key:
                expression = self._expression_for(res, res.key)
                # the chain's children are not visited: the outermost node is rebuilt
                self.replace[node] = (
                    expression if sub is node else node.deep_replace(sub, expression)
                )
                self.rules["reference"] += 1
                return
        self._error(node, f"cannot find the part of {name} that names {res.key}")

    def leave_Attribute(
        self, original_node: cst.Attribute, updated_node: cst.Attribute
    ) -> cst.BaseExpression:
        if original_node in self.replace:
            return self.replace[original_node]
        if imported_name(self._qnames(original_node)) == "torch.cuda":
            self._require("_teops_device")
            self.rules["device-torch-cuda"] += 1
            return cst.parse_expression(CUDA_EXPR)
        return updated_node

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.BaseExpression:
        if original_node in self.replace:
            return self.replace[original_node]
        return updated_node

    # -- device ------------------------------------------------------------------
    def _device(self) -> cst.BaseExpression:
        self._require("_teops_device")
        self.rules["device-literal"] += 1
        return cst.parse_expression(DEVICE_EXPR)

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        func = updated_node.func
        if (
            isinstance(func, cst.Attribute)
            and func.attr.value == "cuda"
            and not updated_node.args
            and imported_name(self._qnames(original_node.func)) != "torch.cuda"
        ):
            self._require("_teops_device")
            self.rules["device-cuda-call"] += 1
            return updated_node.with_changes(
                func=func.with_changes(attr=cst.Name("to")),
                args=[cst.Arg(cst.parse_expression(DEVICE_EXPR))],
            )
        callee = imported_name(self._qnames(original_node.func))
        names_device = callee in ("torch.device", "torch.autocast", "torch.amp.autocast") or (
            isinstance(func, cst.Attribute) and func.attr.value == "to" and callee is None
        )
        if names_device and updated_node.args:
            first = updated_node.args[0]
            if first.keyword is None and _string_value(first.value) == "cuda":
                args = [first.with_changes(value=self._device()), *updated_node.args[1:]]
                return updated_node.with_changes(args=args)
        return updated_node

    def leave_Arg(self, original_node: cst.Arg, updated_node: cst.Arg) -> cst.Arg:
        if (
            updated_node.keyword is not None
            and updated_node.keyword.value in ("device", "device_type")
            and _string_value(updated_node.value) == "cuda"
        ):
            return updated_node.with_changes(value=self._device())
        return updated_node

    def leave_Param(self, original_node: cst.Param, updated_node: cst.Param) -> cst.Param:
        if (
            updated_node.name.value == "device"
            and updated_node.default is not None
            and _string_value(updated_node.default) == "cuda"
        ):
            return updated_node.with_changes(default=self._device())
        return updated_node

    def leave_Assign(self, original_node: cst.Assign, updated_node: cst.Assign) -> cst.Assign:
        if _string_value(updated_node.value) != "cuda" or len(updated_node.targets) != 1:
            return updated_node
        target = updated_node.targets[0].target
        if isinstance(target, cst.Name) and target.value == "device":
            return updated_node.with_changes(value=self._device())
        if isinstance(target, cst.Subscript) and len(target.slice) == 1:
            index = target.slice[0].slice
            if isinstance(index, cst.Index) and _string_value(index.value) == "device":
                return updated_node.with_changes(value=self._device())
        return updated_node

    def leave_DictElement(
        self, original_node: cst.DictElement, updated_node: cst.DictElement
    ) -> cst.DictElement:
        if _string_value(updated_node.key) == "device" and _string_value(updated_node.value) == (
            "cuda"
        ):
            return updated_node.with_changes(value=self._device())
        return updated_node


def _chain(node: cst.BaseExpression) -> list[cst.BaseExpression]:
    out: list[cst.BaseExpression] = []
    while isinstance(node, cst.Attribute):
        out.append(node)
        node = node.value
    out.append(node)
    return out


def _from_import(module: str, attr: str, bound: str) -> cst.ImportFrom:
    alias = f"{attr} as {bound}" if attr != bound else attr
    stmt = cst.parse_statement(f"from {module} import {alias}\n")
    return cst.ensure_type(cst.ensure_type(stmt, cst.SimpleStatementLine).body[0], cst.ImportFrom)


def _merge_from_imports(stmts: Sequence[cst.BaseSmallStatement]) -> list[cst.BaseSmallStatement]:
    """One ``from M import a, b`` per module (first-seen order), then the placeholders."""
    by_module: dict[str, list[cst.ImportAlias]] = {}
    others: list[cst.BaseSmallStatement] = []
    for stmt in stmts:
        if isinstance(stmt, cst.ImportFrom) and not isinstance(stmt.names, cst.ImportStar):
            module = dotted(stmt.module) or ""  # type: ignore[arg-type]
            by_module.setdefault(module, []).extend(stmt.names)
        else:
            others.append(stmt)
    merged: list[cst.BaseSmallStatement] = []
    for module, aliases in by_module.items():
        text = ", ".join(cst.Module([]).code_for_node(a.with_changes(comma=None)) for a in aliases)
        merged.append(
            cst.ensure_type(
                cst.ensure_type(
                    cst.parse_statement(f"from {module} import {text}\n"), cst.SimpleStatementLine
                ).body[0],
                cst.ImportFrom,
            )
        )
    return merged + others


def _is_marker(stmt: cst.CSTNode) -> bool:
    return (
        isinstance(stmt, cst.SimpleStatementLine)
        and len(stmt.body) == 1
        and isinstance(stmt.body[0], cst.Expr)
        and isinstance(stmt.body[0].value, cst.Name)
        and stmt.body[0].value.value == _IMPORTS_MARKER
    )


def _header_end(body: Sequence[cst.BaseStatement]) -> int:
    """Index after the docstring and the ``from __future__`` imports."""
    i = 0
    if body and isinstance(body[0], cst.SimpleStatementLine):
        first = body[0].body[0]
        if isinstance(first, cst.Expr) and isinstance(first.value, cst.SimpleString):
            i = 1
    while i < len(body):
        stmt = body[i]
        if (
            isinstance(stmt, cst.SimpleStatementLine)
            and isinstance(stmt.body[0], cst.ImportFrom)
            and dotted(stmt.body[0].module or cst.Name("x")) == "__future__"
        ):
            i += 1
            continue
        break
    return i


def rewrite_source(
    source: str, path: str, offered: Mapping[str, frozenset[str]] | None = None
) -> Rewritten:
    """Rewrite one test file's source. ``offered`` maps a module of this package to the
    names it offers (a name not listed binds a failing placeholder); a module not in it
    is taken to offer everything. Raises ``RewriteError`` listing every TE name that
    cannot be rewritten."""
    try:
        module = cst.parse_module(source)
    except cst.ParserSyntaxError as exc:
        raise RewriteError(f"{path}:{exc.raw_line}:{exc.raw_column}: {exc.message}") from None
    wrapper = MetadataWrapper(module)
    rewriter = _Rewriter(path, offered or {})
    new = wrapper.visit(rewriter)
    if rewriter.errors:
        raise RewriteError("\n".join(rewriter.errors))
    return Rewritten(new.code, rewriter.rules)
