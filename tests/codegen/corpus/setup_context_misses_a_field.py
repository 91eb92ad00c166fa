# expect: 31:5 returns no `BwdArgs.shape`
"""Corpus: setup_context misses a backward field that is not a copy."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from transformer_engine_ops.runtime.declaration import OpDeclaration


@dataclass
class FwdArgs:
    inp: torch.Tensor
    scale: float

@dataclass
class BwdArgs:
    grad_outputs: list[torch.Tensor]
    scale: float
    shape: list[int]

def fwd(args): ...
def bwd(args): ...
def fwd_spec(args): ...
def bwd_spec(args): ...
def setup(args, outputs, saved):
    if args.scale:
        return dict(shape=list(args.inp.shape))
    return {}

OP = OpDeclaration(
    name="bad",
    forward=FwdArgs,
    backward=BwdArgs,
    grad_fields=("inp",),
    forward_impl=fwd,
    backward_impl=bwd,
    forward_spec=fwd_spec,
    backward_spec=bwd_spec,
    setup_context=setup,
)
