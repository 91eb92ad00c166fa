# expect: 16:14 mixed union of Tensor, int
"""Corpus: a bundle defined inside a module-level try/except/else block is still read."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

import torch

from transformer_engine_ops.runtime.declaration import OpDeclaration

try:
    @dataclass
    class FwdArgs:
        inp: Union[torch.Tensor, int]
except ImportError:
    pass
else:
    @dataclass
    class BwdArgs:
        grad_outputs: list[torch.Tensor]

OP = OpDeclaration(name="bad", forward=FwdArgs, backward=BwdArgs, grad_fields=("inp",))
