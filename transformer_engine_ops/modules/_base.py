"""What every module of this package shares: ``_extra_state`` and TE's constructor
argument conventions.

``_extra_state`` (TE's state-dict key for recipe state) is kept by
``modules/_extra_state.py``: an empty uint8 tensor for a module without scaling state,
the module's delayed-scaling state otherwise. ``ExtraStateMixin`` gives a module those
``get_extra_state``/``set_extra_state`` methods, and the parameter life cycle TE's
GEMM modules share: ``quantized_model_init`` weights (with their high-precision init
values when asked), the pieces of ``reset_parameters`` and ``set_tensor_parallel_group``.
"""

from __future__ import annotations

import dataclasses
import types
import warnings
from typing import Any

import torch
from torch.compiler import is_compiling

from ..quantization.quantizer import QuantizedTensor
from ..quantization.recipes import DelayedScalingRequest, QuantizerRequest, compatible_recipe
from ..runtime._torch_private import current_graph_task_id
from ..runtime.boundary import registered_group
from ..runtime.fallback import run_eagerly
from . import _extra_state
from .autocast import (
    STATE,
    CalibrationQuantizers,
    GemmRoles,
    RecipeQuantizers,
    custom_quantizers,
)

_UNSET = object()


class OpSetting:
    """A module attribute every call hands its op (tensor parallelism, features, wgrad
    flags, ...), kept with the module's other such settings in one tuple,
    ``module._op_settings``, which its forward reads at once (in the order of the class's
    ``OP_SETTINGS``). Under torch.compile a tuple of plain values is guarded as one
    constant, one check a layer and call, where each attribute read is guarded on its own
    (two or three checks each; docs/design.md, "What a compiled call is guarded on").
    Assigning the attribute rebuilds the tuple, so a forward never reads a stale value.
    Installed by :func:`with_op_settings`."""

    def __init__(self, name: str, index: int, count: int) -> None:
        self.name, self.index, self.count = name, index, count

    def __get__(self, module: Any, owner: type | None = None) -> Any:
        if module is None:
            return self
        value = module.__dict__.get("_op_settings", ())[self.index : self.index + 1]
        if not value or value[0] is _UNSET:
            raise AttributeError(f"{type(module).__name__}.{self.name} is not set")
        return value[0]

    def __set__(self, module: Any, value: Any) -> None:
        settings = module.__dict__.get("_op_settings") or (_UNSET,) * self.count
        i = self.index
        module.__dict__["_op_settings"] = (*settings[:i], value, *settings[i + 1 :])


def with_op_settings(cls: type) -> type:
    """Class decorator: an :class:`OpSetting` for each name of ``cls.OP_SETTINGS``, in
    that order (the order ``forward`` unpacks ``_op_settings`` in)."""
    names = cls.OP_SETTINGS  # type: ignore[attr-defined]
    for index, name in enumerate(names):
        setattr(cls, name, OpSetting(name, index, len(names)))
    return cls


class GemmScalingState:
    """Holds the delayed-scaling state of one further GEMM of a module (LayerNormMLP's
    fc2), kept apart from the module's first GEMM as TE keeps one set of FP8 metadata
    per GEMM."""


def forward_recipe(module: Any) -> RecipeQuantizers | None:
    """The recipe ``module``'s forward runs under: the calling thread's active one,
    recorded on the module (eagerly); in the recompute of an activation-checkpointed
    region (a forward run by a backward pass, outside the ``autocast`` that wrapped the
    original forward) the one the original forward recorded, so the recompute quantizes
    as the forward did. Under torch.compile the recompute is traced with the forward's
    quantizers as graph constants, so nothing is recorded there. Eagerly, a forward
    under a recipe of another type than the module's last quantized forward warns as
    TE's does (a compiled call, which records nothing, does not). (A function, not a
    method: a method looked up on each layer is guarded, per layer and call, as absent
    from its ``__dict__``; the recipe read from its cell, not through the
    ``STATE.autocast`` property, whose getter a compiled call guards.)"""
    active = STATE.autocast_cell[0]
    if is_compiling():
        return active
    state = module.__dict__
    if active is None:
        if current_graph_task_id() != -1:
            return state.get("_teops_forward_recipe")
    else:
        kind = type(active.recipe)
        if state.get("_teops_recipe_type", kind) is not kind:
            _recipe_type_changed(state, kind)
        state["_teops_recipe_type"] = kind
        _check_weight_recipes(module, active.recipe)
    state["_teops_forward_recipe"] = active
    return active


def _check_weight_recipes(module: Any, recipe: Any) -> None:
    """TE's check that each ``quantized_model_init`` weight suits the active recipe:
    its quantizer's recipe class (``recipes.compatible_recipe``) must be the recipe's
    class or a base of it; a weight made under another recipe raises TE's error. A
    ``CustomRecipe`` is not checked: its factory chooses each role's format, so any
    format's weight may be its (TE's check knows the built-in recipes only)."""
    if recipe.custom():
        return
    for name, param in module._parameters.items():
        if isinstance(param, QuantizedTensor):
            compatible = compatible_recipe(param._quantizer)
            if compatible is not None and not isinstance(recipe, compatible):
                raise RuntimeError(
                    f"Recipe mismatch for '{name}': tensor supports recipe "
                    f"{compatible.__name__}, but got {type(recipe).__name__}. Please check the "
                    "recipes assigned during quantized_model_init() and autocast() calls."
                )


def _recipe_type_changed(state: dict[str, Any], kind: type) -> None:
    """TE's warning when a module runs under a recipe of another type than its last
    quantized forward (neither class a subclass of the other). TE drops the module's
    cached weights then; here a kept weight is read only by its own quantizer
    (``WeightWorkspace.read``), so a copy of the old recipe is never used."""
    last = state["_teops_recipe_type"]
    if not (issubclass(kind, last) or issubclass(last, kind)):
        warnings.warn(
            f"Recipe type changed from {last.__name__} to {kind.__name__}. "
            "This may affect model behavior.",
            stacklevel=3,
        )


class ExtraStateMixin:
    """``get_extra_state``/``set_extra_state`` with TE's ``_extra_state`` key, the recipe
    a forward runs under (recorded for the recompute of activation checkpointing), and
    the module's own quantizers where the active recipe keeps state (delayed scaling).

    A module with more than one GEMM names the further ones in ``further_gemms``; each
    keeps its own scaling state, saved in the ``_extra_state`` dict under its name
    (the first GEMM's state is the dict itself, as for a one-GEMM module)."""

    further_gemms: tuple[str, ...] = ()
    # TE's QuantizerRole.module_type of this module's GEMMs (CustomRecipe factories see it).
    quantizer_module_type: str = "linear"

    def get_extra_state(self) -> Any:
        state = _extra_state.get_extra_state(self)  # type: ignore[arg-type]
        if isinstance(state, dict):
            for gemm in self.further_gemms:
                state[gemm] = _extra_state.get_extra_state(self._scaling_owner(gemm))
        return state

    def set_extra_state(self, state: Any) -> None:
        if isinstance(state, dict):
            _extra_state.check_gemm_entries(type(self).__name__, state, self.further_gemms)
        # Every GEMM's state is read and checked before any is installed: a bad entry
        # leaves the module's scaling state as it was.
        cls = type(self).__name__
        loaded = [(self, _extra_state.read_extra_state(state, cls))]
        if isinstance(state, dict):
            for gemm in self.further_gemms:
                owner = self._scaling_owner(gemm)
                loaded.append((owner, _extra_state.read_extra_state(state.get(gemm), cls, gemm)))
        for owner, scaling in loaded:
            before = _extra_state.scaling_state(owner)
            _extra_state.install(owner, scaling)
            after = _extra_state.scaling_state(owner)
            if before is not None and after is not before:
                self._rebind_weights(before, after, warn=False)

    def _scaling_owner(self, gemm: str | None) -> Any:
        """What keeps the scaling state of ``gemm`` (None: the first GEMM, the module)."""
        if gemm is None:
            return self
        if gemm not in self.further_gemms:
            raise ValueError(f"{type(self).__name__}: no GEMM named {gemm!r}")
        key = f"_teops_scaling_{gemm}"
        owner = self.__dict__.get(key)
        if owner is None:
            owner = self.__dict__[key] = GemmScalingState()
        return owner

    def _stateful_quantizers(
        self, shared: RecipeQuantizers | None, gemm: str | None = None
    ) -> RecipeQuantizers | None:
        """``shared`` for a stateless recipe (or none); the stateful quantizers of this
        module's ``gemm`` under delayed scaling (such a recipe runs eagerly); a
        CustomRecipe's quantizers for this GEMM's roles."""
        if shared is not None and shared.recipe.custom():
            made = self._role_quantizers(shared, gemm)
            if not made.requested:  # type: ignore[union-attr]
                return made
            if torch.compiler.is_compiling():
                reason = made.compile_blocker  # type: ignore[union-attr]
                return run_eagerly(reason, self._answer_requests, made, gemm)
            return self._answer_requests(made, gemm)  # type: ignore[arg-type]
        if shared is None or shared.compile_blocker is None:
            return shared
        if torch.compiler.is_compiling():
            # The state lives on the module, outside any graph: made or fetched eagerly
            # (behind a graph break), as the op call that uses it runs eagerly too.
            return run_eagerly(shared.compile_blocker, self._own_quantizers, shared, gemm)
        return self._own_quantizers(shared, gemm)

    def _role_quantizers(
        self, shared: RecipeQuantizers | None, gemm: str | None = None
    ) -> RecipeQuantizers | None:
        """Under a CustomRecipe, the quantizers its ``qfactory`` returns for the roles of
        this module's ``gemm`` (:meth:`_quantizer_roles`); ``shared`` otherwise."""
        if shared is None or not shared.recipe.custom():
            return shared
        roles = self._quantizer_roles(gemm)
        if shared.roles == roles:
            return shared  # already this GEMM's (and its requests answered)
        if shared.compile_blocker is not None and torch.compiler.is_compiling():
            return run_eagerly(shared.compile_blocker, custom_quantizers, shared, roles)
        return custom_quantizers(shared, roles)

    def _quantizer_roles(self, gemm: str | None) -> GemmRoles:
        """TE 2.20.2's ``get_quantizer_roles`` for ``gemm`` (input, weight, output,
        grad_output, grad_input): ``(module_type, tensor_type, name)`` with the module's
        ``name``, None where TE asks with None (the module's output and input gradient).
        LayerNormMLP's GEMMs are named ``<name>.fc1``/``<name>.fc2`` (``fc1``/``fc2``
        unnamed), and their inner boundary takes its consumer's role: fc1's output is
        fc2's input, fc2's input gradient is fc1's output gradient."""
        kind, name = self.quantizer_module_type, getattr(self, "name", None) or ""
        if self.further_gemms != ("fc2",):
            return (
                (kind, "input", name),
                (kind, "weight", name),
                None,
                (kind, "grad_output", name),
                None,
            )
        fc1, fc2 = (f"{name}.fc1", f"{name}.fc2") if name else ("fc1", "fc2")
        if gemm is None:
            return (
                (kind, "input", fc1),
                (kind, "weight", fc1),
                (kind, "input", fc2),
                (kind, "grad_output", fc1),
                None,
            )
        return (
            (kind, "input", fc2),
            (kind, "weight", fc2),
            None,
            (kind, "grad_output", fc2),
            (kind, "grad_output", fc1),
        )

    def _own_quantizers(self, shared: RecipeQuantizers, gemm: str | None) -> RecipeQuantizers:
        owner = self._scaling_owner(gemm)
        before = _extra_state.scaling_state(owner)
        made = _extra_state.module_quantizers(owner, shared)
        after = _extra_state.scaling_state(owner)
        if before is not None and after is not before:
            self._rebind_weights(before, after, warn=True)
        return made

    def _answer_requests(self, made: RecipeQuantizers, gemm: str | None) -> RecipeQuantizers:
        """A CustomRecipe's quantizers of ``gemm`` with each ``DelayedScalingRequest``
        answered by this GEMM's own delayed-scaling quantizer of that role, the state
        ``DelayedScaling`` with the request's arguments keeps (TE's CustomRecipeState
        does the same; it is saved in ``_extra_state`` as that recipe's)."""
        slots = ("input", "weight", "output", "grad_output", "grad_input", "grad_weight")
        asked = {slot: getattr(made, slot) for slot in slots}
        requests = {q for q in asked.values() if isinstance(q, QuantizerRequest)}
        cls = type(self).__name__
        if len(requests) != 1:
            raise ValueError(
                f"{cls}: the DelayedScalingRequests a CustomRecipe factory returns for one "
                f"GEMM must be equal (TE's rule); got {sorted(map(repr, requests))}"
            )
        (request,) = requests
        if not isinstance(request, DelayedScalingRequest):
            raise NotImplementedError(
                f"{cls}: a CustomRecipe factory returned a {type(request).__name__}; "
                "transformer_engine_ops answers DelayedScalingRequest only"
            )
        owner = self._scaling_owner(gemm)
        before = _extra_state.scaling_state(owner)
        state = _extra_state.scaling_state_for(owner, request.recipe())
        if before is not None and state is not before:
            self._rebind_weights(before, state, warn=True)
        answered = {
            slot: state.quantizers[slot]
            for slot, q in asked.items()
            if isinstance(q, QuantizerRequest)
        }
        return dataclasses.replace(made, **answered)

    def _rebind_weights(self, old: Any, new: Any, *, warn: bool) -> None:
        """The ``quantized_model_init`` weights that requantize with ``old``'s weight
        quantizer (a GEMM's delayed-scaling state, now replaced by ``new``) take
        ``new``'s, as TE's ``_update_weight_quantizers`` does when the recipe changes;
        TE's warning says so (not on loading a state dict, where TE copies in place)."""
        old_state = old.quantizers["weight"]._state
        for param in self._parameters.values():
            if (
                isinstance(param, QuantizedTensor)
                and getattr(param._quantizer, "_state", None) is old_state
            ):
                if warn:
                    param.update_quantizer(new.quantizers["weight"])
                else:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        param.update_quantizer(new.quantizers["weight"])

    def _split_calibration(
        self, active: RecipeQuantizers | None
    ) -> tuple[RecipeQuantizers | None, list[Any] | None]:
        """``(the recipe this forward quantizes with, the calibration quantizers)``.
        Under ``autocast(enabled=False, calibrating=True)`` (TE's calibration) the
        forward quantizes nothing and each GEMM's input and weight quantizers (this
        module's own under delayed scaling, in GEMM order) record what they would
        quantize; otherwise ``(active, None)``. Calibration runs eagerly (the state it
        writes is the module's)."""
        if not isinstance(active, CalibrationQuantizers):
            return active, None
        if is_compiling():
            return None, run_eagerly(active.compile_blocker, self._calibration_quantizers, active)
        return None, self._calibration_quantizers(active)

    def _calibration_quantizers(self, active: RecipeQuantizers) -> list[Any]:
        made: list[Any] = []
        for gemm in (None, *self.further_gemms):
            q = self._stateful_quantizers(active, gemm)
            made += [q.input, q.weight]  # type: ignore[union-attr]
        return made

    def _recipe_quantizers(self) -> RecipeQuantizers | None:
        """The quantizers of this forward's (first) GEMM: :func:`forward_recipe`'s,
        made stateful per module under delayed scaling."""
        return self._stateful_quantizers(forward_recipe(self))

    def _initial_weight(
        self, init: RecipeQuantizers, weight: torch.Tensor, gemm: str | None = None
    ) -> Any:
        """``weight`` quantized under ``quantized_model_init``. Delayed scaling: with the
        GEMM's own weight quantizer, its scale seeded from the weight's amax (a scale of 1
        flushes small weights to zero or subnormals). As TE's, the columnwise data (the
        backward's) is made only with gradients enabled: a module built under
        ``torch.no_grad()`` or ``torch.inference_mode()`` holds rowwise weights only."""
        self.__dict__["_teops_model_init"] = init  # for reset_parameters
        if init.recipe.custom():
            quantizer = self._stateful_quantizers(init, gemm).weight  # type: ignore[union-attr]
            if quantizer is None:  # the factory's IdentityQuantizer: not quantized
                return weight
        else:
            quantizer = _extra_state.module_weight_quantizer(self._scaling_owner(gemm), init)
        quantizer = quantizer.with_usage(rowwise=True, columnwise=torch.is_grad_enabled())
        if weight.device.type == "meta":
            # Nothing to quantize yet (``to_empty`` then ``reset_parameters`` fills it).
            return quantizer.with_internal(False).make_empty(
                weight.shape, dtype=weight.dtype, device=weight.device
            )
        if getattr(quantizer, "owns_state", False):  # delayed scaling
            quantizer.observe(weight)
        quantized = quantizer.with_internal(False).quantize(weight)
        if STATE.preserve_init_val:
            # Attached when the module registers the parameter (a Parameter is a new
            # object): the weights are registered in the order they were quantized.
            self.__dict__.setdefault("_teops_pending_init_vals", []).append(
                weight.detach().to("cpu", copy=True)
            )
        return quantized

    def register_parameter(self, name: str, param: Any) -> None:
        """``nn.Module.register_parameter``; a quantized weight built under
        ``quantized_model_init(preserve_high_precision_init_val=True)`` gets TE's
        ``get_high_precision_init_val``/``clear_high_precision_init_val``."""
        super().register_parameter(name, param)  # type: ignore[misc]
        pending = self.__dict__.get("_teops_pending_init_vals")
        if pending and isinstance(param, QuantizedTensor):
            _keep_high_precision_init_val(param, pending.pop(0))

    def _apply(self, fn: Any, recurse: bool = True) -> Any:
        """``nn.Module._apply`` (``.to``, ``.cuda()``, ``.cpu()``, ``.half()``, ...), keeping
        what was attached to a quantized parameter: torch moves such a parameter with
        ``swap_tensors``, which trades its ``__dict__`` for the converted tensor's, so
        TE's ``get_high_precision_init_val`` and a caller's own attributes would stay
        with the discarded tensor (as in TE, they are attached again)."""
        attached = {
            name: dict(param.__dict__)
            for name, param in self._parameters.items()
            if isinstance(param, QuantizedTensor)
        }
        out = super()._apply(fn, recurse)  # type: ignore[misc]
        for name, before in attached.items():
            param = self._parameters.get(name)
            if param is None:
                continue
            for key, value in before.items():
                if key in param.__dict__:
                    continue  # the converted tensor's own state
                if isinstance(value, types.MethodType) and isinstance(value.__self__, torch.Tensor):
                    value = types.MethodType(value.__func__, param)  # read the kept parameter
                param.__dict__[key] = value
        return out

    def set_tensor_parallel_group(self, tp_group: Any) -> None:
        """TE's: the tensor-parallel group the module communicates over from now on
        (Megatron builds its modules before its groups). The weights are sharded for
        ``tp_size`` ranks, so the group must have that many (None: only where the module
        needs no group, ``tp_size == 1``); the shard held stays the one built (call
        ``reset_parameters()`` to draw this rank's)."""
        cls = type(self).__name__
        tp_size = self.tp_size  # type: ignore[attr-defined]
        if tp_group is None:
            if tp_size > 1:
                raise ValueError(
                    f"{cls}.set_tensor_parallel_group: tp_size={tp_size} needs a group"
                )
        else:
            size = registered_group(tp_group, f"{cls}.tp_group").size()
            if size != tp_size:
                raise ValueError(
                    f"{cls}.set_tensor_parallel_group: a group of {size} ranks for a module "
                    f"sharded over tp_size={tp_size}"
                )
        self.tp_group = tp_group

    # ----- reset_parameters -----

    def _reset_weight(self, name: str, fresh: torch.Tensor, gemm: str | None = None) -> None:
        """Put ``fresh`` (this rank's newly initialised plain weight) into parameter
        ``name``: in place into a plain parameter of its device, dtype and shape (an
        optimizer keeps its reference); otherwise, as TE's ``reset_parameters``, as a new
        parameter, quantized again when the module was built under
        ``quantized_model_init`` (after ``to_empty`` the weight is a plain empty tensor)."""
        current = getattr(self, name)
        init = self.__dict__.get("_teops_model_init")
        if (
            init is None
            and type(current) in (torch.Tensor, torch.nn.Parameter)
            and (current.device, current.dtype, current.shape)
            == (fresh.device, fresh.dtype, fresh.shape)
        ):
            with torch.no_grad():
                current.copy_(fresh)
            return
        value = fresh if init is None else self._initial_weight(init, fresh, gemm)
        setattr(self, name, torch.nn.Parameter(value, requires_grad=current.requires_grad))

    def _reset_filled(self, names: tuple[str, ...], value: float) -> None:
        """Fill the parameters ``names`` (None ones skipped) with ``value`` in place."""
        with torch.no_grad():
            for name in names:
                param = getattr(self, name)
                if param is not None:
                    param.fill_(value)


def _get_high_precision_init_val(param: Any) -> torch.Tensor | None:
    return getattr(param, "_high_precision_init_val", None)


def _clear_high_precision_init_val(param: Any) -> None:
    param._high_precision_init_val = None


def _keep_high_precision_init_val(param: Any, value: torch.Tensor) -> None:
    """TE's attributes of a weight quantized with its high-precision value kept."""
    param._high_precision_init_val = value
    param.get_high_precision_init_val = types.MethodType(_get_high_precision_init_val, param)
    param.clear_high_precision_init_val = types.MethodType(_clear_high_precision_init_val, param)


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


def check_positive(cls: str, **given: Any) -> None:
    """Raise naming the first argument that is not a positive integer (head counts and
    head dims, which the constructors divide by)."""
    for name, value in given.items():
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{cls}: {name}={value!r}, expected a positive integer")


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
