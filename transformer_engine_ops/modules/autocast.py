"""``autocast`` and ``quantized_model_init``: TE's user-facing recipe contexts.

Entering ``autocast`` makes the recipe's six quantizers once, outside any compiled
region; modules read them from here. Quantizers are value-opaque, so a compiled
graph guards on their equality: the same recipe re-entered reuses the graph, a
changed recipe recompiles.

Entering it every step is cheap: the quantizers of a recipe whose quantizers are
stateless values are made once per recipe value and shared (a small LRU memo), so the
quantizers derived from them (``Quantizer._derived``) are reused too.
"""

from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch.utils.checkpoint

from ..quantization.float8 import deferred_scale_updates
from ..quantization.recipes import ROLES, Float8CurrentScaling, Recipe
from ..runtime.quantizer import Quantizer, value_opaque_reason
from ..runtime.values import GemmConfig


@dataclass(frozen=True)
class RecipeQuantizers:
    """One quantizer per tensor role of a Linear, made from one recipe."""

    recipe: Recipe
    input: Quantizer
    weight: Quantizer
    output: Quantizer
    grad_output: Quantizer
    grad_input: Quantizer
    grad_weight: Quantizer

    # Why these quantizers cannot cross a compiled op boundary (None if they can);
    # decided here, outside any compiled region, because it inspects classes.
    compile_blocker: str | None = None

    # The recipe's GEMM configurations and backward precision mode (TE's
    # fp8_gemm_fprop/dgrad/wgrad and backward_override).
    fprop_gemm: GemmConfig = GemmConfig()
    dgrad_gemm: GemmConfig = GemmConfig()
    wgrad_gemm: GemmConfig = GemmConfig()
    backward_override: str | None = None

    @classmethod
    def from_recipe(cls, recipe: Recipe) -> RecipeQuantizers:
        """The quantizers of ``recipe``: shared by every equal recipe while the memo holds
        them, when the recipe is a hashable frozen dataclass and its quantizers are
        stateless values (no ``compile_blocker``); made afresh otherwise (delayed
        scaling's quantizers keep state and are never shared)."""
        key = _memo_key(recipe)
        if key is None:
            return cls._make(recipe)
        with _MEMO_LOCK:
            made = _MEMO.get(key)
            if made is not None:
                _MEMO.move_to_end(key)
                return made
        made = cls._make(recipe)
        if made.compile_blocker is None:
            with _MEMO_LOCK:
                _MEMO[key] = made
                if len(_MEMO) > _MEMO_SIZE:
                    _MEMO.popitem(last=False)
        return made

    @classmethod
    def _make(cls, recipe: Recipe) -> RecipeQuantizers:
        quantizers = [recipe.make_quantizer(role) for role in ROLES]
        blocker = None
        for role, quantizer in zip(ROLES, quantizers, strict=True):
            reason = value_opaque_reason(quantizer)
            if reason is not None:
                blocker = (
                    f"{type(recipe).__name__}: the {role} quantizer "
                    f"{type(quantizer).__name__} is not value-opaque ({reason})"
                )
                break
        fprop, dgrad, wgrad = recipe.gemm_configs()
        return cls(
            recipe,
            *quantizers,
            compile_blocker=blocker,
            fprop_gemm=fprop,
            dgrad_gemm=dgrad,
            wgrad_gemm=wgrad,
            backward_override=getattr(recipe, "backward_override", None),
        )


# RecipeQuantizers.from_recipe's memo: (recipe, repr(recipe)) -> the shared quantizers,
# least recently used first. The key holds the recipe, so an object its repr names by
# address stays alive and the address is never reused while the entry exists; the repr
# tells apart the one kind of equal recipes whose quantizers differ (a -0.0 float field
# is == 0.0 but encodes, and so guards, as "-0.0").
_MEMO: OrderedDict[tuple[Recipe, str], RecipeQuantizers] = OrderedDict()
_MEMO_LOCK = threading.Lock()
_MEMO_SIZE = 16


def _memo_key(recipe: Recipe) -> tuple[Recipe, str] | None:
    """The memo key of ``recipe``, or None when it may not be memoized: only a frozen
    dataclass (a value: a mutable recipe could change after its quantizers were made)
    whose fields all hash."""
    params = getattr(type(recipe), "__dataclass_params__", None)
    if params is None or not params.frozen:
        return None
    key = (recipe, repr(recipe))
    try:
        hash(key)
    except TypeError:  # an unhashable field value (a list, say)
        return None
    return key


class _State(threading.local):
    """The active recipes of the calling thread, as ``torch.autocast``'s state is per
    thread: a context entered on one thread is invisible to the others.

    torch.compile reads it like any global (it evaluates attributes of a
    ``threading.local``), so a compiled graph guards on the calling thread's value.
    """

    def __init__(self) -> None:
        self.autocast: RecipeQuantizers | None = None
        self.model_init: RecipeQuantizers | None = None


STATE = _State()


@contextlib.contextmanager
def _recipe_scope(field: str, enabled: bool, recipe: Recipe | None) -> Iterator[None]:
    """Set ``STATE.<field>`` to the recipe's quantizers (None if disabled) inside."""
    previous = getattr(STATE, field)
    quantizers = RecipeQuantizers.from_recipe(recipe or Float8CurrentScaling()) if enabled else None
    setattr(STATE, field, quantizers)
    try:
        yield
    finally:
        setattr(STATE, field, previous)


def autocast(
    enabled: bool = True, recipe: Recipe | None = None
) -> contextlib.AbstractContextManager[None]:
    """Run the modules inside with ``recipe`` (default FP8 current scaling).

    Delayed scaling: each module keeps its own scaling state per tensor role; the
    forward scales update from the amax history when the outermost region exits (TE's
    ``reduce_and_update_fp8_tensors(forward=True)``), the gradient scales at the end of
    each backward pass.
    """
    return _autocast_scope(enabled, recipe)


@contextlib.contextmanager
def _autocast_scope(enabled: bool, recipe: Recipe | None) -> Iterator[None]:
    with deferred_scale_updates(), _recipe_scope("autocast", enabled, recipe):
        yield


def quantized_model_init(
    enabled: bool = True, recipe: Recipe | None = None
) -> contextlib.AbstractContextManager[None]:
    """Create module weights inside as quantized parameters of ``recipe``."""
    return _recipe_scope("model_init", enabled, recipe)


def checkpoint(
    function: Callable[..., Any], *args: Any, use_reentrant: bool = True, **kwargs: Any
) -> Any:
    """``torch.utils.checkpoint.checkpoint`` whose recompute runs under the recipe of the
    forward (TE's ``te.checkpoint``; ``use_reentrant`` defaults to True as there).

    The recipe active at this call is recorded and re-entered around every call of
    ``function``, the forward and the recompute, which the backward runs outside the
    ``autocast`` that wrapped the forward. Use it to checkpoint a compiled module
    (``checkpoint(torch.compile(model), x)``) from eager code: the recompute then meets
    the same recipe guard as the forward and reuses its graph. ``torch.utils.checkpoint``
    itself recomputes the compiled module without a recipe. Other keyword arguments go
    to ``torch.utils.checkpoint.checkpoint``.
    """
    recorded = STATE.autocast

    def under_recorded_recipe(*inner_args: Any, **inner_kwargs: Any) -> Any:
        previous = STATE.autocast
        STATE.autocast = recorded
        try:
            return function(*inner_args, **inner_kwargs)
        finally:
            STATE.autocast = previous

    return torch.utils.checkpoint.checkpoint(
        under_recorded_recipe, *args, use_reentrant=use_reentrant, **kwargs
    )
