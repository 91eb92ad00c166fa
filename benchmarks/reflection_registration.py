"""Baseline of figure 2: registering the Linear ops by reflection at import.

What a runtime-reflection library does at import instead of importing generated code:
resolve the bundles' annotations (``typing.get_type_hints``), derive the schemas and
slot plans from them (:mod:`benchmarks.reflection_plan`), and define the same custom
ops (namespace ``teops_reflect``) with real and fake kernels, autograd and the
quantized-subclass dispatch rule, through the same ``runtime.custom_ops`` helpers the
generated module uses. Importing this module is what figure 2 times.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from transformer_engine_ops.ops.linear import LINEAR
from transformer_engine_ops.runtime import custom_ops as _r
from transformer_engine_ops.runtime.custom_ops import (
    _flat_value,
    _shape_of,
    decode_none,
)
from transformer_engine_ops.runtime.tensor_spec import TensorSpec

from .reflection_plan import TENSOR, TENSOR_OR_QUANTIZED, Plan

NAMESPACE = "teops_reflect"


# --- the glue of a ``torch.library.custom_op`` registration ------------------------
# What the generated modules did before the lean registration (runtime/custom_ops.py's
# ``define_op``/``register_autograd``): kept here, as the baseline's own glue.


def pack_result(outputs: Sequence[Any], saved: Sequence[Any]) -> list[torch.Tensor]:
    """A forward's (outputs, saved) as one flat list: quantized values as inner buffers."""
    device = _device_of([*outputs, *saved])
    return [t for v in (*outputs, *saved) for t in _flat_value(v, device)]


def _device_of(values: Sequence[Any]) -> torch.device | None:
    return next((v.device for v in values if v is not None), None)


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


def define(qualname: str, schema: str, kernel: Callable[..., Any], fake: Callable[..., Any]) -> Any:
    """A custom op through ``torch.library.custom_op`` with its fake kernel, never
    dead-code eliminated (the registration a reflection library would do)."""
    op = torch.library.custom_op(qualname, kernel, mutates_args=(), schema=schema)
    op.register_fake(fake)
    torch.fx.node.has_side_effect(op._opoverload)
    return op


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


def _tensor_fields(plan: Plan) -> tuple[str, ...]:
    return tuple(e.name for e in plan.entries if e.kind in (TENSOR, TENSOR_OR_QUANTIZED))


def _offsets(plan: Plan) -> tuple[dict[str, int], tuple[int, ...]]:
    index, tq, offset = {}, [], 0
    for e in plan.entries:
        if e.kind in (TENSOR, TENSOR_OR_QUANTIZED):
            index[e.name] = offset
        if e.kind == TENSOR_OR_QUANTIZED:
            tq.append(offset)
        offset += len(e.slots)
    return index, tuple(tq)


def register(decl: Any = LINEAR, namespace: str = NAMESPACE) -> tuple[Any, Any]:
    """Define ``<namespace>::<name>_fwd/_bwd`` for ``decl`` by reflection; returns the ops."""
    fwd_plan, bwd_plan = Plan(decl.forward), Plan(decl.backward)
    fwd_tensors, bwd_tensors = _tensor_fields(fwd_plan), _tensor_fields(bwd_plan)
    index, fwd_tq = _offsets(fwd_plan)
    _, bwd_tq = _offsets(bwd_plan)
    grad_slots = tuple(index[n] for n in decl.grad_fields)
    n_fwd = len(fwd_plan.slot_names)
    grad_outputs_slot = bwd_plan.slot_names.index("grad_outputs")

    def spec_args(plan: Plan, names: tuple[str, ...], slots: tuple[Any, ...]) -> Any:
        args = plan.unflatten(*slots)
        for name in names:
            value = getattr(args, name)
            setattr(args, name, _r.specs(value) if isinstance(value, list) else _r.spec(value))
        return args

    def forward_kernel(*slots: Any) -> list[torch.Tensor]:
        outputs, saved = decl.forward_impl(fwd_plan.unflatten(*slots))
        return pack_result(outputs, saved)

    def forward_fake(*slots: Any) -> list[torch.Tensor]:
        outputs, saved = decl.forward_spec(spec_args(fwd_plan, fwd_tensors, slots))
        return _r.fake_result(outputs, saved, _r.first_device(slots))

    def backward_kernel(*slots: Any) -> list[torch.Tensor]:
        grads = decl.backward_impl(bwd_plan.unflatten(*slots))
        return _r.pack_grads(grads, _r.first_device(slots))

    def backward_fake(*slots: Any) -> list[torch.Tensor]:
        grads = decl.backward_spec(spec_args(bwd_plan, bwd_tensors, slots))
        return _r.fake_grads(grads, _r.first_device(slots))

    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: list[torch.Tensor]) -> None:
        out_specs, saved_specs = decl.forward_spec(spec_args(fwd_plan, fwd_tensors, inputs))
        outputs, saved = split_result(out_specs, saved_specs, output)
        backward = decl.backward_args(fwd_plan.unflatten(*inputs), tuple(outputs), tuple(saved))
        save_backward_slots(ctx, bwd_plan.flatten(backward))
        ctx.out_specs = out_specs
        ctx.grad_layout = grad_layout(inputs, grad_slots)

    def backward(ctx: Any, flat_grads: list[torch.Tensor]) -> tuple[Any, ...]:
        slots = load_backward_slots(ctx)
        slots[grad_outputs_slot] = output_grads(ctx.out_specs, flat_grads)
        grads = bwd_op(*slots)
        return input_grads(n_fwd, grad_slots, grads, ctx.grad_layout)

    schema_out = " -> Tensor[]"
    fwd_op = define(
        f"{namespace}::{decl.name}_fwd", fwd_plan.schema + schema_out, forward_kernel, forward_fake
    )
    bwd_op = define(
        f"{namespace}::{decl.name}_bwd",
        bwd_plan.schema + schema_out,
        backward_kernel,
        backward_fake,
    )
    if fwd_op is not None:
        fwd_op.register_autograd(backward, setup_context=setup_context)
    _r.register_quantized_dispatch(fwd_op, fwd_tq)
    _r.register_quantized_dispatch(bwd_op, bwd_tq)
    return fwd_op, bwd_op


linear_fwd, linear_bwd = register()
