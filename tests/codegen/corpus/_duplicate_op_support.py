# support: declares op `shared` first; used by duplicate_op_name.py
"""Corpus support: a valid module; the first to declare op `shared`."""

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

OP = OpDeclaration(name="shared", forward=FwdArgs, backward=BwdArgs, grad_fields=("inp",))

