"""A quantized model's state dict round-trips through ``torch.save`` and the default
``torch.load(weights_only=True)``."""

from __future__ import annotations

import io

import pytest
import torch
from module_cases import QUANTIZED, RECIPES

from transformer_engine_ops.modules.autocast import autocast, quantized_model_init
from transformer_engine_ops.modules.linear import Linear
from transformer_engine_ops.runtime.quantizer import QuantizedTensor


@pytest.mark.parametrize("recipe", QUANTIZED)
def test_quantized_state_dict_loads_with_weights_only(recipe):
    torch.manual_seed(0)
    with quantized_model_init(recipe=RECIPES[recipe]()):
        saved = Linear(64, 32, params_dtype=torch.bfloat16)
        fresh = Linear(64, 32, params_dtype=torch.bfloat16)
    assert isinstance(saved.weight, QuantizedTensor)
    buf = io.BytesIO()
    torch.save(saved.state_dict(), buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)
    assert type(state["weight"]) is type(saved.weight)
    fresh.load_state_dict(state)
    x = torch.randn(32, 64).to(torch.bfloat16)
    with autocast(recipe=RECIPES[recipe]()):
        assert torch.equal(fresh(x), saved(x))
