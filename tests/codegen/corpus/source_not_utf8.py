# expect: 17:21 not valid UTF-8
"""Corpus: a Latin-1 source (no coding cookie) raised UnicodeDecodeError."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from transformer_engine_ops.runtime.declaration import OpDeclaration


@dataclass
class FwdArgs:
    inp: torch.Tensor
    scale: float  # échelle

@dataclass
class BwdArgs:
    grad_outputs: list[torch.Tensor]

OP = OpDeclaration(name="bad", forward=FwdArgs, backward=BwdArgs, grad_fields=("inp",))
