"""Per-module scaling state of stateful recipes, and its ``_extra_state`` in state dicts.

Delayed scaling (TE's ``DelayedScaling``) derives each tensor's scale from an amax
history. As in TE, that state belongs to a module and a tensor role: a module keeps one
``Float8Quantizer`` per role (``input``, ``weight``, ``output``, ``grad_output``,
``grad_input``, ``grad_weight``), made from the recipe the first time the module runs
under it and kept across ``autocast`` entries, so the history carries from step to step.

Any module reuses it with three small methods::

    def get_extra_state(self):
        return get_extra_state(self)

    def set_extra_state(self, state):
        set_extra_state(self, state)

and calls :func:`module_quantizers` with the autocast's quantizers before using them.

The ``_extra_state`` entry is a dict of plain values and CPU tensors (loadable with
``torch.load(weights_only=True)``)::

    {"format": "transformer_engine_ops.delayed_scaling/1",
     "recipe": {"margin", "fp8_format", "amax_history_len", "amax_compute_algo",
                [the callable "scaling_factor_compute_algo"]},
     "scale_fwd": (3,), "amax_history_fwd": (len, 3),   # input, weight, output
     "scale_bwd": (3,), "amax_history_bwd": (len, 3)}   # grad_output, grad_input, grad_weight

TE's tensor names and layout (one column per role). A module without such state saves an
empty uint8 tensor, as TE does. Loading accepts None and an empty tensor (a TE-shaped
state dict of a stateless module): the module's state is left as it is.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from typing import Any

import torch

from ..quantization.float8 import Float8Quantizer
from ..quantization.recipes import (
    BACKWARD_ROLES,
    FORWARD_ROLES,
    ROLES,
    DelayedScaling,
    Format,
    Recipe,
)
from .autocast import RecipeQuantizers

__all__ = [
    "EXTRA_STATE_FORMAT",
    "ScalingState",
    "get_extra_state",
    "module_quantizers",
    "module_weight_quantizer",
    "scaling_state",
    "scaling_state_for",
    "set_extra_state",
]

EXTRA_STATE_FORMAT = "transformer_engine_ops.delayed_scaling/1"
# Per direction: the (scale, amax history) keys of the state dict and the roles they hold.
_DIRECTIONS = (
    (("scale_fwd", "amax_history_fwd"), FORWARD_ROLES),
    (("scale_bwd", "amax_history_bwd"), BACKWARD_ROLES),
)
_ATTR = "_teops_scaling_state"


class ScalingState:
    """One module's delayed-scaling quantizers, one per tensor role, and a copy of the
    recipe they were made from: recipes are mutable, so the module compares the
    autocast's recipe with this copy by value (never by identity) and rebuilds the
    state when a field changed, in place or not."""

    def __init__(self, recipe: DelayedScaling) -> None:
        self.recipe = copy.deepcopy(recipe)
        self.quantizers: dict[str, Float8Quantizer] = {
            role: recipe.make_quantizer(role)._seal()  # type: ignore[misc]
            for role in ROLES
        }

    def inherit(self, old: ScalingState) -> None:
        """Keep the scale and history of a previous recipe's state where the FP8 format
        is the same, as TE does when a delayed-scaling recipe changes: a shorter history
        keeps its newest rows (TE's ``amax_history[:length]``), a longer one is padded
        with zeros."""
        for role, quantizer in self.quantizers.items():
            previous = old.quantizers[role]
            if previous.fp8_dtype != quantizer.fp8_dtype:
                continue
            history = previous.amax_history[: quantizer.amax_history_len]
            missing = quantizer.amax_history_len - history.shape[0]
            if missing:
                history = torch.cat([history, history.new_zeros(missing)])
            quantizer.load_state(previous.scale, history)

    def to_dict(self) -> dict[str, Any]:
        r = self.recipe
        state: dict[str, Any] = {
            "format": EXTRA_STATE_FORMAT,
            "recipe": {
                "margin": r.margin,
                "fp8_format": r.fp8_format.name,
                "amax_history_len": r.amax_history_len,
                "amax_compute_algo": r.amax_compute_algo,
            },
        }
        if r.scaling_factor_compute_algo is not None:
            # A callable (as a callable amax_compute_algo): the state then pickles with
            # it, as TE's recipe does, and loads without weights_only.
            state["recipe"]["scaling_factor_compute_algo"] = r.scaling_factor_compute_algo
        for (scale_key, history_key), roles in _DIRECTIONS:
            qs = [self.quantizers[role] for role in roles]
            state[scale_key] = torch.cat([q.scale.detach().cpu() for q in qs])
            state[history_key] = torch.stack([q.amax_history.detach().cpu() for q in qs], dim=1)
        return state

    @classmethod
    def from_dict(cls, owner: str, state: dict[str, Any], entry: str = "") -> ScalingState:
        """The state ``to_dict`` saved, checked; ``entry`` prefixes the names of its
        entries in errors (a further GEMM's state sits in the module's dict under its
        name)."""
        try:
            fields = state["recipe"]
            recipe = DelayedScaling(
                margin=fields["margin"],
                fp8_format=Format[fields["fp8_format"]],
                amax_history_len=fields["amax_history_len"],
                amax_compute_algo=fields["amax_compute_algo"],
                scaling_factor_compute_algo=fields.get("scaling_factor_compute_algo"),
            )
            new = cls(recipe)
            for (scale_key, history_key), roles in _DIRECTIONS:
                scale, history = state[scale_key], state[history_key]
                if tuple(scale.shape) != (len(roles),) or tuple(history.shape) != (
                    recipe.amax_history_len,
                    len(roles),
                ):
                    raise ValueError(
                        f"{scale_key} {tuple(scale.shape)} / {history_key} "
                        f"{tuple(history.shape)} do not match amax_history_len="
                        f"{recipe.amax_history_len} and {len(roles)} roles"
                    )
                _check_scales(entry, scale_key, scale, roles)
                for i, role in enumerate(roles):
                    new.quantizers[role].load_state(scale[i : i + 1], history[:, i])
        except (KeyError, TypeError, ValueError) as error:
            raise ValueError(f"{owner}: malformed delayed-scaling _extra_state: {error}") from None
        return new


def _check_scales(entry: str, key: str, scale: torch.Tensor, roles: tuple[str, ...]) -> None:
    """Refuse a scale that is not finite and positive: with a NaN, infinite or zero
    scale the next forward comes out non-finite, without an error (TE loads it as it
    is); a negative one is no scale the update makes. A saved
    state never holds one (the update sets a scale only from a finite, positive amax).
    An amax history may hold non-finite values (an overflowing step records them, and
    the update skips them), so it is loaded as saved."""
    for i, role in enumerate(roles):
        value = float(scale[i])
        if not (math.isfinite(value) and value > 0.0):
            raise ValueError(
                f"{entry}{key}[{i}] (the {role} scale) is {value}; a delayed-scaling "
                "scale must be finite and positive (the update never makes another; a "
                "NaN, infinite or zero scale makes the next forward non-finite)"
            )


def scaling_state(owner: Any) -> ScalingState | None:
    """The delayed-scaling state ``owner`` (a module or a further GEMM's holder) keeps."""
    return owner.__dict__.get(_ATTR)


def module_quantizers(module: torch.nn.Module, shared: RecipeQuantizers) -> RecipeQuantizers:
    """The quantizers ``module`` quantizes with under ``shared``'s recipe: ``shared``
    itself for a stateless recipe, else the module's own stateful ones (made on first use,
    remade when the recipe changes, keeping the state that still fits)."""
    if not shared.recipe.delayed():
        return shared
    state = _scaling_state(module, shared.recipe)
    return dataclasses.replace(shared, **state.quantizers)


def module_weight_quantizer(module: torch.nn.Module, init: RecipeQuantizers) -> Any:
    """The quantizer making ``module``'s weight under ``quantized_model_init``: the
    module's own weight quantizer for delayed scaling (the caller seeds its scale from
    the weight with ``observe``), else the recipe's."""
    if not init.recipe.delayed():
        return init.weight
    return _scaling_state(module, init.recipe).quantizers["weight"]


def scaling_state_for(owner: Any, recipe: DelayedScaling) -> ScalingState:
    """``owner``'s delayed-scaling state for ``recipe`` (made on first use, remade when
    the recipe changes, keeping the state that still fits)."""
    return _scaling_state(owner, recipe)


def _scaling_state(module: torch.nn.Module, recipe: Recipe) -> ScalingState:
    state: ScalingState | None = module.__dict__.get(_ATTR)
    if state is None or state.recipe != recipe:
        new = ScalingState(recipe)  # type: ignore[arg-type]
        if state is not None:
            new.inherit(state)
        module.__dict__[_ATTR] = state = new
    return state


# The keys ``ScalingState.to_dict`` writes; a module's further GEMMs add one key each.
STATE_KEYS = frozenset({"format", "recipe", *(key for keys, _ in _DIRECTIONS for key in keys)})


def check_gemm_entries(owner: str, state: dict[str, Any], further_gemms: tuple[str, ...]) -> None:
    """Refuse a scaling-state dict whose per-GEMM entries are not this module's (one
    saved by a module with another number of GEMMs), before anything is loaded: a
    missing entry would otherwise leave that GEMM's scaling state silently as it was."""
    if state.get("format") != EXTRA_STATE_FORMAT:
        return  # set_extra_state reports it
    missing = [gemm for gemm in further_gemms if gemm not in state]
    unexpected = sorted(str(k) for k in state if k not in STATE_KEYS and k not in further_gemms)
    if missing or unexpected:
        raise ValueError(
            f"{owner}: this _extra_state does not match the module's GEMMs "
            f"{['(first)', *further_gemms]}: missing {missing}, unexpected {unexpected} "
            "(saved by a module with another number of GEMMs?)"
        )


def get_extra_state(module: torch.nn.Module) -> Any:
    """``module``'s scaling state for ``state_dict`` (an empty uint8 tensor if none)."""
    state: ScalingState | None = module.__dict__.get(_ATTR)
    if state is None:
        return torch.empty(0, dtype=torch.uint8)
    return state.to_dict()


def set_extra_state(module: Any, state: Any) -> None:
    """Restore what :func:`get_extra_state` saved. None and an empty tensor (TE's entry
    for a module without scaling state) leave the module as it is."""
    install(module, read_extra_state(state, type(module).__name__))


def read_extra_state(state: Any, owner: str, gemm: str | None = None) -> ScalingState | None:
    """The scaling state ``state`` holds (None: leave the module's as it is), checked;
    errors name ``owner`` (the module's class) and, for a further GEMM's state, the
    GEMM's entry (``fc2.scale_fwd[1]``)."""
    if state is None:
        return None
    if isinstance(state, torch.Tensor):
        if state.numel() == 0:
            return None
        raise ValueError(
            f"{owner}: this _extra_state is a non-empty byte tensor (Transformer Engine's "
            "pickled FP8 metadata); it is not loaded because unpickling runs arbitrary code. "
            "Drop the '_extra_state' entries from the state dict to start the scaling state "
            "afresh"
        )
    if not isinstance(state, dict) or state.get("format") != EXTRA_STATE_FORMAT:
        where = f"{gemm} entry of its " if gemm else ""
        raise ValueError(
            f"{owner}: unrecognised {where}_extra_state {type(state).__name__}; expected "
            f"None, an empty tensor or a dict with format {EXTRA_STATE_FORMAT!r}"
        )
    return ScalingState.from_dict(owner, state, f"{gemm}." if gemm else "")


def install(module: Any, loaded: ScalingState | None) -> None:
    """Make ``loaded`` (from :func:`read_extra_state`) ``module``'s scaling state."""
    if loaded is None:
        return
    current: ScalingState | None = module.__dict__.get(_ATTR)
    if current is not None and current.recipe == loaded.recipe:
        # Into the quantizers in place: a ``quantized_model_init`` weight holds the
        # weight role's quantizer and requantizes with its state after every update.
        current.inherit(loaded)
    else:
        module.__dict__[_ATTR] = loaded
