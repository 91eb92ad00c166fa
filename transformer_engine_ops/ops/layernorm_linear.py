"""The LayerNormLinear op: LayerNorm or RMSNorm, then a Linear GEMM on the norm output.

The norm runs in fp32 (``ops/layernorm.py``'s math) and writes its output in the
activation dtype; the GEMM stage is the Linear op's own forward and backward
(``ops/_fused.py``), so the norm output is quantized for the GEMM by the input quantizer
under every recipe, and column parallelism (with sequence parallelism: the norm output
all-gathered before the GEMM, dgrad reduce-scattered after) is Linear's, and so are
``fp8_output`` (the GEMM output quantized by the output quantizer) and the weight
workspace cache across microbatches (``weight_workspace``, ``is_first_microbatch``,
``cache_weight``), and so is ``backward_override`` (an unquantized backward on the
original or the dequantized norm output and weight). ``return_layernorm_output`` returns the (local) norm output as a
second output; its gradient joins the GEMM's dgrad before the norm backward.
Row parallelism is refused by the module, as TE 2.20.2 refuses it (the norm would need
the whole hidden dimension that a row-parallel input shards).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, NamedTuple, Optional

import torch

from transformer_engine_ops.ops import _wgrad
from transformer_engine_ops.ops._fused import (
    GemmQuantizers,
    keeps_high_precision_input,
    linear_backward_stage,
    linear_stage,
    norm_stage_backward,
    norm_stage_forward,
    norm_stage_grad_specs,
)
from transformer_engine_ops.ops.layernorm import (
    check_norm,
    norm_stats_specs,
)
from transformer_engine_ops.ops.linear import (
    BackwardOverride,
    LinearFwdArgs,
    linear_backward,
    linear_backward_spec,
    linear_forward,
    linear_forward_spec,
    linear_setup_context,
)
from transformer_engine_ops.quantization.quantizer import Quantizer
from transformer_engine_ops.runtime.declaration import OpDeclaration
from transformer_engine_ops.runtime.lowering import examples
from transformer_engine_ops.runtime.tensor_spec import TensorSpec
from transformer_engine_ops.runtime.types import ProcessGroup, TensorOrQuantized
from transformer_engine_ops.runtime.values import GemmConfig

Normalization = Literal["LayerNorm", "RMSNorm"]
ParallelMode = Literal["column"]


@dataclass
class LayerNormLinearFwdArgs:
    """Everything the LayerNormLinear forward needs."""

    # --- Differentiable inputs ---
    inp: torch.Tensor
    ln_weight: torch.Tensor
    ln_bias: Optional[torch.Tensor]  # None for RMSNorm
    weight: TensorOrQuantized
    bias: Optional[torch.Tensor]

    # --- Cached quantized weight (reused across microbatches) ---
    weight_workspace: Optional[TensorOrQuantized]

    # --- requires_grad, recorded so the backward does not re-query ---
    input_requires_grad: bool
    ln_weight_requires_grad: bool
    ln_bias_requires_grad: bool
    weight_requires_grad: bool
    bias_requires_grad: bool

    # --- Norm ---
    normalization: Normalization
    eps: float
    zero_centered_gamma: bool
    return_layernorm_output: bool

    # --- Quantizers of the GEMM (None when the recipe does not quantize that tensor) ---
    input_quantizer: Optional[Quantizer]
    weight_quantizer: Optional[Quantizer]
    output_quantizer: Optional[Quantizer]
    grad_input_quantizer: Optional[Quantizer]
    grad_weight_quantizer: Optional[Quantizer]
    grad_output_quantizer: Optional[Quantizer]

    # --- Numerics ---
    activation_dtype: torch.dtype
    fp8: bool
    fp8_output: bool
    # Linear's: an unquantized backward on the original (HIGH_PRECISION) or the
    # dequantized (DEQUANTIZED) norm output and weight; None: the recipe's quantized one.
    backward_override: Optional[BackwardOverride]
    fprop_gemm: GemmConfig
    dgrad_gemm: GemmConfig
    wgrad_gemm: GemmConfig

    # --- Weight-workspace caching ---
    is_first_microbatch: Optional[bool]
    cache_weight: bool

    # --- Tensor and sequence parallelism (column parallel only) ---
    parallel_mode: Optional[ParallelMode]
    tp_group: Optional[ProcessGroup]
    tp_size: int
    sequence_parallel: bool
    in_features: int
    out_features: int

    # --- Autograd state ---
    is_grad_enabled: bool

    # --- Stochastic rounding of the output gradient: (seed, offset), int64 (2,) ---
    sr_rng_state: Optional[torch.Tensor] = None

    # --- Weight-gradient scheduling (eager only: the weight's main_grad, a deferred GEMM) ---
    fuse_wgrad_accumulation: bool = False
    delay_wgrad_compute: bool = False

    # --- Calibration (autocast(enabled=False, calibrating=True)): norm output's, weight's ---
    calibration_quantizers: Optional[list[Optional[Quantizer]]] = None


@dataclass
class LayerNormLinearBwdArgs:
    """Everything the LayerNormLinear backward needs."""

    # --- One per forward output: out (and ln_out with return_layernorm_output) ---
    grad_outputs: list[torch.Tensor]

    # --- Saved for the norm backward ---
    inp: torch.Tensor
    ln_weight: torch.Tensor
    mu: Optional[torch.Tensor]
    rsigma: Optional[torch.Tensor]

    # --- Saved for the GEMM backward ---
    inputmat: Optional[TensorOrQuantized]
    weight_fp8: Optional[TensorOrQuantized]
    ln_out_shape: torch.Size

    # --- What to compute ---
    requires_dgrad: bool  # through the GEMM into the norm
    requires_wgrad: bool
    use_bias: bool
    input_requires_grad: bool
    ln_weight_requires_grad: bool
    ln_bias_requires_grad: bool

    normalization: Normalization
    zero_centered_gamma: bool
    return_layernorm_output: bool

    # --- Quantizers ---
    input_quantizer: Optional[Quantizer]
    weight_quantizer: Optional[Quantizer]
    grad_input_quantizer: Optional[Quantizer]
    grad_weight_quantizer: Optional[Quantizer]
    grad_output_quantizer: Optional[Quantizer]

    # --- Numerics ---
    activation_dtype: torch.dtype
    fp8: bool
    backward_override: Optional[BackwardOverride]
    dgrad_gemm: GemmConfig
    wgrad_gemm: GemmConfig

    # --- Tensor and sequence parallelism ---
    parallel_mode: Optional[ParallelMode]
    tp_group: Optional[ProcessGroup]
    tp_size: int
    sequence_parallel: bool

    # --- Stochastic rounding of the output gradient: (seed, offset), int64 (2,) ---
    sr_rng_state: Optional[torch.Tensor] = None

    # --- Where the weight gradient goes instead of being returned (eager only) ---
    wgrad_route: Optional[Any] = None


# --- The plan: every decision real kernels and spec fakes share ---------------------


def _quantizers(args: LayerNormLinearFwdArgs | LayerNormLinearBwdArgs) -> GemmQuantizers:
    return GemmQuantizers(
        args.input_quantizer,
        args.weight_quantizer,
        getattr(args, "output_quantizer", None),
        args.grad_input_quantizer,
        args.grad_weight_quantizer,
        args.grad_output_quantizer,
    )


def _norm_grads_needed(args: LayerNormLinearFwdArgs) -> bool:
    return args.is_grad_enabled and (
        args.input_requires_grad or args.ln_weight_requires_grad or args.ln_bias_requires_grad
    )


def _gemm_args(args: LayerNormLinearFwdArgs, ln_out: Any) -> LinearFwdArgs:
    """The Linear stage's bundle, with the norm output (real or spec) as its input: the
    shared stage, plus this op's quantized output and weight-workspace fields."""
    gemm = linear_stage(
        weight=args.weight,
        inp=ln_out,
        bias=args.bias,
        input_requires_grad=_norm_grads_needed(args),
        weight_requires_grad=args.weight_requires_grad,
        bias_requires_grad=args.bias_requires_grad,
        quantizers=_quantizers(args),
        activation_dtype=args.activation_dtype,
        fp8=args.fp8,
        gemms=(args.fprop_gemm, args.dgrad_gemm, args.wgrad_gemm),
        parallel_mode=args.parallel_mode,
        tp_group=args.tp_group,
        tp_size=args.tp_size,
        sequence_parallel=args.sequence_parallel,
        in_features=args.in_features,
        out_features=args.out_features,
        is_grad_enabled=args.is_grad_enabled,
    )
    gemm.weight_workspace = args.weight_workspace
    gemm.fp8_output = args.fp8_output
    gemm.is_first_microbatch = args.is_first_microbatch
    gemm.cache_weight = args.cache_weight
    gemm.backward_override = args.backward_override
    gemm.calibration_quantizers = args.calibration_quantizers
    return gemm


class _ForwardPlan(NamedTuple):
    gemm: LinearFwdArgs  # the GEMM stage, on a spec of the norm output
    save_stats: bool  # mu/rsigma for the norm backward
    save_ln_out: bool  # the unquantized norm output for the GEMM's wgrad
    return_ln_out: bool


def _forward_plan(args: LayerNormLinearFwdArgs) -> _ForwardPlan:
    hidden = args.inp.shape[-1]
    check_norm(
        args.normalization,
        args.ln_weight,
        args.ln_bias,
        hidden,
        "LayerNormLinearFwdArgs",
        "ln_bias",
    )
    if hidden != args.weight.shape[-1]:
        raise ValueError(
            f"LayerNormLinearFwdArgs: the input's last dim is {hidden}, but the weight has "
            f"shape {tuple(args.weight.shape)} (expected (out_features, {hidden}))"
        )
    ln_out = TensorSpec(tuple(args.inp.shape), args.activation_dtype, device=args.inp.device)
    gemm = _gemm_args(args, ln_out)
    return _ForwardPlan(
        gemm,
        _norm_grads_needed(args),
        keeps_high_precision_input(gemm),
        args.return_layernorm_output,
    )


# --- Forward ---------------------------------------------------------------------


def layernorm_linear_forward(
    args: LayerNormLinearFwdArgs,
) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """``outputs == (out,)`` or ``(out, ln_out)``; ``saved == (mu, rsigma, ln_out,
    gemm input, gemm weight)`` (None where the backward does not need it)."""
    plan = _forward_plan(args)
    ln_out, mu, rsigma = norm_stage_forward(args, args.activation_dtype)
    (out,), (gemm_input, gemm_weight) = linear_forward(_gemm_args(args, ln_out))
    # A returned norm output is not saved again (a custom op's results must not alias
    # each other): setup_context takes it from the outputs.
    saved_ln_out = ln_out if plan.save_ln_out and not plan.return_ln_out else None
    outputs: tuple[Any, ...] = (out, ln_out) if plan.return_ln_out else (out,)
    stats = (mu, rsigma) if plan.save_stats else (None, None)
    return outputs, (*stats, saved_ln_out, gemm_input, gemm_weight)


def layernorm_linear_forward_spec(
    args: LayerNormLinearFwdArgs,
) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    _wgrad.refuse_traced(
        "LayerNormLinearFwdArgs", args.fuse_wgrad_accumulation, args.delay_wgrad_compute
    )
    plan = _forward_plan(args)
    inp = args.inp
    (out,), (gemm_input, gemm_weight) = linear_forward_spec(plan.gemm)
    ln_out = TensorSpec(tuple(inp.shape), args.activation_dtype, device=inp.device)
    outputs: tuple[Any, ...] = (out, ln_out) if plan.return_ln_out else (out,)
    stats: tuple[Any, ...] = (None, None)
    if plan.save_stats:
        rows = 1
        for d in inp.shape[:-1]:
            rows = rows * d
        stats = norm_stats_specs(args.normalization, rows, inp.device, inp.dtype)
    saved_ln_out = ln_out if plan.save_ln_out and not plan.return_ln_out else None
    return outputs, (*stats, saved_ln_out, gemm_input, gemm_weight)


def layernorm_linear_setup_context(
    args: LayerNormLinearFwdArgs, outputs: tuple[Any, ...], saved: tuple[Any, ...]
) -> dict[str, Any]:
    mu, rsigma, ln_out, gemm_input, gemm_weight = saved
    if args.return_layernorm_output and _forward_plan(args).save_ln_out:
        ln_out = outputs[1]  # returned, so not saved a second time
    # Without a saved norm output the GEMM backward does not read its input: the
    # forward input (same shape) stands in for the shape only.
    gemm = linear_setup_context(
        _gemm_args(args, ln_out if ln_out is not None else args.inp),
        (),
        (gemm_input, gemm_weight),
    )
    grad = args.is_grad_enabled
    return dict(
        mu=mu,
        rsigma=rsigma,
        inputmat=gemm["inputmat"],
        weight_fp8=gemm["weight_fp8"],
        ln_out_shape=gemm["inp_shape"],
        requires_dgrad=gemm["requires_dgrad"],
        requires_wgrad=gemm["requires_wgrad"],
        use_bias=gemm["use_bias"],
        input_requires_grad=grad and args.input_requires_grad,
        ln_weight_requires_grad=grad and args.ln_weight_requires_grad,
        ln_bias_requires_grad=grad and args.ln_bias is not None and args.ln_bias_requires_grad,
        wgrad_route=_wgrad.route_of(
            args.weight,
            args.fuse_wgrad_accumulation,
            args.delay_wgrad_compute,
            args.is_first_microbatch,
        )
        if gemm["requires_wgrad"]
        else None,
    )


# --- Backward --------------------------------------------------------------------


def _gemm_backward_args(args: LayerNormLinearBwdArgs) -> Any:
    gemm = linear_backward_stage(
        grad_output=args.grad_outputs[0],
        inputmat=args.inputmat,
        weight_fp8=args.weight_fp8,
        inp_shape=args.ln_out_shape,
        requires_dgrad=args.requires_dgrad,
        requires_wgrad=args.requires_wgrad,
        use_bias=args.use_bias,
        quantizers=_quantizers(args),
        activation_dtype=args.activation_dtype,
        fp8=args.fp8,
        gemms=(args.dgrad_gemm, args.wgrad_gemm),
        parallel_mode=args.parallel_mode,
        tp_group=args.tp_group,
        tp_size=args.tp_size,
        sequence_parallel=args.sequence_parallel,
    )
    gemm.backward_override = args.backward_override
    gemm.sr_rng_state = args.sr_rng_state
    gemm.wgrad_route = args.wgrad_route
    return gemm


def layernorm_linear_backward(args: LayerNormLinearBwdArgs) -> tuple[torch.Tensor | None, ...]:
    """Gradients of ``(inp, ln_weight, ln_bias, weight, bias)``; None where not required."""
    dln, wgrad, bgrad = linear_backward(_gemm_backward_args(args))
    dgrad = dgamma = dbeta = None
    if args.requires_dgrad:
        dgrad, dgamma, dbeta = norm_stage_backward(args, dln)
    return dgrad, dgamma, dbeta, wgrad, bgrad


def layernorm_linear_backward_spec(
    args: LayerNormLinearBwdArgs,
) -> tuple[TensorSpec | None, ...]:
    _, wgrad, bgrad = linear_backward_spec(_gemm_backward_args(args))
    return (
        *norm_stage_grad_specs(args, args.requires_dgrad),
        wgrad,
        bgrad,
    )


LAYERNORM_LINEAR = OpDeclaration(
    name="layernorm_linear",
    forward=LayerNormLinearFwdArgs,
    backward=LayerNormLinearBwdArgs,
    grad_fields=("inp", "ln_weight", "ln_bias", "weight", "bias"),
    forward_impl=layernorm_linear_forward,
    backward_impl=layernorm_linear_backward,
    forward_spec=layernorm_linear_forward_spec,
    backward_spec=layernorm_linear_backward_spec,
    setup_context=layernorm_linear_setup_context,
    # Backward fields setup_context computes although a forward field has their name.
    derived=("input_requires_grad", "ln_weight_requires_grad", "ln_bias_requires_grad"),
    lowers=True,
    # Compiled calls that run eagerly, with the reason (the generated compile blocker).
    eager_when=(
        ("quantized(inp)", "a quantized input tensor"),
        (
            "fuse_wgrad_accumulation",
            "fused wgrad accumulation into main_grad (fuse_wgrad_accumulation)",
        ),
        ("delay_wgrad_compute", "delayed wgrad compute (delay_wgrad_compute, run by backward_dw)"),
        (
            "fp8_output and is_grad_enabled",
            "fp8_output=True with autograd enabled (a differentiable quantized output)",
        ),
    ),
)


@examples(LayerNormLinearFwdArgs)
def layernorm_linear_examples(recipe: Any, device: torch.device) -> list[LayerNormLinearFwdArgs]:
    """Bundles the lowering is checked on (``tests/runtime/lowering_check.py``): LayerNorm with
    a bias and its output returned, RMSNorm without, in bf16 and fp32."""
    from transformer_engine_ops.ops import _examples

    bundles = []
    for seed, dtype in enumerate(_examples.DTYPES):
        make = _examples.random_tensors(seed, dtype, device)
        quantizers = _examples.quantizer_fields(recipe)
        for normalization in ("LayerNorm", "RMSNorm"):
            layernorm = normalization == "LayerNorm"
            ln_bias, bias = (make(64), make(32)) if layernorm else (None, None)
            bundles.append(
                LayerNormLinearFwdArgs(
                    inp=make(4, 16, 64),
                    ln_weight=make(64),
                    ln_bias=ln_bias,
                    weight=make(32, 64),
                    bias=bias,
                    weight_workspace=None,
                    input_requires_grad=True,
                    ln_weight_requires_grad=True,
                    ln_bias_requires_grad=layernorm,
                    weight_requires_grad=True,
                    bias_requires_grad=layernorm,
                    normalization=normalization,
                    eps=1e-5,
                    zero_centered_gamma=False,
                    return_layernorm_output=layernorm,
                    **quantizers,
                    activation_dtype=dtype,
                    fp8_output=False,
                    backward_override=None,
                    **_examples.gemm_fields(recipe),
                    is_first_microbatch=None,
                    cache_weight=False,
                    parallel_mode=None,
                    tp_group=None,
                    tp_size=1,
                    sequence_parallel=False,
                    in_features=64,
                    out_features=32,
                    is_grad_enabled=True,
                    sr_rng_state=_examples.rng_state(quantizers, device),
                )
            )
    return bundles
