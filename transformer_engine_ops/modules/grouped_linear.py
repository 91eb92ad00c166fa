"""``GroupedLinear``: TE's ``num_gemms`` Linear layers over consecutive row groups,
through the generated ``grouped_linear`` op.

The constructor takes TE 2.20.2's arguments in TE's order; parameters are TE's
(``weight0``.. ``weight{n-1}``, ``bias0``.. ``bias{n-1}``, plus ``_extra_state``). With
TE's ``single_grouped_weight=True`` (``single_grouped_bias=True``), gated as in TE by
``NVTE_GROUPED_LINEAR_SINGLE_PARAM``, the weights are one parameter ``weight`` of shape
``[num_gemms, out_features, in_features]`` (the biases one ``bias`` ``[num_gemms,
out_features]``; a plain tensor, where TE's is its experimental GroupedTensor), which
the grouped GEMM reads as it is, without stacking the per-GEMM weights each call.
``device=None`` means TE's ``"cuda"`` where CUDA is available, else the CPU
(``modules/_device.py``).
``forward(inp, m_splits)`` takes the rows of each GEMM as an integer tensor or a list of
ints (zeros allowed); a float or bool tensor or list element is refused, not truncated.
A tensor's values never reach the graph, so one compiled graph serves every split; a
list's ints do (dynamo guards on them) unless compiled with ``dynamic=True``.

Two ops serve a call (docs/moe.md): the grouped-GEMM op (``ops/grouped_gemm.py``) for
bf16 and FP8 current scaling where torch has a grouped GEMM for the device (and fp32
grouped GEMMs on the CPU, the loop's numbers): it reads ``m_splits`` on the device
(a list becomes a tensor there), so no call synchronizes and CUDA graphs capture it;
and the per-GEMM loop (the ``grouped_linear`` op) for every other recipe and feature,
which reads ``m_splits`` on the host and runs outside CUDA graphs. ``use_grouped_tensor``
takes TE's values (``None``: TE's deprecated ``NVTE_GROUPED_LINEAR_USE_FUSED_GROUPED_GEMM``,
else False) and selects nothing here: both ops serve either value. As in TE, single
grouped parameters need ``use_grouped_tensor=True`` (a ``RuntimeError`` at the forward
otherwise).

Tensor parallelism is TE 2.20.2's: ``parallel_mode`` shards each weight (``"column"``:
``out_features``, ``"row"``: ``in_features`` over ``tp_size`` ranks; ``tp_size`` is
``tp_group``'s size when a group is given) and the module communicates nothing. The
caller's MoE dispatch and combine stages do (a column-parallel output is this rank's
feature shard, its input gradient a partial sum; a row-parallel output is a partial sum
to be reduced). ``m_splits`` count the rows this rank holds, with or without
``sequence_parallel``, which changes no computation here (TE only records it). As in TE,
``bias=True`` with ``tp_size > 1`` is refused (it would be added once per rank). The op
always keeps the original input and re-quantizes it in the backward, which is TE's
``save_original_input=True`` (with ``False`` TE keeps the quantized input instead: the
same numbers, more memory), so both values are accepted; under delayed scaling the
backward quantizes at the scales the forward quantized with (the forward's bits), and
``save_original_input=True`` is refused as TE refuses it.

``forward(..., is_first_microbatch=...)`` caches the quantized weights as TE does, per
GEMM: ``True`` quantizes every weight and keeps the results, ``False`` reuses them
without running the weight quantizers (a weight changed in place is seen at the next
``True``), ``None`` caches nothing. Compiled as for ``Linear``: one graph per flag value,
reading or writing the kept workspaces; weights made under ``quantized_model_init`` are
already quantized and cache nothing.

The recipe is taken as ``Linear`` takes it, per GEMM: its GEMM settings
(``fp8_gemm_fprop`` ...) and ``backward_override`` reach every GEMM, and delayed scaling
keeps one state per GEMM (TE keeps FP8 metadata per GEMM; GEMM ``i > 0`` saved under
``"gemm{i}"`` in ``_extra_state``), each ``quantized_model_init`` weight seeded from its
own amax.
"""

from __future__ import annotations

import functools
import math
import operator
import os
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import is_grad_enabled, is_tensor, nn

from ..generated.grouped_gemm import call_grouped_gemm
from ..generated.grouped_linear import call_grouped_linear
from ..ops.grouped_gemm import serves as grouped_gemm_serves
from ..quantization.quantizer import QuantizedData
from ..quantization.stochastic import rng_state_for
from ..runtime.boundary import registered_group
from ..runtime.keep import Keep
from ._base import (
    ExtraStateMixin,
    forward_recipe,
    full_then_shard,
    reject_unimplemented,
    te_default_init,
    tp_rank,
)
from ._call import (
    activation_dtype,
    backward_override_of,
    quantizes_weight,
    recipe_gemm_fields,
    refuse_torch_func,
    refuse_unsupported,
    torch_autocast_on,
    under_torch_autocast,
    zero_feature_gemms,
)
from ._device import default_device
from ._wgrad import WgradScheduling, wgrad_flags
from ._workspace import WeightWorkspace
from .autocast import STATE, CalibrationQuantizers


def _row_counts(owner: str, m_splits: list[Any] | tuple[Any, ...]) -> list[int]:
    """``m_splits`` given as a list, as ints; a float or a bool is refused (``torch.tensor``
    would truncate 2.5 to 2 without a word)."""
    counts = []
    for i, s in enumerate(m_splits):
        if isinstance(s, int) and not isinstance(s, bool):
            counts.append(s)  # as is: under dynamic=True a symbolic int, not specialized
            continue
        try:
            if isinstance(s, bool):
                raise TypeError
            counts.append(operator.index(s))  # a NumPy integer, a 0-d integer tensor
        except TypeError:
            raise TypeError(
                f"{owner}: m_splits[{i}] is {s!r} ({type(s).__name__}); row counts must be ints"
            ) from None
    return counts


_SINGLE_PARAM_ENV = "NVTE_GROUPED_LINEAR_SINGLE_PARAM"


def _single_param_flags(owner: str, weight: bool, bias: bool, use_bias: bool) -> tuple[bool, bool]:
    """TE's gate of ``single_grouped_weight``/``single_grouped_bias``: on only with
    ``NVTE_GROUPED_LINEAR_SINGLE_PARAM`` set to a positive int, with TE's warnings."""
    if not (weight or bias):
        return False, False
    if int(os.environ.get(_SINGLE_PARAM_ENV, "0")) <= 0:
        warnings.warn(
            f"GroupedLinear was constructed with single_grouped_weight={weight} and "
            f"single_grouped_bias={bias}, but the {_SINGLE_PARAM_ENV} environment variable is "
            "not set. Disabling single grouped weight/bias and falling back to per-expert "
            "parameters.",
            UserWarning,
            stacklevel=3,
        )
        return False, False
    warnings.warn(
        "GroupedLinear is using single_grouped_weight/single_grouped_bias. This feature is "
        "experimental and may change in future releases.",
        UserWarning,
        stacklevel=3,
    )
    if use_bias and weight and not bias:
        warnings.warn(
            "GroupedLinear has single_grouped_weight=True and bias=True, but "
            "single_grouped_bias=False. This requires packing the per-GEMM biases on every "
            "forward; enable single_grouped_bias to keep both parameters grouped.",
            UserWarning,
            stacklevel=3,
        )
    return bool(weight), bool(bias)


_USE_GROUPED_TENSOR_ENV = "NVTE_GROUPED_LINEAR_USE_FUSED_GROUPED_GEMM"


def _use_grouped_tensor(value: Any) -> bool:
    """TE's ``use_grouped_tensor``: a bool as given; None reads TE's deprecated
    ``NVTE_GROUPED_LINEAR_USE_FUSED_GROUPED_GEMM`` (an int; TE's ``FutureWarning`` when
    set), False when unset; anything else is a TypeError, as in TE."""
    if value is None:
        env = os.environ.get(_USE_GROUPED_TENSOR_ENV)
        if env is None:
            return False
        warnings.warn(
            f"{_USE_GROUPED_TENSOR_ENV} is deprecated and will be removed in a future release. "
            "Pass use_grouped_tensor=True or use_grouped_tensor=False to GroupedLinear instead.",
            FutureWarning,
            stacklevel=3,
        )
        try:
            return bool(int(env))
        except ValueError:
            raise ValueError(
                f"GroupedLinear: {_USE_GROUPED_TENSOR_ENV}={env!r} is not an int"
            ) from None
    if not isinstance(value, bool):
        raise TypeError(f"use_grouped_tensor must be a bool or None, got {type(value)}.")
    return value


def _tensor_parallel_size(tp_group: Any, tp_size: Any) -> int:
    """TE's rule: the group's size when a group is given, else ``tp_size``."""
    if not isinstance(tp_size, int) or isinstance(tp_size, bool) or tp_size < 1:
        raise ValueError(f"GroupedLinear: tp_size must be a positive int, got {tp_size!r}")
    if tp_group is None:
        return tp_size
    size = registered_group(tp_group, "GroupedLinear.tp_group").size()
    if tp_size not in (1, size):
        raise ValueError(
            f"GroupedLinear: tp_size={tp_size} but tp_group {tp_group.group_name!r} has "
            f"{size} ranks"
        )
    return size


def _check_parallel_mode(parallel_mode: Any) -> str | None:
    if parallel_mode not in (None, "column", "row"):
        raise ValueError(
            "GroupedLinear: parallel_mode must be one of None, 'column', 'row'; got "
            f"{parallel_mode!r}"
        )
    return parallel_mode


def _divide(cls: str, name: str, features: int, tp_size: int) -> int:
    if features % tp_size != 0:
        raise ValueError(
            f"{cls}: {name}={features} is not divisible by tp_size={tp_size} (the "
            f"{'column' if name == 'out_features' else 'row'}-parallel shard)"
        )
    return features // tp_size


def _gemm(i: int) -> str | None:
    """The name of GEMM ``i``'s delayed-scaling state (None: the module's own)."""
    return f"gemm{i}" if i else None


def _workspaces_fit(fields: dict[str, Any]) -> bool:
    """Whether every cached workspace has the usages this call needs (dgrad reads the
    columnwise data)."""
    needs_columnwise = (
        fields["is_grad_enabled"]
        and fields["input_requires_grad"]
        and fields["backward_override"] is None
    )
    return not needs_columnwise or all(
        bool(getattr(w, "columnwise_usage", True))
        for w in fields["weight_workspaces"] or ()
        if w is not None
    )


class GroupedLinear(ExtraStateMixin, WgradScheduling, nn.Module):
    """``y[rows of group i] = x[rows of group i] W_i^T + b_i`` for ``i < num_gemms``."""

    quantizer_module_type = "grouped_linear"  # TE's QuantizerRole.module_type

    def __init__(
        self,
        num_gemms: int,
        in_features: int,
        out_features: int,
        sequence_parallel: bool = False,
        fuse_wgrad_accumulation: bool = False,
        tp_group: Any = None,
        tp_size: int = 1,
        get_rng_state_tracker: Callable | None = None,
        rng_tracker_name: str | None = None,
        init_method: Callable | None = None,
        bias: bool = True,
        return_bias: bool = False,
        params_dtype: torch.dtype | None = None,
        parallel_mode: str | None = None,
        device: torch.device | str | None = None,
        ub_overlap_rs: bool = False,
        ub_overlap_ag: bool = False,
        ub_name: str | None = None,
        delay_wgrad_compute: bool = False,
        save_original_input: bool = False,
        single_grouped_weight: bool = False,
        single_grouped_bias: bool = False,
        name: str | None = None,
        use_grouped_tensor: bool | None = None,
    ) -> None:
        super().__init__()
        device = default_device(device)  # TE's default: CUDA where available
        cls = type(self).__name__
        reject_unimplemented(
            cls,
            get_rng_state_tracker=(get_rng_state_tracker, None),
            rng_tracker_name=(rng_tracker_name, None),
            return_bias=(return_bias, False),
            ub_overlap_rs=(ub_overlap_rs, False),
            ub_overlap_ag=(ub_overlap_ag, False),
            ub_name=(ub_name, None),
        )
        # TE's choice between its GroupedTensor GEMM and its split-quantize GEMMs; here
        # one computation serves both (the grouped GEMM where it serves the call), and
        # only single grouped parameters ask for True (forward).
        self.use_grouped_tensor = _use_grouped_tensor(use_grouped_tensor)
        if not isinstance(num_gemms, int) or num_gemms < 1:
            raise ValueError(f"{cls}: num_gemms must be a positive int, got {num_gemms!r}")
        self.name = name
        self._set_wgrad_scheduling(fuse_wgrad_accumulation, delay_wgrad_compute)
        self.tp_group = tp_group
        self.tp_size = tp_size = _tensor_parallel_size(tp_group, tp_size)
        self.parallel_mode = _check_parallel_mode(parallel_mode)
        if tp_size > 1 and bias:
            # TE's rule: the caller's combine stage reduces the outputs, so a bias here
            # would be added once per rank.
            raise ValueError(
                f"{cls}: bias=True is not supported with tp_size={tp_size} > 1 (as in TE: "
                "the tensor-parallel communication is the caller's, outside this module); "
                "pass bias=False and add the bias after the combine"
            )
        # As in TE: parallel_mode shards the weights (column: out_features, row:
        # in_features over tp_size ranks) and in_features/out_features become this rank's.
        out_local, in_local = out_features, in_features
        if self.parallel_mode == "column":
            out_local = _divide(cls, "out_features", out_features, tp_size)
        elif self.parallel_mode == "row":
            in_local = _divide(cls, "in_features", in_features, tp_size)
        self.num_gemms, self.in_features, self.out_features = num_gemms, in_local, out_local
        # Delayed scaling keeps one state per GEMM, as TE keeps FP8 metadata per GEMM:
        # GEMM 0's is the module's own, GEMM i's (i > 0) is saved under "gemm{i}".
        self.further_gemms = tuple(f"gemm{i}" for i in range(1, num_gemms))
        self.sequence_parallel = tp_size > 1 and bool(sequence_parallel)
        self.save_original_input = bool(save_original_input)
        self.params_dtype = dtype = params_dtype or torch.get_default_dtype()
        self.use_bias = bool(bias)
        single_grouped_weight, single_grouped_bias = _single_param_flags(
            cls, single_grouped_weight, single_grouped_bias, self.use_bias
        )
        if (single_grouped_weight or single_grouped_bias) and (
            fuse_wgrad_accumulation or delay_wgrad_compute
        ):
            raise NotImplementedError(
                f"{cls}: single_grouped_weight/single_grouped_bias with fuse_wgrad_accumulation "
                "or delay_wgrad_compute is not implemented (their main_grad and deferred GEMMs "
                "are per GEMM)"
            )
        if single_grouped_weight and STATE.model_init is not None:
            if not STATE.model_init.recipe.delayed():
                raise NotImplementedError(
                    f"{cls}: single_grouped_weight=True under quantized_model_init is not "
                    "implemented (the weights are quantized one per GEMM)"
                )
            single_grouped_weight = False  # TE keeps delayed scaling's weights per GEMM
        self.single_grouped_weight = single_grouped_weight
        self.single_grouped_bias = single_grouped_bias
        # One quantized weight per GEMM, kept across microbatches (``is_first_microbatch``).
        self._weight_caches = [WeightWorkspace() for _ in range(num_gemms)]
        # Every rank draws the same full weights (same init_method, or the default init
        # on an identically seeded RNG) and keeps its shard, so a single-process module
        # built the same way holds the concatenation of the shards.
        dim = 1 if self.parallel_mode == "row" else 0
        parts = tp_size if self.parallel_mode is not None else 1
        rank = tp_rank(tp_group, tp_size)
        weights = [
            full_then_shard(
                (out_features, in_features),
                dim,
                parts,
                rank,
                init_method or te_default_init,
                dtype,
                device,
            )
            for _ in range(num_gemms)
        ]
        init = STATE.model_init
        if init is not None:
            weights = [self._initial_weight(init, w, _gemm(i)) for i, w in enumerate(weights)]
        if single_grouped_weight:  # one [G, out, in] parameter, TE's "weight"
            self.register_parameter("weight", nn.Parameter(torch.stack(weights)))
        for i, weight in enumerate(weights):
            param = None if single_grouped_weight else nn.Parameter(weight)
            self.register_parameter(f"weight{i}", param)
            if bias:
                zeros = torch.zeros(out_local, dtype=dtype, device=device)
                param = None if single_grouped_bias else nn.Parameter(zeros)
                self.register_parameter(f"bias{i}", param)
        if bias and single_grouped_bias:  # one [G, out] parameter, TE's "bias"
            zeros = torch.zeros(num_gemms, out_local, dtype=dtype, device=device)
            self.register_parameter("bias", nn.Parameter(zeros))
        self._teops_init_methods = (init_method,)

    def reset_parameters(self) -> None:
        """Draw the weights again as the constructor did (``init_method``, else TE's
        N(0, 0.023), one weight after another; the full weight, then this rank's shard)
        and reset the other parameters to their initial values, as TE's
        ``reset_parameters``: what a module built on ``device="meta"`` needs after
        ``to_empty()``; ``quantized_model_init`` weights are quantized again."""
        split = {"column": 0, "row": 1}.get(self.parallel_mode or "")
        parts = self.tp_size if split is not None else 1
        full = (
            self.out_features * (parts if split == 0 else 1),
            self.in_features * (parts if split == 1 else 1),
        )
        rank, device = tp_rank(self.tp_group, self.tp_size), self._weights()[0].device
        for i in range(self.num_gemms):
            init = self._teops_init_methods[0] or te_default_init
            weight = full_then_shard(full, split or 0, parts, rank, init, self.params_dtype, device)
            if self.single_grouped_weight:
                with torch.no_grad():
                    self.weight[i].copy_(weight)
            else:
                self._reset_weight(f"weight{i}", weight, _gemm(i))
        if self.single_grouped_bias:
            self._reset_filled(("bias",) if self.use_bias else (), 0.0)
        else:
            names = tuple(f"bias{i}" for i in range(self.num_gemms) if self.use_bias)
            self._reset_filled(names, 0.0)

    def make_grouped_weights(self, defer_init: bool = False) -> None:
        """TE's packing of the per-GEMM weights ``weight0``.. into one ``[num_gemms, out,
        in]`` parameter ``weight`` (what ``single_grouped_weight=True`` builds), in
        place. As in TE, a no-op for ``defer_init`` and for delayed-scaling weights
        (kept per GEMM), and a ``RuntimeError`` when only some weights keep their
        high-precision initial values. Quantized weights of other recipes cannot be
        packed here (docs/te_api.md)."""
        if defer_init or self.single_grouped_weight:
            return
        cls = type(self).__name__
        weights = self._weights()
        initial = [
            w.get_high_precision_init_val() if hasattr(w, "get_high_precision_init_val") else None
            for w in weights
        ]
        if any(v is not None for v in initial) and not all(v is not None for v in initial):
            raise RuntimeError(
                "Grouped weights have inconsistent high-precision initialization state"
            )
        if any(isinstance(w, QuantizedData) for w in weights):
            formats = {getattr(w.quantizer, "_COMPATIBLE_RECIPE", None) for w in weights}
            if formats == {"DelayedScaling"}:
                return  # TE keeps delayed scaling's weights per GEMM
            raise NotImplementedError(
                f"{cls}.make_grouped_weights: quantized weights (quantized_model_init) cannot "
                "be packed into one grouped parameter (the weights are quantized one per GEMM)"
            )
        with torch.no_grad():
            grouped = nn.Parameter(torch.stack([w.detach() for w in weights]))
        for i in range(self.num_gemms):
            self.register_parameter(f"weight{i}", None)
        self.register_parameter("weight", grouped)
        self.single_grouped_weight = True

    def _weights(self) -> list[torch.Tensor]:
        if self.single_grouped_weight:
            return list(self.weight.unbind(0))
        return [getattr(self, f"weight{i}") for i in range(self.num_gemms)]

    def _stacked_weight(self, weights: list[torch.Tensor]) -> torch.Tensor:
        """The ``[G, out, in]`` weight of the grouped GEMM: the single grouped parameter
        itself, or the per-GEMM weights stacked (a copy; their gradients are views of
        the stack's)."""
        return self.weight if self.single_grouped_weight else torch.stack(weights)

    def _wgrad_weights(self) -> tuple[Any, ...]:
        return tuple(self._weights())

    def _biases(self) -> list[torch.Tensor] | None:
        if not self.use_bias:
            return None
        if self.single_grouped_bias:
            return list(self.bias.unbind(0))
        return [getattr(self, f"bias{i}") for i in range(self.num_gemms)]

    def forward(
        self,
        inp: torch.Tensor,
        m_splits: torch.Tensor | list[int],
        is_first_microbatch: bool | None = None,
        out: torch.Tensor | None = None,
        dgrad_out: torch.Tensor | None = None,
    ) -> Any:
        refuse_torch_func(self)  # a torch.func transform: a clear error
        if torch_autocast_on(inp):  # TE's rule: cast the input, run with autocast off
            return under_torch_autocast(
                GroupedLinear.forward, self, inp, m_splits, is_first_microbatch, out, dgrad_out
            )
        cls = f"{type(self).__name__}.forward"
        reject_unimplemented(
            cls,
            out=(None if out is None else "a tensor", None),
            dgrad_out=(None if dgrad_out is None else "a tensor", None),
        )
        if (self.single_grouped_weight or self.single_grouped_bias) and not (
            self.use_grouped_tensor
        ):
            raise RuntimeError(  # TE's contract (its split-quantize path has none)
                "single_grouped_weight and single_grouped_bias require use_grouped_tensor=True; "
                "the split-quantize path only supports discrete parameters."
            )
        counts = None  # a host list's ints
        if isinstance(m_splits, (list, tuple)):
            counts = _row_counts(cls, m_splits)
        elif not is_tensor(m_splits):
            raise TypeError(f"{cls}: m_splits must be a tensor or a list of ints, got {m_splits!r}")
        if counts is not None:
            m_splits = torch.tensor(counts, dtype=torch.int64)
        if 0 in (self.out_features, self.in_features) and is_tensor(inp):
            # No features: nothing to quantize or multiply (zeros, plus each GEMM's bias
            # on its rows).
            if sum(m_splits.tolist()) != math.prod(inp.shape[:-1]):
                raise ValueError(
                    f"{cls}: m_splits sums to {sum(m_splits.tolist())} rows, but the input "
                    f"of shape {tuple(inp.shape)} has {math.prod(inp.shape[:-1])}"
                )
            return zero_feature_gemms(
                cls, inp, self._weights(), self._biases(), m_splits, self.params_dtype
            )
        shared = forward_recipe(self)
        calibration = None
        if isinstance(shared, CalibrationQuantizers):  # TE's calibrating=True
            shared, calibration = self._split_calibration(shared)
        if (
            self.save_original_input
            and shared is not None
            and shared.recipe.delayed()
            and backward_override_of(shared) is None
            and is_grad_enabled()
            and any(w.requires_grad for w in self._weights())
        ):
            # TE's refusal: the original input cannot be quantized again at the scale the
            # forward used (autocast's exit updates it first).
            raise ValueError(
                f"{cls}: DelayedScaling recipe is not supported with save_original_input"
            )
        n = self.num_gemms
        # Each GEMM's quantizers: the recipe's, or under delayed scaling its own.
        qs: list[Any] = [self._stateful_quantizers(shared, _gemm(i)) for i in range(n)]
        weights = self._weights()
        for qi in qs:
            refuse_unsupported(qi, weights[0])  # a format this CUDA device lacks
        q: Any = shared
        dtype = activation_dtype(self, inp, self.params_dtype)
        biases = self._biases()
        weight_quantizers = [qi and qi.weight for qi in qs]
        # Caching only means something where this call quantizes a weight (TE's rule).
        caching = is_first_microbatch is not None and any(
            quantizes_weight(wq, w) for wq, w in zip(weight_quantizers, weights, strict=True)
        )
        fields = dict(
            inp=inp,
            weights=weights,
            biases=biases,
            weight_workspaces=self._read_workspaces(weight_quantizers, weights)
            if caching and is_first_microbatch is False
            else None,
            m_splits=m_splits,
            input_requires_grad=is_tensor(inp) and inp.requires_grad,
            weights_requires_grad=any(w.requires_grad for w in weights),
            biases_requires_grad=biases is not None and any(b.requires_grad for b in biases),
            input_quantizers=[qi and qi.input for qi in qs],
            weight_quantizers=weight_quantizers,
            grad_output_quantizers=[qi and qi.grad_output for qi in qs],
            activation_dtype=dtype,
            backward_override=backward_override_of(q),
            **recipe_gemm_fields(q),
            num_gemms=n,
            in_features=self.in_features,
            out_features=self.out_features,
            is_first_microbatch=is_first_microbatch,
            cache_weight=caching,
            is_grad_enabled=is_grad_enabled(),
            sr_rng_state=rng_state_for(
                [qi and qi.grad_output for qi in qs],
                inp,
                weights[0].device,
                is_grad_enabled() and backward_override_of(q) is None,
            ),
            **wgrad_flags(self.fuse_wgrad_accumulation, self.delay_wgrad_compute, *weights),
            calibration_quantizers=calibration,
        )
        if not caching and self._grouped_gemm_serves(inp, dtype, fields):
            if counts is not None:  # made on the input's device: a graph constant there
                fields["m_splits"] = torch.tensor(counts, dtype=torch.int64, device=inp.device)
            return self._grouped_gemm(fields)
        keep = None
        if caching:
            if fields["weight_workspaces"] is not None and not _workspaces_fit(fields):
                fields["weight_workspaces"] = None  # remade with every usage this call needs
            if fields["weight_workspaces"] is None:
                # The op saves exactly the quantized weight of each GEMM.
                keep = Keep(
                    tuple(range(n)),
                    functools.partial(self._keep_weight_workspaces, fields["weight_quantizers"]),
                )
        return call_grouped_linear(**fields, keep=keep)[0]

    def _grouped_gemm_serves(self, inp: Any, dtype: torch.dtype, fields: dict[str, Any]) -> bool:
        """Whether the grouped-GEMM op serves this call (``ops/grouped_gemm.py``): plain
        input and weights, no weight-gradient scheduling or backward override, one
        quantizer per role for every GEMM (a stateless recipe), and a device, dtype,
        alignment and recipe it has a grouped GEMM for, not calibrating. Every other call
        loops."""
        if not is_tensor(inp) or isinstance(inp, QuantizedData):
            return False
        if fields["fuse_wgrad_accumulation"] or fields["delay_wgrad_compute"]:
            return False
        if fields["backward_override"] is not None or fields["sr_rng_state"] is not None:
            return False
        if fields["calibration_quantizers"] is not None:
            return False  # calibration reads each GEMM's operands in Linear's stage
        if any(isinstance(w, QuantizedData) for w in fields["weights"]):
            return False
        roles = ("input_quantizers", "weight_quantizers", "grad_output_quantizers")
        firsts = tuple(fields[role][0] for role in roles)
        if any(
            any(q is not first for q in fields[role])
            for role, first in zip(roles, firsts, strict=False)
        ):
            return False  # per-GEMM quantizers (delayed scaling's state)
        reason = grouped_gemm_serves(inp.device, dtype, self.in_features, self.out_features, firsts)
        return reason is None

    def _grouped_gemm(self, fields: dict[str, Any]) -> torch.Tensor:
        """The call on the grouped-GEMM op: the weights (and biases) stacked, the row
        counts on the input's device."""
        inp, weights, biases = fields["inp"], fields["weights"], fields["biases"]
        m_splits = fields["m_splits"]
        if m_splits.device != inp.device:  # a host tensor: copied, never read on the host
            m_splits = m_splits.to(inp.device, non_blocking=True)
        if biases is not None:
            biases = self.bias if self.single_grouped_bias else torch.stack(biases)
        return call_grouped_gemm(
            inp=inp,
            weight=self._stacked_weight(weights),
            bias=biases,
            m_splits=m_splits,
            input_requires_grad=fields["input_requires_grad"],
            weight_requires_grad=fields["weights_requires_grad"],
            bias_requires_grad=fields["biases_requires_grad"],
            input_quantizer=fields["input_quantizers"][0],
            weight_quantizer=fields["weight_quantizers"][0],
            grad_output_quantizer=fields["grad_output_quantizers"][0],
            activation_dtype=fields["activation_dtype"],
            fprop_gemm=fields["fprop_gemm"],
            dgrad_gemm=fields["dgrad_gemm"],
            is_grad_enabled=fields["is_grad_enabled"],
        )[0]

    def _keep_weight_workspaces(self, quantizers: Any, made: tuple[Any, ...]) -> None:
        """Keep the quantized weights a first microbatch made (one per GEMM); later
        microbatches reuse them without running the weight quantizers (TE's contract: a
        weight changed in place is seen at the next first microbatch)."""
        if any(m is not None for m in made):
            for cache, weight, quantizer in zip(self._weight_caches, made, quantizers, strict=True):
                cache.keep(weight, quantizer)

    def _read_workspaces(self, quantizers: list[Any], weights: list[Any]) -> list[Any] | None:
        """The kept quantized weights this call reads, one per GEMM (None for a GEMM
        whose weight it does not quantize): all of them, each made by this call's
        quantizer of its GEMM, or None (every weight is quantized and kept afresh)."""
        read = []
        for cache, quantizer, weight in zip(self._weight_caches, quantizers, weights, strict=True):
            if not quantizes_weight(quantizer, weight):
                read.append(None)
                continue
            value = cache.read(quantizer)
            if value is None:
                return None
            read.append(value)
        return read

    @property
    def _weight_workspaces(self) -> list[Any] | None:
        """The kept quantized weights, one per GEMM (None until a caching call made
        them; None for a GEMM whose weight that call did not quantize)."""
        if all(cache.value is None for cache in self._weight_caches):
            return None
        return [cache.value for cache in self._weight_caches]

    def extra_repr(self) -> str:
        text = (
            f"num_gemms={self.num_gemms}, in_features={self.in_features}, "
            f"out_features={self.out_features}, bias={self.use_bias}"
        )
        if self.parallel_mode is not None:
            text += (
                f", parallel_mode={self.parallel_mode!r}, tp_size={self.tp_size}, "
                f"sequence_parallel={self.sequence_parallel}"
            )
        return text
