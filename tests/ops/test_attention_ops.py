"""The generated dot_product_attention ops: opcheck both ways, fake-vs-real layouts, and
the kernel's own checks of a bundle."""

from __future__ import annotations

import pytest
import torch

import transformer_engine_ops as te
from transformer_engine_ops.generated import attention as g
from transformer_engine_ops.modules import attention as module_file
from transformer_engine_ops.ops.attention import DotProductAttnFwdArgs

H, D = 4, 8


def _capture(ctor, inputs, seed=0, grad=True, **kw):
    """The forward bundle ``DotProductAttention(H, D, **ctor)(*inputs, **kw)`` builds."""
    seen = []
    original = module_file.call_dot_product_attention
    module_file.call_dot_product_attention = lambda **fields: seen.append(
        DotProductAttnFwdArgs(**fields)
    ) or (None,)
    try:
        torch.manual_seed(seed)
        with torch.set_grad_enabled(grad):
            te.DotProductAttention(H, D, **ctor)(*inputs, **kw)
    finally:
        module_file.call_dot_product_attention = original
    return seen[0]


def _t(*shape, seed, dtype=torch.float32, grad=True):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen).to(dtype).requires_grad_(grad)


def _qkv(*shape, dtype=torch.float32, grad=True):
    return tuple(_t(*shape, seed=i, dtype=dtype, grad=grad) for i in range(3))


def _on(backend, fwd):
    """``fwd`` run by a fused backend: on the CPU, torch's CPU flash kernel through the
    same saved-stats forward and backward as the CUDA kernels."""
    fwd.backend = backend
    return fwd


CU = torch.tensor([0, 3, 8, 10], dtype=torch.int32)
CASES = {
    "causal-bf16": lambda: _capture({}, _qkv(6, 2, H, D, dtype=torch.bfloat16)),
    "gqa-window-softcap": lambda: _capture(
        dict(num_gqa_groups=2, softcap=3.0, attn_mask_type="no_mask", window_size=(2, 1)),
        (_t(6, 2, H, D, seed=0), _t(6, 2, 2, D, seed=1), _t(6, 2, 2, D, seed=2)),
    ),
    "thd-alibi": lambda: _capture(
        dict(qkv_format="thd", attn_mask_type="padding_causal_bottom_right"),
        _qkv(10, H, D),
        cu_seqlens_q=CU,
        cu_seqlens_kv=CU,
        core_attention_bias_type="alibi",
    ),
    "bias-grad": lambda: _capture(
        dict(qkv_format="bshd", attn_mask_type="arbitrary"),
        _qkv(2, 5, H, D),
        attention_mask=torch.rand(2, 1, 5, 5, generator=torch.Generator().manual_seed(3)) < 0.3,
        core_attention_bias_type="pre_scale_bias",
        core_attention_bias=_t(1, H, 5, 5, seed=4),
    ),
    "dropout": lambda: _capture(dict(attention_dropout=0.2), _qkv(6, 2, H, D)),
    "flash-cpu-gqa": lambda: _on(
        "flash",
        _capture(
            dict(num_gqa_groups=2),
            (
                _t(6, 2, H, D, seed=0, dtype=torch.bfloat16),
                _t(6, 2, 2, D, seed=1, dtype=torch.bfloat16),
                _t(6, 2, 2, D, seed=2, dtype=torch.bfloat16),
            ),
        ),
    ),
    "efficient-cpu-arbitrary-alibi": lambda: _on(
        "efficient",
        _capture(
            dict(qkv_format="bshd", attn_mask_type="arbitrary"),
            _qkv(2, 5, H, D),
            attention_mask=torch.rand(2, 1, 5, 5, generator=torch.Generator().manual_seed(3)) < 0.3,
            core_attention_bias_type="alibi",
        ),
    ),
    "no-grad": lambda: _capture({}, _qkv(6, 2, H, D, grad=False), grad=False),
    # TE's checkpoint_core_attention: the backward recomputes the forward's results.
    "checkpoint-dropout": lambda: _capture(
        dict(attention_dropout=0.2), _qkv(6, 2, H, D), checkpoint_core_attention=True
    ),
    "checkpoint-flash-cpu": lambda: _on(
        "flash",
        _capture({}, _qkv(6, 2, H, D, dtype=torch.bfloat16), checkpoint_core_attention=True),
    ),
}


def _backward_bundle(fwd):
    with torch.no_grad():
        outputs, saved = g.attention_forward(fwd)
    bwd = g._backward_args(fwd, outputs, saved)  # the generated path
    for field, value in vars(bwd).items():
        if isinstance(value, torch.Tensor):
            setattr(bwd, field, value.detach())
    gen = torch.Generator().manual_seed(9)
    bwd.grad_output = torch.randn(outputs[0].shape, generator=gen).to(outputs[0].dtype)
    return bwd


@pytest.mark.parametrize(
    "case",
    [c if c == "causal-bf16" else pytest.param(c, marks=pytest.mark.slow) for c in CASES],
)
def test_opcheck(case):
    fwd = CASES[case]()
    torch.library.opcheck(g.dot_product_attention_fwd, g.flatten_dot_product_attn_fwd_args(fwd))
    if case != "no-grad":
        bwd = _backward_bundle(fwd)
        torch.library.opcheck(g.dot_product_attention_bwd, g.flatten_dot_product_attn_bwd_args(bwd))


@pytest.mark.parametrize("case", list(CASES))
def test_fake_outputs_match_the_kernels(case):
    from torch._subclasses.fake_tensor import FakeTensorMode

    fwd = CASES[case]()
    slots = g.flatten_dot_product_attn_fwd_args(fwd)
    real = g.dot_product_attention_fwd(*slots)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fake_slots = [mode.from_tensor(s) if isinstance(s, torch.Tensor) else s for s in slots]
        fake = g.dot_product_attention_fwd(*fake_slots)
    assert [(t.shape, t.dtype) for t in real] == [(t.shape, t.dtype) for t in fake]


def test_a_bundle_whose_heads_do_not_divide_is_refused_naming_the_shapes():
    fwd = CASES["causal-bf16"]()
    fwd.k = fwd.k[:, :, :3]
    fwd.v = fwd.v[:, :, :3]
    with pytest.raises(ValueError, match=r"4 query heads are not a multiple of 3"):
        g.dot_product_attention_fwd(*g.flatten_dot_product_attn_fwd_args(fwd))


def test_dropout_without_an_rng_state_is_refused():
    fwd = CASES["dropout"]()
    fwd.rng_state = None
    with pytest.raises(ValueError, match=r"DotProductAttnFwdArgs.rng_state: dropout needs"):
        g.dot_product_attention_fwd(*g.flatten_dot_product_attn_fwd_args(fwd))


def test_cudnn_on_the_cpu_is_refused():
    fwd = CASES["causal-bf16"]()
    fwd.backend = "cudnn"
    with pytest.raises(ValueError, match=r"backend: 'cudnn' runs on CUDA only"):
        g.dot_product_attention_fwd(*g.flatten_dot_product_attn_fwd_args(fwd))


@pytest.mark.parametrize("backend", ["flash", "cudnn", "efficient"])
@pytest.mark.parametrize("sq", [1, 33, 64])
def test_the_saved_stats_spec_is_what_each_cuda_kernel_returns(backend, sq):
    """The fake of the saved log-sum-exp against the aten op's own meta function on the
    installed torch (its shape differs per kernel: cuDNN's has a trailing 1, the
    memory-efficient one's rows are padded to 32)."""
    from types import SimpleNamespace

    from transformer_engine_ops.ops import attention as op_file
    from transformer_engine_ops.runtime.tensor_spec import TensorSpec

    b, h, skv, d = 2, 4, 40, 64
    plan = op_file._Plan(b, h, h, sq, skv, d, d, None)
    args = SimpleNamespace(
        backend=backend, q=TensorSpec((sq, b, h, d), torch.bfloat16, device="cuda")
    )
    spec = op_file._fused_stats_spec(args, plan)
    q = torch.empty(b, h, sq, d, dtype=torch.bfloat16, device="meta")
    k = torch.empty(b, h, skv, d, dtype=torch.bfloat16, device="meta")
    aten = torch.ops.aten
    if backend == "flash":
        lse = aten._scaled_dot_product_flash_attention(q, k, k, 0.0, True, False)[1]
    elif backend == "cudnn":
        lse = aten._scaled_dot_product_cudnn_attention(q, k, k, None, True, 0.0, True, False)[1]
    else:
        lse = aten._scaled_dot_product_efficient_attention(q, k, k, None, True)[1]
    assert (tuple(lse.shape), lse.dtype) == (spec.shape, spec.dtype)
    assert lse.is_contiguous()
