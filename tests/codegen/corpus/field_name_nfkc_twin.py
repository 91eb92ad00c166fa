# expect: 18:5 field name `FwdArgs.ﬁeld` is not an ASCII identifier
"""Corpus: `ﬁeld` and `field` are one name to Python (NFKC); it ended in "ruff ... (a template bug)"."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

from transformer_engine_ops.runtime.declaration import OpDeclaration


@dataclass
class FwdArgs:
    inp: torch.Tensor
    field: float
    ﬁeld: float

@dataclass
class BwdArgs:
    grad_outputs: list[torch.Tensor]

OP = OpDeclaration(name="bad", forward=FwdArgs, backward=BwdArgs, grad_fields=("inp",))
