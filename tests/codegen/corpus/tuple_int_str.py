# expect: 19:11 unsupported tuple annotation `Tuple[int, str]`
"""Corpus: a tuple of mixed types crosses as no kind."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

import torch

from transformer_engine_ops.runtime.declaration import OpDeclaration
from typing import Tuple


@dataclass
class FwdArgs:
    inp: torch.Tensor
    scale: float
    pair: Tuple[int, str]

@dataclass
class BwdArgs:
    grad_outputs: list[torch.Tensor]

OP = OpDeclaration(name="bad", forward=FwdArgs, backward=BwdArgs, grad_fields=("inp",))

