"""``te.InferenceParams``: incremental decoding through ``TransformerLayer`` with the KV
cache (paged and not) equals recomputing each whole sequence, compiled decode steps
equal eager ones in one graph, and (on CUDA) the step replays under CUDA graphs."""

from __future__ import annotations

from collections import OrderedDict

import pytest
import torch
from module_cases import graph_breaks, unique_graphs
from transformer_cases import HEADS, HIDDEN, make_layer

import transformer_engine_ops as te

GROUPS, D, MAX_LEN = 2, HIDDEN // HEADS, 16


def _params(
    paged: bool, batch: int = 3, dtype: torch.dtype = torch.float32, **kw
) -> te.InferenceParams:
    extra = dict(is_paged=True, page_size=4, total_num_pages=batch * MAX_LEN // 4) if paged else {}
    return te.InferenceParams(batch, MAX_LEN, GROUPS, D, dtype, qkv_format="bshd", **extra, **kw)


def _layer(dtype: torch.dtype = torch.float32) -> te.TransformerLayer:
    return make_layer(seed=21, dtype=dtype, num_gqa_groups=GROUPS, attn_input_format="bshd").eval()


def _full(layer: te.TransformerLayer, tokens: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """The layer on one whole sequence ``[1, s, h]``, no cache (causal)."""
    return layer(tokens, rotary_pos_emb=freqs[: tokens.shape[1]])


@pytest.mark.parametrize("paged", [False, True])
def test_prefill_then_decode_equals_recomputing_each_sequence(paged: bool) -> None:
    layer = _layer()
    freqs = te.RotaryPositionEmbedding(D)(MAX_LEN)
    params = _params(paged)
    gen = torch.Generator().manual_seed(22)
    lengths = [5, 3]
    seqs = [torch.randn(1, n, HIDDEN, generator=gen) for n in lengths]
    prompt = torch.zeros(2, 5, HIDDEN)
    for i, s in enumerate(seqs):
        prompt[i, : s.shape[1]] = s[0]
    with torch.no_grad():
        params.pre_step(OrderedDict(zip(("a", "b"), lengths, strict=True)))
        out = layer(prompt, rotary_pos_emb=freqs, inference_params=params)
        for i, s in enumerate(seqs):
            torch.testing.assert_close(
                out[i, : s.shape[1]], _full(layer, s, freqs)[0], rtol=1e-5, atol=1e-5
            )
        for _ in range(3):
            new = torch.randn(2, 1, HIDDEN, generator=gen)
            params.pre_step(OrderedDict([("a", 1), ("b", 1)]))
            out = layer(new, rotary_pos_emb=freqs, inference_params=params)
            for i in range(2):
                seqs[i] = torch.cat([seqs[i], new[i : i + 1]], dim=1)
                want = _full(layer, seqs[i], freqs)[0, -1]
                torch.testing.assert_close(out[i, 0], want, rtol=1e-5, atol=1e-5)


def test_a_finished_sequence_frees_its_pages_for_a_new_one() -> None:
    layer = _layer()
    freqs = te.RotaryPositionEmbedding(D)(MAX_LEN)
    params = _params(paged=True, batch=2)
    gen = torch.Generator().manual_seed(23)
    with torch.no_grad():
        params.pre_step(OrderedDict([("a", 8), ("b", 8)]))
        layer(
            torch.randn(2, 8, HIDDEN, generator=gen), rotary_pos_emb=freqs, inference_params=params
        )
        assert len(params._free) == params.total_num_pages - 4
        fresh = torch.randn(1, 6, HIDDEN, generator=gen)
        params.pre_step(OrderedDict([("c", 6)]))  # a and b finished
        out = layer(fresh, rotary_pos_emb=freqs, inference_params=params)
    torch.testing.assert_close(out, _full(layer, fresh, freqs), rtol=1e-5, atol=1e-5)
    assert len(params._pages["c"]) == 2


def test_pre_step_refuses_what_does_not_fit() -> None:
    params = _params(paged=False, batch=1)
    with pytest.raises(ValueError, match="max_batch_size"):
        params.pre_step(OrderedDict([("a", 1), ("b", 1)]))
    with pytest.raises(ValueError, match="max_sequence_length"):
        params.pre_step(OrderedDict([("a", MAX_LEN + 1)]))
    with pytest.raises(ValueError, match="total_num_pages"):
        te.InferenceParams(
            2, MAX_LEN, GROUPS, D, torch.float32, is_paged=True, page_size=4, total_num_pages=3
        )
    with pytest.raises(NotImplementedError, match="thd"):
        te.InferenceParams(2, MAX_LEN, GROUPS, D, torch.float32, qkv_format="thd", max_ctx_len=4)


def _decode_run(layer, params, freqs, steps, compiled) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(24)
    outs = []
    with torch.no_grad():
        params.pre_step(OrderedDict([("a", 4), ("b", 4)]))
        outs.append(
            layer(
                torch.randn(2, 4, HIDDEN, generator=gen).to(params.device, params.dtype),
                rotary_pos_emb=freqs,
                inference_params=params,
            )
        )
        for _ in range(steps):
            params.pre_step(OrderedDict([("a", 1), ("b", 1)]))
            token = torch.randn(2, 1, HIDDEN, generator=gen).to(params.device, params.dtype)
            outs.append(compiled(token, rotary_pos_emb=freqs, inference_params=params).clone())
    return outs


@pytest.mark.slow
@pytest.mark.parametrize("paged", [False, True])
def test_compiled_decode_step_equals_eager_in_one_graph(paged: bool) -> None:
    layer = _layer(torch.bfloat16)
    freqs = te.RotaryPositionEmbedding(D)(MAX_LEN)
    eager = _decode_run(layer, _params(paged, dtype=torch.bfloat16), freqs, 4, layer)
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    got = _decode_run(layer, _params(paged, dtype=torch.bfloat16), freqs, 4, compiled)
    for a, b in zip(got, eager, strict=True):
        assert torch.equal(a, b)
    assert graph_breaks() == 0
    assert unique_graphs() == 1  # the growing lengths are tensors: no recompile


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("paged", [False, True])
def test_decode_step_runs_under_cuda_graphs(paged: bool) -> None:
    """The decode step compiled with mode="reduce-overhead" (CUDA graphs) replays
    without a CUDA-graph skip, equals the same compile without CUDA graphs bit for bit
    (Inductor may fuse the non-op parts, RoPE and the cache update, differently from
    eager, so eager is compared within bf16's rounding)."""
    from torch._dynamo.utils import counters

    with torch.device("cuda"):
        layer = _layer(torch.bfloat16)
        freqs = te.RotaryPositionEmbedding(D)(MAX_LEN)
    eager = _decode_run(layer, _params(paged, dtype=torch.bfloat16, device="cuda"), freqs, 6, layer)
    plain = torch.compile(layer, fullgraph=True)
    reference = _decode_run(
        layer, _params(paged, dtype=torch.bfloat16, device="cuda"), freqs, 6, plain
    )
    torch._dynamo.reset()
    graphed = torch.compile(layer, fullgraph=True, mode="reduce-overhead")
    got = _decode_run(layer, _params(paged, dtype=torch.bfloat16, device="cuda"), freqs, 6, graphed)
    assert counters["inductor"]["cudagraph_skips"] == 0
    for a, b, c in zip(got, reference, eager, strict=True):
        assert torch.equal(a, b)
        torch.testing.assert_close(a, c, rtol=2e-2, atol=2e-2)


def test_cross_attention_with_a_cache_is_refused_by_name() -> None:
    layer = make_layer(seed=25, layer_type="decoder", attn_input_format="bshd")
    params = te.InferenceParams(1, MAX_LEN, HEADS, D, torch.float32, qkv_format="bshd")
    params.pre_step(OrderedDict([("a", 2)]))
    with pytest.raises(NotImplementedError, match="cross"):
        layer(
            torch.randn(1, 2, HIDDEN),
            encoder_output=torch.randn(1, 3, HIDDEN),
            inference_params=params,
        )
