# expect: 28:12 returns the whole backward bundle BwdArgs
"""Corpus: setup_context builds the whole backward bundle, copies included."""

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

def fwd(args): ...
def bwd(args): ...
def fwd_spec(args): ...
def bwd_spec(args): ...
def setup(args, outputs, saved):
    return BwdArgs(grad_outputs=[], scale=args.scale)

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
