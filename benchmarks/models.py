"""The model of figures 4-6 and 10: an MLP of our ``Linear`` or of ``torch.nn.Linear``
(8 layers unless a figure asks for another depth)."""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from transformer_engine_ops.modules.autocast import autocast
from transformer_engine_ops.modules.linear import Linear
from transformer_engine_ops.quantization import Float8CurrentScaling

LAYERS = 8
# name -> (rows, hidden): tokens x features of the input; every layer is hidden x hidden.
SHAPES = {"tiny": (8, 32), "small": (64, 256), "medium": (2048, 1024), "large": (4096, 8192)}


class MLP(torch.nn.Module):
    """``layers`` square layers with ReLU between them, bf16 parameters."""

    def __init__(self, kind: str, hidden: int, device: str = "cpu", layers: int = LAYERS) -> None:
        super().__init__()
        dtype = torch.bfloat16
        if kind == "ours":
            layers = [
                Linear(hidden, hidden, params_dtype=dtype, device=device) for _ in range(layers)
            ]
        elif kind == "torch":
            layers = [
                torch.nn.Linear(hidden, hidden, dtype=dtype, device=device) for _ in range(layers)
            ]
        else:
            raise ValueError(f"unknown layer kind {kind!r}")
        self.layers = torch.nn.ModuleList(layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i + 1 < len(self.layers):
                x = torch.relu(x)
        return x


def make_model(
    kind: str, hidden: int, device: str = "cpu", seed: int = 0, layers: int = LAYERS
) -> MLP:
    torch.manual_seed(seed)
    return MLP(kind, hidden, device, layers)


def recipe_context(recipe: str) -> Any:
    """``autocast`` with FP8 current scaling for ``"fp8"``; nothing for ``"bf16"``."""
    if recipe == "fp8":
        return autocast(recipe=Float8CurrentScaling())
    if recipe == "bf16":
        return contextlib.nullcontext()
    raise ValueError(f"unknown recipe {recipe!r}")


def make_input(rows: int, hidden: int, device: str = "cpu", seed: int = 1) -> torch.Tensor:
    gen = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(rows, hidden, generator=gen, device=device, dtype=torch.bfloat16)
    return x.requires_grad_(True)


def train_step(model: Any, x: torch.Tensor, recipe: str) -> torch.Tensor:
    """Forward + backward (loss = sum of squares); gradients accumulate, no optimizer."""
    with recipe_context(recipe):
        y = model(x)
    y.float().pow(2).mean().backward()
    return y
