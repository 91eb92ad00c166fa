"""``Linear``: TE's Linear conventions, compiled through the generated custom ops.

The module builds the op's forward bundle and calls the generated ``call_linear``, the
op's one entry (eager, compiled, every recipe; what a compiled call cannot serve runs
eagerly there, with the reason the op declares). Module logic only: nothing here knows
how the op is dispatched, saved or rebuilt.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

import torch
from torch import is_grad_enabled, is_tensor, nn

from ..generated.linear import call_linear
from ..ops.linear import requantizes_exactly
from ..quantization.float8 import Float8Quantizer
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
    with_op_settings,
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


def _save_original_input_allowed(input_quantizer: Any) -> bool:
    """TE's policy for ``save_original_input=True`` under a recipe: a delayed-scaling
    input quantizer is refused (its scale moves between the forward and the backward,
    so the backward could not quantize the input to the same values); one whose second
    quantize could differ otherwise (stochastic rounding) is ignored with TE's warning."""
    if input_quantizer is None:
        return False
    if isinstance(input_quantizer, Float8Quantizer):
        raise ValueError(
            "Linear: DelayedScaling recipe is not supported with save_original_input "
            "(the backward would quantize the input with a scale updated since the forward)"
        )
    if not requantizes_exactly(input_quantizer):
        warnings.warn(
            "Ignoring save_original_input=True because the input quantizer cannot safely "
            "reconstruct the backward operand from the original input "
            f"({type(input_quantizer).__name__}).",
            stacklevel=3,
        )
        return False
    return True


def _workspace_fits(workspace: Any, needs_columnwise: bool) -> bool:
    """Whether the cached weight workspace has every usage this call needs."""
    return not needs_columnwise or bool(getattr(workspace, "columnwise_usage", True))


_PARALLEL_MODES = (None, "column", "row")


def _check_parallelism(
    in_features: int,
    out_features: int,
    tp_group: Any,
    tp_size: int,
    parallel_mode: Any,
    *,
    cls: str = "Linear",
) -> int:
    """Validate the parallelism arguments (the same answer on every rank, before any
    communication, so a bad configuration fails everywhere without hanging); errors name
    ``cls``, the calling module's class."""
    if parallel_mode not in _PARALLEL_MODES:
        raise ValueError(
            f"{cls}: parallel_mode must be one of None, 'column', 'row'; got {parallel_mode!r}"
        )
    if not isinstance(tp_size, int) or tp_size < 1:
        raise ValueError(f"{cls}: tp_size must be a positive int, got {tp_size!r}")
    if tp_group is not None:
        group = registered_group(tp_group, f"{cls}.tp_group")
        if group.size() != tp_size:
            raise ValueError(
                f"{cls}: tp_size={tp_size} but tp_group {group.group_name!r} has "
                f"{group.size()} ranks"
            )
    elif parallel_mode is not None and tp_size > 1:
        raise ValueError(
            f"{cls}: parallel_mode={parallel_mode!r} with tp_size={tp_size} needs a "
            "tp_group (a registered torch.distributed ProcessGroup), got None"
        )
    split = {"column": ("out_features", out_features), "row": ("in_features", in_features)}
    if parallel_mode in split:
        name, features = split[parallel_mode]
        if features % tp_size != 0:
            raise ValueError(
                f"{cls}: {parallel_mode}-parallel splits {name}={features} over "
                f"tp_size={tp_size} ranks, but {features} is not divisible by {tp_size}"
            )
    return tp_size


@with_op_settings
class Linear(ExtraStateMixin, WgradScheduling, nn.Module):
    """``y = x W^T + b`` with TE's recipes, caching and parallelism parameters."""

    # The settings every call hands the op, kept in one tuple (``_base.OpSetting``) that
    # ``forward`` unpacks in this order: each is an attribute as well (read and assigned).
    OP_SETTINGS = (
        "parallel_mode",
        "tp_group",
        "tp_size",
        "sequence_parallel",
        "in_features",
        "out_features",
        "return_bias",
        "params_dtype",
        "fuse_wgrad_accumulation",
        "delay_wgrad_compute",
        "save_original_input",
    )

    def __init__(
        self,
        in_features: int,
        out_features: int,
        sequence_parallel: bool = False,
        fuse_wgrad_accumulation: bool = False,
        tp_group: Any = None,
        tp_size: int = 1,
        get_rng_state_tracker: Any = None,
        rng_tracker_name: str | None = None,
        init_method: Any = None,
        bias: bool = True,
        return_bias: bool = False,
        params_dtype: torch.dtype | None = None,
        parallel_mode: str | None = None,
        parameters_split: Any = None,
        device: torch.device | str | None = None,
        ub_overlap_ag: bool = False,
        ub_overlap_rs: bool = False,
        ub_overlap_rs_dgrad: bool = False,
        ub_bulk_dgrad: bool = False,
        ub_bulk_wgrad: bool = False,
        ub_name: str | None = None,
        delay_wgrad_compute: bool = False,
        symmetric_ar_type: str | None = None,
        save_original_input: bool = False,
        name: str | None = None,
    ) -> None:
        """TE 2.20.2's arguments in TE's order (``device=None``: TE's ``"cuda"`` where
        CUDA is available, else the CPU, ``modules/_device.py``); the ones not
        implemented here raise ``NotImplementedError`` naming them unless left at TE's
        defaults."""
        super().__init__()
        device = default_device(device)  # TE's default: CUDA where available
        reject_unimplemented(
            "Linear",
            get_rng_state_tracker=(get_rng_state_tracker, None),
            rng_tracker_name=(rng_tracker_name, None),
            parameters_split=(parameters_split, None),
            ub_overlap_ag=(ub_overlap_ag, False),
            ub_overlap_rs=(ub_overlap_rs, False),
            ub_overlap_rs_dgrad=(ub_overlap_rs_dgrad, False),
            ub_bulk_dgrad=(ub_bulk_dgrad, False),
            ub_bulk_wgrad=(ub_bulk_wgrad, False),
            ub_name=(ub_name, None),
            symmetric_ar_type=(symmetric_ar_type, None),
        )
        self.name = name
        # As in TE: keep the unquantized input for the backward, which quantizes it again
        # (the quantized copy is not kept; the input itself often is, by its producer).
        self.save_original_input = bool(save_original_input)
        # As in TE: the weight gradient goes into ``weight.main_grad`` (fused), and/or its
        # GEMM waits for ``backward_dw()`` (delayed); such calls run eagerly under compile.
        self._set_wgrad_scheduling(fuse_wgrad_accumulation, delay_wgrad_compute)
        # As in TE: the bias is returned unapplied (the caller adds it, e.g. after a
        # row-parallel reduction) and still receives its gradient through that use.
        self.return_bias = bool(return_bias)
        tp_size = _check_parallelism(in_features, out_features, tp_group, tp_size, parallel_mode)
        self.in_features, self.out_features = in_features, out_features
        self.params_dtype = params_dtype or torch.get_default_dtype()
        self.tp_group, self.tp_size = tp_group, tp_size
        self.parallel_mode = parallel_mode
        # As in TE: sequence parallelism only means something on more than one rank.
        self.sequence_parallel = (
            bool(sequence_parallel) and parallel_mode is not None and tp_size > 1
        )
        # Every rank builds the same full (out, in) weight (same init_method, or the
        # default init on an identically seeded global RNG) and keeps its shard, so a
        # single-process Linear built the same way holds the concatenation of the shards.
        weight = torch.empty(out_features, in_features, dtype=self.params_dtype, device=device)
        (init_method or te_default_init)(weight)
        rank = tp_group.rank() if tp_group is not None and tp_size > 1 else 0
        out_local, in_local = out_features, in_features
        if parallel_mode == "column":
            out_local = out_features // tp_size
            weight = weight.narrow(0, rank * out_local, out_local).clone()
        elif parallel_mode == "row":
            in_local = in_features // tp_size
            weight = weight.narrow(1, rank * in_local, in_local).clone()
        self.in_features_per_partition, self.out_features_per_partition = in_local, out_local
        init = STATE.model_init
        if init is not None:
            weight = self._initial_weight(init, weight)
        self.weight = nn.Parameter(weight)
        # Column parallel: the bias is sharded with the output features; row parallel:
        # full, added once after the output reduction.
        self.bias = (
            nn.Parameter(torch.zeros(out_local, dtype=self.params_dtype, device=device))
            if bias
            else None
        )
        # The quantized weight kept across microbatches (``is_first_microbatch``).
        self._weight_cache = WeightWorkspace()
        self._teops_init_methods = (init_method,)

    def reset_parameters(self) -> None:
        """Draw the weights again as the constructor did (``init_method``, else TE's N(0, 0.023); the full
        weight, then this rank's shard) and reset the other parameters to their initial
        values, as TE's ``reset_parameters``: what a module built on ``device="meta"``
        needs after ``to_empty()``; ``quantized_model_init`` weights are quantized again."""
        split = {"column": 0, "row": 1}.get(self.parallel_mode or "")
        weight = full_then_shard(
            (self.out_features, self.in_features),
            split or 0,
            self.tp_size if split is not None else 1,
            tp_rank(self.tp_group, self.tp_size),
            self._teops_init_methods[0] or te_default_init,
            self.params_dtype,
            self.weight.device,
        )
        self._reset_weight("weight", weight)
        self._reset_filled(("bias",), 0.0)

    def forward(
        self,
        inp: torch.Tensor,
        is_first_microbatch: bool | None = None,
        fp8_output: bool = False,
        fp8_grad: bool = False,
    ) -> Any:
        refuse_torch_func(self)  # a torch.func transform: a clear error
        if torch_autocast_on(inp):  # TE's rule: cast the input, run with autocast off
            return under_torch_autocast(
                Linear.forward, self, inp, is_first_microbatch, fp8_output, fp8_grad
            )
        if fp8_grad:  # TE's quantized input gradient
            reject_unimplemented(f"{type(self).__name__}.forward", fp8_grad=(fp8_grad, False))
        # Each parameter read once, from the registry ``nn.Module.__getattr__`` reads
        # after a failed attribute lookup (~0.7 us a read); anything else (a parameter
        # deleted and replaced by a plain attribute, ``bias=False``'s None) by getattr.
        params = self._parameters
        weight = params.get("weight")
        if weight is None:
            weight = self.weight
        module_bias = params.get("bias")
        if module_bias is None:
            module_bias = self.bias
        (
            parallel_mode,
            tp_group,
            tp_size,
            sequence_parallel,
            in_features,
            out_features,
            return_bias,
            params_dtype,
            fuse_wgrad_accumulation,
            delay_wgrad_compute,
            save_original_input,
        ) = self._op_settings  # OP_SETTINGS, read at once
        if 0 in weight.shape and tp_size == 1:  # no features: nothing to quantize
            bias = None if return_bias else module_bias
            out = zero_feature_gemms(
                type(self).__name__,
                inp,
                [weight],
                None if bias is None else [bias],
                None,
                params_dtype,
            )
            if return_bias:
                return out, None if module_bias is None else module_bias.to(out.dtype)
            return out
        active = forward_recipe(self)
        calibration = None
        if isinstance(active, CalibrationQuantizers):  # TE's calibrating=True
            active, calibration = self._split_calibration(active)
        grad = is_grad_enabled()
        # A non-tensor input reaches the op as is and is reported by its field check.
        input_requires_grad = is_tensor(inp) and inp.requires_grad
        dtype = activation_dtype(self, inp, params_dtype)
        bias = None if return_bias else module_bias
        workspace = None
        keep = None
        original = False
        if active is None:
            # No recipe (the common bf16 call): no quantizer, GEMM configuration, random
            # state or weight caching to look up.
            q: Any = None
            override = None
            cache_weight = False
            gemms = recipe_gemm_fields(None)
            sr_rng_state = None
        else:
            q = self._role_quantizers(self._stateful_quantizers(active))  # a CustomRecipe's
            refuse_unsupported(q, weight)  # a format this CUDA device lacks
            override = backward_override_of(q)
            if save_original_input and override is None and grad and weight.requires_grad:
                original = _save_original_input_allowed(q.input)
            # Caching only means something where this call quantizes the weight.
            cache_weight = is_first_microbatch is not None and quantizes_weight(q.weight, weight)
            gemms = recipe_gemm_fields(q)
            sr_rng_state = rng_state_for(
                (q.grad_output,), inp, weight.device, grad and override is None
            )
            if cache_weight:
                if is_first_microbatch is False:  # a copy made by this call's quantizer
                    workspace = self._weight_cache.read(q.weight)
                needs_columnwise = grad and input_requires_grad and override is None
                if workspace is not None and not _workspace_fits(workspace, needs_columnwise):
                    workspace = None  # remade with every usage this call needs
                if workspace is None:
                    keep = Keep((1,), functools.partial(self._keep_weight_workspace, q.weight))
        wgrad = wgrad_flags(fuse_wgrad_accumulation, delay_wgrad_compute, weight)
        # Named keywords only: a ``**`` in the call would rebuild every keyword as a dict.
        (out,) = call_linear(
            weight=weight,
            inp=inp,
            bias=bias,
            weight_workspace=workspace,
            input_requires_grad=input_requires_grad,
            weight_requires_grad=weight.requires_grad,
            bias_requires_grad=bias is not None and bias.requires_grad,
            input_quantizer=q and q.input,
            weight_quantizer=q and q.weight,
            output_quantizer=q and q.output,
            grad_input_quantizer=q and q.grad_input,
            grad_weight_quantizer=q and q.grad_weight,
            grad_output_quantizer=q and q.grad_output,
            activation_dtype=dtype,
            fp8_output=fp8_output,
            backward_override=override,
            fp8=gemms["fp8"],
            fprop_gemm=gemms["fprop_gemm"],
            dgrad_gemm=gemms["dgrad_gemm"],
            wgrad_gemm=gemms["wgrad_gemm"],
            is_first_microbatch=is_first_microbatch,
            cache_weight=cache_weight,
            parallel_mode=parallel_mode,
            tp_group=tp_group,
            tp_size=tp_size,
            sequence_parallel=sequence_parallel,
            in_features=in_features,
            out_features=out_features,
            ub_overlap_ag_fprop=False,
            ub_overlap_rs_fprop=False,
            ub_name=None,
            wgrad_store=None,
            is_grad_enabled=grad,
            sr_rng_state=sr_rng_state,
            fuse_wgrad_accumulation=wgrad["fuse_wgrad_accumulation"],
            delay_wgrad_compute=wgrad["delay_wgrad_compute"],
            save_original_input=original,
            calibration_quantizers=calibration,
            keep=keep,
        )
        if return_bias:
            return out, None if module_bias is None else module_bias.to(dtype)
        return out

    @property
    def _weight_workspace(self) -> Any:
        """The kept quantized weight (None until a caching call made one)."""
        return self._weight_cache.value

    def _keep_weight_workspace(self, weight_quantizer: Any, kept: tuple[Any, ...]) -> None:
        """Keep the quantized weight a first microbatch made (the forward's saved value
        1); later microbatches reuse it without quantizing. Compiled too: the graph
        hands the weight out and this runs in the traced frame (one graph per flag),
        writing it into the kept buffers where an eager call made them."""
        self._weight_cache.keep(kept[0], weight_quantizer)

    def _wgrad_weights(self) -> tuple[Any, ...]:
        return (self.weight,)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}"
            + (
                f", parallel_mode={self.parallel_mode!r}, tp_size={self.tp_size}, "
                f"sequence_parallel={self.sequence_parallel}"
                if self.parallel_mode is not None
                else ""
            )
        )
