# expect: 19:11 a Literal field must list one or more strings
"""Corpus: Literal of ints cannot cross as a string choice."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

import torch

from transformer_engine_ops.runtime.declaration import OpDeclaration
from typing import Literal


@dataclass
class FwdArgs:
    inp: torch.Tensor
    scale: float
    bits: Literal[4, 8]

@dataclass
class BwdArgs:
    grad_outputs: list[torch.Tensor]

OP = OpDeclaration(name="bad", forward=FwdArgs, backward=BwdArgs, grad_fields=("inp",))

