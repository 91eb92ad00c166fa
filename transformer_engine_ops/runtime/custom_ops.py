"""The op-generic half of the generated registration glue.

A generated op module holds what differs per op (schemas, flatten/unflatten, its
autograd Functions written out field by field, its calling side); everything the same
for every op lives here, as small helpers over values:
defining the ops, packing results into the flat ``Tensor[]`` return and back,
stashing the backward bundle's tensors on the autograd context, letting a
quantized tensor subclass enter an op as its inner buffers, and protecting
ops from dead-code elimination.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..quantization.quantizer import (
    QuantizedData,
    QuantizedTensor,
    quantized_tensor_classes,
    value_opaque_reason,
)
from . import _torch_private as _private
from . import lowering
from .boundary import (
    SlotRow,
    optional_tensor_or_quantized,
    quantized_slots,
    unpack_tensor_or_quantized,
    unpack_tensor_or_quantized_list,
)
from .boundary import (
    first_device as first_device,  # generated kernels call it as ``_r.first_device``
)
from .declaration import (
    check_nothing_saved as check_nothing_saved,  # generated calls: ``_r.check_nothing_saved``
)
from .declaration import (
    check_setup_context as check_setup_context,  # generated calls: ``_r.check_setup_context``
)
from .fallback import run_eagerly as run_eagerly  # generated calls: ``_r.run_eagerly``
from .keep import Keep as Keep  # generated calls: ``_r.Keep``
from .library import op_library
from .tensor_spec import TensorSpec, to_tensor_spec

# --- None in a ``Tensor[]`` return ------------------------------------------------
# A ``Tensor[]`` return cannot hold None, and it must stay non-optional for autograd
# to attach grad_fn. Absent entries travel as a 0-element complex32 tensor: no real
# buffer of this library is complex32, so an empty FP8 buffer (batch size 0) is never
# mistaken for "absent".
_SENTINEL_DTYPE = torch.complex32
# Creating an empty complex32 tensor warns that ComplexHalf is experimental; no
# arithmetic ever runs on the sentinel, so that warning is noise here.
warnings.filterwarnings("ignore", message="ComplexHalf support is experimental")


def none_sentinel(device: torch.device | None = None) -> torch.Tensor:
    return torch.empty((0,), dtype=_SENTINEL_DTYPE, device=device)


def is_none_sentinel(t: torch.Tensor) -> bool:
    return t.dtype == _SENTINEL_DTYPE


def decode_none(t: torch.Tensor) -> torch.Tensor | None:
    return None if t.dtype == _SENTINEL_DTYPE else t


# --- spec views for fake kernels ---------------------------------------------------


def spec(value: Any) -> TensorSpec | None:
    """A tensor field's value as a TensorSpec (None stays None)."""
    return None if value is None else to_tensor_spec(value)


def specs(values: Sequence[Any] | None) -> list[TensorSpec] | None:
    return None if values is None else [None if v is None else to_tensor_spec(v) for v in values]


# --- flat results -----------------------------------------------------------------


def _flat_value(value: Any, device: torch.device | None) -> list[torch.Tensor]:
    # The fake allocates every flat buffer contiguous (``TensorSpec.create_inner_tensors``),
    # so the real ones are made contiguous too (a no-op unless a format returned a view,
    # e.g. a transposed scale buffer): otherwise inductor's stride asserts fail.
    if value is None:
        return [none_sentinel(device)]
    if isinstance(value, QuantizedData):
        return [t.contiguous() for t in quantized_slots(value)[1]]
    return [value.contiguous()]


def fake_result(
    out_specs: Sequence[TensorSpec | None],
    saved_specs: Sequence[TensorSpec | None],
    device: torch.device | None,
) -> list[torch.Tensor]:
    """The same flat layout as :func:`pack_result`, allocated from specs (fake at trace)."""
    flat: list[torch.Tensor] = []
    for s in (*out_specs, *saved_specs):
        flat += [none_sentinel(device)] if s is None else s.create_inner_tensors()
    return flat


def _flat_grads(grads: Sequence[Any], device: torch.device | None) -> list[torch.Tensor]:
    flat: list[torch.Tensor] = []
    for g in grads:
        if isinstance(g, list | tuple):  # a ``List[Tensor]`` gradient field: one per element
            flat += [none_sentinel(device) if e is None else e.contiguous() for e in g]
        else:
            flat.append(none_sentinel(device) if g is None else g.contiguous())
    return flat


def pack_grads(grads: Sequence[Any], device: torch.device | None) -> list[torch.Tensor]:
    """A backward's gradients as one flat list (a list gradient spreads over its elements)."""
    return _flat_grads(grads, device)


def fake_grads(grad_specs: Sequence[Any], device: torch.device | None) -> list[torch.Tensor]:
    flat: list[torch.Tensor] = []
    for s in grad_specs:
        for e in s if isinstance(s, list | tuple) else (s,):
            flat.append(none_sentinel(device) if e is None else e.create_tensor())
    return flat


# --- definition -------------------------------------------------------------------

_REGISTRATION_ERRORS: list[str] = []


class OpRegistrationError(RuntimeError):
    """A generated op's schema cannot be defined: its module must not import as if it had
    been (a silent ``None`` op surfaced only as an opaque error inside a compiled call)."""


def registration_error() -> str | None:
    """Why the generated ops could not be registered on this torch (None if they were)."""
    return _REGISTRATION_ERRORS[0] if _REGISTRATION_ERRORS else None


def register_quantized_dispatch(op: Any, tq_slots: tuple[int, ...]) -> None:
    """Let quantized wrapper tensors enter ``op``: each ``Tensor?`` slot of a
    tensor-or-quantized group (at ``tq_slots``) holding one, and each ``Tensor?[]``
    slot of a tensor-or-quantized list group holding some, is rewritten into inner
    buffers and descriptions, and the op is called again."""
    if op is None or not tq_slots:
        return

    def rule(mode: Any, func: Any, types: Any, args: tuple, kwargs: dict) -> Any:
        slots = list(args)
        for i in tq_slots:
            value = slots[i]
            if isinstance(value, QuantizedTensor):
                slots[i], slots[i + 1], slots[i + 2] = quantized_slots(value)
            elif isinstance(value, list) and any(isinstance(v, QuantizedTensor) for v in value):
                slots[i], slots[i + 1], slots[i + 2] = _split_wrappers(*slots[i : i + 3])
        return op(*slots, **kwargs)

    for cls in quantized_tensor_classes():
        torch.library.register_torch_dispatch(op, cls, rule)


def _split_wrappers(tensors: list, inner: list, metas: list) -> tuple[list, list, list]:
    """A tensor-or-quantized list group with its wrapper tensors as buffers and descriptions."""
    out_tensors: list[Any] = []
    out_inner: list[torch.Tensor] = []
    out_metas: list[Any] = []
    for value in unpack_tensor_or_quantized_list(tensors, inner, metas):
        if isinstance(value, QuantizedData):
            tensor, buffers, meta = quantized_slots(value)
        else:
            tensor, buffers, meta = optional_tensor_or_quantized(value, "a list element")
        out_tensors.append(tensor)
        out_inner += buffers
        out_metas.append(meta)
    return out_tensors, out_inner, out_metas


def _shape_of(value: Any) -> Any:
    # (the reflection baseline of benchmarks/reflection_registration.py reads it)
    if isinstance(value, torch.Tensor):
        return value.shape
    if isinstance(value, list):
        return [t.shape for t in value]
    return None


# --- user outputs of a compiled call ----------------------------------------------
# A forward op returns one flat ``Tensor[]``: user outputs, then saved values, a
# quantized value spread over its inner buffers. Which buffers form which value is the
# call's *result layout*: per value ``("none",)``, ``("tensor",)`` or
# ``(tag, class, inner names, flatten context)`` with tag ``storage`` or ``wrapper``;
# shape-free and hashable, so a graph constant.
#
# A ``Tensor[]`` return carries no such description, so the kernel that served a call
# (the real one, or the fake one while the call is traced: the op's spec on the call's
# own inputs) hands it to its caller through this thread's *call record*: the caller
# opens the record (:func:`begin_call`), calls the op, and reads what that call's kernel
# wrote (:func:`result_layouts`). The record is thread-local and opened per call, so
# neither another thread's call nor an earlier one can be read in its place (a
# process-wide "last layout per op" would let one thread's kernel rewrite what another
# thread's trace reads). Under Dynamo both functions run once, at trace time
# (``assume_constant_result``): the layout becomes a constant of the graph.


class _CallRecord(threading.local):
    """This thread's open op calls: qualname -> the result layout its kernel described
    (None until the kernel has run)."""

    def __init__(self) -> None:
        self.layouts: dict[str, tuple[tuple[Any, ...], tuple[Any, ...]] | None] = {}


_CALL_RECORD = _CallRecord()


def begin_call(qualname: str) -> None:
    """Open this thread's record for one call of ``qualname`` (forgetting any earlier
    call's layout): the op's kernel fills it, :func:`result_layouts` reads it."""
    _CALL_RECORD.layouts[qualname] = None


def result_layouts(qualname: str) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """(user-output layouts, saved-value layouts) of the ``qualname`` call this thread
    opened with :func:`begin_call`, as its kernel described them."""
    layouts = _CALL_RECORD.layouts.get(qualname)
    if layouts is None:
        raise RuntimeError(
            f"{qualname}: its kernel described no result layout for this call on this "
            "thread (begin_call, then one call of the op, then result_layouts)"
        )
    return layouts


def output_layout(qualname: str) -> tuple[tuple[Any, ...], ...]:
    """The user-output layout of the ``qualname`` call this thread just made (a constant
    while tracing)."""
    return result_layouts(qualname)[0]


def _record(qualname: str, out: tuple[Any, ...], saved: tuple[Any, ...]) -> None:
    # Only a call opened on this thread is recorded; a kernel run by a compiled graph
    # (whose layout is a constant of the graph) has nothing to tell.
    layouts = _CALL_RECORD.layouts
    if qualname in layouts:
        layouts[qualname] = (out, saved)


def _value_layout(value: Any) -> tuple[Any, ...]:
    if value is None:
        return ("none",)
    if isinstance(value, QuantizedData):
        names, context = value.__tensor_flatten__()
        tag = "wrapper" if isinstance(value, torch.Tensor) else "storage"
        return (tag, type(value), tuple(names), context)
    return ("tensor",)


def _spec_layout(s: TensorSpec | None) -> tuple[Any, ...]:
    if s is None:
        return ("none",)
    if s.quantizer is None:
        return ("tensor",)
    internal = s.quantizer.internal
    cls = s.quantizer.storage_cls if internal else s.quantizer.wrapper_cls
    return ("storage" if internal else "wrapper", cls, s.inner_names(), s.create_metadata())


def pack_and_record(qualname: str, outputs: Sequence[Any], saved: Sequence[Any]) -> list[Any]:
    """Pack a real kernel's ``(outputs, saved)`` into its flat result; describe its
    layout to the call that opened a record on this thread."""
    flat: list[torch.Tensor] = []
    layouts: list[tuple[Any, ...]] = []
    device = None
    for value in (*outputs, *saved):
        if type(value) is torch.Tensor:  # the common case: a plain tensor
            flat.append(value.contiguous())
            layouts.append(_TENSOR_LAYOUT)
            device = device or value.device
        elif value is None:
            flat.append(None)
            layouts.append(_NONE_LAYOUT)
        else:
            flat += _flat_value(value, None)
            layouts.append(_value_layout(value))
            device = device or value.device
    n = len(outputs)
    _record(qualname, tuple(layouts[:n]), tuple(layouts[n:]))
    return [none_sentinel(device) if t is None else t for t in flat]


_TENSOR_LAYOUT = ("tensor",)
_NONE_LAYOUT = ("none",)


def record_output_specs(
    qualname: str,
    out_specs: Sequence[TensorSpec | None],
    saved_specs: Sequence[TensorSpec | None] = (),
) -> None:
    """Describe the fake kernel's result layout (the op's spec on this call's inputs) to
    the call that opened a record on this thread."""
    _record(
        qualname,
        tuple(_spec_layout(s) for s in out_specs),
        tuple(_spec_layout(s) for s in saved_specs),
    )


def rebuild(layouts: Sequence[tuple[Any, ...]], flat: Sequence[torch.Tensor]) -> tuple[Any, ...]:
    """The values laid out by ``layouts`` from the start of ``flat``, quantized ones
    rebuilt as their class: a forward op's user outputs by its call's
    :func:`output_layout` (the generated call reads it: a constant while traced), or
    saved values by theirs. Tensors and Nones are placed here and only a quantized
    value costs a call (:func:`_rebuild_quantized`): under Dynamo every inlined
    function is guarded on each compiled call."""
    values: list[Any] = []
    cursor = 0
    for entry in layouts:
        tag = entry[0]
        if tag == "tensor":
            values.append(flat[cursor])
            cursor += 1
        elif tag == "none":
            values.append(None)
            cursor += 1
        else:
            value, cursor = _rebuild_quantized(entry, flat, cursor)
            values.append(value)
    return tuple(values)


def _call_layouts(qualname: str) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """:func:`result_layouts`, read as a constant while traced (for :func:`kept_values`)."""
    return result_layouts(qualname)


def _width(entry: tuple[Any, ...]) -> int:
    """How many flat slots a value of this layout takes."""
    return 1 if entry[0] in ("none", "tensor") else len(entry[2])


def kept_values(
    qualname: str, flat: Sequence[torch.Tensor], kept: tuple[int, ...]
) -> tuple[Any, ...]:
    """The saved values at the indices ``kept`` of a forward op's flat result (the call
    this thread just made), in ``kept``'s order, rebuilt from *detached* buffers: state
    a module keeps across calls (TE's weight workspace), outside this call's autograd
    graph. Each is None, a plain tensor or a quantized wrapper tensor: a traced call can
    build those, not a bare storage (refused with the index)."""
    if not kept:  # the common call: nothing to trace through
        return ()
    out_layouts, saved_layouts = _call_layouts(qualname)
    missing = [index for index in kept if not 0 <= index < len(saved_layouts)]
    if missing:
        raise IndexError(
            f"{qualname}: no saved value {missing[0]} to keep (this call saved "
            f"{len(saved_layouts)})"
        )
    cursor = sum(_width(entry) for entry in out_layouts)
    found: dict[int, Any] = {}
    for index, entry in enumerate(saved_layouts):
        width = _width(entry)
        if index in kept:
            if entry[0] == "storage":
                raise TypeError(
                    f"{qualname}: saved value {index} is a bare quantized storage; a value "
                    "kept across calls must be a tensor or a quantized wrapper tensor"
                )
            buffers = [t.detach() for t in flat[cursor : cursor + width]]
            found[index] = rebuild((entry,), buffers)[0]
        cursor += width
    return tuple(found[index] for index in kept)


# Dynamo calls these once while it traces a compiled call, and bakes in what they
# return: the record is opened and read at trace time, around the fake kernel's run.
_private.mark_constant_result(begin_call)
_private.mark_constant_result(output_layout)
_private.mark_constant_result(_call_layouts)


# --- the generated autograd Functions' op-generic pieces ----------------------------
# Each generated op module writes its two ``torch.autograd.Function``s out field by field
# (``_EagerNode``: the eager path; ``_OpNode``: the op's autograd kernel). What is the
# same for every op, and loops over values rather than fields, is here.


def save_for_backward(ctx: Any, *values: Any) -> None:
    """Save a backward bundle's tensor-carrying values with ``ctx.save_for_backward``:
    every tensor (a quantized value as its inner buffers, a list element by element), so
    saved-tensor hooks (``save_on_cpu``, checkpointing, memory tools) see all of them;
    :func:`load_saved` gives the values back."""
    tensors: list[torch.Tensor] = []
    layout: list[Any] = []
    for value in values:
        if value is None:
            layout.append(None)
        elif type(value) in _PLAIN_TENSORS:  # the common case: a plain tensor
            layout.append(("t", len(tensors)))
            tensors.append(value)
        elif isinstance(value, list | tuple):
            layout.append(("l", tuple(_save(item, tensors) for item in value)))
        else:
            layout.append(_save(value, tensors))
    ctx.save_for_backward(*tensors)
    ctx.saved_layout = tuple(layout)


_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)


def _save(value: Any, tensors: list[torch.Tensor]) -> tuple[Any, ...]:
    if value is None:
        return ("n",)
    if isinstance(value, QuantizedData):
        _, inner, meta = quantized_slots(value)
        tensors += inner
        return ("q", len(tensors) - len(inner), len(inner), meta)
    tensors.append(value)
    return ("t", len(tensors) - 1)


def _load(entry: Any, tensors: Sequence[torch.Tensor]) -> Any:
    if entry[0] == "t":
        return tensors[entry[1]]
    if entry[0] == "n":
        return None
    _, start, n, meta = entry
    return unpack_tensor_or_quantized(None, tensors[start : start + n], meta)


def load_saved(ctx: Any) -> list[Any]:
    """The values :func:`save_for_backward` saved, in its order; the context stays
    intact (the backward may run again on a retained graph)."""
    tensors = ctx.saved_tensors
    values: list[Any] = []
    for entry in ctx.saved_layout:
        if entry is None:
            values.append(None)
        elif entry[0] == "l":
            values.append([_load(e, tensors) for e in entry[1]])
        else:
            values.append(_load(entry, tensors))
    return values


def length(value: Sequence[Any] | None) -> int:
    """The element count of a list gradient field (an absent list has none)."""
    return 0 if value is None else len(value)


def input_grads(
    ctx: Any,
    grads: Sequence[Any],
    lengths: tuple[int | None, ...],
    lead: int,
    shapes: tuple[Any, ...] | None = None,
) -> tuple[Any, ...]:
    """``backward_impl``'s gradients (one per grad field, a list for a list field) as an
    ``autograd.Function`` backward returns them: ``lead`` Nones for the non-tensor
    arguments first, then one per input (a list field spread over its ``lengths``
    elements), None where the input needs none (not a tensor, or no grad). ``shapes``:
    each input's shape, a gradient of another (a flat view) reshaped to it."""
    if len(grads) != len(lengths):
        raise ValueError(
            f"backward_impl returned {len(grads)} gradients, but the op declares "
            f"{len(lengths)} grad_fields"
        )
    flat: list[Any] = []
    for n, grad in zip(lengths, grads, strict=True):
        if n is None:
            flat.append(grad)
            continue
        items = [None] * n if grad is None else list(grad)
        if len(items) != n:
            raise ValueError(
                f"backward_impl returned {len(items)} gradients for a list of {n} tensors"
            )
        flat += items
    needs = ctx.needs_input_grad
    if shapes is not None:
        flat = [
            g if g is None or s is None or g.shape == s else g.view(s)
            for g, s in zip(flat, shapes, strict=True)
        ]
    return (
        *([None] * lead),
        *(g if needs[lead + i] else None for i, g in enumerate(flat)),
    )


def input_shapes(inputs: Sequence[Any]) -> tuple[Any, ...]:
    return tuple(t.shape if isinstance(t, torch.Tensor) else None for t in inputs)


def output_grad_slots(outputs: Sequence[Any]) -> tuple[tuple[int, Any], ...]:
    """Where the gradient of each user output arrives in a forward op's flat result (its
    first slot; inner buffers after the first, saved values and sentinels get none),
    and how to make zeros for an output that got no gradient."""
    firsts, cursor = [], 0
    for value in outputs:
        firsts.append((cursor, _zeros_spec(value)))
        cursor += _slot_count(value)
    return tuple(firsts)


def output_grads(firsts: tuple[tuple[int, Any], ...], flat_grads: Sequence[Any]) -> list[Any]:
    """Each user output's gradient from a forward op's flat gradients (zeros where an
    output that exists received none)."""
    grads = []
    for slot, zeros in firsts:
        g = flat_grads[slot]
        if g is None and zeros is not None:
            g = torch.zeros(zeros[0], dtype=zeros[1], device=zeros[2])
        grads.append(g)
    return grads


def field_grads(flat: Sequence[torch.Tensor], lengths: tuple[int | None, ...]) -> list[Any]:
    """A backward op's flat result as one gradient per grad field (a list for a list
    field), sentinels as None."""
    grads: list[Any] = []
    cursor = 0
    for n in lengths:
        if n is None:
            grads.append(decode_none(flat[cursor]))
            cursor += 1
        else:
            grads.append([decode_none(g) for g in flat[cursor : cursor + n]])
            cursor += n
    return grads


def redispatch_forward(
    op: Any, qualname: str, below: Any, slots: tuple[Any, ...]
) -> tuple[Any, list[Any], list[Any]]:
    """A traced forward-op call below autograd: its flat result, and the user outputs
    and saved values rebuilt from it by the layout its (fake) kernel described."""
    begin_call(qualname)
    with _private.AutoDispatchBelowAutograd():
        flat = op.redispatch(below, *slots)
    out_layout, saved_layout = result_layouts(qualname)
    outputs = rebuild(out_layout, flat)
    saved = rebuild(saved_layout, flat[sum(_width(entry) for entry in out_layout) :])
    return flat, outputs, saved


# The keys left once Autograd is handled, and the C check of "any argument (a tensor,
# or a list of them) requires grad" (the generated autograd kernels use both).
AFTER_AUTOGRAD = _private.after_autograd_keyset
any_requires_grad = _private.any_requires_grad


# --- why a compiled call runs eagerly (the generated ``<op>_compile_blocker``) --------


def quantizer_blocker(*quantizers: Any) -> str | None:
    """Why one of a bundle's quantizers cannot cross a compiled op boundary as a graph
    constant (e.g. delayed scaling's, which keep state), or None."""
    for q in quantizers:
        if q is not None:
            reason = value_opaque_reason(q)
            if reason is not None:
                return f"the {type(q).__name__} quantizer is not value-opaque ({reason})"
    return None


# --- lean registration: the dispatcher's fixed cost, paid once per call -----------------
# ``torch.library.custom_op`` wraps every call in Python layers: an autograd kernel that,
# even with no gradient to record, re-enters the dispatcher (every slot converted to C++
# and back a second time), a backend wrapper checking output aliasing, and a
# dynamo-disable wrapper. An op of ~36 slots pays that on every call, including every
# call a compiled graph makes. The ops here are defined on a ``torch.library.Library``
# with the kernel at CompositeExplicitAutograd and an autograd kernel of our own that,
# when no gradient is recorded and the next dispatch key is the plain backend (no fake
# tensors, functionalization, tensor subclass or mode in between), calls the kernel
# straight away: one conversion of the slots per call.

_BACKEND_KEYS = _private.BACKEND_KEYS


def plain_backend(below: Any) -> bool:
    """Whether a redispatch with ``below`` would go straight to the backend kernel."""
    return below.highestPriorityTypeId() in _BACKEND_KEYS


def define_op(
    qualname: str,
    schema: str,
    kernel: Callable[..., Any],
    fake: Callable[..., Any],
    slots: Sequence[SlotRow],
    *,
    differentiable: bool = False,
    lowers: bool = False,
    cudagraph_unsafe: str | None = None,
) -> Any:
    """Define a custom op (its OpOverload), real and fake kernels, never dead-code
    eliminated. A ``differentiable`` op gets its autograd kernel from
    :func:`register_autograd`; any other never records a gradient. ``slots`` (the op's
    slot table) tell :mod:`.lowering` which calls Inductor may trace the kernel of;
    ``lowers`` (the declaration's) whether every Inductor compile does.
    ``cudagraph_unsafe`` (the declaration's reason) tags the op so that Inductor runs it
    outside its CUDA graphs (``mode="reduce-overhead"`` partitions the graph around it).

    Ops may run collectives, so an op whose result is unused must still run; FX's
    side-effect registry keeps it. A schema torch refuses (more arguments than its
    dispatcher takes, a name defined twice) raises :class:`OpRegistrationError`, so the
    generated module does not import. A torch capability missing after that is recorded,
    not raised (None returned), so the package still imports and modules fall back to
    eager with the reason.
    """
    namespace, name = qualname.split("::")
    lib = op_library(namespace)
    try:
        lib.define(name + schema, tags=(torch.Tag.cudagraph_unsafe,) if cudagraph_unsafe else ())
    except RuntimeError as exc:
        raise OpRegistrationError(
            f"cannot define the op {qualname} on torch {torch.__version__}: {exc}"
        ) from None
    try:
        lib.impl(name, kernel, "CompositeExplicitAutograd")
        torch.library.register_fake(qualname, lowering.keyed(fake) if lowers else fake, lib=lib)
        op = getattr(getattr(torch.ops, namespace), name).default
        after_autograd = _private.after_autograd_keyset

        def no_grad_kernel(keyset: Any, *slots: Any) -> Any:
            # A non-differentiable op (e.g. a backward op): never records a gradient.
            return below_autograd(op, kernel, keyset & after_autograd, slots)

        if not differentiable:
            lib.impl(name, no_grad_kernel, "Autograd", with_keyset=True)
        torch.fx.node.has_side_effect(op)
        lowering.register(op, kernel, slots, by_default=lowers)
        return op
    except Exception as exc:  # noqa: BLE001 - any torch-version failure means: fall back
        _REGISTRATION_ERRORS.append(
            f"could not register {qualname} on torch {torch.__version__}: "
            f"{type(exc).__name__}: {exc}"
        )
        return None


def below_autograd(op: Any, kernel: Callable[..., Any], below: Any, slots: tuple[Any, ...]) -> Any:
    """An op call that records no gradient: its kernel straight away when the next key
    is the plain backend, else a re-dispatch below autograd."""
    if plain_backend(below):
        return kernel(*slots)
    with _private.AutoDispatchBelowAutograd():
        return op.redispatch(below, *slots)


def register_autograd(op: Any, autograd_kernel: Callable[..., Any]) -> None:
    """Make the forward op differentiable through its generated autograd kernel
    (``autograd_kernel(keyset, *slots)``; see ``_OpNode`` in a generated module)."""
    if op is None:
        return
    namespace, name = op.name().split("::")
    op_library(namespace).impl(name, autograd_kernel, "Autograd", with_keyset=True)


def _slot_count(value: Any) -> int:
    if isinstance(value, QuantizedData):
        return len(quantized_slots(value)[1])
    return 1


def _zeros_spec(value: Any) -> tuple[Any, ...] | None:
    if value is None:
        return None
    return (tuple(value.shape), value.dtype, value.device)


def _rebuild_quantized(
    entry: tuple[Any, ...], flat: Sequence[torch.Tensor], cursor: int
) -> tuple[Any, int]:
    """The quantized value (a storage or a wrapper tensor) laid out by ``entry`` in
    ``flat`` at ``cursor``, and the cursor after it."""
    tag, cls, names, context = entry
    inner = list(flat[cursor : cursor + len(names)])
    cursor += len(names)
    if tag == "storage":
        return cls._from_flat(names, inner, context), cursor
    # What ``__tensor_unflatten__`` does, spelled so dynamo traces it (it cannot trace
    # that classmethod on a tensor subclass).
    meta = dict(context)
    buffers = dict(zip(names, inner, strict=False))
    return cls(buffers, quantizer=meta["quantizer"], dtype=meta["dtype"]), cursor
