"""The single-process parts of FSDP2 over quantized parameters: the tensor ops
``fully_shard`` applies to a parameter (chunk, ``new_zeros``, ``narrow``, ``copy_``,
``as_strided``) keep a per-tensor FP8 shard's codes and scale exactly, and the
all-gather hooks rebuild the whole tensor from the shards or refuse what they cannot
gather. The four-rank runs are in tests/distributed/test_fsdp2_tp.py."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from transformer_engine_ops.quantization import (
    Float8CurrentScalingQuantizer,
    Float8Tensor,
    MXFP8Quantizer,
)
from transformer_engine_ops.quantization.quantizer import QuantizedView


class _Mesh:
    """The two methods the hooks call on FSDP2's shard mesh."""

    def __init__(self, n: int) -> None:
        self.n = n

    def size(self) -> int:
        return self.n

    def get_group(self) -> Any:
        return None


def _weight(rows: int = 8, cols: int = 16, columnwise: bool = True) -> Float8Tensor:
    x = torch.randn(rows, cols, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    q = Float8CurrentScalingQuantizer(columnwise_usage=columnwise)
    return q.quantize(x)


def _fsdp_shard(w: Float8Tensor, n: int, r: int) -> Any:
    """What ``fully_shard``'s ``_init_sharded_param`` does to a parameter (even case)."""
    chunk = torch.chunk(w, n, dim=0)[r]
    padded = w.new_zeros(chunk.size())
    padded.narrow(0, 0, chunk.size(0)).copy_(chunk)
    return padded.narrow(0, 0, chunk.size(0))


@pytest.mark.parametrize("columnwise", [False, True])
def test_sharding_ops_keep_the_shards_codes_and_scale(columnwise: bool) -> None:
    w = _weight(columnwise=columnwise)
    for r in range(2):
        shard = _fsdp_shard(w, 2, r)
        assert type(shard) is Float8Tensor
        assert torch.equal(shard._data, w._data[4 * r : 4 * r + 4])
        assert torch.equal(shard._scale_inv, w._scale_inv)
        assert shard.columnwise_usage == columnwise
        if columnwise:
            assert torch.equal(shard._transpose, w._transpose[:, 4 * r : 4 * r + 4])


def test_new_zeros_is_quantized_zeros_in_the_same_format() -> None:
    w = _weight()
    z = w.new_zeros((3, 16))
    assert type(z) is Float8Tensor and z.quantizer == w.quantizer
    assert torch.equal(z.dequantize(), torch.zeros(3, 16, dtype=torch.bfloat16))


def test_new_zeros_of_a_view_is_quantized_zeros_in_the_viewed_format() -> None:
    # FSDP2 re-pads the empty shard of the last rank (a view of no rows) this way.
    z = _weight().narrow(0, 0, 0).new_zeros((2, 16))
    assert type(z) is Float8Tensor
    assert torch.equal(z.dequantize(), torch.zeros(2, 16, dtype=torch.bfloat16))


def test_identity_views_alias_the_quantized_value_and_other_views_do_not() -> None:
    w = _weight()
    for view in (w.narrow(0, 0, 8), w.view(8, 16), torch.as_strided(w, (8, 16), (16, 1), 0)):
        assert type(view) is Float8Tensor
        assert view._data.untyped_storage().data_ptr() == w._data.untyped_storage().data_ptr()
    assert type(w.narrow(0, 1, 4)) is QuantizedView
    assert type(w.view(-1)) is QuantizedView


def test_copy_from_a_row_block_of_another_scale_is_exact() -> None:
    w = _weight()
    dst = w.new_zeros((4, 16))
    dst.copy_(w[2:6])
    assert torch.equal(dst._data, w._data[2:6]) and torch.equal(dst._scale_inv, w._scale_inv)
    # A block of columns is no tensor of its own: requantized, as any in-place write.
    cols = w.new_zeros((8, 8))
    cols.copy_(w[:, :8])
    want = w.quantizer.quantize(w.dequantize()[:, :8])
    assert torch.equal(cols._data, want._data) and torch.equal(cols._scale_inv, want._scale_inv)


@pytest.mark.parametrize("columnwise", [False, True])
def test_gather_rebuilds_the_whole_tensor_bit_for_bit(columnwise: bool) -> None:
    w = _weight(columnwise=columnwise)
    shards = [_fsdp_shard(w, 2, r) for r in range(2)]
    inputs = [s.fsdp_pre_all_gather(_Mesh(2), w.shape, (16, 1), None, None) for s in shards]
    (codes, scale), metadata = inputs[0]
    assert codes.dtype == torch.uint8 and codes.shape == (4, 16)
    assert scale.dtype == torch.float32 and scale.numel() == 1
    gathered = (
        torch.cat([i[0][0] for i in inputs]),
        torch.cat([i[0][1].reshape(-1) for i in inputs]),
    )
    full, kept = shards[0].fsdp_post_all_gather(gathered, metadata, torch.bfloat16)
    assert type(full) is Float8Tensor and full.shape == w.shape
    assert full.inner_names() == w.inner_names()
    for name in w.inner_names():
        assert torch.equal(getattr(full, name), getattr(w, name)), name
    assert kept[0] is gathered[0]
    # Later gathers refill the same tensor (FSDP2 passes it as ``out``).
    assert shards[0].fsdp_post_all_gather(gathered, metadata, torch.bfloat16, out=full) is None
    assert torch.equal(full.dequantize(), w.dequantize())


def test_gathered_shards_with_different_scales_are_refused() -> None:
    w = _weight()
    codes, scale = w._data, w._scale_inv
    with pytest.raises(RuntimeError, match="hold different scales"):
        w.fsdp_post_all_gather((codes, torch.cat([scale, 2 * scale])), (False,), torch.bfloat16)


def test_uneven_rows_and_other_formats_are_refused_before_any_gather() -> None:
    w = _weight(rows=6)
    with pytest.raises(RuntimeError, match="dim 0 must divide evenly over the 4 ranks"):
        w.fsdp_pre_all_gather(_Mesh(4), w.shape, (16, 1), None, None)
    with pytest.raises(RuntimeError, match="sharded unevenly over the 4 ranks"):
        w.narrow(0, 0, 2).fsdp_pre_all_gather(_Mesh(4), w.shape, (16, 1), None, None)
    x = torch.randn(64, 64, dtype=torch.bfloat16)
    mx = MXFP8Quantizer().quantize(x)
    with pytest.raises(RuntimeError, match="MXFP8 quantized parameter .* cannot be sharded"):
        mx.fsdp_pre_all_gather(_Mesh(2), mx.shape, (64, 1), None, None)
