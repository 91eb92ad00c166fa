"""Opt-in: Inductor compiles an op call as its own code instead of calling the op.

By default a compiled graph calls each op as one opaque node, so every call pays the
dispatcher and the op's Python kernel on the host, and Inductor cannot fuse across it;
on small shapes that host cost is the step. ``inductor_backend()`` gives Inductor a
decomposition of each op that traces the op's own kernel into the graph in place of
the node, for a call it can trace to eager's bits: no process group (collectives need
the op), no integer tensor (GroupedLinear's ``m_splits`` is read on the host, a
data-dependent size), and every quantizer the call names or carries computing eager's
bits when traced on its device (``Quantizer.lowers_bitwise_on``: FP8 current scaling
on CUDA, whose fused quantize is then recorded as one op running the same kernels;
block formats trace reference ops Inductor would fuse into other bits). Any other call
declines and keeps its node. The graph Dynamo captures still holds the ops (schemas,
guards and SCHEMAS.md are unchanged); only Inductor's graph differs.

A lowered call stays bitwise equal to eager: what Inductor would compute differently
(a reduction in its own order, a fused and FMA-contracted activation, an addmm split
into a GEMM and a rounded bias add) is marked in the kernels with :func:`exact` and
recorded whole, and the backend keeps eager's 16-bit roundings between fused pointwise
ops (``emulate_precision_casts``). AOTAutograd's cache does not key on the
decomposition table, so the backend bypasses that cache (Inductor's own FX graph cache
keys on the already-decomposed graph).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from typing import Any

from . import codec
from .boundary import SlotRow, decode_meta, first_device

# op -> its decomposition (registered by define_op for every generated op)
_DECOMPOSITIONS: dict[Any, Callable[..., Any]] = {}

# Slot kinds whose values must be None for a call to lower.
_GROUP_KINDS = frozenset(("process group",))
_QUANTIZER_KINDS = frozenset(("quantizer",))
_QUANTIZER_LIST_KINDS = frozenset(("quantizer list",))
# A tensor-or-quantized group describes each value in its ``str`` (``str[]``) slot.
_QUANTIZABLE_KINDS = frozenset(("tensor-or-quantized", "tensor-or-quantized list"))
# Plain tensor slots: each must hold floating-point tensors (or None).
_TENSOR_KINDS = frozenset(("tensor", "tensor list"))


def _floating(value: Any) -> bool:
    if value is None:
        return True
    if isinstance(value, list):
        return all(t is None or t.is_floating_point() for t in value)
    return value.is_floating_point()


class Lowerable:
    """Whether an op call may be traced into Inductor's graph, by the op's slot table:
    no process group, no integer tensor, and every quantizer (those in its slots and
    those of the quantized values it carries) computing eager's bits when traced on the
    call's device (``Quantizer.lowers_bitwise_on``)."""

    def __init__(self, rows: Sequence[SlotRow]) -> None:
        def where(kinds: frozenset[str], types: tuple[str, ...] = ()) -> tuple[int, ...]:
            return tuple(
                i for i, r in enumerate(rows) if r.kind in kinds and (not types or r.type in types)
            )

        self.groups = where(_GROUP_KINDS)
        self.quantizers = where(_QUANTIZER_KINDS)
        self.quantizer_lists = where(_QUANTIZER_LIST_KINDS)
        self.metas = where(_QUANTIZABLE_KINDS, ("str", "str[]"))
        self.floating = where(_TENSOR_KINDS)

    def __call__(self, slots: Sequence[Any]) -> bool:
        if any(slots[i] is not None for i in self.groups):
            return False
        if not all(_floating(slots[i]) for i in self.floating):
            return False
        quantizers = [codec.decode(slots[i]) for i in self.quantizers if slots[i] is not None]
        for i in self.quantizer_lists:
            quantizers += [codec.decode(q) for q in slots[i] or () if q is not None]
        for i in self.metas:
            for code in slots[i] if isinstance(slots[i], list) else (slots[i],):
                meta = decode_meta(code)
                if meta.tag not in ("tensor", "none"):
                    quantizers.append(dict(meta.context).get("quantizer"))
        if not quantizers:
            return True
        device = first_device(slots)
        return all(q is not None and q.lowers_bitwise_on(device) for q in quantizers)


class _Tracing(threading.local):
    depth = 0
    keep_exact = True  # False while an ``inductor_backend(bitwise=False)`` compiles


_TRACING = _Tracing()


def tracing() -> bool:
    """Whether this thread is tracing an op's kernel into Inductor's graph (a quantizer
    then records its fused kernels as one op, not its reference ops)."""
    return _TRACING.depth > 0


# --- pieces of a kernel that keep eager's bits in a lowered graph ---------------------
# What Inductor traces it regenerates: its own reduction order for a sum or a mean, a
# pointwise chain fused (and FMA-contracted) into one kernel, an addmm split into a GEMM
# and a separately rounded bias add. A kernel marks each such piece with ``exact``; while
# a call is traced for Inductor, the piece is recorded as one op of ``teops_exact`` that
# runs the same function, which Inductor calls as it is (a fallback). Everything else a
# kernel does (GEMMs through ATen, casts, views, plain pointwise arithmetic) Inductor
# reproduces bit for bit (with ``emulate_precision_casts``, which the backend sets).

_EXACT_NAMESPACE = "teops_exact"
_EXACT: dict[str, tuple[str, Callable[..., Any]]] = {}  # name -> (schema, function)
_EXACT_OPS: dict[str, Any] = {}  # name -> its op, defined on first trace
_EXACT_LOCK = threading.Lock()


def exact(schema: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Mark a piece of a kernel Inductor must not regenerate: ``schema`` names it and
    types its arguments, under the function's own parameter names
    (``"bias_grad(Tensor dy, ScalarType dtype) -> Tensor"``); the function is pure and
    returns fresh tensors (never an input or a view of one).
    Eagerly the piece is called as it is; traced for Inductor it is recorded as the op
    ``teops_exact::<name>`` running the same function (its fake: the function itself, on
    fake tensors)."""
    name = schema.split("(", 1)[0]

    def mark(fn: Callable[..., Any]) -> Callable[..., Any]:
        if name in _EXACT:
            raise ValueError(f"exact: two pieces named {name!r}")
        _EXACT[name] = (schema, fn)

        @functools.wraps(fn)
        def piece(*args: Any, **kwargs: Any) -> Any:
            if _TRACING.depth == 0 or not _TRACING.keep_exact:
                return fn(*args, **kwargs)
            return exact_op(name)(*args, **kwargs)

        return piece

    return mark


def exact_op(name: str) -> Any:
    """The op ``teops_exact::<name>`` of the piece ``name`` (defined on first use: only
    a lowered trace records it, and a program that never lowers never defines it)."""
    op = _EXACT_OPS.get(name)
    if op is not None:
        return op
    import torch

    from .custom_ops import op_library  # custom_ops imports this module

    with _EXACT_LOCK:
        if name not in _EXACT_OPS:
            schema, fn = _EXACT[name]
            lib = op_library(_EXACT_NAMESPACE)
            lib.define(schema)
            # No autograd layer: the piece runs inside an op call autograd has already
            # differentiated, so Inductor's call of it costs one dispatch.
            lib.impl(name, fn, "CompositeExplicitAutograd")
            torch.library.register_fake(f"{_EXACT_NAMESPACE}::{name}", fn, lib=lib)
            _EXACT_OPS[name] = getattr(getattr(torch.ops, _EXACT_NAMESPACE), name).default
        return _EXACT_OPS[name]


def exact_pieces() -> tuple[str, ...]:
    """The names of every piece marked with :func:`exact` (those imported so far)."""
    return tuple(_EXACT)


def register(op: Any, kernel: Callable[..., Any], rows: Sequence[SlotRow]) -> None:
    """Let :func:`inductor_backend` trace ``kernel`` in place of ``op`` for lowerable calls."""
    lowerable = Lowerable(rows)

    def decomposition(*slots: Any) -> Any:
        if not lowerable(slots):
            return NotImplemented  # keep the op node
        _TRACING.depth += 1
        try:
            return kernel(*slots)
        finally:
            _TRACING.depth -= 1

    decomposition.__name__ = f"lower_{op._schema.name.replace('::', '_')}"
    _DECOMPOSITIONS[op] = decomposition


def decompositions() -> dict[Any, Callable[..., Any]]:
    """The registered op decompositions (a copy)."""
    return dict(_DECOMPOSITIONS)


def inductor_backend(
    mode: str | None = None, options: dict[str, Any] | None = None, *, bitwise: bool = True
) -> Callable[..., Any]:
    """A ``torch.compile`` backend: Inductor, with the op calls that trace to eager's bits
    lowered into its graph (the module docstring says which).

    ``torch.compile(model, fullgraph=True, backend=inductor_backend(mode="reduce-overhead"))``;
    ``mode`` and ``options`` mean what they mean to ``torch.compile``'s Inductor.
    ``bitwise=False`` lets Inductor regenerate the :func:`exact` pieces of plain calls
    too (fusing a bias gradient's sum into the activation's backward, say), and round
    as it likes between fused ops: a little faster on small shapes, and equal to eager
    to rounding only, as ``torch.nn.Linear`` compiled is to its eager. FP8 calls record
    their fused quantize either way.
    """
    import torch
    import torch._functorch.config as functorch_config
    from torch._inductor import list_mode_options
    from torch._inductor.compile_fx import compile_fx
    from torch._inductor.decomposition import select_decomp_table

    # Inductor elides a 16-bit round trip between fused pointwise ops unless told to
    # keep it; eager rounds there.
    patches = {
        **({"emulate_precision_casts": True} if bitwise else {}),
        **list_mode_options(mode or "default"),
        **(options or {}),
    }

    def backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
        _register_fallbacks()
        table = {**select_decomp_table(), **_DECOMPOSITIONS}
        keep_exact = _TRACING.keep_exact
        _TRACING.keep_exact = bitwise  # read by the pieces as the decompositions trace
        try:
            with functorch_config.patch(enable_autograd_cache=False):
                return compile_fx(gm, example_inputs, config_patches=patches, decompositions=table)
        finally:
            _TRACING.keep_exact = keep_exact

    backend.__name__ = "teops_inductor" if bitwise else "teops_inductor_rounding"
    return backend


def _register_fallbacks() -> None:
    """A declined call keeps its op node, and Inductor refuses to make its implicit
    fallback for an op its decomposition table holds. So each op gets, up front, the
    fallback Inductor would make for it implicitly (the layout constraint of its tags),
    marked as overriding the decomposition; the default backend finds the same one."""
    from torch._inductor import lowering as inductor_lowering
    from torch._library.utils import get_layout_constraint_tag

    for op in _DECOMPOSITIONS:
        if op not in inductor_lowering.lowerings:
            tag = get_layout_constraint_tag(op, with_default=True)
            inductor_lowering.make_fallback(
                op,
                layout_constraint=inductor_lowering.tag_to_layout_constraint(tag),
                warn=False,
                override_decomp=True,
            )
