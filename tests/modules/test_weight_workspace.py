"""``WeightWorkspace`` (``modules/_workspace.py``) eagerly: where a module's cached
quantized weight lives, when a first microbatch writes it in place and when it replaces
it. The compiled side is in ``test_compiled_microbatches.py``."""

from __future__ import annotations

import copy
import io

import pytest
import torch

import transformer_engine_ops as te
from transformer_engine_ops import recipe


def _linear() -> te.Linear:
    torch.manual_seed(0)
    return te.Linear(64, 32, params_dtype=torch.bfloat16)


def _call(module: te.Linear, first: bool | None, make_recipe=recipe.Float8CurrentScaling) -> None:
    x = torch.randn(32, 64, dtype=torch.bfloat16, requires_grad=True)
    with te.autocast(recipe=make_recipe()):
        module(x, is_first_microbatch=first).float().sum().backward()


def _addresses(module: te.Linear) -> list[int]:
    return [b.data_ptr() for b in module._weight_cache.buffers]


def _same_tensors(cache) -> bool:
    """The kept buffers are the kept value's own inner tensors."""
    names = cache.value._present_names
    return len(cache.buffers) == len(names) and all(
        b is getattr(cache.value, n) for b, n in zip(cache.buffers, names, strict=True)
    )


def test_an_eager_first_microbatch_writes_the_kept_weight_in_place():
    """TE's update_workspace: the next first microbatch quantizes the changed weight
    into the same object at the same addresses, equal to a fresh quantization."""
    module, fresh = _linear(), _linear()
    _call(module, True)
    cache = module._weight_cache
    kept, addresses = cache.value, _addresses(module)
    assert cache.in_place and _same_tensors(cache)
    before = [b.clone() for b in cache.buffers]
    with torch.no_grad():
        module.weight.mul_(2)
        fresh.weight.mul_(2)
    _call(module, True)
    _call(fresh, True)
    assert module._weight_workspace is kept and _addresses(module) == addresses
    assert any(not torch.equal(a, b) for a, b in zip(before, cache.buffers, strict=True))
    for a, b in zip(cache.buffers, fresh._weight_cache.buffers, strict=True):
        assert torch.equal(a, b)


def test_a_first_microbatch_under_another_recipe_replaces_the_kept_weight():
    """A fresh weight that does not fit the kept buffers (another format) is kept as it
    is, never copied into them."""
    module = _linear()
    _call(module, True)
    old = module._weight_workspace
    _call(module, True, recipe.MXFP8BlockScaling)
    assert module._weight_workspace is not old
    assert type(module._weight_workspace).__name__ != type(old).__name__
    assert _same_tensors(module._weight_cache) and module._weight_cache.in_place


def test_a_workspace_made_without_grad_is_replaced_by_one_with_the_columnwise_data():
    module = _linear()
    with torch.no_grad(), te.autocast(recipe=recipe.Float8CurrentScaling()):
        module(torch.randn(8, 64, dtype=torch.bfloat16), is_first_microbatch=True)
    old = module._weight_workspace
    assert not old.columnwise_usage
    _call(module, False)
    assert module._weight_workspace is not old and module._weight_workspace.columnwise_usage


def test_a_workspace_made_under_inference_mode_is_replaced_not_written():
    """torch refuses writes to inference tensors outside ``inference_mode``: such a
    workspace is replaced by the next first microbatch, which then matches a fresh one."""
    module, fresh = _linear(), _linear()
    with torch.inference_mode(), te.autocast(recipe=recipe.Float8CurrentScaling()):
        module(torch.randn(32, 64, dtype=torch.bfloat16), is_first_microbatch=True)
    assert not module._weight_cache.in_place
    _call(module, True)
    _call(fresh, True)
    assert module._weight_cache.in_place
    for a, b in zip(module._weight_cache.buffers, fresh._weight_cache.buffers, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("how", ["deepcopy", "torch.save"])
def test_a_copied_module_writes_into_its_own_kept_weight(how):
    """A copy keeps the invariant: its buffers are its own value's inner tensors, so a
    write reaches what its ops read, and never the original's."""
    module = _linear()
    _call(module, True)
    if how == "deepcopy":
        copied = copy.deepcopy(module)
    else:
        stream = io.BytesIO()
        torch.save(module, stream)
        stream.seek(0)
        copied = torch.load(stream, weights_only=False)
    cache = copied._weight_cache
    assert cache.in_place and _same_tensors(cache)
    assert set(_addresses(copied)).isdisjoint(_addresses(module))
    original = [b.clone() for b in module._weight_cache.buffers]
    with torch.no_grad():
        copied.weight.add_(1.0)
    _call(copied, True)
    assert any(not torch.equal(a, b) for a, b in zip(cache.buffers, original, strict=True))
    for a, b in zip(module._weight_cache.buffers, original, strict=True):
        assert torch.equal(a, b)
