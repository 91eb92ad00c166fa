# support: binds `Scale` differently in the branches of an `if`; used by name_from_branches_of_another_module.py
"""Corpus support: a valid op module whose `Scale` depends on a condition."""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch

from transformer_engine_ops.runtime.declaration import OpDeclaration

if sys.version_info >= (3, 12):
    Scale = float
else:
    Scale = int


@dataclass
class SupportFwdArgs:
    inp: torch.Tensor


@dataclass
class SupportBwdArgs:
    grad_outputs: list[torch.Tensor]


OP = OpDeclaration(
    name="branch_alias_support", forward=SupportFwdArgs, backward=SupportBwdArgs, grad_fields=("inp",)
)
