# expect: 1:1 no OpDeclaration found
"""Corpus: bundles but no OpDeclaration."""

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

