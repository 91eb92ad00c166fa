"""Baseline of figure 1: a reflection-driven boundary plan, the way TE 2.20's runtime does it.

At registration, ``dataclasses.fields`` + ``typing.get_type_hints`` resolve every field's
annotation once into a plan entry ``(name, kind, handler data, slots)``. Per call,
``flatten`` loops over the plan, dispatches on each entry's kind, fills a dict of slots
and returns them in schema order; ``unflatten`` loops again, rebuilds each field, and
makes the bundle with ``cls.__new__`` + ``object.__setattr__`` (no ``__init__``).

It produces exactly the slots of the generated ``flatten_*`` (same order, same
``QuantizedMeta`` descriptions, process groups by name) and runs the same checks
(``type(v) is T or isinstance(v, T)``, enum / literal / size / tensor-list validation,
unsupported fields must be None), so the two are compared doing the same work. It is
written to be reasonably fast: kinds are small ints, handler data is precomputed, error
strings are built only on failure.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from typing import Any, NamedTuple, Union, get_args, get_origin

import torch
import torch.distributed as dist

from transformer_engine_ops.quantization.quantizer import QuantizedStorage, Quantizer
from transformer_engine_ops.runtime import boundary as _b
from transformer_engine_ops.runtime.values import GemmConfig

# Field kinds (ints: a cheap per-call dispatch).
TENSOR, TENSOR_OR_QUANTIZED, TENSOR_LIST, SIZE, SCALAR, ENUM, LITERAL = range(7)
PROCESS_GROUP, OPAQUE, OPAQUE_LIST, UNSUPPORTED = range(7, 11)

_META_TYPE = "str"
_SCALAR_TYPES: dict[Any, tuple[Any, str]] = {
    bool: (bool, "bool"),
    int: (_b.INT, "SymInt"),
    float: (_b.FLOAT, "float"),
    str: (str, "str"),
    torch.dtype: (torch.dtype, "ScalarType"),
}
_OPAQUE_TYPES = (Quantizer, GemmConfig)


class Entry(NamedTuple):
    """One field of the plan: what it is, how to check it, which schema slots it fills."""

    name: str
    kind: int
    optional: bool
    data: Any  # expected type(s), enum class or literal choices
    where: str  # "Bundle.field", for error messages
    slots: tuple[tuple[str, str], ...]  # (slot name, schema type)


def _is_union(annot: Any) -> bool:
    return get_origin(annot) in (Union, types.UnionType)


def _strip_optional(annot: Any) -> tuple[Any, bool]:
    if _is_union(annot):
        args = get_args(annot)
        if type(None) in args:
            rest = tuple(a for a in args if a is not type(None))
            return (rest[0] if len(rest) == 1 else Union[rest]), True
    return annot, False


_TQ_MEMBERS = frozenset((torch.Tensor, QuantizedStorage))


def _entry(owner: str, name: str, annot: Any) -> Entry:
    where = f"{owner}.{name}"
    inner, optional = _strip_optional(annot)
    q = "?" if optional else ""
    if _is_union(inner) and frozenset(get_args(inner)) == _TQ_MEMBERS:
        slots = ((name, "Tensor?"), (f"{name}__inner", "Tensor[]"), (f"{name}__meta", _META_TYPE))
        return Entry(name, TENSOR_OR_QUANTIZED, optional, None, where, slots)
    if inner is torch.Tensor:
        return Entry(name, TENSOR, optional, torch.Tensor, where, ((name, f"Tensor{q}"),))
    if get_origin(inner) in (list, tuple) and get_args(inner)[:1] == (torch.Tensor,):
        return Entry(name, TENSOR_LIST, optional, None, where, ((name, f"Tensor[]{q}"),))
    if inner is torch.Size:
        return Entry(name, SIZE, optional, None, where, ((name, f"SymInt[]{q}"),))
    if inner is dist.ProcessGroup:
        return Entry(name, PROCESS_GROUP, optional, None, where, ((name, "str?"),))
    if get_origin(inner) is typing.Literal:
        return Entry(name, LITERAL, optional, get_args(inner), where, ((name, f"str{q}"),))
    if isinstance(inner, type) and issubclass(inner, enum.Enum):
        return Entry(name, ENUM, optional, inner, where, ((name, f"str{q}"),))
    if inner in _SCALAR_TYPES:
        expected, schema = _SCALAR_TYPES[inner]
        return Entry(name, SCALAR, optional, expected, where, ((name, f"{schema}{q}"),))
    if get_origin(inner) is list:
        element, _ = _strip_optional(get_args(inner)[0])
        if isinstance(element, type) and issubclass(element, _OPAQUE_TYPES):
            slots = ((name, f"str?[]{q}"),)
            return Entry(name, OPAQUE_LIST, optional, element, where, slots)
    if isinstance(inner, type) and issubclass(inner, _OPAQUE_TYPES):
        return Entry(
            name,
            OPAQUE,
            optional,
            inner,
            where,
            ((name, f"str{q}"),),
        )
    return Entry(name, UNSUPPORTED, True, None, where, ())


class Plan:
    """The registration-time plan of one bundle class, interpreted per call."""

    def __init__(self, cls: type) -> None:
        hints = typing.get_type_hints(cls)
        owner = cls.__name__
        self.cls = cls
        self.entries = tuple(_entry(owner, f.name, hints[f.name]) for f in dataclasses.fields(cls))
        self.slot_names = tuple(s for e in self.entries for s, _ in e.slots)
        self.schema = "(" + ", ".join(f"{t} {s}" for e in self.entries for s, t in e.slots) + ")"

    # --- per call ---------------------------------------------------------------

    def flatten(self, obj: Any) -> tuple[Any, ...]:
        """Bundle -> slots (schema order), every field checked; a dict of slots inside."""
        slots: dict[str, Any] = {}
        for e in self.entries:
            value = getattr(obj, e.name)
            kind = e.kind
            if kind == OPAQUE:
                slots[e.name] = (
                    None if value is None and e.optional else _b.code(value, e.data, e.where)
                )
            elif kind == OPAQUE_LIST:
                slots[e.name] = (
                    None if value is None and e.optional else _b.code_list(value, e.data, e.where)
                )
            elif kind == SCALAR or kind == TENSOR:
                expected = e.data
                if not (
                    (value is None and e.optional)
                    or type(value) is expected
                    or isinstance(value, expected)
                ):
                    raise _b._mismatch(e.where, _b._type_names(expected), value)
                slots[e.name] = value
            elif kind == TENSOR_OR_QUANTIZED:
                if value is None and e.optional:
                    group = _b.optional_tensor_or_quantized(None, e.where)
                else:
                    group = _b.tensor_or_quantized(value, e.where)
                (t, _), (i, _), (m, _) = e.slots
                slots[t], slots[i], slots[m] = group
            elif kind == ENUM:
                slots[e.name] = None if value is None else _b.enum_name(value, e.data, e.where)
            elif kind == LITERAL:
                slots[e.name] = None if value is None else _b.choice(value, e.data, e.where)
            elif kind == PROCESS_GROUP:
                slots[e.name] = None if value is None else _b.group_name(value, e.where)
            elif kind == TENSOR_LIST:
                slots[e.name] = _b.tensor_list(value, e.where)
            elif kind == SIZE:
                slots[e.name] = _b.size(value, e.where)
            elif kind == UNSUPPORTED:
                _b.unsupported(value, e.where)
        return tuple(slots.values())

    def unflatten(self, *values: Any) -> Any:
        """Slots -> a fresh bundle via ``cls.__new__`` + setattr; the inverse of flatten."""
        slots = dict(zip(self.slot_names, values, strict=True))
        obj = self.cls.__new__(self.cls)
        for e in self.entries:
            kind = e.kind
            if kind == SCALAR or kind == TENSOR or kind == TENSOR_LIST:
                value = slots[e.name]
            elif kind == OPAQUE:
                value = _b.optional_decode(slots[e.name])
            elif kind == OPAQUE_LIST:
                value = _b.decode_list(slots[e.name])
            elif kind == TENSOR_OR_QUANTIZED:
                (t, _), (i, _), (m, _) = e.slots
                value = _b.unpack_tensor_or_quantized(slots[t], slots[i], slots[m])
            elif kind == ENUM:
                name = slots[e.name]
                value = None if name is None else e.data[name]
            elif kind == LITERAL:
                value = slots[e.name]
            elif kind == PROCESS_GROUP:
                value = _b.resolve_group(slots[e.name], e.where)
            elif kind == SIZE:
                value = torch.Size(slots[e.name])
            else:  # UNSUPPORTED
                value = None
            object.__setattr__(obj, e.name, value)
        return obj


def plans(*classes: type) -> dict[type, Plan]:
    return {cls: Plan(cls) for cls in classes}
