"""Helpers of the Linear module tests: the model, a training step, comparisons."""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
from typing import Any

import torch
from torch._dynamo.utils import counters

from transformer_engine_ops.modules.autocast import autocast
from transformer_engine_ops.modules.linear import Linear
from transformer_engine_ops.quantization import (
    Float8BlockScaling,
    Float8CurrentScaling,
    MXFP8BlockScaling,
    NVFP4BlockScaling,
)

# name -> recipe factory (None: plain bf16, no autocast)
RECIPES: dict[str, Any] = {
    "bf16": None,
    "fp8_current": Float8CurrentScaling,
    "mxfp8": MXFP8BlockScaling,
    "nvfp4": functools.partial(
        NVFP4BlockScaling, disable_rht=True, disable_stochastic_rounding=True
    ),
    "fp8_block": Float8BlockScaling,
}
QUANTIZED = [name for name, factory in RECIPES.items() if factory is not None]
HIDDEN = 64


class MLP(torch.nn.Module):
    """Two Linear layers with bf16 parameters; passes TE's per-call flags through."""

    def __init__(self, device: str = "cpu", bias: bool = True) -> None:
        super().__init__()
        self.fc1 = Linear(64, HIDDEN, bias=bias, params_dtype=torch.bfloat16, device=device)
        self.fc2 = Linear(HIDDEN, 32, bias=bias, params_dtype=torch.bfloat16, device=device)

    def forward(
        self, x: torch.Tensor, is_first_microbatch: bool | None = None, fp8_output: bool = False
    ) -> Any:
        h = self.fc1(x, is_first_microbatch=is_first_microbatch)
        return self.fc2(h, is_first_microbatch=is_first_microbatch, fp8_output=fp8_output)


def make_mlp(seed: int = 0, device: str = "cpu", bias: bool = True) -> MLP:
    """The test model, deterministically initialised (same seed, same weights)."""
    torch.manual_seed(seed)
    return MLP(device=device, bias=bias)


def make_input(batch: int = 4, seq: int = 16, seed: int = 1, device: str = "cpu") -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(batch, seq, 64, generator=gen).to(torch.bfloat16).to(device)


def recipe_context(name: str | None) -> Any:
    """``autocast`` with a fresh recipe of that name; bf16/None: the surrounding context."""
    factory = RECIPES.get(name) if name else None
    return autocast(recipe=factory()) if factory is not None else contextlib.nullcontext()


def step(model: Any, x: torch.Tensor, recipe: str | None, **kwargs: Any) -> tuple[Any, ...]:
    """One forward + backward (loss = sum): (output, input grad, parameter grads)."""
    params = [p for p in _modules_params(model)]
    for p in params:
        p.grad = None
    x = x.detach().clone().requires_grad_(True)
    with recipe_context(recipe):
        y = model(x, **kwargs) if kwargs else model(x)
    y.sum().backward()
    return y.detach(), x.grad, [p.grad for p in params]


def _modules_params(model: Any) -> list[torch.nn.Parameter]:
    inner = getattr(model, "_orig_mod", model)
    return list(inner.parameters())


def cloned(result: tuple[Any, ...]) -> tuple[Any, ...]:
    """``step``'s result copied (CUDA-graph outputs are overwritten by the next replay)."""
    out, dx, grads = result
    return out.clone(), dx.clone(), [None if g is None else g.clone() for g in grads]


def assert_bitwise(a: tuple[Any, ...], b: tuple[Any, ...]) -> None:
    """Output, input grad and every parameter grad are identical (torch.equal)."""
    out_a, dx_a, grads_a = a
    out_b, dx_b, grads_b = b
    assert torch.equal(out_a, out_b), "output differs"
    assert torch.equal(dx_a, dx_b), "input grad differs"
    assert len(grads_a) == len(grads_b)
    for i, (ga, gb) in enumerate(zip(grads_a, grads_b, strict=True)):
        assert ga is not None and gb is not None, f"parameter {i} got no grad"
        assert torch.equal(ga, gb), f"grad of parameter {i} differs"


def graph_breaks() -> int:
    return sum(counters["graph_break"].values())


def unique_graphs() -> int:
    return counters["stats"]["unique_graphs"]


class RecompileLog(logging.Handler):
    """Collects dynamo's recompile reasons (the ``recompiles`` logging artifact)."""

    LOGGER = "torch._dynamo.guards.__recompiles"

    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def run_in_threads(fn: Any, names: list[str]) -> dict[str, Any]:
    """``{name: fn(name)}``, every call on its own thread, all started together (a
    barrier); an exception on any thread fails the caller with every thread's error."""
    results: dict[str, Any] = {}
    errors: list[Any] = []
    barrier = threading.Barrier(len(names))

    def work(name: str) -> None:
        try:
            barrier.wait()
            results[name] = fn(name)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append((name, e))

    threads = [threading.Thread(target=work, args=(n,)) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    return results


def linear_call_bundle(layer: Linear, *args: Any, **kwargs: Any) -> Any:
    """The ``LinearFwdArgs`` a ``Linear`` call hands its op: the fields it passes the
    generated ``call_linear`` by name, recorded (the call itself runs as usual)."""
    from transformer_engine_ops.modules import linear as linear_module
    from transformer_engine_ops.ops.linear import LinearFwdArgs

    seen: list[dict[str, Any]] = []
    entry = linear_module.call_linear

    def record(**fields: Any) -> Any:
        seen.append({k: v for k, v in fields.items() if k != "keep"})
        return entry(**fields)

    linear_module.call_linear = record
    try:
        layer(*args, **kwargs)
    finally:
        linear_module.call_linear = entry
    (fields,) = seen
    return LinearFwdArgs(**fields)
