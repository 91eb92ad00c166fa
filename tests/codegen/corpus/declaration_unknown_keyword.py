# expect: 28:5 unknown OpDeclaration argument `fwd_impl`
"""Corpus: OpDeclaration with a misspelt keyword."""

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

OP = OpDeclaration(
    name="bad",
    forward=FwdArgs,
    backward=BwdArgs,
    grad_fields=("inp",),
    fwd_impl=None,
)

