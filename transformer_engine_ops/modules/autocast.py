"""``autocast`` and ``quantized_model_init``: TE's user-facing recipe contexts.

The active recipe is per thread, as ``torch.autocast``'s state and grad mode are: each
context replaces the calling thread's active quantizers on entry and restores the
previous ones on exit, so a context entered on one thread is invisible to the others.
Modules read them from :data:`STATE`.

Entering a context makes the recipe's six quantizers. Recipes are mutable, as TE's
are, so each entry takes a snapshot of the recipe's field values (:func:`recipe_key`)
and makes the quantizers from a new recipe of that value, never from the caller's
object: a change made between two entries reaches the next entry, and nothing made
earlier changes with it. The quantizers of a recipe whose quantizers are stateless
values are made once per snapshot value and shared (a small LRU memo), so the
quantizers derived from them (``Quantizer._derived``) are reused too.

Inside a compiled function Dynamo traces the context: it reads the recipe's fields
(:func:`recipe_key`, so the graph is guarded on each of them and a changed recipe
recompiles), then fetches the quantizers of that value through
:func:`_traced_quantizers_name`, which Dynamo runs for real while tracing
(``assume_constant_result``). Nothing on the traced path takes a lock, calls ``repr`` or
reads a thread id; entering, nesting and leaving a context adds no graph break. A
stateful recipe (delayed scaling), or one that is not a value, runs its region eagerly
behind a graph break naming why (``fullgraph=True`` raises it).

A ``CustomRecipe`` is a value when its ``qfactory`` is a plain function (the graph is
guarded on its identity). Each module asks it for the quantizers of its own roles
(:func:`custom_quantizers`), kept per (recipe value, roles) as the shared ones are, and
fetched the same way while tracing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import math
import threading
import types
import warnings
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import torch.utils.checkpoint

from ..quantization.availability import quantizer_format
from ..quantization.float8 import deferred_scale_updates
from ..quantization.quantizer import Quantizer, value_opaque_reason
from ..quantization.recipes import (
    ROLES,
    CustomRecipe,
    DelayedScaling,
    Float8CurrentScaling,
    QuantizerRequest,
    QuantizerRole,
    Recipe,
)
from ..runtime._torch_private import functorch_transform_active
from ..runtime.fallback import run_eagerly
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

    # The recipe's value these were made from (recipe_key; None: a recipe that is not a
    # value), which a CustomRecipe's per-module quantizers are kept under.
    key: tuple[Any, ...] | None = None

    # The formats these quantizers need of a CUDA device, as (format, what needs it)
    # pairs (availability.recipe_refusal): the recipe's formats, named by the recipe,
    # or, for a CustomRecipe, each role's quantizer's.
    needs: tuple[tuple[str, str], ...] = ()

    # A CustomRecipe's factory answered some role with a QuantizerRequest, which each
    # module answers with a stateful quantizer of its own (modules/_base.py).
    requested: bool = False
    # The GEMM roles a CustomRecipe's quantizers were asked for (None: the recipe's own).
    roles: GemmRoles | None = None

    @classmethod
    def from_recipe(cls, recipe: Recipe) -> RecipeQuantizers:
        """The quantizers of ``recipe``'s current value. A dataclass of values
        (:func:`recipe_key`) is snapshotted: the quantizers, and their ``recipe``, are
        made from a new recipe of that value (constructing it checks the values again,
        also those assigned since), and shared by every equal value while the memo holds
        them if they are stateless (no ``compile_blocker``; delayed scaling's keep state
        and are never shared). Any other recipe is read as it is, afresh each time."""
        key = recipe_key(recipe)
        if key is None:
            return cls._make(recipe)
        return _shared_quantizers(key)

    @classmethod
    def _make(cls, recipe: Recipe, key: tuple[Any, ...] | None = None) -> RecipeQuantizers:
        if isinstance(recipe, CustomRecipe):
            # Each module asks the factory with its own GEMMs' roles (custom_quantizers),
            # and only then, as TE's modules do: the recipe itself asks nothing.
            quantizers = [None] * len(ROLES)
        else:
            # Sealed: shared by every module (and graph) of this recipe value.
            quantizers = [_sealed(recipe.make_quantizer(role)) for role in ROLES]
        blocker = None
        if isinstance(recipe, CustomRecipe) and key is None:
            blocker = (
                f"CustomRecipe.qfactory is a {type(recipe.qfactory).__name__}: a compiled "
                "graph is guarded on the factory's identity, which takes a plain function "
                "(def or lambda)"
            )
        blocker = _blocker(recipe, dict(zip(ROLES, quantizers, strict=True))) or blocker
        fprop, dgrad, wgrad = recipe.gemm_configs()
        return cls(
            recipe,
            *quantizers,
            compile_blocker=blocker,
            fprop_gemm=fprop,
            dgrad_gemm=dgrad,
            wgrad_gemm=wgrad,
            backward_override=getattr(recipe, "backward_override", None),
            key=key,
            needs=_needs(recipe, dict(zip(ROLES, quantizers, strict=True))),
            requested=any(isinstance(q, QuantizerRequest) for q in quantizers),
        )


# Why a calibrating region runs eagerly (TE's autocast(enabled=False, calibrating=True)).
CALIBRATION_REASON = (
    "te.autocast(calibrating=True) records amaxes into the modules' own delayed-scaling "
    "state, which lives outside any graph"
)


@dataclass(frozen=True)
class CalibrationQuantizers(RecipeQuantizers):
    """A recipe's quantizers under ``autocast(enabled=False, calibrating=True)``: the
    modules quantize nothing, and each GEMM's input and weight quantizers record what
    they would quantize (``calibrate``: delayed scaling's amax), as TE's calibration."""

    @classmethod
    def of(cls, made: RecipeQuantizers) -> CalibrationQuantizers:
        fields = {f.name: getattr(made, f.name) for f in dataclasses.fields(made)}
        fields["compile_blocker"] = CALIBRATION_REASON
        return cls(**fields)


def _sealed(quantizer: Any) -> Any:
    """A recipe's new quantizer, sealed (a CustomRecipe slot may hold a request or None)."""
    return quantizer._seal() if isinstance(quantizer, Quantizer) else quantizer


def _blocker(recipe: Recipe, quantizers: dict[str, Any]) -> str | None:
    """Why ``quantizers`` (by role) cannot be graph constants, or None."""
    for role, quantizer in quantizers.items():
        reason = value_opaque_reason(quantizer)
        if reason is not None:
            return (
                f"{type(recipe).__name__}: the {role} quantizer "
                f"{type(quantizer).__name__} is not value-opaque ({reason})"
            )
    return None


def _needs(recipe: Recipe, quantizers: dict[str, Quantizer]) -> tuple[tuple[str, str], ...]:
    """The formats ``quantizers`` (by role) need of a CUDA device: each once, named by
    the recipe for a built-in one, by the role and quantizer class for a CustomRecipe,
    whose factory may answer each role with another format."""
    needs: dict[str, str] = {}
    name = type(recipe).__name__
    for role, quantizer in quantizers.items():
        fmt = quantizer_format(quantizer)
        if fmt is not None and fmt not in needs:
            what = type(quantizer).__name__
            custom = isinstance(recipe, CustomRecipe)
            needs[fmt] = f"{name} (its {role} quantizer {what})" if custom else name
    return tuple(needs.items())


# The memo of shared quantizers: recipe_key(recipe) -> the quantizers of that value
# (holding a snapshot recipe of that value, which no caller holds), least recently used
# first. Keys are values (nested tuples of constants): equal recipes share, and a recipe
# changed in place has another key.
_MEMO: OrderedDict[tuple[Any, ...], RecipeQuantizers] = OrderedDict()
_MEMO_LOCK = threading.Lock()
_MEMO_SIZE = 16


def _shared_quantizers(key: tuple[Any, ...]) -> RecipeQuantizers:
    """The memo's quantizers for the recipe value ``key``, made from a snapshot recipe
    of that value and kept when they are missing and stateless."""
    with _MEMO_LOCK:
        made = _MEMO.get(key)
        if made is not None:
            _MEMO.move_to_end(key)
            return made
    made = RecipeQuantizers._make(_value_of_key(key), key)
    if made.compile_blocker is None:
        with _MEMO_LOCK:
            _MEMO[key] = made
            if len(_MEMO) > _MEMO_SIZE:
                _MEMO.popitem(last=False)
    return made


# --- a recipe as a value -------------------------------------------------------------

# The largest magnitude up to which every int is exactly a float (a key holds ints as
# floats, below).
_EXACT_INT = 2**53


def recipe_key(recipe: Any) -> tuple[Any, ...] | None:
    """``recipe``'s value as nested tuples of constants: ``(class, ((field, key), ...))``
    for a dataclass, each field's value keyed the same way: ``(type, value)`` for None,
    a bool, a str or an Enum member; ``(int, float(value))`` for an int (up to 2**53);
    ``(float, value, sign)`` for a float (-0.0 == 0.0, but the two encode differently);
    ``(tuple, keys)`` for a tuple; ``(FunctionType, function)`` for a plain function (a
    CustomRecipe's ``qfactory``: Dynamo guards on its identity). None when some value is
    anything else (a list, another callable, an arbitrary object), or the recipe is not
    a dataclass.

    Dynamo traces it, guarding the graph on every field it reads. A number read from an
    argument may reach it symbolic (Dynamo makes a number that changed between calls
    dynamic): ``float.__float__`` must return a Python float, which makes Dynamo
    specialize the number, and guard on it, where ``int``'s conversions do not."""
    kind = type(recipe)
    if recipe is None or kind is bool or kind is str or isinstance(recipe, enum.Enum):
        return (kind, recipe)
    if kind is int:
        if not -_EXACT_INT <= recipe <= _EXACT_INT:
            return None
        return (int, float(recipe).__float__())
    if kind is float:
        value = recipe.__float__()
        return (float, value, math.copysign(1.0, value))
    if kind is types.FunctionType:
        return (types.FunctionType, recipe)
    if kind is tuple:
        items = []
        for item in recipe:
            key = recipe_key(item)
            if key is None:
                return None
            items.append(key)
        return (tuple, tuple(items))
    if not dataclasses.is_dataclass(recipe) or isinstance(recipe, type):
        return None
    fields = []
    for field in dataclasses.fields(recipe):
        key = recipe_key(getattr(recipe, field.name))
        if key is None:
            return None
        fields.append((field.name, key))
    return (kind, tuple(fields))


def _unkeyable_part(recipe: Any, path: str) -> str:
    """Where ``recipe`` holds what :func:`recipe_key` cannot key, in words (only asked
    after it returned None)."""
    if not dataclasses.is_dataclass(recipe) or isinstance(recipe, type):
        return f"{path} is a {type(recipe).__name__}"
    for field in dataclasses.fields(recipe):
        value = getattr(recipe, field.name)
        if recipe_key(value) is None:
            return _unkeyable_part(value, f"{path}.{field.name}")
    return path


def _value_of_key(key: tuple[Any, ...]) -> Any:
    """The value :func:`recipe_key` made ``key`` of (a new, equal object)."""
    kind = key[0]
    if kind is tuple:
        return tuple(_value_of_key(item) for item in key[1])
    if kind is int:
        return int(key[1])
    if not dataclasses.is_dataclass(kind):
        return key[1]
    values = {}
    for name, item in key[1]:
        try:
            values[name] = _value_of_key(item)
        except (TypeError, ValueError, NotImplementedError) as error:
            # A nested recipe value (a QParams) that holds a value assigned since and
            # refused on construction: name the field that holds it.
            raise type(error)(f"{kind.__name__}.{name}: {error}") from None
    init = {f.name for f in dataclasses.fields(kind) if f.init}
    made = kind(**{name: value for name, value in values.items() if name in init})
    for name, value in values.items():
        if name not in init:  # derived on construction, perhaps replaced since
            object.__setattr__(made, name, value)
    return made


class _TracedQuantizers:
    """The quantizers compiled graphs were traced with, one attribute per recipe value
    (``q0``, ``q1``, ...): a traced ``autocast`` reads its quantizers from here, through a
    source Dynamo guards like any global (a constant returned by
    ``assume_constant_result`` has none, and Dynamo cannot guard attribute reads on it).
    Written only while tracing, under :data:`_MEMO_LOCK`; keyed by value, so two traces
    of one value read the same entry and of two values never collide."""


_TRACED = _TracedQuantizers()
_TRACED_NAMES: dict[tuple[Any, ...], str] = {}


@torch.compiler.assume_constant_result
def _traced_quantizers_name(key: tuple[Any, ...] | None) -> str:
    """The attribute of :data:`_TRACED` holding the quantizers of the recipe whose value
    is ``key`` (None: the default recipe). Dynamo runs it for real while tracing and
    keeps the name as a constant; the graph is guarded on the recipe's fields that made
    ``key``."""
    if key is None:
        key = recipe_key(Float8CurrentScaling())
        assert key is not None
    made = _shared_quantizers(key)
    with _MEMO_LOCK:
        name = _TRACED_NAMES.get(key)
        if name is None:
            name = _TRACED_NAMES[key] = f"q{len(_TRACED_NAMES)}"
        setattr(_TRACED, name, made)
    return name


def _quantizers_while_compiling(recipe: Recipe | None) -> RecipeQuantizers | str:
    """``from_recipe`` for code Dynamo traces (None: the default recipe, which traced
    code does not construct: Dynamo cannot build its ``GemmConfig`` defaults), or why
    the recipe cannot be a graph constant."""
    key = None
    if recipe is not None:
        key = recipe_key(recipe)
        if key is None:
            return (
                "te.autocast inside torch.compile takes a recipe that is a dataclass of "
                "values (None, bool, int, float, str, Enum members, tuples and dataclasses "
                "of these), which the compiled graph is guarded on; "
                f"{_unkeyable_part(recipe, type(recipe).__name__)}"
            )
    quantizers = getattr(_TRACED, _traced_quantizers_name(key))
    return quantizers if quantizers.compile_blocker is None else quantizers.compile_blocker


# --- a CustomRecipe's quantizers per module --------------------------------------------

# TE's QuantizerRole of each quantizer of one GEMM, as plain values:
# (module_type, tensor_type, name), or None for a slot TE asks with None. In the order
# input, weight, output, grad_output, grad_input (grad_weight, which no GEMM quantizes,
# takes grad_output's).
GemmRoles = tuple[tuple[str, str, str] | None, ...]

_CUSTOM_MEMO: OrderedDict[tuple[Any, ...], RecipeQuantizers] = OrderedDict()
_CUSTOM_MEMO_SIZE = 256


def custom_quantizers(shared: RecipeQuantizers, roles: GemmRoles) -> RecipeQuantizers:
    """``shared`` (a CustomRecipe's) with the quantizers its ``qfactory`` returns for
    ``roles``: asked once per (recipe value, roles) and kept (a small LRU memo), as TE
    keeps a module's recipe state; a recipe that is not a value asks every time (it runs
    eagerly). Traced, fetched through :func:`_traced_custom_name` like the shared ones."""
    if torch.compiler.is_compiling():
        return getattr(_TRACED, _traced_custom_name(shared.key, roles))
    return _memoized_custom(shared, roles)


def _memoized_custom(shared: RecipeQuantizers, roles: GemmRoles) -> RecipeQuantizers:
    if shared.key is None:
        return _with_roles(shared, roles)
    memo_key = (shared.key, roles)
    with _MEMO_LOCK:
        made = _CUSTOM_MEMO.get(memo_key)
        if made is not None:
            _CUSTOM_MEMO.move_to_end(memo_key)
            return made
    made = _with_roles(shared, roles)
    with _MEMO_LOCK:
        _CUSTOM_MEMO[memo_key] = made
        if len(_CUSTOM_MEMO) > _CUSTOM_MEMO_SIZE:
            _CUSTOM_MEMO.popitem(last=False)
    return made


def _with_roles(shared: RecipeQuantizers, roles: GemmRoles) -> RecipeQuantizers:
    recipe = shared.recipe
    assert isinstance(recipe, CustomRecipe)
    made = [recipe.quantizer_for(None if r is None else QuantizerRole(*r)) for r in roles]
    fields = dict(
        zip(("input", "weight", "output", "grad_output", "grad_input"), made, strict=True)
    )
    blocker = shared.compile_blocker if shared.key is None else _blocker(recipe, fields)
    return dataclasses.replace(
        shared,
        **fields,
        grad_weight=fields["grad_output"],
        needs=_needs(recipe, fields),
        compile_blocker=blocker,
        requested=any(isinstance(q, QuantizerRequest) for q in made),
        roles=roles,
    )


@torch.compiler.assume_constant_result
def _traced_custom_name(key: tuple[Any, ...], roles: GemmRoles) -> str:
    """The attribute of :data:`_TRACED` holding the quantizers of the CustomRecipe value
    ``key`` for ``roles`` (run for real while tracing; the graph is guarded on the
    recipe's fields, its factory's identity and the module's name)."""
    made = _memoized_custom(_shared_quantizers(key), roles)
    memo_key = (key, roles)
    with _MEMO_LOCK:
        name = _TRACED_NAMES.get(memo_key)
        if name is None:
            name = _TRACED_NAMES[memo_key] = f"q{len(_TRACED_NAMES)}"
        setattr(_TRACED, name, made)
    return name


class _State(threading.local):
    """The active recipes of the calling thread, as ``torch.autocast``'s state and grad
    mode are per thread: a context entered on one thread is invisible to the others.

    Each context kind keeps its active quantizers in a one-element list (``[None]``: no
    recipe), which a context replaces on entry and restores on exit (the stack of earlier
    values lives in the context objects); ``autocast``/``model_init`` read and replace
    that element. A list, not an attribute, because of how Dynamo traces it: it replays a
    traced list mutation onto the real list after the graph and before a graph break (so
    eager code after a break sees the recipe), where a traced attribute store on a
    ``threading.local`` is dropped. One element, not a growing stack: a graph guards on
    ``STATE.autocast_cell[0]`` whatever the nesting depth (a stack's top is read by
    position, and its guards would tie a graph to one depth). Guards and replays evaluate
    ``STATE.<cell>`` on the calling thread, so a compiled graph follows that thread's
    recipe.
    """

    def __init__(self) -> None:
        self.autocast_cell: list[RecipeQuantizers | None] = [None]
        self.model_init_cell: list[RecipeQuantizers | None] = [None]
        # quantized_model_init(preserve_high_precision_init_val=True) is open (module
        # construction is eager, so a plain attribute serves).
        self.preserve_init_val = False

    @property
    def autocast(self) -> RecipeQuantizers | None:
        """The quantizers of the innermost ``autocast`` (None outside any)."""
        return self.autocast_cell[0]

    @autocast.setter
    def autocast(self, quantizers: RecipeQuantizers | None) -> None:
        self.autocast_cell[0] = quantizers

    @property
    def model_init(self) -> RecipeQuantizers | None:
        """The quantizers of the innermost ``quantized_model_init`` (None outside any)."""
        return self.model_init_cell[0]

    @model_init.setter
    def model_init(self, quantizers: RecipeQuantizers | None) -> None:
        self.model_init_cell[0] = quantizers


STATE = _State()


class _RecipeScope:
    """Makes a recipe's quantizers (None if disabled) the calling thread's active ones
    (``STATE.<cell>``) inside, and restores the previous ones on exit. A class with
    ``__enter__`` and ``__exit__`` (not a generator) so that Dynamo inlines both into the
    graph's frame."""

    def __init__(
        self,
        cell: str,
        enabled: bool,
        recipe: Recipe | None,
        deferred: bool,
        calibrating: bool = False,
    ) -> None:
        self.cell = cell
        self.enabled = enabled
        # TE's calibration: only a disabled region calibrates (an enabled one quantizes).
        self.calibrating = calibrating and not enabled
        self.recipe = recipe
        self.deferred = deferred  # defer delayed-scaling updates to the outermost exit
        self.previous: RecipeQuantizers | None = None
        self.deferring: contextlib.AbstractContextManager[None] | None = None
        # Set while a region entered eagerly is open: its exit runs eagerly too (the
        # reason of that eager exit under torch.compile, should the exit be traced).
        self.eager_reason: str | None = None

    def __enter__(self) -> None:
        if not torch.compiler.is_compiling():
            self._enter_eagerly()
            return
        if self.calibrating:  # module state: entered eagerly, behind a graph break
            run_eagerly(CALIBRATION_REASON, self._enter_eagerly)
            return
        quantizers = _quantizers_while_compiling(self.recipe) if self.enabled else None
        if isinstance(quantizers, str):
            # A stateful recipe (its scales live outside any graph) or one that is not
            # a value: the region runs eagerly, entered here behind a graph break
            # (fullgraph=True raises, quoting the reason).
            run_eagerly(quantizers, self._enter_eagerly)
            return
        self._activate(quantizers)

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self.eager_reason is None:
            getattr(STATE, self.cell)[0] = self.previous
        elif torch.compiler.is_compiling():
            run_eagerly(self.eager_reason, self._exit_eagerly, kind, error, traceback)
        else:
            self._exit_eagerly(kind, error, traceback)

    def _activate(self, quantizers: RecipeQuantizers | None) -> None:
        cell = getattr(STATE, self.cell)
        self.previous = cell[0]
        cell[0] = quantizers

    def _enter_eagerly(self) -> None:
        quantizers = None
        if self.enabled or self.calibrating:
            _refuse_under_functorch(self.cell)
            recipe = Float8CurrentScaling() if self.recipe is None else self.recipe
            quantizers = RecipeQuantizers.from_recipe(recipe)
            if self.calibrating:
                quantizers = CalibrationQuantizers.of(quantizers)
        if self.deferred:
            self.deferring = deferred_scale_updates()
            self.deferring.__enter__()
        self.eager_reason = (
            "leaving a te.autocast region entered outside the graph"
            if quantizers is None or quantizers.compile_blocker is None
            else quantizers.compile_blocker
        )
        self._activate(quantizers)

    def _exit_eagerly(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        getattr(STATE, self.cell)[0] = self.previous
        self.eager_reason = None
        if self.deferring is not None:
            deferring, self.deferring = self.deferring, None
            deferring.__exit__(kind, error, traceback)


def _refuse_under_functorch(cell: str) -> None:
    """Raise when a torch.func transform (grad, vmap, jacrev, ...) is active: the modules'
    autograd Functions do not define ``setup_context``, which those transforms need."""
    if functorch_transform_active():
        name = "autocast" if cell == "autocast_cell" else "quantized_model_init"
        raise RuntimeError(
            f"te.{name} inside a torch.func transform (grad, vmap, jacrev, jvp, ...) is not "
            "supported: the modules' autograd Functions do not define setup_context, which "
            "torch.func needs; differentiate with torch.autograd (loss.backward(), "
            "torch.autograd.grad) instead"
        )


def autocast(
    enabled: bool = True,
    calibrating: bool = False,
    recipe: Recipe | None = None,
    amax_reduction_group: Any = None,
    _graph: bool = False,
) -> contextlib.AbstractContextManager[None]:
    """Run the modules inside with ``recipe`` (default FP8 current scaling); also inside
    a compiled function, where the graph is guarded on the recipe's fields. TE 2.20.2's
    arguments, in its order:

    ``calibrating`` with ``enabled=False`` (TE's calibration): the modules run
    unquantized, and each GEMM's input and weight quantizers of ``recipe`` (the
    module's own under delayed scaling) record what they would quantize: delayed
    scaling's amax of the operand replaces the current step's (``calibrate``), so the
    history and the saved ``_extra_state`` hold the statistics of a high-precision
    run; no scale is updated at the exit (as in TE, only an enabled region updates).
    Stateless recipes keep no statistics: the run is plain high precision. The region
    runs eagerly under ``torch.compile`` (module state). With ``enabled=True`` it
    changes nothing (the quantized run collects its statistics anyway).

    ``amax_reduction_group``: the group over which delayed scaling reduces its amaxes
    when the region exits. Accepted; the reduction across ranks is not done here (each
    rank keeps its own amax history), so a group of more than one rank under
    ``DelayedScaling`` raises ``NotImplementedError`` instead of letting the ranks'
    scales drift apart; other recipes scale from the current tensor and keep no
    amaxes to reduce.

    ``_graph`` (TE's CUDA-graph capture flag): only its default, False.

    Delayed scaling: each module keeps its own scaling state per tensor role; the
    forward scales update from the amax history when the outermost region exits (TE's
    ``reduce_and_update_fp8_tensors(forward=True)``), the gradient scales at the end of
    each backward pass. Inside a compiled function it is refused (an eager fallback,
    which ``fullgraph=True`` turns into an error naming it).
    """
    _check_autocast_arguments(enabled, recipe, amax_reduction_group, _graph)
    return _RecipeScope("autocast_cell", enabled, recipe, deferred=True, calibrating=calibrating)


def _check_autocast_arguments(
    enabled: bool, recipe: Recipe | None, group: Any, graph: bool
) -> None:
    """Refuse, naming it, what :func:`autocast` does not implement of TE's arguments."""
    if graph:
        raise NotImplementedError(
            "autocast: _graph=True (TE's CUDA-graph capture flag) is not implemented by "
            "transformer_engine_ops; use te.make_graphed_callables"
        )
    delayed = isinstance(recipe, DelayedScaling)
    if group is not None and delayed and group.size() > 1:
        raise NotImplementedError(
            f"autocast: amax_reduction_group of {group.size()} ranks under DelayedScaling "
            "(reducing the amaxes across ranks) is not implemented by "
            "transformer_engine_ops; each rank would keep its own scales"
        )


def quantized_model_init(
    enabled: bool = True,
    recipe: Recipe | None = None,
    preserve_high_precision_init_val: bool = False,
) -> contextlib.AbstractContextManager[None]:
    """Create module weights inside as quantized parameters of ``recipe``.

    ``preserve_high_precision_init_val`` (TE's): each quantized weight also keeps, on
    the CPU, the high-precision value it was quantized from, read with
    ``weight.get_high_precision_init_val()`` (to initialise master weights without the
    quantization's loss) and freed with ``weight.clear_high_precision_init_val()``."""
    scope = _RecipeScope("model_init_cell", enabled, recipe, deferred=False)
    if not preserve_high_precision_init_val:
        return scope
    return _preserving_init_vals(scope)


@contextlib.contextmanager
def _preserving_init_vals(scope: contextlib.AbstractContextManager[None]) -> Any:
    previous = STATE.preserve_init_val
    STATE.preserve_init_val = True
    try:
        with scope:
            yield
    finally:
        STATE.preserve_init_val = previous


def fp8_autocast(
    enabled: bool = True,
    calibrating: bool = False,
    fp8_recipe: Recipe | None = None,
    fp8_group: Any = None,
    _graph: bool = False,
) -> contextlib.AbstractContextManager[None]:
    """TE's deprecated name of :func:`autocast` (``fp8_recipe`` is ``recipe``,
    ``fp8_group`` is ``amax_reduction_group``); warns as TE does."""
    warnings.warn(
        "fp8_autocast is deprecated and will be removed in a future release. "
        "Use autocast(enabled=..., calibrating=..., recipe=..., amax_reduction_group=..., "
        "_graph=...) instead.",
        category=DeprecationWarning,
        stacklevel=2,
    )
    return autocast(
        enabled=enabled,
        calibrating=calibrating,
        recipe=fp8_recipe,
        amax_reduction_group=fp8_group,
        _graph=_graph,
    )


def fp8_model_init(
    enabled: bool = True,
    recipe: Recipe | None = None,
    preserve_high_precision_init_val: bool = False,
) -> contextlib.AbstractContextManager[None]:
    """TE's deprecated name of :func:`quantized_model_init`; warns as TE does."""
    warnings.warn(
        "fp8_model_init is deprecated and will be removed in a future release. "
        "Use quantized_model_init(enabled=..., recipe=..., "
        "preserve_high_precision_init_val=...) instead.",
        category=DeprecationWarning,
        stacklevel=2,
    )
    return quantized_model_init(
        enabled=enabled,
        recipe=recipe,
        preserve_high_precision_init_val=preserve_high_precision_init_val,
    )


def checkpoint(
    function: Callable[..., Any],
    *args: Any,
    distribute_saved_activations: bool = False,
    get_rng_state_tracker: Callable[[], Any] | None = None,
    tp_group: Any = None,
    use_reentrant: bool = True,
    **kwargs: Any,
) -> Any:
    """``torch.utils.checkpoint.checkpoint`` whose recompute runs under the recipe of the
    forward (TE's ``te.checkpoint``, with its keyword arguments; ``use_reentrant``
    defaults to True as there).

    The recipe active at this call is recorded and re-entered around every call of
    ``function``, the forward and the recompute, which the backward runs outside the
    ``autocast`` that wrapped the forward. Use it to checkpoint a compiled module
    (``checkpoint(torch.compile(model), x)``) from eager code: the recompute then meets
    the same recipe guard as the forward and reuses its graph. ``torch.utils.checkpoint``
    itself recomputes the compiled module without a recipe.

    As TE: other keyword arguments go to ``function``; ``get_rng_state_tracker`` returns
    a tracker (``get_states``/``set_states``, Megatron's and TE's
    ``CudaRNGStatesTracker``) whose states the recompute starts from as the forward did,
    and restores afterwards (torch's checkpoint already does so for the default
    generators); ``tp_group`` is read only by ``distribute_saved_activations=True``
    (splitting the saved input over the group), which is not implemented with
    ``use_reentrant=True`` and has no effect without it, as in TE.
    """
    if distribute_saved_activations and use_reentrant:
        raise NotImplementedError(
            "checkpoint: distribute_saved_activations=True (the saved input split over "
            "tp_group) is not implemented by transformer_engine_ops"
        )
    del tp_group  # only read by distribute_saved_activations
    recorded = STATE.autocast
    tracker = get_rng_state_tracker() if get_rng_state_tracker is not None else None
    forward_states = tracker.get_states() if tracker is not None else None
    calls = [0]

    def under_recorded_recipe(*inner_args: Any) -> Any:
        recompute = calls[0] > 0
        calls[0] += 1
        previous = STATE.autocast
        STATE.autocast = recorded
        outer_states = None
        if recompute and tracker is not None:
            outer_states = tracker.get_states()
            tracker.set_states(dict(forward_states))  # a fresh dict per recompute
        try:
            return function(*inner_args, **kwargs)
        finally:
            STATE.autocast = previous
            if outer_states is not None:
                tracker.set_states(outer_states)

    return torch.utils.checkpoint.checkpoint(
        under_recorded_recipe, *args, use_reentrant=use_reentrant
    )
