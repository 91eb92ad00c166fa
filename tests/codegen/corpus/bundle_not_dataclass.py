# expect: 14:7 is not a @dataclass
"""Corpus: the forward bundle lacks @dataclass."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

import torch

from transformer_engine_ops.runtime.declaration import OpDeclaration


class FwdArgs:
    inp: torch.Tensor
    scale: float

@dataclass
class BwdArgs:
    grad_outputs: list[torch.Tensor]

OP = OpDeclaration(name="bad", forward=FwdArgs, backward=BwdArgs, grad_fields=("inp",))

