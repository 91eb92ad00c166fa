"""Bundles of the Linear-family ops, as their modules build them, and the op checks
every family op shares (opcheck both ways, fake-vs-real flat layouts)."""

from __future__ import annotations

import contextlib
import sys
from types import ModuleType
from typing import Any

import torch
from linear_cases import RECIPES as LINEAR_RECIPES
from test_linear_ops import _layout, _real_and_fake

from tests.runtime.lowering_check import forward_bundle
from transformer_engine_ops.modules.autocast import autocast

# The ops' recipes, as the Linear op tests make them.
RECIPES: dict[str, Any] = LINEAR_RECIPES


class _Recorder:
    """Stands in for a module's ``call_<op>``: keeps the fields it is given, as the
    op's forward bundle."""

    def __init__(self, bundle: type) -> None:
        self.bundle = bundle
        self.args: Any = None

    def __call__(self, keep: Any = None, **fields: Any) -> tuple[Any, ...]:
        self.args = self.bundle(**fields)
        return (None, None)


def capture_bundle(module: torch.nn.Module, x: torch.Tensor, recipe: str, *extra: Any) -> Any:
    """The forward bundle ``module(x, *extra)`` hands its op under ``recipe`` (op not run).
    A module with several ops (GroupedLinear: the grouped GEMM or the loop) gives the
    bundle of the one its call took."""
    owner: ModuleType = sys.modules[type(module).__module__]
    entries = [name for name in vars(owner) if name.startswith("call_")]  # its call_<op>s
    originals = {entry: getattr(owner, entry) for entry in entries}
    recorders = {
        entry: _Recorder(forward_bundle(sys.modules[original.__module__]))
        for entry, original in originals.items()
    }
    for entry, recorder in recorders.items():
        setattr(owner, entry, recorder)
    factory = RECIPES[recipe]
    context = autocast(recipe=factory()) if factory is not None else contextlib.nullcontext()
    try:
        with context:
            module(x, *extra)
    finally:
        for entry, original in originals.items():
            setattr(owner, entry, original)
    (called,) = [r for r in recorders.values() if r.args is not None]
    return called.args


def _detached(value: Any) -> Any:
    # The backward op runs inside autograd's backward: its inputs carry no graph.
    if isinstance(value, torch.Tensor):
        return value.detach()
    if isinstance(value, list):
        return [_detached(v) for v in value]
    return value


def backward_bundle(g: ModuleType, name: str, fwd: Any, seed: int = 1) -> Any:
    """The backward bundle a forward run of ``fwd`` leads to, random output grads."""
    with torch.no_grad():
        outputs, saved = getattr(g, f"{name}_forward")(fwd)
    bwd = g._backward_args(fwd, outputs, saved)  # the generated path
    for field, value in vars(bwd).items():
        setattr(bwd, field, _detached(value))
    gen = torch.Generator().manual_seed(seed)
    bwd.grad_outputs = [torch.randn(o.shape, generator=gen).to(o.dtype) for o in outputs]
    return bwd


def check_opcheck(g: ModuleType, name: str, flatten_fwd: Any, flatten_bwd: Any, fwd: Any) -> None:
    torch.library.opcheck(getattr(g, f"{name}_fwd"), flatten_fwd(fwd))
    bwd = backward_bundle(g, name, fwd)
    torch.library.opcheck(getattr(g, f"{name}_bwd"), flatten_bwd(bwd))


def check_fake_layouts(
    g: ModuleType, name: str, flatten_fwd: Any, flatten_bwd: Any, fwd: Any
) -> None:
    real, fake = _real_and_fake(getattr(g, f"{name}_fwd"), flatten_fwd(fwd))
    assert len(real) == len(fake) > 0
    assert _layout(fake) == _layout(real)
    bwd = backward_bundle(g, name, fwd)
    real, fake = _real_and_fake(getattr(g, f"{name}_bwd"), flatten_bwd(bwd))
    # One flat gradient per plain field, one per element of a list field.
    assert len(real) == len(fake) >= len(g.GRAD_FIELDS)
    assert _layout(fake) == _layout(real)
