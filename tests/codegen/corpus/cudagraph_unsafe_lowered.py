# expect: 38:22 `cudagraph_unsafe` on an op with `lowers=True`
"""Corpus: a lowered op cannot be kept out of CUDA graphs."""

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
    lowers=True,
    cudagraph_unsafe="reads a value on the host",
)
