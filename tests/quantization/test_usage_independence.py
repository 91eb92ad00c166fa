"""Each usage of a quantized value is a function of the data alone: quantizing with both
usages or with one gives the same rowwise bits and the same columnwise bits. What
``Linear(save_original_input=True)`` (the backward makes the columnwise usage alone) and
``LayerNormMLP(checkpoint=True)`` (the forward makes the rowwise usage alone, the
backward both) rest on to give the bits of the plain module (docs/quantization.md)."""

from __future__ import annotations

import pytest
import torch
from quant_cases import QUANTIZERS

from transformer_engine_ops.quantization import NVFP4Quantizer
from transformer_engine_ops.quantization.quantizer import Quantizer

CASES: dict[str, Quantizer] = {
    **QUANTIZERS,
    # NVFP4BlockScaling's input and weight (the Hadamard transform on columnwise data).
    "nvfp4_rht": NVFP4Quantizer(with_rht=True),
    "nvfp4_rht_post_amax": NVFP4Quantizer(with_rht=True, with_post_rht_amax=True),
}
CUDA = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def _buffers(q: Quantizer, x: torch.Tensor, rowwise: bool, columnwise: bool) -> dict:
    value = q.with_usage(rowwise=rowwise, columnwise=columnwise).with_internal(True).quantize(x)
    return dict(zip(value.inner_names(), value.inner_tensors(), strict=True))


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=CUDA)])
@pytest.mark.parametrize("name", list(CASES))
def test_one_usage_alone_is_the_same_bits_as_with_the_other(name, device):
    q = CASES[name]
    gen = torch.Generator().manual_seed(3)
    x = (torch.randn(96, 128, generator=gen) * 3).to(torch.bfloat16).to(device)
    x[5, 7] = 40.0  # an outlier: one block's (and the tensor's) amax
    both = _buffers(q, x, True, True)
    for rowwise in (True, False):
        alone = _buffers(q, x, rowwise, not rowwise)
        assert alone, name
        for buffer, t in alone.items():
            assert torch.equal(t, both[buffer]), f"{name}: {buffer}"
