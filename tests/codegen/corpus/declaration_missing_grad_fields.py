# expect: 23:6 lacks `grad_fields`
"""Corpus: OpDeclaration without grad_fields."""

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

OP = OpDeclaration(name="bad", forward=FwdArgs, backward=BwdArgs)

