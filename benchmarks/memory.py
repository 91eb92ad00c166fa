"""Figure 7: bytes one Linear layer keeps for its backward, per recipe, eager and compiled.

Every tensor the autograd graph saves passes through ``torch.autograd.graph.
saved_tensors_hooks`` (our eager path saves through ``save_for_backward``, the compiled
one through AOT autograd), so the figure counts what PyTorch's own memory tools see.
Each saved tensor is classified as:

* **parameter**: shares storage with a parameter of the layer (kept anyway, no copy);
* **activation**: kept because the weight needs a gradient (wgrad reads the input);
* **weight copy**: kept because the input needs a gradient (dgrad reads the weight),
  such as a quantized copy of the weight.

The split comes from two extra forwards, one with the input not requiring grad (only
wgrad's tensors are saved) and one with the parameters frozen (only dgrad's); the
training step (everything requires grad) must save exactly their sum, which
:func:`measure` checks. Bytes are data plus scales: every inner buffer of a quantized
value is its own saved tensor.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

import torch

from transformer_engine_ops.modules.autocast import autocast
from transformer_engine_ops.modules.linear import Linear
from transformer_engine_ops.quantization import (
    Float8BlockScaling,
    Float8CurrentScaling,
    MXFP8BlockScaling,
    NVFP4BlockScaling,
)

# name -> recipe factory (None: unquantized bf16)
RECIPES: dict[str, Any] = {
    "bf16": None,
    "fp8_current": Float8CurrentScaling,
    "fp8_block": Float8BlockScaling,
    "mxfp8": MXFP8BlockScaling,
    # The features this library implements (no random Hadamard transform, no
    # stochastic rounding); the recipe refuses the others.
    "nvfp4": functools.partial(
        NVFP4BlockScaling, disable_rht=True, disable_stochastic_rounding=True
    ),
}
# Saved activation bytes of a recipe over bf16's, at most.
TARGETS = {"fp8_current": 0.55, "fp8_block": 0.55, "mxfp8": 0.6, "nvfp4": 0.35}
# Layer and input of the figure: (rows, in_features, out_features).
SHAPE = (512, 256, 384)
QUICK_SHAPE = (128, 128, 256)


class SavedTensors:
    """Records (bytes, storage pointer) of every tensor saved for backward."""

    def __init__(self) -> None:
        self.saved: list[tuple[int, int]] = []

    @contextlib.contextmanager
    def hooks(self) -> Iterator[None]:
        def pack(t: torch.Tensor) -> torch.Tensor:
            self.saved.append((t.numel() * t.element_size(), t.untyped_storage().data_ptr()))
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            yield

    def split(self, params: list[torch.Tensor]) -> tuple[int, int, int]:
        """(tensors, bytes of non-parameters, bytes of parameters)."""
        param_ptrs = {p.untyped_storage().data_ptr() for p in params}
        own = sum(n for n, ptr in self.saved if ptr not in param_ptrs)
        shared = sum(n for n, ptr in self.saved if ptr in param_ptrs)
        return len(self.saved), own, shared


def recipe_context(recipe: str) -> Any:
    factory = RECIPES[recipe]
    return autocast(recipe=factory()) if factory is not None else contextlib.nullcontext()


def make_layer(kind: str, shape: tuple[int, int, int], seed: int = 0) -> torch.nn.Module:
    """Our ``Linear`` (``"ours"``) or ``torch.nn.Linear`` (``"torch"``), bf16 parameters."""
    _, k, n = shape
    torch.manual_seed(seed)
    if kind == "ours":
        return Linear(k, n, params_dtype=torch.bfloat16)
    if kind == "torch":
        return torch.nn.Linear(k, n, dtype=torch.bfloat16)
    raise ValueError(f"unknown layer kind {kind!r}")


def _saved(
    run: Callable[[torch.Tensor], Any],
    layer: torch.nn.Module,
    x: torch.Tensor,
    recipe: str,
    *,
    input_grad: bool,
    param_grad: bool,
) -> tuple[int, int, int]:
    params = list(layer.parameters())
    for p in params:
        p.requires_grad_(param_grad)
    record = SavedTensors()
    try:
        with record.hooks(), recipe_context(recipe):
            y = run(x.detach().requires_grad_(input_grad))
        del y  # the graph (and what it saved) goes with it
    finally:
        for p in params:
            p.requires_grad_(True)
    return record.split(params)


def measure(
    recipe: str, kind: str, compiled: bool, shape: tuple[int, int, int], backend: str
) -> dict[str, int]:
    """Saved bytes of one layer's forward, split as the module docstring says."""
    if kind == "torch" and recipe != "bf16":
        raise ValueError("torch.nn.Linear runs bf16 only")
    layer = make_layer(kind, shape)
    run = torch.compile(layer, fullgraph=True, backend=backend) if compiled else layer
    rows, k, _ = shape
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    count, total, params = _saved(run, layer, x, recipe, input_grad=True, param_grad=True)
    _, activation, _ = _saved(run, layer, x, recipe, input_grad=False, param_grad=True)
    _, weight_copy, _ = _saved(run, layer, x, recipe, input_grad=True, param_grad=False)
    if compiled and total - activation < weight_copy:
        # torch 2.11 compiles a bf16 layer's frozen-parameter step to save a tensor its
        # training step does not (2.13 does not): dgrad's share is what the training step
        # saves beyond wgrad's. A training step that saves more than both runs together
        # still fails below.
        weight_copy = total - activation
    if total != activation + weight_copy:
        raise AssertionError(
            f"{kind} {recipe} {'compiled' if compiled else 'eager'}: the training step saves "
            f"{total} bytes besides parameters, but wgrad's ({activation}) and dgrad's "
            f"({weight_copy}) tensors add up to {activation + weight_copy}"
        )
    return {
        "tensors": count,
        "activation": activation,
        "weight_copy": weight_copy,
        "parameters": params,
        "total": total + params,
    }


def run(quick: bool = False, backend: str | None = None) -> dict[str, Any]:
    """Every recipe eager and compiled, and ``torch.nn.Linear`` bf16, for one layer.
    Compiled with inductor (``aot_eager`` for a quick run); inductor's FX graph cache is
    off, so a graph compiled by another version of this library is never reused."""
    shape = QUICK_SHAPE if quick else SHAPE
    backend = backend or ("aot_eager" if quick else "inductor")
    rows: dict[str, Any] = {}
    with torch._inductor.config.patch(fx_graph_cache=False):
        for compiled in (False, True):
            mode = "compiled" if compiled else "eager"
            torch._dynamo.reset()
            rows[f"torch.nn.Linear bf16 {mode}"] = measure(
                "bf16", "torch", compiled, shape, backend
            )
            for recipe in RECIPES:
                torch._dynamo.reset()
                rows[f"{recipe} {mode}"] = measure(recipe, "ours", compiled, shape, backend)
    return {"shape": list(shape), "backend": backend, "targets": TARGETS, "rows": rows}


def ratios(result: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Per recipe and mode: activation bytes over our bf16's of the same mode."""
    out: dict[str, dict[str, float]] = {}
    for mode in ("eager", "compiled"):
        base = result["rows"][f"bf16 {mode}"]["activation"]
        out[mode] = {
            recipe: result["rows"][f"{recipe} {mode}"]["activation"] / base for recipe in TARGETS
        }
    return out
