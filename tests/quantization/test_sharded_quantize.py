"""Quantizing shards and gathering them (sequence parallelism's quantized all-gather)
gives the whole tensor's bits.

FP8 current scaling with a reduced amax (TE's amax reduction over a TP group): shards
quantized with the element-wise maximum of their ``amax_stats`` hold exactly the codes
and scale-inverse of the whole tensor quantized at once; NVFP4 likewise with its two
per-tensor amaxes (rowwise, and columnwise after the Hadamard transform). ``gathered_rows``
(FP8 per tensor, MXFP8, 1-D FP8 blocks, NVFP4) concatenates the shards' buffers as a
whole tensor's: checked here with an in-process stand-in for the all-gather
(tests/distributed runs the real one)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from transformer_engine_ops.ops.tensor_parallel import gathers_quantized
from transformer_engine_ops.quantization import (
    Float8BlockScaling,
    Float8CurrentScaling,
    MXFP8BlockScaling,
    NVFP4BlockScaling,
)
from transformer_engine_ops.quantization.float8 import Float8CurrentScalingQuantizer
from transformer_engine_ops.quantization.float8_block import Float8BlockQuantizer
from transformer_engine_ops.quantization.mxfp8 import MXFP8Quantizer
from transformer_engine_ops.quantization.nvfp4 import NVFP4Quantizer

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
ROLES = ("input", "weight", "output", "grad_output", "grad_input", "grad_weight")

CONFIGS = {
    "e4m3": dict(),
    "e5m2": dict(fp8_dtype=E5M2),
    "pow2": dict(force_pow_2_scales=True),
    "epsilon": dict(amax_epsilon=1e3),  # larger than every amax: the floor decides
}


def _tensor(kind: str) -> torch.Tensor:
    gen = torch.Generator().manual_seed(29)
    x = torch.randn(24, 40, generator=gen)
    x[18:] *= 50  # the last shard holds the amax
    if kind == "inf":
        x[20, 3] = float("inf")
    elif kind == "nan":
        x[2, 7] = float("nan")
    elif kind == "zeros":
        x.zero_()
    return x.to(torch.bfloat16)


def _reduced(q: Float8CurrentScalingQuantizer, shards: list[torch.Tensor]) -> torch.Tensor:
    return torch.stack([q.amax_stats(s) for s in shards]).amax(0)


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("kind", ["finite", "inf", "nan", "zeros"])
@pytest.mark.parametrize("parts", [2, 3, 4])
def test_shards_with_reduced_stats_hold_the_whole_tensors_bits(
    config: str, kind: str, parts: int
) -> None:
    q = Float8CurrentScalingQuantizer(internal=True, **CONFIGS[config])
    x = _tensor(kind)
    whole = q.quantize(x)
    shards = list(x.chunk(parts, 0))
    stats = _reduced(q, shards)
    got = [q.quantize_with_stats(s, stats) for s in shards]
    assert torch.equal(torch.cat([g._data for g in got]), whole._data)
    assert torch.equal(torch.cat([g._transpose for g in got], 1), whole._transpose)
    for g in got:
        assert torch.equal(g._scale_inv, whole._scale_inv)


def test_a_shards_own_stats_give_another_scale() -> None:
    """The reduction matters: a shard quantized with its own amax differs."""
    q = Float8CurrentScalingQuantizer(internal=True)
    x = _tensor("finite")
    whole = q.quantize(x)
    own = q.quantize(x[:12])
    assert not torch.equal(own._scale_inv, whole._scale_inv)
    assert not torch.equal(own._data, whole._data[:12])


def test_stats_are_the_finite_amax_and_an_inf_flag() -> None:
    q = Float8CurrentScalingQuantizer()
    x = torch.tensor([[1.0, -3.0], [float("nan"), 2.0]])
    assert torch.equal(q.amax_stats(x), torch.tensor([3.0, 0.0]))
    x[0, 0] = float("-inf")
    assert torch.equal(q.amax_stats(x), torch.tensor([3.0, 1.0]))


@pytest.mark.parametrize(
    ("stats", "fragment"),
    [(torch.zeros(3), "(3,)"), (torch.zeros(2, dtype=torch.float64), "torch.float64")],
)
def test_malformed_stats_are_refused_naming_the_method(stats: torch.Tensor, fragment: str) -> None:
    q = Float8CurrentScalingQuantizer()
    with pytest.raises(ValueError, match="quantize_with_stats") as info:
        q.quantize_with_stats(torch.ones(2, 2), stats)
    assert fragment in str(info.value)


@pytest.mark.parametrize(
    "recipe_cls", [Float8CurrentScaling, MXFP8BlockScaling, Float8BlockScaling, NVFP4BlockScaling]
)
def test_the_gather_option_is_validated_and_reaches_every_quantizer(recipe_cls: type) -> None:
    assert all(recipe_cls().make_quantizer(role).fp8_all_gather for role in ROLES)
    off = recipe_cls(fp8_all_gather=False)
    assert not any(off.make_quantizer(role).fp8_all_gather for role in ROLES)
    with pytest.raises(TypeError, match="fp8_all_gather"):
        recipe_cls(fp8_all_gather=1)
    quantizer_cls = type(recipe_cls().make_quantizer("input"))
    with pytest.raises(TypeError, match="fp8_all_gather"):
        quantizer_cls(fp8_all_gather="no")


def _gathered(shards: list, rowwise: bool, columnwise: bool):
    """Every shard's ``gathered_rows``, with an all-gather that concatenates the i-th
    buffer each shard sends (all shards send their buffers in the same order)."""
    sent: list[list[torch.Tensor]] = []
    for shard in shards:
        calls: list[torch.Tensor] = []

        def record(t: torch.Tensor, calls: list[torch.Tensor] = calls) -> torch.Tensor:
            calls.append(t)
            return torch.cat([t] * len(shards))

        shard.gathered_rows(record, len(shards), rowwise=rowwise, columnwise=columnwise)
        sent.append(calls)
    results = []
    for shard in shards:
        index = iter(range(len(sent[0])))

        def gather(t: torch.Tensor, index: Iterator[int] = index) -> torch.Tensor:
            i = next(index)
            return torch.cat([calls[i] for calls in sent])

        results.append(
            shard.gathered_rows(gather, len(shards), rowwise=rowwise, columnwise=columnwise)
        )
    return results


USAGES = [(True, False), (False, True), (True, True)]


@pytest.mark.parametrize(("rowwise", "columnwise"), USAGES)
def test_fp8_shards_gather_into_the_whole_tensors_codes(rowwise: bool, columnwise: bool) -> None:
    q = Float8CurrentScalingQuantizer(internal=True)
    x = _tensor("finite")
    whole = q.quantize(x)
    shards = list(x.chunk(3, 0))
    stats = _reduced(q, shards)
    local = [q.with_usage(columnwise=False).quantize_with_stats(s, stats) for s in shards]
    for got in _gathered(local, rowwise, columnwise):
        assert (got.rowwise_usage, got.columnwise_usage) == (rowwise, columnwise)
        assert got.shape == whole.shape
        for name in got.inner_names():
            assert torch.equal(getattr(got, name), getattr(whole, name)), name


def test_fp8_columnwise_only_shards_are_refused_naming_the_usage() -> None:
    q = Float8CurrentScalingQuantizer(internal=True, rowwise_usage=False)
    shard = q.quantize(torch.ones(4, 8))
    with pytest.raises(ValueError, match="only rowwise FP8 data is gathered"):
        shard.gathered_rows(lambda t: t, 2, rowwise=True, columnwise=False)


@pytest.mark.parametrize(("rowwise", "columnwise"), USAGES)
@pytest.mark.parametrize("parts", [2, 3, 5])
def test_mxfp8_shards_of_whole_blocks_gather_into_the_whole_tensors_bits(
    rowwise: bool, columnwise: bool, parts: int
) -> None:
    """Shards of 32 rows (no columnwise block straddles two): codes and E8M0 scales,
    padded as the whole tensor's (rows to 128, scale columns to 4 / 128)."""
    gen = torch.Generator().manual_seed(3)
    x = (torch.randn(32 * parts, 96, generator=gen) * torch.logspace(-3, 3, 96)).bfloat16()
    x[40, 7] = float("inf")
    q = MXFP8Quantizer(internal=True, rowwise_usage=rowwise, columnwise_usage=columnwise)
    whole = q.quantize(x)
    local = [q.quantize(s) for s in x.chunk(parts, 0)]
    for got in _gathered(local, rowwise, columnwise):
        assert got.shape == whole.shape
        assert got.inner_names() == whole.inner_names()
        for name in got.inner_names():
            assert torch.equal(getattr(got, name), getattr(whole, name)), name


def test_mxfp8_gathers_only_the_usages_a_shard_holds() -> None:
    shard = MXFP8Quantizer(internal=True, columnwise_usage=False).quantize(torch.ones(32, 32))
    with pytest.raises(ValueError, match="no columnwise data"):
        shard.gathered_rows(lambda t: t, 1, rowwise=False, columnwise=True)


@pytest.mark.parametrize(("rowwise", "columnwise"), USAGES)
@pytest.mark.parametrize("parts", [2, 3])
@pytest.mark.parametrize("pow2", [True, False])
def test_fp8_block_shards_of_whole_blocks_gather_into_the_whole_tensors_bits(
    rowwise: bool, columnwise: bool, parts: int, pow2: bool
) -> None:
    """1-D blocks (16 here: TE's 128 scaled down), K not a multiple of the block: codes
    and fp32 scales, re-laid out as the whole tensor's (transposed codes, padded scales)."""
    gen = torch.Generator().manual_seed(5)
    x = (torch.randn(16 * parts, 40, generator=gen) * torch.logspace(-2, 2, 40)).bfloat16()
    x[17, 3] = float("inf")
    q = Float8BlockQuantizer(
        internal=True,
        block_len=16,
        block_scaling_dim=1,
        force_pow_2_scales=pow2,
        rowwise_usage=rowwise,
        columnwise_usage=columnwise,
    )
    whole = q.quantize(x)
    local = [q.quantize(s) for s in x.chunk(parts, 0)]
    for got in _gathered(local, rowwise, columnwise):
        assert got.shape == whole.shape
        assert got.inner_names() == whole.inner_names()
        for name in got.inner_names():
            assert torch.equal(getattr(got, name), getattr(whole, name)), name


@pytest.mark.parametrize(
    ("quantizer", "rows"),
    [
        (Float8BlockQuantizer(block_len=16, block_scaling_dim=2), 16),
        (Float8BlockQuantizer(block_len=16, block_scaling_dim=1), 8),
    ],
    ids=["2-D blocks", "a columnwise block straddles shards"],
)
def test_fp8_block_shards_that_cannot_be_gathered_are_refused(
    quantizer: Float8BlockQuantizer, rows: int
) -> None:
    shard = quantizer.quantize(torch.ones(rows, 32))
    with pytest.raises(ValueError, match="gathers 1-D blocks of shards of whole blocks"):
        shard.gathered_rows(lambda t: t, 2, rowwise=True, columnwise=True)


# NVFP4: the configurations a sequence-parallel gather quantizes (TE's input: the
# transform on the columnwise data; 16x16 blocks; 4over6 with either error).
NVFP4_CONFIGS = {
    "plain": dict(),
    "rht": dict(with_rht=True, with_post_rht_amax=True),
    "rht_amax_before": dict(with_rht=True),
    "2d": dict(with_2d_quantization=True),
    "4over6": dict(nvfp4_use_4over6=True),
    "4over6_mse_256": dict(nvfp4_use_4over6=True, nvfp4_4over6_err_mode="MSE", nvfp4_e4m3_max=256),
}


def _nvfp4_tensor(kind: str, parts: int) -> torch.Tensor:
    """16 rows a shard, features spread over binades; the last shard holds the amax."""
    gen = torch.Generator().manual_seed(31)
    x = torch.randn(16 * parts, 48, generator=gen) * torch.logspace(-3, 3, 48)
    x[-16:] *= 8
    if kind == "inf":
        x[5, 3] = float("inf")
    elif kind == "nan":
        x[17, 40] = float("nan")
    elif kind == "zeros":
        x.zero_()
    return x.to(torch.bfloat16)


@pytest.mark.parametrize(("rowwise", "columnwise"), USAGES)
@pytest.mark.parametrize("config", NVFP4_CONFIGS)
@pytest.mark.parametrize(
    ("kind", "parts"), [("finite", 2), ("finite", 3), ("inf", 2), ("nan", 2), ("zeros", 2)]
)
def test_nvfp4_shards_with_reduced_stats_gather_into_the_whole_tensors_bits(
    rowwise: bool, columnwise: bool, config: str, kind: str, parts: int
) -> None:
    """Shards of 16 rows quantized with the element-wise maximum of their
    ``amax_stats``, then gathered: packed codes, E4M3 scales (padded as the whole
    tensor's) and both amaxes equal the whole tensor quantized at once."""
    q = NVFP4Quantizer(
        internal=True, rowwise_usage=rowwise, columnwise_usage=columnwise, **NVFP4_CONFIGS[config]
    )
    x = _nvfp4_tensor(kind, parts)
    whole = q.quantize(x)
    shards = list(x.chunk(parts, 0))
    stats = _reduced(q, shards)
    local = [q.quantize_with_stats(s, stats) for s in shards]
    for got in _gathered(local, rowwise, columnwise):
        assert got.shape == whole.shape
        assert got.inner_names() == whole.inner_names()
        for name in got.inner_names():
            assert torch.equal(getattr(got, name), getattr(whole, name)), name
        want = whole.dequantize(torch.float32)  # NaN where a block held an Inf or NaN
        torch.testing.assert_close(
            got.dequantize(torch.float32), want, rtol=0, atol=0, equal_nan=True
        )


@pytest.mark.parametrize("config", ["plain", "rht"])
def test_nvfp4_a_shards_own_amax_gives_other_codes(config: str) -> None:
    """The reduction matters: a shard quantized alone has another global scale."""
    q = NVFP4Quantizer(internal=True, **NVFP4_CONFIGS[config])
    x = _nvfp4_tensor("finite", 2)
    whole, own = q.quantize(x), q.quantize(x[:16])
    assert not torch.equal(own._amax_rowwise, whole._amax_rowwise)
    assert not torch.equal(own._amax_columnwise, whole._amax_columnwise)
    assert not torch.equal(own._rowwise_data, whole._rowwise_data[:16])


def test_nvfp4_stats_are_the_rowwise_and_post_transform_amax() -> None:
    x = _nvfp4_tensor("inf", 2)
    plain = NVFP4Quantizer().amax_stats(x)
    assert plain[0] == plain[1] == x.float().abs().nan_to_num(posinf=0).amax()
    rht = NVFP4Quantizer(with_rht=True, with_post_rht_amax=True)
    stats = rht.amax_stats(x)
    assert stats[0] == plain[0]
    assert torch.equal(stats[1:], rht.quantize(x)._amax_columnwise)
    assert stats[1] != stats[0]


@pytest.mark.parametrize(
    ("quantizer", "stats", "fragment"),
    [
        (NVFP4Quantizer(), torch.zeros(3), "(3,)"),
        (NVFP4Quantizer(), torch.zeros(2, dtype=torch.float64), "torch.float64"),
        (NVFP4Quantizer(stochastic_rounding=True), torch.ones(2), "stochastic_rounding=True"),
        (NVFP4Quantizer(row_scaled_nvfp4=True), torch.ones(2), "row_scaled_nvfp4=True"),
    ],
    ids=["shape", "dtype", "stochastic", "row-scaled"],
)
def test_nvfp4_quantize_with_stats_refuses_what_it_cannot_shard(
    quantizer: NVFP4Quantizer, stats: torch.Tensor, fragment: str
) -> None:
    with pytest.raises(ValueError, match="quantize_with_stats") as info:
        quantizer.quantize_with_stats(torch.ones(16, 16), stats)
    assert fragment in str(info.value)


def test_nvfp4_row_scaled_data_has_no_stats_to_reduce() -> None:
    with pytest.raises(ValueError, match="one amax per row"):
        NVFP4Quantizer(row_scaled_nvfp4=True).amax_stats(torch.ones(16, 16))


@pytest.mark.parametrize(
    ("quantizer", "shape"),
    [
        (NVFP4Quantizer(internal=True), (8, 32)),
        (NVFP4Quantizer(internal=True), (16, 40)),
        (NVFP4Quantizer(internal=True, row_scaled_nvfp4=True), (16, 32)),
    ],
    ids=["8 rows", "40 features", "row-scaled"],
)
def test_nvfp4_shards_that_cannot_be_gathered_are_refused(
    quantizer: NVFP4Quantizer, shape: tuple[int, int]
) -> None:
    shard = quantizer.quantize(torch.ones(shape))
    with pytest.raises(ValueError, match="whole 16-element blocks"):
        shard.gathered_rows(lambda t: t, 2, rowwise=True, columnwise=True)


def test_nvfp4_gathers_only_the_usages_a_shard_holds() -> None:
    shard = NVFP4Quantizer(internal=True, columnwise_usage=False).quantize(torch.ones(16, 32))
    with pytest.raises(ValueError, match="lacks a usage"):
        shard.gathered_rows(lambda t: t, 2, rowwise=False, columnwise=True)


@pytest.mark.parametrize(
    ("quantizer", "shape", "expected"),
    [
        (NVFP4Quantizer(with_rht=True, with_post_rht_amax=True), (32, 2, 64), True),
        (NVFP4Quantizer(with_2d_quantization=True, nvfp4_use_4over6=True), (16, 48), True),
        (NVFP4Quantizer(fp8_all_gather=False), (32, 64), False),
        (NVFP4Quantizer(stochastic_rounding=True), (32, 64), False),
        (NVFP4Quantizer(row_scaled_nvfp4=True), (32, 64), False),
        (NVFP4Quantizer(), (8, 64), False),
        (NVFP4Quantizer(), (32, 40), False),
    ],
    ids=["rht", "2d-4over6", "option-off", "stochastic", "row-scaled", "8-rows", "40-features"],
)
def test_which_nvfp4_shards_gather_quantized(
    quantizer: NVFP4Quantizer, shape: tuple[int, ...], expected: bool
) -> None:
    """TE's ``is_quantizable`` (whole 16-element blocks each way, no row scaling), and
    round-to-nearest: stochastic rounding's bits depend on an element's position in
    the tensor quantized, so a shard's would not be the whole tensor's."""
    assert gathers_quantized(quantizer, shape) is expected
