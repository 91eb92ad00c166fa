"""The op declaration: the one statement per op that the generator reads.

An op module (``transformer_engine_ops/ops/*.py``) states, next to its argument
bundles, which bundles form the forward and backward op, which forward fields
receive gradients, and which hand-written functions implement it. ``codegen``
reads the call statically (every argument must be a literal or a bare name);
at run time the object is an inert record that documentation and tests may read.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


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
