"""The row-group padding op behind TE's ``Fp8Padding`` and ``Fp8Unpadding``: consecutive
row groups, each moved to a group of another size.

Group ``i`` has ``from_splits[i]`` rows in the input and ``to_splits[i]`` in the output:
its first ``min(from, to)`` rows are copied, and a longer output group is filled with
zero rows (padding each expert's rows to the recipe's alignment, TE's
``Fp8Padding``; the opposite direction drops them, ``Fp8Unpadding``). The backward is
the same move the other way round. The splits are host ints, as TE takes them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from transformer_engine_ops.runtime.declaration import OpDeclaration
from transformer_engine_ops.runtime.tensor_spec import TensorSpec


@dataclass
class MoePadRowsFwdArgs:
    """Everything moving row groups to other sizes needs."""

    inp: torch.Tensor  # [sum(from_splits), H]
    from_splits: list[int]  # rows of each group in the input
    to_splits: list[int]  # rows of each group in the output

    inp_requires_grad: bool

    # --- Autograd state ---
    is_grad_enabled: bool


@dataclass
class MoePadRowsBwdArgs:
    """Everything the backward needs: the move the other way round."""

    grad_outputs: list[torch.Tensor]

    from_splits: list[int]
    to_splits: list[int]

    requires_dgrad: bool


def _check(inp: Any, from_splits: list[Any], to_splits: list[Any], where: str) -> None:
    if len(inp.shape) < 1:
        raise ValueError(f"{where}.inp: rows expected, got a scalar")
    if len(from_splits) != len(to_splits):
        raise ValueError(
            f"{where}: from_splits has {len(from_splits)} groups, to_splits {len(to_splits)}"
        )
    for name, splits in (("from_splits", from_splits), ("to_splits", to_splits)):
        if any(type(s) is int and s < 0 for s in splits):
            raise ValueError(f"{where}.{name}: row counts must be non-negative, got {splits}")
    if all(type(s) is int for s in from_splits) and type(inp.shape[0]) is int:
        if sum(from_splits) != inp.shape[0]:
            raise ValueError(
                f"{where}.from_splits: {from_splits} sum to {sum(from_splits)} rows, but the "
                f"input has {inp.shape[0]}"
            )


def move_groups(x: torch.Tensor, from_splits: list[Any], to_splits: list[Any]) -> torch.Tensor:
    """Each group of ``x`` (``from_splits``) copied into a group of ``to_splits`` rows:
    cut, or filled with zero rows."""
    pieces = []
    for group, size in zip(x.split(list(from_splits)), to_splits, strict=True):
        kept = min(group.shape[0], size)
        pieces.append(group[:kept])
        if size > kept:
            pieces.append(x.new_zeros((size - kept, *x.shape[1:])))
    if not pieces:
        return x.new_zeros((0, *x.shape[1:]))
    return torch.cat(pieces)


def moe_pad_rows_forward(args: MoePadRowsFwdArgs) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    _check(args.inp, args.from_splits, args.to_splits, "MoePadRowsFwdArgs")
    return (move_groups(args.inp, args.from_splits, args.to_splits),), ()


def moe_pad_rows_forward_spec(
    args: MoePadRowsFwdArgs,
) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    inp = args.inp
    _check(inp, args.from_splits, args.to_splits, "MoePadRowsFwdArgs")
    rows = sum(args.to_splits)
    return (TensorSpec((rows, *inp.shape[1:]), inp.dtype, device=inp.device),), ()


def moe_pad_rows_setup_context(
    args: MoePadRowsFwdArgs, outputs: tuple[Any, ...], saved: tuple[Any, ...]
) -> dict[str, Any]:
    return dict(
        from_splits=list(args.from_splits),
        to_splits=list(args.to_splits),
        requires_dgrad=args.is_grad_enabled and args.inp_requires_grad,
    )


def moe_pad_rows_backward(args: MoePadRowsBwdArgs) -> tuple[Any]:
    if not args.requires_dgrad:
        return (None,)
    return (move_groups(args.grad_outputs[0], args.to_splits, args.from_splits),)


def moe_pad_rows_backward_spec(args: MoePadRowsBwdArgs) -> tuple[Any]:
    if not args.requires_dgrad:
        return (None,)
    g = args.grad_outputs[0]
    rows = sum(args.from_splits)
    return (TensorSpec((rows, *g.shape[1:]), g.dtype, device=g.device),)


MOE_PAD_ROWS = OpDeclaration(
    name="moe_pad_rows",
    forward=MoePadRowsFwdArgs,
    backward=MoePadRowsBwdArgs,
    grad_fields=("inp",),
    forward_impl=moe_pad_rows_forward,
    backward_impl=moe_pad_rows_backward,
    forward_spec=moe_pad_rows_forward_spec,
    backward_spec=moe_pad_rows_backward_spec,
    setup_context=moe_pad_rows_setup_context,
    # Backward fields setup_context computes although a forward field has their name.
    derived=("to_splits", "from_splits"),
)
