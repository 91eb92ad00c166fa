# expect: 24:7 a second OpDeclaration
"""Corpus: two OpDeclarations in one module."""

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

OP = OpDeclaration(name="bad", forward=FwdArgs, backward=BwdArgs, grad_fields=("inp",))
OP2 = OpDeclaration(name="bad2", forward=FwdArgs, backward=BwdArgs, grad_fields=())

