"""Whether an op declared ``lowers=True`` computes eager's bits once Inductor lowers it.

Marking every piece of a kernel Inductor would compute its own way (``lowering.exact``)
is the kernel author's job, and nothing reads a kernel to see that it did: a reduction
left unmarked drifts by an ulp in a compiled model and no error says so. So every op
declared ``lowers=True`` declares example bundles next to it (``lowering.examples``),
and :func:`check` compiles the op's call on them with Inductor's default lowering,
forward and backward, for every recipe the op takes, and compares each output and
gradient with eager's, bit for bit. ``tests/runtime/test_lowering_check.py`` runs it on
every op lowered by default, so a new op module is checked without a test of its own.
"""

from __future__ import annotations

import dataclasses
import importlib
import typing
from collections.abc import Callable, Sequence
from typing import Any

import torch

from tests.bundles import fields_by_name
from transformer_engine_ops.runtime import _torch_private as _private
from transformer_engine_ops.runtime import lowering


def recipes() -> tuple[tuple[str, Callable[[], Any] | None], ...]:
    """``(name, factory)`` of every recipe an op may take, each with its defaults; None
    for no recipe."""
    from transformer_engine_ops.quantization import recipes as r

    return (
        ("no recipe", None),
        ("DelayedScaling", r.DelayedScaling),
        ("Float8CurrentScaling", r.Float8CurrentScaling),
        ("Float8BlockScaling", r.Float8BlockScaling),
        ("MXFP8BlockScaling", r.MXFP8BlockScaling),
        ("NVFP4BlockScaling", r.NVFP4BlockScaling),
    )


def forward_bundle(generated: Any) -> type:
    """The forward bundle class of a generated op module (its ``<op>_eager``'s argument)."""
    name = generated.FORWARD_OP.split("::")[1].removesuffix("_fwd")
    return typing.get_type_hints(getattr(generated, f"{name}_eager"))["args"]


def check(
    module_name: str,
    *,
    device: str | torch.device = "cpu",
    recipe_factories: Sequence[tuple[str, Callable[[], Any] | None]] | None = None,
) -> list[str]:
    """What differs between eager and Inductor's default lowering of the op of the
    generated module ``module_name``, on its example bundles (empty: bitwise equal).

    For each recipe (:func:`recipes` by default) the op's example hook gives bundles
    (twice: eager and compiled runs each consume their own, delayed scaling's state
    included); one function calling the op on each is compiled (``fullgraph``, past the
    graph caches) and run forward and backward with the same output gradients as
    eager. Also reported: no example hook, and an op neither of whose calls lowered on
    any example (the check would have compared op nodes, not the lowering). Each compile
    starts with ``torch.compiler.reset()``: run the check apart from compiled models."""
    g = importlib.import_module(module_name)
    forward = forward_bundle(g)
    hook = lowering.examples_of(forward)
    if hook is None:
        return [
            f"{g.FORWARD_OP}: declared lowers=True, but its op module declares no example "
            f"bundles (@lowering.examples({forward.__name__}) on a function (recipe, device) "
            "-> bundles): its lowering cannot be checked"
        ]
    eager_call, compiled_call = _calling_functions(g)
    problems: list[str] = []
    lowered: set[str] = set()
    for name, factory in recipe_factories if recipe_factories is not None else recipes():
        eager = hook(factory() if factory else None, torch.device(device))
        compiled = hook(factory() if factory else None, torch.device(device))
        if not eager:
            continue
        where = f"{g.FORWARD_OP} ({name})"
        try:
            expected = _run(eager_call, eager, compile_=False)
            with _private.graph_caches_off(), lowering.recording() as traced:
                torch.compiler.reset()
                got = _run(compiled_call, compiled, compile_=True)
        except Exception as exc:  # noqa: BLE001 - reported with the op and recipe
            first_line = (str(exc).splitlines() or [""])[0]
            problems.append(f"{where}: failed: {type(exc).__name__}: {first_line}")
            continue
        lowered |= set(traced)
        problems += _differences(where, expected, got)
    for op in (g.FORWARD_OP, g.BACKWARD_OP):
        if op not in lowered:
            problems.append(
                f"{op}: no example call was lowered (each kept its op node): the examples "
                "check nothing of the lowering; give one that lowers (no recipe, floating "
                "tensors, no process group)"
            )
    return problems


def _calling_functions(g: Any) -> tuple[Callable[[Any], Any], Callable[[Any], Any]]:
    """``call_<op>`` (eager's bits) and ``<op>_compiled`` (the op call itself, past
    ``call_<op>``'s compile blockers: a recipe a module runs eagerly under compile, such
    as delayed scaling, still has its lowering checked)."""
    (name,) = (n for n in vars(g) if n.startswith("call_"))
    op = name.removeprefix("call_")
    entry, compiled, slots = (
        getattr(g, name),
        getattr(g, f"{op}_compiled"),
        g.__dict__[f"{op}_fwd_slots"],
    )

    def eager_call(args: Any) -> Any:
        return entry(**fields_by_name(args))

    def compiled_call(args: Any) -> Any:
        return compiled(slots(**fields_by_name(args)))[0]

    return eager_call, compiled_call


def _tensor_fields(bundle: Any) -> list[str]:
    return [
        f.name
        for f in dataclasses.fields(bundle)
        if isinstance(getattr(bundle, f.name), torch.Tensor)
    ]


def _run(
    call: Callable[[Any], Any], bundles: Sequence[Any], *, compile_: bool
) -> list[tuple[str, Any]]:
    """``(what, value)``: the outputs of the op on the bundles, in order, then the
    gradient of every tensor field that requires grad, after a backward from fixed
    output gradients."""
    names = [_tensor_fields(b) for b in bundles]
    fields = [(j, n) for j, ns in enumerate(names) for n in ns]
    tensors = [getattr(bundles[j], n) for j, n in fields]

    def calls(*flat: torch.Tensor) -> list[Any]:
        rest = iter(flat)
        outs: list[Any] = []
        for bundle, ns in zip(bundles, names, strict=True):
            outs.extend(call(dataclasses.replace(bundle, **{n: next(rest) for n in ns})))
        return outs

    runner = torch.compile(calls, fullgraph=True, backend="inductor") if compile_ else calls
    outs = runner(*tensors)
    differentiable = [o for o in outs if isinstance(o, torch.Tensor) and o.requires_grad]
    leaves = [
        (f"gradient of example {j}'s {n}", t) for (j, n), t in zip(fields, tensors, strict=True)
    ]
    leaves = [(what, t) for what, t in leaves if t.requires_grad]
    if differentiable and leaves:
        gen = torch.Generator().manual_seed(0)
        cotangents = [
            torch.randn(o.shape, generator=gen, dtype=torch.float32).to(o.device, o.dtype)
            for o in differentiable
        ]
        torch.autograd.backward(differentiable, cotangents)
    results = [
        (f"output {i}", o.detach() if isinstance(o, torch.Tensor) else o)
        for i, o in enumerate(outs)
    ]
    return results + [(what, t.grad) for what, t in leaves]


def _differences(
    where: str, expected: Sequence[tuple[str, Any]], got: Sequence[tuple[str, Any]]
) -> list[str]:
    if [w for w, _ in expected] != [w for w, _ in got]:
        return [f"{where}: compiled gives {[w for w, _ in got]}, eager {[w for w, _ in expected]}"]
    problems = []
    for (what, a), (_, b) in zip(expected, got, strict=True):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            if not (a is None and b is None):
                problems.append(
                    f"{where}: {what}: eager {type(a).__name__}, compiled {type(b).__name__} "
                    "(the check compares plain tensors: give examples with plain outputs)"
                )
        elif a.dtype != b.dtype or a.shape != b.shape:
            problems.append(
                f"{where}: {what}: eager {a.dtype}{tuple(a.shape)}, compiled "
                f"{b.dtype}{tuple(b.shape)}"
            )
        elif not torch.equal(_bits(a), _bits(b)):
            drift = (a.double() - b.double()).abs().max().item()
            problems.append(
                f"{where}: {what} ({a.dtype}{tuple(a.shape)}) is not eager's bits, up to "
                f"{drift:.3g} apart: a reduction or activation Inductor recomputed its own "
                "way? (mark it with lowering.exact)"
            )
    return problems


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().reshape(-1).contiguous().view(torch.uint8)
