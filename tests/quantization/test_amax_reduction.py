"""FP8 current scaling with a reduced amax (TE's amax reduction over a TP group): shards
quantized with the element-wise maximum of their ``amax_stats`` hold exactly the codes
and scale-inverse of the whole tensor quantized at once, so a sequence-parallel FP8
all-gather gives every rank the bits of a single-process quantize."""

from __future__ import annotations

import pytest
import torch

from transformer_engine_ops.quantization.float8 import Float8CurrentScalingQuantizer

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2

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


def test_the_option_is_validated_and_reaches_the_quantizer() -> None:
    from transformer_engine_ops.quantization import Float8CurrentScaling

    assert Float8CurrentScaling().make_quantizer("input").fp8_all_gather
    assert (
        not Float8CurrentScaling(fp8_all_gather=False).make_quantizer("grad_output").fp8_all_gather
    )
    with pytest.raises(TypeError, match="fp8_all_gather"):
        Float8CurrentScaling(fp8_all_gather=1)
    with pytest.raises(TypeError, match="fp8_all_gather"):
        Float8CurrentScalingQuantizer(fp8_all_gather="no")
