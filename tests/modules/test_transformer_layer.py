"""``te.TransformerLayer``: TE 2.20.2's state-dict keys and layouts, the plain-PyTorch
block computed from its own state dict (fp32 forward and gradients), compiled
``fullgraph=True`` equal to eager bit for bit for bf16 and every recipe, and one graph
over several sequence lengths."""

from __future__ import annotations

import pytest
import torch
from inductor_widths import SCALAR, inductor_width, width_params
from module_cases import QUANTIZED, graph_breaks, recipe_context, unique_graphs
from transformer_cases import FFN, HEADS, HIDDEN, layer_step, make_layer, reference_step

import transformer_engine_ops as te

# --- TE 2.20.2's state-dict keys ------------------------------------------------------
# Read from TE 2.20.2's wheel (transformer_engine/pytorch/...):
#  transformer.py, TransformerLayer.__init__: children self_attention (MultiheadAttention),
#    inter_attention (layer_type="decoder"), layernorm_mlp (LayerNormMLP), then layernorm
#    (output_layernorm=True), in that order.
#  attention/multi_head_attention.py, MultiheadAttention.__init__: q_norm/k_norm first
#    (_create_qk_norm_modules), then layernorm_qkv (self, input_layernorm; LayerNormLinear)
#    or qkv (Linear) or, for cross attention, layernorm_query + key_value; with
#    fuse_qkv_params=False they get parameters_split ("query", "key", "value") / ("query",)
#    / ("key", "value"); then core_attention (DotProductAttention), then proj (Linear).
#  module/layernorm_linear.py ~1452-1565: layer_norm_weight, layer_norm_bias (not for
#    RMSNorm), then every "{part}_weight" of parameters_split (or "weight"), then every
#    "{part}_bias" (or "bias"); bias=False registers no bias.
#  module/linear.py ~2214-2229: the same weights-then-biases order, without a norm.
#  module/layernorm_mlp.py ~2089-2149: layer_norm_weight, layer_norm_bias, fc1_weight,
#    fc1_bias, fc2_weight, fc2_bias.
#  Every TransformerEngineBaseModule (LayerNormLinear, Linear, LayerNormMLP and
#    attention/dot_product_attention/dot_product_attention.py:594 DotProductAttention, whose
#    backend submodules hold no state) adds "_extra_state"; so does te.RMSNorm/te.LayerNorm
#    (ops/op.py:632, BasicOperation.get_extra_state), after their "weight" (and "bias").
# torch's state_dict lists a module's parameters, then its _extra_state, then its children.

_QKV_UNFUSED = [
    "self_attention.layernorm_qkv.layer_norm_weight",
    "self_attention.layernorm_qkv.layer_norm_bias",
    "self_attention.layernorm_qkv.query_weight",
    "self_attention.layernorm_qkv.key_weight",
    "self_attention.layernorm_qkv.value_weight",
    "self_attention.layernorm_qkv.query_bias",
    "self_attention.layernorm_qkv.key_bias",
    "self_attention.layernorm_qkv.value_bias",
    "self_attention.layernorm_qkv._extra_state",
]
_ATTN_TAIL = [
    "self_attention.core_attention._extra_state",
    "self_attention.proj.weight",
    "self_attention.proj.bias",
    "self_attention.proj._extra_state",
]
_MLP = [
    "layernorm_mlp.layer_norm_weight",
    "layernorm_mlp.layer_norm_bias",
    "layernorm_mlp.fc1_weight",
    "layernorm_mlp.fc1_bias",
    "layernorm_mlp.fc2_weight",
    "layernorm_mlp.fc2_bias",
    "layernorm_mlp._extra_state",
]
EXPECTED_KEYS = {
    # TransformerLayer(64, 128, 4): TE's defaults (fuse_qkv_params=False, LayerNorm, bias).
    "default": _QKV_UNFUSED + _ATTN_TAIL + _MLP,
    "fused": [
        "self_attention.layernorm_qkv.layer_norm_weight",
        "self_attention.layernorm_qkv.layer_norm_bias",
        "self_attention.layernorm_qkv.weight",
        "self_attention.layernorm_qkv.bias",
        "self_attention.layernorm_qkv._extra_state",
        *_ATTN_TAIL,
        *_MLP,
    ],
    # RMSNorm: no layer_norm_bias; bias=False: no GEMM biases.
    "rmsnorm_nobias": [
        "self_attention.layernorm_qkv.layer_norm_weight",
        "self_attention.layernorm_qkv.query_weight",
        "self_attention.layernorm_qkv.key_weight",
        "self_attention.layernorm_qkv.value_weight",
        "self_attention.layernorm_qkv._extra_state",
        "self_attention.core_attention._extra_state",
        "self_attention.proj.weight",
        "self_attention.proj._extra_state",
        "layernorm_mlp.layer_norm_weight",
        "layernorm_mlp.fc1_weight",
        "layernorm_mlp.fc2_weight",
        "layernorm_mlp._extra_state",
    ],
    # qk_norm_type="RMSNorm": q_norm and k_norm come before the QKV projection.
    "qk_norm": [
        "self_attention.q_norm.weight",
        "self_attention.q_norm._extra_state",
        "self_attention.k_norm.weight",
        "self_attention.k_norm._extra_state",
        *_QKV_UNFUSED,
        *_ATTN_TAIL,
        *_MLP,
    ],
    # qk_norm_type="L2Normalization": one parameter-free operation under both names,
    # each with its (empty) _extra_state.
    "l2_qk_norm": [
        "self_attention.q_norm._extra_state",
        "self_attention.k_norm._extra_state",
        *_QKV_UNFUSED,
        *_ATTN_TAIL,
        *_MLP,
    ],
    # output_layernorm=True: the self attention has no input norm (qkv, a Linear) and the
    # layer ends in layernorm.
    "output_layernorm": [
        "self_attention.qkv.query_weight",
        "self_attention.qkv.key_weight",
        "self_attention.qkv.value_weight",
        "self_attention.qkv.query_bias",
        "self_attention.qkv.key_bias",
        "self_attention.qkv.value_bias",
        "self_attention.qkv._extra_state",
        *_ATTN_TAIL,
        *_MLP,
        "layernorm.weight",
        "layernorm.bias",
        "layernorm._extra_state",
    ],
    # layer_type="decoder": inter_attention (cross) after self_attention.
    "decoder": _QKV_UNFUSED
    + _ATTN_TAIL
    + [
        "inter_attention.layernorm_query.layer_norm_weight",
        "inter_attention.layernorm_query.layer_norm_bias",
        "inter_attention.layernorm_query.query_weight",
        "inter_attention.layernorm_query.query_bias",
        "inter_attention.layernorm_query._extra_state",
        "inter_attention.key_value.key_weight",
        "inter_attention.key_value.value_weight",
        "inter_attention.key_value.key_bias",
        "inter_attention.key_value.value_bias",
        "inter_attention.key_value._extra_state",
        "inter_attention.core_attention._extra_state",
        "inter_attention.proj.weight",
        "inter_attention.proj.bias",
        "inter_attention.proj._extra_state",
    ]
    + _MLP,
}
CONFIGS = {
    "default": {},
    "fused": {"fuse_qkv_params": True},
    "rmsnorm_nobias": {"normalization": "RMSNorm", "bias": False},
    "qk_norm": {"qk_norm_type": "RMSNorm"},
    "l2_qk_norm": {"qk_norm_type": "L2Normalization"},
    "output_layernorm": {"output_layernorm": True},
    "decoder": {"layer_type": "decoder"},
}


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_state_dict_keys_are_te_2_20_2s(config: str) -> None:
    layer = te.TransformerLayer(HIDDEN, FFN, HEADS, **CONFIGS[config])
    assert list(layer.state_dict()) == EXPECTED_KEYS[config]


def test_parameter_layouts_are_tes_with_gqa_and_swiglu() -> None:
    """TE's shapes: q rows heads*kv_channels, k and v groups*kv_channels, fc1 two halves
    of the FFN for a gated activation, fc2 (hidden, ffn)."""
    layer = te.TransformerLayer(HIDDEN, FFN, HEADS, num_gqa_groups=2, activation="swiglu")
    shapes = {k: tuple(v.shape) for k, v in layer.state_dict().items() if "extra" not in k}
    d = HIDDEN // HEADS
    assert shapes["self_attention.layernorm_qkv.query_weight"] == (HEADS * d, HIDDEN)
    assert shapes["self_attention.layernorm_qkv.key_weight"] == (2 * d, HIDDEN)
    assert shapes["self_attention.layernorm_qkv.value_weight"] == (2 * d, HIDDEN)
    assert shapes["self_attention.proj.weight"] == (HIDDEN, HEADS * d)
    assert shapes["layernorm_mlp.fc1_weight"] == (2 * FFN, HIDDEN)
    assert shapes["layernorm_mlp.fc2_weight"] == (HIDDEN, FFN)


def test_a_te_checkpoint_loads_by_name_and_computes_the_same() -> None:
    """A state dict with TE's keys (here another layer's, values drawn anew) loads
    strictly, and the layer then computes what the reference computes from it."""
    source = make_layer(seed=3)
    target = make_layer(seed=4)
    target.load_state_dict(source.state_dict(), strict=True)
    x = torch.randn(8, 2, HIDDEN)
    torch.testing.assert_close(target(x), source(x), rtol=0, atol=0)


# --- the plain PyTorch block (fp32) ---------------------------------------------------

REFERENCE_CASES = {
    "default": ({}, {}),
    "gqa_rmsnorm_swiglu": (
        {"num_gqa_groups": 2, "normalization": "RMSNorm", "activation": "swiglu"},
        {"groups": 2, "normalization": "RMSNorm", "activation": "swiglu"},
    ),
    "no_mask_nobias": ({"self_attn_mask_type": "no_mask", "bias": False}, {"causal": False}),
    "residual_post_layernorm": (
        {"apply_residual_connection_post_layernorm": True},
        {"residual_post_layernorm": True},
    ),
    "parallel_attention_mlp": (
        {"parallel_attention_mlp": True},
        {"parallel_attention_mlp": True},
    ),
}


def _assert_matches_reference(got: tuple, ref: tuple) -> None:
    out, dx, grads = got
    ref_out, ref_dx, ref_grads = ref
    scale = ref_out.abs().max().item()
    assert (out.double() - ref_out).abs().max().item() <= 1e-5 * scale
    assert (dx.double() - ref_dx).abs().max().item() <= 1e-5 * ref_dx.abs().max().item()
    assert set(grads) == set(ref_grads)
    for name, grad in grads.items():
        # A bias's scale is its weight's: the key bias's gradient is zero in exact
        # arithmetic (softmax ignores a shift shared by a row), its terms are not.
        ref_grad, scale_of = ref_grads[name], ref_grads.get(name.replace("bias", "weight"))
        bound = 1e-5 * max(ref_grad.abs().max().item(), scale_of.abs().max().item())
        assert (grad.double() - ref_grad).abs().max().item() <= bound, name


@pytest.mark.parametrize("case", sorted(REFERENCE_CASES))
def test_equals_the_plain_pytorch_block_from_its_state_dict(case: str) -> None:
    layer_kwargs, ref_kwargs = REFERENCE_CASES[case]
    layer = make_layer(seed=1, **layer_kwargs)
    x = torch.randn(12, 3, HIDDEN, generator=torch.Generator().manual_seed(2))
    got = layer_step(layer, x, weighted=True)
    _assert_matches_reference(got, reference_step(layer, x, **ref_kwargs))


def test_rotary_pos_emb_matches_the_reference() -> None:
    layer = make_layer(seed=5, num_gqa_groups=2)
    freqs = te.RotaryPositionEmbedding(HIDDEN // HEADS, rotary_percent=0.5)(12)
    x = torch.randn(12, 2, HIDDEN, generator=torch.Generator().manual_seed(6))
    got = layer_step(layer, x, weighted=True, rotary_pos_emb=freqs)
    _assert_matches_reference(got, reference_step(layer, x, groups=2, freqs=freqs))


def test_bshd_equals_sbhd_transposed() -> None:
    sbhd = make_layer(seed=7)
    bshd = make_layer(seed=7, attn_input_format="bshd")
    x = torch.randn(10, 2, HIDDEN)
    torch.testing.assert_close(bshd(x.transpose(0, 1)).transpose(0, 1), sbhd(x))


def test_fused_interleaved_qkv_computes_as_the_split_parameters() -> None:
    """``fuse_qkv_params`` with ``qkv_weight_interleaved``: the fused weight's rows are
    per KV group [its q heads, k, v]; permuting the split weights that way gives the
    same layer."""
    groups, d = 2, HIDDEN // HEADS
    split = make_layer(seed=8, num_gqa_groups=groups)
    fused = make_layer(seed=9, num_gqa_groups=groups, fuse_qkv_params=True)
    sd = split.state_dict()
    p = "self_attention.layernorm_qkv."
    rows = []
    biases = []
    per = HEADS // groups
    for g in range(groups):
        rows += [
            sd[f"{p}query_weight"].view(groups, per * d, HIDDEN)[g],
            sd[f"{p}key_weight"].view(groups, d, HIDDEN)[g],
            sd[f"{p}value_weight"].view(groups, d, HIDDEN)[g],
        ]
        biases += [
            sd[f"{p}query_bias"].view(groups, per * d)[g],
            sd[f"{p}key_bias"].view(groups, d)[g],
            sd[f"{p}value_bias"].view(groups, d)[g],
        ]
    converted = {k: v for k, v in sd.items() if not k.startswith(p) or "layer_norm" in k}
    converted[f"{p}weight"] = torch.cat(rows)
    converted[f"{p}bias"] = torch.cat(biases)
    converted[f"{p}_extra_state"] = sd[f"{p}_extra_state"]
    fused.load_state_dict(converted, strict=True)
    x = torch.randn(6, 2, HIDDEN)
    torch.testing.assert_close(fused(x), split(x), rtol=1e-6, atol=1e-6)


# --- compiled equals eager --------------------------------------------------------------


def _bitwise(a: tuple, b: tuple) -> None:
    assert torch.equal(a[0], b[0]), "output differs"
    assert torch.equal(a[1], b[1]), "input grad differs"
    for name in a[2]:
        assert torch.equal(a[2][name], b[2][name]), f"grad of {name} differs"


def _compiled_equals_eager(recipe: str, **kwargs: object) -> None:
    layer = make_layer(seed=11, dtype=torch.bfloat16, **kwargs)
    x = torch.randn(16, 2, HIDDEN, generator=torch.Generator().manual_seed(12))
    x = x.to(torch.bfloat16)
    with recipe_context(recipe):
        eager = layer_step(layer, x)
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    with recipe_context(recipe):
        got = layer_step(compiled, x)
    assert graph_breaks() == 0
    _bitwise(got, eager)


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["bf16", *QUANTIZED])
def test_compiled_equals_eager_bitwise_gqa_rmsnorm_swiglu(recipe: str) -> None:
    _compiled_equals_eager(recipe, num_gqa_groups=2, normalization="RMSNorm", activation="swiglu")


@pytest.mark.slow
def test_compiled_equals_eager_bitwise_te_defaults_bf16() -> None:
    _compiled_equals_eager("bf16")


def _seeded_step(layer: object, x: torch.Tensor, seed: int, **forward: object) -> tuple:
    """:func:`layer_step` from a fixed generator state: dropout draws the same masks."""
    torch.manual_seed(seed)
    return layer_step(layer, x, weighted=True, **forward)


def _inductor_equals_eager(dtype: torch.dtype, steps: int = 2, **kwargs: object) -> None:
    """Default Inductor (no backend or setting of ours), training mode, every step bit
    for bit: output, input gradient, every parameter gradient."""
    rope = kwargs.pop("rope", False)
    layer = make_layer(seed=21, dtype=dtype, **kwargs)
    freqs = te.RotaryPositionEmbedding(HIDDEN // HEADS)(16) if rope else None
    compiled = torch.compile(layer, fullgraph=True)
    for step in range(steps):
        x = torch.randn(16, 2, HIDDEN, generator=torch.Generator().manual_seed(step)).to(dtype)
        eager = _seeded_step(layer, x, 100 + step, rotary_pos_emb=freqs)
        got = _seeded_step(compiled, x, 100 + step, rotary_pos_emb=freqs)
        _bitwise(got, eager)
    assert graph_breaks() == 0


@pytest.mark.slow
@pytest.mark.parametrize("width", width_params())
def test_inductor_equals_eager_bitwise_te_defaults_with_dropout(width: int | None) -> None:
    """TE's defaults (bias, LayerNorm, GELU, hidden and attention dropout 0.1): the bias
    gradients are sums over the tokens, the masks random draws; both inside ops."""
    with inductor_width(width):
        _inductor_equals_eager(torch.bfloat16, hidden_dropout=0.1, attention_dropout=0.1)


@pytest.mark.slow
def test_inductor_equals_eager_bitwise_fp32_rope_gqa_drop_path() -> None:
    """fp32 with rotary embeddings (cos and sin inside the op), GQA, RMSNorm, SwiGLU and
    stochastic depth, with scalar Inductor code against ATen's vectorized kernels."""
    with inductor_width(SCALAR):
        _inductor_equals_eager(
            torch.float32,
            rope=True,
            num_gqa_groups=2,
            normalization="RMSNorm",
            activation="swiglu",
            drop_path_rate=0.1,
            hidden_dropout=0.1,
        )


@pytest.mark.slow
@pytest.mark.parametrize("before_rope", [False, True], ids=["after_rope", "before_rope"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_inductor_equals_eager_bitwise_l2_qk_norm(dtype: torch.dtype, before_rope: bool) -> None:
    """``qk_norm_type="L2Normalization"``: the sums of squares (and the backward's sums)
    are reductions inside the ``l2normalization`` op, so Inductor's scalar code keeps
    eager's bits."""
    with inductor_width(SCALAR):
        _inductor_equals_eager(
            dtype,
            rope=True,
            qk_norm_type="L2Normalization",
            qk_norm_before_rope=before_rope,
            hidden_dropout=0.0,
            attention_dropout=0.0,
        )


BF16_UNIT_ROUNDOFF = 2.0**-8


@pytest.mark.slow
def test_inductor_parallel_attention_mlp_three_way_gradient_sum_within_its_rounding() -> None:
    """``parallel_attention_mlp``: the layer input's gradient is the sum of three
    contributions (the residual's, attention's and the MLP's norm dgrads), added by
    autograd outside any op. Eager rounds to bf16 after each addition, in the order the
    engine picks; Inductor fuses the sum into one fp32 kernel and rounds once, unless
    ``emulate_precision_casts`` rounds as eager does (torch 2.13 does, 2.11 does not).
    Everything else is computed inside ops and stays bit for bit. The input gradient is
    held to the difference of two roundings against one: for ``s = fl(fl(a + b) + c)``
    and ``t = fl(a + b + c)``, ``|s - t| <= u |a + b| + 2u |a + b + c| <= 3u (|a| + |b| +
    |c|)`` element by element (u = 2^-8, bf16's unit roundoff; any order of the three),
    with the contributions read from the eager step."""
    import copy

    import torch._inductor.config as config
    from transformer_cases import cotangent

    layer = make_layer(seed=21, dtype=torch.bfloat16, parallel_attention_mlp=True)
    eager_layer = copy.deepcopy(layer)
    parts: dict[str, torch.Tensor] = {}
    for name in ("self_attention", "layernorm_mlp"):
        getattr(eager_layer, name).register_full_backward_hook(
            lambda _m, grad_in, _out, name=name: parts.__setitem__(name, grad_in[0])
        )
    with config.patch(emulate_precision_casts=True):
        compiled = torch.compile(layer, fullgraph=True)
        for step in range(2):
            x = torch.randn(16, 2, HIDDEN, generator=torch.Generator().manual_seed(step))
            x = x.to(torch.bfloat16)
            eager = _seeded_step(eager_layer, x, 100 + step)
            got = _seeded_step(compiled, x, 100 + step)
            assert torch.equal(got[0], eager[0]), "output differs"
            for name in eager[2]:
                assert torch.equal(got[2][name], eager[2][name]), f"grad of {name} differs"
            residual = cotangent(eager[0].shape).to(torch.bfloat16)
            magnitude = sum(t.float().abs() for t in (residual, *parts.values()))
            bound = (3 * BF16_UNIT_ROUNDOFF + 2.0**-15) * magnitude
            excess = (got[1].float() - eager[1].float()).abs() - bound
            assert excess.max().item() <= 0, (
                f"input grad beyond the rounding bound by {excess.max()}"
            )
            # the three contributions are the gradient: their sum is within the bound too
            total = sum(t.float() for t in (residual, *parts.values()))
            assert ((total - eager[1].float()).abs() <= bound).all()
    assert graph_breaks() == 0


@pytest.mark.slow
def test_one_graph_over_several_sequence_lengths() -> None:
    layer = make_layer(seed=13, dtype=torch.bfloat16, num_gqa_groups=2)
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager", dynamic=True)
    for seq in (8, 12, 20, 28):
        x = torch.randn(seq, 2, HIDDEN).to(torch.bfloat16)
        _bitwise(layer_step(compiled, x), layer_step(layer, x))
    assert graph_breaks() == 0
    assert unique_graphs() == 1


class _Stack(torch.nn.Module):
    """Layers whose calls are nested compile regions (docs/transformer.md, "Compiling a
    deep stack")."""

    def __init__(self, layers: list[torch.nn.Module], freqs: torch.Tensor) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(layers)
        self.freqs = freqs

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = _run_layer(layer, x, self.freqs)
        return x


@torch.compiler.nested_compile_region
def _run_layer(layer: torch.nn.Module, x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    return layer(x, rotary_pos_emb=freqs)


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["bf16", "fp8_current"])
def test_regional_compile_of_a_stack_compiles_the_layer_once(recipe: str) -> None:
    """Three layers, each call a nested compile region: one Dynamo graph calling one
    layer subgraph three times, and Inductor's result equal to eager bit for bit (output,
    input gradient, every parameter gradient), on a second step too and on a batch of
    one (a graph of its own, again one layer subgraph)."""
    from torch._inductor.compile_fx import compile_fx

    layers = [
        make_layer(31 + i, torch.bfloat16, num_gqa_groups=2, normalization="RMSNorm")
        for i in range(3)
    ]
    stack = _Stack(layers, te.RotaryPositionEmbedding(HIDDEN // HEADS)(16))
    graphs: list[torch.fx.GraphModule] = []

    def inductor(gm: torch.fx.GraphModule, inputs: list) -> object:
        graphs.append(gm)
        return compile_fx(gm, inputs)

    compiled = torch.compile(stack, fullgraph=True, backend=inductor)
    x = torch.randn(16, 2, HIDDEN, generator=torch.Generator().manual_seed(32))
    x = x.to(torch.bfloat16)
    with recipe_context(recipe):
        for batch in (x, x.flip(0), x[:, :1]):
            _bitwise(layer_step(compiled, batch), layer_step(stack, batch))
    assert graph_breaks() == 0
    assert len(graphs) == 2  # batch 2, then batch 1
    for graph in graphs:
        calls = [
            node
            for node in graph.graph.nodes
            if node.target is torch.ops.higher_order.invoke_subgraph
        ]
        assert len(calls) == len(layers)
        assert len({node.args[0].target for node in calls}) == 1, "a layer traced its own region"


# --- construction ---------------------------------------------------------------------


def test_meta_construction_then_reset_parameters() -> None:
    layer = te.TransformerLayer(HIDDEN, FFN, HEADS, num_gqa_groups=2, device="meta")
    assert all(p.device.type == "meta" for p in layer.parameters())
    layer = layer.to_empty(device="cpu")
    layer.reset_parameters()
    sd = layer.state_dict()
    assert torch.equal(sd["self_attention.layernorm_qkv.layer_norm_weight"], torch.ones(HIDDEN))
    assert torch.equal(sd["layernorm_mlp.fc1_bias"], torch.zeros(FFN))
    for key in ("query_weight", "key_weight", "value_weight"):
        weight = sd[f"self_attention.layernorm_qkv.{key}"]
        assert weight.isfinite().all() and 0.015 < weight.std().item() < 0.035, key


def test_reset_parameters_draws_split_weights_in_place() -> None:
    """The split parameters are redrawn in place (an optimizer keeps its references)."""
    layer = te.TransformerLayer(HIDDEN, FFN, HEADS)
    query = layer.self_attention.layernorm_qkv.query_weight
    before = query.detach().clone()
    layer.reset_parameters()
    assert layer.self_attention.layernorm_qkv.query_weight is query
    assert not torch.equal(query, before)


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"get_rng_state_tracker": lambda: None}, "get_rng_state_tracker"),
        ({"ub_tp_comm_overlap": True}, "ub_tp_comm_overlap"),
        ({"softmax_type": "learnable"}, "softmax_type"),
    ],
)
def test_unimplemented_arguments_raise_naming_them(kwargs: dict, named: str) -> None:
    with pytest.raises(NotImplementedError, match=named):
        te.TransformerLayer(HIDDEN, FFN, HEADS, **kwargs)


@pytest.mark.parametrize(
    ("forward", "named"),
    [
        ({"thd_attention_policies": [{}]}, "thd_attention_policies"),
    ],
)
def test_unimplemented_forward_arguments_raise_naming_them(forward: dict, named: str) -> None:
    layer = te.TransformerLayer(HIDDEN, FFN, HEADS)
    with pytest.raises(NotImplementedError, match=named):
        layer(torch.randn(4, 1, HIDDEN), **forward)


def test_bad_layer_type_and_mask_are_named() -> None:
    with pytest.raises(ValueError, match="layer_type"):
        te.TransformerLayer(HIDDEN, FFN, HEADS, layer_type="middle")
    with pytest.raises(ValueError, match="attn_mask_type"):
        te.TransformerLayer(HIDDEN, FFN, HEADS, self_attn_mask_type="diagonal")
    with pytest.raises(ValueError, match="fuse_qkv_params"):
        te.TransformerLayer(HIDDEN, FFN, HEADS, fuse_wgrad_accumulation=True)


@pytest.mark.parametrize("batch, seq", [(0, 8), (1, 1), (2, 0)])
@pytest.mark.parametrize("interleaved", [True, False])
def test_empty_and_one_token_batches(batch: int, seq: int, interleaved: bool) -> None:
    """An empty batch (or sequence) gives an empty output and zero-sized gradients; a
    single token runs as any other (fused QKV layouts both ways, GQA)."""
    layer = make_layer(
        seed=31,
        num_gqa_groups=2,
        attn_input_format="bshd",
        fuse_qkv_params=True,
        qkv_weight_interleaved=interleaved,
    )
    x = torch.randn(batch, seq, HIDDEN, requires_grad=True)
    out = layer(x)
    assert out.shape == (batch, seq, HIDDEN)
    out.sum().backward()
    assert x.grad is not None and x.grad.shape == x.shape
    assert all(p.grad is None or torch.isfinite(p.grad).all() for p in layer.parameters())
