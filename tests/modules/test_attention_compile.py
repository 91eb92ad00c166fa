"""DotProductAttention under torch.compile(fullgraph=True): bitwise eager's output and
gradients (dropout included: its bits come from the rng state the module draws), one
graph over several sequence lengths."""

from __future__ import annotations

import pytest
import torch
from attention_cases import randn
from module_cases import graph_breaks, unique_graphs

import transformer_engine_ops as te

H, D = 4, 8


def _run(fn, inputs, seed=0, **kw):
    """(output, gradients of the inputs that require grad) of ``fn(*inputs, **kw)``."""
    torch.manual_seed(seed)
    out = fn(*inputs, **kw)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(7)).to(out.dtype)
    wants = [t for t in inputs if t.requires_grad] + [
        t for t in kw.values() if isinstance(t, torch.Tensor) and t.requires_grad
    ]
    return out, torch.autograd.grad(out, wants, g)


def _assert_bitwise(a, b):
    assert torch.equal(a[0], b[0]), "output differs"
    for i, (x, y) in enumerate(zip(a[1], b[1], strict=True)):
        assert torch.equal(x, y), f"gradient {i} differs"


def _bshd(b, s, heads=H, seed=0, dtype=torch.bfloat16):
    return randn(b, s, heads, D, seed=seed, dtype=dtype)


CASES = {
    "causal": lambda: (
        dict(qkv_format="bshd"),
        (_bshd(2, 8), _bshd(2, 8, seed=1), _bshd(2, 8, seed=2)),
        {},
    ),
    "gqa-window-softcap-alibi": lambda: (
        dict(qkv_format="bshd", num_gqa_groups=2, attn_mask_type="no_mask", softcap=4.0),
        (_bshd(2, 8), _bshd(2, 8, 2, 1), _bshd(2, 8, 2, 2)),
        dict(window_size=(3, 1), core_attention_bias_type="alibi"),
    ),
    "padding-mask": lambda: (
        dict(qkv_format="bshd", attn_mask_type="padding_causal"),
        (_bshd(3, 8), _bshd(3, 8, seed=1), _bshd(3, 8, seed=2)),
        dict(
            attention_mask=torch.arange(8).view(1, 1, 1, 8)
            >= torch.tensor([8, 5, 2]).view(3, 1, 1, 1)
        ),
    ),
    "post-scale-bias-with-grad": lambda: (
        dict(qkv_format="bshd", attn_mask_type="causal_bottom_right"),
        (_bshd(2, 8), _bshd(2, 8, seed=1), _bshd(2, 8, seed=2)),
        dict(
            core_attention_bias_type="post_scale_bias",
            core_attention_bias=randn(1, H, 8, 8, seed=5, dtype=torch.bfloat16),
        ),
    ),
    "dropout": lambda: (
        dict(qkv_format="sbhd", attention_dropout=0.3),
        (_bshd(8, 2), _bshd(8, 2, seed=1), _bshd(8, 2, seed=2)),
        {},
    ),
    "thd-dropout": lambda: (
        dict(qkv_format="thd", attn_mask_type="padding_causal", attention_dropout=0.2),
        (randn(11, H, D, seed=0), randn(11, H, D, seed=1), randn(11, H, D, seed=2)),
        dict(
            cu_seqlens_q=torch.tensor([0, 3, 9, 11], dtype=torch.int32),
            cu_seqlens_kv=torch.tensor([0, 3, 9, 11], dtype=torch.int32),
            max_seqlen_q=6,
            max_seqlen_kv=6,
        ),
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_compiled_equals_eager_bitwise(case):
    ctor, inputs, kw = CASES[case]()
    dpa = te.DotProductAttention(H, D, **ctor)
    eager = _run(dpa, inputs, **kw)
    compiled = _run(torch.compile(dpa, backend="aot_eager", fullgraph=True), inputs, **kw)
    _assert_bitwise(eager, compiled)
    assert graph_breaks() == 0


@pytest.mark.slow
@pytest.mark.parametrize("case", ["dropout"])
def test_inductor_equals_eager_bitwise(case):
    ctor, inputs, kw = CASES[case]()
    dpa = te.DotProductAttention(H, D, **ctor)
    eager = _run(dpa, inputs, **kw)
    compiled = _run(torch.compile(dpa, fullgraph=True), inputs, **kw)
    _assert_bitwise(eager, compiled)


def test_dropout_draws_fresh_bits_each_compiled_call():
    dpa = te.DotProductAttention(H, D, attention_dropout=0.5)
    compiled = torch.compile(dpa, backend="aot_eager", fullgraph=True)
    q, k, v = (_bshd(6, 2, seed=i) for i in range(3))
    torch.manual_seed(1)
    first, second = compiled(q, k, v), compiled(q, k, v)
    assert not torch.equal(first, second)
    torch.manual_seed(1)
    assert torch.equal(dpa(q, k, v), first)


@pytest.mark.slow
def test_one_graph_over_sequence_lengths():
    dpa = te.DotProductAttention(H, D, qkv_format="bshd", window_size=(4, 0), softcap=3.0)
    compiled = torch.compile(dpa, backend="aot_eager", fullgraph=True, dynamic=True)
    for s in (10, 12, 14, 20):  # none equal to another dim: duck sizing would specialize
        inputs = [_bshd(2, s, seed=i) for i in range(3)]
        _assert_bitwise(_run(dpa, inputs), _run(compiled, inputs))
    assert unique_graphs() == 1


def test_thd_under_compile_needs_max_seqlen():
    dpa = te.DotProductAttention(H, D, qkv_format="thd", attn_mask_type="padding")
    compiled = torch.compile(dpa, backend="aot_eager", fullgraph=True)
    cu = torch.tensor([0, 3, 5], dtype=torch.int32)
    q = randn(5, H, D, seed=0)
    with pytest.raises(Exception, match="needs max_seqlen_q"):
        compiled(q, q, q, cu_seqlens_q=cu, cu_seqlens_kv=cu)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["flash", "efficient"])
def test_a_llama_style_layer_on_the_fused_path_compiles_bitwise_and_trains_like_unfused(
    backend, monkeypatch
):
    """A TransformerLayer (GQA, RMSNorm, SwiGLU, no biases, bf16) whose attention saves
    the kernel's output and log-sum-exp (the CPU stand-in of the fused backends): its
    output and every gradient compiled equal eager bitwise, and equal the unfused
    backend's within bf16 rounding (the saved output is the one the next GEMM reads)."""
    from transformer_cases import HIDDEN, make_layer

    from transformer_engine_ops.modules import attention as module_file

    def step(chosen: str, compiled: bool) -> list[torch.Tensor]:
        monkeypatch.setattr(module_file, "select_backend", lambda reasons, device: chosen)
        layer = make_layer(
            seed=3,
            dtype=torch.bfloat16,
            num_gqa_groups=2,
            normalization="RMSNorm",
            activation="swiglu",
            bias=False,
        )
        run = torch.compile(layer, fullgraph=True, backend="aot_eager") if compiled else layer
        x = torch.randn(7, 2, HIDDEN, generator=torch.Generator().manual_seed(1))
        x = x.bfloat16().requires_grad_(True)
        out = run(x)
        out.float().square().sum().backward()
        return [out, x.grad, *(p.grad for p in layer.parameters())]

    eager = step(backend, False)
    for a, b in zip(eager, step(backend, True), strict=True):
        assert torch.equal(a, b)
    for a, b in zip(eager, step("unfused", False), strict=True):
        scale = b.float().abs().max().item()
        torch.testing.assert_close(a.float(), b.float(), atol=2e-2 * scale, rtol=0)
