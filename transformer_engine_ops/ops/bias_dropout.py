"""The bias-dropout op of TE's bias-dropout-add: ``drop_path(dropout(inp + bias))``.

``TransformerLayer`` ends each sublayer with ``residual + drop_path(dropout(out +
bias))`` (TE's bias-dropout-add). The residual add stays in the module: one rounding of
two stored tensors, which Inductor computes as eager does. Everything before it is this
op. Inductor would otherwise regenerate it its own way: the bias gradient is a sum over
every token (Inductor's reduction order is not eager's, and depends on the host's vector
width), the bias add and the residual add would fuse into one rounding where eager rounds
twice, and dropout's mask would come from Inductor's generator instead of torch's. As an
op node the whole piece computes eager's bits in every compile: the same kernels, the
same random numbers for the same generator state.

Dropout is ``torch.native_dropout`` (mask kept for the backward); stochastic depth
(``drop_path``, TE's ``DropPath``) draws one keep flag per sample (dim 0) with
``keep + rand`` floored, in the input's dtype, and scales the kept samples by ``1 / keep``;
``drop_path=1.0`` drops every sample (zeros, where TE's ``0 / 0`` gives NaN).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch

from transformer_engine_ops.runtime.declaration import OpDeclaration
from transformer_engine_ops.runtime.tensor_spec import TensorSpec


@dataclass
class BiasDropoutFwdArgs:
    """Everything ``drop_path(dropout(inp + bias))`` needs."""

    # --- Differentiable inputs ---
    inp: torch.Tensor
    bias: Optional[torch.Tensor]  # broadcastable against inp (a vector, or inp's shape)

    inp_requires_grad: bool
    bias_requires_grad: bool

    # --- Randomness (applied in training only) ---
    dropout: float  # probability of zeroing an element
    drop_path: float  # probability of zeroing a sample (dim 0)
    training: bool

    # --- Autograd state ---
    is_grad_enabled: bool


@dataclass
class BiasDropoutBwdArgs:
    """Everything the bias-dropout backward needs."""

    grad_outputs: list[torch.Tensor]

    # --- Saved by the forward (None where the forward drew nothing) ---
    dropout_mask: Optional[torch.Tensor]  # bool, inp's shape
    drop_path_mask: Optional[torch.Tensor]  # inp's dtype, [batch, 1, ...]

    bias: Optional[torch.Tensor]  # its shape and dtype: what the bias gradient sums to
    inp_dtype: torch.dtype  # the input gradient's dtype

    dropout: float
    drop_path: float
    requires_dgrad: bool
    requires_bgrad: bool


def _check(args: BiasDropoutFwdArgs) -> None:
    where = "BiasDropoutFwdArgs"
    for name in ("dropout", "drop_path"):
        p = getattr(args, name)
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"{where}.{name}: a probability in [0, 1], got {p}")
    bias, inp = args.bias, args.inp
    if bias is not None:
        try:
            torch.broadcast_shapes(tuple(bias.shape), tuple(inp.shape))
        except RuntimeError:
            raise ValueError(
                f"{where}.bias: shape {tuple(bias.shape)} does not broadcast against inp "
                f"{tuple(inp.shape)}"
            ) from None
        if torch.broadcast_shapes(tuple(bias.shape), tuple(inp.shape)) != tuple(inp.shape):
            raise ValueError(
                f"{where}.bias: shape {tuple(bias.shape)} would grow inp {tuple(inp.shape)}"
            )
    if args.drop_path and args.training and len(inp.shape) == 0:
        raise ValueError(f"{where}.inp: drop_path needs a batch dimension, got a scalar")


def _draws(args: BiasDropoutFwdArgs) -> tuple[bool, bool]:
    """Whether the call draws a dropout mask and a drop-path mask."""
    return args.training and args.dropout > 0.0, args.training and args.drop_path > 0.0


def _out_dtype(args: BiasDropoutFwdArgs) -> torch.dtype:
    """``inp + bias``'s dtype: torch's promotion, as TE's eager add promotes."""
    inp, bias = args.inp, args.bias
    return inp.dtype if bias is None else torch.promote_types(inp.dtype, bias.dtype)


def _path_shape(inp: Any) -> tuple[Any, ...]:
    return (inp.shape[0],) + (1,) * (len(inp.shape) - 1)


def bias_dropout_forward(args: BiasDropoutFwdArgs) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """``((out,), (dropout_mask, drop_path_mask))``, ``out`` in ``inp + bias``'s dtype."""
    _check(args)
    dropping, pathing = _draws(args)
    h = args.inp if args.bias is None else args.inp + args.bias
    dropout_mask = drop_path_mask = None
    if dropping:
        h, dropout_mask = torch.native_dropout(h, args.dropout, True)
    if pathing:
        keep = 1.0 - args.drop_path
        drop_path_mask = (keep + torch.rand(_path_shape(h), dtype=h.dtype, device=h.device)).floor()
        # Every sample dropped (keep 0) leaves zeros: no survivor to scale by 1 / 0.
        h = (h.div(keep) if keep else h) * drop_path_mask
    if h is args.inp:  # nothing to add or draw: an op's output is never its input
        h = h.clone()
    return (h,), (dropout_mask, drop_path_mask)


def bias_dropout_forward_spec(
    args: BiasDropoutFwdArgs,
) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    _check(args)
    inp = args.inp
    dropping, pathing = _draws(args)
    dtype = _out_dtype(args)
    out = TensorSpec(tuple(inp.shape), dtype, device=inp.device)
    dropout_mask = TensorSpec(tuple(inp.shape), torch.bool, device=inp.device) if dropping else None
    drop_path_mask = TensorSpec(_path_shape(inp), dtype, device=inp.device) if pathing else None
    return (out,), (dropout_mask, drop_path_mask)


def bias_dropout_setup_context(
    args: BiasDropoutFwdArgs, outputs: tuple[Any, ...], saved: tuple[Any, ...]
) -> dict[str, Any]:
    dropout_mask, drop_path_mask = saved
    grad = args.is_grad_enabled
    return dict(
        dropout_mask=dropout_mask,
        drop_path_mask=drop_path_mask,
        inp_dtype=args.inp.dtype,
        requires_dgrad=grad and args.inp_requires_grad,
        requires_bgrad=grad and args.bias is not None and args.bias_requires_grad,
    )


def bias_dropout_backward(args: BiasDropoutBwdArgs) -> tuple[torch.Tensor | None, ...]:
    """Gradients of ``(inp, bias)``: the forward's masks and scales applied in reverse
    order, rounding where the forward rounded; the bias gradient summed over the
    dimensions the bias was broadcast along."""
    if not (args.requires_dgrad or args.requires_bgrad):
        return None, None
    g = args.grad_outputs[0]
    if args.drop_path_mask is not None:
        keep = 1.0 - args.drop_path
        g = g * args.drop_path_mask
        g = g.div(keep) if keep else g
    if args.dropout_mask is not None:
        g = torch.ops.aten.native_dropout_backward(g, args.dropout_mask, _scale(args.dropout))
    dgrad = bgrad = None
    if args.requires_dgrad:
        dgrad = g.to(args.inp_dtype)
        if dgrad is args.grad_outputs[0]:  # a gradient op never returns its input
            dgrad = dgrad.clone()
    if args.requires_bgrad:
        bias = args.bias
        bgrad = g.sum_to_size(bias.shape).to(bias.dtype)
        if bgrad is g or bgrad is dgrad or bgrad is args.grad_outputs[0]:
            bgrad = bgrad.clone()
    return dgrad, bgrad


def _scale(p: float) -> float:
    return 0.0 if p == 1.0 else 1.0 / (1.0 - p)


def bias_dropout_backward_spec(args: BiasDropoutBwdArgs) -> tuple[TensorSpec | None, ...]:
    if not (args.requires_dgrad or args.requires_bgrad):
        return None, None
    g = args.grad_outputs[0]
    dgrad = (
        TensorSpec(tuple(g.shape), args.inp_dtype, device=g.device) if args.requires_dgrad else None
    )
    bgrad = None
    if args.requires_bgrad:
        bias = args.bias
        bgrad = TensorSpec(tuple(bias.shape), bias.dtype, device=g.device)
    return dgrad, bgrad


BIAS_DROPOUT = OpDeclaration(
    name="bias_dropout",
    forward=BiasDropoutFwdArgs,
    backward=BiasDropoutBwdArgs,
    grad_fields=("inp", "bias"),
    forward_impl=bias_dropout_forward,
    backward_impl=bias_dropout_backward,
    forward_spec=bias_dropout_forward_spec,
    backward_spec=bias_dropout_backward_spec,
    setup_context=bias_dropout_setup_context,
)
