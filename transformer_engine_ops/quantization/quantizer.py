"""Format-independent bases: quantizers (immutable values) and quantized tensors.

A quantizer's configuration is its identity: concrete quantizers are frozen dataclasses
whose fields are the config, so equality and hashing come from the fields, and the
boundary codec (runtime/codec.py) lets a quantizer cross an op boundary as one guarded
constant string. A quantized value exists in two forms sharing one implementation
(:class:`QuantizedData`): a bare :class:`QuantizedStorage` (not a tensor; cheap, for
internal use) and a :class:`QuantizedTensor` wrapper subclass (for parameters and
outputs). Each format lists its inner buffers once, in flatten order.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, ClassVar, Optional, Union

import torch

from ..runtime import _torch_private as _private
from ..runtime import codec

__all__ = [
    "InnerLayout",
    "QuantizedData",
    "QuantizedStorage",
    "QuantizedTensor",
    "QuantizedView",
    "Quantizer",
    "all_reduce_max",
    "check_bool",
    "check_choice",
    "check_float",
    "check_int",
    "flatten_context",
    "is_quantized",
    "quantized_tensor_classes",
    "quantizer_dataclass",
    "require_value_opaque",
    "usage_fields",
    "value_opaque_reason",
]

# (name, shape, dtype) of each present inner buffer, in flatten order.
InnerLayout = tuple[tuple[str, tuple[Any, ...], torch.dtype], ...]

# High-precision dtypes every reference quantizer accepts.
SUPPORTED_INPUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# Devices the plain-PyTorch reference quantizes on.
SUPPORTED_DEVICE_TYPES = ("cpu", "cuda")


# ----- configuration checks (quantizers and recipes validate at construction) -----


def check_bool(owner: str, name: str, value: Any) -> bool:
    """``value`` if it is exactly a bool; else TypeError naming ``owner.name``."""
    if type(value) is not bool:
        raise TypeError(f"{owner}: {name} must be a bool, got {value!r} ({type(value).__name__})")
    return value


def check_int(owner: str, name: str, value: Any, low: int, high: int) -> int:
    """``value`` as an exact ``int`` in ``[low, high]`` (an ``IntEnum`` member becomes its
    int); bools, floats and other types are refused with a message naming ``owner.name``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{owner}: {name} must be an int, got {value!r} ({type(value).__name__})")
    value = int(value)  # exact int: graph-constant code must never see a subclass repr
    if not low <= value <= high:
        raise ValueError(f"{owner}: {name} must be in [{low}, {high}], got {value}")
    return value


def check_float(owner: str, name: str, value: Any, low: float = 0.0) -> float:
    """``value`` as an exact finite ``float`` >= ``low`` (ints accepted, bools refused)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{owner}: {name} must be a float, got {value!r} ({type(value).__name__})")
    value = float(value)
    if not (value >= low and value != float("inf")):
        raise ValueError(f"{owner}: {name} must be a finite float >= {low}, got {value}")
    return value


def check_choice(owner: str, name: str, value: Any, choices: tuple[Any, ...]) -> Any:
    """``value`` if it is one of ``choices`` (exact built-in types); else ValueError."""
    if type(value) not in (type(None), str) or value not in choices:
        raise ValueError(f"{owner}: {name} must be one of {choices}, got {value!r}")
    return str(value) if value is not None else None


def fx_dtype(name: str) -> torch.dtype:
    """``torch.<name>``: how ``__fx_repr__`` code spells a dtype. FX's code generator
    takes classes and functions as an opaque value's globals, not a dtype or a module,
    and Inductor's graph cache pickles them (a function pickles by name)."""
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"fx_dtype: torch has no dtype {name!r}")
    return dtype


def _fx_value_repr(value: Any, owner: str, name: str, env: dict[str, Any]) -> str:
    """The code of one field's value for ``__fx_repr__``, evaluated with the returned
    globals alone (as TE's value quantizers are); a dtype is a call of ``fx_dtype``."""
    # Exact built-in types only: an IntEnum member is an int whose repr is not code.
    if value is None or type(value) in (bool, int, str):
        return repr(value)
    if type(value) is float:
        if value != value or value in (float("inf"), float("-inf")):
            return f"float({str(value)!r})"
        return repr(value)
    if isinstance(value, torch.dtype):
        env["_teops_fx_dtype"] = fx_dtype
        return f"_teops_fx_dtype({str(value).removeprefix('torch.')!r})"
    raise TypeError(f"{owner}.{name}: value {value!r} has no evaluable FX representation")


# Where a quantizer keeps the quantizers derived from it (``Quantizer._derived``).
_DERIVED_ATTR = "_teops_derived"
# Set once a quantizer's constructor has run: later assignments go through
# ``Quantizer.__setattr__``, which lets TE's mutable attributes change and no other.
_BUILT_ATTR = "_teops_built"
# Set on a quantizer this package shares (what a quantized value, a recipe's quantizer
# set, the op boundary's decoder or ``_derived`` holds): it never changes, so whatever
# holds it stays valid. A user's own quantizer is not sealed until copied into one.
_SEALED_ATTR = codec.SEALED_ATTR
# The fields TE lets a user assign on a quantizer (``q.internal = True``,
# ``q.set_usage(...)``, ``q.with_amax_reduction = True``): all flags.
_MUTABLE_FIELDS = frozenset(
    {"rowwise_usage", "columnwise_usage", "internal", "with_amax_reduction"}
)


def usage_fields(
    owner: str,
    rowwise: Optional[bool],
    columnwise: Optional[bool],
    rowwise_usage: Optional[bool],
    columnwise_usage: Optional[bool],
) -> dict[str, bool]:
    """``rowwise_usage``/``columnwise_usage`` from TE's constructor arguments
    (``rowwise``, ``columnwise``) or the fields' own names (what ``dataclasses.replace``
    and the op boundary's decoder pass): one spelling per flag, True when neither."""

    def pick(te_name: str, te_value: Optional[bool], name: str, value: Optional[bool]) -> bool:
        if te_value is not None and value is not None:
            raise TypeError(f"{owner}: {te_name} and {name} both given; pass one of them")
        chosen = value if te_value is None else te_value
        return True if chosen is None else chosen

    return {
        "rowwise_usage": pick("rowwise", rowwise, "rowwise_usage", rowwise_usage),
        "columnwise_usage": pick("columnwise", columnwise, "columnwise_usage", columnwise_usage),
    }


def _default_device(device: Optional[Union[str, torch.device]]) -> torch.device:
    """TE's default device of ``make_empty``/``alloc_tensors`` (the current CUDA device)
    where CUDA is available, else torch's default device."""
    if device is not None:
        return torch.device(device)
    return torch.device("cuda") if torch.cuda.is_available() else torch.get_default_device()


def quantizer_dataclass(cls: type) -> type:
    """The decorator of every quantizer class: a frozen dataclass (``torch.compile``
    passes frozen dataclasses as constants, rebuilding one from its fields by name, so
    every field is keyword-only and every constructor takes the fields by name), whose
    ``__setattr__``/``__delattr__`` are :class:`Quantizer`'s (TE's assignable
    attributes) and whose equality and hash are :class:`Quantizer`'s."""
    cls = dataclasses.dataclass(frozen=True, eq=False, kw_only=True)(cls)
    cls.__setattr__ = _quantizer_setattr  # type: ignore[assignment]
    cls.__delattr__ = _quantizer_delattr  # type: ignore[assignment]
    return cls


def opaque_value_type(cls: type) -> type:
    """The outermost decorator of TE's four tensorless quantizer classes: registered as
    torch opaque value types, as TE registers them, a user's ``torch.library`` schema may
    name one (``get_opaque_type_name(te.MXFP8Quantizer)``) and Dynamo passes an instance
    (and one of a subclass) as a constant guarded by its equality. This package's own op
    boundaries keep their canonical strings (runtime/codec.py)."""
    _private.register_opaque_value_type(cls, _member_names(cls))
    return cls


def _member_names(cls: type) -> list[str]:
    """Every member a traced call may read of a quantizer: its fields, its class
    attributes and methods, and what ``__post_init__`` caches on every instance (torch
    2.11's Dynamo refuses a member that is not listed, and one listed that an instance
    lacks)."""
    names = {name for klass in cls.__mro__[:-1] for name in vars(klass)}
    names |= set(codec.field_names(cls))
    names |= {_BUILT_ATTR, codec.CODE_ATTR}
    return sorted(n for n in names if not (n.startswith("__") and n.endswith("__")))


def _quantizer_setattr(self: Quantizer, name: str, value: Any) -> None:
    """TE's assignable attributes: the usage flags, ``internal``,
    ``with_amax_reduction`` (where the format has it) and ``amax_reduction_group``;
    any other field is part of the configuration and stays as constructed."""
    if not self.__dict__.get(_BUILT_ATTR):
        object.__setattr__(self, name, value)
    elif name in _MUTABLE_FIELDS and name in codec.field_names(type(self)):
        self._mutate({name: value})
    elif name == "amax_reduction_group":
        self._check_unsealed(f"{name} = ...")
        object.__setattr__(self, name, value)
        self._forget_derived()
    else:
        raise dataclasses.FrozenInstanceError(
            f"{type(self).__name__}: cannot assign to {name!r}: a quantizer's "
            "configuration is fixed at construction (only the usage flags, internal, "
            "with_amax_reduction and amax_reduction_group change); construct another"
        )


def _quantizer_delattr(self: Quantizer, name: str) -> None:
    raise dataclasses.FrozenInstanceError(f"{type(self).__name__}: cannot delete {name!r}")


@quantizer_dataclass
class Quantizer(metaclass=_private.opaque_value_meta):
    """Base of all quantizers (TE's ``Quantizer``): a configuration value.

    Concrete formats are :func:`quantizer_dataclass` classes whose fields are their
    configuration: equality and hashing compare the fields, and the boundary
    codec (runtime/codec.py) lets a quantizer cross an op boundary as one guarded
    constant string. Each takes TE's constructor arguments (``rowwise``, ``columnwise``,
    TE's dtypes as ``te.DType`` or torch dtypes) and also every field by its own name,
    which is how ``dataclasses.replace`` and the codec rebuild one.

    ``rowwise_usage``/``columnwise_usage`` choose which layouts ``quantize`` produces;
    ``internal`` chooses a bare storage (True) or a wrapper tensor subclass (False). As
    in TE they may be changed on a quantizer of one's own (``set_usage``, ``q.internal =
    True``); the quantizers this package holds (a quantized value's, a recipe's) are
    sealed and raise instead (change a ``copy()``). Other fields do not change.
    """

    rowwise_usage: bool = True
    columnwise_usage: bool = True
    internal: bool = False

    storage_cls: ClassVar[type]
    wrapper_cls: ClassVar[type]
    value_opaque: ClassVar[bool] = True
    not_value_opaque_reason: ClassVar[Optional[str]] = None
    # Human-readable format name used in error messages ("MXFP8", "NVFP4", ...).
    format_name: ClassVar[str] = "quantized"
    # TE's process group of an amax reduction (``with_amax_reduction``), an attribute
    # outside the configuration: a quantizer holding one is no value (see ``_value``).
    amax_reduction_group: ClassVar[Any] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        codec.register(cls)

    def lowers_bitwise_on(self, device: Optional[torch.device]) -> bool:
        """Whether, traced into Inductor's graph on ``device``, this quantizer computes the
        bits it computes eagerly (``runtime/lowering.py`` lowers an op call only then).
        False by default: reference ops fused by Inductor round their own way."""
        return False

    def __post_init__(self) -> None:
        owner = type(self).__name__
        for name in ("rowwise_usage", "columnwise_usage", "internal"):
            check_bool(owner, name, getattr(self, name))
        if not (self.rowwise_usage or self.columnwise_usage):
            raise ValueError(
                f"{type(self).__name__}: at least one of rowwise_usage and "
                "columnwise_usage must be True"
            )
        self._init_fields()
        object.__setattr__(self, _BUILT_ATTR, True)
        # The boundary text (see runtime/codec.py), once per object and after every field
        # is normalized: a compiled graph reads it as a guarded constant and never traces
        # the encoder.
        codec.code_of(self)

    def _init_fields(self) -> None:
        """Subclasses validate, normalize (an IntEnum becomes an exact int) and initialize
        their own fields here, before the boundary text is computed from them."""

    def _construct(self, **fields: Any) -> None:
        """What a subclass's constructor ends with: every field set (by name, all of
        them), then validated (``__post_init__``)."""
        for name in codec.field_names(type(self)):
            object.__setattr__(self, name, fields.pop(name))
        if fields:
            raise TypeError(f"{type(self).__name__}: not fields: {sorted(fields)}")
        self.__post_init__()

    # ----- value semantics -----

    def _value(self) -> tuple[Any, ...]:
        """The configuration: the class and every field's value. A quantizer holding a
        process group (TE's ``amax_reduction_group``) has none: live distributed state
        is never hashed, compared or baked into a graph (TypeError)."""
        if self.amax_reduction_group is not None:
            raise TypeError(
                f"{type(self).__name__} holds a process group (amax_reduction_group) and "
                "is not a value: it cannot be hashed, compared, encoded or baked into a "
                "graph; set amax_reduction_group = None"
            )
        return (type(self), *(getattr(self, name) for name in codec.field_names(type(self))))

    def _encoding(self) -> tuple[Any, ...]:
        """What fixes the meaning of the buffers this quantizer writes: its fields but
        the usage flags, ``internal`` and those that choose how (not what) it computes.
        A value may change to another quantizer of the same encoding
        (``update_quantizer``)."""
        skip = ("rowwise_usage", "columnwise_usage", "internal", "fp8_all_gather")
        return tuple(
            getattr(self, name)
            for name in codec.field_names(type(self))
            if name not in skip and name != "with_amax_reduction"
        )

    def _same_quantizer(self, other: Quantizer) -> bool:
        """Whether ``other`` quantizes as this one does (its configuration; a stateful
        quantizer's state too)."""
        return self == other

    def _check_encodable(self) -> None:
        """The op boundary's encoder asks first (runtime/codec.py)."""
        self._value()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Quantizer):
            return NotImplemented
        return self._value() == other._value()

    def __hash__(self) -> int:
        return hash(self._value())

    def _check_unsealed(self, what: str) -> None:
        if self.__dict__.get(_SEALED_ATTR):
            raise TypeError(
                f"{type(self).__name__}.{what}: this quantizer is shared (a quantized "
                "tensor's, a recipe's or a module's) and does not change; change a copy "
                "(q = q.copy())"
            )

    def _mutate(self, changes: Mapping[str, Any]) -> None:
        """Assign TE's mutable flags on a quantizer of one's own, then forget what was
        computed from the old values (its boundary text, its derived quantizers)."""
        self._check_unsealed("set_usage" if "rowwise_usage" in changes else "assignment")
        owner = type(self).__name__
        for name, value in changes.items():
            check_bool(owner, name, value)
        usage = {
            name: changes.get(name, getattr(self, name))
            for name in ("rowwise_usage", "columnwise_usage")
        }
        if not any(usage.values()):
            raise ValueError(
                f"{owner}: at least one of rowwise_usage and columnwise_usage must be True"
            )
        for name, value in changes.items():
            object.__setattr__(self, name, value)
        self._forget_derived()

    def _drop_shared_marks(self) -> None:
        """Forget what a copy inherits from its original but is the original's own: the
        seal, the derived-quantizer memo and the boundary text."""
        for attr in (_SEALED_ATTR, _DERIVED_ATTR, codec.CODE_ATTR):
            self.__dict__.pop(attr, None)

    def _forget_derived(self) -> None:
        """Drop what was computed from the old values, and encode the new ones at once:
        every quantizer that is a value carries its text, which Dynamo reads off an
        opaque value as a listed member (one holding a process group is no value)."""
        self.__dict__.pop(_DERIVED_ATTR, None)
        self.__dict__.pop(codec.CODE_ATTR, None)
        if self.amax_reduction_group is None:
            codec.code_of(self)

    def _replace(self, **changes: Any) -> Quantizer:
        """A copy with ``changes``; stateful subclasses override to share their state."""
        return dataclasses.replace(self, **changes)

    def _derived(self, **changes: Any) -> Quantizer:
        """``_replace(**changes)``, sealed, built once per object and change: building a
        quantizer validates and encodes it (~0.1-0.2 ms), and every quantize in an op
        derives one (usage, internal) from the same few decoded quantizers."""
        memo = self.__dict__.get(_DERIVED_ATTR)
        if memo is None:
            memo = {}
            object.__setattr__(self, _DERIVED_ATTR, memo)
        key = tuple(sorted(changes.items()))
        derived = memo.get(key)
        if derived is None:
            derived = self._replace(**changes)
            object.__setattr__(derived, _SEALED_ATTR, True)
            memo[key] = derived
        return derived

    def _sealed(self) -> Quantizer:
        """This quantizer if sealed, else a sealed copy of it (kept until it changes)."""
        return self if self.__dict__.get(_SEALED_ATTR) else self._derived()

    def _seal(self) -> Quantizer:
        """Seal this quantizer itself (one nobody else holds: a recipe's, just made)."""
        object.__setattr__(self, _SEALED_ATTR, True)
        return self

    def __getstate__(self) -> dict[str, Any]:
        """Pickled without the derived-quantizer memo (rebuilt on use)."""
        state = dict(self.__dict__)
        state.pop(_DERIVED_ATTR, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.__dict__[_BUILT_ATTR] = True

    def with_usage(
        self, *, rowwise: Optional[bool] = None, columnwise: Optional[bool] = None
    ) -> Quantizer:
        """This quantizer with other usage flags (``None`` keeps a flag)."""
        changes = {}
        if rowwise is not None and rowwise != self.rowwise_usage:
            changes["rowwise_usage"] = rowwise
        if columnwise is not None and columnwise != self.columnwise_usage:
            changes["columnwise_usage"] = columnwise
        return self._derived(**changes) if changes else self

    def with_internal(self, internal: bool) -> Quantizer:
        """This quantizer producing storages (True) or wrapper tensors (False)."""
        return self if internal == self.internal else self._derived(internal=internal)

    def __fx_repr__(self) -> tuple[str, dict[str, Any]]:
        """``ClassName(field=value, ...)`` plus the globals that evaluate it."""
        self._value()  # a quantizer holding a process group is refused
        cls = type(self)
        env: dict[str, Any] = {cls.__name__: cls}
        args = ", ".join(
            f"{name}={_fx_value_repr(getattr(self, name), cls.__name__, name, env)}"
            for name in codec.field_names(cls)
        )
        return f"{cls.__name__}({args})", env

    # ----- TE's quantizer API -----

    def set_usage(
        self, *, rowwise: Optional[bool] = None, columnwise: Optional[bool] = None
    ) -> None:
        """TE's: set how quantized values made from now on are used (``None`` keeps a
        flag), on a quantizer of one's own (see the class docstring)."""
        changes = {}
        if rowwise is not None:
            changes["rowwise_usage"] = rowwise
        if columnwise is not None:
            changes["columnwise_usage"] = columnwise
        if changes:
            self._mutate(changes)

    def get_usages(self) -> dict[str, bool]:
        """TE's: ``{"rowwise": ..., "columnwise": ...}``."""
        return {"rowwise": self.rowwise_usage, "columnwise": self.columnwise_usage}

    def copy(self) -> Quantizer:
        """TE's: a new quantizer of this configuration (one's own, so it may change);
        a delayed-scaling quantizer's copy shares its scaling state, as TE's does."""
        made = self._replace()
        made._drop_shared_marks()
        if self.amax_reduction_group is not None:
            object.__setattr__(made, "amax_reduction_group", self.amax_reduction_group)
        return made

    def calibrate(self, tensor: torch.Tensor) -> None:
        """TE's: record what quantizing ``tensor`` would (without quantizing it). Only
        delayed scaling keeps such state; for the other formats there is nothing."""

    def is_quantizable(self, inp: torch.Tensor) -> bool:
        """TE's: whether ``inp`` can be gathered quantized (its shape fits the format's
        blocks for an all-gather)."""
        return True

    def supports_only_rowwise_all_gather(self) -> bool:
        """TE's: whether only rowwise data is all-gathered (per-tensor FP8)."""
        return False

    def is_requantization_safe(self) -> bool:
        """TE's: whether quantizing the same input again gives the same value (False
        for a stateful or stochastic quantizer)."""
        return True

    # The name of the recipe class whose quantized weights it makes (None: any); the
    # class itself is recipes.compatible_recipe's answer (recipes import the formats).
    _COMPATIBLE_RECIPE: ClassVar[Optional[str]] = None

    def multi_quantize(self, tensors: Iterable[torch.Tensor]) -> list[Any]:
        """TE's: ``quantize`` of each tensor."""
        return [self.quantize(t) for t in tensors]

    def __call__(self, tensor: torch.Tensor) -> Union[QuantizedStorage, QuantizedTensor]:
        return self.quantize(tensor)

    # ----- format hooks -----

    def check_shape(self, shape: Sequence[Any]) -> None:
        """Raise ValueError when the format cannot take ``shape`` with this usage."""
        if len(shape) < 1:
            raise ValueError(
                f"{self.format_name} ({type(self).__name__}) needs a tensor of at least one "
                f"dimension, got shape {tuple(shape)}"
            )

    def inner_layout(self, shape: Sequence[Any]) -> InnerLayout:
        """Present inner buffers for ``shape`` and this usage, in flatten order."""
        raise NotImplementedError(f"{type(self).__name__} does not define inner_layout")

    def _quantize_impl(self, x: torch.Tensor) -> dict[str, Optional[torch.Tensor]]:
        """The format's math: inner buffers (by name) for this usage."""
        raise NotImplementedError(f"{type(self).__name__} does not define _quantize_impl")

    # ----- construction -----

    def check_input(self, t: torch.Tensor) -> None:
        """Raise TypeError/ValueError naming the format when ``t`` cannot be quantized."""
        if not isinstance(t, torch.Tensor) or isinstance(t, QuantizedTensor):
            raise TypeError(
                f"{self.format_name} ({type(self).__name__}) quantizes plain tensors, "
                f"got {type(t).__name__}"
            )
        if t.dtype not in SUPPORTED_INPUT_DTYPES:
            raise TypeError(
                f"{self.format_name} ({type(self).__name__}) cannot quantize dtype {t.dtype}; "
                "expected one of float32, bfloat16, float16"
            )
        if t.device.type not in SUPPORTED_DEVICE_TYPES:
            raise ValueError(
                f"{self.format_name} ({type(self).__name__}) reference quantization runs on "
                f"cpu or cuda tensors, got a tensor on {t.device}"
            )
        self.check_shape(t.shape)

    def quantize(
        self,
        t: torch.Tensor,
        *,
        out: Optional[QuantizedData] = None,
        dtype: Optional[torch.dtype] = None,
    ) -> Union[QuantizedStorage, QuantizedTensor]:
        """Quantize ``t``: a storage when ``internal``, else a wrapper tensor, presenting
        ``dtype`` (default ``t``'s). As TE's: ``out=`` quantizes into that value in place
        (:meth:`update_quantized`); a wrapper made from a tensor that requires grad while
        grad mode is on passes the gradient straight through to it."""
        if out is not None:
            if dtype is not None and dtype != out.dtype:
                raise ValueError(
                    f"{type(self).__name__}.quantize: dtype={dtype} with out= of dtype {out.dtype}"
                )
            return self.update_quantized(t, out)
        self.check_input(t)
        if dtype is not None and dtype not in SUPPORTED_INPUT_DTYPES:
            raise TypeError(
                f"{type(self).__name__}.quantize: dtype={dtype}; expected one of float32, "
                "bfloat16, float16"
            )
        fake = t.dtype if dtype is None else dtype
        if not self.internal and t.requires_grad and torch.is_grad_enabled():
            return _Quantize.apply(t, self, fake)
        return self._quantize_value(t.detach() if t.requires_grad else t, fake)

    def _quantize_value(
        self, x: torch.Tensor, dtype: torch.dtype
    ) -> Union[QuantizedStorage, QuantizedTensor]:
        """The quantized value of ``x`` (no autograd history), presenting ``dtype``."""
        return self._quantized_value(self._quantize_impl(x), x, dtype)

    def update_quantized(
        self,
        src: torch.Tensor,
        dst: QuantizedData,
        *,
        noop_flag: Optional[torch.Tensor] = None,
    ) -> QuantizedData:
        """TE's: quantize ``src`` with this quantizer into ``dst`` in place (its buffers,
        which keep their storage, and its usage); ``dst`` then decodes with this
        quantizer's configuration. With ``noop_flag`` (a one-element tensor) equal to 1
        nothing is written (TE's flag for a step skipped on device, e.g. after an
        overflow), decided on the device without a host sync."""
        cls = type(self).__name__
        if not isinstance(dst, (self.storage_cls, self.wrapper_cls)):
            raise ValueError(
                f"{cls} can only update {self.wrapper_cls.__name__} (or its storage), got "
                f"{type(dst).__name__}"
            )
        if not isinstance(src, torch.Tensor) or isinstance(src, QuantizedData):
            raise TypeError(f"{cls}.update_quantized: src must be a plain tensor")
        if tuple(src.shape) != tuple(dst.shape):
            raise ValueError(
                f"{cls}.update_quantized: src of shape {tuple(src.shape)} for a "
                f"{type(dst).__name__} of shape {tuple(dst.shape)}"
            )
        maker = self.with_usage(rowwise=dst.rowwise_usage, columnwise=dst.columnwise_usage)
        fresh = (
            maker.with_internal(True)
            ._quantize_value(src.detach().to(dst.device), dst.dtype)
            ._inner_dict()
        )
        names = dst.inner_names()
        mismatched = [
            name
            for name in names
            if fresh[name].shape != getattr(dst, name).shape
            or fresh[name].dtype != getattr(dst, name).dtype
        ]
        if set(fresh) != set(names) or mismatched:
            raise ValueError(
                f"{cls}.update_quantized: this quantizer's buffers for shape "
                f"{tuple(dst.shape)} do not fit the {type(dst).__name__}'s "
                f"({sorted(set(fresh) ^ set(names)) or mismatched}); quantize into a value "
                "made by an equal configuration"
            )
        skip = None if noop_flag is None else noop_flag.reshape(()).to(dst.device) == 1
        for name in names:
            buffer = getattr(dst, name)
            new = fresh[name] if skip is None else torch.where(skip, buffer, fresh[name])
            buffer.copy_(new)
        internal = isinstance(dst, QuantizedStorage)
        dst._quantizer = maker.with_internal(internal)._sealed()
        if isinstance(dst, torch.Tensor):
            torch.autograd.graph.increment_version(dst)
        return dst

    def quantize_with_bias_grad(
        self, t: torch.Tensor
    ) -> tuple[Union[QuantizedStorage, QuantizedTensor], torch.Tensor]:
        """``(quantize(t), t.sum(0) in fp32)`` of a 2-D ``t``, an output gradient and its
        bias gradient (TE's ``bgrad_quantize``). A format whose kernels read ``t`` anyway
        may sum the columns in the same pass (``_fused_bias_grad_impl``)."""
        self.check_input(t)
        if len(t.shape) != 2:
            raise ValueError(
                f"{self.format_name} ({type(self).__name__}): the bias gradient is taken "
                f"of a 2-D tensor, got shape {tuple(t.shape)}"
            )
        fused = self._fused_bias_grad_impl(t.detach() if t.requires_grad else t)
        if fused is None:
            return self.quantize(t), t.sum(0, dtype=torch.float32)
        inner, bias_grad = fused
        return self._quantized_value(inner, t), bias_grad

    def _quantized_value(
        self,
        inner: Mapping[str, Optional[torch.Tensor]],
        t: torch.Tensor,
        dtype: Optional[torch.dtype] = None,
    ) -> Union[QuantizedStorage, QuantizedTensor]:
        """The quantized value of ``t`` holding ``inner``, presenting ``dtype`` (default
        ``t``'s): a storage when ``internal`` else a wrapper tensor."""
        cls = self.storage_cls if self.internal else self.wrapper_cls
        return cls(inner, quantizer=self, dtype=dtype or t.dtype, shape=t.shape)

    def _fused_bias_grad_impl(
        self, t: torch.Tensor
    ) -> Optional[tuple[dict[str, Optional[torch.Tensor]], torch.Tensor]]:
        """``(inner buffers, fp32 column sums)`` of ``t`` from one fused pass, or None
        (the default: ``quantize`` and a separate sum)."""
        return None

    def make_empty(
        self,
        shape: Sequence[Any],
        *,
        dtype: torch.dtype = torch.float32,
        device: Optional[Union[str, torch.device]] = None,
        requires_grad: bool = False,
        pin_memory: bool = False,
    ) -> Union[QuantizedStorage, QuantizedTensor]:
        """Uninitialised quantized value (``torch.empty``; allocates nothing under fake
        mode), TE's arguments: ``device`` defaults to the current CUDA device (torch's
        default device without CUDA); ``pin_memory`` pins CPU buffers."""
        inner = self.alloc_tensors(shape, device=device, pin_memory=pin_memory)
        if self.internal:
            return self.storage_cls(inner, quantizer=self, dtype=dtype, shape=shape)
        return self.wrapper_cls(
            inner, quantizer=self, dtype=dtype, shape=shape, requires_grad=requires_grad
        )

    # ----- TE's data-free allocation primitives (its TensorSpec's) -----

    def inner_tensor_specs(self, shape: Sequence[Any]) -> dict[str, tuple[tuple[Any, ...], Any]]:
        """``{buffer name: (shape, dtype)}`` of the buffers a value of ``shape`` holds,
        in flatten order (:meth:`inner_layout` as TE's dict)."""
        return {name: (tuple(s), d) for name, s, d in self.inner_layout(tuple(shape))}

    def alloc_tensors(
        self,
        shape: Sequence[Any],
        *,
        device: Optional[Union[str, torch.device]] = None,
        pin_memory: bool = False,
    ) -> dict[str, torch.Tensor]:
        """Uninitialised buffers of a value of ``shape`` (``torch.empty``, FakeTensors
        under fake mode), by name: ``__tensor_unflatten__``'s ``inner_tensors``."""
        where = _default_device(device)
        return {
            name: torch.empty(s, dtype=d, device=where, pin_memory=pin_memory)
            for name, s, d in self.inner_layout(tuple(shape))
        }

    def storage_metadata(self, fake_dtype: torch.dtype) -> dict[str, Any]:
        """TE's: the class a value of this quantizer is (a storage when ``internal``)
        and its non-tensor constructor arguments."""
        return {
            "cls": self.storage_cls if self.internal else self.wrapper_cls,
            "nontensor_kwargs": {"quantizer": self, "fake_dtype": fake_dtype},
        }

    def create_metadata(
        self, shape: Sequence[Any], *, dtype: torch.dtype, requires_grad: bool = False
    ) -> dict[str, Any]:
        """TE's data-free ``__tensor_unflatten__`` context of a value of ``shape`` and
        fake ``dtype`` (this package's ``__tensor_unflatten__`` takes it as well as its
        own flatten context)."""
        meta = self.storage_metadata(dtype)
        return {
            "cls": meta["cls"],
            "is_tensor": not self.internal,
            "requires_grad": requires_grad,
            "nontensor_kwargs": meta["nontensor_kwargs"],
        }


def all_reduce_max(t: torch.Tensor, group: Any, owner: str) -> torch.Tensor:
    """TE's amax reduction: ``t`` replaced in place by its element-wise maximum over
    ``group`` (the default process group when None)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(
            f"{owner}: with_amax_reduction=True takes the maximum amax over a process group, "
            "but torch.distributed is not initialized"
        )
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return t


def value_opaque_reason(q: Quantizer) -> Optional[str]:
    """Why ``q`` cannot be baked into a graph as a constant, or None when it can."""
    if getattr(q, "value_opaque", True):
        return None
    return type(q).not_value_opaque_reason or "it is declared not value-opaque"


def require_value_opaque(q: Quantizer) -> None:
    """Raise TypeError naming the class and the reason when ``q`` is not value-opaque."""
    reason = value_opaque_reason(q)
    if reason is not None:
        raise TypeError(f"{type(q).__name__} is not a value-opaque quantizer: {reason}")


# ----------------------------------------------------------------------------------------
# Quantized data: shared by the bare storage and the wrapper tensor subclass.
# ----------------------------------------------------------------------------------------

FlattenContext = tuple[tuple[str, Any], ...]

# QuantizedData._expected_names: (class, rowwise, columnwise) -> buffer names.
_EXPECTED_NAMES: dict[tuple[type, bool, bool], tuple[str, ...]] = {}
# class -> frozenset of its INNER_NAMES.
_NAME_SETS: dict[type, frozenset[str]] = {}


def _name_set(cls: type) -> frozenset[str]:
    names = _NAME_SETS.get(cls)
    if names is None:
        names = _NAME_SETS[cls] = frozenset(cls.INNER_NAMES)  # type: ignore[attr-defined]
    return names


def flatten_context(quantizer: Quantizer, dtype: torch.dtype) -> FlattenContext:
    """The ``__tensor_flatten__`` context of a quantized value: hashable and shape-free.

    It rides in a value-opaque constant even when shapes are symbolic. The quantizer
    carries usage and form (storage or wrapper); the buffers carry the shapes.
    """
    return (("dtype", dtype), ("quantizer", quantizer))


class QuantizedData:
    """Inner buffers + quantizer + fake dtype; the code both quantized forms share.

    A format mixin sets ``INNER_NAMES`` (full flatten order), ``ROWWISE_NAMES`` and
    ``COLUMNWISE_NAMES`` (buffers that exist only for that usage; the rest always exist)
    and implements ``_logical_shape``, ``_dequantize_fp32`` and, where the data allows,
    ``_derive_usage``. The quantizer held by a value always describes its present
    buffers: its usage flags match them and ``internal`` matches the form.
    """

    INNER_NAMES: ClassVar[tuple[str, ...]] = ()
    ROWWISE_NAMES: ClassVar[tuple[str, ...]] = ()
    COLUMNWISE_NAMES: ClassVar[tuple[str, ...]] = ()
    # Whether both usages hold the same values (one scale; the columnwise codes are the
    # rowwise codes transposed), so a GEMM may read either layout from the other exactly.
    USAGES_SHARE_VALUES: ClassVar[bool] = False

    _quantizer: Quantizer
    _dtype: torch.dtype
    # Names of the present inner buffers, in flatten order (see ``inner_names``).
    _present_names: tuple[str, ...]

    # ----- format hooks -----

    @classmethod
    def _logical_shape(cls, inner: Mapping[str, Optional[torch.Tensor]]) -> torch.Size:
        raise NotImplementedError

    def _dequantize_fp32(self, columnwise: bool) -> torch.Tensor:
        raise NotImplementedError

    def _derive_usage(self, columnwise: bool) -> dict[str, torch.Tensor]:
        """Buffers of the missing usage computed from the present one (exactly), if possible."""
        which = "columnwise" if columnwise else "rowwise"
        raise RuntimeError(
            f"{type(self).__name__} cannot create {which} data from the other usage "
            f"({self._quantizer.format_name} scales differ per direction); quantize the "
            "high-precision tensor with that usage instead"
        )

    def _rows(self, start: int, stop: int) -> Optional[dict[str, torch.Tensor]]:
        """The present buffers of rows ``start:stop`` of dim 0 (views, no copy), when the
        format encodes those rows exactly as a tensor of their own (one scale per tensor);
        None otherwise. FSDP2 shards a parameter by such row blocks."""
        return None

    # ----- shared behaviour -----

    def _init_quantized(
        self,
        inner: Mapping[str, Optional[torch.Tensor]],
        quantizer: Quantizer,
        dtype: torch.dtype,
    ) -> None:
        cls = type(self)
        names = cls.INNER_NAMES
        if not inner.keys() <= _name_set(cls):
            unknown = set(inner) - set(names)
            raise ValueError(
                f"{cls.__name__}: unknown inner buffers {sorted(unknown)}; "
                f"expected names among {names}"
            )
        get = inner.get
        for name in names:
            object.__setattr__(self, name, get(name))
        rowwise = any(get(n) is not None for n in cls.ROWWISE_NAMES)
        columnwise = any(get(n) is not None for n in cls.COLUMNWISE_NAMES)
        if not (rowwise or columnwise):
            raise ValueError(f"{cls.__name__}: neither rowwise nor columnwise data given")
        if quantizer.rowwise_usage is not rowwise or quantizer.columnwise_usage is not columnwise:
            quantizer = quantizer.with_usage(rowwise=rowwise, columnwise=columnwise)
        internal = isinstance(self, QuantizedStorage)
        if quantizer.internal is not internal:
            quantizer = quantizer.with_internal(internal)
        # Sealed: a quantizer its owner changes later (``set_usage``) must not change
        # what this value's buffers mean. (The quantizers a compiled graph is traced with
        # are sealed where they are made; none is copied while tracing.)
        if not quantizer.__dict__.get(_SEALED_ATTR) and not torch.compiler.is_compiling():
            quantizer = quantizer._sealed()
        self._quantizer = quantizer
        self._dtype = dtype
        expected = cls._expected_names(rowwise, columnwise)
        missing = [n for n in expected if get(n) is None]
        if missing:
            raise ValueError(f"{cls.__name__}: missing inner buffers {missing}")
        # Every expected buffer is present and no other: these are the present names.
        self._present_names = expected

    @classmethod
    def _expected_names(cls, rowwise: bool, columnwise: bool) -> tuple[str, ...]:
        """The buffers a value of this usage holds, in flatten order (once per class and
        usage: a value is built on every quantize)."""
        key = (cls, rowwise, columnwise)
        names = _EXPECTED_NAMES.get(key)
        if names is None:

            def wanted(name: str) -> bool:
                if name in cls.ROWWISE_NAMES:
                    return rowwise
                if name in cls.COLUMNWISE_NAMES:
                    return columnwise
                return True

            names = _EXPECTED_NAMES[key] = tuple(n for n in cls.INNER_NAMES if wanted(n))
        return names

    @property
    def quantizer(self) -> Quantizer:
        return self._quantizer

    def _get_quantizer(self) -> Quantizer:
        """TE's: the quantizer this value requantizes with (``quantize_``)."""
        return self._quantizer

    def update_quantizer(self, quantizer: Quantizer) -> None:
        """TE's: requantize with ``quantizer`` from now on (``quantize_``, the in-place
        updates of a quantized parameter), warning as TE does when it is not this
        value's quantizer. It must encode as this value's does (its class and
        :meth:`Quantizer._encoding`), so the buffers keep their meaning."""
        current = self._quantizer
        if type(quantizer) is not type(current) or quantizer._encoding() != current._encoding():
            raise ValueError(
                f"{type(self).__name__}.update_quantizer: {quantizer!r} does not encode as "
                f"this value's {current!r}; quantize the value with it instead"
            )
        fitted = quantizer.with_usage(rowwise=self.rowwise_usage, columnwise=self.columnwise_usage)
        fitted = fitted.with_internal(isinstance(self, QuantizedStorage))._sealed()
        if fitted._same_quantizer(current):
            return
        warnings.warn("Quantizer is being updated, this may affect model behavior", stacklevel=2)
        self._quantizer = fitted

    @property
    def rowwise_usage(self) -> bool:
        return self._quantizer.rowwise_usage

    @property
    def columnwise_usage(self) -> bool:
        return self._quantizer.columnwise_usage

    def inner_names(self) -> tuple[str, ...]:
        """Names of the present inner buffers, in flatten order.

        Kept as ``_present_names`` by every method that sets inner buffers
        (``_init_quantized``, ``update_usage``, ``QuantizedStorage._from_flat``): the op
        glue asks for it several times per quantized value."""
        return self._present_names

    def _held_names(self) -> tuple[str, ...]:
        """The inner buffers this value holds, read from its attributes (flatten order)."""
        return tuple(n for n in self.INNER_NAMES if getattr(self, n, None) is not None)

    def inner_tensors(self) -> list[torch.Tensor]:
        """Present inner buffers, in :meth:`inner_names` order."""
        return [getattr(self, n) for n in self._present_names]

    def _inner_dict(self) -> dict[str, torch.Tensor]:
        return {n: getattr(self, n) for n in self._present_names}

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Unpickle; the present names are derived from the buffers again (a pickle made
        before they were kept has none)."""
        self.__dict__.update(state)
        self._present_names = self._held_names()

    def __tensor_flatten__(self) -> tuple[list[str], FlattenContext]:
        return list(self._present_names), flatten_context(self._quantizer, self._dtype)

    @classmethod
    def __tensor_unflatten__(
        cls,
        inner: Mapping[str, torch.Tensor],
        ctx: FlattenContext,
        outer_size: Optional[Iterable[Any]],
        outer_stride: Optional[Iterable[Any]],
    ) -> Any:
        """Rebuild from inner buffers; the logical shape comes from them if not given.
        ``ctx`` is this package's flatten context, or TE's (``Quantizer.create_metadata``:
        a dict with the quantizer and fake dtype under ``nontensor_kwargs``)."""
        if isinstance(ctx, Mapping):
            kwargs = ctx["nontensor_kwargs"]
            extra = {}
            if issubclass(cls, torch.Tensor):
                extra["requires_grad"] = bool(ctx.get("requires_grad", False))
            return cls(
                inner,
                quantizer=kwargs["quantizer"],
                dtype=kwargs["fake_dtype"],
                shape=outer_size,
                **extra,
            )
        meta = dict(ctx)
        return cls(inner, quantizer=meta["quantizer"], dtype=meta["dtype"], shape=outer_size)

    def dequantize(self, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
        """High-precision value, from rowwise data when present, else columnwise."""
        return self.dequantize_usage(columnwise=not self.rowwise_usage, dtype=dtype)

    def dequantize_usage(
        self, *, columnwise: bool, dtype: Optional[torch.dtype] = None
    ) -> torch.Tensor:
        """High-precision value from one usage's data (GEMMs read the layout they use)."""
        present = self.columnwise_usage if columnwise else self.rowwise_usage
        if not present:
            if self.USAGES_SHARE_VALUES:  # the other layout holds the same values
                return self._dequantize_fp32(not columnwise).to(dtype or self._dtype)
            which = "columnwise" if columnwise else "rowwise"
            raise ValueError(
                f"{type(self).__name__} has no {which} data (usage: rowwise="
                f"{self.rowwise_usage}, columnwise={self.columnwise_usage})"
            )
        return self._dequantize_fp32(columnwise).to(dtype or self._dtype)

    def update_usage(
        self, rowwise_usage: Optional[bool] = None, columnwise_usage: Optional[bool] = None
    ) -> None:
        """Drop a usage's buffers, or create them from the other usage where exact."""
        rowwise = self.rowwise_usage if rowwise_usage is None else rowwise_usage
        columnwise = self.columnwise_usage if columnwise_usage is None else columnwise_usage
        if not (rowwise or columnwise):
            raise ValueError(f"{type(self).__name__}: cannot drop both rowwise and columnwise data")
        inner = self._inner_dict()
        if rowwise and not self.rowwise_usage:
            inner.update(self._derive_usage(columnwise=False))
        if columnwise and not self.columnwise_usage:
            inner.update(self._derive_usage(columnwise=True))
        dropped = (() if rowwise else self.ROWWISE_NAMES) + (
            () if columnwise else self.COLUMNWISE_NAMES
        )
        for name in self.INNER_NAMES:
            object.__setattr__(self, name, None if name in dropped else inner.get(name))
        self._quantizer = self._quantizer.with_usage(rowwise=rowwise, columnwise=columnwise)
        self._present_names = self._held_names()

    def _describe(self) -> str:
        buffers = ", ".join(
            f"{n}={tuple(t.shape)}:{str(t.dtype).removeprefix('torch.')}"
            for n, t in self._inner_dict().items()
        )
        return (
            f"{type(self).__name__}(shape={tuple(self.shape)}, dtype={self._dtype}, "
            f"quantizer={self._quantizer!r}, {buffers})"
        )


class RowwiseColumnwisePairs(QuantizedData):
    """Formats with one (data, scale-inverse) pair per usage, rowwise pair first, as
    TE's MXFP8 and FP8 block tensors lay them out."""

    INNER_NAMES: ClassVar[tuple[str, ...]] = (
        "_rowwise_data",
        "_rowwise_scale_inv",
        "_columnwise_data",
        "_columnwise_scale_inv",
    )
    ROWWISE_NAMES: ClassVar[tuple[str, ...]] = ("_rowwise_data", "_rowwise_scale_inv")
    COLUMNWISE_NAMES: ClassVar[tuple[str, ...]] = ("_columnwise_data", "_columnwise_scale_inv")


class QuantizedStorage(QuantizedData):
    """A bare quantized value: inner buffers and metadata, not a ``torch.Tensor``."""

    def __init__(
        self,
        inner: Mapping[str, Optional[torch.Tensor]],
        *,
        quantizer: Quantizer,
        dtype: torch.dtype,
        shape: Optional[Iterable[Any]] = None,
    ) -> None:
        self._init_quantized(inner, quantizer, dtype)
        self._shape = torch.Size(shape) if shape is not None else self._logical_shape(inner)

    @property
    def shape(self) -> torch.Size:
        return self._shape

    def size(self, dim: Optional[int] = None) -> Any:
        return self._shape if dim is None else self._shape[dim]

    @property
    def dtype(self) -> torch.dtype:
        """The fake (high-precision) dtype the value stands for."""
        return self._dtype

    @property
    def device(self) -> torch.device:
        return getattr(self, self._present_names[0]).device

    @property
    def requires_grad(self) -> bool:
        return False

    @classmethod
    def _from_flat(
        cls, names: Sequence[str], buffers: Sequence[torch.Tensor], ctx: FlattenContext
    ) -> QuantizedStorage:
        """Trusted rebuild from what a flatten of a valid storage produced.

        ``names`` are its present inner buffers in flatten order and ``ctx`` its
        :func:`flatten_context`, so the quantizer already matches the buffers' usage
        and form: the checks of ``__init__`` (unknown or missing buffers, usage and
        form re-derivation) would pass and are skipped. About 10x cheaper than
        ``__tensor_unflatten__``; the op boundary's unflatten is its only caller.
        """
        if len(names) != len(buffers):
            raise ValueError(
                f"{cls.__name__}: {len(buffers)} inner buffers for names {tuple(names)}"
            )
        self = object.__new__(cls)
        state = dict.fromkeys(cls.INNER_NAMES)
        state.update(zip(names, buffers, strict=True))
        (_, dtype), (_, quantizer) = ctx
        state["_quantizer"] = quantizer
        state["_dtype"] = dtype
        state["_shape"] = cls._logical_shape(state)
        state["_present_names"] = tuple(names)
        self.__dict__.update(state)
        return self

    def __repr__(self) -> str:
        return self._describe()


_WRAPPER_CLASSES: list[type] = []


def quantized_tensor_classes() -> tuple[type, ...]:
    """Every concrete wrapper subclass, so op glue can add torch-dispatch rules for each."""
    return tuple(_WRAPPER_CLASSES)


class _Quantize(torch.autograd.Function):
    """Quantize into a wrapper tensor with a straight-through gradient, as TE's
    ``Quantizer.quantize`` of a tensor that requires grad."""

    @staticmethod
    def forward(ctx: Any, t: torch.Tensor, quantizer: Quantizer, dtype: torch.dtype) -> Any:
        return quantizer._quantize_value(t.detach(), dtype)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, None, None]:
        return grad, None, None


class _Dequantize(torch.autograd.Function):
    """Dequantize with a straight-through gradient, as TE's quantized tensors do."""

    @staticmethod
    def forward(ctx: Any, t: QuantizedTensor, columnwise: bool, dtype: torch.dtype) -> Any:
        return QuantizedData.dequantize_usage(t, columnwise=columnwise, dtype=dtype)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, None, None]:
        return grad, None, None


_aten = torch.ops.aten


class QuantizedTensor(QuantizedData, torch.Tensor):
    """Wrapper tensor subclass: presents the logical shape and the fake dtype.

    Ops it does not know run on the dequantized value and give plain tensors, so
    ``x + 1`` works and ``zeros_like(x)`` is a plain tensor of the fake dtype (what an
    optimizer keeps as its state); detach, clone, alias and device moves keep it
    quantized. An op that writes into it (``add_``, ``copy_``, ``_foreach_mul_``, an
    ``out=`` argument, ...) runs on its dequantized value and requantizes the result
    into its own buffers (:meth:`quantize_`), as TE's quantized tensors do: a quantized
    parameter trains. An op whose result cannot be requantized raises naming the op.
    A view of it (``w[0]``, ``w.t()``) is a :class:`QuantizedView`: writes through the
    view requantize it too. ``.data = value`` (what ``Module.to(dtype)``/``.half()``/
    ``.float()`` do) keeps it quantized, holding ``quantize(value)`` in value's dtype.
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.INNER_NAMES:
            _WRAPPER_CLASSES.append(cls)

    @staticmethod
    def __new__(
        cls,
        inner: Mapping[str, Optional[torch.Tensor]],
        *,
        quantizer: Quantizer,
        dtype: torch.dtype,
        shape: Optional[Iterable[Any]] = None,
        requires_grad: bool = False,
    ) -> QuantizedTensor:
        size = torch.Size(shape) if shape is not None else cls._logical_shape(inner)
        device = next(t.device for t in inner.values() if t is not None)
        self = _private.make_wrapper_subclass(
            cls, size, dtype=dtype, device=device, requires_grad=requires_grad
        )
        self._init_quantized(inner, quantizer, dtype)
        return self

    __torch_function__ = _private.disabled_torch_function_impl

    def dequantize(self, dtype: Optional[torch.dtype] = None) -> torch.Tensor:  # type: ignore[override]
        return self.dequantize_usage(columnwise=not self.rowwise_usage, dtype=dtype)

    def dequantize_usage(
        self, *, columnwise: bool, dtype: Optional[torch.dtype] = None
    ) -> torch.Tensor:
        if self.requires_grad and torch.is_grad_enabled():
            return _Dequantize.apply(self, columnwise, dtype or self._dtype)
        return QuantizedData.dequantize_usage(self, columnwise=columnwise, dtype=dtype)

    def quantize_(self, value: torch.Tensor) -> QuantizedTensor:
        """Quantize ``value`` (a plain tensor of this shape) into this tensor in place:
        the same object, quantizer and inner buffers (their storage is overwritten, so
        aliases made by ``detach``/``.data`` see the new value); its version counter
        counts the write."""
        if isinstance(value, QuantizedData) or not isinstance(value, torch.Tensor):
            raise TypeError(
                f"{type(self).__name__}.quantize_ takes a plain tensor, got {type(value).__name__}"
            )
        if value.shape != self.shape:
            raise ValueError(
                f"{type(self).__name__}.quantize_: value of shape {tuple(value.shape)} "
                f"for a tensor of shape {tuple(self.shape)}"
            )
        value = value.detach().to(self.device, self._dtype)
        fresh = self._requantized(value)
        for name in self._present_names:
            getattr(self, name).copy_(fresh[name])
        # Autograd checks saved tensors against it; an op over a list of tensors
        # (``_foreach_add_``) reaches this tensor without torch counting a write.
        torch.autograd.graph.increment_version(self)
        return self

    def _requantized(self, value: torch.Tensor) -> Mapping[str, torch.Tensor]:
        """The inner buffers :meth:`quantize_` writes for ``value`` (a format whose
        shards share one scale overrides it: FSDP2's FP8 parameters)."""
        return self._quantizer.with_internal(True).quantize(value)._inner_dict()

    def fsdp_pre_all_gather(
        self,
        mesh: Any,
        orig_size: torch.Size,
        contiguous_orig_stride: Any,
        module: Any,
        mp_policy: Any,
    ) -> Any:
        """FSDP2's all-gather extension (``fully_shard``): formats that gather their
        codes override it; the others are refused here, before any all-gather, rather
        than gathered and kept as high-precision parameters."""
        raise RuntimeError(
            f"fully_shard: a {self._quantizer.format_name} quantized parameter "
            f"({type(self).__name__}, shape {tuple(orig_size)}) cannot be sharded: FSDP2 "
            "all-gathers quantized parameters in FP8 per-tensor current scaling only; "
            "build this module outside quantized_model_init (its weight is quantized per "
            "step) or with the Float8CurrentScaling recipe"
        )

    def fsdp_post_all_gather(
        self, all_gather_outputs: Any, metadata: Any, param_dtype: Any, *, out: Any = None
    ) -> Any:
        raise RuntimeError(f"fully_shard: {type(self).__name__} has no FSDP2 all-gather")

    def _get_data(self) -> QuantizedTensor:
        return torch.Tensor.data.__get__(self, type(self))  # type: ignore[attr-defined]

    @torch.no_grad()
    def _set_data(self, value: torch.Tensor) -> None:
        """``self.data = value``, which ``nn.Module.to(dtype)``, ``.half()``,
        ``.bfloat16()`` and ``.float()`` do to every parameter: as TE's quantized
        tensors, this tensor stays a quantized tensor (the same object, so a parameter
        keeps its identity, its attributes and its in-place requantization) holding
        ``quantize(value)`` made with its own quantizer, and takes ``value``'s dtype as
        its fake dtype and ``value``'s device. A quantized ``value`` of this format is
        taken as it is (its buffers, not a requantized copy)."""
        if isinstance(value, QuantizedTensor) and _same_encoding(self, value):
            fresh = value
        elif isinstance(value, QuantizedData) or not isinstance(value, torch.Tensor):
            raise TypeError(
                f"{type(self).__name__}.data = {value!r}: takes a plain tensor or a quantized "
                "tensor of the same format"
            )
        else:
            if value.shape != self.shape:
                raise ValueError(
                    f"{type(self).__name__}.data = a tensor of shape {tuple(value.shape)} for "
                    f"a tensor of shape {tuple(self.shape)}"
                )
            fresh = self._quantizer.with_internal(False).quantize(value.detach())
        # The wrapper's own metadata (dtype, device), then the quantized content.
        torch.Tensor.data.__set__(self, fresh)  # type: ignore[attr-defined]
        self._init_quantized(fresh._inner_dict(), self._quantizer, fresh._dtype)
        torch.autograd.graph.increment_version(self)

    data = property(_get_data, _set_data)  # type: ignore[assignment]

    def _map_inner(self, fn: Any, **kwargs: Any) -> QuantizedTensor:
        inner = {n: fn(t) for n, t in self._inner_dict().items()}
        return type(self)(
            inner, quantizer=self._quantizer, dtype=self._dtype, shape=self.shape, **kwargs
        )

    @classmethod
    def __torch_dispatch__(
        cls, func: Any, types: Any, args: tuple = (), kwargs: Optional[dict] = None
    ) -> Any:
        kwargs = kwargs or {}
        handler = _DISPATCH_RULES.get(func)
        if handler is not None:
            result = handler(func, args, kwargs)
            if result is not NotImplemented:
                return result
        return _dispatch_on_values(func, args, kwargs)

    def __repr__(self, *, tensor_contents: Any = None) -> str:  # type: ignore[override]
        return self._describe()


def _rule_same(func: Any, args: tuple, kwargs: dict) -> Any:
    """detach / alias: the same quantized value, new tensor identity."""
    return args[0]._map_inner(func)


def _rule_clone(func: Any, args: tuple, kwargs: dict) -> Any:
    if kwargs.get("memory_format") not in (None, torch.preserve_format, torch.contiguous_format):
        return NotImplemented
    return args[0]._map_inner(lambda t: t.clone())


def _rule_to_copy(func: Any, args: tuple, kwargs: dict) -> Any:
    """A device move keeps the value quantized; a dtype change dequantizes."""
    src = args[0]
    if kwargs.get("dtype") not in (None, src.dtype) or set(kwargs) - {"dtype", "device"}:
        return NotImplemented
    device = kwargs.get("device")
    return src._map_inner(lambda t: t.to(device=device))


def _same_encoding(a: QuantizedTensor, b: QuantizedTensor) -> bool:
    """Whether ``b``'s buffers encode a value as ``a``'s do: class, shape and the
    quantizer's configuration (its fields; a stateful quantizer's state aside)."""
    qa, qb = a._quantizer, b._quantizer
    return (
        type(a) is type(b)
        and type(qa) is type(qb)
        and a.shape == b.shape
        and all(getattr(qa, f.name) == getattr(qb, f.name) for f in dataclasses.fields(qa))
    )


def _same_format(a: QuantizedTensor, b: QuantizedTensor) -> bool:
    """Whether ``b``'s buffers are valid as ``a``'s: the same encoding and fake dtype."""
    return _same_encoding(a, b) and a._dtype == b._dtype


def _rule_copy_(func: Any, args: tuple, kwargs: dict) -> Any:
    """``dst.copy_(src)`` from a quantized tensor of dst's format copies its codes (the
    value exactly, as TE does; loading a state dict round-trips bit for bit), and so does
    a copy from a block of rows of one (``w.chunk(n)[i]``, FSDP2's sharding) where the
    format encodes rows on their own; any other copy is an in-place op like the others."""
    dst, src = args[0], args[1]
    if not isinstance(dst, QuantizedTensor):
        return NotImplemented
    if isinstance(src, QuantizedView):
        inner = _row_block_inner(dst, src)
        if inner is None:
            return NotImplemented
    elif isinstance(src, QuantizedTensor) and _same_format(dst, src):
        inner = src._inner_dict()
    else:
        return NotImplemented
    for name in dst.inner_names():
        getattr(dst, name).copy_(inner[name], **kwargs)
    return dst


def _row_block_inner(dst: QuantizedTensor, src: QuantizedView) -> Optional[dict[str, Any]]:
    """The buffers of ``src`` when it is a block of dim-0 rows of a quantized tensor of
    ``dst``'s format and shape, in a format that encodes rows on their own; else None."""
    base = src._quantized
    rows = _row_range(src._views, base.shape[0]) if base.dim() else None
    if rows is None or type(base) is not type(dst) or dst._dtype != base._dtype:
        return None
    start, stop = rows
    if dst.shape != (stop - start, *base.shape[1:]) or not _same_encoding_fields(dst, base):
        return None
    inner = base._rows(start, stop)
    if inner is None or set(inner) != set(dst.inner_names()):
        return None
    return inner


def _row_range(
    views: tuple[tuple[Any, tuple, dict, Optional[int]], ...], rows: int
) -> Optional[tuple[int, int]]:
    """``(start, stop)`` when ``views`` select a contiguous block of dim-0 rows of a
    tensor with ``rows`` rows (``split``/``chunk`` along dim 0, ``narrow``/``slice``
    of dim 0 with step 1); None for any other view."""
    start, stop = 0, rows
    for func, rest, kwargs, index in views:
        if func is _aten.split.Tensor and index is not None:
            size, dim = rest[0], (rest[1] if len(rest) > 1 else kwargs.get("dim", 0))
            if dim != 0 or size <= 0:
                return None
            first = start + index * size
            start, stop = first, min(first + size, stop)
        elif func is _aten.slice.Tensor and index is None:
            dim, lo, hi, step = (*rest, *(None,) * 4)[:4]
            dim = kwargs.get("dim", 0 if dim is None else dim)
            lo = kwargs.get("start", lo) or 0
            hi = kwargs.get("end", hi)
            step = kwargs.get("step", 1 if step is None else step)
            n = stop - start
            if dim != 0 or step != 1 or lo < 0 or (hi is not None and hi < 0):
                return None
            hi = n if hi is None else min(hi, n)
            start, stop = start + min(lo, n), start + hi
        else:
            return None
        if stop < start:
            return None
    return start, stop


def _same_encoding_fields(a: QuantizedTensor, b: QuantizedTensor) -> bool:
    """Whether ``a`` and ``b`` hold codes of one quantizer configuration (its fields;
    usage aside, which the buffer names check)."""
    qa, qb = a._quantizer, b._quantizer
    return type(qa) is type(qb) and all(
        getattr(qa, f.name) == getattr(qb, f.name)
        for f in dataclasses.fields(qa)
        if f.name not in ("rowwise_usage", "columnwise_usage", "internal")
    )


def _rule_identity_view(func: Any, args: tuple, kwargs: dict) -> Any:
    """A view that is the whole tensor as it is laid out (``narrow`` of all rows,
    ``view`` to its own shape, ``as_strided`` to its contiguous size: what FSDP2 does to
    an evenly sharded parameter) is the same quantized value, aliased; other views are
    :class:`QuantizedView` s as before."""
    src = args[0]
    if not isinstance(src, QuantizedTensor) or not _is_identity_view(func, src, args[1:], kwargs):
        return NotImplemented
    return src._map_inner(_aten.alias.default)


def _is_identity_view(func: Any, src: QuantizedTensor, rest: tuple, kwargs: dict) -> bool:
    shape = tuple(src.shape)
    if func is _aten.view.default:
        return tuple(rest[0]) == shape
    if func is _aten.as_strided.default:
        offset = rest[2] if len(rest) > 2 else kwargs.get("storage_offset")
        return (
            tuple(rest[0]) == shape
            and tuple(rest[1]) == tuple(_contiguous_strides(shape))
            and offset in (None, 0)
        )
    if func is _aten.slice.Tensor and src.dim() > 0:
        rows = _row_range(((func, rest, kwargs, None),), shape[0])
        return rows == (0, shape[0])
    return False


def _contiguous_strides(shape: tuple[int, ...]) -> list[int]:
    strides, step = [], 1
    for d in reversed(shape):
        strides.append(step)
        step *= max(d, 1)
    return strides[::-1]


def _rule_new_zeros(func: Any, args: tuple, kwargs: dict) -> Any:
    """``q.new_zeros(size)`` is a quantized tensor of zeros in ``q``'s format (as TE's
    quantized tensors give; FSDP2 pads a sharded parameter into one), or a plain one
    where the format cannot take ``size``."""
    src, size = args[0], args[1]
    if not isinstance(src, QuantizedTensor) or kwargs.get("layout") not in (None, torch.strided):
        return NotImplemented
    if kwargs.get("pin_memory") or set(kwargs) - {"dtype", "device", "layout", "pin_memory"}:
        return NotImplemented
    dtype = kwargs.get("dtype") or src.dtype
    if dtype not in SUPPORTED_INPUT_DTYPES:
        return NotImplemented
    zeros = torch.zeros(size, dtype=dtype, device=kwargs.get("device") or src.device)
    try:
        src._quantizer.check_shape(zeros.shape)
    except ValueError:
        return NotImplemented
    return src._quantizer.with_internal(False).quantize(zeros)


def _rule_record_stream(func: Any, args: tuple, kwargs: dict) -> Any:
    """The tensor's memory is its inner buffers: each is recorded on the stream."""
    for buffer in args[0].inner_tensors():
        func(buffer, *args[1:], **kwargs)


def _rule_set_(func: Any, args: tuple, kwargs: dict) -> Any:
    raise RuntimeError(
        f"{func}: a quantized {type(args[0]).__name__} cannot alias another tensor's "
        "storage; assign a new parameter, or copy_ the value into it"
    )


_DISPATCH_RULES: dict[Any, Any] = {
    _aten.detach.default: _rule_same,
    _aten.alias.default: _rule_same,
    _aten.clone.default: _rule_clone,
    _aten._to_copy.default: _rule_to_copy,
    _aten.copy_.default: _rule_copy_,
    _aten.new_zeros.default: _rule_new_zeros,
    _aten.view.default: _rule_identity_view,
    _aten.as_strided.default: _rule_identity_view,
    _aten.slice.Tensor: _rule_identity_view,
    _aten.record_stream.default: _rule_record_stream,
    **{
        overload: _rule_set_
        for overload in (
            _aten.set_.source_Tensor,
            _aten.set_.source_Storage,
            _aten.set_.source_Storage_storage_offset,
            _aten.set_.default,
        )
    },
}


def _written_arguments(func: Any, args: tuple, kwargs: dict) -> list[Any]:
    """The arguments ``func`` writes into (``Tensor(a!)`` and ``Tensor(a!)[]`` in its
    schema), as passed: a tensor or a list of tensors each."""
    written = []
    for i, arg in enumerate(func._schema.arguments):
        if arg.alias_info is None or not arg.alias_info.is_write:
            continue
        if i < len(args) and not arg.kwarg_only:
            written.append(args[i])
        elif arg.name in kwargs:
            written.append(kwargs[arg.name])
    return written


class QuantizedView(torch.Tensor):
    """A view of a quantized tensor (``w[0]``, ``w.t()``, ``w.view(-1)``), as a view of
    a plain tensor behaves: reading it reads the quantized tensor's current value through
    the same view ops, and an op writing into it writes the quantized tensor's
    dequantized value through them and requantizes the whole tensor (``w[0].zero_()``,
    ``w[:, :4] = 0``). Not a quantized value itself: other ops give plain tensors."""

    _quantized: QuantizedTensor
    # The view ops from the base, in order: (op, arguments after the tensor, keyword
    # arguments, which output of a multi-output view such as ``split``, or None).
    _views: tuple[tuple[Any, tuple, dict, Optional[int]], ...]

    @staticmethod
    def __new__(
        cls,
        base: QuantizedTensor,
        views: tuple[tuple[Any, tuple, dict, Optional[int]], ...],
        value: torch.Tensor,
    ) -> QuantizedView:
        self = _private.make_wrapper_subclass(
            cls, value.shape, strides=value.stride(), dtype=value.dtype, device=value.device
        )
        self._quantized = base
        self._views = views
        return self

    __torch_function__ = _private.disabled_torch_function_impl

    def fsdp_pre_all_gather(
        self,
        mesh: Any,
        orig_size: torch.Size,
        contiguous_orig_stride: Any,
        module: Any,
        mp_policy: Any,
    ) -> Any:
        """FSDP2 keeps a view as the shard of a quantized parameter whose dim 0 does not
        divide over the mesh (a padded shard): refused, as every rank's hook refuses it."""
        raise RuntimeError(
            f"fully_shard: a quantized parameter of shape {tuple(orig_size)} is sharded "
            f"unevenly over the {mesh.size()} ranks of the FSDP mesh; dim 0 must divide "
            "evenly (every shard a whole block of rows)"
        )

    def fsdp_post_all_gather(
        self, all_gather_outputs: Any, metadata: Any, param_dtype: Any, *, out: Any = None
    ) -> Any:
        raise RuntimeError("fully_shard: a view of a quantized tensor has no FSDP2 all-gather")

    def view_of(self, base_value: torch.Tensor) -> torch.Tensor:
        """This view of ``base_value`` (a dequantized value of the base)."""
        value = base_value
        for func, rest, kwargs, index in self._views:
            value = func(value, *rest, **kwargs)
            if index is not None:
                value = value[index]
        return value

    @classmethod
    def __torch_dispatch__(
        cls, func: Any, types: Any, args: tuple = (), kwargs: Optional[dict] = None
    ) -> Any:
        kwargs = kwargs or {}
        if func is _aten.new_zeros.default and isinstance(args[0], QuantizedView):
            # Zeros in the viewed tensor's format, as a quantized tensor's own
            # ``new_zeros`` (FSDP2 re-pads an empty shard, a view, into one).
            zeros = _rule_new_zeros(func, (args[0]._quantized, *args[1:]), kwargs)
            if zeros is not NotImplemented:
                return zeros
        return _dispatch_on_values(func, args, kwargs)

    def __repr__(self, *, tensor_contents: Any = None) -> str:  # type: ignore[override]
        value = self.view_of(_dequantized(self._quantized))
        return f"QuantizedView(of {type(self._quantized).__name__}, value={value!r})"


def _dequantized(q: QuantizedTensor) -> torch.Tensor:
    """``q``'s value laid out as ``q`` presents itself (contiguous), so that view ops
    valid on ``q`` are valid on it (a columnwise dequantize is a transpose)."""
    return QuantizedData.dequantize_usage(q, columnwise=not q.rowwise_usage).contiguous()


def _traced() -> bool:
    """Whether a compiled graph is being traced (by Dynamo or AOTAutograd, whose
    dispatch runs on fake buffers): the graph keeps plain views of the dequantized value."""
    return torch.compiler.is_compiling()


def _dispatch_on_values(func: Any, args: tuple, kwargs: dict) -> Any:
    """Every op a quantized tensor or a view of one meets without a rule of its own:
    writes requantize (``_run_writing_op``), a view op on one makes a
    :class:`QuantizedView`, anything else runs on the dequantized values."""
    if func._schema.is_mutable:
        return _run_writing_op(func, args, kwargs)
    if func.is_view and args and isinstance(args[0], (QuantizedTensor, QuantizedView)):
        view = _view_of(func, args, kwargs)
        if view is not NotImplemented:
            return view
    values = _PlainValues()
    plain_args, plain_kwargs = _private.tree_map(values, (args, kwargs))
    return func(*plain_args, **plain_kwargs)


def _view_of(func: Any, args: tuple, kwargs: dict) -> Any:
    source, rest = args[0], args[1:]
    if isinstance(source, QuantizedTensor):
        base, views = source, ()
    else:
        base, views = source._quantized, source._views
    if _traced() or any(isinstance(x, torch.Tensor) for x in _private.tree_leaves((rest, kwargs))):
        return NotImplemented  # a plain view of the dequantized value
    value = func(_PlainValues()(source), *rest, **kwargs)
    if isinstance(value, torch.Tensor):
        return QuantizedView(base, (*views, (func, rest, kwargs, None)), value)
    return [QuantizedView(base, (*views, (func, rest, kwargs, i)), v) for i, v in enumerate(value)]


class _PlainValues:
    """Maps the quantized tensors and views an op call is given to plain values: each
    quantized tensor dequantized once (so the op sees the aliasing it was given: ``w``
    and ``w[0]`` in one call share memory), each view that view of its base's value."""

    def __init__(self) -> None:
        self.bases: dict[int, tuple[QuantizedTensor, torch.Tensor]] = {}
        # id(plain value) -> (what it stands for, the value), kept alive with it.
        self.stand_ins: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def base_value(self, q: QuantizedTensor) -> torch.Tensor:
        entry = self.bases.get(id(q))
        if entry is None:
            entry = self.bases[id(q)] = (q, _dequantized(q))
        return entry[1]

    def __call__(self, x: Any) -> Any:
        if isinstance(x, QuantizedTensor):
            value = self.base_value(x)
        elif isinstance(x, QuantizedView):
            value = x.view_of(self.base_value(x._quantized))
        else:
            return x
        self.stand_ins[id(value)] = (x, value)
        return value

    def originals(self, result: Any) -> Any:
        """``result`` with each value that stands for a quantized tensor or a view
        replaced by it (an in-place op returns what it wrote into)."""

        def original(x: Any) -> Any:
            entry = self.stand_ins.get(id(x)) if isinstance(x, torch.Tensor) else None
            return entry[0] if entry is not None and entry[1] is x else x

        return _private.tree_map(original, result)


def _run_writing_op(func: Any, args: tuple, kwargs: dict) -> Any:
    """Run an op that writes into some of its arguments on the plain values of the
    quantized tensors and views it is given, then requantize each quantized tensor
    written (directly or through a view) in place from its written value:
    ``quantize(op(dequantize(w)))``, the update TE's quantized parameters make."""
    written = _private.tree_leaves(_written_arguments(func, args, kwargs))
    if torch.Tag.inplace_view in func.tags and any(isinstance(x, QuantizedView) for x in written):
        raise RuntimeError(
            f"{func}: changes the shape of a view of a quantized tensor in place; "
            "make the view with the shape wanted instead"
        )
    values = _PlainValues()
    plain_args, plain_kwargs = _private.tree_map(values, (args, kwargs))
    result = func(*plain_args, **plain_kwargs)
    targets: dict[int, QuantizedTensor] = {}
    for x in written:
        if isinstance(x, QuantizedTensor):
            targets[id(x)] = x
        elif isinstance(x, QuantizedView):
            targets[id(x._quantized)] = x._quantized
    for target in targets.values():  # every check before any write: all or nothing
        value = values.base_value(target)
        if value.shape != target.shape or value.dtype != target.dtype:
            raise RuntimeError(
                f"{func}: cannot requantize a {type(target).__name__} of shape "
                f"{tuple(target.shape)} and dtype {target.dtype} after an in-place op that "
                f"made its value {tuple(value.shape)} {value.dtype}; dequantize() it first "
                "to work on a plain tensor"
            )
    for target in targets.values():
        target.quantize_(values.base_value(target))
    return values.originals(result)


def is_quantized(x: Any) -> bool:
    """Whether ``x`` is a quantized storage or a quantized wrapper tensor."""
    return isinstance(x, QuantizedData)
