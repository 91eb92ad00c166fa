"""``te.InferenceParams``: incremental decoding through ``TransformerLayer`` with the KV
cache (paged and not) equals recomputing each whole sequence, compiled decode steps
equal eager ones in one graph, and (on CUDA) the step replays under CUDA graphs."""

from __future__ import annotations

import functools
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


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_steady_decode_pre_step_never_waits_for_the_device() -> None:
    """pre_step's writes go through pinned memory without blocking: a pageable copy
    would make the host wait for the device's previous step before issuing the next.
    So do a non-paged cache's moves when a sequence finishes."""
    paged, flat = _params(paged=True, device="cuda"), _params(paged=False, device="cuda")
    flat.allocate_memory(1)
    for params in (paged, flat):
        params.pre_step(OrderedDict([("a", 1), ("b", 2)]))
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):  # b crosses a page boundary: the page table is written too
            paged.pre_step(OrderedDict([("a", 1), ("b", 1)]))
        flat.pre_step(OrderedDict([("b", 1)]))  # a finished: b's rows move to page 0
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert paged.pre_step_seqlens[:2].tolist() == [3, 4]
    assert paged.page_table[1, 1].item() != paged.trash_page
    assert flat.pre_step_seqlens[:1].tolist() == [2]


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


def _decode_against_recompute(
    layer: te.TransformerLayer, params: te.InferenceParams, schedule: list, sbhd: bool = False
) -> None:
    """Run ``schedule`` (a list of OrderedDicts seq -> new tokens, batch order) through
    the cache and check each step's outputs against the layer on each whole sequence."""
    freqs = te.RotaryPositionEmbedding(D)(MAX_LEN)
    gen = torch.Generator().manual_seed(26)
    seqs: dict = {}
    with torch.no_grad():
        for step in schedule:
            longest = max(step.values())
            tokens = torch.zeros(len(step), longest, HIDDEN)
            for i, (seq, n) in enumerate(step.items()):
                new = torch.randn(1, n, HIDDEN, generator=gen)
                tokens[i, :n] = new[0]
                seqs[seq] = torch.cat([seqs[seq], new], dim=1) if seq in seqs else new
            params.pre_step(step)
            x = tokens.transpose(0, 1) if sbhd else tokens
            out = layer(x, rotary_pos_emb=freqs, inference_params=params)
            out = out.transpose(0, 1) if sbhd else out
            for i, (seq, n) in enumerate(step.items()):
                whole = seqs[seq].transpose(0, 1) if sbhd else seqs[seq]
                want = layer(whole, rotary_pos_emb=freqs[: whole.shape[1 - sbhd]])
                want = want.transpose(0, 1) if sbhd else want
                torch.testing.assert_close(out[i, :n], want[0, -n:], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("groups", [1, HEADS])
@pytest.mark.parametrize("fmt", ["bshd", "sbhd"])
def test_decode_equals_recomputing_for_mqa_mha_and_both_formats(groups: int, fmt: str) -> None:
    """The query heads of a KV group are folded into the query's rows for attention;
    with one group (MQA) or one head per group (MHA), in either format, each token's
    output is still the whole sequence's."""
    layer = make_layer(seed=27, num_gqa_groups=groups, attn_input_format=fmt).eval()
    params = te.InferenceParams(3, MAX_LEN, groups, D, torch.float32, qkv_format=fmt)
    schedule = [OrderedDict([("a", 4), ("b", 2)])] + [OrderedDict([("a", 1), ("b", 1)])] * 2
    _decode_against_recompute(layer, params, schedule, sbhd=fmt == "sbhd")


@pytest.mark.parametrize("paged", [False, True])
def test_sequences_that_change_batch_position_keep_their_cache(paged: bool) -> None:
    """When a sequence finishes, those after it move up a batch position and a new one
    may join: the non-paged cache moves their rows with them (batch entry i owns page
    i), the paged one changes only the page table; decoding goes on as recomputing."""
    schedule = [
        OrderedDict([("a", 3), ("b", 5), ("c", 2)]),
        OrderedDict([("a", 1), ("b", 1), ("c", 1)]),
        OrderedDict([("b", 1), ("c", 1)]),  # a finished: b and c move up
        OrderedDict([("c", 1), ("d", 4), ("b", 1)]),  # d joins between them
        OrderedDict([("c", 1), ("d", 1), ("b", 1)]),
    ]
    _decode_against_recompute(_layer(), _params(paged), schedule)


def test_decode_with_a_sliding_window_equals_recomputing() -> None:
    layer = make_layer(
        seed=28, num_gqa_groups=GROUPS, attn_input_format="bshd", window_size=(3, 0)
    ).eval()
    schedule = [OrderedDict([("a", 6), ("b", 3)])] + [OrderedDict([("a", 1), ("b", 1)])] * 3
    _decode_against_recompute(layer, _params(paged=True), schedule)


@pytest.mark.parametrize("paged", [False, True])
def test_decode_through_the_memory_efficient_path_equals_recomputing(paged, monkeypatch):
    """On CUDA the cache's length mask selects torch's memory-efficient SDPA kernel
    (``attn_mask_type="arbitrary"``); its mask, the folded query heads and the zeroed
    padding rows of a prefill, run on the op's CPU stand-in for it (torch's CPU flash
    kernel with the same additive mask): still the whole sequence's outputs."""
    from transformer_engine_ops.modules import attention as module_file

    monkeypatch.setattr(module_file, "select_backend", lambda reasons, device: "efficient")
    schedule = [OrderedDict([("a", 5), ("b", 2)])] + [OrderedDict([("a", 1), ("b", 1)])] * 2
    _decode_against_recompute(_layer(), _params(paged), schedule)


def test_steady_decode_pre_step_writes_only_the_cached_lengths() -> None:
    """Between two decode steps of the same sequences (no new page needed) only the
    cached lengths change: pre_step leaves the page table and the step lengths untouched (on CUDA each write
    is a copy the host would otherwise issue every step)."""
    params = _params(paged=True)
    params.pre_step(OrderedDict([("a", 1), ("b", 2)]))
    params.pre_step(OrderedDict([("a", 1), ("b", 1)]))
    versions = [t._version for t in (params.page_table, params.pre_step_seqlens, params.step_lens)]
    params.pre_step(OrderedDict([("a", 1), ("b", 1)]))
    table, pre, steps = (params.page_table, params.pre_step_seqlens, params.step_lens)
    assert [table._version, pre._version, steps._version] == [
        versions[0],
        versions[1] + 1,
        versions[2],
    ]
    assert pre[:2].tolist() == [2, 3] and steps[:3].tolist() == [1, 1, 0]


def _aten_graph(layer, params, freqs) -> torch.fx.GraphModule:
    """The decode step's ATen graph (Dynamo + AOTAutograd, no compiler)."""
    from torch._dynamo.backends.common import aot_autograd

    graphs: list = []

    def keep(gm, example_inputs):
        graphs.append(gm)
        return gm

    compiled = torch.compile(layer, fullgraph=True, backend=aot_autograd(fw_compiler=keep))
    _decode_run(layer, params, freqs, 1, compiled)
    (graph,) = graphs
    return graph


@pytest.mark.slow
@pytest.mark.parametrize("paged", [False, True])
def test_decode_step_copies_no_cache_but_the_paged_gather(paged: bool) -> None:
    """No node of the compiled decode step makes a tensor as large as the batch's
    cached keys, but the two in-place writes (functionalized, they name the whole cache)
    and, for a paged cache, the gathers of each sequence's pages (keys and values):
    a non-paged cache is read where it lies (views); attention gets as many query heads
    as key heads, so no kernel repeats the keys per query head."""
    layer = _layer(torch.bfloat16)
    params = _params(paged, dtype=torch.bfloat16)
    graph = _aten_graph(layer, params, te.RotaryPositionEmbedding(D)(MAX_LEN))
    cache_shape = tuple(params.cache[layer.self_attention.layer_number][0].shape)
    reads = {
        node
        for node in graph.graph.nodes
        if node.op == "placeholder" and tuple(node.meta["val"].shape) == cache_shape
    }
    assert len(reads) == 2  # the keys' and the values' caches
    for node in graph.graph.nodes:  # every node computed from a cache, in graph order
        if any(arg in reads for arg in node.all_input_nodes):
            reads.add(node)
    one_layer = 2 * MAX_LEN * GROUPS * D  # the two sequences' keys
    large = sorted(
        str(node.target)
        for node in reads
        if node.op == "call_function"
        and isinstance(node.meta.get("val"), torch.Tensor)
        and node.meta["val"].numel() >= one_layer
        and node.target not in (torch.ops.aten.slice.Tensor, torch.ops.aten.view.default)
    )
    gathers = ["aten.index.Tensor"] * 2 if paged else []
    assert large == sorted(["aten.index_put.default"] * 2 + gathers), large
    (attention,) = [n for n in reads if "dot_product_attention" in str(n.target)]
    query, keys = (attention.args[i].meta["val"] for i in (0, 1))  # the q and k slots
    assert query.shape[2] == keys.shape[2] == GROUPS  # heads folded: no repeat of the keys


def test_attention_biases_with_a_cache_are_refused_by_name() -> None:
    layer = _layer()
    params = _params(paged=False)
    params.pre_step(OrderedDict([("a", 2)]))
    with pytest.raises(NotImplementedError, match="core_attention_bias_type='alibi'"):
        layer(
            torch.randn(1, 2, HIDDEN),
            inference_params=params,
            core_attention_bias_type="alibi",
        )


def _prefilled(paged: bool = False) -> tuple[te.TransformerLayer, te.InferenceParams, torch.Tensor]:
    """A layer and a cache holding two sequences of 4 tokens (one forward after pre_step)."""
    layer = _layer()
    freqs = te.RotaryPositionEmbedding(D)(MAX_LEN)
    params = _params(paged)
    params.pre_step(OrderedDict([("a", 4), ("b", 4)]))
    with torch.no_grad():
        layer(torch.randn(2, 4, HIDDEN), rotary_pos_emb=freqs, inference_params=params)
    return layer, params, freqs


# name -> (what happens before the forward, its input [b, s, hidden], the error)
MISUSES = {
    "no-pre_step": (
        lambda p: p.reset(),
        (2, 1),
        r"InferenceParams.step \(layer_number=1\): no sequences declared \(bshd keys "
        r"\(2, 1, 2, 16\), .*call pre_step",
    ),
    "forward-again-without-pre_step": (
        lambda p: None,
        (2, 1),
        r"layer_number=1\): this layer already wrote this step's keys and values; call "
        "pre_step before each forward",
    ),
    "batch-larger-than-declared": (
        lambda p: p.pre_step(OrderedDict([("a", 1)])),
        (2, 1),
        r"bshd keys \(2, 1, 2, 16\), values \(2, 1, 2, 16\) hold a batch of 2, but pre_step "
        "declared a batch of 1",
    ),
    "fewer-tokens-than-declared": (
        lambda p: p.pre_step(OrderedDict([("a", 3), ("b", 1)])),
        (2, 2),
        r"hold 2 tokens per sequence, but pre_step declared 3 new tokens for a sequence",
    ),
}


@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("misuse", list(MISUSES))
def test_a_forward_the_last_pre_step_did_not_declare_is_refused(misuse, paged):
    """Each ran silently: no pre_step (or a second forward after one) wrote over the
    cache at stale positions, a batch entry pre_step did not declare wrote nothing and
    read zeros, and fewer tokens than declared left cache rows that the mask reads
    unwritten."""
    layer, params, freqs = _prefilled(paged)
    before, shape, message = MISUSES[misuse]
    before(params)
    with pytest.raises(ValueError, match=message), torch.no_grad():
        layer(torch.randn(*shape, HIDDEN), rotary_pos_emb=freqs, inference_params=params)


@pytest.mark.slow
@pytest.mark.parametrize("misuse", list(MISUSES))
def test_a_compiled_forward_the_last_pre_step_did_not_declare_is_refused(misuse):
    """The same checks under torch.compile(fullgraph=True): sizes and host counts, so
    they are guards (the decode steps before share one graph), and the error carries
    the message."""
    layer, params, freqs = _prefilled()
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        for _ in range(2):
            params.pre_step(OrderedDict([("a", 1), ("b", 1)]))
            compiled(torch.randn(2, 1, HIDDEN), rotary_pos_emb=freqs, inference_params=params)
        assert unique_graphs() == 1
        before, shape, message = MISUSES[misuse]
        before(params)
        with pytest.raises(Exception, match=message):
            compiled(torch.randn(*shape, HIDDEN), rotary_pos_emb=freqs, inference_params=params)


@pytest.mark.parametrize(
    "cache,message",
    [
        (
            dict(num_heads_kv=4),
            r"InferenceParams.step \(layer_number=1\): bshd keys of shape \(1, 2, 2, 16\), "
            r"expected \[\.\.\., 4, 16\] \(the cache's num_heads_kv=4, head_dim_k=16\)",
        ),
        (dict(head_dim_k=8), r"keys of shape \(1, 2, 2, 16\), expected \[\.\.\., 2, 8\]"),
        (dict(head_dim_v=8), r"values of shape \(1, 2, 2, 16\), .* head_dim_v=8\)"),
    ],
)
def test_a_cache_of_other_heads_or_head_dims_is_refused_naming_it(cache, message):
    """Was a bare index_put_ shape error that named neither the cache nor the layer."""
    layer = _layer()
    kw = dict(num_heads_kv=GROUPS, head_dim_k=D) | cache
    params = te.InferenceParams(1, MAX_LEN, dtype=torch.float32, qkv_format="bshd", **kw)
    params.pre_step(OrderedDict([("a", 2)]))
    with pytest.raises(ValueError, match=message), torch.no_grad():
        layer(torch.randn(1, 2, HIDDEN), inference_params=params)


# --- DotProductAttention's own KV-cache step (TE's inference_params argument) ----------


def _dpa(fmt: str = "bshd", mask: str = "padding_causal") -> te.DotProductAttention:
    return te.DotProductAttention(
        HEADS, D, num_gqa_groups=GROUPS, qkv_format=fmt, attn_mask_type=mask, layer_number=1
    ).eval()


def _dpa_steps(fmt: str, schedule: list[int], batch: int = 2) -> list[list[torch.Tensor]]:
    """Each step's q, k, v of ``batch`` sequences of ``n`` new tokens, in ``fmt``."""
    gen = torch.Generator().manual_seed(40)
    steps = []
    for n in schedule:
        qkv = [torch.randn(batch, n, heads, D, generator=gen) for heads in (HEADS, GROUPS, GROUPS)]
        steps.append([t.transpose(0, 1) if fmt == "sbhd" else t for t in qkv])
    return steps


def _dpa_generate(fn: object, steps: list, fmt: str, paged: bool = False) -> list[torch.Tensor]:
    params = te.InferenceParams(
        2, MAX_LEN, GROUPS, D, torch.float32, qkv_format=fmt,
        **(dict(is_paged=True, page_size=4, total_num_pages=2 * MAX_LEN // 4) if paged else {}),
    )  # fmt: skip
    params.allocate_memory(1)  # as TE's tests do; an eager first step would do it too
    outs = []
    with torch.no_grad():
        for q, k, v in steps:
            n = q.shape[0 if fmt == "sbhd" else 1]
            params.pre_step(OrderedDict((i, n) for i in range(2)))
            outs.append(fn(q, k, v, inference_params=params).clone())
    return outs


@pytest.mark.parametrize("paged", [False, True], ids=["non_paged", "paged"])
@pytest.mark.parametrize("fmt", ["bshd", "sbhd"])
@pytest.mark.parametrize("mask", ["padding_causal", "padding_causal_bottom_right", "padding"])
def test_dpa_kv_cache_decode_equals_attention_over_the_whole_sequence(mask, fmt, paged):
    """TE's ``DotProductAttention(inference_params=...)``: a prefill and three one-token
    steps, each step's output that of the step's queries attending over every key of
    their sequence so far (causal aligned to the sequence's end, as TE turns
    ``padding_causal`` into ``padding_causal_bottom_right``), in the query's format."""
    dpa = _dpa(fmt, mask)
    steps = _dpa_steps(fmt, [4, 1, 1, 1])
    outs = _dpa_generate(dpa, steps, fmt, paged)
    seq = 0 if fmt == "sbhd" else 1
    whole = te.DotProductAttention(HEADS, D, num_gqa_groups=GROUPS, qkv_format=fmt).eval()
    full_mask = "no_mask" if mask == "padding" else "causal_bottom_right"
    for i, (q, _, _) in enumerate(steps):
        keys, values = (torch.cat([s[j] for s in steps[: i + 1]], dim=seq) for j in (1, 2))
        want = whole(q, keys, values, attn_mask_type=full_mask)
        assert outs[i].shape == want.shape
        torch.testing.assert_close(outs[i], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("via", ["DotProductAttention", "MultiheadAttention"])
def test_kv_cache_step_passes_checkpoint_core_attention_to_the_op(via, monkeypatch):
    """``checkpoint_core_attention=True`` with a cache: the step's attention op keeps
    only its inputs (its ``checkpoint`` field), and computes the same output."""
    from transformer_engine_ops.modules import attention as module_file

    seen: list[bool] = []
    call = module_file.call_dot_product_attention

    def spy(**fields):
        seen.append(fields["checkpoint"])
        return call(**fields)

    monkeypatch.setattr(module_file, "call_dot_product_attention", spy)
    if via == "DotProductAttention":
        fn, steps = _dpa(), _dpa_steps("bshd", [3, 1])
    else:
        mha = te.MultiheadAttention(
            HEADS * D, HEADS, num_gqa_groups=GROUPS, qkv_format="bshd", layer_number=1,
            attn_mask_type="causal", device="cpu",
        ).eval()  # fmt: skip
        gen = torch.Generator().manual_seed(41)
        steps = [[torch.randn(2, n, HEADS * D, generator=gen)] * 3 for n in (3, 1)]

        def fn(x, _k, _v, **kw):
            return mha(x, **kw)

    plain = _dpa_generate(fn, steps, "bshd")
    assert seen == [False, False]
    kept = _dpa_generate(functools.partial(fn, checkpoint_core_attention=True), steps, "bshd")
    assert seen == [False, False, True, True]
    for a, b in zip(plain, kept, strict=True):
        assert torch.equal(a, b)


@pytest.mark.slow
def test_dpa_compiled_kv_cache_decoding_equals_eager():
    """TE's ``test_dpa_torch_compile_kv_cache_decoding``: every step of a compiled
    (``fullgraph``) generation equals eager's, with a cache of its own each."""
    dpa = _dpa(mask="padding_causal_bottom_right")
    steps = _dpa_steps("bshd", [4, 1, 1, 1])
    eager = _dpa_generate(dpa, steps, "bshd")
    compiled = _dpa_generate(torch.compile(dpa, fullgraph=True), steps, "bshd")
    for got, want in zip(compiled, eager, strict=True):
        assert torch.equal(got, want)
    assert graph_breaks() == 0
    params = te.InferenceParams(2, MAX_LEN, GROUPS, D, torch.float32, qkv_format="bshd")
    params.pre_step(OrderedDict((i, 4) for i in range(2)))
    # Dynamo reports the refusal raised while tracing as its Unsupported (a RuntimeError).
    with pytest.raises(RuntimeError, match=r"call inference_params.allocate_memory\(1\)"):
        torch.compile(dpa, fullgraph=True)(*steps[0], inference_params=params)


def test_dpa_kv_cache_refuses_what_te_refuses_or_we_do_not_implement():
    params = te.InferenceParams(2, MAX_LEN, GROUPS, D, torch.float32, qkv_format="bshd")
    params.pre_step(OrderedDict((i, 2) for i in range(2)))
    q, k, v = _dpa_steps("bshd", [2])[0]
    with pytest.raises(ValueError, match="KV caching requires padding mask"):
        _dpa(mask="causal")(q, k, v, inference_params=params)
    with pytest.raises(NotImplementedError, match="core_attention_bias_type='alibi'"):
        _dpa()(q, k, v, inference_params=params, core_attention_bias_type="alibi")
    thd = _dpa("thd", "padding_causal")
    cu = torch.tensor([0, 2, 4], dtype=torch.int32)
    with pytest.raises(NotImplementedError, match="qkv_format='thd'"):
        thd(q.reshape(4, HEADS, D), k.reshape(4, GROUPS, D), v.reshape(4, GROUPS, D),
            cu_seqlens_q=cu, cu_seqlens_kv=cu, inference_params=params)  # fmt: skip
