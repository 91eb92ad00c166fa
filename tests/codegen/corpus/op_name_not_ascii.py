# expect: 23:6 op name 'línear' is not an ASCII identifier
"""Corpus: an op name Python accepts as an identifier but a schema must not carry."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from transformer_engine_ops.runtime.declaration import OpDeclaration


@dataclass
class FwdArgs:
    inp: torch.Tensor


@dataclass
class BwdArgs:
    grad_outputs: list[torch.Tensor]


OP = OpDeclaration(name="línear", forward=FwdArgs, backward=BwdArgs, grad_fields=("inp",))
