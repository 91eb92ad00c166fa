# expect: 32:6 but not forward_spec, backward_spec
"""Corpus: two of the five implementation functions."""

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


OP = OpDeclaration(
    name="bad",
    forward=FwdArgs,
    backward=BwdArgs,
    grad_fields=("inp",),
    forward_impl=fwd,
    backward_impl=bwd,
)

