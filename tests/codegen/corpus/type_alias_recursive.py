# expect: 20:13 refers to itself
"""Corpus: a module-level type alias that refers to itself."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

import torch

from transformer_engine_ops.runtime.declaration import OpDeclaration

Nested = Optional[Nested]


@dataclass
class FwdArgs:
    inp: torch.Tensor
    scale: float
    nested: Nested

@dataclass
class BwdArgs:
    grad_outputs: list[torch.Tensor]

OP = OpDeclaration(name="bad", forward=FwdArgs, backward=BwdArgs, grad_fields=("inp",))

