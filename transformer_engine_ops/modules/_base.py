"""What every module of this package shares with TE's module base: ``_extra_state``.

TE's modules keep their quantization-recipe state under the state-dict key
``<prefix>_extra_state`` (a pickled dict as a uint8 tensor; an empty tensor when the
module holds no state, which is every stateless recipe and every unquantized module).
Modules here hold no recipe state between calls, so they save the empty tensor and
load an empty one (or None); a non-empty state is refused by name rather than dropped.
Modules that do keep state override ``extra_state``/``load_extra_state``.
"""

from __future__ import annotations

from typing import Any

import torch


def empty_extra_state() -> torch.Tensor:
    """The ``_extra_state`` TE writes for a module without recipe state."""
    return torch.empty(0, dtype=torch.uint8)


def check_extra_state(module: torch.nn.Module, state: Any) -> None:
    """Accept what :func:`empty_extra_state` writes (and None, as TE does)."""
    if state is None:
        return
    if isinstance(state, torch.Tensor) and state.numel() == 0:
        return
    raise NotImplementedError(
        f"{type(module).__name__}.set_extra_state: this module keeps no quantization-recipe "
        "state, but the checkpoint's _extra_state is not empty (saved with a stateful recipe "
        "such as DelayedScaling); loading that state is not implemented for this module"
    )


class ExtraStateMixin:
    """``get_extra_state``/``set_extra_state`` with TE's ``_extra_state`` key."""

    def get_extra_state(self) -> torch.Tensor:
        return empty_extra_state()

    def set_extra_state(self, state: Any) -> None:
        check_extra_state(self, state)  # type: ignore[arg-type]


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
