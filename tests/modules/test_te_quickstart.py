"""TE's quickstart, as a TE 2.20.2 user writes it, with only the import line changed:
a small GPT-style block (``te.LayerNormLinear`` QKV, attention in torch, ``te.Linear``
projection, ``te.LayerNormMLP``) trained a few steps under ``te.fp8_autocast`` /
``te.autocast``, its weights made under ``te.fp8_model_init``, in bf16 and every recipe,
eager and compiled (``fullgraph=True``)."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch

import transformer_engine_ops as te  # the one changed line: `import transformer_engine.pytorch as te`

HIDDEN, FFN, HEADS, SEQ, BATCH = 64, 128, 4, 32, 2


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        dtype = torch.bfloat16
        self.qkv = te.LayerNormLinear(HIDDEN, 3 * HIDDEN, bias=True, params_dtype=dtype)
        self.proj = te.Linear(HIDDEN, HIDDEN, bias=True, params_dtype=dtype)
        self.mlp = te.LayerNormMLP(HIDDEN, FFN, activation="gelu", params_dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s, b, h = x.shape
        q, k, v = self.qkv(x).view(s, b, 3, HEADS, h // HEADS).unbind(2)
        q, k, v = (t.permute(1, 2, 0, 3) for t in (q, k, v))
        attn = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attn.permute(2, 0, 1, 3).reshape(s, b, h))
        return x + self.mlp(x)


RECIPES: dict[str, Any] = {
    "bf16": None,
    "delayed": te.recipe.DelayedScaling,
    "current": te.recipe.Float8CurrentScaling,
    "mxfp8": te.recipe.MXFP8BlockScaling,
    "block": te.recipe.Float8BlockScaling,
    "nvfp4": te.recipe.NVFP4BlockScaling,
}


def _train(recipe_name: str, compiled: bool, quantized_weights: bool, old_names: bool) -> list:
    make_recipe = RECIPES[recipe_name]
    fp8 = make_recipe is not None
    torch.manual_seed(1234)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        if quantized_weights and fp8:
            init = te.fp8_model_init if old_names else te.quantized_model_init
            with init(enabled=True, recipe=make_recipe()):
                model = Block()
        else:
            model = Block()
    run = torch.compile(model, fullgraph=True, backend="aot_eager") if compiled else model
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(SEQ, BATCH, HIDDEN, dtype=torch.bfloat16)
    target = torch.randn(SEQ, BATCH, HIDDEN, dtype=torch.bfloat16)
    losses = []
    for _ in range(3):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            if old_names:
                context = te.fp8_autocast(enabled=fp8, fp8_recipe=make_recipe and make_recipe())
            else:
                context = te.autocast(enabled=fp8, recipe=make_recipe and make_recipe())
        with context:
            out = run(x)
        loss = torch.nn.functional.mse_loss(out.float(), target.float())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.detach())
    return losses


CASES = [
    (name, compiled)
    for name in RECIPES
    for compiled in (False, True)
    if not (compiled and name == "delayed")  # delayed scaling runs eagerly only
]


@pytest.mark.slow
# TE's older names with quantized weights (fp8_model_init), the current ones without.
@pytest.mark.parametrize(
    ("old_names", "quantized_weights"),
    [(True, True), (False, False)],
    ids=["fp8_autocast+fp8_model_init", "autocast"],
)
@pytest.mark.parametrize(
    ("recipe_name", "compiled"),
    CASES,
    ids=[f"{n}-{'compiled' if c else 'eager'}" for n, c in CASES],
)
def test_quickstart_trains(
    recipe_name: str, compiled: bool, quantized_weights: bool, old_names: bool
) -> None:
    losses = _train(recipe_name, compiled, quantized_weights, old_names)
    assert all(torch.isfinite(loss) for loss in losses), losses
    if compiled:
        assert [loss.item() for loss in losses] == [
            loss.item() for loss in _train(recipe_name, False, quantized_weights, old_names)
        ]
