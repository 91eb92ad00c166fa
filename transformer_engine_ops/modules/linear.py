"""``Linear``: TE's Linear conventions, compiled through the generated custom ops.

The module builds the op's forward bundle and calls the generated calling side:
``linear_eager`` (the op's impls through a generated ``autograd.Function``, no
op-boundary cost) or, under ``torch.compile``, ``linear_compiled`` (``teops::linear_fwd``,
one graph node each way). What the op path cannot serve runs eagerly with a named
reason. Module logic only: nothing here crosses the op boundary by hand.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from ..generated.linear import linear_compiled, linear_compiled_keeping, linear_eager
from ..ops.linear import _CUDA_HALF, _PLAIN_TENSORS, LinearFwdArgs, _bias_grad
from ..quantization.gemm import gemm, half_product
from ..quantization.stochastic import rng_state_for
from ..runtime.boundary import registered_group
from ..runtime.fallback import run_eagerly
from . import _extra_state
from ._base import (
    ExtraStateMixin,
    full_then_shard,
    reject_unimplemented,
    te_default_init,
    tp_rank,
)
from ._call import (
    activation_dtype,
    backward_override_of,
    caches_weight,
    fitting_workspace,
    follows_torch_autocast,
    gemm_call_reason,
    kept_workspace,
    recipe_gemm_fields,
    zero_feature_gemms,
)
from ._wgrad import WgradScheduling
from .autocast import STATE, RecipeQuantizers


def _with_fitting_workspace(args: LinearFwdArgs) -> LinearFwdArgs:
    """``args`` without its cached weight workspace when that lacks a usage this call
    needs (made under ``no_grad``, now read by a dgrad GEMM): the call quantizes the
    weight again, and the module keeps the new workspace."""
    needs_columnwise = (
        args.is_grad_enabled and args.input_requires_grad and args.backward_override is None
    )
    workspace = fitting_workspace(args.weight_workspace, needs_columnwise)
    if workspace is args.weight_workspace:
        return args
    return dataclasses.replace(args, weight_workspace=workspace)


# The index of the quantized weight in the op's saved values (``linear_forward``).
_SAVED_WEIGHT = (1,)


_PARALLEL_MODES = (None, "column", "row")
_PLAIN_DEVICES = ("cpu", "cuda")


def _plain_fprop(
    weight: torch.Tensor, inp: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """The forward GEMM of a plain call (operands checked by ``Linear._plain_eager``):
    for 16-bit CUDA operands ``gemm``'s own branch for them, called directly."""
    if inp.is_cuda and inp.dtype in _CUDA_HALF:
        return half_product(weight, inp, "TN", bias)
    return gemm(weight, inp, layout="TN", out_dtype=inp.dtype, bias=bias)


class _PlainLinear(torch.autograd.Function):
    """The eager call of the commonest case: no recipe, one rank, plain 2-D tensors of
    one dtype (``Linear._plain_eager`` says exactly when). It computes what the op's
    impls compute for that case, through the same kernels (``gemm``, or for 16-bit CUDA
    operands its own branch for them, ``half_product``; ``_bias_grad``),
    so the bits are the same (tested against the op path), without the bundle, the
    field checks and the generic autograd glue that every other call pays for: on the
    H200's host those cost ~85 us a layer over a minimal ``autograd.Function``, and
    ``torch.nn.Linear``'s whole step is ~150 us a layer."""

    @staticmethod
    def forward(
        ctx: Any, inp: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor:
        # What linear_setup_context keeps: the input for wgrad, the weight for dgrad.
        needs_dgrad, needs_wgrad = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        ctx.save_for_backward(inp if needs_wgrad else None, weight if needs_dgrad else None)
        ctx.use_bias = bias is not None and ctx.needs_input_grad[2]
        ctx.dtype = inp.dtype
        ctx.half = inp.is_cuda and inp.dtype in _CUDA_HALF
        return _plain_fprop(weight, inp, bias)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        inp, weight = ctx.saved_tensors
        dtype = ctx.dtype
        if not (type(dy) in _PLAIN_TENSORS and len(dy.shape) == 2 and dy.dtype == dtype):
            dy = dy.reshape(-1, dy.shape[-1]).to(dtype)  # as linear_backward reads it
        if ctx.half and dy.is_cuda and type(dy) in _PLAIN_TENSORS:
            dgrad = half_product(weight, dy, "NN", None) if weight is not None else None
            wgrad = half_product(inp, dy, "NT", None) if inp is not None else None
        else:
            dgrad = gemm(weight, dy, layout="NN", out_dtype=dtype) if weight is not None else None
            wgrad = gemm(inp, dy, layout="NT", out_dtype=dtype) if inp is not None else None
        bgrad = _bias_grad(dy, dtype) if ctx.use_bias else None
        return dgrad, wgrad, bgrad


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


class Linear(ExtraStateMixin, WgradScheduling, nn.Module):
    """``y = x W^T + b`` with TE's recipes, caching and parallelism parameters."""

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
        """TE 2.20.2's arguments in TE's order (``device=None``: torch's default device,
        where TE defaults to ``"cuda"``); the ones not implemented here raise
        ``NotImplementedError`` naming them unless left at TE's defaults."""
        super().__init__()
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
            save_original_input=(save_original_input, False),
        )
        self.name = name
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
        self._weight_workspace: Any = None
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

    def _fwd_args(
        self,
        inp: torch.Tensor,
        quantizers: RecipeQuantizers | None,
        is_first_microbatch: bool | None,
        fp8_output: bool,
    ) -> LinearFwdArgs:
        q: Any = quantizers
        grad = torch.is_grad_enabled()
        # A non-tensor input reaches the bundle as is and is reported by its field check.
        is_tensor = isinstance(inp, torch.Tensor)
        dtype = activation_dtype(type(self).__name__, inp, self.params_dtype)
        bias = None if self.return_bias else self.bias
        override = backward_override_of(q)
        return LinearFwdArgs(
            weight=self.weight,
            inp=inp,
            bias=bias,
            weight_workspace=self._weight_workspace if is_first_microbatch is False else None,
            input_requires_grad=is_tensor and inp.requires_grad,
            weight_requires_grad=self.weight.requires_grad,
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
            **recipe_gemm_fields(q),
            is_first_microbatch=is_first_microbatch,
            cache_weight=is_first_microbatch is not None,
            parallel_mode=self.parallel_mode,
            tp_group=self.tp_group,
            tp_size=self.tp_size,
            sequence_parallel=self.sequence_parallel,
            in_features=self.in_features,
            out_features=self.out_features,
            ub_overlap_ag_fprop=False,
            ub_overlap_rs_fprop=False,
            ub_name=None,
            wgrad_store=None,
            is_grad_enabled=grad,
            sr_rng_state=rng_state_for(
                (q and q.grad_output,), inp, self.weight.device, grad and override is None
            ),
            **self._wgrad_flags(self.weight),
        )

    @follows_torch_autocast
    def forward(
        self,
        inp: torch.Tensor,
        is_first_microbatch: bool | None = None,
        fp8_output: bool = False,
        fp8_grad: bool = False,
    ) -> Any:
        if fp8_grad:  # TE's quantized input gradient
            reject_unimplemented(f"{type(self).__name__}.forward", fp8_grad=(fp8_grad, False))
        if 0 in self.weight.shape and self.tp_size == 1:  # no features: nothing to quantize
            bias = None if self.return_bias else self.bias
            out = zero_feature_gemms(
                type(self).__name__,
                inp,
                [self.weight],
                None if bias is None else [bias],
                None,
                self.params_dtype,
            )
            if self.return_bias:
                return out, None if self.bias is None else self.bias.to(out.dtype)
            return out
        quantizers = STATE.autocast
        compiling = torch.compiler.is_compiling()
        if not compiling:
            quantizers = self._recipe_of_this_forward(quantizers)
            if quantizers is None and is_first_microbatch is None and not self.routes_wgrad:
                out = self._plain_eager(inp)
                if out is not None:
                    if self.return_bias:  # as below: the bias, in the output's dtype
                        bias = self.bias
                        return out, None if bias is None else bias.to(out.dtype)
                    return out
        args = self._fwd_args(inp, quantizers, is_first_microbatch, fp8_output)
        if not compiling:
            out = self._eager(args)
        elif (reason := gemm_call_reason(args, quantizers)) is None:
            out = self._compiled(args)
        else:
            out = run_eagerly(reason, self._eager, args)
        if self.return_bias:
            bias = self.bias
            return out, None if bias is None else bias.to(args.activation_dtype)
        return out

    def _wgrad_weights(self) -> tuple[Any, ...]:
        return (self.weight,)

    def _plain_eager(self, inp: Any) -> torch.Tensor | None:
        """The output of :class:`_PlainLinear` when this call is the plain case its
        docstring names (checked here, cheaply); None for any other call, which the op
        path serves (and reports, when something is wrong with it)."""
        weight, bias = self.weight, None if self.return_bias else self.bias
        dtype = weight.dtype
        if (
            type(inp) not in _PLAIN_TENSORS
            or type(weight) not in _PLAIN_TENSORS
            or self.tp_group is not None
            or self.tp_size != 1
            or len(inp.shape) != 2
            or inp.dtype != dtype
            or inp.shape[1] != weight.shape[1]
            or inp.device != weight.device
            or inp.device.type not in _PLAIN_DEVICES
            or (bias is not None and (type(bias) not in _PLAIN_TENSORS or bias.dtype != dtype))
        ):
            return None
        if torch.is_grad_enabled() and (
            inp.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)
        ):
            return _PlainLinear.apply(inp, weight, bias)
        return _plain_fprop(weight, inp, bias)

    def _eager(self, args: LinearFwdArgs) -> Any:
        args = self._with_scaling_state(args)
        if args.tp_group is not None:
            # What the compiled path's unflatten does: the group must still be registered.
            registered_group(args.tp_group, "LinearFwdArgs.tp_group")
        caching = caches_weight(args)
        if caching:
            args = _with_fitting_workspace(args)
        # The generated eager path checks every field (``LinearFwdArgs.<field>:
        # expected ..., got ...``) as the compiled path does.
        (out,), (_, made_weight) = linear_eager(args)
        if caching:
            self._weight_workspace = kept_workspace(args.weight_workspace, made_weight)
        return out

    def _compiled(self, args: LinearFwdArgs) -> Any:
        """The compiled call; with weight caching the graph reads the cached workspace
        (a later microbatch) or writes the one it made (the first) back to the module,
        a tensor attribute Dynamo replays after the graph: one graph per flag value."""
        if not caches_weight(args):
            return linear_compiled(args)[0]
        args = _with_fitting_workspace(args)
        (out,), (made_weight,) = linear_compiled_keeping(args, _SAVED_WEIGHT)
        self._weight_workspace = kept_workspace(args.weight_workspace, made_weight)
        return out

    # ----- scaling state of stateful recipes (delayed scaling) -----

    def _with_scaling_state(self, args: LinearFwdArgs) -> LinearFwdArgs:
        """``args`` with this module's own stateful quantizers where the active recipe
        keeps state (delayed scaling), else unchanged."""
        shared = STATE.autocast or self.__dict__.get("_teops_forward_recipe")
        if shared is None or shared.compile_blocker is None or args.input_quantizer is None:
            return args
        own = _extra_state.module_quantizers(self, shared)
        if own is shared:
            return args
        return dataclasses.replace(
            args,
            input_quantizer=own.input,
            weight_quantizer=own.weight,
            output_quantizer=own.output,
            grad_input_quantizer=own.grad_input,
            grad_weight_quantizer=own.grad_weight,
            grad_output_quantizer=own.grad_output,
        )

    # The recipe a forward runs under (recorded for the recompute of activation
    # checkpointing), the ``quantized_model_init`` weight (``_initial_weight``) and
    # ``_extra_state`` are the family's (``ExtraStateMixin``).
    _recipe_of_this_forward = ExtraStateMixin._forward_recipe

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
