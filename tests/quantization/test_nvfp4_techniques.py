"""TE's three NVFP4 training techniques, each against a float64 reference of TE's
algorithm: the random Hadamard transform, stochastic rounding (Philox bits from a
(seed, offset) pair), and 2-D (16x16) weight blocks; and the recipe that enables them."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from quant_cases import random_input

from transformer_engine_ops.quantization import NVFP4Quantizer, gemm
from transformer_engine_ops.quantization.encoding import (
    E2M1_VALUES,
    e2m1_to_float,
    encode_e2m1_stochastic,
    unpack_e2m1,
)
from transformer_engine_ops.quantization.hadamard import (
    RHT_SIGNS,
    apply_rht,
    rht_matrix,
    undo_rht,
)
from transformer_engine_ops.quantization.philox import philox4x32, philox_rounds, uniform
from transformer_engine_ops.recipe import NVFP4BlockScaling, QParams

RHT = NVFP4Quantizer(with_rht=True, with_post_rht_amax=True)
SR = NVFP4Quantizer(stochastic_rounding=True)


def rng(seed: int, offset: int = 0) -> torch.Tensor:
    return torch.tensor([seed, offset], dtype=torch.int64)


# ----- Philox -----


@pytest.mark.parametrize(
    ("counter", "key", "expected"),
    [  # Random123's known-answer vectors for philox4x32_10
        ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
        ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
        (
            (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
            (0xA4093822, 0x299F31D0),
            (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
        ),
    ],
)
def test_philox_rounds_match_random123_known_answers(counter, key, expected):
    words = philox_rounds(
        tuple(torch.tensor([c]) for c in counter), tuple(torch.tensor([k]) for k in key)
    )
    assert tuple(int(w) for w in words) == expected


def test_philox_counter_layout_is_index_stream_offset():
    words = philox4x32(rng(0x1234_5678_9ABC_DEF0, 0x0102_0304_0506_0708), 3, 5)
    ref = philox_rounds(
        (
            torch.arange(3),
            torch.full((3,), 5),
            torch.full((3,), 0x05060708),
            torch.full((3,), 0x01020304),
        ),
        (torch.tensor(0x9ABCDEF0), torch.tensor(0x12345678)),
    )
    for a, b in zip(words, ref, strict=True):
        assert torch.equal(a, b)


def test_uniform_bits_depend_only_on_seed_offset_and_stream():
    a = uniform(rng(7, 3), 1000, 0)
    assert torch.equal(a, uniform(rng(7, 3), 1000, 0))
    assert torch.equal(a[:10], uniform(rng(7, 3), 10, 0))
    for other in (
        uniform(rng(8, 3), 1000, 0),
        uniform(rng(7, 4), 1000, 0),
        uniform(rng(7, 3), 1000, 1),
    ):
        assert (a != other).float().mean() > 0.99
    assert 0.0 <= float(a.min()) and float(a.max()) < 1.0
    assert abs(float(a.mean()) - 0.5) < 0.05


# ----- random Hadamard transform -----


def sylvester64(n: int) -> torch.Tensor:
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h


def test_rht_matrix_is_signed_sylvester_hadamard_and_orthogonal():
    h = sylvester64(16)
    assert torch.equal(h @ h.T, 16 * torch.eye(16, dtype=torch.float64))
    t = rht_matrix(torch.float64)
    signs = torch.tensor(RHT_SIGNS, dtype=torch.float64)
    assert torch.equal(t, torch.diag(signs) @ h / 4)
    assert torch.equal(t @ t.T, torch.eye(16, dtype=torch.float64))
    assert torch.equal(rht_matrix(torch.bfloat16).double(), t)  # TE keeps it in bf16: exact


def test_apply_rht_matches_float64_reference_and_undo_inverts_it():
    x = random_input((24, 64), seed=3)
    ref = (x.double().reshape(24, 4, 16) @ rht_matrix(torch.float64)).reshape(24, 64)
    y = apply_rht(x)
    assert torch.allclose(y.double(), ref, rtol=0, atol=2**-20 * float(x.abs().max()))
    assert torch.allclose(undo_rht(y), x, rtol=0, atol=2**-20 * float(x.abs().max()))


def test_rht_keeps_a_gemm_over_the_transformed_dimension():
    a, b = random_input((32, 48), seed=1), random_input((32, 40), seed=2)
    ref = a.double().T @ b.double()
    got = apply_rht(a.T.contiguous()).double() @ apply_rht(b.T.contiguous()).double().T
    assert torch.allclose(got, ref, rtol=0, atol=1e-4)


def test_rht_quantizer_columnwise_data_is_the_transformed_tensor_quantized():
    """Columnwise buffers are a plain NVFP4 quantize of ``RHT(x.T)`` with its own
    (post-transform) amax; rowwise buffers are untouched by the transform."""
    x = random_input((48, 64), seed=5)
    v = RHT.quantize(x)
    plain = NVFP4Quantizer().quantize(x)
    t = NVFP4Quantizer(columnwise_usage=False).quantize(apply_rht(x.T.contiguous()))
    for name in ("_rowwise_data", "_rowwise_scale_inv", "_amax_rowwise"):
        assert torch.equal(getattr(v, name), getattr(plain, name))
    assert torch.equal(v._columnwise_data, t._rowwise_data)
    assert torch.equal(v._columnwise_scale_inv, t._rowwise_scale_inv)
    assert torch.equal(v._amax_columnwise, t._amax_rowwise)
    assert float(v._amax_columnwise) != float(v._amax_rowwise)
    without_post = NVFP4Quantizer(with_rht=True).quantize(x)
    assert torch.equal(without_post._amax_columnwise, plain._amax_columnwise)


def test_rht_columnwise_dequantizes_back_within_the_transformed_bound():
    """The error made in the transformed domain (NVFP4's bound there, per element)
    comes back through the orthogonal ``T.T`` with the same 2-norm per 16-run."""
    x = random_input((64, 32), seed=9)
    y = apply_rht(x.T.contiguous()).double()  # (K, M), transformed along M
    a = float(y.abs().max())
    bound = y.abs() / 4 + 0.046 * a
    err = RHT.quantize(x).dequantize_usage(columnwise=True).double().T - x.double().T
    err_norm = err.reshape(32, 4, 16).norm(dim=2)
    bound_norm = bound.reshape(32, 4, 16).norm(dim=2)
    assert bool((err_norm <= bound_norm + 1e-5).all())


def test_wgrad_gemm_of_two_rht_operands_approximates_the_exact_product():
    x, dy = random_input((64, 32), seed=1), random_input((64, 48), seed=2)
    xq, dyq = RHT.quantize(x), RHT.quantize(dy)
    got = gemm(xq, dyq, layout="NT", out_dtype=torch.float32).double()
    ref = dy.double().T @ x.double()
    assert float((got - ref).norm() / ref.norm()) < 0.15


def test_rht_columnwise_needs_m_multiple_of_16_naming_the_shape():
    with pytest.raises(ValueError, match=r"multiple of 16, got shape \(2, 12, 32\)"):
        RHT.quantize(torch.randn(2, 12, 32))
    RHT.with_usage(columnwise=False).quantize(torch.randn(2, 12, 32))  # rowwise: any M


# ----- stochastic rounding -----


def test_stochastic_e2m1_keeps_representable_values_and_brackets_the_rest():
    grid = torch.tensor(E2M1_VALUES)
    values = torch.cat([grid, -grid, torch.linspace(-6, 6, 241)])
    for u in (torch.zeros_like(values), torch.full_like(values, 1 - 2**-24)):
        got = e2m1_to_float(encode_e2m1_stochastic(values, u))
        on_grid = torch.isin(values.abs(), grid)
        assert torch.equal(got[on_grid], values[on_grid])
        lo = torch.stack([g for g in grid]).unsqueeze(0)
        below = torch.where(lo <= values.abs().unsqueeze(1), lo, -1.0).amax(1)
        above = torch.where(lo >= values.abs().unsqueeze(1), lo, 7.0).amin(1)
        expected = above if u[0] == 0 else below  # u = 0 rounds up whenever p > 0
        assert torch.equal(got.abs(), expected)


def exact_scale_input(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, step size of each element) with every NVFP4 scale exact: tensor amax 2688
    (global scale 1) and a block amax of 6 * 2**j in each 1x16 block, so each element's
    neighbouring grid values are E2M1 values times 2**j."""
    g = torch.Generator().manual_seed(seed)
    m, k = 16, 64
    j = torch.randint(-3, 8, (m, k // 16), generator=g).double()
    x = (torch.rand(m, k, generator=g, dtype=torch.float64) * 12 - 6).reshape(m, 4, 16)
    x[..., 0] = 6.0
    x = x * torch.exp2(j)[..., None]
    x = x.reshape(m, k)
    x[0, 0] = 2688.0  # 6 * 2**j with j = 8.8...: set its block so 2**j = 448
    x[0, 1:16] = x[0, 1:16].clamp(-2688, 2688)
    x = x.float().double()  # representable in fp32
    scale = torch.exp2(j).repeat_interleave(16, dim=1)
    scale[0, :16] = 448.0
    return x.float(), scale


def step_of(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Float64 reference: distance between the neighbouring representable values."""
    grid = torch.tensor(E2M1_VALUES, dtype=torch.float64)
    v = (x.double().abs() / scale).unsqueeze(-1)
    lo = torch.where(grid <= v, grid, -1.0).amax(-1)
    hi = torch.where(grid >= v, grid, 7.0).amin(-1)
    return (hi - lo) * scale


def test_stochastic_rounding_is_unbiased_over_seeds():
    """Rowwise (every scale exact): the mean over seeds is within 6 sigma of x for
    every element, sigma from the float64 reference's grid step. Columnwise (scales
    along M, not exact): far less biased than round-to-nearest."""
    x, scale = exact_scale_input(0)
    assert float(x.abs().max()) == 2688.0
    n = 600
    total = {
        False: torch.zeros(x.shape, dtype=torch.float64),
        True: torch.zeros(x.shape, dtype=torch.float64),
    }
    for seed in range(n):
        v = SR.quantize_stochastic(x, rng(seed, 11))
        for columnwise in (False, True):
            total[columnwise] += v.dequantize_usage(columnwise=columnwise).double()
    sigma = step_of(x, scale) / 2 / n**0.5  # the largest per-draw std is step / 2
    mean = total[False] / n
    assert bool(((mean - x.double()).abs() <= 6 * sigma + 1e-9).all())
    nearest = NVFP4Quantizer().quantize(x).dequantize_usage(columnwise=True).double()
    rtn_bias = (nearest - x.double()).abs().mean()
    sr_bias = (total[True] / n - x.double()).abs().mean()
    assert sr_bias < rtn_bias / 4


def test_stochastic_rounding_is_bitwise_reproducible_from_seed_and_offset():
    x = random_input((32, 64), seed=4)
    a, b = SR.quantize_stochastic(x, rng(5, 9)), SR.quantize_stochastic(x.clone(), rng(5, 9))
    for name in a.inner_names():
        assert torch.equal(getattr(a, name), getattr(b, name))
    c = SR.quantize_stochastic(x, rng(5, 10))
    assert not torch.equal(a._rowwise_data, c._rowwise_data)
    assert not torch.equal(a._rowwise_data.T, a._columnwise_data)  # own stream per usage


def test_stochastic_rounding_codes_are_one_of_the_two_neighbours():
    x = random_input((32, 64), seed=6)
    near = NVFP4Quantizer().quantize(x)
    v = SR.quantize_stochastic(x, rng(1, 2))
    assert torch.equal(v._rowwise_scale_inv, near._rowwise_scale_inv)
    a = e2m1_to_float(unpack_e2m1(v._rowwise_data)).abs()
    b = e2m1_to_float(unpack_e2m1(near._rowwise_data)).abs()
    grid = list(E2M1_VALUES)
    idx_a = torch.tensor([grid.index(float(t)) for t in a.reshape(-1)])
    idx_b = torch.tensor([grid.index(float(t)) for t in b.reshape(-1)])
    assert int((idx_a - idx_b).abs().max()) <= 1


def test_stochastic_rounding_needs_its_rng_state_and_only_then():
    x = torch.randn(16, 32)
    with pytest.raises(TypeError, match=r"quantize_stochastic\): .* rng_state, .* NoneType"):
        SR.quantize(x)
    with pytest.raises(TypeError, match=r"got a torch.int32 tensor of shape \(2,\)"):
        SR.quantize_stochastic(x, torch.tensor([1, 2], dtype=torch.int32))
    with pytest.raises(TypeError, match="rng_state"):
        SR.quantize_with_bias_grad(x)
    with pytest.raises(ValueError, match="without stochastic_rounding"):
        NVFP4Quantizer().quantize_stochastic(x, rng(1))
    q, bias = SR.quantize_stochastic(x, rng(1), with_bias_grad=True)
    assert torch.equal(bias, x.sum(0, dtype=torch.float32))
    assert torch.equal(q._rowwise_data, SR.quantize_stochastic(x, rng(1))._rowwise_data)


# ----- 2-D blocks -----


def test_2d_blocks_share_one_scale_per_16x16_block_in_both_usages():
    x = random_input((48, 64), seed=8)
    v = NVFP4Quantizer(with_2d_quantization=True).quantize(x)
    row = v._rowwise_scale_inv[:48, :4]
    col = v._columnwise_scale_inv[:64, :3]
    blocks = row.reshape(3, 16, 4)
    assert torch.equal(blocks, blocks[:, :1, :].expand(3, 16, 4))  # one scale per block
    assert torch.equal(col.reshape(4, 16, 3), blocks[:, 0, :].T[:, None, :].expand(4, 16, 3))
    codes_row = unpack_e2m1(v._rowwise_data)
    codes_col = unpack_e2m1(v._columnwise_data)
    assert torch.equal(codes_row.T, codes_col)  # the same codes, transposed
    ref = x.double().reshape(3, 16, 4, 16).abs().amax(dim=(1, 3))  # float64 block amax
    s = 448 * 6 / float(x.abs().max())
    expected = (ref / 6 * s).float().clamp(max=448).to(torch.float8_e4m3fn).view(torch.uint8)
    assert torch.equal(blocks[:, 0, :], expected)


# ----- the recipe -----


def test_default_recipe_configures_roles_as_te():
    r = NVFP4BlockScaling()
    assert r.fp4_quant_fwd_inp == QParams(random_hadamard_transform=True)
    assert r.fp4_quant_fwd_weight == QParams(fp4_2d_quantization=True)
    assert r.fp4_quant_bwd_grad == QParams(random_hadamard_transform=True, stochastic_rounding=True)
    rht = dict(with_rht=True, with_post_rht_amax=True)
    assert r.make_quantizer("input") == NVFP4Quantizer(**rht)
    assert r.make_quantizer("output") == NVFP4Quantizer(**rht)
    assert r.make_quantizer("weight") == NVFP4Quantizer(with_2d_quantization=True)
    for role in ("grad_output", "grad_input", "grad_weight"):
        assert r.make_quantizer(role) == NVFP4Quantizer(**rht, stochastic_rounding=True)


@pytest.mark.parametrize(
    ("flag", "role", "field"),
    [
        ("disable_rht", "input", "with_rht"),
        ("disable_rht", "grad_output", "with_rht"),
        ("disable_stochastic_rounding", "grad_output", "stochastic_rounding"),
        ("disable_2d_quantization", "weight", "with_2d_quantization"),
    ],
)
def test_each_disable_flag_turns_its_technique_off(flag, role, field):
    assert getattr(NVFP4BlockScaling().make_quantizer(role), field)
    assert not getattr(NVFP4BlockScaling(**{flag: True}).make_quantizer(role), field)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(stochastic_rounding=1), "stochastic_rounding must be a bool"),
        (dict(with_rht="yes"), "with_rht must be a bool"),
        (dict(with_post_rht_amax=None), "with_post_rht_amax must be a bool"),
    ],
)
def test_quantizer_refuses_non_bool_options(kwargs, match):
    with pytest.raises(TypeError, match=match):
        NVFP4Quantizer(**kwargs)


def test_qparams_validates_its_fields():
    with pytest.raises(TypeError, match="QParams: stochastic_rounding must be a bool"):
        QParams(stochastic_rounding=None)


@pytest.mark.parametrize("seed", range(5))
def test_stochastic_rounding_round_trip_stays_within_its_documented_bound(seed):
    """A whole grid step instead of half: ``abs(x) / 2 + 0.092 * A`` (docs)."""
    x = random_input((64, 96), seed=seed)
    a = float(x.abs().max())
    v = SR.quantize_stochastic(x, rng(seed, 1))
    for columnwise in (False, True):
        err = (v.dequantize_usage(columnwise=columnwise) - x).abs()
        assert bool((err <= x.abs() / 2 + 0.092 * a).all())


# ----- 4over6 and row-scaled data -----


def e4m3_round(t: torch.Tensor) -> torch.Tensor:
    return t.float().clamp(0, 448).to(torch.float8_e4m3fn).double()


def e2m1_round(t: torch.Tensor) -> torch.Tensor:
    """Nearest E2M1 value, ties to the even code (float64 reference)."""
    grid = torch.tensor(E2M1_VALUES, dtype=torch.float64)
    a = t.abs().clamp(max=6.0).unsqueeze(-1)
    dist = (grid - a).abs()
    best = dist.min(-1, keepdim=True).values
    tied = dist == best
    codes = torch.arange(8)
    even_first = torch.where(tied, codes % 2, 9).argmin(-1)  # even code among ties
    return grid[even_first] * torch.sign(t)


def four_over_six_reference(x: torch.Tensor, mse: bool, bound: int) -> tuple[Any, Any, Any]:
    """TE's 4over6 on 1x16 blocks in float64 (only the E4M3 and E2M1 roundings are
    those formats'): (chosen dequantized values, map4 chosen per block, error gap)."""
    x = x.double()
    m, k = x.shape
    amax = x.abs().max()
    s = bound * 6 / amax
    blocks = x.reshape(m, k // 16, 16)
    base = blocks.abs().amax(-1, keepdim=True) / 6 * s
    out, errs = [], []
    for factor in (1.5, 1.0):
        sf = e4m3_round(base * factor)
        q = e2m1_round(blocks * s / sf)
        deq = q * sf / s
        err = (deq - blocks) ** 2 if mse else (deq - blocks).abs()
        out.append(deq)
        errs.append(err.sum(-1))
    pick4 = errs[0] < errs[1]
    chosen = torch.where(pick4[..., None], out[0], out[1]).reshape(m, k)
    return chosen, pick4, (errs[0] - errs[1]).abs() / errs[1].clamp(min=1e-30)


@pytest.mark.parametrize("mode", ["MAE", "MSE"])
@pytest.mark.parametrize("bound", [448, 256])
def test_4over6_picks_the_candidate_te_picks(mode, bound):
    x = random_input((32, 128), seed=11) * torch.logspace(-1, 1, 128)
    q = NVFP4Quantizer(
        nvfp4_use_4over6=True, nvfp4_e4m3_max=bound, nvfp4_4over6_err_mode=mode
    ).with_usage(columnwise=False)
    got = q.quantize(x).dequantize().double()
    ref, pick4, gap = four_over_six_reference(x, mode == "MSE", bound)
    assert 0 < int(pick4.sum()) < pick4.numel()  # both candidates occur
    clear = (gap > 1e-4).repeat_interleave(16, dim=1).reshape(32, 128)  # no near-tie
    assert float(clear.float().mean()) > 0.9
    assert torch.allclose(got[clear], ref[clear], rtol=1e-6, atol=1e-12)


def test_4over6_is_no_worse_than_map_to_6_per_block():
    x = random_input((64, 64), seed=12)
    plain = NVFP4Quantizer().quantize(x).dequantize()
    four = NVFP4Quantizer(nvfp4_use_4over6=True).quantize(x).dequantize()
    e_plain = (plain - x).abs().reshape(64, 4, 16).sum(-1)
    e_four = (four - x).abs().reshape(64, 4, 16).sum(-1)
    assert bool((e_four <= e_plain * (1 + 1e-5) + 1e-6).all())
    assert float(e_four.sum()) < float(e_plain.sum())


def test_4over6_2d_blocks_choose_one_scale_per_16x16_tile():
    x = random_input((32, 64), seed=13)
    v = NVFP4Quantizer(nvfp4_use_4over6=True, with_2d_quantization=True).quantize(x)
    scales = v._rowwise_scale_inv[:32, :4].reshape(2, 16, 4)
    assert torch.equal(scales, scales[:, :1, :].expand(2, 16, 4))


def test_row_scaled_rows_are_quantized_as_tensors_of_their_own():
    x = random_input((16, 64), seed=14) * torch.logspace(-3, 2, 16)[:, None]
    v = NVFP4Quantizer(row_scaled_nvfp4=True).quantize(x)
    assert torch.equal(v._amax_rowwise, x.abs().amax(dim=1))
    assert torch.equal(v._amax_columnwise, x.abs().amax(dim=0))
    plain = NVFP4Quantizer(columnwise_usage=False)
    for i in (0, 7, 15):
        row = plain.quantize(x[i : i + 1])
        assert torch.equal(v._rowwise_data[i], row._rowwise_data[0])
        assert torch.equal(v._rowwise_scale_inv[i, :4], row._rowwise_scale_inv[0, :4])
    col = plain.quantize(x[:, 5:6].T.contiguous())
    assert torch.equal(v._columnwise_data[5], col._rowwise_data[0])
    err = (v.dequantize() - x).abs()
    assert bool((err <= x.abs() / 4 + 0.046 * x.abs().amax(dim=1, keepdim=True)).all())


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(row_scaled_nvfp4=True, with_rht=True), "row_scaled_nvfp4=True with with_rht"),
        (dict(row_scaled_nvfp4=True, with_2d_quantization=True), "with_2d_quantization"),
        (dict(nvfp4_use_4over6=True, stochastic_rounding=True), "nvfp4_use_4over6=True with"),
        (dict(nvfp4_use_4over6=True, nvfp4_e4m3_max=300), "448 or 256, got 300"),
        (dict(nvfp4_4over6_err_mode="L1"), "nvfp4_4over6_err_mode must be one of"),
    ],
)
def test_combinations_te_refuses_raise_value_error(kwargs, match):
    with pytest.raises(ValueError, match=match):
        NVFP4Quantizer(**kwargs)


def test_the_e4m3_bound_counts_only_with_4over6_and_the_error_mode_any_case():
    """TE's constructor: ``nvfp4_e4m3_max`` is 448 unless 4over6 is on, and the error
    mode is upper-cased."""
    assert NVFP4Quantizer(nvfp4_e4m3_max=256).nvfp4_e4m3_max == 448
    assert NVFP4Quantizer(nvfp4_use_4over6=True, nvfp4_e4m3_max=256).nvfp4_e4m3_max == 256
    q = NVFP4Quantizer(nvfp4_use_4over6=True, nvfp4_4over6_err_mode="mse")
    assert q.nvfp4_4over6_err_mode == "MSE"


def test_row_scaled_needs_the_last_dim_multiple_of_16():
    with pytest.raises(ValueError, match=r"row_scaled_nvfp4\) needs the last dim .* \(4, 24\)"):
        NVFP4Quantizer(row_scaled_nvfp4=True).quantize(torch.randn(4, 24))


def test_recipe_4over6_and_row_scaled_roles_follow_te():
    r = NVFP4BlockScaling(disable_rht=True, nvfp4_4over6="all", row_scaled_activation=True)
    inp, weight, grad = (r.make_quantizer(x) for x in ("input", "weight", "grad_output"))
    assert inp.nvfp4_use_4over6 and inp.row_scaled_nvfp4 and inp.nvfp4_e4m3_max == 256
    assert weight.nvfp4_use_4over6 and not weight.row_scaled_nvfp4 and weight.with_2d_quantization
    assert not grad.nvfp4_use_4over6 and grad.stochastic_rounding and grad.nvfp4_e4m3_max == 448
    w = NVFP4BlockScaling(nvfp4_4over6="weights", nvfp4_4over6_e4m3_use_256="activations")
    assert w.make_quantizer("weight").nvfp4_use_4over6
    assert w.make_quantizer("weight").nvfp4_e4m3_max == 448
    assert not w.make_quantizer("input").nvfp4_use_4over6
    mse = NVFP4BlockScaling(nvfp4_4over6="weights", nvfp4_4over6_err_mode="MSE")
    assert mse.make_quantizer("weight").nvfp4_4over6_err_mode == "MSE"
