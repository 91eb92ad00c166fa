# expect: 25:9 unknown OpDeclaration argument `fwd_arg_type`
"""Corpus: a declaration inside a module-level if/else block is read like any other."""

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

if torch.cuda.is_available():
    pass
else:
    OP = OpDeclaration(
        fwd_arg_type=FwdArgs,
        name="bad",
    )
