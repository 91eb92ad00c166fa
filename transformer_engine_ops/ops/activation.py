"""The activation op: one of TE's activations on the last dim, as LayerNormMLP computes
it between its GEMMs, for the MoE experts' ``GroupedLinear`` pair.

The activations and their math are LayerNormMLP's (``layernorm_mlp.activation_forward``
and ``activation_backward``: fp32 math, one rounding; on CUDA one fused Triton kernel
each way): plain ones keep the width, gated ones (``swiglu``, ``geglu``, ...) halve it,
the first half gating the second as in TE. As an op node the activation computes
eager's bits in every compile (Inductor would regenerate the transcendental functions
its own way, which differs with the host's vector width).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from transformer_engine_ops.ops import layernorm_mlp
from transformer_engine_ops.ops.layernorm_mlp import ACTIVATIONS, GATED, Activation
from transformer_engine_ops.runtime.declaration import OpDeclaration
from transformer_engine_ops.runtime.tensor_spec import TensorSpec


@dataclass
class ActivationFwdArgs:
    """Everything one activation needs."""

    inp: torch.Tensor  # [..., D] (gated: D even)
    activation: Activation
    # clamped_swiglu's parameters (TE's ClampedSwiGLUParams); the others ignore them
    limit: float
    alpha: float
    glu_linear_offset: float

    inp_requires_grad: bool

    # --- Autograd state ---
    is_grad_enabled: bool


@dataclass
class ActivationBwdArgs:
    """Everything the activation's backward needs."""

    grad_outputs: list[torch.Tensor]

    inp: torch.Tensor
    activation: Activation
    limit: float
    alpha: float
    glu_linear_offset: float

    requires_dgrad: bool


def _out_shape(args: ActivationFwdArgs) -> tuple[Any, ...]:
    where = "ActivationFwdArgs"
    inp, name = args.inp, args.activation
    if name not in ACTIVATIONS:
        raise ValueError(f"{where}.activation: one of {ACTIVATIONS}, got {name!r}")
    if len(inp.shape) < 1 or not inp.dtype.is_floating_point:
        raise ValueError(
            f"{where}.inp: a float tensor [..., D] expected, got {inp.dtype} {tuple(inp.shape)}"
        )
    width = inp.shape[-1]
    if name in GATED:
        if width % 2:
            raise ValueError(f"{where}.inp: {name} halves the last dim, got an odd {width}")
        width = width // 2
    return (*inp.shape[:-1], width)


def activation_forward(args: ActivationFwdArgs) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """``((out,), ())``: ``out`` of the input's dtype."""
    _out_shape(args)
    inp = args.inp
    out = layernorm_mlp.activation_forward(
        args.activation, inp, inp.dtype, args.limit, args.alpha, args.glu_linear_offset
    )
    return (out,), ()


def activation_forward_spec(
    args: ActivationFwdArgs,
) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    inp = args.inp
    return (TensorSpec(_out_shape(args), inp.dtype, device=inp.device),), ()


def activation_setup_context(
    args: ActivationFwdArgs, outputs: tuple[Any, ...], saved: tuple[Any, ...]
) -> dict[str, Any]:
    return dict(
        requires_dgrad=args.is_grad_enabled and args.inp_requires_grad,
    )


def activation_backward(args: ActivationBwdArgs) -> tuple[Any]:
    if not args.requires_dgrad:
        return (None,)
    inp = args.inp
    dgrad = layernorm_mlp.activation_backward(
        args.activation,
        args.grad_outputs[0],
        inp,
        inp.dtype,
        args.limit,
        args.alpha,
        args.glu_linear_offset,
    )
    return (dgrad,)


def activation_backward_spec(args: ActivationBwdArgs) -> tuple[Any]:
    if not args.requires_dgrad:
        return (None,)
    inp = args.inp
    return (TensorSpec(tuple(inp.shape), inp.dtype, device=inp.device),)


ACTIVATION = OpDeclaration(
    name="activation",
    forward=ActivationFwdArgs,
    backward=ActivationBwdArgs,
    grad_fields=("inp",),
    forward_impl=activation_forward,
    backward_impl=activation_backward,
    forward_spec=activation_forward_spec,
    backward_spec=activation_backward_spec,
    setup_context=activation_setup_context,
)
