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

from .boundary import quantized_slots
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


def pack_grads(
    grads: Sequence[torch.Tensor | None], device: torch.device | None
) -> list[torch.Tensor]:
    return [none_sentinel(device) if g is None else g.contiguous() for g in grads]


def fake_grads(
    grad_specs: Sequence[TensorSpec | None], device: torch.device | None
) -> list[torch.Tensor]:
    return [none_sentinel(device) if s is None else s.create_tensor() for s in grad_specs]


# --- autograd context -------------------------------------------------------------


def save_backward_slots(ctx: Any, slots: Sequence[Any]) -> None:
    """Keep the backward op's slots on ``ctx``; tensors go through save_for_backward."""
    tensors: list[torch.Tensor] = []
    layout: list[Any] = []
    for value in slots:
        if isinstance(value, torch.Tensor):
            layout.append(("t", len(tensors)))
            tensors.append(value)
        elif isinstance(value, list) and value and isinstance(value[0], torch.Tensor):
            layout.append(("l", len(tensors), len(value)))
            tensors += value
        else:
            layout.append(("v", value))
    ctx.save_for_backward(*tensors)
    ctx.backward_layout = layout


def load_backward_slots(ctx: Any) -> list[Any]:
    tensors = ctx.saved_tensors
    slots: list[Any] = []
    for entry in ctx.backward_layout:
        if entry[0] == "t":
            slots.append(tensors[entry[1]])
        elif entry[0] == "l":
            slots.append(list(tensors[entry[1] : entry[1] + entry[2]]))
        else:
            slots.append(entry[1])
    ctx.backward_layout = None
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
    tensor-or-quantized group (at ``tq_slots``) holding one is rewritten into its
    inner buffers and description, and the op is called again."""
    if op is None or not tq_slots:
        return

    def rule(mode: Any, func: Any, types: Any, args: tuple, kwargs: dict) -> Any:
        slots = list(args)
        for i in tq_slots:
            if isinstance(slots[i], QuantizedTensor):
                slots[i], slots[i + 1], slots[i + 2] = quantized_slots(slots[i])
        return op(*slots, **kwargs)

    for cls in quantized_tensor_classes():
        op.register_torch_dispatch(cls, rule)


def first_device(slots: Sequence[Any]) -> torch.device | None:
    """The device of the first tensor among an op's slots (for sentinels and fakes)."""
    for value in slots:
        if isinstance(value, torch.Tensor):
            return value.device
        if isinstance(value, list) and value and isinstance(value[0], torch.Tensor):
            return value[0].device
    return None


def grad_layout(inputs: Sequence[Any], grad_slots: tuple[int, ...]) -> tuple[Any, ...]:
    """What the backward needs of the forward inputs: the gradient slots' shapes and
    the length of every ``Tensor[]`` slot (autograd wants a list of grads there)."""
    shapes = tuple(
        inputs[i].shape if isinstance(inputs[i], torch.Tensor) else None for i in grad_slots
    )
    lists = tuple((i, len(v)) for i, v in enumerate(inputs) if isinstance(v, list))
    return shapes, lists


def input_grads(
    n_slots: int,
    grad_slots: tuple[int, ...],
    grads: Sequence[torch.Tensor],
    layout: tuple[Any, ...],
) -> tuple[Any, ...]:
    """One gradient per forward slot: the declared gradient fields' at their slots."""
    shapes, lists = layout
    out: list[Any] = [None] * n_slots
    for slot, length in lists:
        out[slot] = [None] * length
    for slot, grad, shape in zip(grad_slots, grads, shapes, strict=True):
        out[slot] = input_grad(grad, shape)
    return tuple(out)
