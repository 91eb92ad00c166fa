"""Importing a generated op module imports no Dynamo (~0.9 s) and no Inductor (over a
second): a program that never compiles does not pay for them."""

from __future__ import annotations

import subprocess
import sys


def test_importing_the_generated_ops_imports_neither_dynamo_nor_inductor():
    code = (
        "import sys, transformer_engine_ops.generated.linear, "
        "transformer_engine_ops.generated.layernorm_mlp\n"
        "print('torch._dynamo' in sys.modules, 'torch._inductor' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.split() == ["False", "False"]
