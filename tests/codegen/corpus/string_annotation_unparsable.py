# expect: 18:13 cannot parse the string annotation
"""Corpus: a string annotation that is not an expression."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

import torch

from transformer_engine_ops.runtime.declaration import OpDeclaration


@dataclass
class FwdArgs:
    inp: torch.Tensor
    scale: float
    broken: "Optional[torch.Tensor"

@dataclass
class BwdArgs:
    grad_outputs: list[torch.Tensor]

OP = OpDeclaration(name="bad", forward=FwdArgs, backward=BwdArgs, grad_fields=("inp",))

