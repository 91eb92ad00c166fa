# expect: 14:7 imported into the generated module as `Any`
"""Corpus: a bundle named `Any`, which generated code imports from typing."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from transformer_engine_ops.runtime.declaration import OpDeclaration


@dataclass
class Any:
    inp: torch.Tensor


@dataclass
class BwdArgs:
    grad_outputs: list[torch.Tensor]


OP = OpDeclaration(name="any_op", forward=Any, backward=BwdArgs, grad_fields=("inp",))
