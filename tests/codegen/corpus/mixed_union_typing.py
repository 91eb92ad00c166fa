# expect: 18:21 mixed union of Tensor, int
"""Corpus: Union[Tensor, int] mixes two kinds."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

import torch

from transformer_engine_ops.runtime.declaration import OpDeclaration


@dataclass
class FwdArgs:
    inp: torch.Tensor
    scale: float
    size_or_tensor: Union[torch.Tensor, int]

@dataclass
class BwdArgs:
    grad_outputs: list[torch.Tensor]

OP = OpDeclaration(name="bad", forward=FwdArgs, backward=BwdArgs, grad_fields=("inp",))

