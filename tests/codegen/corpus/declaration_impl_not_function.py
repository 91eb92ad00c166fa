# expect: 45:18 `forward_spec` must name a function
"""Corpus: an impl name bound to a lambda, not a def."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

import torch

from transformer_engine_ops.runtime.declaration import OpDeclaration


@dataclass
class FwdArgs:
    inp: torch.Tensor
    scale: float

@dataclass
class BwdArgs:
    grad_outputs: list[torch.Tensor]


def fwd(args: FwdArgs) -> list[torch.Tensor]:
    return [args.inp]


def bwd(args: BwdArgs) -> list[torch.Tensor]:
    return args.grad_outputs


def setup(ctx: object, args: FwdArgs, out: list[torch.Tensor]) -> None:
    pass


spec = lambda args: []  # noqa: E731

OP = OpDeclaration(
    name="bad",
    forward=FwdArgs,
    backward=BwdArgs,
    grad_fields=("inp",),
    forward_impl=fwd,
    backward_impl=bwd,
    forward_spec=spec,
    backward_spec=bwd,
    setup_context=setup,
)

