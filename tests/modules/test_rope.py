"""``te.RotaryPositionEmbedding`` and ``te.apply_rotary_pos_emb``: TE 2.20.2's table and
rotation for sbhd, bshd and thd, interleaved and partial, with start positions."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import transformer_engine_ops as te

D = 16


def _complex_rotation(x: torch.Tensor, positions: torch.Tensor, rot: int, interleaved: bool) -> Any:
    """The rotation as complex multiplication in float64: feature pair i (``(i, i +
    rot/2)``, or ``(2i, 2i+1)`` interleaved) turned by ``position * 10000^(-2i/rot)``.
    ``x`` is ``[..., D]`` and ``positions`` broadcasts against ``x[..., 0]``."""
    x = x.double()
    part, rest = x[..., :rot], x[..., rot:]
    if interleaved:
        re, im = part[..., 0::2], part[..., 1::2]
    else:
        re, im = part[..., : rot // 2], part[..., rot // 2 :]
    inv_freq = 1.0 / 10000 ** (torch.arange(0, rot, 2, dtype=torch.float64) / rot)
    angle = positions.double()[..., None] * inv_freq
    turned = torch.complex(re, im) * torch.polar(torch.ones_like(angle), angle)
    if interleaved:
        out = torch.stack((turned.real, turned.imag), dim=-1).flatten(-2)
    else:
        out = torch.cat((turned.real, turned.imag), dim=-1)
    return torch.cat((out, rest), dim=-1)


def test_table_is_tes() -> None:
    freqs = te.RotaryPositionEmbedding(D)(5)
    inv_freq = 1.0 / 10000 ** (torch.arange(0, D, 2, dtype=torch.float32) / D)
    angles = torch.arange(5, dtype=torch.float32)[:, None] * inv_freq
    assert freqs.shape == (5, 1, 1, D) and freqs.dtype == torch.float32
    torch.testing.assert_close(freqs[:, 0, 0], torch.cat((angles, angles), -1))
    interleaved = te.RotaryPositionEmbedding(D, interleaved=True)(5)
    torch.testing.assert_close(interleaved[:, 0, 0], angles.repeat_interleave(2, dim=-1))


def test_table_is_in_the_state_dict_as_tes() -> None:
    assert list(te.RotaryPositionEmbedding(D).state_dict()) == ["inv_freq"]


def test_sequence_length_interpolation() -> None:
    rope = te.RotaryPositionEmbedding(D, seq_len_interpolation_factor=2)
    plain = te.RotaryPositionEmbedding(D)(8)
    rope.pretrained_max_position_embeddings = 16
    torch.testing.assert_close(rope(8), plain / 2)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("percent", [1.0, 0.5])
@pytest.mark.parametrize("fused", [False, True])
def test_sbhd_equals_the_complex_rotation(interleaved: bool, percent: float, fused: bool) -> None:
    t = torch.randn(7, 2, 3, D)
    freqs = te.RotaryPositionEmbedding(D, rotary_percent=percent, interleaved=interleaved)(7)
    got = te.apply_rotary_pos_emb(t, freqs, "sbhd", interleaved=interleaved, fused=fused)
    want = _complex_rotation(t, torch.arange(7)[:, None, None], int(D * percent), interleaved)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    assert torch.equal(got[..., int(D * percent) :], t[..., int(D * percent) :])


def test_fused_computes_in_fp32_for_bf16() -> None:
    t = torch.randn(6, 1, 2, D).to(torch.bfloat16)
    freqs = te.RotaryPositionEmbedding(D)(6)
    fused = te.apply_rotary_pos_emb(t, freqs, fused=True)
    want = te.apply_rotary_pos_emb(t.float(), freqs, fused=True).to(torch.bfloat16)
    assert torch.equal(fused, want)


def test_bshd_equals_sbhd_transposed() -> None:
    t = torch.randn(5, 2, 3, D)
    freqs = te.RotaryPositionEmbedding(D)(8)
    sbhd = te.apply_rotary_pos_emb(t, freqs, "sbhd")
    bshd = te.apply_rotary_pos_emb(t.transpose(0, 1), freqs, "bshd")
    assert torch.equal(bshd.transpose(0, 1), sbhd)


def test_thd_with_ragged_sequences_equals_each_sequence_alone() -> None:
    lengths = [3, 7, 1, 5]
    cu = torch.tensor([0, 3, 10, 11, 16], dtype=torch.int32)
    t = torch.randn(sum(lengths), 2, D)
    freqs = te.RotaryPositionEmbedding(D)(8)
    got = te.apply_rotary_pos_emb(t, freqs, "thd", cu_seqlens=cu)
    want = [
        te.apply_rotary_pos_emb(seq.unsqueeze(1), freqs, "sbhd").squeeze(1)
        for seq in torch.split(t, lengths)
    ]
    torch.testing.assert_close(got, torch.cat(want), rtol=0, atol=0)


def test_start_positions_offset_each_sequence() -> None:
    t = torch.randn(3, 2, 1, D)
    freqs = te.RotaryPositionEmbedding(D)(16)
    start = torch.tensor([0, 5])
    got = te.apply_rotary_pos_emb(t, freqs, "sbhd", start_positions=start)
    for b, offset in enumerate(start.tolist()):
        alone = te.apply_rotary_pos_emb(t[:, b : b + 1], freqs[offset:], "sbhd")
        torch.testing.assert_close(got[:, b : b + 1], alone, rtol=0, atol=0)
    cu = torch.tensor([0, 3, 6])
    thd = te.apply_rotary_pos_emb(
        t.transpose(0, 1).reshape(6, 1, D), freqs, "thd", start_positions=start, cu_seqlens=cu
    )
    torch.testing.assert_close(thd, got.transpose(0, 1).reshape(6, 1, D), rtol=0, atol=0)


def test_gradient_is_the_inverse_rotation() -> None:
    t = torch.randn(4, 1, 2, D, dtype=torch.float64, requires_grad=True)
    freqs = te.RotaryPositionEmbedding(D)(4).double()
    g = torch.randn(4, 1, 2, D, dtype=torch.float64)
    te.apply_rotary_pos_emb(t, freqs).backward(g)
    # A rotation's transpose is its inverse: the angles negated.
    torch.testing.assert_close(t.grad, te.apply_rotary_pos_emb(g, -freqs))


def test_thd_compiles_into_one_graph_over_lengths() -> None:
    freqs = te.RotaryPositionEmbedding(D)(32)
    fn = torch.compile(te.apply_rotary_pos_emb, fullgraph=True, backend="aot_eager", dynamic=True)
    for total, cu in ((10, [0, 4, 10]), (17, [0, 9, 12, 17])):
        t = torch.randn(total, 2, D)
        cu_t = torch.tensor(cu)
        eager = te.apply_rotary_pos_emb(t, freqs, "thd", cu_seqlens=cu_t)
        assert torch.equal(fn(t, freqs, "thd", cu_seqlens=cu_t), eager)


def test_bad_arguments_are_named() -> None:
    freqs = te.RotaryPositionEmbedding(D)(4)
    with pytest.raises(ValueError, match="tensor_format"):
        te.apply_rotary_pos_emb(torch.randn(4, 1, 1, D), freqs, "bhsd")
    with pytest.raises(ValueError, match="cu_seqlens"):
        te.apply_rotary_pos_emb(torch.randn(4, 1, D), freqs, "thd")
    with pytest.raises(ValueError, match="rotate 32 features"):
        te.apply_rotary_pos_emb(torch.randn(4, 1, 1, D), te.RotaryPositionEmbedding(32)(4))
    with pytest.raises(ValueError, match="even"):
        te.RotaryPositionEmbedding(3)
