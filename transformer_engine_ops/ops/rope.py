"""The rotary-embedding op: rotate the first features of each head by per-token angles.

``apply_rotary_pos_emb`` (``modules/rope.py``) gathers each token's angles from TE's
frequency table (positions, offsets, ``thd`` sequences, context-parallel slices: index
arithmetic only) and hands this op the angles, broadcastable against the rotated part
of ``t``. The op holds the arithmetic: ``cos`` and ``sin`` of the angles, the rotation
and its transpose for the backward. Inductor would regenerate ``cos`` and ``sin`` with
its own vectorized functions, whose last bits depend on the host's vector width, and
fuse the rotation's roundings away; as an op node the rotation computes eager's bits in
every compile, on every host. On CUDA the rotation is one fused Triton kernel each way
(``rope_kernels``), in eager and compiled calls alike.

Two precisions, as TE's two paths: ``fused`` (TE's fused kernel) rotates in fp32 (float64
for float64 data) and rounds once to ``t``'s dtype; otherwise ``cos`` and ``sin`` are rounded to ``t``'s dtype
and every product and the sum round there (TE's unfused PyTorch path).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from transformer_engine_ops.kernels import rope_kernels
from transformer_engine_ops.runtime.declaration import OpDeclaration
from transformer_engine_ops.runtime.precision import math_dtype
from transformer_engine_ops.runtime.tensor_spec import TensorSpec


@dataclass
class RopeFwdArgs:
    """Everything applying rotary embeddings needs."""

    # --- Differentiable input ---
    t: torch.Tensor  # [..., heads, d]; the first angles.shape[-1] features are rotated

    # --- Angles of each token (fp32), broadcastable against t[..., :d'] ---
    angles: torch.Tensor

    t_requires_grad: bool

    # --- Numerics ---
    interleaved: bool  # pairs (2i, 2i+1) rotate together, else (i, i + d'/2)
    fused: bool  # fp32 math, one rounding (TE's fused kernel)

    # --- Autograd state ---
    is_grad_enabled: bool


@dataclass
class RopeBwdArgs:
    """Everything the rotary embedding's backward needs."""

    grad_outputs: list[torch.Tensor]

    angles: torch.Tensor

    interleaved: bool
    fused: bool
    requires_dgrad: bool


def check_angles(t: Any, angles: Any, where: str) -> int:
    """The rotated width ``d'`` (``angles.shape[-1]``), after checking that it is even and
    fits ``t``'s head dimension and that the angles broadcast against ``t`` (real and
    fake tensors alike)."""
    rot_dim = angles.shape[-1]
    if rot_dim % 2 or rot_dim < 2 or rot_dim > t.shape[-1]:
        raise ValueError(
            f"{where}: the angles rotate {rot_dim} features, which must be even, >= 2 and at "
            f"most t's last dim ({t.shape[-1]}); t {tuple(t.shape)}, angles "
            f"{tuple(angles.shape)}"
        )
    lead_t, lead_a = tuple(t.shape[:-1]), tuple(angles.shape[:-1])
    if len(lead_a) != len(lead_t) or any(
        a not in (1, n) for a, n in zip(lead_a, lead_t, strict=False)
    ):
        raise ValueError(
            f"{where}: angles {tuple(angles.shape)} do not broadcast against t "
            f"{tuple(t.shape)} (one angle row per token, 1 where shared)"
        )
    return rot_dim


def rotate_half(x: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """``R x``: each pair ``(a, b)`` becomes ``(-b, a)``."""
    if not interleaved:
        x1, x2 = torch.chunk(x, 2, dim=-1)
        return torch.cat((-x2, x1), dim=-1)
    return torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2)


def _rotate_half_transposed(y: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """``R^T y``: each pair ``(a, b)`` becomes ``(b, -a)`` (the backward's permutation)."""
    if not interleaved:
        y1, y2 = torch.chunk(y, 2, dim=-1)
        return torch.cat((y2, -y1), dim=-1)
    return torch.stack((y[..., 1::2], -y[..., ::2]), dim=-1).flatten(-2)


def _cos_sin(angles: torch.Tensor, dtype: torch.dtype, fused: bool) -> tuple[torch.Tensor, ...]:
    """``cos`` and ``sin`` of the angles: in ``dtype``'s math dtype for the fused
    precision, rounded to ``dtype`` otherwise."""
    if fused:
        angles = angles.to(math_dtype(dtype))
        return torch.cos(angles), torch.sin(angles)
    return torch.cos(angles).to(dtype), torch.sin(angles).to(dtype)


def _joined(rotated: torch.Tensor, whole: torch.Tensor, rot_dim: int) -> torch.Tensor:
    """``rotated`` followed by ``whole``'s features past ``rot_dim`` (partial rotary): a
    fresh tensor either way, as an op's output must be."""
    if rot_dim == whole.shape[-1]:
        return rotated
    return torch.cat((rotated, whole[..., rot_dim:]), dim=-1)


def rotate(t: torch.Tensor, angles: torch.Tensor, interleaved: bool, fused: bool) -> torch.Tensor:
    """``t`` with its first ``angles.shape[-1]`` features rotated by ``angles``, in ``t``'s
    dtype: the op's forward, also what ``apply_rotary_pos_emb`` differentiates with
    autograd where the angles themselves require grad."""
    rot_dim = angles.shape[-1]
    part = t[..., :rot_dim]
    cos, sin = _cos_sin(angles, t.dtype, fused)
    if fused:
        x = part.to(cos.dtype)
        rotated = (x * cos + rotate_half(x, interleaved) * sin).to(t.dtype)
    else:
        rotated = part * cos + rotate_half(part, interleaved) * sin
    return _joined(rotated, t, rot_dim)


def rope_forward(args: RopeFwdArgs) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """``((out,), ())``: ``t`` with its first ``d'`` features rotated, in ``t``'s dtype
    (on CUDA by one fused kernel, ``rope_kernels``)."""
    t, angles = args.t, args.angles
    check_angles(t, angles, "RopeFwdArgs")
    if rope_kernels.eligible(t, angles):
        return (rope_kernels.fused_rope(t, angles, args.interleaved, args.fused, False),), ()
    return (rotate(t, angles, args.interleaved, args.fused),), ()


def rope_forward_spec(args: RopeFwdArgs) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    t = args.t
    check_angles(t, args.angles, "RopeFwdArgs")
    return (TensorSpec(tuple(t.shape), t.dtype, device=t.device),), ()


def rope_setup_context(
    args: RopeFwdArgs, outputs: tuple[Any, ...], saved: tuple[Any, ...]
) -> dict[str, Any]:
    return dict(
        requires_dgrad=args.is_grad_enabled and args.t_requires_grad,
    )


def rope_backward(args: RopeBwdArgs) -> tuple[torch.Tensor | None]:
    """The gradient of ``t``: ``cos * g + R^T (sin * g)`` on the rotated features (the
    transpose of the forward's rotation, in its precision), the rest passed through."""
    if not args.requires_dgrad:
        return (None,)
    g = args.grad_outputs[0]
    if rope_kernels.eligible(g, args.angles):
        return (rope_kernels.fused_rope(g, args.angles, args.interleaved, args.fused, True),)
    rot_dim = args.angles.shape[-1]
    part = g[..., :rot_dim]
    cos, sin = _cos_sin(args.angles, g.dtype, args.fused)
    if args.fused:
        gf = part.to(cos.dtype)
        dpart = (gf * cos + _rotate_half_transposed(gf * sin, args.interleaved)).to(g.dtype)
    else:
        dpart = part * cos + _rotate_half_transposed(part * sin, args.interleaved)
    return (_joined(dpart, g, rot_dim),)


def rope_backward_spec(args: RopeBwdArgs) -> tuple[TensorSpec | None]:
    if not args.requires_dgrad:
        return (None,)
    g = args.grad_outputs[0]
    return (TensorSpec(tuple(g.shape), g.dtype, device=g.device),)


ROPE = OpDeclaration(
    name="rope",
    forward=RopeFwdArgs,
    backward=RopeBwdArgs,
    grad_fields=("t",),
    forward_impl=rope_forward,
    backward_impl=rope_backward,
    forward_spec=rope_forward_spec,
    backward_spec=rope_backward_spec,
    setup_context=rope_setup_context,
)
