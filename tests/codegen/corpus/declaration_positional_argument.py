# expect: 23:20 keyword arguments only
"""Corpus: OpDeclaration called with a positional argument."""

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

OP = OpDeclaration("bad", forward=FwdArgs, backward=BwdArgs, grad_fields=("inp",))

