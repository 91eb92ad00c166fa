"""Rotary position embeddings: TE 2.20.2's ``RotaryPositionEmbedding`` and
``apply_rotary_pos_emb``.

The frequencies are TE's (``inv_freq = 1 / base^(2i/dim)``, optional sequence-length
interpolation, ``[s, 1, 1, d]`` output, halves or interleaved pairs); applying them
rotates the first ``d`` features of each head (partial rotary leaves the rest as they
are) for the ``sbhd``, ``bshd`` and ``thd`` formats, with per-sequence
``start_positions`` (the KV-cache offsets of a decode step) and TE's context-parallel
frequency slicing. Gathering each token's angles is index arithmetic without host
reads, so it traces into one graph with dynamic sequence lengths (TE's unfused ``thd``
path calls ``.tolist()``; here the token positions are computed from ``cu_seqlens`` on
device); the rotation itself (cos, sin and their products) is the ``rope`` op, which
computes eager's bits compiled too (``ops/rope.py``).
"""

from __future__ import annotations

import torch
from torch import is_grad_enabled, nn

from ..generated.rope import call_rope
from ..ops.rope import rotate
from ._device import default_device

_FORMATS = ("sbhd", "bshd", "thd")


class RotaryPositionEmbedding(nn.Module):
    """TE's rotary embedding table: ``forward(max_seq_len, offset=0)`` returns the
    angles ``[max_seq_len, 1, 1, dim * rotary_percent]`` (fp32) for
    :func:`apply_rotary_pos_emb`. ``inv_freq`` is a buffer on the current CUDA device
    as TE's (torch's default device where one is set; the CPU without CUDA), in the
    state dict as TE's."""

    def __init__(
        self,
        dim: int,
        rotary_percent: float = 1.0,
        seq_len_interpolation_factor: int | None = None,
        pretrained_max_position_embeddings: int | None = None,
        rotary_base: float = 10000.0,
        interleaved: bool = False,
    ) -> None:
        super().__init__()
        if rotary_percent < 1.0:
            dim = int(dim * rotary_percent)
        if dim < 2 or dim % 2:
            raise ValueError(
                f"RotaryPositionEmbedding: the rotated dimension must be even and >= 2, got "
                f"{dim} (dim * rotary_percent)"
            )
        self.seq_len_interpolation_factor = seq_len_interpolation_factor
        self.rotary_base = rotary_base
        self.pretrained_max_position_embeddings = pretrained_max_position_embeddings
        self.interleaved = bool(interleaved)
        # TE's on the current CUDA device; on the CPU without one (modules/_device.py).
        device = default_device(None)
        exponent = torch.arange(0, dim, 2, dtype=torch.float32, device=device) / dim
        self.register_buffer("inv_freq", 1.0 / (rotary_base**exponent))

    def forward(self, max_seq_len: int, offset: int = 0) -> torch.Tensor:
        inv_freq = self.inv_freq
        with torch.autocast(device_type=inv_freq.device.type, enabled=False):
            seq = torch.arange(max_seq_len, device=inv_freq.device, dtype=inv_freq.dtype) + offset
            factor = self.seq_len_interpolation_factor
            pretrained = self.pretrained_max_position_embeddings
            if pretrained is not None and factor is not None:
                if max_seq_len > pretrained * factor:
                    seq = seq * (1 / (max_seq_len / pretrained))
                else:
                    seq = seq * (1 / factor)
            freqs = torch.outer(seq, inv_freq)
        if self.interleaved:
            emb = torch.stack((freqs, freqs), dim=-1).flatten(-2)
        else:
            emb = torch.cat((freqs, freqs), dim=-1)
        return emb.reshape(emb.size(0), 1, 1, emb.size(1))


def _rotate(t: torch.Tensor, angles: torch.Tensor, interleaved: bool, fused: bool) -> torch.Tensor:
    """``t`` (``[..., d_head]``) with its first ``angles.shape[-1]`` features rotated by
    ``angles`` (broadcast against ``t``), through the ``rope`` op. ``fused``: in
    fp32, cast back once (TE's fused kernel, which MultiheadAttention uses); otherwise in
    ``t``'s dtype with cos and sin cast to it (TE's unfused path).

    Angles that require grad (a learned frequency table: TE's unfused path
    differentiates them, its fused kernel does not) take the same arithmetic in plain
    PyTorch, so that autograd reaches them; compiled, Inductor then computes it to
    rounding only."""
    rot_dim = angles.shape[-1]
    if rot_dim > t.shape[-1]:
        raise ValueError(
            f"apply_rotary_pos_emb: the frequencies rotate {rot_dim} features but the "
            f"tensor has {t.shape[-1]} per head"
        )
    if angles.requires_grad and is_grad_enabled():
        return rotate(t, angles, interleaved, fused)
    return call_rope(
        t=t,
        angles=angles,
        t_requires_grad=t.requires_grad,
        interleaved=interleaved,
        fused=fused,
        is_grad_enabled=is_grad_enabled(),
    )[0]


def _cp_slice(freqs: torch.Tensor, seqlen: int, cp_size: int, cp_rank: int) -> torch.Tensor:
    """The angles of this context-parallel rank's tokens: its two load-balanced chunks
    of the full sequence (TE's ``_get_freqs_on_this_cp_rank``)."""
    if cp_size == 1:
        return freqs[:seqlen]
    seg, full = seqlen // 2, cp_size * seqlen
    return torch.cat(
        (
            freqs[cp_rank * seg : (cp_rank + 1) * seg],
            freqs[full - (cp_rank + 1) * seg : full - cp_rank * seg],
        )
    )


def apply_rotary_pos_emb(
    t: torch.Tensor,
    freqs: torch.Tensor,
    tensor_format: str = "sbhd",
    start_positions: torch.Tensor | None = None,
    interleaved: bool = False,
    fused: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    cp_size: int = 1,
    cp_rank: int = 0,
) -> torch.Tensor:
    """TE's ``apply_rotary_pos_emb``: rotate ``t`` (``[s, b, h, d]``, ``[b, s, h, d]``
    or ``[t, h, d]`` for ``thd`` with ``cu_seqlens``) by ``freqs`` (``[s_max, 1, 1, d']``,
    ``d' <= d``). ``start_positions`` (one per sequence) offsets each sequence's
    positions. Autograd gives the backward (TE's fused kernel computes the same)."""
    if tensor_format not in _FORMATS:
        raise ValueError(
            f"apply_rotary_pos_emb: tensor_format must be one of {_FORMATS}, got {tensor_format!r}"
        )
    if freqs.dim() != 4 or freqs.shape[1:3] != (1, 1):
        raise ValueError(
            f"apply_rotary_pos_emb: freqs must be [s, 1, 1, d] (RotaryPositionEmbedding's "
            f"output), got {tuple(freqs.shape)}"
        )
    table = freqs[:, 0, 0, :]  # [s_max, d']
    if tensor_format == "thd":
        if cu_seqlens is None:
            raise ValueError("apply_rotary_pos_emb: tensor_format='thd' needs cu_seqlens")
        if cp_size != 1:
            raise NotImplementedError(
                "apply_rotary_pos_emb: tensor_format='thd' with cp_size > 1 is not implemented"
            )
        tokens = torch.arange(t.shape[0], device=t.device)
        ends = cu_seqlens[1:].to(t.device)
        seq = torch.searchsorted(ends, tokens, right=True)
        positions = tokens - cu_seqlens.to(t.device)[seq]
        if start_positions is not None:
            positions = positions + start_positions.to(t.device)[seq]
        angles = table.to(t.device)[positions].unsqueeze(1)  # [t, 1, d']
        return _rotate(t, angles, interleaved, fused)
    seq_dim = 0 if tensor_format == "sbhd" else 1
    seqlen = t.shape[seq_dim]
    if start_positions is None:
        angles = _cp_slice(table, seqlen, cp_size, cp_rank)  # [s, d']
        angles = angles[:, None, None, :] if seq_dim == 0 else angles[None, :, None, :]
        return _rotate(t, angles, interleaved, fused)
    if cp_size != 1:
        raise NotImplementedError(
            "apply_rotary_pos_emb: start_positions with cp_size > 1 is not implemented"
        )
    # One start per sequence; a longer tensor (InferenceParams' per-slot lengths) is
    # read for the batch's first entries, as TE's kernel reads it.
    start_positions = start_positions[: t.shape[1 - seq_dim]]
    steps = torch.arange(seqlen, device=start_positions.device)
    positions = start_positions[None, :] + steps[:, None]  # [s, b]
    angles = table[positions.to(table.device)]  # [s, b, d']
    if seq_dim == 1:
        angles = angles.transpose(0, 1)
    return _rotate(t, angles.unsqueeze(2), interleaved, fused)
