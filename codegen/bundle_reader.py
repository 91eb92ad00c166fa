"""Read a bundle class: its fields, their annotations as type expressions, their kinds."""

from __future__ import annotations

import ast
import keyword
from collections.abc import Container

import libcst as cst

from . import kinds, nesting
from .config import Config
from .errors import CodegenError, Location
from .model import Bundle, Field, TypeExpr
from .names import AmbiguousName, Enums, Resolver, SourceFile, base_names, code_of, dotted_name
from .safety import is_identifier

_DATACLASS = "dataclasses.dataclass"
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


def _type_expr(
    file: SourceFile,
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
    dotted = dotted_name(node)
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
            except AmbiguousName as exc:
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
        f"unsupported annotation syntax `{code_of(node)}`",
        "use a name, a subscripted generic or `X | None`",
    )


def _expand_alias(file: SourceFile, name: str, use: cst.CSTNode, depth: int) -> TypeExpr:
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
    resolver: Resolver, qualname: str, use: Location, depth: int
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
    file: SourceFile, parsed: cst.BaseExpression, anchor: cst.CSTNode, text: str, depth: int
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


def _is_dataclass(file: SourceFile, cls: cst.ClassDef) -> bool:
    for decorator in cls.decorators:
        target = decorator.decorator
        if isinstance(target, cst.Call):
            target = target.func
        dotted = dotted_name(target)
        if (
            dotted is not None
            and file.resolves(dotted)
            and file.qualify(dotted, target) == _DATACLASS
        ):
            return True
    return False


def _read_bundle(
    file: SourceFile, cls: cst.ClassDef, config: Config, enums: Container[str]
) -> Bundle:
    name = cls.name.value
    bases = [b for b in base_names(file, cls) if b != "builtins.object"]
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
                    f"`{code_of(target)}` in bundle `{name}` has no annotation, so it is not "
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
    file: SourceFile,
    bundle: str,
    node: cst.AnnAssign,
    config: Config,
    enums: Container[str],
    seen: dict[str, Location],
) -> Field | None:
    if not isinstance(node.target, cst.Name):
        raise CodegenError(
            file.loc(node.target),
            f"`{code_of(node.target)}` is not a field name",
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
    default = None if node.value is None else code_of(node.value)
    source = code_of(node.annotation.annotation)
    try:
        source = ast.unparse(ast.parse(source.strip(), mode="eval"))
    except SyntaxError:
        pass
    return Field(name, kinds.render(expr), ftype, slots, where, default, "".join(source.split()))


def _check_init(file: SourceFile, bundle: str, name: str, value: cst.BaseExpression | None) -> None:
    """Refuse ``field(init=...)`` other than ``init=True``.

    An ``init=False`` field is no constructor argument: unflatten (which builds the bundle
    through its constructor) could not pass it, and a value set after construction would
    be lost at the op boundary, so it is refused rather than silently reset.
    """
    if not isinstance(value, cst.Call):
        return
    callee = dotted_name(value.func)
    if callee is None or not file.resolves(callee) or file.qualify(callee, value.func) != _FIELD:
        return
    for arg in value.args:
        if arg.keyword is not None and arg.keyword.value == "init":
            if not (isinstance(arg.value, cst.Name) and arg.value.value == "True"):
                raise CodegenError(
                    file.loc(arg),
                    f"field `{bundle}.{name}` is declared with `{code_of(arg)}`: it is not a "
                    "constructor argument, so it cannot cross the op boundary",
                    "drop `init=False` (make it a field), or make it a ClassVar or a property",
                )


class BundleReader:
    """Reads each bundle class an op names, once; a bundle must be a local @dataclass."""

    def __init__(
        self, file: SourceFile, classes: dict[str, cst.ClassDef], config: Config, enums: Enums
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
        bundle = _read_bundle(self._file, cls, self._config, self._enums)
        self._cache[name] = bundle
        return bundle
