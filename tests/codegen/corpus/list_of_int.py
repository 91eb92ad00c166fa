# expect: 19:11 unsupported list annotation `List[int]`
"""Corpus: List[int] is not a tensor list."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

import torch

from transformer_engine_ops.runtime.declaration import OpDeclaration
from typing import List


@dataclass
class FwdArgs:
    inp: torch.Tensor
    scale: float
    dims: List[int]

@dataclass
class BwdArgs:
    grad_outputs: list[torch.Tensor]

OP = OpDeclaration(name="bad", forward=FwdArgs, backward=BwdArgs, grad_fields=("inp",))

