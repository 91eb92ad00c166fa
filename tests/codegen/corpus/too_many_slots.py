# expect: 14:7 bundle `FwdArgs` needs 65 schema arguments; torch's dispatcher allows at most 64
"""Corpus: 65 slots were accepted; registration then failed at import and the op was None."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

from transformer_engine_ops.runtime.declaration import OpDeclaration


@dataclass
class FwdArgs:
    inp: torch.Tensor
    a1: int = 0
    a2: int = 0
    a3: int = 0
    a4: int = 0
    a5: int = 0
    a6: int = 0
    a7: int = 0
    a8: int = 0
    a9: int = 0
    a10: int = 0
    a11: int = 0
    a12: int = 0
    a13: int = 0
    a14: int = 0
    a15: int = 0
    a16: int = 0
    a17: int = 0
    a18: int = 0
    a19: int = 0
    a20: int = 0
    a21: int = 0
    a22: int = 0
    a23: int = 0
    a24: int = 0
    a25: int = 0
    a26: int = 0
    a27: int = 0
    a28: int = 0
    a29: int = 0
    a30: int = 0
    a31: int = 0
    a32: int = 0
    a33: int = 0
    a34: int = 0
    a35: int = 0
    a36: int = 0
    a37: int = 0
    a38: int = 0
    a39: int = 0
    a40: int = 0
    a41: int = 0
    a42: int = 0
    a43: int = 0
    a44: int = 0
    a45: int = 0
    a46: int = 0
    a47: int = 0
    a48: int = 0
    a49: int = 0
    a50: int = 0
    a51: int = 0
    a52: int = 0
    a53: int = 0
    a54: int = 0
    a55: int = 0
    a56: int = 0
    a57: int = 0
    a58: int = 0
    a59: int = 0
    a60: int = 0
    a61: int = 0
    a62: int = 0
    a63: int = 0
    a64: int = 0

@dataclass
class BwdArgs:
    grad_outputs: list[torch.Tensor]

OP = OpDeclaration(name="bad", forward=FwdArgs, backward=BwdArgs, grad_fields=("inp",))
