"""Every private torch API the runtime, the ops and the modules use, in one place.

Each entry names the symbol, why no public API serves, and the torch versions it was
run on, where its comment gives them: 2.11 (the GPU machines), 2.13 (the CPU machines),
2.14 (``make test-torch-versions``). A torch upgrade that moves one breaks here, not at
its users. Public API is used wherever one exists (``torch.is_grad_enabled``,
``torch.compiler.disable(reason=)``, ``OpOverload.name()``,
``torch.compiler.assume_constant_result``). Inductor is imported only by the functions
that need it: importing it costs over a second, and a program that never compiles with
Inductor should not pay that. ``tests/runtime/test_private_torch_api.py`` keeps every
other module of the package free of private torch names (its allow-list is empty).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
import torch.utils._pytree
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import _get_current_dispatch_mode

__all__ = [
    "AutoDispatchBelowAutograd",
    "BACKEND_KEYS",
    "FakeTensor",
    "INDUCTOR_LOWERING_MODULE",
    "after_autograd_keyset",
    "any_requires_grad",
    "assert_async",
    "autograd_cache_off",
    "cuda_current_device",
    "cuda_current_raw_stream",
    "current_dispatch_mode",
    "current_graph_task_id",
    "graph_caches_off",
    "disabled_torch_function_impl",
    "functorch_transform_active",
    "grouped_mm",
    "inductor_compile",
    "inductor_decompositions",
    "inductor_default_table",
    "inductor_install_fallback",
    "inductor_max_autotune",
    "inductor_mode_options",
    "make_wrapper_subclass",
    "mark_constant_result",
    "opaque_value_meta",
    "preserve_version_counter",
    "queue_backward_callback",
    "register_opaque_value_type",
    "scaled_grouped_mm",
    "scaled_mm",
    "sdpa_kernel_ops",
    "symm_mem_ops",
    "tree_leaves",
    "tree_map",
]

# --- the ops' own Autograd kernels (runtime/custom_ops.py) -----------------------------
# torch.library's ``register_autograd`` re-enters the dispatcher even when nothing is
# recorded (every slot converted twice, ~36 slots an op); our Autograd kernel calls the
# backend kernel straight away when the next key is the plain backend, and otherwise
# re-dispatches below autograd, as torch's own custom-op autograd does internally.

# The keys left once Autograd is handled (``keyset & after_autograd_keyset``).
after_autograd_keyset = torch._C._after_autograd_keyset
# Context: dispatch below the Autograd key (``OpOverload.redispatch`` under it).
AutoDispatchBelowAutograd = torch._C._AutoDispatchBelowAutograd
# The backend keys a call with nothing in between goes straight to.
BACKEND_KEYS = (torch._C.DispatchKey.CPU, torch._C.DispatchKey.CUDA)
# Whether any argument (a tensor, or a list of them) requires grad, in C: the public
# spelling is a Python loop over ~36 slots on every op call.
any_requires_grad = torch._C._any_requires_grad

# --- autograd's engine (ops/linear.py, modules/_base.py) --------------------------------
# The id of the backward the autograd engine is running on this thread, -1 outside one:
# the only way to tell a forward recomputed by a backward (checkpointing) or a backward
# run with ``create_graph=True`` from a plain call.
current_graph_task_id = torch._C._current_graph_task_id
# Runs a callback when the backward the engine is running ends (quantization/float8.py:
# delayed scaling updates its scale once per backward, after every quantize in it, as
# TE does); no public hook runs at the end of the whole backward. 2.11 (H200), 2.13.
queue_backward_callback = torch.autograd.Variable._execution_engine.queue_callback


# --- torch.func (modules/autocast.py) --------------------------------------------------
def functorch_transform_active() -> bool:
    """Whether a torch.func transform (grad, vmap, jacrev, ...) is running: te.autocast
    refuses it by name, since the modules' autograd Functions define no setup_context.
    torch has no public query for the functorch interpreter stack."""
    return torch._C._functorch.peek_interpreter_stack() is not None


# --- quantized tensor subclasses (quantization/quantizer.py) --------------------------------
# The wrapper-subclass constructor and the "no __torch_function__" marker: what every
# ``__torch_dispatch__`` subclass in torch's own documentation and in torchao uses.
make_wrapper_subclass = torch.Tensor._make_wrapper_subclass
disabled_torch_function_impl = torch._C._disabled_torch_function_impl
# Maps a function over nested args/kwargs (a fallback dequantizes every quantized
# argument): torch has no public pytree module (``torch.utils.pytree`` is absent in 2.13).
tree_map = torch.utils._pytree.tree_map
# The tensors among nested args/kwargs (an in-place op's written arguments).
tree_leaves = torch.utils._pytree.tree_leaves

# --- comm-GEMM overlap (runtime/comm_overlap.py) ---------------------------------------
# ``torch.ops.symm_mem``'s fused all-gather + matmul and matmul + reduce-scatter are
# defined by importing ``torch.distributed._symmetric_memory``; no public module defines
# them. Imported on first use (after the group checks), never at package import. 2.13
# (defined on the CPU build; the kernels need CUDA and NCCL); the H200's 2.11 ran the
# bf16 ops on a one-rank NCCL group.


def symm_mem_ops() -> Any:
    """``torch.ops.symm_mem`` with torch's symmetric-memory ops defined, or None where
    this torch cannot import them."""
    try:
        import torch.distributed._symmetric_memory  # noqa: F401  (defines the ops)
    except ImportError:
        return None
    return torch.ops.symm_mem


# --- attention's fused kernels (ops/attention.py) -------------------------------------
# ``F.scaled_dot_product_attention`` returns the output only; the aten ops it and its
# autograd formula call (``aten._scaled_dot_product_{flash,cudnn,efficient}_attention``
# and their ``_backward``, the CPU flash kernel's ``..._for_cpu``) return the
# log-sum-exp and take it back, so the attention backward runs on what its forward
# saved instead of recomputing it. No public API exposes them. 2.13 (the CPU kernels
# run; the CUDA ones' meta functions checked against our fakes); 2.11 (H200) pending.


def sdpa_kernel_ops() -> Any:
    """``torch.ops.aten``: the SDPA kernels' private forward and backward ops."""
    return torch.ops.aten


# --- device-side checks (ops/attention.py, ops/_moe.py, ops/grouped_linear.py) ---------
# A rule on tensor values checked without a host synchronization (safe under CUDA-graph
# capture): ``torch._assert_async`` fails the stream at the next synchronization (the
# thd ``cu_seqlens`` / ``max_seqlen`` checks, the MoE row counts). No public spelling on
# 2.11 (H200), 2.13 or 2.14 (``torch._check`` reads the value on the host).
assert_async = torch._assert_async

# --- grouped GEMMs (ops/grouped_linear.py) ---------------------------------------------
# One GEMM over consecutive row groups, the group ends read on the device (int32
# offsets): ``torch._grouped_mm`` (bf16) and ``torch._scaled_grouped_mm`` (FP8 E4M3 with
# rowwise fp32 scales, Hopper). No public spelling on 2.11 (H200), 2.13 (its CPU
# kernel, a loop of ``mm``) or 2.14. Looked up on use: a torch without them answers None.


def grouped_mm() -> Any:
    return getattr(torch, "_grouped_mm", None)


def scaled_grouped_mm() -> Any:
    return getattr(torch, "_scaled_grouped_mm", None)


# --- quantized kernels (quantization/) ------------------------------------------------
# The FP8 GEMM (quantization/gemm.py), per-tensor and block-scaled (1x128 / 128x128
# fp32 scales, quantization/float8_block_gemm.py): ``torch._scaled_mm`` has no public
# spelling on 2.11 (the H200's), 2.13 or 2.14 (``torch.nn.functional.scaled_mm`` takes
# the same scales plus explicit scaling kinds, and its 128x128 scale shapes differ
# between versions). Run on 2.11 (H200) and 2.13; block scales probed on 2.11.
scaled_mm = torch._scaled_mm
# ``FakeTensor`` (imported above; torch imports its module at start-up, so no cost):
# quantization/gemm.py and kernels/cuda_kernels.py tell a kernel traced for a
# lowered op call by its fake tensors, and record their fused kernels as one op only
# then; torch has no public "is this tensor fake" query. 2.11 (H200), 2.13.
# Whether a torch_dispatch mode (fake or functional tracing) is active before a Triton
# launch (kernels/cuda_kernels.py): no public query. 2.11 (H200), 2.13.
current_dispatch_mode = _get_current_dispatch_mode


def _built_without_cuda(*args: Any) -> Any:
    raise RuntimeError("transformer_engine_ops: this torch was built without CUDA")


# The current CUDA device and its raw stream handle, on the launch path of every Triton
# kernel (kernels/_triton_launch.py, kernels/cuda_kernels.py): the public
# ``torch.cuda.current_device()`` runs the lazy-init check, and
# ``torch.cuda.current_stream()`` builds a Stream object, per launch. Module-level
# aliases, so a launch pays one C call for each, as before. Absent from CPU-only builds,
# where no launch reaches them. 2.11 (H200), 2.13.
cuda_current_device = getattr(torch._C, "_cuda_getDevice", _built_without_cuda)
cuda_current_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", _built_without_cuda)

# --- Dynamo, without importing it (runtime/custom_ops.py, runtime/fallback.py) ----------
# Importing torch._dynamo costs ~0.9 s, which importing a generated op module does not
# pay.


# --- FSDP2's refill of a gathered parameter (quantization/fsdp2.py) ---------------------
# Before the backward FSDP2 refills an unsharded parameter with the values its forward
# read, and keeps autograd's version counters as they were (its own copy-out uses this
# context manager); an FP8 parameter's scale and transposed codes are refilled the same
# way, or the backward would refuse its saved buffers as modified. No public spelling;
# run on 2.13.
preserve_version_counter = torch.autograd._unsafe_preserve_version_counter


def mark_constant_result(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``torch.compiler.assume_constant_result(fn)`` without importing Dynamo: that
    function only sets the attribute Dynamo reads (checked on 2.13), and a compiled
    call's ``begin_call`` must be marked before Dynamo first traces it."""
    fn._dynamo_marked_constant = True  # type: ignore[attr-defined]
    return fn


# --- quantizers as torch opaque value types (quantization/quantizer.py) --------------
# TE registers its four tensorless quantizer classes with torch's opaque-object API, so
# that a ``torch.library`` schema can name one (``get_opaque_type_name``) and Dynamo
# passes an instance as a constant guarded by ``__eq__``. No public API; run on 2.11 and
# 2.13. 2.11 also wants the class's metaclass to be ``OpaqueBaseMeta`` (2.13 only for
# reference types); where torch lacks the API the metaclass is ``type`` and nothing is
# registered.
try:
    from torch._library import opaque_object as _opaque_object
    from torch._opaque_base import OpaqueBaseMeta as opaque_value_meta
except ImportError:  # pragma: no cover - torch without opaque objects
    _opaque_object = None
    opaque_value_meta = type


def register_opaque_value_type(cls: type, use_real: Iterable[str]) -> bool:
    """Register ``cls`` as an opaque value type (once), Dynamo reading or calling each
    member in ``use_real`` on the real object while it traces (2.11 refuses any member
    not listed); False where torch cannot."""
    if _opaque_object is None:
        return False
    if not _opaque_object.is_opaque_value_type(cls):
        members = dict.fromkeys(use_real, _opaque_object.MemberType.USE_REAL)
        _opaque_object.register_opaque_type(cls, typ="value", members=members)
    return True


def __getattr__(name: str) -> Any:
    # ``comptime`` (runtime/fallback.py) runs a function in Dynamo's own frame while it
    # traces, where a ``torch.compiler.disable``d runner can be created without Dynamo
    # breaking the graph on the creation itself. Imported on first use: Dynamo knows it
    # by identity, so the real function is handed out, not a wrapper.
    if name == "comptime":
        from torch._dynamo.comptime import comptime

        return comptime
    # ``torch._dynamo.mark_static_address`` (modules/inference.py): the KV cache and the
    # step's page table are fixed device buffers written in place between decode steps;
    # marked static, a CUDA-graph replay reads them where they are instead of copying
    # them into the graph's own inputs. No ``torch.compiler`` spelling on 2.11 or 2.13.
    if name == "mark_static_address":
        from torch._dynamo import mark_static_address

        return mark_static_address
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# --- joining Inductor (runtime/lowering.py) --------------------------------------------
# Inductor has no public API for a backend's decomposition table, its fallbacks or its
# configuration; a lowering needs all three.

# The module every Inductor compile imports (the import hook waits for it).
INDUCTOR_LOWERING_MODULE = "torch._inductor.lowering"


def inductor_max_autotune() -> bool:
    """Whether this compile lets Inductor choose its own GEMM kernels."""
    from torch._inductor import config

    return bool(config.max_autotune or config.max_autotune_gemm)


def inductor_install_fallback(op: Any) -> None:
    """Give ``op`` the fallback Inductor would make for it implicitly (the layout
    constraint of its tags), marked as overriding a decomposition of it, with one
    change: the pointwise values it reads are realized where they are computed, not
    copied into a buffer of their own (:func:`_realizing_inputs`). 2.13."""
    from torch._inductor import lowering
    from torch._library.utils import get_layout_constraint_tag

    if op not in lowering.lowerings:
        tag = get_layout_constraint_tag(op, with_default=True)
        lowering.make_fallback(
            op,
            layout_constraint=_realizing_inputs(op, lowering.tag_to_layout_constraint(tag)),
            warn=False,
            override_decomp=True,
        )


def _realizing_inputs(op: Any, constraint: Callable[..., Any] | None) -> Callable[..., Any]:
    """``constraint`` (a tag's layout constraint, or None), after realizing every
    tensor argument still a pointwise expression. Inductor's own constraint copies such
    an argument into a buffer for the op and leaves the expression inlined into its
    other readers: ``relu(y)`` feeding the next layer's op and the ``le`` that the
    backward of ``relu`` saves was computed once for the op's copy and again inside the
    ``le`` kernel, from ``y``. That second read of ``y`` blocks computing ``relu`` in
    place, for some layers but not others (it depends on the order Inductor fused the
    two in), and each variant is a C++ kernel of its own to compile (~0.5 s each on the
    CPU machine). Realized, the value has one buffer, which the op and every other
    reader read: the readers see the rounded value eager sees, and the kernel is the
    same in every layer. Inductor calls the constraint as ``(node, *args, **kwargs)``
    for any constraint but its own ``constrain_to_fake_tensors``, which this reproduces
    (the node's eager input values, normalized by the op's schema; no constraint when
    the node has none, as Inductor does)."""
    from torch._inductor import ir, lowering

    def realize(box: Any) -> Any:
        box.realize()
        return box

    def normalized(args: Any, kwargs: Any) -> tuple[Any, Any]:
        result = torch.fx.operator_schemas.normalize_function(op, args, kwargs)
        assert result is not None
        return result[0], result[1]

    def constrain(node: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        args, kwargs = torch.utils._pytree.tree_map_only(ir.TensorBox, realize, (args, kwargs))
        if constraint is None:
            return args, kwargs
        if constraint is not lowering.constrain_to_fake_tensors:
            return constraint(node, *args, **kwargs)
        if "eager_input_vals" not in node.meta:
            return args, kwargs
        fake_args, fake_kwargs = normalized(*node.meta["eager_input_vals"])
        args, kwargs = normalized(args, kwargs)
        return lowering.constrain_to_fake_tensors(args, kwargs, fake_args, fake_kwargs)

    return constrain


def inductor_decompositions() -> tuple[dict[Any, Callable[..., Any]], ...]:
    """Inductor's default decomposition tables (the live dicts: entries added join
    them): its table, and the copy of it that default compiles read, once made
    (``fast_random_decomps``, cached on first use: an op added after Inductor's first
    compile of the process is missing from it otherwise). 2.13."""
    from torch._inductor import decomposition

    tables = [decomposition.decompositions]
    fast = getattr(decomposition, "fast_random_decomps", None)
    if fast is not None and fast.cache_info().currsize:
        tables.append(fast())
    return tuple(tables)


def inductor_mode_options(mode: str) -> dict[str, Any]:
    """The Inductor settings a ``torch.compile`` mode stands for."""
    from torch._inductor import list_mode_options

    return list_mode_options(mode)


def inductor_compile(
    gm: Any,
    example_inputs: Sequence[Any],
    config_patches: dict[str, Any],
    decompositions: dict[Any, Callable[..., Any]] | None = None,
) -> Any:
    """Inductor's compile of ``gm``; ``decompositions`` (if given) in place of its
    default table (:func:`inductor_default_table`)."""
    from torch._inductor.compile_fx import compile_fx

    if decompositions is None:
        return compile_fx(gm, example_inputs, config_patches=config_patches)
    return compile_fx(
        gm, example_inputs, config_patches=config_patches, decompositions=decompositions
    )


def inductor_default_table() -> dict[Any, Callable[..., Any]]:
    """The decomposition table Inductor compiles with by default (a fresh dict)."""
    from torch._inductor.decomposition import select_decomp_table

    return dict(select_decomp_table())


@contextmanager
def graph_caches_off() -> Iterator[None]:
    """Inductor's FX-graph cache and AOTAutograd's cache off for what runs inside
    (tests/runtime/lowering_check.py: a cached graph is loaded, not traced, and the lowering it
    checks would not run); the compiled-kernel cache stays, so no kernel is rebuilt. 2.13."""
    import torch._functorch.config as functorch_config
    from torch._inductor import config

    with (
        config.patch(fx_graph_cache=False),
        functorch_config.patch(enable_autograd_cache=False),
    ):
        yield


@contextmanager
def autograd_cache_off() -> Iterator[None]:
    """AOTAutograd's compile cache off for what runs inside."""
    import torch._functorch.config as functorch_config

    with functorch_config.patch(enable_autograd_cache=False):
        yield
