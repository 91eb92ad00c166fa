"""What every module of this package shares: ``_extra_state`` and TE's constructor
argument conventions.

``_extra_state`` (TE's state-dict key for recipe state) is kept by
``modules/_extra_state.py``: an empty uint8 tensor for a module without scaling state,
the module's delayed-scaling state otherwise. ``ExtraStateMixin`` gives a module those
``get_extra_state``/``set_extra_state`` methods.
"""

from __future__ import annotations

from typing import Any

import torch

from . import _extra_state
from .autocast import RecipeQuantizers


class ExtraStateMixin:
    """``get_extra_state``/``set_extra_state`` with TE's ``_extra_state`` key, and the
    module's own quantizers where the active recipe keeps state (delayed scaling)."""

    def get_extra_state(self) -> Any:
        return _extra_state.get_extra_state(self)  # type: ignore[arg-type]

    def set_extra_state(self, state: Any) -> None:
        _extra_state.set_extra_state(self, state)  # type: ignore[arg-type]

    def _recipe_quantizers(self, shared: RecipeQuantizers | None) -> RecipeQuantizers | None:
        """``shared`` for a stateless recipe (or none); this module's stateful quantizers
        under delayed scaling (such a recipe runs eagerly, so this is never traced)."""
        if shared is None or shared.compile_blocker is None:
            return shared
        return _extra_state.module_quantizers(self, shared)  # type: ignore[arg-type]


# --- constructor arguments --------------------------------------------------------


def reject_unimplemented(cls: str, **given: tuple[Any, Any]) -> None:
    """Raise naming every TE argument given a value other than its default
    (``name=(value, default)``) that this module does not implement."""
    bad = [f"{name}={value!r}" for name, (value, default) in given.items() if value != default]
    if bad:
        raise NotImplementedError(
            f"{cls}: not implemented by transformer_engine_ops: {', '.join(bad)} "
            "(leave these at TE's defaults)"
        )


def te_default_init(weight: torch.Tensor) -> None:
    """TE's default weight init (``init_method_normal(0.023)``)."""
    torch.nn.init.normal_(weight, mean=0.0, std=0.023)


def tp_rank(tp_group: Any, tp_size: int) -> int:
    return tp_group.rank() if tp_group is not None and tp_size > 1 else 0


def full_then_shard(
    shape: tuple[int, ...],
    dim: int,
    parts: int,
    rank: int,
    init: Any,
    dtype: torch.dtype,
    device: Any,
) -> torch.Tensor:
    """Build the full tensor (so every rank draws the same values from ``init``) and
    keep this rank's ``1/parts`` slice along ``dim``."""
    full = torch.empty(shape, dtype=dtype, device=device)
    init(full)
    if parts == 1:
        return full
    local = shape[dim] // parts
    return full.narrow(dim, rank * local, local).clone()
