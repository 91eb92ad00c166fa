# expect: 19:11 unsupported list annotation `List[float]`
"""Corpus: List[float] crosses as no kind."""

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
    dims: List[float]

@dataclass
class BwdArgs:
    grad_outputs: list[torch.Tensor]

OP = OpDeclaration(name="bad", forward=FwdArgs, backward=BwdArgs, grad_fields=("inp",))

