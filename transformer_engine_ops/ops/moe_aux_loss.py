"""The MoE auxiliary-loss op: TE's ``fused_moe_aux_loss``, the load-balancing loss

    loss = sum_e (sum_t probs[t, e]) * tokens_per_expert[e] * C,
    C = num_experts * coeff / (topk * total_num_tokens ** 2)

(Switch Transformer's, as Megatron scales it). ``probs`` may hold several sequences'
experts side by side (``num_experts`` times a multiplier columns: the sequence loss).
The sums are fp32 inside the op, so a compiled call adds in eager's order; the loss is
a 0-d tensor of ``probs``' dtype. ``total_num_tokens`` is a host int (``C`` folded on
the host) or a 0-d integer tensor (``C`` computed on the device: nothing read on the
host, so a CUDA graph replays with the tensor's current value). The gradient is
``tokens_per_expert[e] * C`` times the loss's gradient, for every token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch

from transformer_engine_ops.runtime.declaration import OpDeclaration
from transformer_engine_ops.runtime.precision import math_dtype
from transformer_engine_ops.runtime.tensor_spec import TensorSpec


@dataclass
class MoeAuxLossFwdArgs:
    """Everything the load-balancing loss needs."""

    probs: torch.Tensor  # [T, C]
    tokens_per_expert: torch.Tensor  # [C]: int32/int64/fp32/bf16

    # --- The token count: a host int, or a 0-d integer tensor (exactly one given) ---
    total_num_tokens: Optional[int]
    total_num_tokens_tensor: Optional[torch.Tensor]

    num_experts: int
    topk: int
    coeff: float

    probs_requires_grad: bool

    # --- Autograd state ---
    is_grad_enabled: bool


@dataclass
class MoeAuxLossBwdArgs:
    """Everything the loss's backward needs."""

    grad_outputs: list[torch.Tensor]

    tokens_per_expert: torch.Tensor
    coefficient: torch.Tensor  # 0-d, the math dtype: C
    probs_shape: list[int]
    probs_dtype: torch.dtype

    requires_dgrad: bool


def _plan(args: MoeAuxLossFwdArgs) -> torch.dtype:
    """Checks the bundle; the math dtype."""
    where = "MoeAuxLossFwdArgs"
    probs, tpe = args.probs, args.tokens_per_expert
    if len(probs.shape) != 2 or not probs.dtype.is_floating_point:
        raise ValueError(
            f"{where}.probs: float [num_tokens, num_experts] expected, got {probs.dtype} "
            f"{tuple(probs.shape)}"
        )
    if tuple(tpe.shape) != (probs.shape[1],):
        raise ValueError(
            f"{where}.tokens_per_expert: shape {tuple(tpe.shape)}, expected "
            f"({probs.shape[1]},) (one per column of probs)"
        )
    host, device = args.total_num_tokens, args.total_num_tokens_tensor
    if (host is None) == (device is None):
        raise ValueError(
            f"{where}: exactly one of total_num_tokens (a host int) and "
            "total_num_tokens_tensor (a 0-d tensor) is given"
        )
    if device is not None and (len(device.shape) != 0 or device.dtype.is_floating_point):
        raise ValueError(
            f"{where}.total_num_tokens_tensor: a 0-d integer tensor expected, got "
            f"{device.dtype} {tuple(device.shape)}"
        )
    if args.topk <= 0 or args.num_experts <= 0:
        raise ValueError(
            f"{where}: topk ({args.topk}) and num_experts ({args.num_experts}) must be positive"
        )
    return math_dtype(probs.dtype)


def _coefficient(args: MoeAuxLossFwdArgs, dtype: torch.dtype) -> torch.Tensor:
    """``C`` as a 0-d tensor of ``dtype`` on the probabilities' device."""
    device = args.probs.device
    scale = args.num_experts * args.coeff
    if args.total_num_tokens is not None:
        total = args.total_num_tokens
        return torch.full((), scale / (args.topk * total * total), dtype=dtype, device=device)
    total = args.total_num_tokens_tensor.to(device=device, dtype=torch.float64)
    return (scale / (args.topk * total * total)).to(dtype)


def moe_aux_loss_forward(args: MoeAuxLossFwdArgs) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """``((loss,), (C,))``."""
    dtype = _plan(args)
    probs = args.probs
    c = _coefficient(args, dtype)
    per_expert = probs.to(dtype).sum(dim=0)
    loss = (per_expert * args.tokens_per_expert.to(dtype)).sum() * c
    return (loss.to(probs.dtype),), (c,)


def moe_aux_loss_forward_spec(args: MoeAuxLossFwdArgs) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    dtype = _plan(args)
    device = args.probs.device
    return (TensorSpec((), args.probs.dtype, device=device),), (
        TensorSpec((), dtype, device=device),
    )


def moe_aux_loss_setup_context(
    args: MoeAuxLossFwdArgs, outputs: tuple[Any, ...], saved: tuple[Any, ...]
) -> dict[str, Any]:
    return dict(
        coefficient=saved[0],
        probs_shape=list(args.probs.shape),
        probs_dtype=args.probs.dtype,
        requires_dgrad=args.is_grad_enabled and args.probs_requires_grad,
    )


def moe_aux_loss_backward(args: MoeAuxLossBwdArgs) -> tuple[Optional[torch.Tensor]]:
    """``grad * C * tokens_per_expert[e]`` at every ``[t, e]``."""
    if not args.requires_dgrad:
        return (None,)
    c = args.coefficient
    g = args.grad_outputs[0].to(c.dtype)
    per_column = args.tokens_per_expert.to(c.dtype) * c * g
    return (per_column.to(args.probs_dtype).expand(args.probs_shape).contiguous(),)


def moe_aux_loss_backward_spec(args: MoeAuxLossBwdArgs) -> tuple[Optional[TensorSpec]]:
    if not args.requires_dgrad:
        return (None,)
    device = args.coefficient.device
    return (TensorSpec(tuple(args.probs_shape), args.probs_dtype, device=device),)


MOE_AUX_LOSS = OpDeclaration(
    name="moe_aux_loss",
    forward=MoeAuxLossFwdArgs,
    backward=MoeAuxLossBwdArgs,
    grad_fields=("probs",),
    forward_impl=moe_aux_loss_forward,
    backward_impl=moe_aux_loss_backward,
    forward_spec=moe_aux_loss_forward_spec,
    backward_spec=moe_aux_loss_backward_spec,
    setup_context=moe_aux_loss_setup_context,
)
