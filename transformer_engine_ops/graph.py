"""``te.make_graphed_callables``: TE's CUDA-graph entry (Megatron's), over
``torch.cuda.make_graphed_callables``, with TE's recipe arguments.

Each callable is captured inside ``te.autocast(enabled, recipe)``: the recipe's
quantizers are plain values, so the captured kernels replay the same quantization.
Delayed scaling is refused, naming it: its scales update in Python when the autocast
region exits, which a replay would skip. Stochastic rounding (NVFP4's gradients, by
``NVFP4BlockScaling`` or a ``CustomRecipe``'s quantizer) is not: each module call draws
its (seed, offset) pair on the CUDA device's generator, which a graph replay advances
as an eager call does, so a replay rounds with fresh bits, eager's for the same
generator state (``quantization/stochastic.py``). The callables returned wrap the
given ones (TE rewires the modules' own ``forward``); call those.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any, Union

import torch

from .modules.autocast import autocast
from .quantization.recipes import DelayedScaling, Recipe


class _UnderRecipe(torch.nn.Module):
    """Runs ``module`` under ``te.autocast(enabled, recipe)`` (a module, so that torch
    graphs its parameters)."""

    def __init__(self, module: Callable[..., Any], enabled: bool, recipe: Recipe | None) -> None:
        super().__init__()
        self.module = module
        self.enabled, self.recipe = enabled, recipe

    def forward(self, *args: Any) -> Any:
        with autocast(enabled=self.enabled, recipe=self.recipe):
            return self.module(*args)


def _renamed(old: str, old_value: Any, new: str, new_value: Any) -> Any:
    """TE's deprecated ``fp8_*`` argument folded into its new name."""
    if old_value is None:
        return new_value
    if new_value is not None:
        raise ValueError(f"make_graphed_callables: pass {new} or {old} (deprecated), not both")
    warnings.warn(
        f"make_graphed_callables: {old} is deprecated; use {new}",
        category=DeprecationWarning,
        stacklevel=3,
    )
    return old_value


def make_graphed_callables(
    modules: Union[Callable[..., Any], tuple[Callable[..., Any], ...]],
    sample_args: Union[tuple[torch.Tensor, ...], tuple[tuple[torch.Tensor, ...], ...]],
    num_warmup_iters: int = 3,
    allow_unused_input: bool = False,
    sample_kwargs: Any = None,
    fp8_enabled: Any = None,
    fp8_calibrating: bool | None = None,
    fp8_recipe: Recipe | None = None,
    fp8_group: Any = None,
    fp8_weight_caching: bool | None = None,
    enabled: Any = None,
    calibrating: bool | None = None,
    recipe: Recipe | None = None,
    amax_reduction_group: Any = None,
    cache_quantized_params: bool | None = None,
    _order: Any = None,
    _num_layers_per_chunk: Any = None,
    pool: Any = None,
    retain_graph_in_backward: bool = False,
    _reuse_graph_input_output_buffers: bool = False,
    clone_param_grads_on_return: bool = True,
    pre_warmup_hook: Any = None,
    post_warmup_hook: Any = None,
    capture_time_hooks: Any = None,
) -> Union[Callable[..., Any], tuple[Callable[..., Any], ...]]:
    """TE 2.20.2's signature. ``enabled`` (one bool, or one per callable) and ``recipe``
    (default ``Float8CurrentScaling``) are the ``te.autocast`` each callable is captured
    under; the ``fp8_*`` names are TE's deprecated ones. ``num_warmup_iters``,
    ``allow_unused_input`` and ``pool`` go to torch. The other arguments work at TE's
    defaults; another value raises ``NotImplementedError`` naming it."""
    enabled = _renamed("fp8_enabled", fp8_enabled, "enabled", enabled)
    calibrating = _renamed("fp8_calibrating", fp8_calibrating, "calibrating", calibrating)
    recipe = _renamed("fp8_recipe", fp8_recipe, "recipe", recipe)
    group = _renamed("fp8_group", fp8_group, "amax_reduction_group", amax_reduction_group)
    caching = _renamed(
        "fp8_weight_caching", fp8_weight_caching, "cache_quantized_params", cache_quantized_params
    )
    unsupported = {
        "sample_kwargs": sample_kwargs is not None,
        "calibrating": bool(calibrating),
        "amax_reduction_group": group is not None,
        "cache_quantized_params": bool(caching),
        "_order": _order is not None,
        "_num_layers_per_chunk": _num_layers_per_chunk is not None,
        "retain_graph_in_backward": retain_graph_in_backward,
        "_reuse_graph_input_output_buffers": _reuse_graph_input_output_buffers,
        "clone_param_grads_on_return": not clone_param_grads_on_return,
        "pre_warmup_hook": pre_warmup_hook is not None,
        "post_warmup_hook": post_warmup_hook is not None,
        "capture_time_hooks": capture_time_hooks is not None,
    }
    named = [name for name, given in unsupported.items() if given]
    if named:
        raise NotImplementedError(
            "make_graphed_callables: not implemented by transformer_engine_ops: "
            + ", ".join(named)
            + " (leave these at TE's defaults)"
        )
    if isinstance(recipe, DelayedScaling):
        raise NotImplementedError(
            "make_graphed_callables: DelayedScaling under CUDA graphs is not implemented by "
            "transformer_engine_ops (delayed scaling updates its scales on the host at each "
            "autocast exit: a graph replay would skip it)"
        )
    if not torch.cuda.is_available():
        raise RuntimeError(
            "make_graphed_callables: CUDA graphs need a CUDA device, and none is available; "
            "call the modules directly (or torch.compile them) on the CPU"
        )
    single = not isinstance(modules, tuple)
    callables = (modules,) if single else modules
    flags = enabled if isinstance(enabled, tuple) else (bool(enabled),) * len(callables)
    if len(flags) != len(callables):
        raise ValueError(
            f"make_graphed_callables: {len(flags)} values of enabled for {len(callables)} callables"
        )
    wrapped = tuple(_UnderRecipe(m, flag, recipe) for m, flag in zip(callables, flags, strict=True))
    graphed = torch.cuda.make_graphed_callables(
        wrapped[0] if single else wrapped,
        sample_args,
        num_warmup_iters=num_warmup_iters,
        allow_unused_input=allow_unused_input,
        pool=pool,
    )
    return graphed
