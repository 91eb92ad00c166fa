"""Transformer Engine style modules under ``torch.compile(fullgraph=True)``.

Use it as TE is used: ``import transformer_engine_ops as te``; ``te.Linear``,
``te.LayerNormLinear``, ``te.LayerNormMLP``, ``te.GroupedLinear``, ``te.LayerNorm``, ``te.RMSNorm``,
``te.autocast``, ``te.checkpoint``, ``te.quantized_model_init`` and the recipes in ``te.recipe``.

The names resolve on first use (PEP 562): importing a subpackage
(``transformer_engine_ops.generated.linear``, ``...quantization``) does not import the
modules and, through them, torch's compiler stack.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from . import recipe
    from .modules import (
        GroupedLinear,
        LayerNorm,
        LayerNormLinear,
        LayerNormMLP,
        Linear,
        RMSNorm,
        autocast,
        checkpoint,
        quantized_model_init,
    )
    from .runtime.lowering import inductor_backend

# public name -> the module that defines it
_EXPORTS = {
    "GroupedLinear": ".modules",
    "LayerNorm": ".modules",
    "LayerNormLinear": ".modules",
    "LayerNormMLP": ".modules",
    "Linear": ".modules",
    "RMSNorm": ".modules",
    "autocast": ".modules",
    "checkpoint": ".modules",
    "inductor_backend": ".runtime.lowering",
    "quantized_model_init": ".modules",
}

__all__ = [
    "GroupedLinear",
    "LayerNorm",
    "LayerNormLinear",
    "LayerNormMLP",
    "Linear",
    "RMSNorm",
    "autocast",
    "checkpoint",
    "inductor_backend",
    "quantized_model_init",
    "recipe",
]


def __getattr__(name: str) -> Any:
    if name == "recipe":
        return importlib.import_module(".recipe", __name__)
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
