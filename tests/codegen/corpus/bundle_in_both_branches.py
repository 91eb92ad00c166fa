# expect: 26:11 bundle `FwdArgs` is bound differently in the branches of the module-level `if` at tests/codegen/corpus/bundle_in_both_branches.py:15:1
"""Corpus: a bundle defined in both branches of an `if`; the generator read the dead one."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from transformer_engine_ops.runtime.declaration import OpDeclaration

import sys

if sys.version_info < (3, 0):

    @dataclass
    class FwdArgs:
        inp: torch.Tensor
        scale: float = 3.0

    _OLD = True
else:

    @dataclass
    class FwdArgs:
        inp: torch.Tensor
        scale: float = 5.0
        extra: int = 0

@dataclass
class BwdArgs:
    grad_outputs: list[torch.Tensor]

OP = OpDeclaration(name="bad", forward=FwdArgs, backward=BwdArgs, grad_fields=("inp",))
