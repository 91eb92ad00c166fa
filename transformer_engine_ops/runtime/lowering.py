"""Inductor compiles an op call as its own code instead of calling the op.

Left as one opaque node, an op call pays the dispatcher and its Python kernel on the
host, and Inductor cannot fuse across it; on small shapes that host cost is the step.
So every Inductor compile (a plain ``torch.compile(model)``) traces the kernel of an
op whose declaration says ``lowers=True`` into its graph in place of the node, for a
call it can trace to eager's bits: no process group (collectives need the op), no
integer tensor (GroupedLinear's ``m_splits`` is read on the host, a data-dependent
size), and every quantizer the call names or carries computing eager's bits when
traced on its device (``Quantizer.lowers_bitwise_on``: FP8 current and block scaling
on CUDA, whose fused quantizes are then recorded as one op running the same kernels;
the other formats would trace reference ops Inductor fuses into other bits). Any other call
declines and keeps its node. The graph Dynamo captures still holds the ops (schemas,
guards and SCHEMAS.md are unchanged); only Inductor's graph differs.

A lowered call stays bitwise equal to eager: what Inductor would compute differently
(a reduction in its own order, a fused and FMA-contracted activation, an addmm split
into a GEMM and a rounded bias add) is marked in the kernels with :func:`exact` and
recorded whole; a 16-bit input is widened inside the piece that reads it, so no cast
pair is left for Inductor to fold. An op module that has not marked its pieces so
leaves ``lowers`` unset and keeps its node.

The decompositions enter Inductor's table once Inductor is imported (importing this
package imports no Inductor). Inductor's caches key on the graph Dynamo captured, not
on the code a decomposition traces, so each compile also puts a fingerprint of the
lowered kernels' source into ``torch.compiler.config.cache_key_tag``: a changed kernel
misses the cache instead of reusing a graph traced from the old one.
:func:`inductor_backend` picks another lowering for one compile.
"""

from __future__ import annotations

import contextlib
import functools
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from . import _torch_private as _private
from . import codec, source_digest
from .boundary import SlotRow, decode_meta, first_device
from .library import op_library

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
    keep_exact = True  # False while an ``inductor_backend(lowering="rounding")`` compiles
    traced: list[str] | None = None  # the ops lowered while :func:`recording` runs


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
# reproduces bit for bit, as long as a 16-bit input is widened inside the piece that
# reads it (Inductor folds a narrowing cast followed by a widening one).

_EXACT_NAMESPACE = "teops_exact"
# op name -> (its schema, the function); op names are scoped by the marking module
_EXACT: dict[str, tuple[str, Callable[..., Any]]] = {}
_EXACT_OPS: dict[str, Any] = {}  # op name -> its op, defined when the lowering joins Inductor
_EXACT_LOCK = threading.Lock()


def exact_op_name(module: str, name: str) -> str:
    """The op name of the piece ``name`` marked in ``module``: scoped by the module, so
    two op modules may each mark a piece of the same name."""
    return f"{name}__{module.replace('.', '_')}"


def exact(schema: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Mark a piece of a kernel Inductor must not regenerate: ``schema`` names it and
    types its arguments, under the function's own parameter names
    (``"bias_grad(Tensor dy, ScalarType dtype) -> Tensor"``); the function is pure and
    returns fresh tensors (never an input or a view of one).
    Eagerly the piece is called as it is; traced for Inductor it is recorded as the op
    ``teops_exact::<name>__<module>`` (:func:`exact_op_name`) running the same function
    (its fake: the function itself, on fake tensors). Names are per module: one module
    cannot mark two pieces of one name, two modules can."""
    name, signature = schema.split("(", 1)

    def mark(fn: Callable[..., Any]) -> Callable[..., Any]:
        op_name = exact_op_name(fn.__module__, name)
        if op_name in _EXACT:
            raise ValueError(f"exact: two pieces named {name!r} in {fn.__module__}")
        _EXACT[op_name] = (f"{op_name}({signature}", fn)

        @functools.wraps(fn)
        def piece(*args: Any, **kwargs: Any) -> Any:
            if _TRACING.depth == 0 or not _TRACING.keep_exact:
                return fn(*args, **kwargs)
            return exact_op(op_name)(*args, **kwargs)

        records(functools.partial(exact_op, op_name))
        return piece

    return mark


def exact_op(op_name: str) -> Any:
    """The op ``teops_exact::<op_name>`` of a marked piece (defined when the lowering
    joins Inductor, see :func:`records`)."""
    op = _EXACT_OPS.get(op_name)
    if op is not None:
        return op
    import torch

    with _EXACT_LOCK:
        if op_name not in _EXACT_OPS:
            schema, fn = _EXACT[op_name]
            lib = op_library(_EXACT_NAMESPACE)
            lib.define(schema)
            # No autograd layer: the piece runs inside an op call autograd has already
            # differentiated, so Inductor's call of it costs one dispatch.
            lib.impl(op_name, fn, "CompositeExplicitAutograd")
            torch.library.register_fake(f"{_EXACT_NAMESPACE}::{op_name}", fn, lib=lib)
            _EXACT_OPS[op_name] = getattr(getattr(torch.ops, _EXACT_NAMESPACE), op_name).default
        return _EXACT_OPS[op_name]


def exact_pieces() -> dict[str, tuple[str, Callable[..., Any]]]:
    """Every piece marked with :func:`exact` so far: op name -> (schema, function)."""
    return dict(_EXACT)


@contextlib.contextmanager
def recording() -> Iterator[list[str]]:
    """The names of the ops (``teops::linear_fwd``) this thread lowers while inside, one
    entry per traced call (a declined call keeps its node and is not listed): what
    tells a check that its compile lowered anything."""
    outer, _TRACING.traced = _TRACING.traced, []
    try:
        yield _TRACING.traced
    finally:
        _TRACING.traced = outer


# --- example bundles: what tests/runtime/lowering_check.py compiles -------------------------
# forward bundle class -> its op module's example hook
_EXAMPLES: dict[type, Callable[..., list[Any]]] = {}


def examples(forward: type) -> Callable[[Callable[..., list[Any]]], Callable[..., list[Any]]]:
    """Declare, next to an op, the forward bundles its lowering is checked on
    (``tests/runtime/lowering_check.py``): the marked function takes ``(recipe, device)`` (a
    ``quantization`` recipe or None) and returns fresh bundles of ``forward`` for it
    (the same values on every call, so an eager and a compiled run each get their own),
    or ``[]`` where the op takes no such recipe. An op declared ``lowers=True`` without
    examples fails the check."""

    def mark(fn: Callable[..., list[Any]]) -> Callable[..., list[Any]]:
        with _INSTALL_LOCK:
            if _EXAMPLES.setdefault(forward, fn) is not fn:
                raise ValueError(f"examples: two example hooks for {forward.__qualname__}")
        return fn

    return mark


def examples_of(forward: type) -> Callable[..., list[Any]] | None:
    """The example hook declared for the forward bundle class ``forward`` (or None)."""
    return _EXAMPLES.get(forward)


def register(
    op: Any, kernel: Callable[..., Any], rows: Sequence[SlotRow], *, by_default: bool
) -> None:
    """Let Inductor trace ``kernel`` in place of ``op`` for lowerable calls: in every
    Inductor compile when ``by_default`` (the op's declaration says ``lowers=True``),
    else only under ``inductor_backend(lowering="rounding")``."""
    lowerable = Lowerable(rows)

    def decomposition(*slots: Any) -> Any:
        if _autotuning_gemms() or not lowerable(slots):
            return NotImplemented  # keep the op node
        if _TRACING.traced is not None:
            _TRACING.traced.append(op.name())
        _TRACING.depth += 1
        try:
            return kernel(*slots)
        finally:
            _TRACING.depth -= 1

    decomposition.__name__ = f"lower_{op.name().replace('::', '_')}"
    with _INSTALL_LOCK:
        _DECOMPOSITIONS[op] = decomposition
        _MODULES[op] = kernel.__module__
        _PACKAGES.add(kernel.__module__.split(".", 1)[0])
        if by_default:
            _BY_DEFAULT.add(op)
        if _INSTALLED:
            _install_op(op)
            _tag_cache_key()
        else:
            _join_inductor_once_imported()


def _autotuning_gemms() -> bool:
    """Whether Inductor may pick its own GEMM kernels for this compile (``max-autotune``
    modes): a traced ``mm`` could then become a Triton template rounding differently
    from eager's cuBLAS call, so the calls keep their nodes (their GEMMs run in the op)."""
    return _private.inductor_max_autotune()


def decompositions() -> dict[Any, Callable[..., Any]]:
    """The registered op decompositions (a copy)."""
    return dict(_DECOMPOSITIONS)


def lowered_by_default() -> frozenset[Any]:
    """The ops every Inductor compile lowers (their declarations say ``lowers=True``)."""
    return frozenset(_BY_DEFAULT)


def lowered_modules() -> tuple[str, ...]:
    """The generated modules (by name) whose ops every Inductor compile lowers: what
    ``tests/runtime/lowering_check.py`` checks."""
    return tuple(sorted({_MODULES[op] for op in _BY_DEFAULT}))


# --- joining Inductor: its decomposition table, its fallbacks, its cache key ----------

_BY_DEFAULT: set[Any] = set()
_MODULES: dict[Any, str] = {}  # op -> the generated module that defined it
_PACKAGES: set[str] = set()  # top-level packages of the registered kernels
_INSTALL_LOCK = threading.RLock()
_INSTALLED = False
_INDUCTOR_LOWERING = _private.INDUCTOR_LOWERING_MODULE  # imported by every Inductor compile
_HOOKED = False  # the import hook is in sys.meta_path (or has fired)


def _lower(op: Any, *slots: Any) -> Any:
    # Looked up per call, so a decomposition can be replaced (tests count the calls).
    return _DECOMPOSITIONS[op](*slots)


def _table_entry(op: Any) -> Callable[..., Any]:
    entry = functools.partial(_lower, op)
    entry.__name__ = _DECOMPOSITIONS[op].__name__  # type: ignore[attr-defined]
    return entry


def _join_inductor_once_imported() -> None:
    """Join Inductor as soon as it is imported: now if it is, else right after its
    import (importing it costs over a second, and a program that never compiles with
    it should not pay that)."""
    import sys

    global _HOOKED
    if _INDUCTOR_LOWERING in sys.modules:
        install()
    elif not _HOOKED:
        _HOOKED = True
        sys.meta_path.insert(0, _AfterImport(_INDUCTOR_LOWERING, install))


class _AfterImport:
    """A one-shot import hook: runs ``then`` once module ``name`` has executed."""

    def __init__(self, name: str, then: Callable[[], None]) -> None:
        self.name, self.then = name, then

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        import sys

        if fullname != self.name:
            return None
        sys.meta_path.remove(self)  # one shot; the other finders find the module
        for finder in sys.meta_path:
            spec = getattr(finder, "find_spec", lambda *a: None)(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader, then = spec.loader, self.then
        run = loader.exec_module

        def exec_module(module: Any) -> None:
            run(module)
            try:
                then()
            except Exception as exc:  # noqa: BLE001 - never break Inductor's own import
                import warnings

                warnings.warn(
                    f"transformer_engine_ops: could not join Inductor ({type(exc).__name__}: "
                    f"{exc}); compiled op calls stay op nodes",
                    stacklevel=2,
                )

        loader.exec_module = exec_module  # this spec's own loader instance
        return spec


def keyed(fake: Callable[..., Any]) -> Callable[..., Any]:
    """``fake``, re-asserting the cache key's fingerprint as it runs: a lowered op's fake
    runs while Dynamo captures a graph holding it, before the compile cache is read."""

    @functools.wraps(fake)
    def keyed_fake(*slots: Any) -> Any:
        _tag_cache_key()
        return fake(*slots)

    return keyed_fake


_RECORDED: list[Callable[[], Any]] = []  # definers of the ops a lowered graph may call


def records(define: Callable[[], Any]) -> None:
    """``define()`` defines an op a lowered graph may call (a kept piece, a fused kernel
    recorded whole): run when the lowering joins Inductor, or now if it has. Defining it
    on its first trace is not enough: a graph loaded from Inductor's cache in a fresh
    process calls it without tracing anything."""
    with _INSTALL_LOCK:
        _RECORDED.append(define)
        if _INSTALLED:
            define()


def install() -> None:
    """Join Inductor: the decompositions of the ops lowered by default into its table
    and a fallback for every op; the fingerprint of the lowered kernels' source into the
    compile cache's key (each lowered op's fake re-asserts it, keeping a tag the user
    set since)."""
    global _INSTALLED
    with _INSTALL_LOCK:
        if not _INSTALLED:
            for op in _DECOMPOSITIONS:
                _install_op(op)
            for define in _RECORDED:
                define()
            _INSTALLED = True
    _tag_cache_key()


def _install_op(op: Any) -> None:
    # A declined call keeps its op node, and Inductor refuses to make its implicit
    # fallback for an op its decomposition table holds. So each op gets, up front, the
    # fallback Inductor would make for it implicitly (the layout constraint of its
    # tags), marked as overriding the decomposition; only then the decomposition.
    _private.inductor_install_fallback(op)
    if op in _BY_DEFAULT:
        entry = _table_entry(op)
        for table in _private.inductor_decompositions():
            table[op] = entry


_FINGERPRINTS: dict[tuple[str, ...], str] = {}


def source_fingerprint() -> str:
    """A digest of everything the lowered kernels can execute
    (:func:`.source_digest.fingerprint`): every ``.py`` file of their packages, on disk
    (modules a kernel imports only as it runs included), and of the packages those
    import, transitively; an installed distribution by its version."""
    roots = tuple(sorted(_PACKAGES))
    cached = _FINGERPRINTS.get(roots)
    if cached is None:
        cached = _FINGERPRINTS[roots] = source_digest.fingerprint(roots)
    return cached


_TAG_PREFIX = "teops-lowered-"
# A fingerprint of ours inside a tag: first (with the "+" after it) or after a "+".
_OUR_TAG = re.compile(
    r"\Ateops-lowered-[0-9a-f]{16}(?:\+|\Z)|\+teops-lowered-[0-9a-f]{16}(?=\+|\Z)"
)


def tagged(tag: str, fingerprint: str) -> str:
    """``tag`` with ``teops-lowered-<fingerprint>`` as its last ``+`` part: every
    character of the user's own tag kept (``team+run++7`` stays that), any earlier
    fingerprint of ours taken out."""
    user = _OUR_TAG.sub("", tag)
    mine = _TAG_PREFIX + fingerprint
    return f"{user}+{mine}" if user else mine


def _tag_cache_key() -> None:
    import torch

    config = torch.compiler.config
    tag = tagged(config.cache_key_tag, source_fingerprint())
    if config.cache_key_tag != tag:
        config.cache_key_tag = tag


_LOWERINGS = ("bitwise", "rounding", "off")


def inductor_backend(
    mode: str | None = None, options: dict[str, Any] | None = None, *, lowering: str = "bitwise"
) -> Callable[..., Any]:
    """A ``torch.compile`` backend: Inductor, with the op calls lowered as ``lowering`` says.

    ``torch.compile(model, fullgraph=True, backend=inductor_backend(lowering="off"))``;
    ``mode`` and ``options`` mean what they mean to ``torch.compile``'s Inductor.

    - ``"bitwise"``: what every Inductor compile does (the module docstring says what).
    - ``"rounding"``: every op lowers, declared so or not, and Inductor regenerates the
      :func:`exact` pieces too (fusing a bias gradient's sum into the activation's
      backward, say): a little faster on small shapes, and equal to eager to rounding
      only, as ``torch.nn.Linear`` compiled is to its eager. FP8 calls record their
      fused quantize either way.
    - ``"off"``: every op call stays one node, as on the other backends.

    The last two compile past AOTAutograd's cache, whose key cannot tell their graphs
    from the default's.
    """
    if lowering not in _LOWERINGS:
        raise ValueError(
            f"inductor_backend: lowering={lowering!r}; expected one of {', '.join(_LOWERINGS)}"
        )
    import torch

    patches = {**_private.inductor_mode_options(mode or "default"), **(options or {})}

    def backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
        install()
        if lowering == "bitwise":
            return _private.inductor_compile(gm, example_inputs, patches)
        table = _private.inductor_default_table()
        if lowering == "rounding":
            table = {**table, **{op: _table_entry(op) for op in _DECOMPOSITIONS}}
        else:
            table = {op: d for op, d in table.items() if op not in _DECOMPOSITIONS}
        keep_exact = _TRACING.keep_exact
        _TRACING.keep_exact = lowering != "rounding"  # read by the pieces as they trace
        try:
            with _private.autograd_cache_off():
                return _private.inductor_compile(gm, example_inputs, patches, table)
        finally:
            _TRACING.keep_exact = keep_exact

    backend.__name__ = f"teops_inductor_{lowering}"
    return backend
