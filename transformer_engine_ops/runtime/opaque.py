"""The one module that touches torch's private opaque-object API.

torch.compile can bake a *value-opaque* object into a graph as a constant and guard on
its equality, which is how quantizers cross a custom-op boundary. The API is private and
moves between releases:

* torch 2.11 - 2.13: ``torch._library.opaque_object.register_opaque_type(cls, typ="value")``;
  2.11 also wants opaque classes to subclass ``torch._opaque_base.OpaqueBase``.
* torch 2.14+: ``register_custom_class(cls, typ="constant")``.

Nothing here raises at import: a failed registration records a reason
(:func:`value_type_registration_error`) so callers can fall back to eager with a message.
"""

from __future__ import annotations

import importlib
from typing import Any, Optional

try:
    from torch._opaque_base import OpaqueBase
except ImportError:  # older torch: value types need no special base class there.

    class OpaqueBase:  # type: ignore[no-redef]
        """Stand-in base class for torch builds without ``torch._opaque_base``."""


__all__ = [
    "OpaqueBase",
    "is_value_type",
    "opaque_type_name",
    "register_value_type",
    "value_type_registration_error",
]

# Every class passed to register_value_type, with its schema type name (kept even when
# torch refused it, so a schema can still be written and the failure reported).
_DECLARED: dict[type, str] = {}
# The classes torch accepted.
_REGISTERED: set[type] = set()
_ERRORS: list[str] = []


def _schema_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _record_error(reason: str) -> None:
    _ERRORS.append(reason)


def _call_torch_registration(cls: type) -> None:
    """Register ``cls`` as a constant/value opaque type with whichever API this torch has."""
    api = importlib.import_module("torch._library.opaque_object")
    register_custom_class = getattr(api, "register_custom_class", None)
    if register_custom_class is not None:  # torch 2.14+
        register_custom_class(cls, typ="constant")
        return
    register_opaque_type = getattr(api, "register_opaque_type", None)
    if register_opaque_type is None:
        raise AttributeError(
            "torch._library.opaque_object has neither register_custom_class "
            "nor register_opaque_type"
        )
    register_opaque_type(cls, typ="value")  # torch 2.11 - 2.13


def register_value_type(cls: type) -> None:
    """Register ``cls`` (and, through the MRO, its subclasses) as a value-opaque type.

    Idempotent. Never raises: on failure the reason is recorded and
    :func:`is_value_type` answers False for the class.
    """
    if cls in _DECLARED:
        return
    _DECLARED[cls] = _schema_name(cls)
    try:
        _call_torch_registration(cls)
    except (ImportError, AttributeError, TypeError, ValueError, RuntimeError) as exc:
        _record_error(
            f"torch {_torch_version()} could not register {_schema_name(cls)} as a "
            f"value-opaque type: {type(exc).__name__}: {exc}"
        )
        return
    _REGISTERED.add(cls)


def _torch_version() -> str:
    import torch

    return str(torch.__version__)


def value_type_registration_error() -> Optional[str]:
    """The first recorded registration failure, or None when every registration worked."""
    return _ERRORS[0] if _ERRORS else None


def _declared_base(cls: type) -> Optional[type]:
    for klass in cls.__mro__:
        if klass in _DECLARED:
            return klass
    return None


def opaque_type_name(cls: type) -> str:
    """Schema type name of the registered class ``cls`` is, or derives from.

    Subclasses resolve to the registered base, so one name serves every quantizer slot.
    """
    base = _declared_base(cls)
    if base is None:
        raise TypeError(
            f"{cls.__module__}.{cls.__qualname__} is not a registered value-opaque type "
            "(call register_value_type on it or on a base class)"
        )
    return _DECLARED[base]


def is_value_type(obj_or_cls: Any) -> bool:
    """Whether torch accepted the class as value-opaque and the class claims value semantics.

    A class may inherit a registration but opt out with ``value_opaque = False`` (stateful
    delayed scaling does): it is then not a value type.
    """
    cls = obj_or_cls if isinstance(obj_or_cls, type) else type(obj_or_cls)
    base = _declared_base(cls)
    if base is None or base not in _REGISTERED:
        return False
    return bool(getattr(cls, "value_opaque", True))


def quantizer_compile_limitation() -> Optional[str]:
    """Why quantizers cannot ride through a compiled graph on this torch, if so.

    On torch 2.11 value-opaque objects pass dynamo but not what follows: AOT's
    partitioner can neither save nor recompute one the backward needs
    (pytorch/pytorch#170665) and Inductor rejects them as graph nodes; both were fixed
    in later releases (pytorch/pytorch#174221). Plain (bf16) ops are unaffected.
    """
    import torch

    major, minor = (int(p) for p in torch.__version__.split(".")[:2])
    if (major, minor) < (2, 12):
        return (
            f"torch {torch.__version__} cannot carry quantizers through AOT autograd and "
            "Inductor (pytorch/pytorch#170665, fixed in later releases); use torch >= 2.12"
        )
    return None
