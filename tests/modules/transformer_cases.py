"""A plain-PyTorch transformer layer computed from a TE-named state dict (TE 2.20.2's
semantics, float64), and the seeded layers the TransformerLayer tests build."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from family_cases import ref_activation

import transformer_engine_ops as te

HIDDEN, FFN, HEADS = 64, 128, 4


def randomize(module: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Every parameter from a seeded normal: norm weights around 1, biases and weights
    around 0 (a fresh TE layer has zero biases, which would hide bias mistakes)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            noise = torch.randn(p.shape, generator=gen, device="cpu").to(p.device)
            if name.endswith(("layer_norm_weight", "norm.weight")):
                p.copy_((1.0 + 0.1 * noise).to(p.dtype))
            else:
                p.copy_((0.05 * noise).to(p.dtype))
    return module


def make_layer(seed: int = 0, dtype: torch.dtype = torch.float32, **kwargs: Any) -> Any:
    torch.manual_seed(seed)
    kwargs.setdefault("hidden_dropout", 0.0)
    kwargs.setdefault("attention_dropout", 0.0)
    layer = te.TransformerLayer(HIDDEN, FFN, HEADS, params_dtype=dtype, **kwargs)
    return randomize(layer, seed)


def _norm(x: torch.Tensor, sd: dict[str, torch.Tensor], prefix: str, kind: str) -> torch.Tensor:
    w = sd[f"{prefix}weight"]
    if kind == "LayerNorm":
        return F.layer_norm(x, (x.shape[-1],), w, sd[f"{prefix}bias"], eps=1e-5)
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w


def _rope(t: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """Non-interleaved rotary embedding of ``t`` ``[s, b, h, d]`` (``freqs`` ``[s, 1, 1, d']``)."""
    d = freqs.shape[-1]
    x, rest = t[..., :d], t[..., d:]
    x1, x2 = x.chunk(2, dim=-1)
    rotated = torch.cat((-x2, x1), dim=-1)
    return torch.cat((x * freqs.cos() + rotated * freqs.sin(), rest), dim=-1)


def _attention(
    x: torch.Tensor,
    sd: dict[str, torch.Tensor],
    heads: int,
    groups: int,
    causal: bool,
    freqs: torch.Tensor | None,
) -> torch.Tensor:
    """``x`` ``[s, b, hidden]`` (already normed) -> projected attention, no proj bias."""
    p = "self_attention.layernorm_qkv."
    s, b, _ = x.shape
    q = F.linear(x, sd[f"{p}query_weight"], sd.get(f"{p}query_bias"))
    k = F.linear(x, sd[f"{p}key_weight"], sd.get(f"{p}key_bias"))
    v = F.linear(x, sd[f"{p}value_weight"], sd.get(f"{p}value_bias"))
    d = q.shape[-1] // heads
    q, k, v = q.view(s, b, heads, d), k.view(s, b, groups, d), v.view(s, b, groups, d)
    if freqs is not None:
        q, k = _rope(q, freqs), _rope(k, freqs)
    k = k.repeat_interleave(heads // groups, dim=2)
    v = v.repeat_interleave(heads // groups, dim=2)
    scores = torch.einsum("sbhd,tbhd->bhst", q, k) / math.sqrt(d)
    if causal:
        future = torch.ones(s, s, dtype=torch.bool).triu(1)
        scores = scores.masked_fill(future, float("-inf"))
    context = torch.einsum("bhst,tbhd->sbhd", scores.softmax(-1), v).reshape(s, b, heads * d)
    return F.linear(context, sd["self_attention.proj.weight"])


def reference_layer(
    sd: dict[str, torch.Tensor],
    x: torch.Tensor,
    *,
    heads: int = HEADS,
    groups: int = HEADS,
    normalization: str = "LayerNorm",
    activation: str = "gelu",
    causal: bool = True,
    freqs: torch.Tensor | None = None,
    residual_post_layernorm: bool = False,
    parallel_attention_mlp: bool = False,
) -> torch.Tensor:
    """TE's encoder layer (``[s, b, h]``): x + attn(norm(x)) + proj bias, then
    h + mlp(norm(h)) + fc2 bias; with ``apply_residual_connection_post_layernorm`` the
    residuals are the norm outputs; with ``parallel_attention_mlp`` both branches read x."""
    ln1 = _norm(x, sd, "self_attention.layernorm_qkv.layer_norm_", normalization)
    attn = _attention(ln1, sd, heads, groups, causal, freqs)
    proj_bias = sd.get("self_attention.proj.bias")

    def mlp(h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ln2 = _norm(h, sd, "layernorm_mlp.layer_norm_", normalization)
        act = ref_activation(
            activation,
            F.linear(ln2, sd["layernorm_mlp.fc1_weight"], sd.get("layernorm_mlp.fc1_bias")),
        )
        return F.linear(act, sd["layernorm_mlp.fc2_weight"]), ln2

    fc2_bias = sd.get("layernorm_mlp.fc2_bias")
    biased = lambda t, bias: t if bias is None else t + bias  # noqa: E731
    if parallel_attention_mlp:
        out, _ = mlp(x)
        return x + (biased(attn, proj_bias) + biased(out, fc2_bias))
    h = (ln1 if residual_post_layernorm else x) + biased(attn, proj_bias)
    out, ln2 = mlp(h)
    return (ln2 if residual_post_layernorm else h) + biased(out, fc2_bias)


def cotangent(shape: torch.Size) -> torch.Tensor:
    """The output gradient of the reference comparisons: seeded noise, not ones (with
    ``loss = sum`` the softmax backward cancels to a small difference of large terms,
    which measures fp32's cancellation rather than the layer)."""
    return torch.randn(shape, generator=torch.Generator().manual_seed(99))


def reference_step(
    layer: torch.nn.Module, x: torch.Tensor, **kwargs: Any
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """(output, input grad, grads by parameter name) of :func:`reference_layer` on the
    layer's own state dict, in float64, loss = (output * cotangent).sum()."""
    sd = {
        k: v.detach().double().requires_grad_(True)
        for k, v in layer.state_dict().items()
        if not k.endswith("_extra_state")
    }
    xd = x.detach().double().requires_grad_(True)
    freqs = kwargs.pop("freqs", None)
    y = reference_layer(sd, xd, freqs=None if freqs is None else freqs.double(), **kwargs)
    (y * cotangent(y.shape).double()).sum().backward()
    grads = {k: v.grad for k, v in sd.items() if v.grad is not None}
    return y.detach(), xd.grad, grads


def layer_step(
    layer: Any, x: torch.Tensor, weighted: bool = False, **forward: Any
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """(output, input grad, grads by parameter name) of one forward + backward, loss =
    sum (``weighted``: ``(output * cotangent).sum()``, as :func:`reference_step`)."""
    inner = getattr(layer, "_orig_mod", layer)
    for p in inner.parameters():
        p.grad = None
    x = x.detach().clone().requires_grad_(True)
    y = layer(x, **forward)
    (y * cotangent(y.shape).to(y.dtype) if weighted else y).sum().backward()
    return y.detach(), x.grad, {n: p.grad for n, p in inner.named_parameters()}
