"""The L2 normalization op: each vector of the last dimension scaled to unit L2 norm.

``y = x * rsqrt(sum(x^2) + eps)`` over the last dimension, with no parameter (TE's
``L2Normalization``, the ``qk_norm_type="L2Normalization"`` query/key norm of
``MultiheadAttention``). The math is TE's: fp32 (float64 for float64 data) whatever
the input's dtype, the output rounded once to it; the forward saves the per-row
``rsqrt(sum(x^2) + eps)`` and the backward recomputes ``sum(x^2)`` from the input:
``dx = r * (dy - x * sum(x * dy) / (sum(x^2) + eps))``.

Both directions are row reductions, so each is a piece marked :func:`exact`: a lowered
graph records it as one op running this function, and compiled calls keep eager's bits
on every host (Inductor would sum the rows in its own order).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

import torch

from transformer_engine_ops.runtime.declaration import OpDeclaration
from transformer_engine_ops.runtime.lowering import exact, examples
from transformer_engine_ops.runtime.precision import math_dtype
from transformer_engine_ops.runtime.tensor_spec import TensorSpec


@dataclass
class L2NormalizationFwdArgs:
    """Everything the L2 normalization forward needs."""

    # --- Differentiable input ---
    inp: torch.Tensor  # [..., hidden]; normalized over the last dim

    input_requires_grad: bool

    # --- Numerics ---
    eps: float  # added to the sum of squares

    # --- Autograd state ---
    is_grad_enabled: bool


@dataclass
class L2NormalizationBwdArgs:
    """Everything the L2 normalization backward needs."""

    grad_outputs: list[torch.Tensor]

    # --- Saved by the forward ---
    inp: torch.Tensor
    rsqrt_norm: Optional[torch.Tensor]  # per row; None when the forward kept no backward

    eps: float
    requires_dgrad: bool


def _check(inp: Any, where: str) -> None:
    if len(inp.shape) < 1:
        raise ValueError(f"{where}.inp: a 0-dim tensor has no last dimension to normalize")


@exact("l2_norm_forward(Tensor x, float eps) -> (Tensor, Tensor)")
def _l2_norm_forward(x: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(y, rsqrt_norm)`` of the rows of ``x`` (2-D): ``y`` in ``x``'s dtype,
    ``rsqrt_norm`` (one per row) in the math dtype."""
    xf = x.to(math_dtype(x.dtype)).contiguous()  # one summation order whatever the strides
    rsqrt_norm = torch.rsqrt(xf.square().sum(-1) + eps)
    return (xf * rsqrt_norm.unsqueeze(-1)).to(x.dtype), rsqrt_norm


@exact("l2_norm_backward(Tensor dy, Tensor x, Tensor rsqrt_norm, float eps) -> Tensor")
def _l2_norm_backward(
    dy: torch.Tensor, x: torch.Tensor, rsqrt_norm: torch.Tensor, eps: float
) -> torch.Tensor:
    """``dx`` of the rows of ``x`` (2-D), rounded once to ``x``'s dtype. ``dy`` is widened
    here (a 16-bit value widened by the caller would, traced, lose its rounding to
    Inductors that fold a narrowing cast followed by a widening one)."""
    dtype = math_dtype(x.dtype, dy.dtype)
    xf, dyf = x.to(dtype).contiguous(), dy.to(dtype).contiguous()
    x_dy = (xf * dyf).sum(-1, keepdim=True)
    norm_squared = xf.square().sum(-1, keepdim=True) + eps
    dx = rsqrt_norm.to(dtype).unsqueeze(-1) * (dyf - xf * x_dy / norm_squared)
    return dx.to(x.dtype)


def _rows(t: torch.Tensor) -> torch.Tensor:
    """``t`` as (rows, hidden), sized explicitly (a -1 is ambiguous for no rows)."""
    return t.reshape(math.prod(t.shape[:-1]), t.shape[-1])


def _saves(args: L2NormalizationFwdArgs) -> bool:
    return args.is_grad_enabled and args.input_requires_grad


def l2normalization_forward(
    args: L2NormalizationFwdArgs,
) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """``((out,), (rsqrt_norm,))``; out in the input's dtype, ``rsqrt_norm`` None without
    a backward."""
    inp = args.inp
    _check(inp, "L2NormalizationFwdArgs")
    y, rsqrt_norm = _l2_norm_forward(_rows(inp), args.eps)
    return (y.view(inp.shape),), (rsqrt_norm if _saves(args) else None,)


def l2normalization_forward_spec(
    args: L2NormalizationFwdArgs,
) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    inp = args.inp
    _check(inp, "L2NormalizationFwdArgs")
    out = TensorSpec(tuple(inp.shape), inp.dtype, device=inp.device)
    if not _saves(args):
        return (out,), (None,)
    rows = math.prod(inp.shape[:-1])
    return (out,), (TensorSpec((rows,), math_dtype(inp.dtype), device=inp.device),)


def l2normalization_setup_context(
    args: L2NormalizationFwdArgs, outputs: tuple[Any, ...], saved: tuple[Any, ...]
) -> dict[str, Any]:
    return dict(rsqrt_norm=saved[0], requires_dgrad=_saves(args))


def l2normalization_backward(args: L2NormalizationBwdArgs) -> tuple[torch.Tensor | None]:
    """The gradient of ``inp`` (None when not required)."""
    if not args.requires_dgrad:
        return (None,)
    inp, dy = args.inp, args.grad_outputs[0]
    dx = _l2_norm_backward(_rows(dy), _rows(inp), args.rsqrt_norm, args.eps)
    return (dx.view(inp.shape),)


def l2normalization_backward_spec(args: L2NormalizationBwdArgs) -> tuple[TensorSpec | None]:
    if not args.requires_dgrad:
        return (None,)
    inp = args.inp
    return (TensorSpec(tuple(inp.shape), inp.dtype, device=inp.device),)


L2NORMALIZATION = OpDeclaration(
    name="l2normalization",
    forward=L2NormalizationFwdArgs,
    backward=L2NormalizationBwdArgs,
    grad_fields=("inp",),
    forward_impl=l2normalization_forward,
    backward_impl=l2normalization_backward,
    forward_spec=l2normalization_forward_spec,
    backward_spec=l2normalization_backward_spec,
    setup_context=l2normalization_setup_context,
    lowers=True,
)


@examples(L2NormalizationFwdArgs)
def l2normalization_examples(recipe: Any, device: torch.device) -> list[L2NormalizationFwdArgs]:
    """Bundles the lowering is checked on (``tests/runtime/lowering_check.py``): bf16 and fp32
    heads. No quantizer field: the op takes no recipe."""
    if recipe is not None:
        return []
    from transformer_engine_ops.ops import _examples

    bundles = []
    for seed, dtype in enumerate(_examples.DTYPES):
        make = _examples.random_tensors(seed, dtype, device)
        for eps in (1e-6, 1e-5):
            bundles.append(
                L2NormalizationFwdArgs(
                    inp=make(4, 16, 2, 64),
                    input_requires_grad=True,
                    eps=eps,
                    is_grad_enabled=True,
                )
            )
    return bundles
