"""Quantizers, value types and quantized descriptions cross an op boundary as one ``str``.

Instead of torch's private opaque-object API, each such object crosses as a canonical,
deterministic text computed once per object (and cached on it). torch.compile sees a
constant string: it guards on it (a changed configuration recompiles; an equal object
re-created, as autocast does on every entry, does not) and the partitioner and Inductor
treat it as any other constant. Inside the op the text is decoded, through a cache, back
into the object; only classes registered here can be decoded.

An encoding is JSON of ``{"class": "module.Qualname", "fields": {...}}`` over the
dataclass fields; field values must be exact built-in values (``None``, ``bool``,
``int``, ``float``, ``str``, tuples of them), ``torch.dtype``, enum members, or other
encodable objects. A class marked ``value_opaque = False`` (stateful: delayed scaling)
crosses by identity (``{"identity": n}``): every object is its own constant.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import itertools
import json
import weakref
from typing import Any

import torch

__all__ = ["CODE_ATTR", "SEALED_ATTR", "code_of", "decode", "encode", "field_names", "register"]

CODE_ATTR = "_teops_code"
# Set on every decoded object: it is shared by every caller that decodes its text, so
# it must never change (quantization/quantizer.py refuses to change a sealed quantizer).
SEALED_ATTR = "_teops_sealed"
_CLASSES: dict[str, type] = {}
_DECODED: dict[str, Any] = {}
_IDENTITY: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
_NEXT_IDENTITY = itertools.count(1)


def _name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def register(cls: type) -> type:
    """Let ``cls`` be decoded (a quantizer, value type, quantized class or enum)."""
    _CLASSES[_name(cls)] = cls
    return cls


def _value(value: Any, where: str) -> Any:
    t = type(value)
    if value is None or t is bool or t is str or t is int:
        return value
    if t is float:
        return {"float": repr(value)}  # exact, and inf/nan stay valid JSON
    if isinstance(value, torch.dtype):
        return {"dtype": str(value).removeprefix("torch.")}
    if isinstance(value, enum.Enum):
        register(t)
        return {"enum": _name(t), "name": value.name}
    if t is tuple:
        return {"tuple": [_value(v, where) for v in value]}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {"object": code_of(value)}
    raise TypeError(
        f"{where}: {t.__qualname__} value {value!r} cannot be encoded for an op boundary "
        "(expected None, bool, int, float, str, a tuple, torch.dtype, an enum member or "
        "an encodable object)"
    )


@functools.cache
def field_names(cls: type) -> tuple[str, ...]:
    """The constructor fields of an encodable dataclass, in declaration order.

    Read once per class from the dataclass's field table: encoding a value is not
    schema derivation (schemas are generated at build time), and nothing per call or
    per import reflects beyond this one lookup.
    """
    return tuple(
        name
        for name, f in cls.__dataclass_fields__.items()  # type: ignore[attr-defined]
        if f.init and f._field_type is dataclasses._FIELD  # type: ignore[attr-defined]
    )


def encode(obj: Any) -> str:
    """The canonical text of a dataclass value object (not cached; see :func:`code_of`)."""
    cls = type(obj)
    register(cls)
    check = getattr(obj, "_check_encodable", None)
    if check is not None:
        check()  # raises for an object that is no value (a quantizer holding a group)
    if not getattr(cls, "value_opaque", True):
        n = next(_NEXT_IDENTITY)
        _IDENTITY[n] = obj
        return json.dumps({"class": _name(cls), "identity": n})
    fields = {
        name: _value(getattr(obj, name), f"{cls.__qualname__}.{name}") for name in field_names(cls)
    }
    return json.dumps({"class": _name(cls), "fields": fields}, separators=(",", ":"))


def code_of(obj: Any) -> str:
    """``obj``'s text, computed once and cached on the object."""
    code = obj.__dict__.get(CODE_ATTR)
    if code is None:
        code = encode(obj)
        object.__setattr__(obj, CODE_ATTR, code)
    return code


def _class(name: str) -> type:
    cls = _CLASSES.get(name)
    if cls is None:
        raise ValueError(f"op boundary: {name} is not a registered encodable class")
    return cls


def _decode_value(value: Any) -> Any:
    if not isinstance(value, dict):
        return value
    if "float" in value:
        return float(value["float"])
    if "dtype" in value:
        dtype = getattr(torch, value["dtype"])
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"op boundary: {value['dtype']!r} is not a torch dtype")
        return dtype
    if "enum" in value:
        return _class(value["enum"])[value["name"]]
    if "tuple" in value:
        return tuple(_decode_value(v) for v in value["tuple"])
    if "object" in value:
        return decode(value["object"])
    raise ValueError(f"op boundary: cannot decode {value!r}")


def decode(code: str) -> Any:
    """The object an encoding describes (cached: one object per distinct text)."""
    obj = _DECODED.get(code)
    if obj is not None:
        return obj
    data = json.loads(code)
    cls = _class(data["class"])
    if "identity" in data:
        obj = _IDENTITY.get(data["identity"])
        if obj is None:
            raise ValueError(f"op boundary: the {cls.__qualname__} object was released")
        return obj
    obj = cls(**{k: _decode_value(v) for k, v in data["fields"].items()})
    object.__setattr__(obj, CODE_ATTR, code)
    object.__setattr__(obj, SEALED_ATTR, True)
    _DECODED[code] = obj
    return obj
