# expect: 17:5 field name `FwdArgs.scalé` is not an ASCII identifier
"""Corpus: a non-ASCII field name was accepted and the op silently left unregistered."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

from transformer_engine_ops.runtime.declaration import OpDeclaration


@dataclass
class FwdArgs:
    inp: torch.Tensor
    scalé: float

@dataclass
class BwdArgs:
    grad_outputs: list[torch.Tensor]

OP = OpDeclaration(name="bad", forward=FwdArgs, backward=BwdArgs, grad_fields=("inp",))
