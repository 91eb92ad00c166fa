"""The field kinds: one record per kind, the single place that says how a field crosses.

A :class:`KindRecord` holds everything about one kind: which annotations it matches,
the schema slots a field of that kind becomes, the code that flattens (packs) and
unflattens (unpacks) it in a generated module, the spec helper fake kernels see it
through, whether it may receive a gradient and how autograd sees its slots, and its
rows of the documentation table (docs/codegen.md and ``python -m codegen kinds``).

Which qualified names mean tensor-or-quantized, quantizer, process group, value or
unsupported (None-only) is configuration (``[tool.transformer_engine_ops.codegen.kinds]``).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Container
from dataclasses import dataclass

from .config import Config
from .errors import CodegenError
from .model import FieldType, Kind, SchemaType, Slot, TypeExpr

_OPTIONAL = {"typing.Optional"}
_UNION = {"typing.Union", "<union>"}
_LIST = {"typing.List", "builtins.list", "typing.Sequence", "collections.abc.Sequence"}
_TUPLE = {"typing.Tuple", "builtins.tuple"}
_LITERAL = {"typing.Literal", "typing_extensions.Literal"}
_SCALARS = {
    "builtins.bool": "bool",
    "builtins.int": "SymInt",
    "builtins.float": "float",
    "builtins.str": "str",
    "torch.dtype": "ScalarType",
    "torch.device": "Device",
}
# Run-time check target of each scalar's Python type, as generated code spells it.
_SCALAR_CHECK = {
    "builtins.bool": "bool",
    "builtins.int": "_b.INT",
    "builtins.float": "_b.FLOAT",
    "builtins.str": "str",
    "torch.dtype": "torch.dtype",
    "torch.device": "torch.device",
}
# The one Python type each scalar's inline fast path tests for (anything else, e.g. a
# SymInt or an int for a float, goes through the full check above).
_SCALAR_EXACT = {
    "builtins.bool": "bool",
    "builtins.int": "int",
    "builtins.float": "float",
    "builtins.str": "str",
    "torch.dtype": "torch.dtype",
    "torch.device": "torch.device",
}
_TENSOR = "torch.Tensor"
_SIZE = "torch.Size"
_INT = "builtins.int"


class Gradient(enum.Enum):
    """Whether a field may receive a gradient, and in what form autograd hands it back."""

    NONE = "never"
    TENSOR = "one gradient"
    PER_ELEMENT = "one gradient per element"


@dataclass(frozen=True)
class Match:
    """What a record's match rule sees: the annotation with ``Optional`` stripped."""

    expr: TypeExpr
    optional: bool
    config: Config
    local_enums: Container[str]


# The attribute the run-time codec caches an object's text under (runtime/codec.py's
# ``CODE_ATTR``; a test holds the two equal).
CODE_ATTR = "_teops_code"
# The run-time descriptions of a plain tensor and of None in a tensor-or-quantized
# field's meta slot (runtime/boundary.py's ``_TENSOR_CODE``/``_NONE_CODE``, which a test
# holds equal): written into the generated pack as literals, so the common values cross
# without a call.
TENSOR_META_CODE = '{"meta":"tensor","class":null,"inner":[],"context":[]}'
NONE_META_CODE = '{"meta":"none","class":null,"inner":[],"context":[]}'


def _as_is(name: str) -> str:
    return name


@dataclass(frozen=True)
class CodeInput:
    """What a record's code functions see for one field of one bundle.

    ``spell`` gives the name the code reads a builtin or a module-level name by
    (``isinstance``, ``torch.Tensor``): in ``call_<op>`` and ``<op>_fwd_slots``, whose
    parameters are the forward fields, a field named ``type`` would hide the builtin, so
    there it is read as the module's alias ``_type`` (see ``emit.Spelling``).
    """

    value: str  # the expression of the field's value in flatten: `args.x`
    where: str  # a Python string literal naming `Bundle.field`, for error messages
    type: FieldType
    local: Callable[[str], str]  # qualified name -> its name in the generated module
    spell: Callable[[str], str] = _as_is  # builtin or module-level name -> how it is read

    @property
    def opt(self) -> str:
        return "optional_" if self.type.optional else ""

    @property
    def check(self) -> str:
        return "check_optional" if self.type.optional else "check"

    def _named(self) -> tuple[str, str]:
        """The value's name and the expression binding it: a local (``call_<op>``'s
        keywords) as is, anything else once through ``v``."""
        if self.value.isidentifier():
            return self.value, self.value
        return "v", f"v := {self.value}"

    def call(self, check: str, *args: str, none: str | None = None) -> str:
        """``_b.<check>(value, *args, where)``; where the field is optional (or ``none``
        is given: what None packs to), None passes by an inline test first, not through
        a call: under Dynamo every inlined call costs far more than the test."""
        if none is None and not self.type.optional:
            return f"_b.{check}({', '.join((self.value, *args, self.where))})"
        v, bound = self._named()
        call = f"_b.{check}({', '.join((v, *args, self.where))})"
        test = v if bound == v else f"({bound})"
        return f"{none or 'None'} if {test} is None else {call}"

    def coded(self) -> str:
        """A quantizer's or value's canonical text: the text the codec cached on the
        object, read inline where the object is an instance of its declared class; the
        ``_b.code`` call (which checks, encodes and caches, or raises naming the field)
        only where not. Under Dynamo the call costs ~3x the inline read."""
        v, bound = self._named()
        cls = self.local(self.type.python_type)
        isinstance_, getattr_ = self.spell("isinstance"), self.spell("getattr")
        cached = f"{isinstance_}({bound}, {cls}) and {getattr_}({v}, {CODE_ATTR!r}, None)"
        read = f"{cached} or _b.code({v}, {cls}, {self.where})"
        if not self.type.optional:
            return read
        held = v if bound == v else f"({bound})"
        return f"None if {held} is None else ({read.replace(bound, v, 1)})"

    def tensor_or_quantized(self) -> str:
        """A tensor-or-quantized field's three slots (a starred group): a tensor (a
        quantized wrapper subclass included, as the ``_b`` call takes it) or None inline,
        with its description as a literal; only a quantized storage (or a wrong value,
        which it reports) goes through the ``_b`` call. Under Dynamo each inlined call is
        guarded on its code in every compiled call."""
        v, bound = self._named()
        held = v if bound == v else f"({bound})"
        call = f"_b.tensor_or_quantized({v}, {self.where})"
        tensor = f"({v}, [], {TENSOR_META_CODE!r})"
        isinstance_, tensor_type = self.spell("isinstance"), self.spell(_TENSOR)
        if not self.type.optional:
            return f"*({tensor} if {isinstance_}({bound}, {tensor_type}) else {call})"
        return (
            f"*((None, [], {NONE_META_CODE!r}) if {held} is None "
            f"else {tensor} if {isinstance_}({v}, {tensor_type}) else {call})"
        )

    def chosen(self) -> str:
        """A ``Literal`` field's value: a str among the choices passes by an inline test;
        anything else goes to the ``_b.choice`` call, which accepts it or raises naming
        the field and the choices (an inlined call is guarded in every compiled call)."""
        v, bound = self._named()
        choices = pyrepr(self.type.choices)
        call = f"_b.choice({v}, {choices}, {self.where})"
        type_, str_ = self.spell("type"), self.spell("str")
        if not self.type.optional:
            return f"{v} if {type_}({bound}) is {str_} and {v} in {choices} else {call}"
        held = v if bound == v else f"({bound})"
        return (
            f"None if {held} is None else {v} if {type_}({v}) is {str_} and {v} in {choices} "
            f"else {call}"
        )

    def checked(self, exact: str, expected: str) -> str:
        """The field's value, type-checked: an inline exact-type test (``exact``; None
        too where optional) that falls back to the ``_b.check`` call only for anything
        else, which accepts subclasses or raises naming the field. Under Dynamo an
        inlined call costs far more than the inline test, and most values pass it. A
        value read from a local (``call_<op>``'s keywords) is named as is, else once
        through ``v``."""
        v, bound = self._named()
        held = v if bound == v else f"({bound})"  # the first test binds the name
        tests = [f"{held} is None"] if self.type.optional else []
        exact_type, expected = self.spell(exact), self.spell(expected)
        # A bool is one of the two bools: an `is` on a constant Dynamo folds at once,
        # where `type(v)` is a builtin call it has to model.
        if exact == "bool":
            tests += [f"{v if tests else held} is True", f"{v} is False"]
        elif exact == _TENSOR:
            # Any tensor: a Parameter (every weight and bias) or a quantized wrapper
            # subclass passes inline too, where an exact-type test sent each through the
            # ``_b.check`` call (a guard on its code in every compiled call).
            tests.append(f"{self.spell('isinstance')}({v if tests else bound}, {exact_type})")
        else:
            tests.append(f"{self.spell('type')}({v if tests else bound}) is {exact_type}")
        return f"{v} if {' or '.join(tests)} else _b.{self.check}({v}, {expected}, {self.where})"


@dataclass(frozen=True)
class DocRow:
    annotation: str
    slots: str
    crossing: str


@dataclass(frozen=True)
class KindRecord:
    kind: Kind
    docs: tuple[DocRow, ...]
    match: Callable[[Match], FieldType | None]
    slots: Callable[[str, FieldType, Config], tuple[Slot, ...]]
    pack: Callable[[CodeInput], str]  # one element (or a starred group) of the flatten tuple
    unpack: Callable[[CodeInput], str]  # one keyword value of the unflatten call
    spec: str | None = None  # runtime custom_ops helper that describes it as TensorSpec(s)
    gradient: Gradient = Gradient.NONE

    @property
    def name(self) -> str:
        return self.kind.value


# --- helpers shared by the records ------------------------------------------------


def _one(base: str, *, list_: bool = False, size: int | None = None) -> Callable:
    def slots(name: str, t: FieldType, config: Config) -> tuple[Slot, ...]:
        return (Slot(name, SchemaType(base, t.optional, list_, size)),)

    return slots


def _slot(_: CodeInput) -> str:
    return "slot()"


def _is(name: str) -> Callable[[TypeExpr], bool]:
    return lambda e: e.name == name


def _list_of(m: Match, element: Callable[[TypeExpr], bool]) -> bool:
    e = m.expr
    return e.name in _LIST and len(e.args) == 1 and element(e.args[0])


def _configured(m: Match, kind: str) -> bool:
    return m.config.kind_of(m.expr.name) == kind


def _configured_element(kind: str) -> Callable[[Match], Callable[[TypeExpr], bool]]:
    def element_of(m: Match) -> Callable[[TypeExpr], bool]:
        def test(e: TypeExpr) -> bool:
            inner, _ = _strip_optional(e)
            return m.config.kind_of(inner.name) == kind

        return test

    return element_of


def _meta_type(config: Config) -> SchemaType:
    return SchemaType.parse(config.meta_type)


def _element_name(m: Match) -> str:
    return _strip_optional(m.expr.args[0])[0].name


# --- match rules ------------------------------------------------------------------


def _match_tensor(m: Match) -> FieldType | None:
    return FieldType(Kind.TENSOR, m.optional, "Tensor", _TENSOR) if m.expr.name == _TENSOR else None


def _match_tensor_list(m: Match) -> FieldType | None:
    if _list_of(m, _is(_TENSOR)):
        return FieldType(Kind.TENSOR_LIST, m.optional, "Tensor", _TENSOR)
    return None


def _match_tq(m: Match) -> FieldType | None:
    if _configured(m, "tensor_or_quantized"):
        return FieldType(Kind.TENSOR_OR_QUANTIZED, m.optional, "Tensor", m.expr.name)
    return None


def _match_tq_list(m: Match) -> FieldType | None:
    if _list_of(m, _configured_element("tensor_or_quantized")(m)):
        return FieldType(Kind.TENSOR_OR_QUANTIZED_LIST, m.optional, "Tensor", _element_name(m))
    return None


def _match_scalar(m: Match) -> FieldType | None:
    name = m.expr.name
    if name in _SCALARS:
        return FieldType(Kind.SCALAR, m.optional, _SCALARS[name], name)
    return None


def _match_size(m: Match) -> FieldType | None:
    e = m.expr
    if e.name == _SIZE or (
        e.name in _TUPLE and len(e.args) == 2 and e.args[0].name == _INT and e.args[1].name == "..."
    ):
        return FieldType(Kind.SIZE, m.optional, "SymInt", _SIZE)
    return None


def _match_int_tuple(m: Match) -> FieldType | None:
    e = m.expr
    if e.name in _TUPLE and e.args and all(a.name == _INT for a in e.args):
        return FieldType(Kind.INT_TUPLE, m.optional, "SymInt", "builtins.tuple", size=len(e.args))
    return None


def _match_int_list(m: Match) -> FieldType | None:
    if _list_of(m, _is(_INT)):
        return FieldType(Kind.INT_LIST, m.optional, "SymInt", "builtins.list")
    return None


def _match_enum(m: Match) -> FieldType | None:
    if m.expr.name in m.local_enums:
        return FieldType(Kind.ENUM, m.optional, "str", m.expr.name)
    return None


def _match_literal(m: Match) -> FieldType | None:
    e = m.expr
    if e.name not in _LITERAL:
        return None
    if not e.args or not all(a.name == "<literal>" and isinstance(a.value, str) for a in e.args):
        raise CodegenError(
            e.location,
            f"`{render(e)}`: a Literal field must list one or more strings",
            "write Literal['a', 'b'], or use an Enum",
        )
    return FieldType(
        Kind.LITERAL, m.optional, "str", "builtins.str", tuple(str(a.value) for a in e.args)
    )


def _match_quantizer(m: Match) -> FieldType | None:
    if _configured(m, "quantizer"):
        return FieldType(Kind.QUANTIZER, m.optional, m.expr.name, m.expr.name)
    return None


def _match_quantizer_list(m: Match) -> FieldType | None:
    if _list_of(m, _configured_element("quantizer")(m)):
        name = _element_name(m)
        return FieldType(Kind.QUANTIZER_LIST, m.optional, name, name)
    return None


def _match_group(m: Match) -> FieldType | None:
    if _configured(m, "process_group"):
        return FieldType(Kind.PROCESS_GROUP, m.optional, "str", m.expr.name)
    return None


def _match_value(m: Match) -> FieldType | None:
    if _configured(m, "value"):
        return FieldType(Kind.VALUE, m.optional, m.expr.name, m.expr.name)
    return None


def _match_unsupported(m: Match) -> FieldType | None:
    if _configured(m, "unsupported"):
        return FieldType(Kind.UNSUPPORTED, True, "", "")
    return None


# --- slots --------------------------------------------------------------------------


def _tq_slots(name: str, t: FieldType, config: Config) -> tuple[Slot, ...]:
    return (
        Slot(name, SchemaType("Tensor", optional=True)),
        Slot(f"{name}__inner", SchemaType("Tensor", list=True)),
        Slot(f"{name}__meta", _meta_type(config)),
    )


def _tq_list_slots(name: str, t: FieldType, config: Config) -> tuple[Slot, ...]:
    meta = _meta_type(config)
    return (
        Slot(name, SchemaType("Tensor", optional=t.optional, list=True, element_optional=True)),
        Slot(f"{name}__inner", SchemaType("Tensor", list=True)),
        Slot(f"{name}__meta", SchemaType(meta.base, list=True)),
    )


def _quantizer_list_slots(name: str, t: FieldType, config: Config) -> tuple[Slot, ...]:
    return (Slot(name, SchemaType("str", t.optional, list=True, element_optional=True)),)


def _int_tuple_slots(name: str, t: FieldType, config: Config) -> tuple[Slot, ...]:
    return (Slot(name, SchemaType("SymInt", t.optional, list=True, size=t.size)),)


def _no_slots(name: str, t: FieldType, config: Config) -> tuple[Slot, ...]:
    return ()


# --- the records ----------------------------------------------------------------------

KINDS: tuple[KindRecord, ...] = (
    KindRecord(
        Kind.TENSOR,
        (
            DocRow(
                "`torch.Tensor` / `Optional[torch.Tensor]`",
                "`Tensor x` / `Tensor? x`",
                "as is",
            ),
        ),
        _match_tensor,
        _one("Tensor"),
        lambda c: c.checked("torch.Tensor", "torch.Tensor"),
        _slot,
        spec="spec",
        gradient=Gradient.TENSOR,
    ),
    KindRecord(
        Kind.TENSOR_LIST,
        (
            DocRow(
                "`List[torch.Tensor]`, optional or not",
                "`Tensor[] x` (+`?`)",
                "as is",
            ),
        ),
        _match_tensor_list,
        _one("Tensor", list_=True),
        lambda c: c.call("tensor_list"),
        _slot,
        spec="specs",
        gradient=Gradient.PER_ELEMENT,
    ),
    KindRecord(
        Kind.TENSOR_OR_QUANTIZED,
        (
            DocRow(
                "`TensorOrQuantized`, optional or not",
                "`Tensor? x, Tensor[] x__inner, <meta> x__meta`",
                "a quantized value crosses as its inner buffers plus its description",
            ),
        ),
        _match_tq,
        _tq_slots,
        lambda c: c.tensor_or_quantized(),
        lambda c: "_b.unpack_tensor_or_quantized(slot(), slot(), slot())",
        spec="spec",
        gradient=Gradient.TENSOR,
    ),
    KindRecord(
        Kind.TENSOR_OR_QUANTIZED_LIST,
        (
            DocRow(
                "`List[TensorOrQuantized]`, optional or not",
                "`Tensor?[] x, Tensor[] x__inner, <meta>[] x__meta` (+`?` on `x`)",
                "plain tensors in `x`; each quantized one as its buffers plus its description",
            ),
        ),
        _match_tq_list,
        _tq_list_slots,
        lambda c: f"*_b.{c.opt}tensor_or_quantized_list({c.value}, {c.where})",
        lambda c: "_b.unpack_tensor_or_quantized_list(slot(), slot(), slot())",
        spec="specs",
        gradient=Gradient.PER_ELEMENT,
    ),
    KindRecord(
        Kind.SCALAR,
        (
            DocRow(
                "`bool`, `int`, `float`, `str`, optional or not",
                "`bool`, `SymInt`, `float`, `str` (+`?`)",
                "one typed slot per field",
            ),
            DocRow("`torch.dtype`, `torch.device`", "`ScalarType`, `Device` (+`?`)", "typed slot"),
        ),
        _match_scalar,
        lambda name, t, config: (Slot(name, SchemaType(t.schema_type, t.optional)),),
        lambda c: c.checked(_SCALAR_EXACT[c.type.python_type], _SCALAR_CHECK[c.type.python_type]),
        _slot,
    ),
    KindRecord(
        Kind.SIZE,
        (
            DocRow(
                "`torch.Size` / `Tuple[int, ...]`",
                "`SymInt[]` (+`?`)",
                "typed slot; unflattened to `torch.Size`",
            ),
        ),
        _match_size,
        _one("SymInt", list_=True),
        lambda c: c.call("size"),
        lambda c: "_b.optional_torch_size(slot())" if c.type.optional else "torch.Size(slot())",
    ),
    KindRecord(
        Kind.INT_TUPLE,
        (
            DocRow(
                "`Tuple[int, int]` (a fixed number of ints)",
                "`SymInt[2]` (+`?`)",
                "typed slot of that length; unflattened to a tuple",
            ),
        ),
        _match_int_tuple,
        _int_tuple_slots,
        lambda c: c.call("int_tuple", str(c.type.size)),
        lambda c: "_b.optional_tuple(slot())" if c.type.optional else "tuple(slot())",
    ),
    KindRecord(
        Kind.INT_LIST,
        (DocRow("`List[int]`", "`SymInt[]` (+`?`)", "typed slot; unflattened to a list"),),
        _match_int_list,
        _one("SymInt", list_=True),
        lambda c: c.call("int_list"),
        lambda c: "_b.optional_list(slot())" if c.type.optional else "list(slot())",
    ),
    KindRecord(
        Kind.ENUM,
        (
            DocRow(
                "`Enum` subclass defined in the op module",
                "`str` (+`?`)",
                "the member name; converted back and validated",
            ),
        ),
        _match_enum,
        _one("str"),
        lambda c: c.call("enum_name", c.local(c.type.python_type)),
        lambda c: (
            f"_b.optional_enum({c.local(c.type.python_type)}, slot())"
            if c.type.optional
            else f"{c.local(c.type.python_type)}[slot()]"
        ),
    ),
    KindRecord(
        Kind.LITERAL,
        (DocRow("`Literal['a', 'b']`", "`str` (+`?`)", "validated against the choices"),),
        _match_literal,
        _one("str"),
        lambda c: c.chosen(),
        _slot,
    ),
    KindRecord(
        Kind.QUANTIZER,
        (
            DocRow(
                "a configured quantizer class",
                "`str` (+`?`)",
                "its canonical text (runtime/codec.py): a graph constant, guarded; "
                "decoded inside the op",
            ),
        ),
        _match_quantizer,
        _one("str"),
        CodeInput.coded,
        lambda c: "_b.optional_decode(slot())" if c.type.optional else "_b.decode(slot())",
    ),
    KindRecord(
        Kind.QUANTIZER_LIST,
        (
            DocRow(
                "`List[<quantizer>]` (elements may be None)",
                "`str?[]` (+`?`)",
                "one quantizer per element (per GEMM), each as its canonical text",
            ),
        ),
        _match_quantizer_list,
        _quantizer_list_slots,
        lambda c: c.call("code_list", c.local(c.type.python_type)),
        lambda c: "_b.decode_list(slot())",
    ),
    KindRecord(
        Kind.PROCESS_GROUP,
        (
            DocRow(
                "a configured process-group type",
                "`str?`",
                "its c10d registry name, re-resolved inside the op",
            ),
        ),
        _match_group,
        lambda name, t, config: (Slot(name, SchemaType("str", optional=True)),),
        lambda c: c.call("group_name"),
        lambda c: f"_b.resolve_group(slot(), {c.where})",
    ),
    KindRecord(
        Kind.VALUE,
        (
            DocRow(
                "a configured value type",
                "`str` (+`?`)",
                "its canonical text, like a quantizer",
            ),
        ),
        _match_value,
        _one("str"),
        CodeInput.coded,
        lambda c: "_b.optional_decode(slot())" if c.type.optional else "_b.decode(slot())",
    ),
    KindRecord(
        Kind.UNSUPPORTED,
        (
            DocRow(
                "a configured unsupported type (`Any`, `Callable[...]`, `Dict[...]`, "
                "`torch.Generator`)",
                "none",
                "allowed only when the value is None at call time",
            ),
        ),
        _match_unsupported,
        _no_slots,
        lambda c: f"*({c.call('unsupported', none='()')})",
        lambda c: "None",
    ),
)

RECORDS: dict[Kind, KindRecord] = {r.kind: r for r in KINDS}
assert set(RECORDS) == set(Kind), "every Kind needs exactly one record"


def record(kind: Kind) -> KindRecord:
    return RECORDS[kind]


def pyrepr(value: object) -> str:
    """``value`` (str, or a tuple of str) as a Python literal: escaped, one line, inert."""
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, tuple) and all(isinstance(v, str) for v in value):
        inner = ", ".join(repr(v) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    raise TypeError(f"pyrepr: expected a str or a tuple of str, got {value!r}")


def table_rows() -> tuple[tuple[str, str, str, str, str], ...]:
    """(annotation, kind, schema slots, crossing, gradient) per documentation row, in record order."""
    return tuple(
        (d.annotation, r.name, d.slots, d.crossing, r.gradient.value) for r in KINDS for d in r.docs
    )


def table_markdown() -> str:
    """The kinds table of docs/codegen.md and of `python -m codegen kinds`."""
    lines = [
        "| annotation | kind | schema slots | crossing | gradient |",
        "|---|---|---|---|---|",
    ]
    lines += [f"| {' | '.join(row)} |" for row in table_rows()]
    return "\n".join(lines) + "\n"


# --- classification -----------------------------------------------------------------


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


def classify(expr: TypeExpr, config: Config, local_enums: Container[str]) -> FieldType:
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
        return FieldType(
            nested.kind, True, nested.schema_type, nested.python_type, nested.choices, nested.size
        )
    m = Match(inner, optional, config, local_enums)
    for r in KINDS:
        found = r.match(m)
        if found is not None:
            return found
    if name in _LIST:
        raise CodegenError(
            inner.location,
            f"unsupported list annotation `{render(inner)}`: a list crosses an op boundary "
            "only as List[torch.Tensor], List[int], or a list of a configured quantizer or "
            "tensor-or-quantized type",
            "use one of those, or Tuple[int, ...] for a shape",
        )
    if name in _TUPLE:
        raise CodegenError(
            inner.location,
            f"unsupported tuple annotation `{render(inner)}`",
            "only torch.Size, Tuple[int, ...] (a shape) or Tuple[int, int] (a fixed number "
            "of ints) crosses as a typed slot",
        )
    raise CodegenError(
        inner.location,
        f"unknown type `{name}`: it maps to no field kind",
        "use a supported annotation (see `python -m codegen kinds`), declare the type "
        "in [tool.transformer_engine_ops.codegen.kinds] of pyproject.toml, or annotate "
        "it Optional[Any] if it must be None across the boundary",
    )


def slots_for(name: str, ftype: FieldType, config: Config) -> tuple[Slot, ...]:
    """The schema slots of one field, in schema order."""
    return RECORDS[ftype.kind].slots(name, ftype, config)


def may_receive_gradient(ftype: FieldType) -> bool:
    return RECORDS[ftype.kind].gradient is not Gradient.NONE


def gradient_per_element(kind: Kind) -> bool:
    """Whether a gradient field of ``kind`` receives a list (one gradient per element)."""
    return RECORDS[kind].gradient is Gradient.PER_ELEMENT
