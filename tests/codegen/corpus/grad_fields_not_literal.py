# expect: 24:79 must be a tuple of string literals
"""Corpus: grad_fields computed, not written out."""

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

GRADS = ("inp",)
OP = OpDeclaration(name="bad", forward=FwdArgs, backward=BwdArgs, grad_fields=GRADS)

