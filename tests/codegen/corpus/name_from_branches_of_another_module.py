# expect: 17:8 `Scale` is `tests.codegen.corpus._branch_alias_support.Scale`, which the branches of the module-level `if` at tests/codegen/corpus/_branch_alias_support.py:13 bind differently
"""Corpus: an imported name another module binds differently in the branches of an `if`."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tests.codegen.corpus._branch_alias_support import Scale
from transformer_engine_ops.runtime.declaration import OpDeclaration


@dataclass
class FwdArgs:
    inp: torch.Tensor
    s: Scale

@dataclass
class BwdArgs:
    grad_outputs: list[torch.Tensor]

OP = OpDeclaration(name="bad", forward=FwdArgs, backward=BwdArgs, grad_fields=("inp",))
