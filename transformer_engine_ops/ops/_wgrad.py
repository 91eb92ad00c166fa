"""Where a weight gradient goes when it is not handed back to autograd: TE's
``fuse_wgrad_accumulation`` (added into the weight's ``main_grad``, Megatron's fp32
buffer) and ``delay_wgrad_compute`` (the wgrad GEMM waits for ``module.backward_dw()``).

Both are side effects on objects outside the call (a buffer written in place, a GEMM
run later), which no custom-op schema declares: the modules run such calls eagerly
under torch.compile with a declared reason (``modules/_call.py``), and the spec fakes
refuse them, so a traced op can never drop one. Not an op module (the generator does
not read it).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

# A wgrad GEMM with its operands bound: out_dtype -> the weight gradient.
WgradGemm = Callable[[torch.dtype], torch.Tensor]

_QUEUE = "_teops_deferred_wgrads"


@dataclass
class WgradRoute:
    """Where one GEMM's weight gradient goes (built by the op's ``setup_context``)."""

    weight: Any  # the parameter the gradient belongs to
    fuse: bool  # into ``weight.main_grad`` (TE: ``fuse_wgrad_accumulation``)
    overwrite: bool  # fused, but ``main_grad`` is overwritten, not added to
    deferred: deque[Any] | None  # delayed: the GEMMs wait here for ``backward_dw``


def route_of(
    weight: Any, fuse: bool, delay: bool, is_first_microbatch: bool | None
) -> WgradRoute | None:
    """The route of a call that needs a weight gradient; None for the plain path. As
    TE: with fusion, ``is_first_microbatch=True`` or ``weight.overwrite_main_grad``
    overwrites ``main_grad`` instead of adding to it."""
    if not (fuse or delay):
        return None
    overwrite = is_first_microbatch is True or bool(getattr(weight, "overwrite_main_grad", False))
    return WgradRoute(weight, fuse, fuse and overwrite, deferred_queue(weight) if delay else None)


def deferred_queue(weight: Any) -> deque[Any]:
    """The weight's own queue of deferred wgrad GEMMs (oldest first)."""
    queue = weight.__dict__.get(_QUEUE)
    if queue is None:
        queue = weight.__dict__[_QUEUE] = deque()
    return queue


def refuse_traced(where: str, fuse: bool, delay: bool) -> None:
    """Raise for a traced call that asks for a wgrad side effect (the spec fakes' check)."""
    for name, given in (("fuse_wgrad_accumulation", fuse), ("delay_wgrad_compute", delay)):
        if given:
            raise ValueError(
                f"{where}.{name}: the weight gradient's side effect (main_grad, "
                "backward_dw) cannot be traced into a graph; the modules run such calls "
                "eagerly"
            )


def send(route: WgradRoute, gemm: WgradGemm, dtype: torch.dtype) -> torch.Tensor | None:
    """Route one weight gradient (``gemm`` computes it in the dtype it is asked for; the
    activations' is ``dtype``); what the backward returns for the weight in its place."""
    if route.deferred is not None:
        route.deferred.append((route, gemm, dtype))
    else:  # an undeferred route is a fused one
        land(route, gemm, dtype)
    return _in_place_of_wgrad(route)


def land(route: WgradRoute, gemm: WgradGemm, dtype: torch.dtype) -> torch.Tensor | None:
    """Run the GEMM: into ``main_grad`` when fused (None returned; in ``main_grad``'s
    dtype, as TE's GEMM writes it), else the gradient in ``dtype``."""
    if not route.fuse:
        return gemm(dtype)
    main_grad = main_grad_of(route.weight)
    wgrad = gemm(main_grad.dtype)
    if route.overwrite:
        main_grad.copy_(wgrad)
    else:
        main_grad.add_(wgrad)
    return None


def main_grad_of(weight: Any) -> torch.Tensor:
    main_grad = getattr(weight, "main_grad", None)
    if not isinstance(main_grad, torch.Tensor):
        raise RuntimeError(
            f"fuse_wgrad_accumulation=True: the weight of shape {tuple(weight.shape)} has no "
            "main_grad tensor; allocate it before the backward (e.g. weight.main_grad = "
            "torch.zeros_like(weight, dtype=torch.float32)), as Megatron-LM does"
        )
    if tuple(main_grad.shape) != tuple(weight.shape):
        raise RuntimeError(
            f"fuse_wgrad_accumulation=True: main_grad has shape {tuple(main_grad.shape)}, "
            f"but its weight has shape {tuple(weight.shape)}"
        )
    return main_grad


def _in_place_of_wgrad(route: WgradRoute) -> torch.Tensor | None:
    """What autograd receives for a fused weight (TE): None, or, where the weight has
    Megatron's ``grad_added_to_main_grad`` attribute, that flag set and a dummy gradient
    (zeros here; TE's is uninitialized unless ``zero_out_wgrad``). A delayed unfused
    gradient arrives in ``backward_dw``: None now."""
    weight = route.weight
    if not route.fuse or not hasattr(weight, "grad_added_to_main_grad"):
        return None
    weight.grad_added_to_main_grad = True
    return torch.zeros(weight.shape, dtype=weight.dtype, device=weight.device)


def backward_dw(weight: Any) -> None:
    """Run the oldest deferred wgrad GEMM of ``weight``: into ``main_grad`` (fused), else
    added to ``weight.grad`` as autograd accumulates it. Nothing deferred: nothing runs."""
    queue = weight.__dict__.get(_QUEUE)
    if not queue:
        return
    route, gemm, dtype = queue.popleft()
    wgrad = land(route, gemm, dtype)
    if wgrad is None:
        return
    wgrad = wgrad.to(weight.dtype)
    if weight.grad is None:
        weight.grad = wgrad
    else:
        weight.grad += wgrad
