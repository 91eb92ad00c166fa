"""The LayerNormMLP op: norm -> fc1 -> activation -> fc2, one op each way.

The norm is ``ops/layernorm.py``'s fp32 math; fc1 and fc2 are the Linear op's own GEMM
stages (``ops/_fused.py``), each with its own six quantizers, so each GEMM quantizes its
input, weight and gradients as Linear does. The activation runs in fp32 on fc1's
output (on CUDA in one fused Triton kernel each way, ``kernels/activation_kernels.py``); gated activations (``glu``, ``swiglu``, ``geglu``, ``qgeglu``, ``reglu``, ``sreglu``,
``clamped_swiglu``) gate the first half of fc1's output features with the second, as TE
does; ``clamped_swiglu`` clamps both halves first (``activation_params``). With ``set_parallel_mode`` fc1 is
column- and fc2 row-parallel; with sequence parallelism too, the one op all-gathers the
norm output before fc1 and reduce-scatters fc2's output (and the reverse in backward).
Weight caching across microbatches rides on each stage's own Linear fields
(``weight_workspace``, ``is_first_microbatch``, ``cache_weight``): a first microbatch
returns each weight it quantized (with every usage) in ``saved`` for the module to keep;
a later one reads the kept workspaces and quantizes no weight.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple, Optional

import torch

from transformer_engine_ops.kernels import activation_kernels
from transformer_engine_ops.ops import _wgrad
from transformer_engine_ops.ops._fused import (
    GemmQuantizers,
    keeps_high_precision_input,
    linear_backward_stage,
    linear_stage,
    norm_stage_backward,
    norm_stage_forward,
    norm_stage_grad_specs,
    replaying,
)
from transformer_engine_ops.ops.layernorm import (
    check_norm,
    norm_stats_specs,
)
from transformer_engine_ops.ops.linear import (
    LinearFwdArgs,
    _weight_from_workspace,
    linear_backward,
    linear_backward_spec,
    linear_forward,
    linear_forward_spec,
    linear_saved,
    linear_setup_context,
)
from transformer_engine_ops.quantization.float8 import Float8Quantizer
from transformer_engine_ops.quantization.quantizer import Quantizer
from transformer_engine_ops.quantization.stochastic import stage_rng_state
from transformer_engine_ops.runtime.declaration import OpDeclaration
from transformer_engine_ops.runtime.lowering import exact, examples
from transformer_engine_ops.runtime.precision import math_dtype
from transformer_engine_ops.runtime.tensor_spec import TensorSpec
from transformer_engine_ops.runtime.types import ProcessGroup, TensorOrQuantized
from transformer_engine_ops.runtime.values import ClampedSwiGLUParams, GemmConfig

Normalization = Literal["LayerNorm", "RMSNorm"]
Activation = Literal[
    "gelu",
    "relu",
    "qgelu",
    "srelu",
    "silu",
    "glu",
    "swiglu",
    "geglu",
    "qgeglu",
    "reglu",
    "sreglu",
    "clamped_swiglu",
]


@dataclass
class LayerNormMLPFwdArgs:
    """Everything the LayerNormMLP forward needs."""

    # --- Differentiable inputs ---
    inp: torch.Tensor
    ln_weight: torch.Tensor
    ln_bias: Optional[torch.Tensor]  # None for RMSNorm
    fc1_weight: TensorOrQuantized
    fc1_bias: Optional[torch.Tensor]
    fc2_weight: TensorOrQuantized
    fc2_bias: Optional[torch.Tensor]

    # --- Cached quantized weights (reused across microbatches) ---
    fc1_weight_workspace: Optional[TensorOrQuantized]
    fc2_weight_workspace: Optional[TensorOrQuantized]
    is_first_microbatch: Optional[bool]
    cache_weight: bool

    # --- requires_grad, recorded so the backward does not re-query ---
    input_requires_grad: bool
    ln_weight_requires_grad: bool
    ln_bias_requires_grad: bool
    fc1_weight_requires_grad: bool
    fc1_bias_requires_grad: bool
    fc2_weight_requires_grad: bool
    fc2_bias_requires_grad: bool

    # --- Norm and activation ---
    normalization: Normalization
    eps: float
    zero_centered_gamma: bool
    return_layernorm_output: bool
    activation: Activation

    # --- fc1 quantizers ---
    fc1_input_quantizer: Optional[Quantizer]
    fc1_weight_quantizer: Optional[Quantizer]
    fc1_output_quantizer: Optional[Quantizer]
    fc1_grad_input_quantizer: Optional[Quantizer]
    fc1_grad_weight_quantizer: Optional[Quantizer]
    fc1_grad_output_quantizer: Optional[Quantizer]

    # --- fc2 quantizers ---
    fc2_input_quantizer: Optional[Quantizer]
    fc2_weight_quantizer: Optional[Quantizer]
    fc2_output_quantizer: Optional[Quantizer]
    fc2_grad_input_quantizer: Optional[Quantizer]
    fc2_grad_weight_quantizer: Optional[Quantizer]
    fc2_grad_output_quantizer: Optional[Quantizer]

    # --- Numerics ---
    activation_dtype: torch.dtype
    fp8: bool
    fprop_gemm: GemmConfig
    dgrad_gemm: GemmConfig
    wgrad_gemm: GemmConfig

    # --- Tensor and sequence parallelism: fc1 column-, fc2 row-parallel ---
    set_parallel_mode: bool
    tp_group: Optional[ProcessGroup]
    tp_size: int
    sequence_parallel: bool
    hidden_size: int
    ffn_hidden_size: int

    # --- Autograd state ---
    is_grad_enabled: bool

    # --- Stochastic rounding of the output gradients: (seed, offset), int64 (2,) ---
    sr_rng_state: Optional[torch.Tensor] = None

    # --- Weight-gradient scheduling (eager only: the weights' main_grad, deferred GEMMs) ---
    fuse_wgrad_accumulation: bool = False
    delay_wgrad_compute: bool = False

    # --- clamped_swiglu's limit, alpha and offset (None: TE's defaults; only with it) ---
    activation_params: Optional[ClampedSwiGLUParams] = None

    # --- TE's checkpoint: keep no activation; the backward recomputes norm, fc1, activation ---
    checkpoint: bool = False

    # --- Calibration (autocast(enabled=False, calibrating=True)): the quantizers of fc1's
    # input and weight, then fc2's ---
    calibration_quantizers: Optional[list[Optional[Quantizer]]] = None


@dataclass
class LayerNormMLPBwdArgs:
    """Everything the LayerNormMLP backward needs."""

    # --- One per forward output: out (and ln_out with return_layernorm_output) ---
    grad_outputs: list[torch.Tensor]

    # --- Saved for the norm backward ---
    inp: torch.Tensor
    ln_weight: torch.Tensor
    mu: Optional[torch.Tensor]
    rsigma: Optional[torch.Tensor]

    # --- Saved for the GEMM and activation backward ---
    fc1_inputmat: Optional[TensorOrQuantized]
    fc1_weight_fp8: Optional[TensorOrQuantized]
    ln_out_shape: torch.Size
    fc1_out: Optional[torch.Tensor]
    fc2_inputmat: Optional[TensorOrQuantized]
    fc2_weight_fp8: Optional[TensorOrQuantized]
    act_shape: torch.Size

    # --- What to compute ---
    fc1_requires_dgrad: bool
    fc1_requires_wgrad: bool
    fc1_use_bias: bool
    fc2_requires_dgrad: bool
    fc2_requires_wgrad: bool
    fc2_use_bias: bool
    input_requires_grad: bool
    ln_weight_requires_grad: bool
    ln_bias_requires_grad: bool

    normalization: Normalization
    zero_centered_gamma: bool
    return_layernorm_output: bool
    activation: Activation

    # --- Quantizers ---
    fc1_input_quantizer: Optional[Quantizer]
    fc1_weight_quantizer: Optional[Quantizer]
    fc1_grad_input_quantizer: Optional[Quantizer]
    fc1_grad_weight_quantizer: Optional[Quantizer]
    fc1_grad_output_quantizer: Optional[Quantizer]
    fc2_input_quantizer: Optional[Quantizer]
    fc2_weight_quantizer: Optional[Quantizer]
    fc2_grad_input_quantizer: Optional[Quantizer]
    fc2_grad_weight_quantizer: Optional[Quantizer]
    fc2_grad_output_quantizer: Optional[Quantizer]

    # --- Numerics ---
    activation_dtype: torch.dtype
    fp8: bool
    dgrad_gemm: GemmConfig
    wgrad_gemm: GemmConfig

    # --- Tensor and sequence parallelism ---
    set_parallel_mode: bool
    tp_group: Optional[ProcessGroup]
    tp_size: int
    sequence_parallel: bool

    # --- Stochastic rounding of the output gradients: (seed, offset), int64 (2,) ---
    sr_rng_state: Optional[torch.Tensor] = None

    # --- Where fc1's and fc2's weight gradients go instead of being returned (eager only) ---
    fc1_wgrad_route: Optional[Any] = None
    fc2_wgrad_route: Optional[Any] = None

    # --- clamped_swiglu's limit, alpha and offset (None: TE's defaults) ---
    activation_params: Optional[ClampedSwiGLUParams] = None

    # --- checkpoint: mu, rsigma, fc1_inputmat, fc1_out and fc2_inputmat were not kept; the
    # backward recomputes them from these, fc1_weight_fp8 and fc2_weight_fp8 holding the
    # weights the forward's GEMMs read (quantized again where the forward quantized them) ---
    checkpoint: bool = False
    ln_bias: Optional[torch.Tensor] = None
    fc1_bias: Optional[torch.Tensor] = None
    eps: Optional[float] = None
    fprop_gemm: Optional[GemmConfig] = None
    # Delayed scaling: the scales fc1's and fc2's input and weight quantizers quantized
    # with in the forward (fp32 (4,); 1 for a stateless quantizer), None without one.
    forward_scales: Optional[torch.Tensor] = None


# --- Activations (fp32 math) ---------------------------------------------------------

# A gated activation gates the first half of its input with f and multiplies the second.
GATED = ("glu", "swiglu", "geglu", "qgeglu", "reglu", "sreglu", "clamped_swiglu")
ACTIVATIONS = ("gelu", "relu", "qgelu", "srelu", "silu", *GATED)
_TANH_K = math.sqrt(2.0 / math.pi)


def _unary(name: str, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(f(x), f'(x))`` of the activation (or the gate of a gated one)."""
    if name in ("gelu", "geglu"):  # TE's gelu is the tanh approximation
        inner = _TANH_K * (x + 0.044715 * x.pow(3))
        t = torch.tanh(inner)
        d = 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * _TANH_K * (1 + 3 * 0.044715 * x * x)
        return 0.5 * x * (1 + t), d
    if name in ("relu", "reglu"):
        return torch.relu(x), (x > 0).to(x.dtype)
    if name in ("srelu", "sreglu"):
        r = torch.relu(x)
        return r * r, 2 * r
    if name in ("qgelu", "qgeglu"):
        s = torch.sigmoid(1.702 * x)
        return x * s, s + 1.702 * x * s * (1 - s)
    if name == "glu":  # sigmoid gate
        s = torch.sigmoid(x)
        return s, s * (1 - s)
    # silu, swiglu: SiLU
    s = torch.sigmoid(x)
    return x * s, s + x * s * (1 - s)


def _clamped_halves(
    x: torch.Tensor, limit: float, alpha: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """clamped_swiglu's clamped gate and linear halves, the gate's ``sigmoid(alpha *
    g)``, and the gate's pass-through mask (TE's kernel: ``g <= limit``)."""
    a, b = x.chunk(2, dim=-1)
    g = a.clamp(max=limit)
    return g, b.clamp(-limit, limit), torch.sigmoid(alpha * g), a <= limit


def activation_params_of(params: ClampedSwiGLUParams | None) -> tuple[float, float, float]:
    """``(limit, alpha, glu_linear_offset)``: ``params``' or TE's defaults (None)."""
    p = ClampedSwiGLUParams() if params is None else params
    return p.limit, p.alpha, p.glu_linear_offset


# Fused into one kernel, a traced activation would be FMA-contracted (other bits): kept
# whole in a lowered graph (runtime/lowering.py). On CUDA both pieces run the fused
# Triton kernels of ``activation_kernels`` (one read, fp32 math, one rounded write), so
# eager and a lowered graph run the same kernel; elsewhere the torch ops below.
# ``limit``, ``alpha`` and ``offset`` are clamped_swiglu's (activation_params_of); the
# other activations do not read them.
@exact(
    "activation_forward(str name, Tensor x, ScalarType out_dtype, float limit, float alpha, "
    "float offset) -> Tensor"
)
def activation_forward(
    name: str, x: torch.Tensor, out_dtype: torch.dtype, limit: float, alpha: float, offset: float
) -> torch.Tensor:
    if activation_kernels.eligible(out_dtype, x):
        return activation_kernels.fused_activation_forward(name, x, out_dtype, limit, alpha, offset)
    xf = x.to(math_dtype(x.dtype))
    if name == "clamped_swiglu":
        g, lin, s, _ = _clamped_halves(xf, limit, alpha)
        return (g * s * (lin + offset)).to(out_dtype)
    if name in GATED:
        a, b = xf.chunk(2, dim=-1)
        return (_unary(name, a)[0] * b).to(out_dtype)
    return _unary(name, xf)[0].to(out_dtype)


@exact(
    "activation_backward(str name, Tensor dy, Tensor x, ScalarType out_dtype, float limit, "
    "float alpha, float offset) -> Tensor"
)
def activation_backward(
    name: str,
    dy: torch.Tensor,
    x: torch.Tensor,
    out_dtype: torch.dtype,
    limit: float,
    alpha: float,
    offset: float,
) -> torch.Tensor:
    if activation_kernels.eligible(out_dtype, dy, x):
        return activation_kernels.fused_activation_backward(
            name, dy, x, out_dtype, limit, alpha, offset
        )
    dtype = math_dtype(x.dtype)
    xf, dyf = x.to(dtype), dy.to(dtype)
    if name == "clamped_swiglu":
        g, lin, s, gate_passes = _clamped_halves(xf, limit, alpha)
        b = xf.chunk(2, dim=-1)[1]
        dg = (s + alpha * g * s * (1 - s)) * gate_passes
        dlin = g * s * ((b >= -limit) & (b <= limit))
        return torch.cat([dyf * (lin + offset) * dg, dyf * dlin], dim=-1).to(out_dtype)
    if name in GATED:
        a, b = xf.chunk(2, dim=-1)
        fa, dfa = _unary(name, a)
        return torch.cat([dyf * b * dfa, dyf * fa], dim=-1).to(out_dtype)
    return (dyf * _unary(name, xf)[1]).to(out_dtype)


# --- The plan: every decision real kernels and spec fakes share ---------------------


def _fc_quantizers(args: Any, fc: int) -> GemmQuantizers:
    if fc == 1:
        return GemmQuantizers(
            args.fc1_input_quantizer,
            args.fc1_weight_quantizer,
            getattr(args, "fc1_output_quantizer", None),
            args.fc1_grad_input_quantizer,
            args.fc1_grad_weight_quantizer,
            args.fc1_grad_output_quantizer,
        )
    return GemmQuantizers(
        args.fc2_input_quantizer,
        args.fc2_weight_quantizer,
        getattr(args, "fc2_output_quantizer", None),
        args.fc2_grad_input_quantizer,
        args.fc2_grad_weight_quantizer,
        args.fc2_grad_output_quantizer,
    )


def _norm_grads_needed(args: LayerNormMLPFwdArgs) -> bool:
    return args.is_grad_enabled and (
        args.input_requires_grad or args.ln_weight_requires_grad or args.ln_bias_requires_grad
    )


def _cached(stage: LinearFwdArgs, args: LayerNormMLPFwdArgs, workspace: Any) -> LinearFwdArgs:
    """``stage`` with the weight-workspace caching of ``args`` (Linear's own fields, so
    Linear's plan decides whether the stage quantizes its weight or reads ``workspace``)."""
    if not args.cache_weight and workspace is None:
        return stage
    return dataclasses.replace(
        stage,
        weight_workspace=workspace,
        is_first_microbatch=args.is_first_microbatch,
        cache_weight=args.cache_weight,
    )


def cached_weights_need_columnwise(args: LayerNormMLPFwdArgs) -> tuple[bool, bool]:
    """Whether fc1's and fc2's weights are read by a dgrad GEMM in this call, so a cached
    workspace made without its columnwise usage (say, under ``no_grad``) must be remade."""
    fc1_dgrad = _norm_grads_needed(args)
    fc2_dgrad = args.is_grad_enabled and (
        fc1_dgrad
        or args.fc1_weight_requires_grad
        or (args.fc1_bias is not None and args.fc1_bias_requires_grad)
    )
    return fc1_dgrad, fc2_dgrad


def _fc1_args(args: LayerNormMLPFwdArgs, ln_out: Any) -> LinearFwdArgs:
    stage = linear_stage(
        weight=args.fc1_weight,
        inp=ln_out,
        bias=args.fc1_bias,
        input_requires_grad=_norm_grads_needed(args),
        weight_requires_grad=args.fc1_weight_requires_grad,
        bias_requires_grad=args.fc1_bias_requires_grad,
        quantizers=_fc_quantizers(args, 1),
        activation_dtype=args.activation_dtype,
        fp8=args.fp8,
        gemms=(args.fprop_gemm, args.dgrad_gemm, args.wgrad_gemm),
        parallel_mode="column" if args.set_parallel_mode else None,
        tp_group=args.tp_group,
        tp_size=args.tp_size,
        sequence_parallel=args.sequence_parallel,
        in_features=args.hidden_size,
        out_features=args.fc1_weight.shape[0],
        is_grad_enabled=args.is_grad_enabled,
    )
    stage.calibration_quantizers = _calibration_pair(args, 0)
    return _cached(stage, args, args.fc1_weight_workspace)


def _fc1_needs_grad(fc1: LinearFwdArgs) -> bool:
    """Whether anything before the activation needs a gradient (so fc2 computes dgrad)."""
    return fc1.is_grad_enabled and (
        fc1.input_requires_grad
        or fc1.weight_requires_grad
        or (fc1.bias is not None and fc1.bias_requires_grad)
    )


def _fc2_args(args: LayerNormMLPFwdArgs, act_out: Any, fc1: LinearFwdArgs) -> LinearFwdArgs:
    stage = linear_stage(
        weight=args.fc2_weight,
        inp=act_out,
        bias=args.fc2_bias,
        input_requires_grad=_fc1_needs_grad(fc1),
        weight_requires_grad=args.fc2_weight_requires_grad,
        bias_requires_grad=args.fc2_bias_requires_grad,
        quantizers=_fc_quantizers(args, 2),
        activation_dtype=args.activation_dtype,
        fp8=args.fp8,
        gemms=(args.fprop_gemm, args.dgrad_gemm, args.wgrad_gemm),
        parallel_mode="row" if args.set_parallel_mode else None,
        tp_group=args.tp_group,
        tp_size=args.tp_size,
        sequence_parallel=args.sequence_parallel,
        in_features=args.ffn_hidden_size,
        out_features=args.hidden_size,
        is_grad_enabled=args.is_grad_enabled,
    )
    stage.calibration_quantizers = _calibration_pair(args, 1)
    return _cached(stage, args, args.fc2_weight_workspace)


def _calibration_pair(args: LayerNormMLPFwdArgs, gemm: int) -> Optional[list[Any]]:
    """The calibration quantizers of fc1 (``gemm`` 0) or fc2 (1): input's, weight's."""
    quantizers = args.calibration_quantizers
    if quantizers is None:
        return None
    if len(quantizers) != 4:
        raise ValueError(
            f"LayerNormMLPFwdArgs.calibration_quantizers: {len(quantizers)} quantizers; "
            "expected 4 (fc1's input and weight, then fc2's)"
        )
    return quantizers[2 * gemm : 2 * gemm + 2]


class _ForwardPlan(NamedTuple):
    fc1: LinearFwdArgs  # on a spec of the norm output
    fc2: LinearFwdArgs  # on a spec of the activation output
    fc1_out: TensorSpec
    save_stats: bool
    save_ln_out: bool  # fc1's wgrad reads the unquantized norm output
    save_fc1_out: bool  # the activation backward reads fc1's output
    save_act_out: bool  # fc2's wgrad reads the unquantized activation output
    # TE's checkpoint: nothing above is kept; the backward recomputes it (_recomputed)
    recompute: bool = False


def _spec(shape: Any, args: LayerNormMLPFwdArgs) -> TensorSpec:
    return TensorSpec(tuple(shape), args.activation_dtype, device=args.inp.device)


def _forward_plan(args: LayerNormMLPFwdArgs) -> _ForwardPlan:
    hidden = args.inp.shape[-1]
    check_norm(
        args.normalization, args.ln_weight, args.ln_bias, hidden, "LayerNormMLPFwdArgs", "ln_bias"
    )
    if args.activation not in ACTIVATIONS:
        raise ValueError(f"LayerNormMLPFwdArgs.activation: unknown activation {args.activation!r}")
    if args.activation_params is not None and args.activation != "clamped_swiglu":
        raise ValueError(
            "LayerNormMLPFwdArgs.activation_params: only clamped_swiglu takes parameters, "
            f"not activation={args.activation!r}"
        )
    fc1_rows, fc2_cols = args.fc1_weight.shape[0], args.fc2_weight.shape[-1]
    act_features = fc1_rows // 2 if args.activation in GATED else fc1_rows
    if act_features != fc2_cols or (args.activation in GATED and fc1_rows % 2):
        raise ValueError(
            f"LayerNormMLPFwdArgs: fc1_weight {tuple(args.fc1_weight.shape)} and fc2_weight "
            f"{tuple(args.fc2_weight.shape)} do not fit activation={args.activation!r} "
            "(fc2's in features must be fc1's out features, halved for a gated activation)"
        )
    fc1 = _fc1_args(args, _spec(args.inp.shape, args))
    fc1_out = linear_forward_spec(fc1)[0][0]
    act_out = _spec((*fc1_out.shape[:-1], act_features), args)
    fc2 = _fc2_args(args, act_out, fc1)
    recompute = args.checkpoint and args.is_grad_enabled
    if recompute:
        _replayable_quantizers(args)
    return _ForwardPlan(
        fc1,
        fc2,
        fc1_out,
        _norm_grads_needed(args),
        keeps_high_precision_input(fc1),
        fc2.input_requires_grad,
        keeps_high_precision_input(fc2),
        recompute,
    )


# --- TE's checkpoint: what the forward keeps, and the backward's recompute -------------


def _recomputed_quantizers(args: Any) -> tuple[Optional[Quantizer], ...]:
    """fc1's and fc2's input and weight quantizers: the ones the recompute quantizes
    with again."""
    return (
        args.fc1_input_quantizer,
        args.fc1_weight_quantizer,
        args.fc2_input_quantizer,
        args.fc2_weight_quantizer,
    )


def _replayable_quantizers(args: LayerNormMLPFwdArgs) -> None:
    """Refuse a stateful quantizer the recompute cannot replay: delayed scaling's
    (``Float8Quantizer``) quantizes with the forward's scale again (``forward_scales``);
    another stateful class's state is unknown here."""
    for q in _recomputed_quantizers(args):
        if q is not None and not getattr(q, "value_opaque", True):
            if not isinstance(q, Float8Quantizer):
                raise ValueError(
                    f"LayerNormMLPFwdArgs.checkpoint: the stateful quantizer "
                    f"{type(q).__name__} cannot be replayed by the backward's recompute"
                )


def _forward_scales(args: LayerNormMLPFwdArgs) -> Optional[torch.Tensor]:
    """The scales delayed scaling's quantizers quantize with in this forward (read
    before any of them quantizes; an update waits for the autocast region's exit), for
    the recompute to quantize with again: its scale has moved on by the backward.
    None where no quantizer is stateful."""
    quantizers = _recomputed_quantizers(args)
    if not any(isinstance(q, Float8Quantizer) for q in quantizers):
        return None
    device = args.inp.device
    one = torch.ones(1, dtype=torch.float32, device=device)
    return torch.cat(
        [
            q.scale.detach().to(device, torch.float32).reshape(1)
            if isinstance(q, Float8Quantizer)
            else one
            for q in quantizers
        ]
    )


def _forward_scales_spec(args: LayerNormMLPFwdArgs) -> Optional[TensorSpec]:
    if not any(isinstance(q, Float8Quantizer) for q in _recomputed_quantizers(args)):
        return None
    return TensorSpec((4,), torch.float32, device=args.inp.device)


def _forward_only(stage: LinearFwdArgs) -> LinearFwdArgs:
    """A checkpointed forward's GEMM stage: it keeps nothing for the backward (no input
    for wgrad; no weight copy for dgrad unless it caches the weight, whose workspace
    keeps every usage), so it quantizes only what its GEMM reads. Each usage of a
    format is made from the data alone, so the GEMM reads the bits it reads without
    checkpoint."""
    return dataclasses.replace(
        stage,
        weight_requires_grad=False,
        input_requires_grad=stage.input_requires_grad and stage.cache_weight,
    )


def _recompute_weight(stage: LinearFwdArgs, made: Any) -> Any:
    """The weight a recomputed stage reads: the workspace this forward made and the
    module keeps (every usage), the workspace it read, or the weight itself (then
    quantized again by the recompute, as TE's recompute does)."""
    if made is not None:
        return made
    if _weight_from_workspace(stage):
        return stage.weight_workspace
    return stage.weight


def _recompute_stage(args: LayerNormMLPBwdArgs, fc: int, inp: Any, spec: bool) -> LinearFwdArgs:
    """fc1's or fc2's forward stage as the checkpointed forward would have run it to
    keep its backward operands: the same flags, weights, quantizers (delayed scaling's
    at the forward's scales) and GEMM settings."""
    first = fc == 1
    q = _fc_quantizers(args, fc)
    if not spec and args.forward_scales is not None:
        scales = args.forward_scales
        at = 0 if first else 2
        q = q._replace(
            input=replaying(q.input, scales[at : at + 1]),
            weight=replaying(q.weight, scales[at + 1 : at + 2]),
        )
    weight = args.fc1_weight_fp8 if first else args.fc2_weight_fp8
    parallel = args.set_parallel_mode
    return linear_stage(
        weight=weight,
        inp=inp,
        bias=args.fc1_bias if first else None,  # fc2's GEMM is not run again
        input_requires_grad=args.fc1_requires_dgrad if first else args.fc2_requires_dgrad,
        weight_requires_grad=args.fc1_requires_wgrad if first else args.fc2_requires_wgrad,
        bias_requires_grad=args.fc1_use_bias if first else args.fc2_use_bias,
        quantizers=q,
        activation_dtype=args.activation_dtype,
        fp8=args.fp8,
        gemms=(args.fprop_gemm, args.dgrad_gemm, args.wgrad_gemm),
        parallel_mode=("column" if first else "row") if parallel else None,
        tp_group=args.tp_group,
        tp_size=args.tp_size,
        sequence_parallel=args.sequence_parallel,
        in_features=weight.shape[-1],
        out_features=weight.shape[0],
        is_grad_enabled=True,
    )


def _with_recomputed(
    args: LayerNormMLPBwdArgs,
    stats: tuple[Any, Any],
    fc1_out: Any,
    fc1: dict[str, Any],
    fc2: dict[str, Any],
) -> LayerNormMLPBwdArgs:
    """``args`` with what ``_recomputed`` made: the statistics, fc1's output and each
    GEMM's backward operands (``linear_setup_context``'s fields)."""
    return dataclasses.replace(
        args,
        checkpoint=False,
        mu=stats[0],
        rsigma=stats[1],
        fc1_inputmat=fc1["inputmat"],
        fc1_weight_fp8=fc1["weight_fp8"],
        fc1_out=fc1_out,
        fc2_inputmat=fc2["inputmat"],
        fc2_weight_fp8=fc2["weight_fp8"],
    )


def _recomputed(args: LayerNormMLPBwdArgs) -> LayerNormMLPBwdArgs:
    """The backward bundle of a checkpointed forward with what a plain forward would
    have kept, recomputed by the forward's own code on the kept inputs (TE's selective
    recompute): the norm and its statistics, fc1 (its GEMM and the operands its
    backward reads), the activation, and fc2's backward operands without its GEMM. The
    same kernels on the same inputs, with the forward's quantizers (delayed scaling's
    at the forward's scales): the bits the forward made. Nothing random is drawn."""
    dtype = args.activation_dtype
    ln_out, mu, rsigma = norm_stage_forward(args, dtype)
    fc1 = _recompute_stage(args, 1, ln_out, spec=False)
    (fc1_out,), fc1_saved = linear_forward(fc1)
    act_out = activation_forward(
        args.activation, fc1_out, dtype, *activation_params_of(args.activation_params)
    )
    fc2 = _recompute_stage(args, 2, act_out, spec=False)
    return _with_recomputed(
        args,
        (mu, rsigma),
        fc1_out,
        linear_setup_context(fc1, (), fc1_saved),
        linear_setup_context(fc2, (), linear_saved(fc2)),
    )


def _recomputed_spec(args: LayerNormMLPBwdArgs) -> LayerNormMLPBwdArgs:
    """:func:`_recomputed` on TensorSpecs."""
    dtype, inp = args.activation_dtype, args.inp
    ln_out = TensorSpec(tuple(inp.shape), dtype, device=inp.device)
    fc1 = _recompute_stage(args, 1, ln_out, spec=True)
    (fc1_out,), fc1_saved = linear_forward_spec(fc1)
    rows = fc1_out.shape[-1] // 2 if args.activation in GATED else fc1_out.shape[-1]
    act_out = TensorSpec((*fc1_out.shape[:-1], rows), dtype, device=inp.device)
    fc2 = _recompute_stage(args, 2, act_out, spec=True)
    stats = norm_stats_specs(args.normalization, math.prod(inp.shape[:-1]), inp.device, inp.dtype)
    return _with_recomputed(
        args,
        stats,
        fc1_out,
        linear_setup_context(fc1, (), fc1_saved),
        linear_setup_context(fc2, (), linear_forward_spec(fc2)[1]),
    )


# --- Forward ---------------------------------------------------------------------


def layernorm_mlp_forward(args: LayerNormMLPFwdArgs) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """``outputs == (out,)`` or ``(out, ln_out)``; ``saved == (mu, rsigma, ln_out, fc1_out,
    act_out, fc1 input, fc1 weight, fc2 input, fc2 weight, forward scales)`` (None where
    not needed; with ``checkpoint`` only the weight workspaces made for the module's
    cache and delayed scaling's scales)."""
    plan = _forward_plan(args)
    dtype = args.activation_dtype
    scales = _forward_scales(args) if plan.recompute else None  # before any quantize
    ln_out, mu, rsigma = norm_stage_forward(args, dtype)
    fc1 = _fc1_args(args, ln_out)
    (fc1_out,), (fc1_input, fc1_weight) = linear_forward(
        _forward_only(fc1) if plan.recompute else fc1
    )
    act_out = activation_forward(
        args.activation, fc1_out, dtype, *activation_params_of(args.activation_params)
    )
    fc2 = _fc2_args(args, act_out, fc1)
    (out,), (fc2_input, fc2_weight) = linear_forward(_forward_only(fc2) if plan.recompute else fc2)
    outputs: tuple[Any, ...] = (out, ln_out) if args.return_layernorm_output else (out,)
    if plan.recompute:
        # The weights kept are workspaces made for the module's cache (None otherwise).
        return outputs, (None, None, None, None, None, None, fc1_weight, None, fc2_weight, scales)
    stats = (mu, rsigma) if plan.save_stats else (None, None)
    # A returned norm output is not saved again (a custom op's results must not alias
    # each other): setup_context takes it from the outputs.
    return outputs, (
        *stats,
        ln_out if plan.save_ln_out and not args.return_layernorm_output else None,
        fc1_out if plan.save_fc1_out else None,
        act_out if plan.save_act_out else None,
        fc1_input,
        fc1_weight,
        fc2_input,
        fc2_weight,
        None,
    )


def layernorm_mlp_forward_spec(
    args: LayerNormMLPFwdArgs,
) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    _wgrad.refuse_traced(
        "LayerNormMLPFwdArgs", args.fuse_wgrad_accumulation, args.delay_wgrad_compute
    )
    plan = _forward_plan(args)
    inp = args.inp
    fc1, fc2 = plan.fc1, plan.fc2
    if plan.recompute:
        fc1, fc2 = _forward_only(fc1), _forward_only(fc2)
    (_,), (fc1_input, fc1_weight) = linear_forward_spec(fc1)
    (out,), (fc2_input, fc2_weight) = linear_forward_spec(fc2)
    ln_out = plan.fc1.inp
    outputs: tuple[Any, ...] = (out, ln_out) if args.return_layernorm_output else (out,)
    if plan.recompute:
        scales = _forward_scales_spec(args)
        return outputs, (None, None, None, None, None, None, fc1_weight, None, fc2_weight, scales)
    stats: tuple[Any, ...] = (None, None)
    if plan.save_stats:
        stats = norm_stats_specs(
            args.normalization, math.prod(inp.shape[:-1]), inp.device, inp.dtype
        )
    return outputs, (
        *stats,
        ln_out if plan.save_ln_out and not args.return_layernorm_output else None,
        plan.fc1_out if plan.save_fc1_out else None,
        plan.fc2.inp if plan.save_act_out else None,
        fc1_input,
        fc1_weight,
        fc2_input,
        fc2_weight,
        None,
    )


def layernorm_mlp_setup_context(
    args: LayerNormMLPFwdArgs, outputs: tuple[Any, ...], saved: tuple[Any, ...]
) -> dict[str, Any]:
    mu, rsigma, ln_out, fc1_out, act_out, fc1_input, fc1_weight, fc2_input, fc2_weight = saved[:9]
    plan = _forward_plan(args)
    if args.return_layernorm_output and plan.save_ln_out and not plan.recompute:
        ln_out = outputs[1]  # returned, so not saved a second time
    # Where an intermediate was not kept, its stage's backward does not read it: a
    # spec-shaped stand-in is only asked for its shape.
    fc1 = linear_setup_context(
        _fc1_args(args, ln_out if ln_out is not None else args.inp),
        (),
        (fc1_input, fc1_weight),
    )
    fc2 = linear_setup_context(
        _fc2_args(args, act_out if act_out is not None else plan.fc2.inp, plan.fc1),
        (),
        (fc2_input, fc2_weight),
    )
    grad = args.is_grad_enabled
    fc1_weight_fp8, fc2_weight_fp8 = fc1["weight_fp8"], fc2["weight_fp8"]
    fc1_inputmat, fc2_inputmat = fc1["inputmat"], fc2["inputmat"]
    if plan.recompute:
        # The weights the forward's GEMMs read, for the recompute (nothing else is kept).
        fc1_weight_fp8 = _recompute_weight(_fc1_args(args, args.inp), fc1_weight)
        fc2_weight_fp8 = _recompute_weight(plan.fc2, fc2_weight)
        fc1_inputmat = fc2_inputmat = None
    return dict(
        mu=mu,
        rsigma=rsigma,
        fc1_inputmat=fc1_inputmat,
        fc1_weight_fp8=fc1_weight_fp8,
        ln_out_shape=fc1["inp_shape"],
        fc1_out=fc1_out,
        fc2_inputmat=fc2_inputmat,
        fc2_weight_fp8=fc2_weight_fp8,
        act_shape=torch.Size(fc2["inp_shape"]),
        fc1_requires_dgrad=fc1["requires_dgrad"],
        fc1_requires_wgrad=fc1["requires_wgrad"],
        fc1_use_bias=fc1["use_bias"],
        fc2_requires_dgrad=fc2["requires_dgrad"],
        fc2_requires_wgrad=fc2["requires_wgrad"],
        fc2_use_bias=fc2["use_bias"],
        input_requires_grad=grad and args.input_requires_grad,
        ln_weight_requires_grad=grad and args.ln_weight_requires_grad,
        ln_bias_requires_grad=grad and args.ln_bias is not None and args.ln_bias_requires_grad,
        fc1_wgrad_route=_route(args, args.fc1_weight) if fc1["requires_wgrad"] else None,
        fc2_wgrad_route=_route(args, args.fc2_weight) if fc2["requires_wgrad"] else None,
        checkpoint=plan.recompute,
        ln_bias=args.ln_bias if plan.recompute else None,
        fc1_bias=args.fc1_bias if plan.recompute else None,
        eps=args.eps if plan.recompute else None,
        fprop_gemm=args.fprop_gemm if plan.recompute else None,
        forward_scales=saved[9] if plan.recompute else None,
    )


def _route(args: LayerNormMLPFwdArgs, weight: Any) -> Any:
    return _wgrad.route_of(
        weight, args.fuse_wgrad_accumulation, args.delay_wgrad_compute, args.is_first_microbatch
    )


# --- Backward --------------------------------------------------------------------


def _fc_backward_args(args: LayerNormMLPBwdArgs, fc: int, grad_output: Any) -> Any:
    parallel = args.set_parallel_mode
    first = fc == 1
    stage = linear_backward_stage(
        grad_output=grad_output,
        inputmat=args.fc1_inputmat if first else args.fc2_inputmat,
        weight_fp8=args.fc1_weight_fp8 if first else args.fc2_weight_fp8,
        inp_shape=args.ln_out_shape if first else args.act_shape,
        requires_dgrad=args.fc1_requires_dgrad if first else args.fc2_requires_dgrad,
        requires_wgrad=args.fc1_requires_wgrad if first else args.fc2_requires_wgrad,
        use_bias=args.fc1_use_bias if first else args.fc2_use_bias,
        quantizers=_fc_quantizers(args, fc),
        activation_dtype=args.activation_dtype,
        fp8=args.fp8,
        gemms=(args.dgrad_gemm, args.wgrad_gemm),
        parallel_mode=("column" if first else "row") if parallel else None,
        tp_group=args.tp_group,
        tp_size=args.tp_size,
        sequence_parallel=args.sequence_parallel,
    )
    stage.sr_rng_state = args.sr_rng_state  # fc1's own offset: layernorm_mlp_backward
    stage.wgrad_route = args.fc1_wgrad_route if first else args.fc2_wgrad_route
    return stage


def _fc1_grad_output_spec(args: LayerNormMLPBwdArgs) -> TensorSpec:
    fc1_out = args.fc1_out
    return TensorSpec(tuple(fc1_out.shape), args.activation_dtype, device=fc1_out.device)


def layernorm_mlp_backward(args: LayerNormMLPBwdArgs) -> tuple[torch.Tensor | None, ...]:
    """Gradients of ``(inp, ln_weight, ln_bias, fc1_weight, fc1_bias, fc2_weight,
    fc2_bias)``; None where not required."""
    if args.checkpoint:
        args = _recomputed(args)
    dtype = args.activation_dtype
    d_act, fc2_wgrad, fc2_bgrad = linear_backward(_fc_backward_args(args, 2, args.grad_outputs[0]))
    dgrad = dgamma = dbeta = fc1_wgrad = fc1_bgrad = None
    if args.fc2_requires_dgrad:
        d_fc1 = activation_backward(
            args.activation,
            d_act,
            args.fc1_out,
            dtype,
            *activation_params_of(args.activation_params),
        )
        fc1 = _fc_backward_args(args, 1, d_fc1)
        fc1.sr_rng_state = stage_rng_state(args.sr_rng_state, 1)  # bits of its own
        dln, fc1_wgrad, fc1_bgrad = linear_backward(fc1)
        if args.fc1_requires_dgrad:
            dgrad, dgamma, dbeta = norm_stage_backward(args, dln)
    return dgrad, dgamma, dbeta, fc1_wgrad, fc1_bgrad, fc2_wgrad, fc2_bgrad


def layernorm_mlp_backward_spec(args: LayerNormMLPBwdArgs) -> tuple[TensorSpec | None, ...]:
    if args.checkpoint:
        args = _recomputed_spec(args)
    _, fc2_wgrad, fc2_bgrad = linear_backward_spec(_fc_backward_args(args, 2, args.grad_outputs[0]))
    fc1_wgrad = fc1_bgrad = None
    norm = False
    if args.fc2_requires_dgrad:
        grad = _fc1_grad_output_spec(args)
        _, fc1_wgrad, fc1_bgrad = linear_backward_spec(_fc_backward_args(args, 1, grad))
        norm = args.fc1_requires_dgrad
    return (
        *norm_stage_grad_specs(args, norm),
        fc1_wgrad,
        fc1_bgrad,
        fc2_wgrad,
        fc2_bgrad,
    )


LAYERNORM_MLP = OpDeclaration(
    name="layernorm_mlp",
    forward=LayerNormMLPFwdArgs,
    backward=LayerNormMLPBwdArgs,
    grad_fields=(
        "inp",
        "ln_weight",
        "ln_bias",
        "fc1_weight",
        "fc1_bias",
        "fc2_weight",
        "fc2_bias",
    ),
    forward_impl=layernorm_mlp_forward,
    backward_impl=layernorm_mlp_backward,
    forward_spec=layernorm_mlp_forward_spec,
    backward_spec=layernorm_mlp_backward_spec,
    setup_context=layernorm_mlp_setup_context,
    # Backward fields setup_context computes although a forward field has their name.
    derived=(
        "input_requires_grad",
        "ln_weight_requires_grad",
        "ln_bias_requires_grad",
        "checkpoint",
        "ln_bias",
        "fc1_bias",
    ),
    lowers=True,
    # Compiled calls that run eagerly, with the reason (the generated compile blocker).
    eager_when=(
        ("quantized(inp)", "a quantized input tensor"),
        (
            "fuse_wgrad_accumulation",
            "fused wgrad accumulation into main_grad (fuse_wgrad_accumulation)",
        ),
        ("delay_wgrad_compute", "delayed wgrad compute (delay_wgrad_compute, run by backward_dw)"),
    ),
)


@examples(LayerNormMLPFwdArgs)
def layernorm_mlp_examples(recipe: Any, device: torch.device) -> list[LayerNormMLPFwdArgs]:
    """Bundles the lowering is checked on (``tests/runtime/lowering_check.py``): one per
    activation, taking turns at bf16 and fp32 and at LayerNorm with biases (its output
    returned) and RMSNorm without; and two of them with ``checkpoint``."""
    import typing

    from transformer_engine_ops.ops import _examples

    activations = typing.get_args(Activation)
    # (seed, activation, the example whose dtype and norm it takes, checkpoint): TE's
    # checkpoint on a plain and a gated activation, LayerNorm returning its output and
    # RMSNorm, each on tensors of its own (a tensor two calls share sums two gradients).
    cases = [(i, activation, i, False) for i, activation in enumerate(activations)]
    cases += [(len(cases), "gelu", 0, True), (len(cases) + 1, "swiglu", 6, True)]
    bundles = []
    for seed, activation, like, checkpoint in cases:
        dtype = _examples.DTYPES[like % len(_examples.DTYPES)]
        make = _examples.random_tensors(seed, dtype, device)
        layernorm = like // 2 % 2 == 0
        quantizers = {
            **_examples.quantizer_fields(recipe, "fc1_"),
            **_examples.quantizer_fields(recipe, "fc2_"),
        }
        fc1_rows = 128 if activation in GATED else 64
        ln_bias, fc1_bias, fc2_bias = (
            (make(64), make(fc1_rows), make(64)) if layernorm else (None, None, None)
        )
        bundles.append(
            LayerNormMLPFwdArgs(
                inp=make(4, 16, 64),
                ln_weight=make(64),
                ln_bias=ln_bias,
                fc1_weight=make(fc1_rows, 64),
                fc1_bias=fc1_bias,
                fc2_weight=make(64, 64),
                fc2_bias=fc2_bias,
                fc1_weight_workspace=None,
                fc2_weight_workspace=None,
                is_first_microbatch=None,
                cache_weight=False,
                input_requires_grad=True,
                ln_weight_requires_grad=True,
                ln_bias_requires_grad=layernorm,
                fc1_weight_requires_grad=True,
                fc1_bias_requires_grad=layernorm,
                fc2_weight_requires_grad=True,
                fc2_bias_requires_grad=layernorm,
                normalization="LayerNorm" if layernorm else "RMSNorm",
                eps=1e-5,
                zero_centered_gamma=False,
                return_layernorm_output=layernorm,
                activation=activation,
                **quantizers,
                activation_dtype=dtype,
                **_examples.gemm_fields(recipe),
                set_parallel_mode=False,
                tp_group=None,
                tp_size=1,
                sequence_parallel=False,
                hidden_size=64,
                ffn_hidden_size=64,
                is_grad_enabled=True,
                sr_rng_state=_examples.rng_state(quantizers, device),
                activation_params=(
                    ClampedSwiGLUParams(limit=0.5, alpha=1.5, glu_linear_offset=0.25)
                    if activation == "clamped_swiglu"
                    else None
                ),
                checkpoint=checkpoint,
            )
        )
    return bundles
