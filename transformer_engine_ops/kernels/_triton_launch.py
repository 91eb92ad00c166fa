"""Launching a Triton kernel without Triton's per-call Python (imported with Triton only).

``kernel[grid](*args)`` binds the arguments, specializes each one, builds a cache key,
looks the compiled kernel up, reads its knobs and hooks and builds launch metadata on
every call: ~12 us of host time per launch on the H200's host (~50 us under cProfile),
two launches per quantize, three quantizes per layer and step, on a path that is bound
by the host. :class:`CachedLauncher` pays that once per specialization and then calls
the compiled kernel's launcher directly, as ``CompiledKernel.__getitem__`` does.

A compiled kernel is reused only for arguments Triton itself would give the same
kernel: the key is the launch options, the constexprs and, for each runtime argument,
what Triton's binder specializes it on (:func:`specialization`; tests check it against
Triton's own ``native_specialize_impl``). Only on Triton versions whose binder and
launcher were read and tested (``VERIFIED``); elsewhere, with a launch hook installed
(profilers), or if the direct launch is refused, every call takes ``kernel[grid]``.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import torch
import triton

from ..runtime import _torch_private as _private

# Per launch: one C call each (runtime/_torch_private.py says why they are private).
_current_device = _private.cuda_current_device
_current_raw_stream = _private.cuda_current_raw_stream

# Triton 3.6 (torch 2.11) and 3.8 (torch 2.14): the same specialization rules (tests
# compare them) and the same launcher call in JITFunction.run; 3.7 lies between.
VERIFIED = ("3.6.", "3.7.", "3.8.")

_I32 = (-(2**31), 2**31)


def specialization(arg: Any) -> Hashable:
    """What Triton's binder specializes a runtime argument on: a tensor on its dtype and
    16-byte alignment; an int on being 1, divisibility by 16 and its width (i32, i64,
    u64); a float or bool on its type only."""
    if isinstance(arg, torch.Tensor):
        return (arg.dtype, arg.data_ptr() % 16 == 0)
    kind = type(arg)
    if kind is int:
        return (arg == 1, arg % 16 == 0, _I32[0] <= arg < _I32[1], arg < 2**63)
    if kind is float or kind is bool:
        return kind
    raise TypeError(f"no Triton specialization rule for a {kind.__name__} argument")


def specializations(args: Sequence[Any]) -> tuple[Hashable, ...]:
    """``tuple(map(specialization, args))`` in one call (a launch's key is built on
    every launch: the common kinds are tested inline)."""
    out: list[Hashable] = []
    for arg in args:
        kind = type(arg)
        if kind is torch.Tensor:
            out.append((arg.dtype, arg.data_ptr() % 16 == 0))
        elif kind is int:
            out.append((arg == 1, arg % 16 == 0, _I32[0] <= arg < _I32[1], arg < 2**63))
        else:
            out.append(specialization(arg))
    return tuple(out)


def _hooked(hook: Any) -> bool:
    """Whether a launch hook is installed: Triton 3.6+ keeps an always-present
    ``HookChain`` (installed hooks in ``.calls``); older versions None or a callable."""
    return hook is not None and bool(getattr(hook, "calls", True))


class CachedLauncher:
    """``launcher(grid, args, constexprs, num_warps=..., num_stages=None)`` launches the
    JIT kernel like ``kernel[grid](*args, **constexprs, num_warps=..., num_stages=...)``
    (``num_stages`` None: Triton's default); ``grid`` has three dims,
    ``args`` are the runtime arguments in signature order, ``constexprs`` the rest, by
    name: a mapping, or a tuple of ``(name, value)`` pairs (hashable as it is, so a
    caller that builds it once per configuration saves rebuilding it per launch).
    Thread-safe: a race at worst compiles-or-finds one kernel twice."""

    def __init__(self, kernel: Any) -> None:
        self._kernel = kernel
        self._names = tuple(kernel.arg_names)
        self._compiled: dict[Hashable, Any] = {}
        self.direct = str(triton.__version__).startswith(VERIFIED)
        self.direct_launches = 0  # read by tests

    def _triton_launch(
        self,
        grid: Sequence[int],
        args: Sequence[Any],
        constexprs: Any,
        warps: int,
        stages: int | None,
    ) -> Any:
        named = dict(constexprs)
        if stages is not None:
            named["num_stages"] = stages
        return self._kernel[tuple(grid)](*args, **named, num_warps=warps)

    def __call__(
        self,
        grid: Sequence[int],
        args: Sequence[Any],
        constexprs: Mapping[str, Any] | tuple[tuple[str, Any], ...],
        *,
        num_warps: int,
        num_stages: int | None = None,
    ) -> None:
        if not self.direct:  # checked first: older Tritons have no ``knobs``
            self._triton_launch(grid, args, constexprs, num_warps, num_stages)
            return
        runtime = triton.knobs.runtime
        if (
            _hooked(runtime.launch_enter_hook)
            or _hooked(runtime.launch_exit_hook)
            or self._kernel.pre_run_hooks
        ):
            self._triton_launch(grid, args, constexprs, num_warps, num_stages)
            return
        device = _current_device()
        items = constexprs if type(constexprs) is tuple else tuple(constexprs.items())
        key = (
            device,
            num_warps,
            num_stages,
            runtime.debug,
            triton.knobs.compilation.instrumentation_mode,
            items,
            specializations(args),
        )
        entry = self._compiled.get(key)
        if entry is None:
            # Triton compiles (or finds) the kernel for these arguments and launches it;
            # the constexprs after the runtime arguments, in signature order, go with it.
            named = dict(items)
            tail = tuple(named[name] for name in self._names[len(args) :])
            launched = self._triton_launch(grid, args, items, num_warps, num_stages)
            self._compiled[key] = (launched, tail)
            return
        compiled, tail = entry
        stream = _current_raw_stream(device)
        try:
            compiled.run(
                grid[0],
                grid[1],
                grid[2],
                stream,
                compiled.function,
                compiled.packed_metadata,
                None,  # launch metadata: only read by launch hooks (none installed)
                None,  # no enter hook
                None,  # no exit hook
                *args,
                *tail,
            )
        except TypeError:
            # The launcher refused the call before launching (argument count or types of
            # another Triton build): launch through Triton, now and from now on.
            self.direct = False
            self._triton_launch(grid, args, constexprs, num_warps, num_stages)
            return
        self.direct_launches += 1


class Interpreted:
    """The launcher call of :class:`CachedLauncher` on Triton's interpreter (CPU tensors
    under ``TRITON_INTERPRET=1``), for a kernel function or its ``triton.jit`` (which,
    decorated under ``TRITON_INTERPRET=1``, already is an interpreted function)."""

    def __init__(self, fn: Any) -> None:
        from triton.runtime.interpreter import InterpretedFunction

        self._fn = (
            fn
            if isinstance(fn, InterpretedFunction)
            else InterpretedFunction(getattr(fn, "fn", fn))
        )

    def __call__(
        self, grid: Any, args: Any, constexprs: Any, *, num_warps: int, num_stages: Any = None
    ) -> None:
        # The interpreter runs one program at a time: no warps or pipeline stages to set.
        self._fn[tuple(grid)](*args, **dict(constexprs), num_warps=num_warps)


def launchers(kernels: Sequence[Any], interpret: bool) -> tuple[Any, ...]:
    """One launcher per kernel (a function or its ``triton.jit``), each called as
    ``launch(grid, args, constexprs, num_warps=...)``: :class:`Interpreted` for Triton's
    interpreter (CPU tensors), else a :class:`CachedLauncher` of the compiled kernel."""
    if interpret:
        return tuple(Interpreted(k) for k in kernels)
    from triton.runtime.jit import JITFunction

    return tuple(
        CachedLauncher(k if isinstance(k, JITFunction) else triton.jit(k)) for k in kernels
    )
