"""DotProductAttention's TE surface: what it refuses (by name), TE's argument rules,
the backend choice and its environment override, and the state dict."""

from __future__ import annotations

import pytest
import torch

import transformer_engine_ops as te
from transformer_engine_ops.ops.attention import backend_support, select_backend

H, D = 4, 8


def _qkv(shape=(6, 2, H, D)):
    return tuple(torch.randn(shape) for _ in range(3))


def test_tes_defaults():
    dpa = te.DotProductAttention(H, D)
    assert (dpa.qkv_format, dpa.attn_mask_type, dpa.window_size) == ("sbhd", "causal", (-1, 0))
    assert dpa.softmax_scale == D**-0.5 and dpa.num_gqa_groups == H
    assert dpa.attention_dropout == 0.0 and dpa.softcap == 0.0 and dpa.layer_number == 1
    out = dpa(*_qkv())
    assert out.shape == (6, 2, H * D)


def test_kv_channels_pair_gives_the_value_head_dim():
    dpa = te.DotProductAttention(H, (D, 6), qkv_format="bshd")
    q, k = torch.randn(2, 5, H, D), torch.randn(2, 5, H, D)
    assert dpa(q, k, torch.randn(2, 5, H, 6)).shape == (2, 5, H * 6)


@pytest.mark.parametrize(
    "kwargs,name",
    [
        (dict(cp_group=object()), "cp_group"),
        (dict(cp_global_ranks=[0, 1]), "cp_global_ranks"),
        (dict(get_rng_state_tracker=lambda: None), "get_rng_state_tracker"),
        (dict(return_max_logit=True), "return_max_logit"),
        (dict(softmax_type="learnable"), "softmax_type"),
    ],
)
def test_unimplemented_constructor_arguments_are_refused_by_name(kwargs, name):
    with pytest.raises(NotImplementedError, match=name):
        te.DotProductAttention(H, D, **kwargs)


@pytest.mark.parametrize(
    "kwargs,name",
    [
        (dict(fp8_output=True), "fp8_output"),
        (dict(score_mod=lambda *a: None), "score_mod"),
        (dict(thd_attention_policies=[{}]), "thd_attention_policies"),
    ],
)
def test_unimplemented_forward_arguments_are_refused_by_name(kwargs, name):
    with pytest.raises(NotImplementedError, match=name):
        te.DotProductAttention(H, D)(*_qkv(), **kwargs)


@pytest.mark.parametrize("flag", ["fp8_dpa", "fp8_mha"])
def test_fp8_attention_is_refused_by_name(flag):
    # Refused where the recipe is made, before any attention runs under it.
    with pytest.raises(NotImplementedError, match=f"{flag}=True \\(FP8 attention\\)"):
        te.recipe.Float8CurrentScaling(**{flag: True})


def test_attention_under_a_recipe_runs_in_high_precision():
    q, k, v = _qkv()
    dpa = te.DotProductAttention(H, D)
    with te.autocast(recipe=te.recipe.Float8CurrentScaling()):
        quantized_run = dpa(q, k, v)
    assert torch.equal(quantized_run, dpa(q, k, v))


def test_tes_mask_type_spellings_are_accepted():
    q, k, v = _qkv()
    mask = torch.zeros(2, 1, 1, 6, dtype=torch.bool)
    a = te.DotProductAttention(H, D, attn_mask_type="padding,causal")(q, k, v, attention_mask=mask)
    b = te.DotProductAttention(H, D, attn_mask_type="padding_causal")(q, k, v, attention_mask=mask)
    assert torch.equal(a, b)


def test_a_window_that_contradicts_a_causal_mask_is_corrected_with_tes_warning():
    with pytest.warns(UserWarning, match=r"window_size should be \(-1, 0\)"):
        dpa = te.DotProductAttention(H, D, window_size=(3, 2))
    assert dpa.window_size == (3, 0)
    with pytest.raises(ValueError, match="window_size"):
        te.DotProductAttention(H, D, attn_mask_type="no_mask", window_size=(-2, 3))


def test_thd_needs_a_padding_mask_type():
    cu = torch.tensor([0, 2, 5], dtype=torch.int32)
    dpa = te.DotProductAttention(H, D, qkv_format="thd")  # TE's default mask type: causal
    with pytest.raises(ValueError, match="qkv_format 'thd' takes attn_mask_type padding"):
        dpa(*_qkv((5, H, D)), cu_seqlens_q=cu, cu_seqlens_kv=cu)


def test_a_padding_mask_type_without_a_mask_or_cu_seqlens_is_refused():
    dpa = te.DotProductAttention(H, D, attn_mask_type="padding")
    with pytest.raises(ValueError, match="needs attention_mask or cu_seqlens_q"):
        dpa(*_qkv())


def test_a_padding_mask_of_the_wrong_shape_is_refused_naming_it():
    dpa = te.DotProductAttention(H, D, attn_mask_type="padding")
    with pytest.raises(ValueError, match=r"expected a bool tensor \[batch, 1, 1, 6\]"):
        dpa(*_qkv(), attention_mask=torch.zeros(2, 6, dtype=torch.bool))


def test_mismatched_heads_are_refused_naming_the_shapes():
    dpa = te.DotProductAttention(H, D, num_gqa_groups=2)
    q, k, v = torch.randn(6, 2, 3, D), torch.randn(6, 2, 2, D), torch.randn(6, 2, 2, D)
    with pytest.raises(ValueError, match=r"query_layer \(6, 2, 3, 8\) has 3 heads, not a multiple"):
        dpa(q, k, v)


@pytest.mark.parametrize(
    "shapes,message",
    [
        # TE's example: built for 4 heads x 16 channels (2 KV groups), given 2 heads x 32.
        (
            [(5, 1, 2, 32)] * 3,
            r"query_layer of shape \(5, 1, 2, 32\), expected \(5, 1, 2, 16\): head_dim = 32, "
            r"but kv_channels = 16 \(module: num_attention_heads=4, num_gqa_groups=2, "
            r"kv_channels=16\)",
        ),
        (
            [(5, 1, 4, 16)] * 3,
            r"key_layer of shape \(5, 1, 4, 16\), expected \(5, 1, 2, 16\): 4 heads, but "
            r"num_gqa_groups = 2",
        ),
        (
            [(5, 1, 4, 16), (5, 1, 2, 16), (5, 1, 2, 8)],
            r"value_layer of shape \(5, 1, 2, 8\), expected \(5, 1, 2, 16\): head_dim = 8, "
            r"but kv_channels = 16",
        ),
        (
            [(5, 1, 4, 16), (5, 1, 2, 16), (5, 2, 2, 16)],
            r"key_layer \(5, 1, 2, 16\) and value_layer \(5, 2, 2, 16\) must have the same",
        ),
        ([(5, 1, 4, 16), (5, 1, 2, 16), (5, 1, 2)], r"4-D .* value_layer has shape \(5, 1, 2\)"),
    ],
)
def test_layers_contradicting_the_configuration_are_refused_naming_both_shapes(shapes, message):
    """TE asserts the key/value heads and each head dim against the module's
    num_gqa_groups and kv_channels; the softmax scale comes from kv_channels, so a call
    with other head dims would run with the wrong scale."""
    dpa = te.DotProductAttention(4, 16, num_gqa_groups=2, attn_mask_type="no_mask")
    with pytest.raises(ValueError, match=message):
        dpa(*(torch.randn(s) for s in shapes))


def test_the_value_head_dim_is_checked_against_kv_channels_pair():
    dpa = te.DotProductAttention(H, (D, 6), qkv_format="bshd")
    q = k = torch.randn(2, 5, H, D)
    with pytest.raises(ValueError, match=r"value_layer .* head_dim = 8, but kv_channels\[1\] = 6"):
        dpa(q, k, torch.randn(2, 5, H, D))


@pytest.mark.parametrize(
    "make,name",
    [
        (lambda: te.DotProductAttention(0, D), "num_attention_heads=0"),
        (lambda: te.DotProductAttention(H, 0), "kv_channels=0"),
        (lambda: te.DotProductAttention(H, (D, 0)), r"kv_channels\[1\]=0"),
        (lambda: te.DotProductAttention(H, D, num_gqa_groups=0), "num_gqa_groups=0"),
        (lambda: te.MultiheadAttention(32, 0), "num_attention_heads=0"),
        (lambda: te.MultiheadAttention(32, H, num_gqa_groups=0), "num_gqa_groups=0"),
        (lambda: te.MultiheadAttention(2, H), r"hidden_size // num_attention_heads=0"),
        (lambda: te.TransformerLayer(32, 64, 0), "TransformerLayer: num_attention_heads=0"),
        (lambda: te.TransformerLayer(32, 64, H, num_gqa_groups=0), "num_gqa_groups=0"),
    ],
)
def test_zero_heads_or_channels_are_refused_naming_the_argument(make, name):
    with pytest.raises(ValueError, match=f"{name}, expected a positive integer"):
        make()


def test_state_dict_holds_tes_extra_state_and_loads_without_it():
    dpa = te.DotProductAttention(H, D)
    assert list(dpa.state_dict()) == ["_extra_state"]
    parent = torch.nn.Module()
    parent.core_attention = dpa
    parent.load_state_dict({}, strict=True)  # an older TE checkpoint has no such key


def _support(**over):
    config = dict(
        device=torch.device("cuda"),
        dtype=torch.bfloat16,
        head_dim=64,
        head_dim_v=64,
        qkv_format="bshd",
        attn_mask_type="causal",
        window_size=(-1, 0),
        bottom_right_diagonal=False,
        same_seqlens=True,
        attn_bias_type="no_bias",
        bias_requires_grad=False,
        softcap=0.0,
        dropout=False,
    )
    config.update(over)
    return backend_support(**config)


def test_every_backend_serves_plain_causal_bf16():
    assert _support() == dict.fromkeys(("unfused", "flash", "cudnn", "efficient"))


@pytest.mark.parametrize(
    "over,served",
    [
        (dict(dropout=True), {"unfused"}),
        (dict(softcap=5.0), {"unfused"}),
        (dict(qkv_format="thd", attn_mask_type="padding"), {"unfused"}),
        (dict(dtype=torch.float32), {"unfused", "efficient"}),
        (dict(window_size=(8, 0)), {"unfused", "efficient"}),
        (dict(attn_bias_type="alibi"), {"unfused", "efficient"}),
        (dict(attn_bias_type="post_scale_bias", bias_requires_grad=True), {"unfused"}),
        (dict(attn_mask_type="padding_causal"), {"unfused"}),
        (dict(attn_mask_type="causal_bottom_right", same_seqlens=False), {"unfused", "efficient"}),
        (dict(head_dim=192, head_dim_v=192), {"unfused", "flash", "efficient"}),
        (dict(device=torch.device("cpu")), {"unfused"}),
    ],
)
def test_backend_support_follows_what_each_kernel_can_do(over, served):
    assert {b for b, why in _support(**over).items() if why is None} == served


def test_the_cpu_runs_the_unfused_backend():
    assert select_backend(_support(device=torch.device("cpu")), torch.device("cpu")) == "unfused"


def test_nvte_unfused_attn_0_leaves_no_backend_on_the_cpu(monkeypatch):
    monkeypatch.setenv("NVTE_UNFUSED_ATTN", "0")
    with pytest.raises(RuntimeError, match="unfused: disabled by the environment"):
        te.DotProductAttention(H, D)(*_qkv())


def test_forward_mask_type_keeps_the_constructors_window_as_te_does():
    q, k, v = _qkv()
    windowed = te.DotProductAttention(H, D, window_size=(2, 0))
    assert torch.equal(windowed(q, k, v, attn_mask_type="causal"), windowed(q, k, v))
    assert not torch.equal(windowed(q, k, v), te.DotProductAttention(H, D)(q, k, v))


def test_torch_autocast_casts_the_inputs_and_keeps_the_math_in_fp32():
    q, k, v = _qkv()
    dpa = te.DotProductAttention(H, D)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = dpa(q, k, v)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, dpa(*(t.bfloat16() for t in (q, k, v))))


def _cu(*values):
    return torch.tensor(values, dtype=torch.int32)


THD_VALUES = {
    # max_seqlen below the longest sequence: thd would read 5 of its 7 tokens.
    "short-max_seqlen": (
        dict(cu_seqlens_q=_cu(0, 3, 10), max_seqlen_q=5),
        r"max_seqlen_q: 5, but cu_seqlens_q \[0, 3, 10\] holds a sequence of 7 tokens",
    ),
    "short-max_seqlen_kv": (
        dict(cu_seqlens_kv=_cu(0, 8, 10), max_seqlen_kv=7),
        r"max_seqlen_kv: 7, but cu_seqlens_kv \[0, 8, 10\] holds a sequence of 8 tokens",
    ),
    "decreasing": (
        dict(cu_seqlens_q=_cu(0, 6, 3)),
        r"cu_seqlens_q: \[0, 6, 3\]; cumulative sequence lengths start at 0 and never decrease",
    ),
    "non-zero-start": (
        dict(cu_seqlens_kv=_cu(2, 5, 9)),
        r"cu_seqlens_kv: \[2, 5, 9\]; cumulative sequence lengths start at 0",
    ),
    "past-the-tokens": (
        dict(cu_seqlens_q=_cu(0, 5, 12)),
        r"cu_seqlens_q: \[0, 5, 12\] ends past the query layer's 10 tokens \(thd \(10, 4, 8\)\)",
    ),
    "padded-too-small": (
        dict(cu_seqlens_q_padded=_cu(0, 4, 10)),
        r"cu_seqlens_q_padded: \[0, 4, 10\]; padded starts from 0 with room for each "
        r"sequence's cu_seqlens_q length \(\[5, 5\]\)",
    ),
    "padded-past-the-tokens": (
        dict(cu_seqlens_kv_padded=_cu(0, 6, 11)),
        r"cu_seqlens_kv_padded: \[0, 6, 11\]; .* within the key layer's 10 tokens",
    ),
}


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "aot_eager"])
@pytest.mark.parametrize("case", list(THD_VALUES))
def test_thd_cu_seqlens_and_max_seqlen_the_kernel_cannot_honour_are_refused(case, compiled):
    """No silent truncation, no internal IndexError: each value is checked where the
    kernel reads it (on the CPU eagerly and in a compiled graph alike)."""
    given, message = THD_VALUES[case]
    dpa = te.DotProductAttention(H, D, qkv_format="thd", attn_mask_type="padding")
    run = torch.compile(dpa, backend="aot_eager", fullgraph=True) if compiled else dpa
    kw = dict(cu_seqlens_q=_cu(0, 5, 10), cu_seqlens_kv=_cu(0, 5, 10))
    kw.update(max_seqlen_q=8, max_seqlen_kv=8)
    kw.update(given)
    q = torch.randn(10, H, D)
    with pytest.raises(ValueError, match=message):
        run(q, q, q, **kw)


def test_thd_accepts_what_the_checks_allow():
    """Padded starts with gaps and room to spare, max_seqlen above the longest sequence,
    cu_seqlens ending before the last token."""
    dpa = te.DotProductAttention(H, D, qkv_format="thd", attn_mask_type="padding")
    q = torch.randn(10, H, D)
    out = dpa(
        q,
        q,
        q,
        cu_seqlens_q=_cu(0, 3, 7),
        cu_seqlens_kv=_cu(0, 3, 7),
        cu_seqlens_q_padded=_cu(0, 5, 10),
        cu_seqlens_kv_padded=_cu(0, 5, 10),
        max_seqlen_q=9,
        max_seqlen_kv=9,
    )
    assert out.shape == (10, H * D)


@pytest.mark.parametrize("fmt", ["sbhd", "bshd"])
def test_padding_cu_seqlens_longer_than_the_layers_are_refused(fmt):
    dpa = te.DotProductAttention(H, D, qkv_format=fmt, attn_mask_type="padding")
    q = torch.randn(*((6, 2) if fmt == "sbhd" else (2, 6)), H, D)
    with pytest.raises(ValueError, match=r"cu_seqlens_q: \[0, 7, 9\] holds a sequence longer"):
        dpa(q, q, q, cu_seqlens_q=_cu(0, 7, 9), cu_seqlens_kv=_cu(0, 6, 9))
