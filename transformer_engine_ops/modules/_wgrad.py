"""TE's weight-gradient scheduling arguments, shared by the GEMM modules:
``fuse_wgrad_accumulation`` (the wgrad GEMM adds into each weight's ``main_grad``) and
``delay_wgrad_compute`` (the GEMM waits for :meth:`WgradScheduling.backward_dw`). The
ops route the gradient (``ops/_wgrad.py``); the module only sets the bundle's flags and
runs the deferred GEMMs. Under torch.compile such calls run eagerly with a declared
reason (the op declarations' ``eager_when``, checked in the generated ``call_<op>``)."""

from __future__ import annotations

from typing import Any

from torch import is_grad_enabled

from ..ops._wgrad import backward_dw


class WgradScheduling:
    """``fuse_wgrad_accumulation``, ``delay_wgrad_compute`` and ``backward_dw`` for a
    module whose weights are ``_wgrad_weights()`` (in the order TE's ``backward_dw``
    runs their GEMMs)."""

    fuse_wgrad_accumulation: bool = False
    delay_wgrad_compute: bool = False

    def _set_wgrad_scheduling(self, fuse_wgrad_accumulation: Any, delay_wgrad_compute: Any) -> None:
        self.fuse_wgrad_accumulation = bool(fuse_wgrad_accumulation)
        self.delay_wgrad_compute = bool(delay_wgrad_compute)

    def _wgrad_weights(self) -> tuple[Any, ...]:
        raise NotImplementedError

    def backward_dw(self) -> None:
        """Run the oldest wgrad GEMM the backward deferred for each weight
        (``delay_wgrad_compute``), as TE's ``backward_dw``: into ``main_grad`` when fused,
        else added to ``weight.grad`` as autograd accumulates. The bias gradients were
        not deferred (the backward computed them)."""
        if self.delay_wgrad_compute:
            for weight in self._wgrad_weights():
                backward_dw(weight)


def wgrad_flags(fuse: bool, delay: bool, *weights: Any) -> dict[str, bool]:
    """The bundle's flags for a module set to ``fuse`` (``fuse_wgrad_accumulation``) and
    ``delay`` (``delay_wgrad_compute``): on where this call computes a gradient of one of
    ``weights``, else off (a call under ``no_grad``, or of frozen weights, compiles). (A
    function of the flags, not a method: a method looked up on each layer is guarded,
    per layer and call, as absent from its ``__dict__``.)"""
    if not (fuse or delay):  # the usual module
        return {"fuse_wgrad_accumulation": False, "delay_wgrad_compute": False}
    on = is_grad_enabled() and any(weight.requires_grad for weight in weights)
    return {"fuse_wgrad_accumulation": on and fuse, "delay_wgrad_compute": on and delay}
