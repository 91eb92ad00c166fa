"""Inner buffers of a quantized value never share storage with each other or with the
input: a custom op may not return aliases, and an (M, 1) or (1, K) transpose made with
``.t().contiguous()`` is a view of the data it transposes."""

from __future__ import annotations

import pytest
import torch
from quant_cases import QUANTIZERS, random_input, usable_for

DEGENERATE_SHAPES = [(1, 64), (64, 1), (1, 1), (64,), (1, 32, 64), (32, 1)]


def _storages(tensors: list[torch.Tensor]) -> list[int]:
    return [t.untyped_storage().data_ptr() for t in tensors if t.numel()]


@pytest.mark.parametrize("shape", DEGENERATE_SHAPES, ids=str)
@pytest.mark.parametrize("name", list(QUANTIZERS))
def test_quantized_buffers_never_alias_each_other_or_the_input(name, shape):
    q = usable_for(QUANTIZERS[name], shape).with_internal(True)
    x = random_input(shape)
    try:
        q.check_shape(shape)
    except ValueError:
        pytest.skip(f"{name} does not take shape {shape}")
    value = q.quantize(x)
    ptrs = _storages(value.inner_tensors())
    assert len(ptrs) == len(set(ptrs)), f"{name} {shape}: inner buffers share storage"
    assert x.untyped_storage().data_ptr() not in ptrs, f"{name} {shape}: a buffer aliases x"
