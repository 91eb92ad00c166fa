"""``setup_context(args, outputs, saved)`` receives the forward's outputs: a backward
that needs a returned tensor (LayerNormLinear's and LayerNormMLP's norm output, with
``return_layernorm_output=True``) saves that very tensor, never a clone of it, eagerly
and compiled, with the same bits as when the norm output is not returned."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import transformer_engine_ops as te


def _module(cls: str, returns: bool) -> torch.nn.Module:
    torch.manual_seed(0)
    if cls == "LayerNormLinear":
        return te.LayerNormLinear(64, 32, return_layernorm_output=returns)
    return te.LayerNormMLP(64, 48, return_layernorm_output=returns)


def _run(module: Any, x: torch.Tensor) -> tuple[Any, list[torch.Tensor], list[torch.Tensor]]:
    """(returned norm output or None, the tensors autograd saved, [dx, *param grads])."""
    x = x.clone().requires_grad_(True)
    packed: list[torch.Tensor] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        packed.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        result = module(x)
    out, ln_out = result if isinstance(result, tuple) else (result, None)
    out.float().square().sum().backward()
    return ln_out, packed, [x.grad, *(p.grad for p in module.parameters())]


@pytest.mark.parametrize("cls", ["LayerNormLinear", "LayerNormMLP"])
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "aot_eager"])
def test_a_returned_norm_output_is_saved_as_itself_not_a_copy(cls, compiled):
    x = torch.randn(8, 64)
    module = _module(cls, returns=True)
    if compiled:
        module = torch.compile(module, fullgraph=True, backend="aot_eager")
    ln_out, packed, grads = _run(module, x)
    if not compiled:  # compiled, autograd saves the graph's own tensors, not ours
        storage = ln_out.untyped_storage().data_ptr()
        shared = [t for t in packed if t.untyped_storage().data_ptr() == storage]
        assert shared, "the backward saved the returned norm output itself"
        same_values = [t for t in packed if t is not ln_out and torch.equal(t, ln_out)]
        assert all(t.untyped_storage().data_ptr() == storage for t in same_values), "a copy"
    _, _, want = _run(_module(cls, returns=False), x)
    for a, b in zip(grads, want, strict=True):
        assert torch.equal(a, b)
