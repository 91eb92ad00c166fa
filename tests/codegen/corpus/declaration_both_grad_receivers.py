# expect: 20:7 needs one field receiving the forward outputs' gradients
"""Corpus: a backward bundle with both `grad_outputs` and TE's `grad_output`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

import torch

from transformer_engine_ops.runtime.declaration import OpDeclaration


@dataclass
class FwdArgs:
    inp: torch.Tensor


@dataclass
class BwdArgs:
    grad_outputs: List[torch.Tensor]
    grad_output: Optional[torch.Tensor] = None

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
