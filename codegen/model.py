"""The generator's IR: frozen records, each tied to where it came from.

The reader builds it, the kind rules classify it, the emitters only read it.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field

from .errors import Location


@dataclass(frozen=True)
class TypeExpr:
    """An annotation as written, with every name resolved through the file's imports.

    ``name`` is a qualified name (``torch.Tensor``, ``typing.Optional``,
    ``builtins.int``), ``"None"``, ``"..."``, ``"<list>"`` for a bracketed list
    (``Callable[[...], T]``) or ``"<literal>"`` for a literal value in ``value``.
    """

    name: str
    location: Location
    args: tuple[TypeExpr, ...] = ()
    value: str | int | bool | None = None


class Kind(enum.Enum):
    """How a field crosses the op boundary; ``kinds.KINDS`` holds one record per kind."""

    TENSOR = "tensor"
    TENSOR_LIST = "tensor list"
    TENSOR_OR_QUANTIZED = "tensor-or-quantized"
    TENSOR_OR_QUANTIZED_LIST = "tensor-or-quantized list"
    SCALAR = "scalar"
    SIZE = "size"
    INT_TUPLE = "int tuple"
    INT_LIST = "int list"
    ENUM = "enum"
    LITERAL = "literal"
    QUANTIZER = "quantizer"
    QUANTIZER_LIST = "quantizer list"
    PROCESS_GROUP = "process group"
    VALUE = "value"
    UNSUPPORTED = "unsupported"


@dataclass(frozen=True)
class SchemaType:
    """One schema argument type: a base type, optionally a list (of fixed ``size``),
    optionally ``?``. ``str()`` is the schema text (``SymInt[2]?``, ``Tensor[]``);
    :meth:`parse` reads that text back, so the two round-trip."""

    base: str
    optional: bool = False
    list: bool = False
    size: int | None = None
    element_optional: bool = False  # `str?[]`: a list whose elements may be None

    def __post_init__(self) -> None:
        if self.size is not None and not self.list:
            raise ValueError("a fixed size needs a list type")
        if self.element_optional and not self.list:
            raise ValueError("element_optional needs a list type")

    def __str__(self) -> str:
        text = self.base + ("?" if self.element_optional else "")
        if self.list:
            text += f"[{'' if self.size is None else self.size}]"
        return text + ("?" if self.optional else "")

    @classmethod
    def parse(cls, text: str) -> SchemaType:
        match = _SCHEMA_TYPE.fullmatch(text)
        if match is None:
            raise ValueError(f"not a schema type: {text!r}")
        base, element_optional, brackets, size, optional = match.groups()
        if brackets is None:  # `Tensor?`: the first `?` is the type's own
            if element_optional and optional:
                raise ValueError(f"not a schema type: {text!r}")
            element_optional, optional = None, element_optional or optional
        return cls(
            base,
            optional=bool(optional),
            list=brackets is not None,
            size=int(size) if size else None,
            element_optional=bool(element_optional),
        )


_SCHEMA_TYPE = re.compile(r"([A-Za-z_][A-Za-z0-9_.]*)(\?)?(\[(\d*)\])?(\?)?")


@dataclass(frozen=True)
class FieldType:
    """A classified annotation.

    ``schema_type`` is the per-value schema type (without ``?``); ``python_type``
    the qualified name of the class a value is checked against at run time
    (empty when the kind needs none); ``choices`` the strings of a ``Literal``.
    """

    kind: Kind
    optional: bool
    schema_type: str
    python_type: str = ""
    choices: tuple[str, ...] = ()
    size: int | None = None  # length of a fixed-length int tuple


@dataclass(frozen=True)
class Slot:
    name: str
    schema: SchemaType

    @property
    def type(self) -> str:
        """The schema text of this slot's type."""
        return str(self.schema)


@dataclass(frozen=True)
class Field:
    name: str
    annotation: str  # the annotation's source text, for tables and docs
    type: FieldType
    slots: tuple[Slot, ...]
    location: Location
    # The source text after ``=`` (``None``, ``field(default_factory=list)``), or None
    # without one: callers building the bundle depend on it, the schema does not.
    default: str | None = None
    # The annotation as Python unparses it, without whitespace: what decides whether a
    # backward field is a copy of the forward field of its name (``setup_context``).
    source_text: str = field(default="", compare=False)


@dataclass(frozen=True)
class Bundle:
    name: str
    qualname: str
    fields: tuple[Field, ...]
    location: Location

    def field(self, name: str) -> Field | None:
        return next((f for f in self.fields if f.name == name), None)


# The backward bundle field that receives the forward outputs' gradients.
GRAD_OUTPUTS_FIELD = "grad_outputs"
# TE's form: the gradient of the first forward output only (``Optional[Tensor]``).
GRAD_OUTPUT_FIELD = "grad_output"


@dataclass(frozen=True)
class Impls:
    """Names of the hand-written functions in the op module."""

    forward_impl: str
    backward_impl: str
    forward_spec: str
    backward_spec: str
    # None where every backward field is a copy (the declaration names none).
    setup_context: str | None = None


@dataclass(frozen=True)
class EagerWhen:
    """A declared reason to run a compiled call eagerly: when every term holds (a field
    that is truthy, or with ``quantized`` a field holding a quantized value)."""

    terms: tuple[tuple[str, bool], ...]  # (forward field, quantized)
    reason: str


@dataclass(frozen=True)
class Problem:
    """A positioned generator error kept for later (``CodegenError``'s arguments)."""

    location: Location
    message: str
    hint: str


@dataclass(frozen=True)
class Op:
    name: str
    forward: Bundle
    backward: Bundle
    grad_fields: tuple[str, ...]
    impls: Impls | None
    location: Location
    # The declaration's ``lowers``: every Inductor compile traces the impls in place of
    # the op (their numerically sensitive pieces are marked to keep eager's bits).
    lowers: bool = False
    # The declaration's ``eager_when``: compiled calls that run eagerly, with the reason.
    eager_when: tuple[EagerWhen, ...] = ()
    # The declaration's ``plain_call``: an op-module function serving a plain eager call
    # more cheaply than the generic path (None: it does not serve this call).
    plain_call: str | None = None
    # The forward fields the plain call reads (its keyword-only parameters).
    plain_fields: tuple[str, ...] = ()
    # Why the plain call's parameters cannot be passed from the fields, raised when the
    # calling side is generated (not when reading: `codegen diff` reads revisions whose
    # plain call took the bundle).
    plain_problem: Problem | None = None
    # The declaration's ``cudagraph_unsafe``: why no CUDA graph may capture the op (None:
    # graphs may); its ops then carry ``torch.Tag.cudagraph_unsafe``.
    cudagraph_unsafe: str | None = None
    # The backward fields the generated code copies from the forward bundle, and those the
    # hand-written ``setup_context`` returns (in the backward bundle's order).
    copied: tuple[str, ...] = ()
    made: tuple[str, ...] = ()


@dataclass(frozen=True)
class SourceModule:
    """One op module: its repo-relative path, dotted module name, text and ops."""

    path: str
    module: str
    text: str
    ops: tuple[Op, ...]
