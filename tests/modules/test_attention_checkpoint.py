"""``checkpoint_core_attention=True`` (TE's, on ``DotProductAttention``,
``MultiheadAttention`` and ``TransformerLayer``): the attention op keeps only its inputs
and its backward recomputes the forward (the log-sum-exp, and the fused kernels' output)
before the gradients. Outputs and gradients are the bits of ``False``, eager and
compiled; with dropout the recompute reads the forward's masks (the call's rng state),
draws nothing from the generators and leaves their states as the plain run does."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from attention_cases import aten_calls, randn
from module_cases import graph_breaks, recipe_context

import transformer_engine_ops as te

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.memory import SavedTensors  # noqa: E402

H, D = 4, 8
AOT = "aot_eager"
CUDA = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
DEVICES = [pytest.param("cpu"), pytest.param("cuda", marks=CUDA)]


def _bshd(b: int, s: int, heads: int = H, seed: int = 0) -> torch.Tensor:
    return randn(b, s, heads, D, seed=seed, dtype=torch.bfloat16)


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
        (
            randn(11, H, D, seed=0, dtype=torch.bfloat16),
            randn(11, H, D, seed=1, dtype=torch.bfloat16),
            randn(11, H, D, seed=2, dtype=torch.bfloat16),
        ),
        dict(
            cu_seqlens_q=torch.tensor([0, 3, 9, 11], dtype=torch.int32),
            cu_seqlens_kv=torch.tensor([0, 3, 9, 11], dtype=torch.int32),
            max_seqlen_q=6,
            max_seqlen_kv=6,
        ),
    ),
}


def _run(fn: Any, inputs: Any, checkpoint: bool, seed: int = 0, **kw: Any) -> list[Any]:
    """[output, gradients of the inputs (and bias) that require grad], and the CPU
    generator's state after the backward."""
    torch.manual_seed(seed)
    out = fn(*inputs, checkpoint_core_attention=checkpoint, **kw)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(7)).to(out.dtype)
    wants = [t for t in inputs if t.requires_grad] + [
        t for t in kw.values() if isinstance(t, torch.Tensor) and t.requires_grad
    ]
    grads = torch.autograd.grad(out, wants, g)
    return [out, *grads, torch.get_rng_state()]


def _assert_equal(a: list[Any], b: list[Any]) -> None:
    assert len(a) == len(b)
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        assert torch.equal(x, y), f"item {i} differs"


@pytest.mark.parametrize("case", list(CASES))
def test_gradients_are_the_bits_of_the_kept_activations(case):
    ctor, inputs, kw = CASES[case]()
    dpa = te.DotProductAttention(H, D, **ctor)
    _assert_equal(_run(dpa, inputs, True, **kw), _run(dpa, inputs, False, **kw))


@pytest.mark.parametrize("case", list(CASES))
def test_compiled_equals_eager(case):
    ctor, inputs, kw = CASES[case]()
    dpa = te.DotProductAttention(H, D, **ctor)
    eager = _run(dpa, inputs, True, **kw)
    compiled = _run(torch.compile(dpa, backend=AOT, fullgraph=True), inputs, True, **kw)
    _assert_equal(eager, compiled)
    assert graph_breaks() == 0


@pytest.mark.slow
def test_compiled_on_inductor_equals_eager_with_dropout():
    ctor, inputs, kw = CASES["dropout"]()
    dpa = te.DotProductAttention(H, D, **ctor)
    eager = _run(dpa, inputs, False, **kw)
    _assert_equal(_run(torch.compile(dpa, fullgraph=True), inputs, True, **kw), eager)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_dropout_masks_are_replayed_whatever_the_generators_did_since(compiled):
    """The recompute reads the forward's (seed, offset): random draws between the
    forward and the backward (other layers, data loading) change nothing, and the
    generator is where the plain run leaves it."""
    ctor, inputs, _ = CASES["dropout"]()
    dpa = te.DotProductAttention(H, D, **ctor)
    run = torch.compile(dpa, backend=AOT, fullgraph=True) if compiled else dpa
    results = []
    for checkpoint in (True, False):
        torch.manual_seed(0)
        out = run(*inputs, checkpoint_core_attention=checkpoint)
        torch.rand(1000)  # the generator moves on before the backward
        torch.manual_seed(123)
        grads = torch.autograd.grad(out, inputs, torch.ones_like(out))
        results.append([out, *grads, torch.get_rng_state()])
    _assert_equal(*results)
    # Dropout did act: without it the output differs.
    torch.manual_seed(0)
    assert not torch.equal(dpa.eval()(*inputs), results[0][0])


@pytest.mark.parametrize("device", DEVICES)
def test_dropout_masks_replay_and_generators_end_as_without(device):
    ctor, inputs, _ = CASES["dropout"]()
    inputs = [t.detach().to(device).requires_grad_(True) for t in inputs]
    dpa = te.DotProductAttention(H, D, **ctor)

    def run(checkpoint: bool) -> list[Any]:
        torch.manual_seed(0)
        out = dpa(*inputs, checkpoint_core_attention=checkpoint)
        grads = torch.autograd.grad(out, inputs, torch.ones_like(out))
        states = [torch.get_rng_state()]
        if device == "cuda":
            states.append(torch.cuda.get_rng_state())
        return [out, *grads, *states]

    _assert_equal(run(True), run(False))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dropout", [0.0, 0.2], ids=["fused", "dropout"])
def test_cuda_backends_recompute_bitwise_eager_and_compiled(dropout):
    """On CUDA: without dropout the chosen fused backend (cuDNN on Hopper) runs its
    forward kernel again in the backward; with dropout the unfused kernel its Philox
    masks. Both the bits of the plain run, compiled with Inductor too."""
    dpa = te.DotProductAttention(H, D, qkv_format="bshd", attention_dropout=dropout)
    inputs = [_bshd(2, 64, seed=i).detach().cuda().requires_grad_(True) for i in range(3)]
    want = _run(dpa, inputs, False)
    _assert_equal(_run(dpa, inputs, True), want)
    _assert_equal(_run(torch.compile(dpa, fullgraph=True), inputs, True), want)


@pytest.mark.parametrize("backend", ["flash", "efficient"])
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "aot_eager"])
def test_the_fused_backward_runs_the_forward_kernel_again_then_its_backward(
    backend, compiled, monkeypatch
):
    """On the CPU stand-in of the fused backends (torch's CPU flash kernel): the
    checkpointed backward runs the kernel's forward once (for the output and the
    log-sum-exp the forward did not keep), then its backward once; the gradients are
    the bits of the backward from the kept output and log-sum-exp."""
    from transformer_engine_ops.modules import attention as module_file

    monkeypatch.setattr(module_file, "select_backend", lambda reasons, device: backend)
    dpa = te.DotProductAttention(H, D, num_gqa_groups=2, attn_mask_type="no_mask")
    run = torch.compile(dpa, fullgraph=True, backend=AOT) if compiled else dpa
    q, k, v = randn(6, 2, H, D, seed=0), randn(6, 2, 2, D, seed=1), randn(6, 2, 2, D, seed=2)
    want = _run(dpa, (q, k, v), False)
    _assert_equal(_run(run, (q, k, v), True), want)
    outs: list = []
    forward = aten_calls(lambda: outs.append(run(q, k, v, checkpoint_core_attention=True)))
    backward = aten_calls(lambda: outs[0].backward(torch.ones_like(outs[0])))
    assert forward == ["_scaled_dot_product_flash_attention_for_cpu"]
    assert backward == [
        "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_flash_attention_for_cpu_backward",
    ]


def _saved(fn: Any, inputs: Any, checkpoint: bool, compiled: bool, **kw: Any) -> list[int]:
    """Bytes of each saved tensor that is not one of the inputs."""
    run = torch.compile(fn, backend=AOT, fullgraph=True) if compiled else fn
    record = SavedTensors()
    with record.hooks():
        run(*inputs, checkpoint_core_attention=checkpoint, **kw)
    own = {t.untyped_storage().data_ptr() for t in inputs}
    return [n for n, ptr in record.saved if ptr not in own]


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("backend", ["unfused", "flash"])
def test_only_the_inputs_are_kept(backend, compiled, monkeypatch):
    from transformer_engine_ops.modules import attention as module_file

    monkeypatch.setattr(module_file, "select_backend", lambda reasons, device: backend)
    dpa = te.DotProductAttention(H, D, qkv_format="bshd", attn_mask_type="no_mask")
    inputs = (_bshd(2, 8), _bshd(2, 8, seed=1), _bshd(2, 8, seed=2))
    plain = _saved(dpa, inputs, False, compiled)
    # Without: the log-sum-exp (fp32 [b, h, s]), and the fused kernels' output.
    lse = 2 * H * 8 * 4
    assert sorted(plain) == sorted([lse] + ([2 * 8 * H * D * 2] if backend == "flash" else []))
    assert _saved(dpa, inputs, True, compiled) == []


# --- MultiheadAttention and TransformerLayer -----------------------------------------


def _layer_step(layer: Any, x: torch.Tensor, checkpoint: bool, recipe: str, **kw: Any) -> list:
    """TE's ``_test_e2e_selective_recompute``: seeded, a causal mask, loss = sum."""
    torch.manual_seed(0)
    for p in layer.parameters():
        p.grad = None
    x = x.detach().clone().requires_grad_(True)
    with recipe_context(recipe):
        out = layer(x, checkpoint_core_attention=checkpoint, **kw)
    out = out[0] if isinstance(out, tuple) else out
    out.float().sum().backward()
    return [out.detach(), x.grad, *(p.grad for p in layer.parameters()), torch.get_rng_state()]


def _transformer_layer() -> Any:
    from transformer_cases import make_layer

    return make_layer(seed=3, dtype=torch.bfloat16, hidden_dropout=0.1, attention_dropout=0.1)


def _hidden(seq: int = 8) -> torch.Tensor:
    from transformer_cases import HIDDEN

    gen = torch.Generator().manual_seed(1)
    return torch.randn(seq, 2, HIDDEN, generator=gen).to(torch.bfloat16)


CAUSAL = dict(
    attention_mask=torch.ones(8, 8, dtype=torch.bool).triu(1).view(1, 1, 8, 8),
    self_attn_mask_type="arbitrary",
)


@pytest.mark.parametrize("recipe", ["bf16", "fp8_current", "nvfp4"])
def test_transformer_layer_as_te_s_selective_recompute_test_calls_it(recipe):
    layer, x = _transformer_layer(), _hidden()
    _assert_equal(
        _layer_step(layer, x, True, recipe, **CAUSAL),
        _layer_step(layer, x, False, recipe, **CAUSAL),
    )


@pytest.mark.parametrize("recipe", ["bf16", "fp8_current"])
def test_transformer_layer_compiled_equals_eager(recipe):
    layer, x = _transformer_layer(), _hidden()
    eager = _layer_step(layer, x, True, recipe)
    compiled = _layer_step(torch.compile(layer, fullgraph=True, backend=AOT), x, True, recipe)
    assert graph_breaks() == 0
    _assert_equal(compiled, eager)


def test_multihead_attention_and_cross_attention():
    from transformer_cases import HEADS, HIDDEN

    x = _hidden()
    for kwargs in (dict(), dict(attention_type="cross")):
        torch.manual_seed(0)
        mha = te.MultiheadAttention(
            HIDDEN, HEADS, attention_dropout=0.2, params_dtype=torch.bfloat16, **kwargs
        )
        extra = {"encoder_output": _hidden(5)} if kwargs else {}
        _assert_equal(
            _layer_step(mha, x, True, "bf16", **extra),
            _layer_step(mha, x, False, "bf16", **extra),
        )
