"""What every generated op module calls: field checks, packing and unpacking.

Generated ``flatten_*`` functions call one checker per field, so a wrong value
is reported as ``Bundle.field: expected ..., got ...`` before any kernel runs;
generated ``unflatten_*`` functions call the inverse helpers. Nothing here
inspects a bundle: the generator already decided what each field is.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch
import torch.distributed as dist

from ..quantization.quantizer import QuantizedStorage, QuantizedTensor
from . import codec

FORMAT_VERSION = 1

INT = (int, torch.SymInt)
FLOAT = (float, int, torch.SymFloat, torch.SymInt)


class SlotRow(NamedTuple):
    """One schema slot of a bundle field, as generated slot tables list them."""

    field: str
    kind: str
    slot: str
    type: str


def first_device(slots: Sequence[Any]) -> torch.device | None:
    """The device of the first tensor among an op's slots (for sentinels, fakes and
    the lowering rule)."""
    for value in slots:
        if isinstance(value, torch.Tensor):
            return value.device
        if isinstance(value, list) and value and isinstance(value[0], torch.Tensor):
            return value[0].device
    return None


def require_format_version(version: int, module: str) -> None:
    """Refuse a generated module written for another runtime format."""
    if version != FORMAT_VERSION:
        raise ImportError(
            f"{module} was generated for format version {version}, but this runtime "
            f"speaks version {FORMAT_VERSION}: run `make codegen`"
        )


def _type_names(expected: type | tuple[type, ...]) -> str:
    kinds = expected if isinstance(expected, tuple) else (expected,)
    return " or ".join(getattr(k, "__qualname__", str(k)) for k in kinds)


def _mismatch(where: str, expected: str, value: object) -> TypeError:
    return TypeError(f"{where}: expected {expected}, got {type(value).__qualname__}")


# The exact-type test first is the fast path; `issubclass(type(v), C)` next serves
# subclasses (a concrete quantizer checked against `Quantizer`) in C: quantizers
# derive from torch's OpaqueBase, whose metaclass answers isinstance in Python
# (about 5x slower). isinstance stays the final fallback because it is the only
# form torch 2.11's dynamo evaluates correctly on opaque classes (it answers False
# to `type(v) is C` and `issubclass(type(v), C)`, which then just fall through).
# Each test only ever answers True when isinstance would, so the semantics are
# `type(v) is C or isinstance(v, C)`.
def check(value: Any, expected: type | tuple[type, ...], where: str) -> Any:
    cls = type(value)
    if cls is expected or issubclass(cls, expected) or isinstance(value, expected):
        return value
    raise _mismatch(where, _type_names(expected), value)


def check_optional(value: Any, expected: type | tuple[type, ...], where: str) -> Any:
    if value is None:
        return value
    cls = type(value)
    if cls is expected or issubclass(cls, expected) or isinstance(value, expected):
        return value
    raise _mismatch(where, f"{_type_names(expected)} or None", value)


def tensor_list(value: Any, where: str) -> list[torch.Tensor]:
    if isinstance(value, list | tuple) and all(isinstance(t, torch.Tensor) for t in value):
        return list(value)
    raise _mismatch(where, "a list of Tensors", value)


def size(value: Any, where: str) -> list[Any]:
    if isinstance(value, torch.Size | tuple | list) and all(isinstance(d, INT) for d in value):
        return list(value)
    raise _mismatch(where, "torch.Size or a tuple of ints", value)


def optional_torch_size(value: Sequence[Any] | None) -> torch.Size | None:
    return None if value is None else torch.Size(value)


def int_tuple(value: Any, length: int, where: str) -> list[Any]:
    """A fixed-length tuple of ints (``Tuple[int, int]``) as its ``SymInt[length]`` slot."""
    if (
        isinstance(value, tuple | list | torch.Size)
        and len(value) == length
        and all(isinstance(d, INT) and not isinstance(d, bool) for d in value)
    ):
        return list(value)
    raise _mismatch(where, f"a tuple of {length} ints", value)


def optional_tuple(value: Sequence[Any] | None) -> tuple[Any, ...] | None:
    return None if value is None else tuple(value)


def int_list(value: Any, where: str) -> list[Any]:
    if isinstance(value, list | tuple) and all(
        isinstance(d, INT) and not isinstance(d, bool) for d in value
    ):
        return list(value)
    raise _mismatch(where, "a list of ints", value)


def optional_list(value: Sequence[Any] | None) -> list[Any] | None:
    return None if value is None else list(value)


def object_list(value: Any, expected: type, where: str) -> list[Any]:
    """A list whose elements are each ``expected`` or None (one quantizer per GEMM)."""
    if isinstance(value, list | tuple):
        for v in value:
            if v is not None and not (type(v) is expected or isinstance(v, expected)):
                raise _mismatch(where, f"a list of {_type_names(expected)} or None", v)
        return list(value)
    raise _mismatch(where, f"a list of {_type_names(expected)} or None", value)


# --- quantizers and value types: crossed as their canonical text (runtime/codec.py) ---


def code(value: Any, expected: type, where: str) -> str:
    """``value`` checked to be an ``expected`` and crossed as its cached text."""
    if type(value) is expected or isinstance(value, expected):
        return getattr(value, codec.CODE_ATTR, None) or codec.code_of(value)
    raise _mismatch(where, _type_names(expected), value)


def code_list(value: Any, expected: type, where: str) -> list[str | None]:
    """One text per element (None stays None): one quantizer per GEMM."""
    return [
        None if v is None else code(v, expected, where) for v in object_list(value, expected, where)
    ]


decode = codec.decode


def optional_decode(text: str | None) -> Any:
    return None if text is None else codec.decode(text)


def decode_list(texts: Sequence[str | None] | None) -> list[Any] | None:
    return None if texts is None else [None if t is None else codec.decode(t) for t in texts]


def enum_name(value: Any, cls: type[enum.Enum], where: str) -> str:
    if isinstance(value, cls):
        return value.name
    raise _mismatch(where, cls.__qualname__, value)


def optional_enum(cls: type[enum.Enum], name: str | None) -> enum.Enum | None:
    return None if name is None else cls[name]


def choice(value: Any, choices: tuple[str, ...], where: str) -> str:
    if isinstance(value, str) and value in choices:
        return value
    allowed = ", ".join(repr(c) for c in choices)
    if isinstance(value, str):
        raise ValueError(f"{where}: expected one of {allowed}, got {value!r}")
    raise _mismatch(where, f"one of {allowed}", value)


def unsupported(value: Any, where: str) -> tuple[()]:
    """A field that cannot cross an op boundary contributes no slot and must be None."""
    if value is None:
        return ()
    raise TypeError(
        f"{where}: this field cannot cross the op boundary and must be None, "
        f"got {type(value).__qualname__}"
    )


# --- process groups: crossed by c10d registry name, resolved inside the op ---


def group_name(value: Any, where: str) -> str:
    if isinstance(value, dist.ProcessGroup):
        return value.group_name
    raise _mismatch(where, "ProcessGroup", value)


def resolve_group(name: str | None, where: str) -> dist.ProcessGroup | None:
    """The group registered under ``name`` (None stays None); a clear ValueError when
    c10d has no such group. Purely local: no rank waits on another here."""
    if name is None:
        return None
    try:
        return dist.distributed_c10d._resolve_process_group(name)
    except (RuntimeError, ValueError, KeyError) as exc:
        raise ValueError(
            f"{where}: process group {name!r} is not registered with c10d "
            f"(was it destroyed, or created in another process?): {exc}"
        ) from None


def registered_group(value: Any, where: str) -> dist.ProcessGroup:
    """``value`` checked to be a ProcessGroup that c10d can resolve by its name: what
    the generated unflatten will do with it inside the op, checked ahead (eagerly)."""
    return resolve_group(group_name(value, where), where)  # type: ignore[return-value]


# --- tensor-or-quantized: (Tensor?, Tensor[] inner buffers, QuantizedMeta) ---


class QuantizedMeta:
    """The description of a tensor-or-quantized slot group; it crosses as its text.

    ``tag`` says what crossed: ``none``, ``tensor`` (in the ``Tensor?`` slot; a
    quantized wrapper subclass is turned into its buffers by the op's dispatch
    rule), ``storage`` or ``wrapper`` (inner buffers of that class, in
    ``inner_names`` order, rebuilt with ``context``). It holds no shapes, so its
    text is a constant when shapes are symbolic.
    """

    __slots__ = ("tag", "cls", "inner_names", "context")

    def __init__(
        self,
        tag: str,
        cls: type | None = None,
        inner_names: tuple[str, ...] = (),
        context: tuple[tuple[str, Any], ...] = (),
    ) -> None:
        self.tag, self.cls, self.inner_names, self.context = tag, cls, inner_names, context

    def _key(self) -> tuple[Any, ...]:
        return (self.tag, self.cls, self.inner_names, self.context)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, QuantizedMeta) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return f"QuantizedMeta({self.tag!r}, {getattr(self.cls, '__qualname__', None)})"


_META_CODES: dict[QuantizedMeta, str] = {}
_METAS: dict[str, QuantizedMeta] = {}


def meta_code(meta: QuantizedMeta) -> str:
    """The canonical text of a description (cached per equal description)."""
    code = _META_CODES.get(meta)
    if code is None:
        cls = meta.cls
        if cls is not None:
            codec.register(cls)
        context = [
            [key, codec._value(value, f"QuantizedMeta.{key}")] for key, value in meta.context
        ]
        code = json.dumps(
            {
                "meta": meta.tag,
                "class": None if cls is None else f"{cls.__module__}.{cls.__qualname__}",
                "inner": list(meta.inner_names),
                "context": context,
            },
            separators=(",", ":"),
        )
        _META_CODES[meta] = code
        _METAS[code] = meta
    return code


def decode_meta(code: str) -> QuantizedMeta:
    meta = _METAS.get(code)
    if meta is None:
        data = json.loads(code)
        cls = None if data["class"] is None else codec._class(data["class"])
        context = tuple((k, codec._decode_value(v)) for k, v in data["context"])
        meta = QuantizedMeta(data["meta"], cls, tuple(data["inner"]), context)
        _METAS[code] = meta
        _META_CODES.setdefault(meta, code)
    return meta


_NONE_META = QuantizedMeta("none")
_TENSOR_META = QuantizedMeta("tensor")
_NONE_CODE = meta_code(_NONE_META)
_TENSOR_CODE = meta_code(_TENSOR_META)


def _describe(value: QuantizedStorage | QuantizedTensor) -> QuantizedMeta:
    names, context = value.__tensor_flatten__()
    tag = "wrapper" if isinstance(value, torch.Tensor) else "storage"
    return QuantizedMeta(tag, type(value), tuple(names), context)


def quantized_slots(value: QuantizedStorage | QuantizedTensor) -> tuple[None, list, str]:
    """A quantized value as (no tensor, its inner buffers, its description's text).

    A bare storage keeps its description, keyed by its quantizer object: the
    quantizer fixes the present buffers (usage) and the context, and every change of
    usage replaces it (``update_usage``), so a stale description is never reused.
    Wrapper tensors are described afresh (no attribute writes on traced tensors).
    """
    if isinstance(value, torch.Tensor):
        meta = _describe(value)
        code = meta_code(meta)
    else:
        state = value.__dict__
        cached = state.get("_boundary_meta")
        quantizer = value._quantizer
        if cached is None or cached[0] is not quantizer or cached[1] is not value._dtype:
            meta = _describe(value)
            cached = (quantizer, value._dtype, meta, meta_code(meta))
            state["_boundary_meta"] = cached
        # The text is cached with the description: under torch.compile a storage
        # flattened eagerly before then needs no (untraceable) look-up or encoding.
        meta, code = cached[2], cached[3]
    return None, [getattr(value, n) for n in meta.inner_names], code


def tensor_or_quantized(value: Any, where: str) -> tuple[Any, list, str]:
    """A tensor-or-quantized value's three slots. The generated pack passes a tensor
    and None inline with the descriptions written as literals (``codegen.kinds``'
    ``TENSOR_META_CODE``/``NONE_META_CODE``, held equal to these by a test); it calls
    this for anything else."""
    if isinstance(value, torch.Tensor):
        return value, [], _TENSOR_CODE
    if isinstance(value, QuantizedStorage):
        return quantized_slots(value)
    raise _mismatch(where, "Tensor or a quantized storage", value)


def optional_tensor_or_quantized(value: Any, where: str) -> tuple[Any, list, str]:
    if value is None:
        return None, [], _NONE_CODE
    return tensor_or_quantized(value, where)


def tensor_or_quantized_list(
    value: Any, where: str
) -> tuple[list[torch.Tensor | None], list[torch.Tensor], list[str]]:
    """A list of tensor-or-quantized values (one weight per GEMM) as three slots: the
    tensors (None where an element is a quantized storage or None), the inner buffers
    of the quantized storages concatenated, and one description per element. A
    quantized wrapper subclass crosses as a tensor, as in :func:`tensor_or_quantized`:
    the op's dispatch rule splits it (dynamo cannot call ``__tensor_flatten__``)."""
    if not isinstance(value, list | tuple):
        raise _mismatch(where, "a list of Tensors or quantized values", value)
    tensors: list[torch.Tensor | None] = []
    inner: list[torch.Tensor] = []
    metas: list[str] = []
    for i, v in enumerate(value):
        if isinstance(v, QuantizedStorage):
            _, buffers, meta = quantized_slots(v)
            tensors.append(None)
            inner += buffers
        elif isinstance(v, torch.Tensor):
            tensors.append(v)
            meta = _TENSOR_CODE
        elif v is None:
            tensors.append(None)
            meta = _NONE_CODE
        else:
            raise _mismatch(f"{where}[{i}]", "Tensor, a quantized value or None", v)
        metas.append(meta)
    return tensors, inner, metas


def optional_tensor_or_quantized_list(
    value: Any, where: str
) -> tuple[list[torch.Tensor | None] | None, list[torch.Tensor], list[str]]:
    if value is None:
        return None, [], []
    return tensor_or_quantized_list(value, where)


def unpack_tensor_or_quantized_list(
    tensors: Sequence[torch.Tensor | None] | None,
    inner: Sequence[torch.Tensor],
    metas: Sequence[str],
) -> list[Any] | None:
    if tensors is None:
        return None
    values, cursor = [], 0
    for tensor, code in zip(tensors, metas, strict=True):
        n = len(decode_meta(code).inner_names)
        values.append(unpack_tensor_or_quantized(tensor, inner[cursor : cursor + n], code))
        cursor += n
    return values


def unpack_tensor_or_quantized(
    tensor: torch.Tensor | None, inner: Sequence[torch.Tensor], code: str
) -> Any:
    meta = decode_meta(code)
    if meta.tag == "tensor":
        return tensor
    if meta.tag == "none":
        return None
    if meta.tag == "storage":  # trusted: names and context come from a flatten
        return meta.cls._from_flat(meta.inner_names, inner, meta.context)  # type: ignore[union-attr]
    buffers = dict(zip(meta.inner_names, inner, strict=True))
    return meta.cls.__tensor_unflatten__(buffers, meta.context, None, None)  # type: ignore[union-attr]
