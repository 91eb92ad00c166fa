# expect: 18:5 the body of bundle `FwdArgs` holds an `if` statement
"""Corpus: a field inside `if True:` in a bundle body was dropped from the schema (eager 5.0, op 1.0)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from transformer_engine_ops.runtime.declaration import OpDeclaration


@dataclass
class FwdArgs:
    inp: torch.Tensor
    scale: float = 1.0
    if True:
        scale: float = 5.0

@dataclass
class BwdArgs:
    grad_outputs: list[torch.Tensor]

OP = OpDeclaration(name="bad", forward=FwdArgs, backward=BwdArgs, grad_fields=("inp",))
