"""Bad input gets the same clear error eagerly and compiled (the fake kernel checks
what the real kernel checks, with the same message)."""

from __future__ import annotations

import re

import pytest
import torch

from transformer_engine_ops.modules.linear import Linear

CASES = {
    "wrong_in_features": (
        lambda: torch.randn(16, 31),
        r"Linear: the input's last dim is 31 \(input shape \(16, 31\)\), but the weight of "
        r"shape \(16, 32\) expects 32 input features",
    ),
    "meta_input": (
        lambda: torch.randn(4, 32, device="meta"),
        r"Linear: the input of shape \(4, 32\) is on the meta device",
    ),
    "zero_dim_input": (
        lambda: torch.tensor(1.0),
        r"Linear: the input must have at least 1 dimension, got a 0-D tensor",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_raises_the_same_clear_error_eager_and_compiled(case):
    make, message = CASES[case]
    model = Linear(32, 16)
    with pytest.raises(ValueError, match=message):
        model(make())
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    with pytest.raises(Exception) as info:  # dynamo wraps the fake kernel's ValueError
        compiled(make())
    assert re.search(message, str(info.value)), str(info.value)[:500]
