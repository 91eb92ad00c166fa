"""Baseline of figure 2: registering the Linear ops by reflection at import.

What a runtime-reflection library does at import instead of importing generated code:
resolve the bundles' annotations (``typing.get_type_hints``), derive the schemas and
slot plans from them (:mod:`benchmarks.reflection_plan`), and define the same custom
ops (namespace ``teops_reflect``) with real and fake kernels, autograd and the
quantized-subclass dispatch rule, through the same ``runtime.custom_ops`` helpers the
generated module uses. Importing this module is what figure 2 times.
"""

from __future__ import annotations

from typing import Any

import torch

from transformer_engine_ops.ops.linear import LINEAR
from transformer_engine_ops.runtime import custom_ops as _r

from .reflection_plan import TENSOR, TENSOR_OR_QUANTIZED, Plan

NAMESPACE = "teops_reflect"


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
        return _r.pack_result(outputs, saved)

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
        _, saved = _r.split_result(out_specs, saved_specs, output)
        backward = decl.setup_context(fwd_plan.unflatten(*inputs), tuple(saved))
        _r.save_backward_slots(ctx, bwd_plan.flatten(backward))
        ctx.out_specs = out_specs
        ctx.grad_layout = _r.grad_layout(inputs, grad_slots)

    def backward(ctx: Any, flat_grads: list[torch.Tensor]) -> tuple[Any, ...]:
        slots = _r.load_backward_slots(ctx)
        slots[grad_outputs_slot] = _r.output_grads(ctx.out_specs, flat_grads)
        grads = bwd_op(*slots)
        return _r.input_grads(n_fwd, grad_slots, grads, ctx.grad_layout)

    schema_out = " -> Tensor[]"
    fwd_op = _r.define(
        f"{namespace}::{decl.name}_fwd", fwd_plan.schema + schema_out, forward_kernel, forward_fake
    )
    bwd_op = _r.define(
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
