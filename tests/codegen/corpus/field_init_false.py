# expect: 17:39 field `FwdArgs.scale` is declared with `init=False`
"""Corpus: `field(init=False)` was accepted and failed at run time (unflatten passes it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

from transformer_engine_ops.runtime.declaration import OpDeclaration


@dataclass
class FwdArgs:
    inp: torch.Tensor
    scale: float = field(default=1.0, init=False)

@dataclass
class BwdArgs:
    grad_outputs: list[torch.Tensor]

OP = OpDeclaration(name="bad", forward=FwdArgs, backward=BwdArgs, grad_fields=("inp",))
