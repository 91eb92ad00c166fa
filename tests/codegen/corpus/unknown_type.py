# expect: 19:12 unknown type `numpy.ndarray`
"""Corpus: an imported type that maps to no kind."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

import torch

from transformer_engine_ops.runtime.declaration import OpDeclaration
import numpy


@dataclass
class FwdArgs:
    inp: torch.Tensor
    scale: float
    table: numpy.ndarray

@dataclass
class BwdArgs:
    grad_outputs: list[torch.Tensor]

OP = OpDeclaration(name="bad", forward=FwdArgs, backward=BwdArgs, grad_fields=("inp",))

