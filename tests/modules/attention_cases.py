"""An independent float64 reference of TE's attention, and the inputs the
DotProductAttention tests share.

The reference computes each sequence on its own (sliced to its real lengths, so
padding and thd need no mask of their own), with TE's definitions written out
per score: the window ``[i + off - left, i + off + right]`` (``-1`` unbounded), the
diagonal offset ``off = skv - sq`` when aligned bottom right, ALiBi
``-slope * |i + off - j|``, softcap ``c * tanh(s / c)`` before a post-scale bias;
a query row with no key gives zeros.
"""

from __future__ import annotations

import math
from typing import Any

import torch


def score_keep(
    sq: int, skv: int, mask_type: str, window: tuple[int, int], bottom_right: bool
) -> torch.Tensor:
    """[sq, skv] bool: which keys each query sees in one sequence."""
    if "causal" in mask_type:
        window = (window[0], 0)
        bottom_right = "bottom_right" in mask_type
    off = skv - sq if bottom_right else 0
    keep = torch.ones(sq, skv, dtype=torch.bool)
    for i in range(sq):
        for j in range(skv):
            if window[0] >= 0 and j < i + off - window[0]:
                keep[i, j] = False
            if window[1] >= 0 and j > i + off + window[1]:
                keep[i, j] = False
    return keep


def one_sequence(
    q: torch.Tensor,  # [sq, h, d] float64
    k: torch.Tensor,  # [skv, hg, d]
    v: torch.Tensor,
    *,
    scale: float,
    mask_type: str,
    window: tuple[int, int],
    bottom_right: bool,
    softcap: float = 0.0,
    bias: torch.Tensor | None = None,  # [h or 1, sq, skv]
    bias_type: str = "no_bias",
    slopes: torch.Tensor | None = None,  # [h]
    arbitrary: torch.Tensor | None = None,  # [h or 1, sq, skv], True = masked
    drop_keep: torch.Tensor | None = None,  # [h, sq, skv] bool
    dropout_p: float = 0.0,
) -> torch.Tensor:
    """[sq, h, dv] attention of one sequence."""
    sq, h, _ = q.shape
    skv, hg, _ = k.shape
    k = k.repeat_interleave(h // hg, dim=1)
    v = v.repeat_interleave(h // hg, dim=1)
    s = torch.einsum("ihd,jhd->hij", q, k)
    if bias_type == "pre_scale_bias":
        s = s + bias
    s = s * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    if bias_type == "post_scale_bias":
        s = s + bias
    if "causal" in mask_type:
        br = "bottom_right" in mask_type
    else:
        br = bottom_right
    if bias_type == "alibi":
        off = skv - sq if br else 0
        i = torch.arange(sq, dtype=torch.float64).view(-1, 1)
        j = torch.arange(skv, dtype=torch.float64).view(1, -1)
        s = s - slopes.view(-1, 1, 1).double() * (i + off - j).abs()
    keep = score_keep(sq, skv, mask_type, window, bottom_right).expand(h, sq, skv)
    if arbitrary is not None:
        keep = keep & ~arbitrary
    s = s.masked_fill(~keep, -math.inf)
    rows = keep.any(-1, keepdim=True)
    p = torch.where(rows, torch.softmax(torch.where(rows, s, 0.0), -1), 0.0)
    if drop_keep is not None:
        p = torch.where(drop_keep, p / (1.0 - dropout_p), 0.0)
    return torch.einsum("hij,jhd->ihd", p, v)


def randn(*shape: int, seed: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype).requires_grad_(True)


def grads(out: torch.Tensor, inputs: list[torch.Tensor], seed: int = 99) -> list[Any]:
    gen = torch.Generator().manual_seed(seed)
    g = torch.randn(out.shape, generator=gen, dtype=torch.float64).to(out.dtype)
    return list(torch.autograd.grad(out, inputs, g, allow_unused=True))


def reference(
    fmt: str,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    lens_q: list[int] | None = None,
    lens_kv: list[int] | None = None,
    starts_q: list[int] | None = None,
    starts_kv: list[int] | None = None,
    bias: torch.Tensor | None = None,  # [1 or b, h or 1, sq, skv]
    arbitrary: torch.Tensor | None = None,  # [1 or b, 1 or h, sq, skv]
    slopes: torch.Tensor | None = None,
    drop_keep: torch.Tensor | None = None,  # [b, h, sq, skv] (padded coordinates)
    **kw: Any,
) -> torch.Tensor:
    """TE's output layout ([sq, b, h*dv], [b, sq, h*dv] or [t, h*dv]) in float64, each
    sequence computed by :func:`one_sequence` on its real lengths; padding rows zero."""
    q, k, v = (t.double() for t in (q, k, v))
    if fmt == "sbhd":
        q, k, v = (t.transpose(0, 1) for t in (q, k, v))
    if fmt == "thd":
        batch = len(lens_q)
    else:
        batch = q.shape[0]
        lens_q = lens_q or [q.shape[1]] * batch
        lens_kv = lens_kv or [k.shape[1]] * batch
    h, dv = q.shape[-2], v.shape[-1]
    rows = []
    out = torch.zeros(*q.shape[:-2], h * dv, dtype=torch.float64)
    for b in range(batch):
        lq, lk = lens_q[b], lens_kv[b]
        if fmt == "thd":
            qb = q[starts_q[b] : starts_q[b] + lq]
            kb = k[starts_kv[b] : starts_kv[b] + lk]
            vb = v[starts_kv[b] : starts_kv[b] + lk]
        else:
            qb, kb, vb = q[b, :lq], k[b, :lk], v[b, :lk]
        pick = min(b, bias.shape[0] - 1) if bias is not None else 0
        bb = None if bias is None else bias[pick, :, :lq, :lk].double()
        pick = min(b, arbitrary.shape[0] - 1) if arbitrary is not None else 0
        ab = None if arbitrary is None else arbitrary[pick, :, :lq, :lk]
        sb = None
        if slopes is not None:
            sb = slopes if slopes.dim() == 1 else slopes[b]
        db = None if drop_keep is None else drop_keep[b, :, :lq, :lk]
        o = one_sequence(qb, kb, vb, bias=bb, arbitrary=ab, slopes=sb, drop_keep=db, **kw)
        row = o.reshape(lq, h * dv)
        if fmt == "thd":
            out = out.index_copy(0, torch.arange(starts_q[b], starts_q[b] + lq), row)
        else:
            rows.append(torch.cat([row, row.new_zeros(q.shape[1] - lq, h * dv)]))
    if fmt != "thd":
        out = torch.stack(rows)
    return out.transpose(0, 1) if fmt == "sbhd" else out


def aten_calls(fn: Any) -> list[str]:
    """The aten ops of torch's SDPA kernels that ``fn()`` runs, at any depth (inside a
    custom op too), in order: the profiler's record of every op call."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    names = [e.name for e in prof.events()]
    return [n.removeprefix("aten::") for n in names if n.startswith("aten::_scaled_dot_product")]
