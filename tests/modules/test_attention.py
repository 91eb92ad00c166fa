"""DotProductAttention against an independent float64 reference of TE's attention
(attention_cases.py): every mask type and format (thd with ragged cu_seqlens), GQA/MQA,
sliding windows, softcap, ALiBi, core_attention_bias, dropout; forward and gradients."""

from __future__ import annotations

import pytest
import torch
from attention_cases import aten_calls, grads, randn, reference

import transformer_engine_ops as te
from transformer_engine_ops.quantization.philox import uniform
from transformer_engine_ops.quantization.stochastic import draw_rng_state

TOL = dict(rtol=1e-9, atol=1e-10)
H, D = 4, 8


def _layout(fmt: str, batch: int, seq: int, heads: int, dim: int) -> tuple[int, ...]:
    return (seq, batch, heads, dim) if fmt == "sbhd" else (batch, seq, heads, dim)


def _check(module, ref_kw, fmt, q, k, v, extra=(), **fwd_kw):
    """Module output and q/k/v (and ``extra``) gradients equal the reference's."""
    out = module(q, k, v, **fwd_kw)
    ref = reference(fmt, q, k, v, **ref_kw)
    torch.testing.assert_close(out, ref, **TOL)
    inputs = [q, k, v, *extra]
    for got, want, name in zip(grads(out, inputs), grads(ref, inputs), "qkvb", strict=False):
        torch.testing.assert_close(got, want, **TOL, msg=lambda m, n=name: f"d{n}: {m}")


def _kw(module, mask_type, window=None, **more):
    """The reference's arguments for ``module``'s configuration."""
    from transformer_engine_ops.modules.attention import check_set_window_size

    bottom_right = module.bottom_right_diagonal
    if bottom_right is None:
        bottom_right = mask_type not in ("causal", "padding_causal")
    return dict(
        scale=module.softmax_scale,
        mask_type=mask_type,
        window=check_set_window_size(mask_type, window),
        bottom_right=bottom_right,
        **more,
    )


NON_PADDING = ["no_mask", "causal", "causal_bottom_right", "arbitrary"]
PADDING = ["padding", "padding_causal", "padding_causal_bottom_right"]


@pytest.mark.parametrize("fmt", ["bshd", "sbhd"])
@pytest.mark.parametrize("mask_type", NON_PADDING)
def test_unpadded_mask_types_match_the_reference(fmt, mask_type):
    b, sq, skv = 2, 5, 7  # sq != skv: the causal diagonals differ
    q = randn(*_layout(fmt, b, sq, H, D), seed=1)
    k = randn(*_layout(fmt, b, skv, H, D), seed=2)
    v = randn(*_layout(fmt, b, skv, H, D), seed=3)
    dpa = te.DotProductAttention(H, D, qkv_format=fmt, attn_mask_type=mask_type)
    fwd, ref = {}, _kw(dpa, mask_type)
    if mask_type == "arbitrary":
        mask = torch.rand(b, H, sq, skv, generator=torch.Generator().manual_seed(4)) < 0.3
        fwd["attention_mask"], ref["arbitrary"] = mask, mask
    _check(dpa, ref, fmt, q, k, v, **fwd)


@pytest.mark.parametrize("fmt", ["bshd", "sbhd"])
@pytest.mark.parametrize("mask_type", PADDING)
def test_padding_mask_types_match_the_reference(fmt, mask_type):
    b, s, lens = 3, 6, [6, 3, 1]
    q, k, v = (randn(*_layout(fmt, b, s, H, D), seed=i) for i in range(3))
    mask = torch.arange(s).view(1, 1, 1, s) >= torch.tensor(lens).view(b, 1, 1, 1)
    dpa = te.DotProductAttention(H, D, qkv_format=fmt, attn_mask_type=mask_type)
    ref = _kw(dpa, mask_type, lens_q=lens, lens_kv=lens)
    _check(dpa, ref, fmt, q, k, v, attention_mask=mask)


@pytest.mark.parametrize("mask_type", PADDING)
def test_cross_attention_padding_pairs_match_the_reference(mask_type):
    b, sq, skv, lq, lk = 2, 5, 7, [5, 2], [4, 7]
    q = randn(b, sq, H, D, seed=1)
    k, v = randn(b, skv, H, D, seed=2), randn(b, skv, H, D, seed=3)
    pad = lambda s, lens: torch.arange(s).view(1, 1, 1, s) >= torch.tensor(lens).view(-1, 1, 1, 1)  # noqa: E731
    dpa = te.DotProductAttention(
        H, D, qkv_format="bshd", attn_mask_type=mask_type, attention_type="cross"
    )
    ref = _kw(dpa, mask_type, lens_q=lq, lens_kv=lk)
    _check(dpa, ref, "bshd", q, k, v, attention_mask=(pad(sq, lq), pad(skv, lk)))


def _padded_positions(fmt: str, seq: int, heads: int, lens: list[int]) -> torch.Tensor:
    """Which elements of a [s, b, h, d] (sbhd) or [b, s, h, d] (bshd) layer are padding."""
    pad = torch.arange(seq).view(1, seq) >= torch.tensor(lens).view(-1, 1)  # [b, s]
    pad = pad.t() if fmt == "sbhd" else pad
    return pad.view(*pad.shape, 1, 1).expand(*pad.shape, heads, D)


@pytest.mark.parametrize("fmt", ["bshd", "sbhd"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
@pytest.mark.parametrize("softcap", [0.0, 5.0])
def test_nan_or_inf_in_padded_positions_reaches_no_real_token(fmt, bad, softcap):
    """Padded tokens are never part of the result (TE's flash backend unpads them away):
    a NaN or Inf in padded queries, keys, values and output gradients leaves the real
    tokens' outputs and q/k/v gradients those of finite padding, bit for bit, and the
    padded rows and their gradients zeros (cross attention, GQA, each side's lengths)."""
    b, sq, skv, lq, lk = 3, 5, 7, [5, 2, 0], [4, 7, 1]
    q = randn(*_layout(fmt, b, sq, H, D), seed=1)
    k, v = (randn(*_layout(fmt, b, skv, 2, D), seed=i) for i in (2, 3))
    mask = lambda s, lens: torch.arange(s).view(1, 1, 1, s) >= torch.tensor(lens).view(-1, 1, 1, 1)  # noqa: E731
    dpa = te.DotProductAttention(
        H,
        D,
        num_gqa_groups=2,
        qkv_format=fmt,
        attn_mask_type="padding_causal_bottom_right",
        attention_type="cross",
        softcap=softcap,
    )
    pad_q, pad_kv = _padded_positions(fmt, sq, H, lq), _padded_positions(fmt, skv, 2, lk)
    dirty = [
        t.detach().masked_fill(pad, bad).requires_grad_(True)
        for t, pad in ((q, pad_q), (k, pad_kv), (v, pad_kv))
    ]
    pad_out = pad_q.flatten(-2)
    grad = torch.randn(pad_out.shape, generator=torch.Generator().manual_seed(9), dtype=q.dtype)
    runs = []
    for inputs, g in ((dirty, grad.masked_fill(pad_out, bad)), ([q, k, v], grad)):
        out = dpa(*inputs, attention_mask=(mask(sq, lq), mask(skv, lk)))
        runs.append((out, torch.autograd.grad(out, inputs, g)))
    (out, got), (clean_out, want) = runs
    assert torch.equal(out, clean_out)
    assert not out[pad_out].any()
    for name, g, w, pad in zip("qkv", got, want, (pad_q, pad_kv, pad_kv), strict=True):
        assert torch.equal(g, w), f"d{name}"
        assert not g[pad].any(), f"d{name} at padding"


@pytest.mark.parametrize("mask_type", PADDING)
@pytest.mark.parametrize("gaps", [False, True])
def test_thd_with_ragged_cu_seqlens_matches_the_reference(mask_type, gaps):
    lq, lk = [3, 5, 1, 4], [4, 2, 6, 4]
    gq, gk = ([1, 0, 2, 1], [0, 3, 1, 2]) if gaps else ([0] * 4, [0] * 4)
    cum = lambda xs: torch.tensor([0, *torch.tensor(xs).cumsum(0).tolist()], dtype=torch.int32)  # noqa: E731
    cu_q, cu_k = cum(lq), cum(lk)
    cu_qp = cum([a + g for a, g in zip(lq, gq, strict=True)])
    cu_kp = cum([a + g for a, g in zip(lk, gk, strict=True)])
    q = randn(int(cu_qp[-1]), H, D, seed=1)
    k, v = randn(int(cu_kp[-1]), 2, D, seed=2), randn(int(cu_kp[-1]), 2, D, seed=3)
    dpa = te.DotProductAttention(H, D, num_gqa_groups=2, qkv_format="thd", attn_mask_type=mask_type)
    ref = _kw(
        dpa,
        mask_type,
        lens_q=lq,
        lens_kv=lk,
        starts_q=cu_qp[:-1].tolist(),
        starts_kv=cu_kp[:-1].tolist(),
    )
    padded = dict(cu_seqlens_q_padded=cu_qp, cu_seqlens_kv_padded=cu_kp) if gaps else {}
    _check(dpa, ref, "thd", q, k, v, cu_seqlens_q=cu_q, cu_seqlens_kv=cu_k, **padded)


@pytest.mark.parametrize("groups", [2, 1])
@pytest.mark.parametrize("mask_type", ["causal", "no_mask"])
def test_gqa_and_mqa_match_the_reference(groups, mask_type):
    q = randn(2, 6, H, D, seed=1)
    k, v = randn(2, 6, groups, D, seed=2), randn(2, 6, groups, D, seed=3)
    dpa = te.DotProductAttention(
        H, D, num_gqa_groups=groups, qkv_format="bshd", attn_mask_type=mask_type
    )
    _check(dpa, _kw(dpa, mask_type), "bshd", q, k, v)


@pytest.mark.parametrize(
    "mask_type,window,bottom_right",
    [
        ("no_mask", (2, 1), None),
        ("no_mask", (0, 0), False),
        ("causal", (2, 0), None),
        ("causal_bottom_right", (1, 0), None),
        ("padding", (1, 2), None),
        ("padding_causal", (2, 0), None),
    ],
)
def test_sliding_windows_match_the_reference(mask_type, window, bottom_right):
    b, s, lens = 2, 7, [7, 4]
    q, k, v = (randn(s, b, H, D, seed=i) for i in range(3))
    dpa = te.DotProductAttention(
        H, D, attn_mask_type=mask_type, window_size=window, bottom_right_diagonal=bottom_right
    )
    fwd, ref = {}, _kw(dpa, mask_type, window)
    if "padding" in mask_type:
        fwd["attention_mask"] = torch.arange(s).view(1, 1, 1, s) >= torch.tensor(lens).view(
            b, 1, 1, 1
        )
        ref.update(lens_q=lens, lens_kv=lens)
    _check(dpa, ref, "sbhd", q, k, v, **fwd)


def test_a_window_without_padding_on_unequal_lengths_matches_the_reference():
    q = randn(2, 4, H, D, seed=1)
    k, v = randn(2, 9, H, D, seed=2), randn(2, 9, H, D, seed=3)
    dpa = te.DotProductAttention(H, D, qkv_format="bshd", attn_mask_type="no_mask")
    fwd_window = (3, 1)
    ref = _kw(dpa, "no_mask", fwd_window)
    _check(dpa, ref, "bshd", q, k, v, window_size=fwd_window)


@pytest.mark.parametrize("bias_type", ["no_bias", "post_scale_bias"])
def test_softcap_matches_the_reference(bias_type):
    q, k, v = (randn(5, 2, H, D, seed=i) for i in range(3))
    q = (q.detach() * 4).requires_grad_(True)  # large scores: the cap bites
    dpa = te.DotProductAttention(H, D, softcap=2.5, attn_mask_type="causal")
    fwd, ref = {}, _kw(dpa, "causal", softcap=2.5, bias_type=bias_type)
    if bias_type != "no_bias":
        bias = randn(1, H, 5, 5, seed=7)
        fwd.update(core_attention_bias_type=bias_type, core_attention_bias=bias)
        ref["bias"] = bias
    _check(dpa, ref, "sbhd", q, k, v, **fwd)


def test_softcap_given_to_forward_overrides_the_constructor():
    q, k, v = (randn(5, 2, H, D, seed=i) for i in range(3))
    dpa = te.DotProductAttention(H, D, softcap=50.0)
    _check(dpa, _kw(dpa, "causal", softcap=1.5), "sbhd", q, k, v, softcap=1.5)


@pytest.mark.parametrize("bias_type", ["pre_scale_bias", "post_scale_bias"])
@pytest.mark.parametrize("shape", [(1, H, 5, 7), (2, 1, 5, 7)])
def test_core_attention_bias_and_its_gradient_match_the_reference(bias_type, shape):
    q = randn(2, 5, H, D, seed=1)
    k, v = randn(2, 7, H, D, seed=2), randn(2, 7, H, D, seed=3)
    bias = randn(*shape, seed=4)
    dpa = te.DotProductAttention(H, D, qkv_format="bshd", attn_mask_type="no_mask")
    ref = _kw(dpa, "no_mask", bias=bias, bias_type=bias_type)
    fwd = dict(core_attention_bias_type=bias_type, core_attention_bias=bias)
    _check(dpa, ref, "bshd", q, k, v, extra=(bias,), **fwd)


@pytest.mark.parametrize("mask_type", ["no_mask", "causal", "causal_bottom_right", "padding"])
@pytest.mark.parametrize("custom", [False, True])
def test_alibi_matches_the_reference(mask_type, custom):
    heads, b, sq, skv = 6, 2, 5, 5 if "padding" in mask_type else 8
    q = randn(b, sq, heads, D, seed=1)
    k, v = randn(b, skv, heads, D, seed=2), randn(b, skv, heads, D, seed=3)
    slopes = torch.rand(heads, generator=torch.Generator().manual_seed(5)) if custom else None
    default = te.DotProductAttention(heads, D).__class__  # noqa: F841 (the class under test)
    from transformer_engine_ops.ops.attention import default_alibi_slopes

    want = slopes if custom else default_alibi_slopes(heads, "cpu")
    dpa = te.DotProductAttention(heads, D, qkv_format="bshd", attn_mask_type=mask_type)
    fwd = dict(core_attention_bias_type="alibi", alibi_slopes=slopes)
    ref = _kw(dpa, mask_type, bias_type="alibi", slopes=want)
    if "padding" in mask_type:
        lens = [5, 3]
        fwd["attention_mask"] = torch.arange(sq).view(1, 1, 1, sq) >= torch.tensor(lens).view(
            b, 1, 1, 1
        )
        ref.update(lens_q=lens, lens_kv=lens)
    _check(dpa, ref, "bshd", q, k, v, **fwd)


def test_default_alibi_slopes_are_tes():
    from transformer_engine_ops.ops.attention import default_alibi_slopes

    # TE's get_alibi: 2**(-8/n * i) for the largest power of two n <= heads, then the odd
    # powers of 2**(-4/n) for the rest.
    torch.testing.assert_close(
        default_alibi_slopes(6, "cpu"),
        torch.tensor([2**-2, 2**-4, 2**-6, 2**-8, 2**-1, 2**-3], dtype=torch.float32),
    )


def test_dropout_matches_the_reference_with_the_calls_own_bits():
    b, s, p = 2, 6, 0.25
    q, k, v = (randn(s, b, H, D, seed=i) for i in range(3))
    dpa = te.DotProductAttention(H, D, attention_dropout=p, attn_mask_type="causal")
    torch.manual_seed(123)
    out = dpa(q, k, v)
    torch.manual_seed(123)
    rng_state = draw_rng_state(None, "cpu")
    keep = (uniform(rng_state, b * H * s * s, stream=0) >= p).view(b, H, s, s)
    ref = reference("sbhd", q, k, v, **_kw(dpa, "causal", drop_keep=keep, dropout_p=p))
    torch.testing.assert_close(out, ref, **TOL)
    for got, want in zip(grads(out, [q, k, v]), grads(ref, [q, k, v]), strict=True):
        torch.testing.assert_close(got, want, **TOL)
    assert 0.15 < 1 - keep.float().mean().item() < 0.35


def test_dropout_is_off_in_eval_mode_and_reproducible_from_the_seed():
    q, k, v = (randn(6, 2, H, D, seed=i) for i in range(3))
    dpa = te.DotProductAttention(H, D, attention_dropout=0.5)
    torch.manual_seed(0)
    a = dpa(q, k, v)
    torch.manual_seed(0)
    assert torch.equal(dpa(q, k, v), a)
    assert not torch.equal(dpa(q, k, v), a)  # the generator moved on
    dpa.eval()
    plain = te.DotProductAttention(H, D)
    assert torch.equal(dpa(q, k, v), plain(q, k, v))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_low_precision_inputs_compute_in_fp32(dtype):
    q, k, v = (randn(6, 2, H, D, seed=i, dtype=dtype) for i in range(3))
    dpa = te.DotProductAttention(H, D, window_size=(3, 0), softcap=5.0)
    out = dpa(q, k, v)
    assert out.dtype == dtype
    ref = reference("sbhd", q, k, v, **_kw(dpa, "causal", (3, 0), softcap=5.0))
    tol = dict(rtol=0, atol=2e-2 if dtype != torch.float32 else 1e-5)
    torch.testing.assert_close(out.double(), ref, **tol)
    for got, want in zip(grads(out, [q, k, v]), grads(ref, [q, k, v]), strict=True):
        torch.testing.assert_close(got.double(), want.double(), rtol=0, atol=5 * tol["atol"])


def test_packed_qkv_layer_equals_separate_layers():
    qkv = randn(2, 5, 3, H, D, seed=1)
    dpa = te.DotProductAttention(H, D, qkv_format="bshd")
    q, k, v = qkv.unbind(-3)
    assert torch.equal(dpa(qkv_layer=qkv), dpa(q, k, v))


def test_gradcheck_in_float64():
    q, k, v = (randn(4, 2, 2, 3, seed=i) for i in range(3))
    bias = randn(1, 2, 4, 4, seed=5)
    dpa = te.DotProductAttention(2, 3, softcap=3.0, window_size=(2, 0))
    fn = lambda q, k, v, b: dpa(  # noqa: E731
        q, k, v, core_attention_bias_type="post_scale_bias", core_attention_bias=b
    )
    assert torch.autograd.gradcheck(fn, (q, k, v, bias))


SDPA_CASES = {
    "flash-causal": ("flash", dict(), {}, H, 7, 7),
    "flash-gqa": ("flash", dict(attn_mask_type="no_mask", num_gqa_groups=2), {}, 2, 5, 9),
    "efficient-bottom-right": (
        "efficient",
        dict(attn_mask_type="causal_bottom_right"),
        {},
        H,
        5,
        9,
    ),
    "efficient-window-alibi": (
        "efficient",
        dict(attn_mask_type="no_mask", window_size=(2, 1)),
        dict(core_attention_bias_type="alibi"),
        H,
        7,
        7,
    ),
    "efficient-pre-scale-bias": (
        "efficient",
        dict(attn_mask_type="causal"),
        dict(
            core_attention_bias_type="pre_scale_bias",
            # memory-efficient has no bias gradient (a bias that wants one: the test below)
            core_attention_bias=randn(1, H, 7, 7, seed=9).detach(),
        ),
        H,
        7,
        7,
    ),
    "efficient-arbitrary": (
        "efficient",
        dict(attn_mask_type="arbitrary"),
        dict(
            attention_mask=torch.rand(2, 1, 7, 7, generator=torch.Generator().manual_seed(3)) < 0.6
        ),
        H,
        7,
        7,
    ),
}


@pytest.mark.parametrize("case", list(SDPA_CASES))
def test_the_sdpa_path_equals_the_unfused_one_on_cpu_kernels(case, monkeypatch):
    """The CUDA backends' mask, bias and GQA handling and their saved-stats backward
    (the output and log-sum-exp saved, the backward op called on them), run on torch's
    CPU flash kernel (the op's CPU stand-in for flash and memory-efficient): the unfused
    path's results, in float64."""
    from transformer_engine_ops.modules import attention as module_file

    backend, ctor, fwd, groups, sq, skv = SDPA_CASES[case]
    q = randn(2, sq, H, D, seed=1)
    k, v = randn(2, skv, groups, D, seed=2), randn(2, skv, groups, D, seed=3)
    results = []
    for chosen in (backend, "unfused"):
        monkeypatch.setattr(module_file, "select_backend", lambda reasons, device, c=chosen: c)
        dpa = te.DotProductAttention(H, D, qkv_format="bshd", **ctor)
        out = dpa(q, k, v, **fwd)
        results.append((out, *grads(out, [q, k, v])))
    for got, want in zip(*results, strict=True):
        torch.testing.assert_close(got, want, **TOL)


@pytest.mark.parametrize(
    "backend, ctor, fwd, why",
    [
        ("efficient", {}, dict(core_attention_bias_type="pre_scale_bias"), "requires grad"),
        ("flash", dict(softcap=5.0), {}, "softcap"),
        ("flash", dict(attn_mask_type="no_mask", window_size=(2, 1)), {}, "window_size"),
        ("flash", dict(attention_dropout=0.1), {}, "dropout"),
        ("efficient", dict(attn_mask_type="padding"), {}, "padded rows"),
    ],
    ids=["efficient-bias-grad", "flash-softcap", "flash-window", "flash-dropout", "padding"],
)
def test_a_backend_that_would_drop_part_of_the_call_is_refused(
    backend, ctor, fwd, why, monkeypatch
):
    """A bundle naming a backend its configuration rules out (the module never selects
    one; a hand-built bundle or a forced selection can) is an error naming the reason,
    never a kernel that drops the softcap, window, dropout, mask or bias gradient."""
    from transformer_engine_ops.modules import attention as module_file

    monkeypatch.setattr(module_file, "select_backend", lambda reasons, device: backend)
    dpa = te.DotProductAttention(H, D, qkv_format="bshd", **ctor)
    q, k, v = (randn(2, 7, H, D, seed=s) for s in (1, 2, 3))
    if "core_attention_bias_type" in fwd:
        fwd = {**fwd, "core_attention_bias": randn(1, H, 7, 7, seed=9)}
    if "padding" in ctor.get("attn_mask_type", ""):
        fwd = {**fwd, "attention_mask": torch.zeros(2, 1, 1, 7, dtype=torch.bool)}
    with pytest.raises(ValueError, match=rf"backend: '{backend}' cannot serve this call: .*{why}"):
        dpa(q, k, v, **fwd)


@pytest.mark.parametrize("backend", ["flash", "efficient"])
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "aot_eager"])
def test_the_fused_backward_runs_the_backward_kernel_once_and_no_forward(
    backend, compiled, monkeypatch
):
    """The saved output and log-sum-exp are all the backward needs: on the CPU stand-in
    (torch's CPU flash kernel) the forward runs the kernel's forward op once, the
    backward its backward op once and its forward not at all."""
    from transformer_engine_ops.modules import attention as module_file

    monkeypatch.setattr(module_file, "select_backend", lambda reasons, device: backend)
    dpa = te.DotProductAttention(H, D, num_gqa_groups=2, attn_mask_type="no_mask")
    run = torch.compile(dpa, fullgraph=True, backend="aot_eager") if compiled else dpa
    q, k, v = randn(6, 2, H, D, seed=0), randn(6, 2, 2, D, seed=1), randn(6, 2, 2, D, seed=2)
    run(q, k, v).sum().backward()  # compiled: the first call compiles both ways
    outs: list = []
    forward = aten_calls(lambda: outs.append(run(q, k, v)))
    backward = aten_calls(lambda: outs[0].backward(torch.ones_like(outs[0])))
    assert forward == ["_scaled_dot_product_flash_attention_for_cpu"]
    assert backward == ["_scaled_dot_product_flash_attention_for_cpu_backward"]


@pytest.mark.parametrize("backend", ["flash", "efficient"])
@pytest.mark.parametrize("fmt", ["sbhd", "bshd"])
def test_the_fused_path_in_bf16_is_within_tes_tolerance_of_the_reference(backend, fmt, monkeypatch):
    """bf16, causal, GQA (the Llama layer's case) on the CPU stand-in: output and
    gradients from the saved log-sum-exp within TE's bf16 tolerance (1.5e-2) of the
    float64 reference."""
    from transformer_engine_ops.modules import attention as module_file

    monkeypatch.setattr(module_file, "select_backend", lambda reasons, device: backend)
    b, s, groups = 2, 9, 2
    q64 = randn(*_layout(fmt, b, s, H, D), seed=1)
    k64, v64 = (randn(*_layout(fmt, b, s, groups, D), seed=i) for i in (2, 3))
    q, k, v = (t.detach().bfloat16().requires_grad_(True) for t in (q64, k64, v64))
    dpa = te.DotProductAttention(H, D, qkv_format=fmt, num_gqa_groups=groups)
    out = dpa(q, k, v)
    ref = reference(fmt, q64, k64, v64, **_kw(dpa, "causal"))
    bf16 = dict(atol=1.5e-2, rtol=1.5e-2)
    torch.testing.assert_close(out.double(), ref, **bf16)
    gen = torch.Generator().manual_seed(5)
    grad = torch.randn(out.shape, generator=gen, dtype=torch.float64)
    got = torch.autograd.grad(out, (q, k, v), grad.bfloat16())
    want = torch.autograd.grad(ref, (q64, k64, v64), grad)
    for g, w, name in zip(got, want, "qkv", strict=True):
        torch.testing.assert_close(g.double(), w, **bf16, msg=lambda m, n=name: f"d{n}: {m}")
