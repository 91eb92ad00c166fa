"""The op declaration: the one statement per op that the generator reads.

An op module (``transformer_engine_ops/ops/*.py``) states, next to its argument
bundles, which bundles form the forward and backward op, which forward fields
receive gradients, and which hand-written functions implement it. ``codegen``
reads the call statically (every argument must be a literal or a bare name);
at run time the object is an inert record that documentation and tests may read.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

# The backward field that receives the outputs' gradients (one of them per bundle): the
# generated code fills it at backward time, so neither a copy nor setup_context's.
GRAD_RECEIVERS = ("grad_outputs", "grad_output")


@dataclass(frozen=True)
class OpDeclaration:
    """A forward/backward custom-op pair over two argument bundles.

    ``name`` becomes ``<namespace>::<name>_fwd`` and ``<name>_bwd``.
    ``grad_fields`` names the forward-bundle tensor fields whose gradients the
    backward op returns, in the order the backward returns them. ``lowers=True`` lets
    every Inductor compile trace the impls in place of the ops (``runtime/lowering.py``):
    declare it once the impls mark, with ``lowering.exact``, every piece Inductor would
    compute differently from eager (reductions, fused activations, bias GEMMs), and
    declare example bundles with ``lowering.examples`` (``tests/runtime/lowering_check.py``
    checks the lowering on them, bit for bit).

    ``eager_when``: why a compiled call runs eagerly, as ``(condition, reason)`` pairs;
    a condition joins forward fields with `` and ``, each truthy or, written
    ``quantized(field)``, holding a quantized value. The generated
    ``<name>_compile_blocker`` tests them in order (after the op's registration and its
    quantizers). ``plain_call``: a function of the forward bundle that serves a plain
    eager call more cheaply than the generic path, returning its outputs (None where it
    does not serve the call); ``call_<name>`` tries it first. ``cudagraph_unsafe``:
    why a CUDA graph must not capture the op (a kernel that reads tensor values on the
    host, which a graph replay would freeze at their captured values); Inductor then
    runs the op outside its CUDA graphs (``torch.Tag.cudagraph_unsafe``).

    ``setup_context(args, outputs, saved)`` returns a ``dict`` of the backward fields
    that are not copies: a backward field whose forward field has the same name and
    annotation is copied from ``args`` by the generated code (``copied_fields``), unless
    ``derived`` names it (a value setup_context computes although a forward field has
    its name and type); the gradient receiver is filled at backward time. An op whose
    backward fields are all copies declares no ``setup_context``; its ``forward_impl``
    then saves nothing (an empty ``saved``, checked on each call).
    ``backward_args`` builds the whole backward bundle as the generated code does.
    """

    name: str
    forward: type
    backward: type
    grad_fields: tuple[str, ...]
    forward_impl: Callable[..., Any] | None = None
    backward_impl: Callable[..., Any] | None = None
    forward_spec: Callable[..., Any] | None = None
    backward_spec: Callable[..., Any] | None = None
    setup_context: Callable[..., Any] | None = None
    lowers: bool = False
    eager_when: tuple[tuple[str, str], ...] = ()
    plain_call: Callable[..., Any] | None = None
    cudagraph_unsafe: str | None = None
    derived: tuple[str, ...] = ()

    @functools.cached_property
    def copied_fields(self) -> tuple[str, ...]:
        """The backward fields the generated code copies from the forward bundle."""
        return copied_fields(self.forward, self.backward, self.derived)

    @functools.cached_property
    def made_fields(self) -> frozenset[str]:
        """The backward fields ``setup_context`` returns."""
        skip = {*self.copied_fields, *GRAD_RECEIVERS}
        return frozenset(f.name for f in dataclasses.fields(self.backward) if f.name not in skip)

    def backward_args(self, args: Any, outputs: tuple[Any, ...], saved: tuple[Any, ...]) -> Any:
        """The backward bundle of one forward call, as the generated code builds it: the
        copied forward fields, an empty gradient receiver and what ``setup_context``
        returns (checked). For op impls that run another op's backward inside their own."""
        if self.setup_context is None:
            if self.made_fields:
                raise TypeError(
                    f"op `{self.name}` declares no setup_context, but {self.backward.__name__} "
                    f"has fields that are not copies: {', '.join(sorted(self.made_fields))}"
                )
            check_nothing_saved(saved, self.name)
            made = {}
        else:
            made = self.setup_context(args, outputs, saved)
            check_setup_context(
                made,
                self.made_fields,
                self.copied_fields,
                self.backward.__name__,
                self.setup_context.__name__,
            )
        receiver = {
            f.name: [] if f.name == "grad_outputs" else None
            for f in dataclasses.fields(self.backward)
            if f.name in GRAD_RECEIVERS
        }
        copies = {name: getattr(args, name) for name in self.copied_fields}
        return self.backward(**receiver, **copies, **made)


def _annotation(value: Any) -> Any:
    # Under ``from __future__ import annotations`` the source text, as Python unparses it.
    return "".join(value.split()) if isinstance(value, str) else value


def copied_fields(forward: type, backward: type, derived: Collection[str] = ()) -> tuple[str, ...]:
    """The fields of ``backward`` whose ``forward`` field has the same name and
    annotation, in ``backward``'s order, less the ``derived`` ones and the gradient
    receiver. The generator applies the same rule to the source text."""
    types = {f.name: _annotation(f.type) for f in dataclasses.fields(forward)}
    return tuple(
        f.name
        for f in dataclasses.fields(backward)
        if f.name in types
        and f.name not in derived
        and f.name not in GRAD_RECEIVERS
        and types[f.name] == _annotation(f.type)
    )


def check_nothing_saved(saved: Any, op: str) -> None:
    """Raise unless ``saved`` is empty: an op without ``setup_context`` has nowhere to put
    what its forward saved for the backward."""
    if len(saved):
        raise TypeError(
            f"op `{op}`: its forward_impl saved {len(saved)} value(s), but the declaration has "
            "no setup_context to put them in the backward bundle; return an empty saved "
            "tuple, or declare a setup_context"
        )


def check_setup_context(
    made: Any,
    expected: frozenset[str],
    copied: Collection[str],
    bundle: str,
    function: str,
) -> None:
    """Raise unless ``made`` (what ``function`` returned) is a dict of exactly the
    ``expected`` fields of the backward bundle ``bundle``."""
    if made.__class__ is dict and made.keys() == expected:
        return
    if not isinstance(made, dict):
        raise TypeError(
            f"{function} returned {type(made).__name__}, not a dict: return "
            f"dict(field=value, ...) of the {bundle} fields the generated code does not copy "
            f"({', '.join(sorted(expected)) or 'none'})"
        )
    for name in made:
        if name in copied:
            raise TypeError(
                f"{bundle}.{name}: {function} returned it, but the generated code copies it "
                "from the forward field of the same name and type; drop it from the dict, or "
                "name it in the declaration's `derived` to compute it"
            )
        if name not in expected:
            raise TypeError(
                f"{bundle}.{name}: {function} returned it, but {bundle} has no such field "
                "that setup_context fills"
            )
    missing = sorted(expected - made.keys())
    if not missing:
        return  # a dict subclass holding exactly the expected fields
    raise TypeError(
        f"{bundle}.{missing[0]}: {function} returned no value for it (it is not copied: the "
        "forward bundle has no field of this name and type)"
        + (f"; also missing: {', '.join(missing[1:])}" if len(missing) > 1 else "")
    )
