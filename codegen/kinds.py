"""The field-kind rules: one annotation -> one kind -> its schema slots.

Pure functions of the resolved annotation and the configured type table; this
is the single place that decides how a bundle field crosses an op boundary.
``KIND_TABLE`` is the human-readable form, printed into the README.
"""

from __future__ import annotations

from .config import Config
from .errors import CodegenError
from .model import FieldType, Kind, Slot, TypeExpr

# (annotation, kind, schema slots, crossing) -- printed by `python -m codegen kinds`.
KIND_TABLE: tuple[tuple[str, str, str, str], ...] = (
    (
        "`torch.Tensor` / `Optional[torch.Tensor]`",
        "tensor",
        "`Tensor x` / `Tensor? x`",
        "as is; may receive a gradient",
    ),
    ("`List[torch.Tensor]`", "tensor list", "`Tensor[] x`", "as is"),
    (
        "`TensorOrQuantized`, optional or not",
        "tensor-or-quantized",
        "`Tensor? x, Tensor[] x__inner, <meta> x__meta`",
        "a quantized value crosses as its inner buffers plus a value-opaque description",
    ),
    (
        "`bool`, `int`, `float`, `str`, optional or not",
        "scalar",
        "`bool`, `SymInt`, `float`, `str` (+`?`)",
        "one typed slot per field",
    ),
    ("`torch.dtype`, `torch.device`", "scalar", "`ScalarType`, `Device` (+`?`)", "typed slot"),
    (
        "`torch.Size` / `Tuple[int, ...]`",
        "size",
        "`SymInt[]` (+`?`)",
        "typed slot; unflattened to `torch.Size`",
    ),
    (
        "`Enum` subclass defined in the op module",
        "enum",
        "`str` (+`?`)",
        "the member name; converted back and validated",
    ),
    ("`Literal['a', 'b']`", "literal", "`str` (+`?`)", "validated against the choices"),
    (
        "a configured quantizer class",
        "quantizer",
        "one value-opaque slot (+`?`)",
        "baked into the graph as a constant",
    ),
    (
        "a configured process-group type",
        "process group",
        "`str?`",
        "its c10d registry name, re-resolved inside the op",
    ),
    (
        "a configured value type",
        "value",
        "one value-opaque slot (+`?`)",
        "baked into the graph as a constant",
    ),
    (
        "`Any`, `Callable[...]`",
        "unsupported",
        "none",
        "allowed only when the value is None at call time",
    ),
)

_OPTIONAL = {"typing.Optional"}
_UNION = {"typing.Union", "<union>"}
_LIST = {"typing.List", "builtins.list"}
_TUPLE = {"typing.Tuple", "builtins.tuple"}
_LITERAL = {"typing.Literal", "typing_extensions.Literal"}
_UNSUPPORTED = {"typing.Any", "typing.Callable", "collections.abc.Callable"}
_SCALARS = {
    "builtins.bool": "bool",
    "builtins.int": "SymInt",
    "builtins.float": "float",
    "builtins.str": "str",
    "torch.dtype": "ScalarType",
    "torch.device": "Device",
}
_TENSOR = "torch.Tensor"
_SIZE = "torch.Size"


def render(expr: TypeExpr) -> str:
    """Source-like text of an annotation (qualified names kept short)."""
    if expr.name == "<literal>":
        return repr(expr.value)
    if expr.name == "<list>":
        return "[" + ", ".join(render(a) for a in expr.args) + "]"
    if expr.name == "<union>":
        return " | ".join(render(a) for a in expr.args)
    if expr.name == "...":
        return "..."
    base = expr.name.rsplit(".", 1)[-1]
    if not expr.args:
        return base
    return f"{base}[{', '.join(render(a) for a in expr.args)}]"


def _strip_optional(expr: TypeExpr) -> tuple[TypeExpr, bool]:
    """``Optional[X]``, ``Union[X, None]``, ``X | None`` -> (X, True)."""
    if expr.name in _OPTIONAL:
        return expr.args[0], True
    if expr.name in _UNION:
        members = [a for a in expr.args if a.name != "None"]
        optional = len(members) < len(expr.args)
        if len(members) == 1:
            return members[0], optional
        names = ", ".join(render(m) for m in members)
        raise CodegenError(
            expr.location,
            f"mixed union of {names}: a field must have exactly one kind",
            "split it into one field per kind, or use TensorOrQuantized for a tensor "
            "that may be quantized",
        )
    return expr, False


def classify(expr: TypeExpr, config: Config, local_enums: frozenset[str]) -> FieldType:
    """The kind of one field's annotation, or a positioned error saying why none fits."""
    inner, optional = _strip_optional(expr)
    name = inner.name
    if name == "None":
        raise CodegenError(
            inner.location, "a field annotated `None` carries nothing", "remove the field"
        )
    if name in _UNION or name in _OPTIONAL:
        # Optional[Optional[X]] and the like: classify the stripped form again.
        nested = classify(inner, config, local_enums)
        return FieldType(nested.kind, True, nested.schema_type, nested.python_type, nested.choices)
    if name == _TENSOR:
        return FieldType(Kind.TENSOR, optional, "Tensor", _TENSOR)
    if name in _LIST:
        if len(inner.args) == 1 and inner.args[0].name == _TENSOR:
            return FieldType(Kind.TENSOR_LIST, optional, "Tensor[]", _TENSOR)
        raise CodegenError(
            inner.location,
            f"unsupported list annotation `{render(inner)}`: only List[torch.Tensor] "
            "crosses an op boundary",
            "use List[torch.Tensor], or Tuple[int, ...] for a shape",
        )
    if name == _SIZE or name in _TUPLE:
        if name == _SIZE or (
            len(inner.args) == 2
            and inner.args[0].name == "builtins.int"
            and inner.args[1].name == "..."
        ):
            return FieldType(Kind.SIZE, optional, "SymInt[]", _SIZE)
        raise CodegenError(
            inner.location,
            f"unsupported tuple annotation `{render(inner)}`",
            "only torch.Size or Tuple[int, ...] (a shape) crosses as a typed slot",
        )
    if name in _SCALARS:
        return FieldType(Kind.SCALAR, optional, _SCALARS[name], name)
    if name in _LITERAL:
        values = [a.value for a in inner.args]
        if not values or not all(
            a.name == "<literal>" and isinstance(a.value, str) for a in inner.args
        ):
            raise CodegenError(
                inner.location,
                f"`{render(inner)}`: a Literal field must list one or more strings",
                "write Literal['a', 'b'], or use an Enum",
            )
        return FieldType(
            Kind.LITERAL, optional, "str", "builtins.str", tuple(str(v) for v in values)
        )
    if name in local_enums:
        return FieldType(Kind.ENUM, optional, "str", name)
    if name in _UNSUPPORTED:
        return FieldType(Kind.UNSUPPORTED, True, "", "")
    configured = config.kind_of(name)
    if configured == "tensor_or_quantized":
        return FieldType(Kind.TENSOR_OR_QUANTIZED, optional, "Tensor", name)
    if configured == "quantizer":
        return FieldType(Kind.QUANTIZER, optional, name, name)
    if configured == "value":
        return FieldType(Kind.VALUE, optional, name, name)
    if configured == "process_group":
        return FieldType(Kind.PROCESS_GROUP, optional, "str", name)
    raise CodegenError(
        inner.location,
        f"unknown type `{name}`: it maps to no field kind",
        "use a supported annotation (see `python -m codegen kinds`), declare the type "
        "in [tool.transformer_engine_ops.codegen.kinds] of pyproject.toml, or annotate "
        "it Optional[Any] if it must be None across the boundary",
    )


def slots_for(name: str, ftype: FieldType, meta_type: str) -> tuple[Slot, ...]:
    """The schema slots of one field, in schema order."""
    q = "?" if ftype.optional else ""
    kind = ftype.kind
    if kind is Kind.UNSUPPORTED:
        return ()
    if kind is Kind.TENSOR_OR_QUANTIZED:
        return (
            Slot(name, "Tensor?"),
            Slot(f"{name}__inner", "Tensor[]"),
            Slot(f"{name}__meta", meta_type),
        )
    if kind is Kind.PROCESS_GROUP:
        return (Slot(name, "str?"),)
    return (Slot(name, ftype.schema_type + q),)
