# expect: 17:1816 too many nested parentheses
"""Corpus: a 400-deep annotation raised RecursionError (1500 deep crashed the parser)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from transformer_engine_ops.runtime.declaration import OpDeclaration


@dataclass
class FwdArgs:
    inp: torch.Tensor
    x: Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[Optional[torch.Tensor]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]

@dataclass
class BwdArgs:
    grad_outputs: list[torch.Tensor]

OP = OpDeclaration(name="bad", forward=FwdArgs, backward=BwdArgs, grad_fields=("inp",))
