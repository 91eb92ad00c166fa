"""Read op modules statically with libcst: bundles, enums and op declarations.

Nothing here imports the code it reads. Every name is resolved through the
file's own imports (``from torch import Tensor as T`` is still ``torch.Tensor``)
and every entity keeps its ``path:line:col``.
"""

from __future__ import annotations

import ast
import builtins
import keyword
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import libcst as cst
from libcst.metadata import CodeRange, MetadataWrapper, PositionProvider

from . import kinds
from .config import Config
from .errors import CodegenError, Location
from .model import (
    GRAD_OUTPUT_FIELD,
    GRAD_OUTPUTS_FIELD,
    Bundle,
    Field,
    Impls,
    Op,
    SourceModule,
    TypeExpr,
)

DECLARATION = "transformer_engine_ops.runtime.declaration.OpDeclaration"
_DATACLASS = "dataclasses.dataclass"
_ENUM_BASES = {"enum.Enum", "enum.IntEnum", "enum.StrEnum"}
_CLASSVAR = {"typing.ClassVar"}
_IMPL_KEYS = ("forward_impl", "backward_impl", "forward_spec", "backward_spec", "setup_context")
_DECL_KEYS = ("name", "forward", "backward", "grad_fields", *_IMPL_KEYS)


def module_name(path: str) -> str:
    """``transformer_engine_ops/ops/linear.py`` -> ``transformer_engine_ops.ops.linear``."""
    return path.removesuffix(".py").replace("/", ".")


@dataclass
class _File:
    """Per-file reading state: positions and the module-level names for resolution."""

    path: str
    module: str
    positions: Mapping[cst.CSTNode, CodeRange]
    names: dict[str, str]  # module-level name -> qualified name
    aliases: dict[str, cst.BaseExpression]  # module-level `Alias = <annotation>`
    expanding: tuple[str, ...] = ()

    def loc(self, node: cst.CSTNode) -> Location:
        start = self.positions[node].start
        return Location(self.path, start.line, start.column + 1)

    def resolves(self, dotted: str) -> bool:
        head = dotted.split(".", 1)[0]
        return head in self.names or (head == dotted and head in _BUILTINS)

    def qualify(self, dotted: str, node: cst.CSTNode) -> str:
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


def _module_names(body: Sequence[cst.CSTNode], module: str) -> dict[str, str]:
    """What each module-level name means: imports resolved, local definitions qualified.

    Annotations are evaluated in module scope, so this table is all name resolution
    needs (libcst's ScopeProvider would also work, at twice the cost of a whole run).
    """
    names: dict[str, str] = {}
    package = module.rsplit(".", 1)[0]
    for statement in body:
        if isinstance(statement, cst.ClassDef | cst.FunctionDef):
            names[statement.name.value] = f"{module}.{statement.name.value}"
        elif isinstance(statement, cst.If | cst.Try):  # `if TYPE_CHECKING:` and friends
            blocks = [statement.body, *([statement.orelse] if statement.orelse else [])]
            for block in blocks:
                names.update(_module_names(getattr(block, "body", []), module))
        elif isinstance(statement, cst.SimpleStatementLine):
            for small in statement.body:
                if isinstance(small, cst.Import):
                    for alias in small.names:
                        dotted = _dotted(alias.name) or ""
                        if alias.asname is not None:
                            names[_dotted(alias.asname.name) or dotted] = dotted  # type: ignore[arg-type]
                        else:
                            head = dotted.split(".", 1)[0]
                            names[head] = head
                elif isinstance(small, cst.ImportFrom) and not isinstance(
                    small.names, cst.ImportStar
                ):
                    base = _dotted(small.module) if small.module is not None else ""
                    if small.relative:
                        parent = (
                            package.rsplit(".", len(small.relative) - 1)[0]
                            if len(small.relative) > 1
                            else package
                        )
                        base = f"{parent}.{base}" if base else parent
                    for alias in small.names:
                        name = alias.name.value  # type: ignore[union-attr]
                        local = _dotted(alias.asname.name) if alias.asname else name  # type: ignore[union-attr]
                        names[local or name] = f"{base}.{name}"
                elif isinstance(small, cst.Assign | cst.AnnAssign):
                    targets = small.targets if isinstance(small, cst.Assign) else [small]
                    for target in targets:
                        if isinstance(target.target, cst.Name):
                            names[target.target.value] = f"{module}.{target.target.value}"
    return names


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
) -> TypeExpr:
    """Convert an annotation expression; ``anchor`` positions nodes parsed from a string."""
    where = file.loc(anchor if anchor is not None else node)
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
        try:
            parsed = cst.parse_expression(text) if isinstance(text, str) else None
        except cst.ParserSyntaxError:
            parsed = None
        if parsed is None:
            raise CodegenError(
                where,
                f"cannot parse the string annotation {text!r}",
                "write the annotation without quotes",
            )
        return _string_type_expr(file, parsed, anchor or node, text)
    if isinstance(node, cst.Ellipsis):
        return TypeExpr("...", where)
    if isinstance(node, cst.List):
        return TypeExpr(
            "<list>", where, tuple(_type_expr(file, e.value, anchor) for e in node.elements)
        )
    # (libcst.matchers would read nicer but costs 0.4 s of import time per run.)
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.BitOr):
        assert isinstance(node, cst.BinaryOperation)
        left = _type_expr(file, node.left, anchor)
        right = _type_expr(file, node.right, anchor)
        members = tuple(
            a for side in (left, right) for a in (side.args if side.name == "<union>" else (side,))
        )
        return TypeExpr("<union>", where, members)
    dotted = _dotted(node)
    if dotted is not None:
        if dotted == "None":
            return TypeExpr("None", where)
        if dotted in file.aliases:
            return _expand_alias(file, dotted, anchor or node)
        return TypeExpr(file.qualify(dotted, anchor or node), where)
    if isinstance(node, cst.Subscript):
        base = _type_expr(file, node.value, anchor)
        literal = base.name in {"typing.Literal", "typing_extensions.Literal"}
        args = []
        for element in node.slice:
            if not isinstance(element.slice, cst.Index):
                raise CodegenError(file.loc(anchor or element), "slices are not annotations")
            args.append(_type_expr(file, element.slice.value, anchor, in_literal=literal))
        return TypeExpr(base.name, where, tuple(args))
    raise CodegenError(
        where,
        f"unsupported annotation syntax `{_code(node)}`",
        "use a name, a subscripted generic or `X | None`",
    )


def _expand_alias(file: _File, name: str, use: cst.CSTNode) -> TypeExpr:
    """A module-level type alias reads as what it stands for, positioned at its use."""
    if name in file.expanding:
        raise CodegenError(
            file.loc(use),
            f"type alias `{name}` refers to itself",
            "define the alias without recursion",
        )
    file.expanding += (name,)
    try:
        return _type_expr(file, file.aliases[name], use)
    finally:
        file.expanding = file.expanding[:-1]


def _string_type_expr(
    file: _File, parsed: cst.BaseExpression, anchor: cst.CSTNode, text: str
) -> TypeExpr:
    try:
        return _type_expr(file, parsed, anchor)
    except CodegenError as exc:
        raise CodegenError(
            exc.location, f"in string annotation {text!r}: {exc.message}", exc.hint
        ) from None


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
    fields: list[Field] = []
    seen: dict[str, Location] = {}
    for statement in cls.body.body:
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
    if expr.name in _CLASSVAR:
        return None
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
    return Field(name, kinds.render(expr), ftype, slots, where)


class _BundleReader:
    """Reads each bundle class an op names, once; a bundle must be a local @dataclass."""

    def __init__(
        self, file: _File, classes: dict[str, cst.ClassDef], config: Config, enums: frozenset[str]
    ) -> None:
        self._file, self._classes, self._config, self._enums = file, classes, config, enums
        self._cache: dict[str, Bundle] = {}

    def __call__(self, key: str, node: cst.Name) -> Bundle:
        name = node.value
        if name in self._cache:
            return self._cache[name]
        cls = self._classes.get(name)
        if cls is None:
            raise CodegenError(
                self._file.loc(node),
                f"`{key}={name}` names no bundle class defined in this file",
                "define the bundle as a @dataclass in the op module, or fix the name",
            )
        if not _is_dataclass(self._file, cls):
            raise CodegenError(
                self._file.loc(cls.name),
                f"`{name}` is named as the {key} bundle but is not a @dataclass",
                f"decorate `{name}` with @dataclass",
            )
        bundle = _read_bundle(self._file, cls, self._config, self._enums)
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


def _read_declaration(
    file: _File, call: cst.Call, read_bundle: _BundleReader, functions: set[str]
) -> Op:
    where = file.loc(call)
    given: dict[str, cst.BaseExpression] = {}
    for arg in call.args:
        if arg.keyword is None:
            raise CodegenError(
                file.loc(arg),
                "OpDeclaration takes keyword arguments only",
                f"name each argument: {', '.join(_DECL_KEYS)}",
            )
        key = arg.keyword.value
        if key not in _DECL_KEYS:
            raise CodegenError(
                file.loc(arg.keyword),
                f"unknown OpDeclaration argument `{key}`",
                f"expected one of: {', '.join(_DECL_KEYS)}",
            )
        given[key] = arg.value
    for key in ("name", "forward", "backward", "grad_fields"):
        if key not in given:
            raise CodegenError(
                where, f"OpDeclaration lacks `{key}`", f"add {key}=... to the declaration"
            )
    name_node = given["name"]
    if (
        not isinstance(name_node, cst.SimpleString)
        or not str(name_node.evaluated_value).isidentifier()
    ):
        raise CodegenError(
            file.loc(name_node), "`name` must be a string literal identifier", 'write name="my_op"'
        )
    op_name = str(name_node.evaluated_value)

    def bundle(key: str) -> Bundle:
        node = given[key]
        if not isinstance(node, cst.Name):
            raise CodegenError(
                file.loc(node), f"`{key}` must name a bundle class", f"write {key}=MyArgs"
            )
        return read_bundle(key, node)

    forward, backward = bundle("forward"), bundle("backward")
    grad_fields = _literal_strings(file, given["grad_fields"], "grad_fields")
    # _literal_strings checked the node: a tuple/list of strings, one element per name.
    grad_nodes = given["grad_fields"].elements  # type: ignore[attr-defined]
    for grad, grad_node in zip(grad_fields, grad_nodes, strict=True):
        field = forward.field(grad)
        if field is None:
            raise CodegenError(
                file.loc(grad_node.value),
                f"gradient field `{grad}` is not a field of `{forward.name}`",
                f"name fields of {forward.name}",
            )
        if not kinds.may_receive_gradient(field.type):
            raise CodegenError(
                file.loc(grad_node.value),
                f"gradient field `{forward.name}.{grad}` is a {field.type.kind.value}, "
                "which cannot receive a gradient",
                "only tensor, tensor-list and tensor-or-quantized fields receive gradients",
            )
    if len(set(grad_fields)) != len(grad_fields):
        raise CodegenError(
            file.loc(given["grad_fields"]),
            "`grad_fields` repeats a field",
            "name each gradient field once",
        )
    present = [k for k in _IMPL_KEYS if k in given]
    impls = None
    if present:
        missing = [k for k in _IMPL_KEYS if k not in given]
        if missing:
            raise CodegenError(
                where,
                f"OpDeclaration names {', '.join(present)} but not {', '.join(missing)}",
                "give all five implementation functions, or none",
            )
        names = {}
        for key in _IMPL_KEYS:
            node = given[key]
            if not isinstance(node, cst.Name) or node.value not in functions:
                raise CodegenError(
                    file.loc(node),
                    f"`{key}` must name a function defined in this file",
                    f"define `def {_code(node)}(...)` at module level",
                )
            names[key] = node.value
        impls = Impls(**names)
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
    return Op(op_name, forward, backward, grad_fields, impls, where)


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


def read_source(path: str, text: str, config: Config) -> SourceModule:
    """Read one op module; raise ``CodegenError`` at the first problem."""
    try:
        tree = cst.parse_module(text)
    except cst.ParserSyntaxError as exc:
        raise _syntax_error(path, text, exc) from None
    # The tree is ours alone, so the wrapper need not deep-copy it.
    wrapper = MetadataWrapper(tree, unsafe_skip_copy=True)
    positions = wrapper.resolve(PositionProvider)
    body: Sequence[cst.CSTNode] = wrapper.module.body
    aliases = {
        small.targets[0].target.value: small.value
        for statement in body
        if isinstance(statement, cst.SimpleStatementLine)
        for small in statement.body
        if isinstance(small, cst.Assign)
        and len(small.targets) == 1
        and isinstance(small.targets[0].target, cst.Name)
        and isinstance(small.value, cst.Subscript | cst.BinaryOperation)
    }
    module = module_name(path)
    file = _File(path, module, positions, _module_names(body, module), aliases)

    classes = [s for s in body if isinstance(s, cst.ClassDef)]
    enums = frozenset(
        f"{file.module}.{c.name.value}"
        for c in classes
        if any(b in _ENUM_BASES for b in _base_names(file, c))
    )
    functions = {s.name.value for s in body if isinstance(s, cst.FunctionDef)}
    read_bundle = _BundleReader(file, {c.name.value: c for c in classes}, config, enums)

    ops: list[Op] = []
    for statement in body:
        if not isinstance(statement, cst.SimpleStatementLine):
            continue
        for small in statement.body:
            value = small.value if isinstance(small, cst.Assign | cst.AnnAssign) else None
            if not isinstance(value, cst.Call):
                continue
            callee = _dotted(value.func)
            if callee is None or not file.resolves(callee):
                continue
            if file.qualify(callee, value.func) == DECLARATION:
                if ops:
                    raise CodegenError(
                        file.loc(value),
                        "a second OpDeclaration in one op module",
                        f"move it to its own module (the first is at {ops[0].location})",
                    )
                ops.append(_read_declaration(file, value, read_bundle, functions))
    if not ops:
        raise CodegenError(
            Location(path, 1, 1),
            "no OpDeclaration found in this op module",
            "declare the op: NAME = OpDeclaration(name=..., forward=..., ...)",
        )
    return SourceModule(path, file.module, text, tuple(ops))
