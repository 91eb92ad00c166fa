"""What the fused ops (LayerNormLinear, LayerNormMLP) share: one Linear GEMM stage, and
the norm stage in front of it.

A fused op runs the Linear op's own forward, spec, setup and backward on a
``LinearFwdArgs`` it builds for each GEMM, so quantization, GEMM layouts, saved
tensors and the tensor/sequence-parallel collectives are Linear's, decided by
Linear's plan, never re-implemented. Not an op module (the generator does not read it).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import torch

from transformer_engine_ops.ops.layernorm import norm_backward, norm_forward
from transformer_engine_ops.ops.linear import (
    LinearBwdArgs,
    LinearFwdArgs,
    _forward_plan,
    _internal,
)
from transformer_engine_ops.quantization.float8 import Float8Quantizer
from transformer_engine_ops.quantization.quantizer import Quantizer
from transformer_engine_ops.runtime.tensor_spec import TensorSpec
from transformer_engine_ops.runtime.values import GemmConfig


class GemmQuantizers(NamedTuple):
    """The six quantizers of one GEMM, in the order of Linear's bundle fields."""

    input: Optional[Quantizer]
    weight: Optional[Quantizer]
    output: Optional[Quantizer]
    grad_input: Optional[Quantizer]
    grad_weight: Optional[Quantizer]
    grad_output: Optional[Quantizer]


def replaying(quantizer: Optional[Quantizer], scale: Optional[torch.Tensor]) -> Any:
    """``quantizer``, or for delayed scaling (``Float8Quantizer``) a copy that quantizes
    with the forward's ``scale`` and records its amax in its own state, never in the
    recipe's: what a backward that quantizes a forward operand again quantizes with, so
    it reads the forward's bits although autocast's exit has moved the scale since."""
    if scale is None or not isinstance(quantizer, Float8Quantizer):
        return quantizer
    replay = quantizer.snapshot()
    replay.load_state(scale, replay.amax_history)
    return replay


def linear_stage(
    *,
    weight: Any,
    inp: Any,
    bias: Any,
    input_requires_grad: bool,
    weight_requires_grad: bool,
    bias_requires_grad: bool,
    quantizers: GemmQuantizers,
    activation_dtype: torch.dtype,
    fp8: bool,
    gemms: tuple[GemmConfig, GemmConfig, GemmConfig],
    parallel_mode: Optional[str],
    tp_group: Any,
    tp_size: int,
    sequence_parallel: bool,
    in_features: int,
    out_features: int,
    is_grad_enabled: bool,
) -> LinearFwdArgs:
    """The Linear forward bundle of one GEMM stage (no caching, no userbuffers)."""
    q = quantizers
    return LinearFwdArgs(
        weight=weight,
        inp=inp,
        bias=bias,
        weight_workspace=None,
        input_requires_grad=input_requires_grad,
        weight_requires_grad=weight_requires_grad,
        bias_requires_grad=bias_requires_grad,
        input_quantizer=q.input,
        weight_quantizer=q.weight,
        output_quantizer=q.output,
        grad_input_quantizer=q.grad_input,
        grad_weight_quantizer=q.grad_weight,
        grad_output_quantizer=q.grad_output,
        activation_dtype=activation_dtype,
        fp8=fp8,
        fp8_output=False,
        backward_override=None,
        fprop_gemm=gemms[0],
        dgrad_gemm=gemms[1],
        wgrad_gemm=gemms[2],
        is_first_microbatch=None,
        cache_weight=False,
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
        is_grad_enabled=is_grad_enabled,
    )


def keeps_high_precision_input(args: LinearFwdArgs) -> bool:
    """Whether the stage's backward reads its input unquantized (so the fused op must
    keep that intermediate): a weight gradient with no quantized input saved."""
    needs_wgrad = args.is_grad_enabled and args.weight_requires_grad
    return needs_wgrad and _forward_plan(args).save_input is None


def linear_backward_stage(
    *,
    grad_output: torch.Tensor,
    inputmat: Any,
    weight_fp8: Any,
    inp_shape: Any,
    requires_dgrad: bool,
    requires_wgrad: bool,
    use_bias: bool,
    quantizers: GemmQuantizers,
    activation_dtype: torch.dtype,
    fp8: bool,
    gemms: tuple[GemmConfig, GemmConfig],
    parallel_mode: Optional[str],
    tp_group: Any,
    tp_size: int,
    sequence_parallel: bool,
) -> LinearBwdArgs:
    """The Linear backward bundle of one GEMM stage."""
    q = quantizers
    return LinearBwdArgs(
        grad_outputs=[grad_output],
        inputmat=inputmat,
        weight_fp8=weight_fp8,
        inp_shape=inp_shape,
        requires_dgrad=requires_dgrad,
        requires_wgrad=requires_wgrad,
        use_bias=use_bias,
        input_quantizer=q.input,
        weight_quantizer=q.weight,
        grad_input_quantizer=q.grad_input,
        grad_weight_quantizer=q.grad_weight,
        grad_output_quantizer=q.grad_output,
        activation_dtype=activation_dtype,
        fp8=fp8,
        backward_override=None,
        dgrad_gemm=gemms[0],
        wgrad_gemm=gemms[1],
        parallel_mode=parallel_mode,
        tp_group=tp_group,
        tp_size=tp_size,
        sequence_parallel=sequence_parallel,
        ub_overlap_ag_dgrad=False,
        ub_overlap_rs_dgrad=False,
        ub_bulk_wgrad=False,
        wgrad_store=None,
        main_grad_func=None,
    )


def quantized_for_backward(args: LinearFwdArgs) -> tuple[Any, Any]:
    """What ``linear_forward(args)`` saves for the backward (the quantized input and
    weight, None where it saves nothing), made without running the GEMM: for ops that
    keep the original input and re-quantize it in the backward (TE's
    ``save_original_input``). Not for tensor-parallel stages."""
    plan = _forward_plan(args)
    dtype = args.activation_dtype
    saved_input = saved_weight = None
    if plan.save_input is not None:
        x = args.inp.reshape(-1, args.inp.shape[-1]).to(dtype)
        saved_input = _internal(args.input_quantizer, plan.save_input).quantize(x)
    if plan.quantize_weight is not None:
        w = args.weight.to(dtype)
        saved_weight = _internal(args.weight_quantizer, plan.quantize_weight).quantize(w)
    return saved_input, saved_weight


# --- the norm stage (fields both fused bundles name alike) ---------------------------


def norm_stage_forward(args: Any, dtype: torch.dtype) -> tuple[torch.Tensor, Any, Any]:
    """(norm output shaped as ``args.inp``, mu, rsigma) of the bundle's LayerNorm/RMSNorm."""
    inp = args.inp
    y, mu, rsigma = norm_forward(
        inp.reshape(-1, inp.shape[-1]),
        args.ln_weight,
        args.ln_bias,
        args.normalization,
        args.eps,
        args.zero_centered_gamma,
        dtype,
    )
    return y.view(inp.shape), mu, rsigma


def norm_stage_backward(args: Any, dln: torch.Tensor) -> tuple[Any, Any, Any]:
    """(input, norm weight, norm bias) gradients from the norm output's gradient ``dln``
    (plus the returned norm output's own gradient when the op returns it); None where
    not required."""
    inp = args.inp
    ln_grad = args.grad_outputs[1] if args.return_layernorm_output else None
    dx, dg, db = norm_backward(
        dln.reshape(-1, dln.shape[-1]),
        inp.reshape(-1, inp.shape[-1]),
        args.ln_weight,
        args.mu,
        args.rsigma,
        args.zero_centered_gamma,
        need_dgrad=args.input_requires_grad,
        dy_extra=None if ln_grad is None else ln_grad.reshape(-1, ln_grad.shape[-1]),
    )
    pdtype = args.ln_weight.dtype
    return (
        dx.view(inp.shape) if args.input_requires_grad else None,
        dg.to(pdtype) if args.ln_weight_requires_grad else None,
        db.to(pdtype) if args.ln_bias_requires_grad else None,
    )


def norm_stage_grad_specs(args: Any, norm: bool) -> tuple[Optional[TensorSpec], ...]:
    """What :func:`norm_stage_backward` returns, as TensorSpecs (all None unless
    ``norm``: the backward reaches the norm stage)."""
    inp, w = args.inp, args.ln_weight
    dgrad = TensorSpec(tuple(inp.shape), inp.dtype, device=inp.device)
    dgamma = TensorSpec(tuple(w.shape), w.dtype, device=inp.device)
    return (
        dgrad if norm and args.input_requires_grad else None,
        dgamma if norm and args.ln_weight_requires_grad else None,
        dgamma if norm and args.ln_bias_requires_grad else None,
    )
