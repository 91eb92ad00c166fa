"""A quantized model of the Linear family saved with ``torch.save(model.state_dict())``
loads with ``torch.load(..., weights_only=True)`` into a fresh model, which then gives
identical outputs."""

from __future__ import annotations

import io

import pytest
import torch
from family_cases import FFN, HIDDEN, randomize
from module_cases import QUANTIZED, RECIPES

import transformer_engine_ops as te

SPLITS = [32, 0, 32]  # tokens per GEMM of the GroupedLinear (64 tokens, one empty group)


class FamilyModel(torch.nn.Module):
    """LayerNormLinear -> LayerNormMLP (residual) -> GroupedLinear, bf16 parameters."""

    def __init__(self, grouped: te.GroupedLinear) -> None:
        super().__init__()
        kw = {"params_dtype": torch.bfloat16}
        self.ln_linear = te.LayerNormLinear(HIDDEN, HIDDEN, **kw)
        self.mlp = te.LayerNormMLP(HIDDEN, FFN, **kw)
        self.grouped = grouped

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln_linear(x)
        h = h + self.mlp(h)
        return self.grouped(h, SPLITS)


def build(recipe: str, seed: int) -> FamilyModel:
    """Every module under ``quantized_model_init``."""
    torch.manual_seed(seed)
    with te.quantized_model_init(recipe=RECIPES[recipe]()):
        model = FamilyModel(te.GroupedLinear(3, HIDDEN, HIDDEN, params_dtype=torch.bfloat16))
    return randomize(model, seed)


def forward_backward(model: FamilyModel, x: torch.Tensor, recipe: str) -> list[torch.Tensor]:
    x = x.detach().clone().requires_grad_(True)
    with te.autocast(recipe=RECIPES[recipe]()):
        y = model(x)
    y.float().pow(2).mean().backward()
    return [y.detach(), x.grad]


def quantized_weights(model: torch.nn.Module) -> dict[str, type]:
    return {
        name: type(p.data)
        for name, p in model.named_parameters()
        if type(p.data) is not torch.Tensor
    }


@pytest.mark.parametrize("recipe", QUANTIZED)
def test_quantized_family_model_round_trips_through_weights_only_load(recipe):
    saved, fresh = build(recipe, seed=0), build(recipe, seed=1)
    # Every GEMM weight is quantized.
    assert set(quantized_weights(saved)) == {
        "ln_linear.weight",
        "mlp.fc1_weight",
        "mlp.fc2_weight",
        *(f"grouped.weight{i}" for i in range(3)),
    }
    x = torch.randn(64, HIDDEN, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    before = forward_backward(fresh, x, recipe)
    expected = forward_backward(saved, x, recipe)
    assert not torch.equal(before[0], expected[0]), "the fresh model must start different"

    buf = io.BytesIO()
    torch.save(saved.state_dict(), buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)
    for name, cls in quantized_weights(saved).items():
        assert type(state[name]) is cls, name
    fresh.load_state_dict(state, strict=True)

    assert quantized_weights(fresh) == quantized_weights(saved)
    got = forward_backward(fresh, x, recipe)
    for what, a, b in zip(("output", "input grad"), got, expected, strict=True):
        assert torch.equal(a, b), f"{recipe}: {what} differs after the weights_only load"
