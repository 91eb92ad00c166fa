"""The core attention ``MultiheadAttention`` runs between its QKV and output
projections: softmax(q k^T * scale + mask) v with TE 2.20.2's mask types, sliding
window, GQA/MQA, softcap and dropout, for the ``sbhd`` and ``bshd`` formats.

It is plain PyTorch (``F.scaled_dot_product_attention`` on CUDA; explicit fp32 math
on the CPU and with a softcap), so it traces into the same graph as the GEMM ops around it, with dynamic
sequence lengths. TE's own ``DotProductAttention`` (a separate module with backend
selection and ``thd``) takes this place where it is available; the state-dict entry
(``core_attention._extra_state``, empty: attention keeps no scaling state, TE's default
``fp8_dpa=False``) is the same.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ._base import ExtraStateMixin

MASK_TYPES = (
    "no_mask",
    "padding",
    "causal",
    "padding_causal",
    "causal_bottom_right",
    "padding_causal_bottom_right",
    "arbitrary",
)
FORMATS = ("sbhd", "bshd")


def check_window_size(mask_type: str, window_size: tuple[int, int] | None) -> tuple[int, int]:
    """TE's ``check_set_window_size``: the window a mask type implies, ``(-1, 0)`` for
    causal masks and ``(-1, -1)`` otherwise; a window that contradicts the mask type is
    an error naming both (TE warns and changes some of them)."""
    causal = "causal" in mask_type
    if window_size is None:
        return (-1, 0) if causal else (-1, -1)
    left, right = (int(v) for v in window_size)
    if causal and not (left >= -1 and right == 0):
        raise ValueError(
            f"window_size={window_size} with attn_mask_type={mask_type!r}: a causal mask "
            "takes (-1, 0) or (>=0, 0)"
        )
    if not causal and (left, right) != (-1, -1) and (left < 0 or right < 0):
        raise ValueError(
            f"window_size={window_size} with attn_mask_type={mask_type!r}: takes (-1, -1) "
            "or (>=0, >=0)"
        )
    return (left, right)


def _allowed(
    sq: int,
    skv: int,
    window: tuple[int, int],
    bottom_right: bool,
    device: torch.device,
) -> torch.Tensor | None:
    """``[sq, skv]`` True where query i may attend key j (None: everywhere)."""
    left, right = window
    if left < 0 and right < 0:
        return None
    i = torch.arange(sq, device=device)[:, None]
    j = torch.arange(skv, device=device)[None, :]
    diag = i + (skv - sq) if bottom_right else i
    allowed = torch.ones(sq, skv, dtype=torch.bool, device=device)
    if right >= 0:
        allowed = allowed & (j <= diag + right)
    if left >= 0:
        allowed = allowed & (j >= diag - left)
    return allowed


class CoreAttention(ExtraStateMixin, nn.Module):
    """softmax(q k^T * softmax_scale) v over ``[s, b, h, d]`` (``sbhd``) or
    ``[b, s, h, d]`` (``bshd``) q/k/v; returns ``[s, b, h*d]`` or ``[b, s, h*d]``.

    ``attention_mask`` is TE's: True marks an excluded position; for padding masks a
    ``[b, 1, 1, s]`` tensor (self attention) or a ``(q_mask, kv_mask)`` pair, for
    ``arbitrary`` a tensor broadcastable to ``[b, h, sq, skv]``. Padded query rows
    come out as zeros (TE's ``fast_zero_fill``)."""

    def __init__(
        self,
        num_attention_heads: int,
        kv_channels: int,
        num_gqa_groups: int,
        attention_dropout: float,
        qkv_format: str,
        softmax_scale: float | None = None,
    ) -> None:
        super().__init__()
        if qkv_format not in FORMATS:
            raise NotImplementedError(
                f"MultiheadAttention: qkv_format={qkv_format!r} is not implemented here "
                f"(one of {FORMATS}); 'thd' needs te.DotProductAttention's ragged kernels"
            )
        self.num_attention_heads = num_attention_heads
        self.kv_channels = kv_channels
        self.num_gqa_groups = num_gqa_groups
        self.attention_dropout = float(attention_dropout)
        self.qkv_format = qkv_format
        self.softmax_scale = (
            softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(kv_channels)
        )

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attn_mask_type: str,
        attention_mask: Any = None,
        window_size: tuple[int, int] = (-1, -1),
        bottom_right_diagonal: bool = True,
        softcap: float = 0.0,
    ) -> torch.Tensor:
        if attn_mask_type not in MASK_TYPES:
            raise ValueError(
                f"MultiheadAttention: attn_mask_type must be one of {MASK_TYPES}, "
                f"got {attn_mask_type!r}"
            )
        sbhd = self.qkv_format == "sbhd"
        # [b, h, s, d], as scaled_dot_product_attention takes them.
        q, k, v = (
            t.permute(1, 2, 0, 3) if sbhd else t.transpose(1, 2) for t in (query, key, value)
        )
        sq, skv = q.shape[2], k.shape[2]
        mask = _allowed(sq, skv, window_size, bottom_right_diagonal, q.device)
        q_pad = None
        if attention_mask is not None and attn_mask_type == "arbitrary":
            keep = ~attention_mask.to(torch.bool)
            mask = keep if mask is None else mask & keep
        elif attention_mask is not None and "padding" in attn_mask_type:
            if isinstance(attention_mask, (tuple, list)):
                q_pad, kv_pad = attention_mask
            else:
                q_pad = kv_pad = attention_mask
            keep = ~kv_pad.to(torch.bool).reshape(kv_pad.shape[0], 1, 1, skv)
            mask = keep if mask is None else mask & keep
        dropout = self.attention_dropout if self.training else 0.0
        if softcap or q.device.type == "cpu":
            out = self._explicit(q, k, v, mask, dropout, softcap)
        else:
            out = F.scaled_dot_product_attention(
                q,
                k,
                v,
                attn_mask=mask,
                dropout_p=dropout,
                scale=self.softmax_scale,
                enable_gqa=q.shape[1] != k.shape[1],
            )
        if q_pad is not None:
            out = out.masked_fill(q_pad.to(torch.bool).reshape(q_pad.shape[0], 1, sq, 1), 0.0)
        # [b, h, s, d] -> [s, b, h*d] or [b, s, h*d]
        out = out.permute(2, 0, 1, 3) if sbhd else out.transpose(1, 2)
        return out.reshape(*out.shape[:2], -1)

    def _explicit(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor | None,
        dropout: float,
        softcap: float,
    ) -> torch.Tensor:
        """Attention as three plain steps in fp32 (fp64 for fp64 data), cast back once:
        with a softcap (``softcap * tanh(scores / softcap)``), and on the CPU, where
        torch's fused SDPA kernel is less exact than this (its fp32 gradients of an
        attention layer measured ~70x further from a float64 reference)."""
        compute = torch.float64 if q.dtype == torch.float64 else torch.float32
        groups = q.shape[1] // k.shape[1]
        if groups > 1:
            k = k.repeat_interleave(groups, dim=1)
            v = v.repeat_interleave(groups, dim=1)
        scores = torch.matmul(q.to(compute), k.to(compute).transpose(-2, -1))
        scores = scores * self.softmax_scale
        if softcap:
            scores = softcap * torch.tanh(scores / softcap)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        probs = F.dropout(torch.softmax(scores, dim=-1), p=dropout)
        return torch.matmul(probs, v.to(compute)).to(q.dtype)

    def extra_repr(self) -> str:
        return (
            f"heads={self.num_attention_heads}, kv_channels={self.kv_channels}, "
            f"gqa_groups={self.num_gqa_groups}, qkv_format={self.qkv_format}"
        )
