# expect: 16:5 field `keep` of FwdArgs is named like the `keep` keyword of the generated `call_bad`
"""Corpus: a forward field named like `call_<op>`'s own `keep` keyword."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from transformer_engine_ops.runtime.declaration import OpDeclaration


@dataclass
class FwdArgs:
    inp: torch.Tensor
    keep: bool

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
)
