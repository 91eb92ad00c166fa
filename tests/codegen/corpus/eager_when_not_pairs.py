# expect: 37:17 each `eager_when` entry must be a (condition, reason) string pair
"""Corpus: `eager_when` holds a bare string, not a (condition, reason) pair."""

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
    eager_when=("inp",),
)
