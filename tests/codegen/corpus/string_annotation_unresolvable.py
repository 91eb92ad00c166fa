# expect: 18:12 cannot resolve `Missing`
"""Corpus: a forward reference to a name that does not exist."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

import torch

from transformer_engine_ops.runtime.declaration import OpDeclaration


@dataclass
class FwdArgs:
    inp: torch.Tensor
    scale: float
    later: "Optional[Missing]"

@dataclass
class BwdArgs:
    grad_outputs: list[torch.Tensor]

OP = OpDeclaration(name="bad", forward=FwdArgs, backward=BwdArgs, grad_fields=("inp",))

