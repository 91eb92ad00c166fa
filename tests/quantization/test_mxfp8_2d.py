"""MXFP8's 2-D weight tiles (TE's ``MXFP8BlockScaling(enable_2d_quantization=True)``):
one E8M0 scale per 32x32 tile, from the tile's amax, in both usages."""

from __future__ import annotations

import pytest
import torch
from quant_cases import random_input

from transformer_engine_ops.quantization import MXFP8Quantizer
from transformer_engine_ops.recipe import MXFP8BlockScaling

TILE = MXFP8Quantizer(with_2d_quantization=True)


def test_one_scale_per_32x32_tile_from_the_tiles_amax():
    x = random_input((64, 96), seed=3) * torch.logspace(-2, 2, 96)
    v = TILE.quantize(x)
    row = v._rowwise_scale_inv[:64, :3].long()  # [m, k // 32]
    col = v._columnwise_scale_inv[:2, :96].long()  # [m // 32, k]
    tiles = row.reshape(2, 32, 3)
    assert torch.equal(tiles, tiles[:, :1].expand(2, 32, 3))
    assert torch.equal(col.reshape(2, 3, 32), tiles[:, 0, :, None].expand(2, 3, 32))
    amax = x.double().abs().reshape(2, 32, 3, 32).amax(dim=(1, 3))
    expected = torch.ceil(torch.log2(amax / 448)) + 127  # float64 reference of E8M0
    assert torch.equal(tiles[:, 0].double(), expected)
    assert torch.equal(v._rowwise_data, v._columnwise_data)  # the same codes


def test_2d_round_trip_stays_within_the_fp8_bound_of_its_tile():
    x = random_input((64, 64), seed=4)
    y = TILE.quantize(x).dequantize()
    amax = x.abs().reshape(2, 32, 2, 32).amax(dim=(1, 3))
    s = (2 * amax / 448).repeat_interleave(32, 0).repeat_interleave(32, 1)  # pow-2 scale_inv
    assert bool(((y - x).abs() <= x.abs() * 2**-4 + 2**-10 * s).all())


def test_an_inf_makes_its_whole_tile_nan():
    x = random_input((64, 64), seed=5)
    x[40, 3] = float("inf")
    y = TILE.quantize(x).dequantize()
    assert bool(y[32:, :32].isnan().all())
    assert bool(torch.isfinite(y[:32]).all() and torch.isfinite(y[32:, 32:]).all())


@pytest.mark.parametrize("two_d", [False, True])
def test_recipe_gives_the_weight_alone_2d_tiles(two_d):
    r = MXFP8BlockScaling(enable_2d_quantization=two_d)
    assert r.make_quantizer("weight").with_2d_quantization is two_d
    for role in ("input", "output", "grad_output", "grad_input", "grad_weight"):
        assert not r.make_quantizer(role).with_2d_quantization
