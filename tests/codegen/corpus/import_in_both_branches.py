# expect: 24:8 `Scale` is bound differently in the branches of the module-level `if` at tests/codegen/corpus/import_in_both_branches.py:15:1
"""Corpus: a name a field uses, bound differently in the branches of an `if`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from transformer_engine_ops.runtime.declaration import OpDeclaration

import sys

if sys.version_info >= (3, 12):
    Scale = float
else:
    Scale = int


@dataclass
class FwdArgs:
    inp: torch.Tensor
    s: Scale

@dataclass
class BwdArgs:
    grad_outputs: list[torch.Tensor]

OP = OpDeclaration(name="bad", forward=FwdArgs, backward=BwdArgs, grad_fields=("inp",))
