"""The op-generic half of the generated registration glue.

A generated op module holds what differs per op (schemas, flatten/unflatten,
which slots carry gradients); everything the same for every op lives here:
defining the ops, packing results into the flat ``Tensor[]`` return and back,
stashing the backward bundle's tensors on the autograd context, letting a
quantized tensor subclass enter an op as its inner buffers, and protecting
ops from dead-code elimination.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch

from .boundary import (
    optional_tensor_or_quantized,
    quantized_slots,
    unpack_tensor_or_quantized,
    unpack_tensor_or_quantized_list,
)
from .quantizer import QuantizedData, QuantizedTensor, quantized_tensor_classes
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


def _device_of(values: Sequence[Any]) -> torch.device | None:
    return next((v.device for v in values if v is not None), None)


def pack_result(outputs: Sequence[Any], saved: Sequence[Any]) -> list[torch.Tensor]:
    """A forward's (outputs, saved) as one flat list: quantized values as inner buffers."""
    device = _device_of([*outputs, *saved])
    return [t for v in (*outputs, *saved) for t in _flat_value(v, device)]


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


def slot_count(s: TensorSpec | None) -> int:
    return 1 if s is None else len(s.inner_names())


def assemble(specs_: Sequence[TensorSpec | None], flat: Sequence[torch.Tensor]) -> list[Any]:
    """Rebuild values from a flat run of buffers, following their specs."""
    values, cursor = [], 0
    for s in specs_:
        n = slot_count(s)
        values.append(None if s is None else s.assemble(list(flat[cursor : cursor + n])))
        cursor += n
    return values


def split_result(
    out_specs: Sequence[TensorSpec | None],
    saved_specs: Sequence[TensorSpec | None],
    flat: Sequence[torch.Tensor],
) -> tuple[list[Any], list[Any]]:
    n_out = sum(slot_count(s) for s in out_specs)
    return assemble(out_specs, flat[:n_out]), assemble(saved_specs, flat[n_out:])


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


# --- autograd context -------------------------------------------------------------


def save_backward_slots(
    ctx: Any, slots: Sequence[Any], tensor_list_slots: tuple[int, ...] | None = None
) -> None:
    """Keep the backward op's slots on ``ctx``; tensors go through save_for_backward.

    ``tensor_list_slots`` are the ``Tensor[]`` slots (their elements are saved one by
    one); every other slot is a tensor, None or a plain value. Without it, non-empty
    lists of tensors are taken for ``Tensor[]`` slots.
    """
    if tensor_list_slots is None:
        tensor_list_slots = _tensor_lists(slots)
    tensors: list[torch.Tensor] = []
    layout: list[Any] = []
    for i, value in enumerate(slots):
        if isinstance(value, torch.Tensor):
            layout.append(("t", len(tensors)))
            tensors.append(value)
        elif i in tensor_list_slots and value is not None:
            layout.append(("l", len(tensors), len(value)))
            tensors += value
        else:
            layout.append(("v", value))
    ctx.save_for_backward(*tensors)
    ctx.backward_layout = tuple(layout)


def load_backward_slots(ctx: Any) -> list[Any]:
    """The slots :func:`save_backward_slots` kept. The context is left intact, so a
    retained graph may run its backward again (``retain_graph=True``)."""
    tensors = ctx.saved_tensors
    slots: list[Any] = []
    for entry in ctx.backward_layout:
        if entry[0] == "t":
            slots.append(tensors[entry[1]])
        elif entry[0] == "l":
            slots.append(list(tensors[entry[1] : entry[1] + entry[2]]))
        else:
            slots.append(entry[1])
    return slots


def output_grads(
    out_specs: Sequence[TensorSpec | None], flat_grads: Sequence[Any]
) -> list[torch.Tensor]:
    """The gradient of each user output (its first slot), zeros where autograd gave None."""
    grads, cursor = [], 0
    for s in out_specs:
        g = flat_grads[cursor]
        if g is None and s is not None:
            g = torch.zeros(s.shape, dtype=s.dtype, device=s.device)
        grads.append(g)
        cursor += slot_count(s)
    return grads


def input_grad(grad: torch.Tensor, shape: Sequence[Any] | None) -> torch.Tensor | None:
    """A returned gradient, decoded and viewed back to its input's shape."""
    g = decode_none(grad)
    if g is None or shape is None or tuple(g.shape) == tuple(shape):
        return g
    return g.view(shape)


# --- definition -------------------------------------------------------------------

_REGISTRATION_ERRORS: list[str] = []


def registration_error() -> str | None:
    """Why the generated ops could not be registered on this torch (None if they were)."""
    return _REGISTRATION_ERRORS[0] if _REGISTRATION_ERRORS else None


def define(qualname: str, schema: str, kernel: Callable[..., Any], fake: Callable[..., Any]) -> Any:
    """Define a custom op with its real and fake kernels, never dead-code eliminated.

    Ops may run collectives, so an op whose result is unused must still run; FX's
    side-effect registry keeps it (the stronger effect-token mode is incompatible
    with CUDA-graph trees). A failure is recorded, not raised, so the package still
    imports and modules fall back to eager with the reason.
    """
    try:
        op = torch.library.custom_op(qualname, kernel, mutates_args=(), schema=schema)
        op.register_fake(fake)
        torch.fx.node.has_side_effect(op._opoverload)
        return op
    except Exception as exc:  # noqa: BLE001 - any torch-version failure means: fall back
        _REGISTRATION_ERRORS.append(
            f"could not register {qualname} on torch {torch.__version__}: "
            f"{type(exc).__name__}: {exc}"
        )
        return None


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
        op.register_torch_dispatch(cls, rule)


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


def first_device(slots: Sequence[Any]) -> torch.device | None:
    """The device of the first tensor among an op's slots (for sentinels and fakes)."""
    for value in slots:
        if isinstance(value, torch.Tensor):
            return value.device
        if isinstance(value, list) and value and isinstance(value[0], torch.Tensor):
            return value[0].device
    return None


def _tensor_lists(slots: Sequence[Any]) -> tuple[int, ...]:
    return tuple(
        i
        for i, v in enumerate(slots)
        if isinstance(v, list) and v and all(isinstance(t, torch.Tensor) for t in v)
    )


def grad_layout(
    inputs: Sequence[Any],
    grad_slots: tuple[int, ...],
    tensor_list_slots: tuple[int, ...] | None = None,
) -> tuple[Any, ...]:
    """What the backward needs of the forward inputs: each gradient slot's shape (a
    list of element shapes for a ``Tensor[]`` slot) and the length of every input that
    is a list of tensors only (autograd wants a list of gradients there, nothing else
    does). torch decides that by value, whatever the schema type: an empty list of any
    type (``SymInt[]``, a quantizer or description list) counts, and so does a
    ``Tensor?[]`` holding no None; so the values decide here too, and
    ``tensor_list_slots`` (the ``Tensor[]`` slots, a subset) is not needed.
    """
    shapes = tuple(_shape_of(inputs[i]) for i in grad_slots)
    lists = tuple(
        (i, len(v))
        for i, v in enumerate(inputs)
        if isinstance(v, list) and all(isinstance(t, torch.Tensor) for t in v)
    )
    return shapes, lists


def _shape_of(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.shape
    if isinstance(value, list):
        return [t.shape for t in value]
    return None


def input_grads(
    n_slots: int,
    grad_slots: tuple[int, ...],
    grads: Sequence[torch.Tensor],
    layout: tuple[Any, ...],
) -> tuple[Any, ...]:
    """One gradient per forward slot from the backward op's flat result: the declared
    gradient fields' at their slots (a ``Tensor[]`` field takes one per element)."""
    shapes, lists = layout
    out: list[Any] = [None] * n_slots
    for slot, length in lists:
        out[slot] = [None] * length
    cursor = 0
    for slot, shape in zip(grad_slots, shapes, strict=True):
        if isinstance(shape, list):
            n = len(shape)
            out[slot] = [
                input_grad(g, s) for g, s in zip(grads[cursor : cursor + n], shape, strict=True)
            ]
            cursor += n
        else:
            out[slot] = input_grad(grads[cursor], shape)
            cursor += 1
    return tuple(out)


# --- user outputs of a compiled call ----------------------------------------------
# A forward op returns one flat ``Tensor[]``: user outputs, then saved values, a
# quantized value spread over its inner buffers. Which buffers form which output is
# what the kernel that ran last for the op described: the fake kernel when dynamo
# traces the call (so the compiled graph rebuilds outputs exactly as the fake, that is
# the op's spec function, describes them), the real kernel otherwise. Each entry is
# shape-free and hashable, a graph constant: ``("none",)``, ``("tensor",)`` or
# ``(tag, class, inner names, flatten context)`` with tag ``storage`` or ``wrapper``.
_OUTPUT_LAYOUTS: dict[str, tuple[tuple[Any, ...], ...]] = {}


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


def record_outputs(qualname: str, outputs: Sequence[Any]) -> None:
    """Remember how the real kernel's user outputs sit in its flat result."""
    _OUTPUT_LAYOUTS[qualname] = tuple(_value_layout(v) for v in outputs)


def record_output_specs(qualname: str, out_specs: Sequence[TensorSpec | None]) -> None:
    """Remember how the fake kernel's user outputs sit in its flat result."""
    _OUTPUT_LAYOUTS[qualname] = tuple(_spec_layout(s) for s in out_specs)
    # Dynamo reads the layout as a constant. Marked here (a fake runs before dynamo
    # traces :func:`user_outputs`), not at import: importing torch._dynamo there would
    # cost every import of a generated module.
    torch.compiler.assume_constant_result(output_layout)


def output_layout(qualname: str) -> tuple[tuple[Any, ...], ...]:
    """The user-output layout of the op call that just ran (a constant while tracing)."""
    return _OUTPUT_LAYOUTS[qualname]


def user_outputs(qualname: str, flat: Sequence[torch.Tensor]) -> tuple[Any, ...]:
    """The user outputs of a forward op's flat result, quantized ones rebuilt."""
    outputs: list[Any] = []
    cursor = 0
    for entry in output_layout(qualname):
        tag = entry[0]
        if tag == "none":
            outputs.append(None)
            cursor += 1
        elif tag == "tensor":
            outputs.append(flat[cursor])
            cursor += 1
        else:
            _, cls, names, context = entry
            inner = flat[cursor : cursor + len(names)]
            cursor += len(names)
            if tag == "storage":
                outputs.append(cls._from_flat(names, list(inner), context))
            else:
                # What ``__tensor_unflatten__`` does, spelled so dynamo traces it (it
                # cannot trace that classmethod on a tensor subclass).
                meta = dict(context)
                buffers = dict(zip(names, inner, strict=False))
                outputs.append(cls(buffers, quantizer=meta["quantizer"], dtype=meta["dtype"]))
    return tuple(outputs)


# --- the eager path: an autograd.Function straight into the impls -------------------


def save_values(ctx: Any, values: Sequence[Any]) -> None:
    """Save the tensor-carrying fields of a backward bundle with ``save_for_backward``:
    every tensor (a quantized value as its inner buffers), so saved-tensor hooks
    (``save_on_cpu``, checkpointing, memory tools) see all of them."""
    tensors: list[torch.Tensor] = []
    layout: list[Any] = []
    for value in values:
        if value is None:
            layout.append(None)
        elif isinstance(value, list | tuple):
            layout.append(("l", tuple(_save(item, tensors) for item in value)))
        else:
            layout.append(_save(value, tensors))
    ctx.save_for_backward(*tensors)
    ctx.saved_layout = tuple(layout)


def _save(value: Any, tensors: list[torch.Tensor]) -> tuple[Any, ...]:
    if isinstance(value, QuantizedData):
        _, inner, meta = quantized_slots(value)
        tensors += inner
        return ("q", len(tensors) - len(inner), len(inner), meta)
    tensors.append(value)
    return ("t", len(tensors) - 1)


def _load(entry: Any, tensors: Sequence[torch.Tensor]) -> Any:
    if entry[0] == "t":
        return tensors[entry[1]]
    _, start, n, meta = entry
    return unpack_tensor_or_quantized(None, tensors[start : start + n], meta)


def load_values(ctx: Any) -> list[Any]:
    """The values :func:`save_values` saved; the context stays intact (the backward may
    run again on a retained graph)."""
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


def eager_inputs(
    values: Sequence[Any], lists: tuple[bool, ...]
) -> tuple[tuple[Any, ...], tuple[int | None, ...]]:
    """The gradient fields' values as ``autograd.Function`` inputs (a list field spread
    over its elements), and each field's length (None for a single value)."""
    flat: list[Any] = []
    lengths: list[int | None] = []
    for value, is_list in zip(values, lists, strict=True):
        if is_list:
            items = [] if value is None else list(value)
            flat += items
            lengths.append(len(items))
        else:
            flat.append(value)
            lengths.append(None)
    return tuple(flat), tuple(lengths)


def needs_autograd(inputs: Sequence[Any]) -> bool:
    return torch.is_grad_enabled() and any(
        isinstance(t, torch.Tensor) and t.requires_grad for t in inputs
    )


def eager_input_grads(
    lengths: tuple[int | None, ...], is_tensor: tuple[bool, ...], grads: Sequence[Any]
) -> tuple[Any, ...]:
    """``backward_impl``'s gradients, one per ``autograd.Function`` input (None where
    the input was not a tensor: a None optional field or a bare quantized storage)."""
    flat: list[Any] = []
    if len(grads) != len(lengths):
        raise ValueError(
            f"backward_impl returned {len(grads)} gradients, but the op declares "
            f"{len(lengths)} grad_fields"
        )
    for n, grad in zip(lengths, grads, strict=True):
        if n is None:
            flat.append(grad)
        else:
            items = [None] * n if grad is None else list(grad)
            if len(items) != n:
                raise ValueError(
                    f"backward_impl returned {len(items)} gradients for a list of {n} tensors"
                )
            flat += items
    return tuple(g if t else None for g, t in zip(flat, is_tensor, strict=True))
