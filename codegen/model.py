"""The generator's IR: frozen records, each tied to where it came from.

The reader builds it, the kind rules classify it, the emitters only read it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

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
    """How a field crosses the op boundary (see ``kinds.KIND_TABLE``)."""

    TENSOR = "tensor"
    TENSOR_LIST = "tensor list"
    TENSOR_OR_QUANTIZED = "tensor-or-quantized"
    SCALAR = "scalar"
    SIZE = "size"
    ENUM = "enum"
    LITERAL = "literal"
    QUANTIZER = "quantizer"
    PROCESS_GROUP = "process group"
    VALUE = "value"
    UNSUPPORTED = "unsupported"


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


@dataclass(frozen=True)
class Slot:
    name: str
    type: str


@dataclass(frozen=True)
class Field:
    name: str
    annotation: str  # the annotation's source text, for tables and docs
    type: FieldType
    slots: tuple[Slot, ...]
    location: Location


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
    setup_context: str


@dataclass(frozen=True)
class Op:
    name: str
    forward: Bundle
    backward: Bundle
    grad_fields: tuple[str, ...]
    impls: Impls | None
    location: Location


@dataclass(frozen=True)
class SourceModule:
    """One op module: its repo-relative path, dotted module name, text and ops."""

    path: str
    module: str
    text: str
    ops: tuple[Op, ...]
