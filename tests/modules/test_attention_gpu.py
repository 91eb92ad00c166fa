"""DotProductAttention on CUDA (marked ``gpu``; run on the H200 with ``-m gpu``): every
backend a configuration selects matches the float64 reference within TE's own test
tolerances for the dtype (tests/pytorch/attention/test_attention.py: bf16 1.5e-2, fp16
1e-3, rtol and atol), compiled equals eager bitwise on the fused backends and with
dropout, and each fused backend's backward calls its kernel's backward op once on the
saved output and log-sum-exp, never its forward."""

from __future__ import annotations

import pytest
import torch
from attention_cases import aten_calls, reference

import transformer_engine_ops as te
from transformer_engine_ops.modules import attention as module_file
from transformer_engine_ops.ops.attention import BACKENDS, backend_support

pytestmark = pytest.mark.gpu
TE_TOLS = {
    torch.bfloat16: dict(atol=1.5e-2, rtol=1.5e-2),
    torch.float16: dict(atol=1e-3, rtol=1e-3),
    torch.float32: dict(atol=1e-3, rtol=1e-3),
}
B, S, H, D = 2, 128, 8, 64

# name -> (constructor kwargs, forward kwargs, reference kwargs, kv groups)
CONFIGS = {
    "causal": (dict(), {}, dict(mask_type="causal", window=(-1, 0)), H),
    "no_mask-gqa": (
        dict(attn_mask_type="no_mask", num_gqa_groups=2),
        {},
        dict(mask_type="no_mask", window=(-1, -1)),
        2,
    ),
    "causal_bottom_right": (
        dict(attn_mask_type="causal_bottom_right"),
        {},
        dict(mask_type="causal_bottom_right", window=(-1, 0)),
        H,
    ),
    "window": (
        dict(attn_mask_type="causal", window_size=(16, 0)),
        {},
        dict(mask_type="causal", window=(16, 0)),
        H,
    ),
    "alibi": (
        dict(attn_mask_type="causal"),
        dict(core_attention_bias_type="alibi"),
        dict(mask_type="causal", window=(-1, 0), bias_type="alibi"),
        H,
    ),
}


def _inputs(dtype, groups, seed=0):
    gen = torch.Generator().manual_seed(seed)
    make = lambda h: torch.randn(S, B, h, D, generator=gen).to(dtype)  # noqa: E731
    return make(H), make(groups), make(groups)


def _cases():
    for name, (ctor, fwd, _ref, _groups) in CONFIGS.items():
        for dtype in TE_TOLS:
            support = backend_support(
                device=torch.device("cuda"),
                dtype=dtype,
                head_dim=D,
                head_dim_v=D,
                qkv_format="sbhd",
                attn_mask_type=ctor.get("attn_mask_type", "causal"),
                window_size=ctor.get("window_size", (-1, 0)),
                bottom_right_diagonal=False,
                same_seqlens=True,
                attn_bias_type=fwd.get("core_attention_bias_type", "no_bias"),
                bias_requires_grad=False,
                softcap=0.0,
                dropout=False,
            )
            for backend in BACKENDS:
                if support[backend] is None:
                    yield pytest.param(name, dtype, backend, id=f"{name}-{dtype}-{backend}")


@pytest.mark.parametrize("name,dtype,backend", list(_cases()))
def test_each_selected_backend_matches_the_reference(name, dtype, backend, monkeypatch):
    ctor, fwd, ref_kw, groups = CONFIGS[name]
    monkeypatch.setattr(module_file, "select_backend", lambda reasons, device: backend)
    dpa = te.DotProductAttention(H, D, **ctor)
    q, k, v = (t.cuda().requires_grad_(True) for t in _inputs(dtype, groups))
    out = dpa(q, k, v, **fwd)
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(5)).to(dtype)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), grad.cuda())
    q64, k64, v64 = (t.detach().cpu().double().requires_grad_(True) for t in (q, k, v))
    slopes = None
    if ref_kw.get("bias_type") == "alibi":
        from transformer_engine_ops.ops.attention import default_alibi_slopes

        slopes = default_alibi_slopes(H, "cpu")
    ref = reference(
        "sbhd", q64, k64, v64, scale=dpa.softmax_scale, bottom_right=False, slopes=slopes, **ref_kw
    )
    want = torch.autograd.grad(ref, (q64, k64, v64), grad.double())
    tols = TE_TOLS[dtype]
    torch.testing.assert_close(out.double().cpu(), ref, **tols)
    for got, w in zip((dq, dk, dv), want, strict=True):
        torch.testing.assert_close(got.double().cpu(), w, **tols)


def test_hopper_selects_cudnn_for_plain_causal_bf16():
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("TE's preference for the fused backend is Hopper and newer")
    seen = []
    original = module_file.call_dot_product_attention
    module_file.call_dot_product_attention = lambda **kw: seen.append(kw["backend"]) or (None,)
    try:
        te.DotProductAttention(H, D)(*(t.cuda() for t in _inputs(torch.bfloat16, H)))
    finally:
        module_file.call_dot_product_attention = original
    assert seen == ["cudnn"]


@pytest.mark.parametrize("backend", ["flash", "cudnn", "efficient", "unfused"])
def test_compiled_equals_eager_bitwise_on_cuda(backend, monkeypatch):
    monkeypatch.setattr(module_file, "select_backend", lambda reasons, device: backend)
    dpa = te.DotProductAttention(H, D)
    q, k, v = (t.cuda().requires_grad_(True) for t in _inputs(torch.bfloat16, H))

    def run(fn):
        out = fn(q, k, v)
        return out, torch.autograd.grad(out, (q, k, v), torch.ones_like(out))

    eager = run(dpa)
    compiled = run(torch.compile(dpa, fullgraph=True))
    assert torch.equal(eager[0], compiled[0])
    for a, b in zip(eager[1], compiled[1], strict=True):
        assert torch.equal(a, b)


def test_dropout_on_cuda_compiled_equals_eager_bitwise():
    dpa = te.DotProductAttention(H, D, attention_dropout=0.1)
    q, k, v = (t.cuda().requires_grad_(True) for t in _inputs(torch.bfloat16, H))

    def run(fn):
        torch.manual_seed(3)
        out = fn(q, k, v)
        return out, torch.autograd.grad(out, (q, k, v), torch.ones_like(out))

    eager, compiled = run(dpa), run(torch.compile(dpa, fullgraph=True))
    assert torch.equal(eager[0], compiled[0])
    for a, b in zip(eager[1], compiled[1], strict=True):
        assert torch.equal(a, b)


def test_compiled_backend_choice_on_cuda_has_no_graph_break():
    """The module's own choice (device query, NVTE_* variables) inside fullgraph."""
    dpa = te.DotProductAttention(H, D, window_size=(16, 0))
    q, k, v = (t.cuda().requires_grad_(True) for t in _inputs(torch.bfloat16, H))
    eager = dpa(q, k, v)
    assert torch.equal(torch.compile(dpa, fullgraph=True)(q, k, v), eager)


@pytest.mark.parametrize("backend", ["flash", "cudnn"])
def test_grouped_kv_is_not_copied_per_head_where_the_kernel_takes_groups(backend, monkeypatch):
    """GQA on flash (and cuDNN where torch's check accepts it): k and v go to the kernel
    grouped (``enable_gqa``), forward and backward, none expanded per query head; the
    result stays within TE's tolerance of the reference (the test above)."""
    from torch.backends import cuda as sdp

    from transformer_engine_ops.ops import attention as op_file

    expanded = []
    original = op_file._expand_groups
    monkeypatch.setattr(
        op_file,
        "_expand_groups",
        lambda x, heads: expanded.append(x.shape[1]) or original(x, heads),
    )
    monkeypatch.setattr(module_file, "select_backend", lambda reasons, device: backend)
    q, k, v = (t.cuda().requires_grad_(True) for t in _inputs(torch.bfloat16, 2))
    can_use = sdp.can_use_flash_attention if backend == "flash" else sdp.can_use_cudnn_attention

    def native(grad: bool) -> bool:
        qb, kb, vb = (t.detach().requires_grad_(grad).permute(1, 2, 0, 3) for t in (q, k, v))
        return bool(can_use(sdp.SDPAParams(qb, kb, vb, None, 0.0, False, True), False))

    # The forward and the backward prepare the same inputs (a backward follows).
    want = ([] if native(True) else [2, 2]) * 2
    if backend == "flash":
        assert want == [], "torch documents GQA on its flash kernel"
    out = te.DotProductAttention(H, D, attn_mask_type="no_mask", num_gqa_groups=2)(q, k, v)
    out.float().sum().backward()
    assert expanded == want


FORWARD_OP = {
    "flash": "_scaled_dot_product_flash_attention",
    "cudnn": "_scaled_dot_product_cudnn_attention",
    "efficient": "_scaled_dot_product_efficient_attention",
}


@pytest.mark.parametrize("backend", ["flash", "cudnn", "efficient"])
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "inductor"])
@pytest.mark.parametrize("groups", [H, 2], ids=["mha", "gqa"])
def test_the_fused_backward_calls_the_backward_op_once_and_no_forward(
    backend, compiled, groups, monkeypatch
):
    """The Llama layer's case (causal, bf16, GQA): the forward runs the kernel's forward
    op once (with its log-sum-exp), the backward its backward op once, on what the
    forward saved; gradients within TE's tolerance of the reference (the test above)."""
    monkeypatch.setattr(module_file, "select_backend", lambda reasons, device: backend)
    dpa = te.DotProductAttention(H, D, num_gqa_groups=groups)
    run = torch.compile(dpa, fullgraph=True) if compiled else dpa
    q, k, v = (t.cuda().requires_grad_(True) for t in _inputs(torch.bfloat16, groups))
    run(q, k, v).sum().backward()  # compiled: the first call compiles both ways
    outs: list = []
    forward = aten_calls(lambda: outs.append(run(q, k, v)))
    backward = aten_calls(lambda: outs[0].backward(torch.ones_like(outs[0])))
    assert forward == [FORWARD_OP[backend]]
    assert backward == [FORWARD_OP[backend] + "_backward"]


@pytest.mark.parametrize("backend", ["flash", "cudnn", "efficient"])
def test_the_fused_backends_run_under_cuda_graphs(backend, monkeypatch):
    """``mode="reduce-overhead"``: no CUDA-graph skip (nothing the op saves lives on the
    CPU), and the replayed step equals eager bitwise."""
    from torch._dynamo.utils import counters

    monkeypatch.setattr(module_file, "select_backend", lambda reasons, device: backend)
    dpa = te.DotProductAttention(H, D, num_gqa_groups=2)
    q, k, v = (t.cuda().requires_grad_(True) for t in _inputs(torch.bfloat16, 2))

    def step(fn):
        out = fn(q, k, v)
        return out.detach().clone(), torch.autograd.grad(out, (q, k, v), torch.ones_like(out))

    eager = step(dpa)
    compiled = torch.compile(dpa, fullgraph=True, mode="reduce-overhead")
    skips = counters["inductor"]["cudagraph_skips"]
    for _ in range(3):
        got = step(compiled)
    assert counters["inductor"]["cudagraph_skips"] == skips
    assert torch.equal(eager[0], got[0])
    for a, b in zip(eager[1], got[1], strict=True):
        assert torch.equal(a, b)


def test_thd_seqlen_checks_read_nothing_on_the_host():
    """On CUDA the cu_seqlens/max_seqlen rules are one device-side assertion: a valid
    thd call (max_seqlen given) never synchronizes with the device."""
    dpa = te.DotProductAttention(H, D, qkv_format="thd", attn_mask_type="padding_causal")
    cu = torch.tensor([0, 50, 128], dtype=torch.int32, device="cuda")
    q = torch.randn(128, H, D, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = dpa(q, q, q, cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=78, max_seqlen_kv=78)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert out.shape == (128, H * D)


def test_thd_with_its_seqlen_checks_runs_under_cuda_graphs():
    """The device-side assertion is captured with the step: ``reduce-overhead`` replays
    a thd call (its checks included) with no CUDA-graph skip, bitwise equal to eager."""
    from torch._dynamo.utils import counters

    dpa = te.DotProductAttention(H, D, qkv_format="thd", attn_mask_type="padding_causal")
    cu = torch.tensor([0, 50, 128], dtype=torch.int32, device="cuda")
    gen = torch.Generator().manual_seed(3)
    q, k, v = (
        torch.randn(128, H, D, generator=gen).to("cuda", torch.bfloat16).requires_grad_(True)
        for _ in range(3)
    )
    kw = dict(cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=78, max_seqlen_kv=78)

    def step(fn):
        out = fn(q, k, v, **kw)
        return out.detach().clone(), torch.autograd.grad(out, (q, k, v), torch.ones_like(out))

    eager = step(dpa)
    compiled = torch.compile(dpa, fullgraph=True, mode="reduce-overhead")
    skips = counters["inductor"]["cudagraph_skips"]
    for _ in range(3):
        got = step(compiled)
    assert counters["inductor"]["cudagraph_skips"] == skips
    assert torch.equal(eager[0], got[0])
    for a, b in zip(eager[1], got[1], strict=True):
        assert torch.equal(a, b)


def test_a_thd_max_seqlen_below_the_longest_sequence_fails_on_the_device():
    """The device-side assertion fails the process's CUDA context, so it runs in a
    child process: a max_seqlen below the longest sequence is never a silent result."""
    import subprocess
    import sys

    script = (
        "import torch, transformer_engine_ops as te\n"
        f"dpa = te.DotProductAttention({H}, {D}, qkv_format='thd', attn_mask_type='padding')\n"
        "cu = torch.tensor([0, 50, 128], dtype=torch.int32, device='cuda')\n"
        f"q = torch.randn(128, {H}, {D}, device='cuda', dtype=torch.bfloat16)\n"
        "out = dpa(q, q, q, cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=64, "
        "max_seqlen_kv=78)\n"
        "torch.cuda.synchronize()\n"
        "print('RAN')\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode != 0 and "RAN" not in done.stdout
    assert "device-side assert" in done.stderr or "Assertion" in done.stderr, done.stderr[-2000:]
