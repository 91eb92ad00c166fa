# expect: 37:16 `plain_call` must name a function defined in this file
"""Corpus: `plain_call` names something not defined here as a function."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from transformer_engine_ops.runtime.declaration import OpDeclaration


@dataclass
class FwdArgs:
    inp: torch.Tensor

@dataclass
class BwdArgs:
    grad_outputs: list[torch.Tensor]

def fwd(args): ...
def bwd(args): ...
def fwd_spec(args): ...
def bwd_spec(args): ...
def setup(args, saved): ...

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
    plain_call=torch,
)
