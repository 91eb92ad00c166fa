"""The LayerNorm / RMSNorm op: its argument bundles, math and op declaration.

One op serves both normalizations (``normalization`` is a Literal field). The forward
computes in fp32 and saves ``mu`` (LayerNorm only) and ``rsigma`` per row; the backward
recomputes the normalized input from them, in fp32. The norm math here
(:func:`norm_forward`, :func:`norm_backward`) is shared with the fused ops
(``layernorm_linear``, ``layernorm_mlp``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple, Optional

import torch

from transformer_engine_ops.kernels import norm_kernels
from transformer_engine_ops.runtime.declaration import OpDeclaration
from transformer_engine_ops.runtime.lowering import exact, examples
from transformer_engine_ops.runtime.precision import math_dtype
from transformer_engine_ops.runtime.tensor_spec import TensorSpec

Normalization = Literal["LayerNorm", "RMSNorm"]


@dataclass
class LayerNormFwdArgs:
    """Everything the standalone LayerNorm / RMSNorm forward needs."""

    # --- Differentiable inputs ---
    inp: torch.Tensor
    weight: torch.Tensor
    bias: Optional[torch.Tensor]  # None for RMSNorm

    # --- requires_grad, recorded so the backward does not re-query ---
    input_requires_grad: bool
    weight_requires_grad: bool
    bias_requires_grad: bool

    # --- Numerics ---
    normalization: Normalization
    eps: float
    zero_centered_gamma: bool

    # --- Autograd state ---
    is_grad_enabled: bool


@dataclass
class LayerNormBwdArgs:
    """Everything the LayerNorm / RMSNorm backward needs."""

    grad_outputs: list[torch.Tensor]

    # --- Saved by the forward ---
    inp: torch.Tensor
    weight: torch.Tensor
    mu: Optional[torch.Tensor]  # None for RMSNorm
    rsigma: Optional[torch.Tensor]  # None when the forward ran without a backward

    # --- What to compute ---
    requires_dgrad: bool
    requires_wgrad: bool
    requires_bgrad: bool

    normalization: Normalization
    zero_centered_gamma: bool


# --- The norm math (shared with the fused ops) --------------------------------------


_NORMALIZATIONS = ("LayerNorm", "RMSNorm")


def check_norm(
    normalization: str, weight: Any, bias: Any, hidden: int, where: str, bias_name: str = "bias"
) -> None:
    """Validate a norm's configuration against the input's hidden size (real and fake)."""
    if normalization not in _NORMALIZATIONS:
        raise ValueError(
            f"{where}.normalization: expected one of {_NORMALIZATIONS}, got {normalization!r}"
        )
    if tuple(weight.shape) != (hidden,):
        raise ValueError(
            f"{where}: the norm weight has shape {tuple(weight.shape)}, but the input's "
            f"last dim is {hidden} (expected ({hidden},))"
        )
    if normalization == "RMSNorm" and bias is not None:
        raise ValueError(f"{where}.{bias_name}: RMSNorm has no bias; pass None")
    if bias is not None and tuple(bias.shape) != (hidden,):
        raise ValueError(f"{where}.{bias_name}: shape {tuple(bias.shape)}, expected ({hidden},)")


def norm_stats_specs(
    normalization: str, rows: Any, device: Any, dtype: torch.dtype
) -> tuple[TensorSpec | None, TensorSpec]:
    """``(mu, rsigma)`` as specs for an input of ``dtype``: in its math dtype (fp32, or
    float64 for float64 data), one per row; no mu for RMSNorm."""
    stats = math_dtype(dtype)
    rsigma = TensorSpec((rows,), stats, device=device)
    mu = TensorSpec((rows,), stats, device=device) if normalization == "LayerNorm" else None
    return mu, rsigma


def _gamma(weight: torch.Tensor, zero_centered_gamma: bool, dtype: torch.dtype) -> torch.Tensor:
    gamma = weight.to(dtype)
    return gamma + 1.0 if zero_centered_gamma else gamma


def norm_forward(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    normalization: str,
    eps: float,
    zero_centered_gamma: bool,
    out_dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """``(y, mu, rsigma)`` of the rows of ``x`` (2-D); fp32 math (float64 for float64
    ``x``), ``y`` in ``out_dtype``; no ``mu`` for RMSNorm."""
    layernorm = normalization == "LayerNorm"
    y, mu, rsigma = _norm_forward(x, weight, bias, layernorm, eps, zero_centered_gamma, out_dtype)
    return y, (mu if layernorm else None), rsigma


# The row statistics are reductions: kept whole in a lowered graph (runtime/lowering.py).
# On CUDA both pieces run the fused Triton kernels of ``norm_kernels`` (one read, fp32
# math, one rounded write), so eager and a lowered graph run the same kernel; elsewhere
# the torch ops below.
@exact(
    "norm_forward(Tensor x, Tensor weight, Tensor? bias, bool layernorm, float eps, "
    "bool zero_centered_gamma, ScalarType out_dtype) -> (Tensor, Tensor, Tensor)"
)
def _norm_forward(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    layernorm: bool,
    eps: float,
    zero_centered_gamma: bool,
    out_dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`norm_forward` with a 0-element ``mu`` for RMSNorm (an op returns tensors
    only)."""
    if norm_kernels.eligible(x, weight, bias, out_dtype=out_dtype):
        return norm_kernels.fused_norm_forward(
            x, weight, bias, layernorm, eps, zero_centered_gamma, out_dtype
        )
    # Contiguous rows: a reduction's order follows its operand's strides, and TE's
    # kernels read a transposed input as its contiguous copy (the same bits).
    xf = x.to(math_dtype(x.dtype)).contiguous()
    if layernorm:
        mu = xf.mean(-1)
        centered = xf - mu.unsqueeze(-1)
    else:
        mu, centered = xf.new_empty(0), xf
    rsigma = torch.rsqrt(centered.square().mean(-1) + eps)
    y = centered * rsigma.unsqueeze(-1) * _gamma(weight, zero_centered_gamma, xf.dtype)
    if bias is not None:
        y = y + bias.to(xf.dtype)
    return y.to(out_dtype), mu, rsigma


def norm_backward(
    dy: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    mu: torch.Tensor | None,
    rsigma: torch.Tensor,
    zero_centered_gamma: bool,
    need_dgrad: bool = True,
    dy_extra: torch.Tensor | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]:
    """``(dx or None, dgamma, dbeta)`` for rows ``x`` (2-D), computed in the math dtype
    of ``x`` (fp32; float64 for float64 ``x``): ``dx`` rounded once to ``x``'s dtype,
    ``dgamma``/``dbeta`` in the math dtype; the output gradient is ``dy``, plus
    ``dy_extra`` when given (summed in the math dtype)."""
    dx, dgamma, dbeta = _norm_backward(
        dy, dy_extra, x, weight, mu, rsigma, zero_centered_gamma, need_dgrad
    )
    return (dx if need_dgrad else None), dgamma, dbeta


@exact(
    "norm_backward(Tensor dy, Tensor? dy_extra, Tensor x, Tensor weight, Tensor? mu, "
    "Tensor rsigma, bool zero_centered_gamma, bool need_dgrad) -> (Tensor, Tensor, Tensor)"
)
def _norm_backward(
    dy: torch.Tensor,
    dy_extra: torch.Tensor | None,
    x: torch.Tensor,
    weight: torch.Tensor,
    mu: torch.Tensor | None,
    rsigma: torch.Tensor,
    zero_centered_gamma: bool,
    need_dgrad: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`norm_backward` with a 0-element ``dx`` where none is needed (an op returns
    tensors only). The output gradients are widened here, not by the caller: a 16-bit
    value widened outside would, traced, lose its rounding to older Inductors (which
    fold a narrowing cast followed by a widening one). ``dx`` is narrowed here too: the
    kernel then writes it once in ``x``'s dtype, not in fp32 for a cast to read."""
    if norm_kernels.eligible(x, dy, dy_extra, weight, mu, rsigma):
        return norm_kernels.fused_norm_backward(
            dy, dy_extra, x, weight, mu, rsigma, zero_centered_gamma, need_dgrad
        )
    dtype = math_dtype(x.dtype)
    # Contiguous, as in the forward: the sums over rows and columns then run in one
    # order whatever the strides of the input and of the output gradient.
    xf = x.to(dtype).contiguous()
    dyf = dy.to(dtype) if dy_extra is None else dy.to(dtype) + dy_extra.to(dtype)
    dyf = dyf.contiguous()
    r = rsigma.unsqueeze(-1)
    xhat = (xf - mu.unsqueeze(-1)) * r if mu is not None else xf * r
    dgamma = (dyf * xhat).sum(0)
    dbeta = dyf.sum(0)
    if not need_dgrad:
        return x.new_empty(0), dgamma, dbeta
    g = dyf * _gamma(weight, zero_centered_gamma, dtype)
    proj = (g * xhat).mean(-1, keepdim=True)
    if mu is not None:
        g = g - g.mean(-1, keepdim=True)
    return (r * (g - xhat * proj)).to(x.dtype), dgamma, dbeta


# --- The plan: what the real and fake kernels share ---------------------------------


class _ForwardPlan(NamedTuple):
    rows: Any  # product of the leading dims
    save_stats: bool  # keep mu/rsigma for a backward


def _forward_plan(args: LayerNormFwdArgs) -> _ForwardPlan:
    hidden = args.inp.shape[-1]
    check_norm(args.normalization, args.weight, args.bias, hidden, "LayerNormFwdArgs")
    needs_grad = args.input_requires_grad or args.weight_requires_grad or args.bias_requires_grad
    return _ForwardPlan(math.prod(args.inp.shape[:-1]), args.is_grad_enabled and needs_grad)


# --- Kernels --------------------------------------------------------------------------


def layernorm_forward(args: LayerNormFwdArgs) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """``((out,), (mu, rsigma))``; out in the input's dtype, stats None without a backward."""
    plan = _forward_plan(args)
    inp = args.inp
    y, mu, rsigma = norm_forward(
        inp.reshape(-1, inp.shape[-1]),
        args.weight,
        args.bias,
        args.normalization,
        args.eps,
        args.zero_centered_gamma,
        inp.dtype,
    )
    if not plan.save_stats:
        return (y.view(inp.shape),), (None, None)
    return (y.view(inp.shape),), (mu, rsigma)


def layernorm_forward_spec(args: LayerNormFwdArgs) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    plan = _forward_plan(args)
    inp = args.inp
    out = TensorSpec(tuple(inp.shape), inp.dtype, device=inp.device)
    if not plan.save_stats:
        return (out,), (None, None)
    return (out,), norm_stats_specs(args.normalization, plan.rows, inp.device, inp.dtype)


def layernorm_setup_context(
    args: LayerNormFwdArgs, outputs: tuple[Any, ...], saved: tuple[Any, ...]
) -> dict[str, Any]:
    mu, rsigma = saved
    return dict(
        mu=mu,
        rsigma=rsigma,
        requires_dgrad=args.is_grad_enabled and args.input_requires_grad,
        requires_wgrad=args.is_grad_enabled and args.weight_requires_grad,
        requires_bgrad=args.is_grad_enabled and args.bias is not None and args.bias_requires_grad,
    )


def layernorm_backward(args: LayerNormBwdArgs) -> tuple[torch.Tensor | None, ...]:
    """Gradients of ``(inp, weight, bias)``; None for those not required."""
    if not (args.requires_dgrad or args.requires_wgrad or args.requires_bgrad):
        return None, None, None  # the forward ran without a backward (no stats saved)
    inp = args.inp
    dy = args.grad_outputs[0]
    dx, dgamma, dbeta = norm_backward(
        dy.reshape(-1, dy.shape[-1]),
        inp.reshape(-1, inp.shape[-1]),
        args.weight,
        args.mu,
        args.rsigma,
        args.zero_centered_gamma,
        need_dgrad=args.requires_dgrad,
    )
    dgrad = dx.view(inp.shape) if args.requires_dgrad else None
    wgrad = dgamma.to(args.weight.dtype) if args.requires_wgrad else None
    bgrad = dbeta.to(args.weight.dtype) if args.requires_bgrad else None
    return dgrad, wgrad, bgrad


def layernorm_backward_spec(args: LayerNormBwdArgs) -> tuple[TensorSpec | None, ...]:
    inp, weight = args.inp, args.weight
    dgrad = TensorSpec(tuple(inp.shape), inp.dtype, device=inp.device)
    wgrad = TensorSpec(tuple(weight.shape), weight.dtype, device=inp.device)
    bgrad = TensorSpec(tuple(weight.shape), weight.dtype, device=inp.device)
    return (
        dgrad if args.requires_dgrad else None,
        wgrad if args.requires_wgrad else None,
        bgrad if args.requires_bgrad else None,
    )


LAYERNORM = OpDeclaration(
    name="layernorm",
    forward=LayerNormFwdArgs,
    backward=LayerNormBwdArgs,
    grad_fields=("inp", "weight", "bias"),
    forward_impl=layernorm_forward,
    backward_impl=layernorm_backward,
    forward_spec=layernorm_forward_spec,
    backward_spec=layernorm_backward_spec,
    setup_context=layernorm_setup_context,
    lowers=True,
    eager_when=(("quantized(inp)", "a quantized input tensor"),),
)


@examples(LayerNormFwdArgs)
def layernorm_examples(recipe: Any, device: torch.device) -> list[LayerNormFwdArgs]:
    """Bundles the lowering is checked on (``tests/runtime/lowering_check.py``): LayerNorm
    (zero-centered gamma too) and RMSNorm, in bf16 and fp32. No quantizer field: the op
    takes no recipe."""
    if recipe is not None:
        return []
    from transformer_engine_ops.ops import _examples

    bundles = []
    for seed, dtype in enumerate(_examples.DTYPES):
        make = _examples.random_tensors(seed, dtype, device)
        for normalization, zero_centered in (
            ("LayerNorm", False),
            ("LayerNorm", True),
            ("RMSNorm", False),
        ):
            bias = make(64) if normalization == "LayerNorm" else None
            bundles.append(
                LayerNormFwdArgs(
                    inp=make(4, 16, 64),
                    weight=make(64),
                    bias=bias,
                    input_requires_grad=True,
                    weight_requires_grad=True,
                    bias_requires_grad=bias is not None,
                    normalization=normalization,
                    eps=1e-5,
                    zero_centered_gamma=zero_centered,
                    is_grad_enabled=True,
                )
            )
    return bundles
