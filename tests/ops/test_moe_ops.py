"""The generated MoE ops (permute, unpermute, chunk sort, row padding, router, auxiliary
scores and loss), the activation op and GroupedLinear's grouped-GEMM op: opcheck both ways and fake-vs-real
flat layouts; TE's row maps; the per-token sum's Triton kernel under Triton's
interpreter (a fresh process with ``TRITON_INTERPRET=1``; skipped without Triton)."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from family_op_cases import check_fake_layouts, check_opcheck

from tests.triton_interpreter import run_interpreted
from transformer_engine_ops.generated import activation as ac
from transformer_engine_ops.generated import grouped_gemm as gg
from transformer_engine_ops.generated import moe_aux_loss as al
from transformer_engine_ops.generated import moe_aux_scores as sc
from transformer_engine_ops.generated import moe_pad_rows as pr
from transformer_engine_ops.generated import moe_permute as pm
from transformer_engine_ops.generated import moe_router as rt
from transformer_engine_ops.generated import moe_sort_chunks as sk
from transformer_engine_ops.generated import moe_unpermute as up
from transformer_engine_ops.ops import _moe
from transformer_engine_ops.quantization.float8 import Float8CurrentScalingQuantizer
from transformer_engine_ops.runtime.values import GemmConfig

HAS_TRITON = importlib.util.find_spec("triton") is not None
GEN = torch.Generator


def _randn(*shape, seed=0, dtype=torch.float32):
    return torch.randn(shape, generator=GEN().manual_seed(seed)).to(dtype)


def _mask(tokens, experts, routed, seed=0):
    flat = torch.zeros(tokens * experts, dtype=torch.bool)
    flat[:routed] = True
    return flat[torch.randperm(tokens * experts, generator=GEN().manual_seed(seed))].view(
        tokens, experts
    )


def _permute_bundle(map_type="mask", probs=True, pad=False, dtype=torch.bfloat16):
    tokens, experts, hidden = 9, 4, 8
    x = _randn(tokens, hidden, dtype=dtype).requires_grad_(True)
    if map_type == "index":
        routing = torch.stack(
            [torch.randperm(experts, generator=GEN().manual_seed(t))[:2] for t in range(tokens)]
        ).to(torch.int32)
        return pm.MoePermuteFwdArgs(
            inp=x,
            probs=None,
            routing_map=routing,
            pad_offsets=None,
            map_type="index",
            num_out_tokens=0,
            inp_requires_grad=True,
            probs_requires_grad=False,
            is_grad_enabled=True,
        )
    routing = _mask(tokens, experts, 14)
    p = (torch.rand(tokens, experts, generator=GEN().manual_seed(2)) * routing).to(dtype)
    pad_offsets = torch.tensor([0, 3, 5, 5]) if pad else None
    return pm.MoePermuteFwdArgs(
        inp=x,
        probs=p.requires_grad_(True) if probs else None,
        routing_map=routing,
        pad_offsets=pad_offsets,
        map_type="mask",
        num_out_tokens=14 + (8 if pad else 0),
        inp_requires_grad=True,
        probs_requires_grad=probs,
        is_grad_enabled=True,
    )


def _unpermute_bundle(map_type="mask", probs=True):
    fwd = _permute_bundle(map_type, probs=False)
    with torch.no_grad():
        (out, row_id_map, _), _ = pm.moe_permute_forward(fwd)
    tokens = fwd.inp.shape[0]
    if map_type == "mask":
        merging = torch.rand(tokens, 4, generator=GEN().manual_seed(3)) * fwd.routing_map
    else:
        merging = torch.rand(tokens, 2, generator=GEN().manual_seed(3))
    return up.MoeUnpermuteFwdArgs(
        inp=out.detach().requires_grad_(True),
        merging_probs=merging.requires_grad_(True) if probs else None,
        row_id_map=row_id_map,
        pad_offsets=None,
        map_type=map_type,
        num_tokens=tokens if probs or map_type == "mask" else tokens * 2,
        inp_requires_grad=True,
        probs_requires_grad=probs,
        is_grad_enabled=True,
    )


def _sort_bundle(probs=True):
    return sk.MoeSortChunksFwdArgs(
        inp=_randn(12, 8).requires_grad_(True),
        probs=_randn(12, seed=1).requires_grad_(True) if probs else None,
        split_sizes=torch.tensor([3, 0, 5, 2]),
        sorted_index=torch.tensor([2, 0, 3, 1]),
        inp_requires_grad=True,
        probs_requires_grad=probs,
        is_grad_enabled=True,
    )


def _pad_bundle():
    return pr.MoePadRowsFwdArgs(
        inp=_randn(10, 8).requires_grad_(True),
        from_splits=[3, 0, 7],
        to_splits=[16, 0, 16],
        inp_requires_grad=True,
        is_grad_enabled=True,
    )


def _router_bundle(score_function="sigmoid", bias=True, qb=False, fmt="bytemap", dense=None):
    logits = _randn(6, 8, seed=4).requires_grad_(True)
    return rt.MoeRouterFwdArgs(
        logits=logits,
        topk=3,
        use_pre_softmax=False,
        num_groups=None,
        group_topk=None,
        scaling_factor=1.5,
        score_function=score_function,
        expert_bias=_randn(8, seed=5) if bias else None,
        routing_map_format=fmt,
        dense_dtype=dense,
        qb_bin_bounds=torch.tensor([-1.0, 1.0]) if qb else None,
        qb_num_bins=10 if qb else None,
        logits_requires_grad=True,
        is_grad_enabled=True,
    )


def _scores_bundle(score_function="sqrtsoftplus", fmt="bitmap_u8"):
    return sc.MoeAuxScoresFwdArgs(
        logits=_randn(6, 10, seed=6).requires_grad_(True),
        topk=2,
        score_function=score_function,
        routing_map_format=fmt,
        logits_requires_grad=True,
        is_grad_enabled=True,
    )


def _loss_bundle(on_device=False):
    return al.MoeAuxLossFwdArgs(
        probs=_randn(7, 6, seed=7).requires_grad_(True),
        tokens_per_expert=torch.tensor([3, 1, 4, 1, 5, 9], dtype=torch.int32),
        total_num_tokens=None if on_device else 7,
        total_num_tokens_tensor=torch.tensor(7) if on_device else None,
        num_experts=6,
        topk=2,
        coeff=0.01,
        probs_requires_grad=True,
        is_grad_enabled=True,
    )


def _activation_bundle(name="swiglu", dtype=torch.bfloat16):
    return ac.ActivationFwdArgs(
        inp=_randn(5, 3, 16, seed=8, dtype=dtype).requires_grad_(True),
        activation=name,
        limit=7.0,
        alpha=1.702,
        glu_linear_offset=1.0,
        inp_requires_grad=True,
        is_grad_enabled=True,
    )


def _grouped_bundle(fp8=False, bias=True):
    g, n, k = 3, 16, 32
    q = Float8CurrentScalingQuantizer() if fp8 else None
    gq = Float8CurrentScalingQuantizer(fp8_dtype=torch.float8_e5m2) if fp8 else None
    return gg.GroupedGemmFwdArgs(
        inp=_randn(11, k, dtype=torch.bfloat16).requires_grad_(True),
        weight=_randn(g, n, k, seed=1, dtype=torch.bfloat16).requires_grad_(True),
        bias=_randn(g, n, seed=2, dtype=torch.bfloat16).requires_grad_(True) if bias else None,
        m_splits=torch.tensor([4, 0, 7]),
        input_requires_grad=True,
        weight_requires_grad=True,
        bias_requires_grad=bias,
        input_quantizer=q,
        weight_quantizer=q,
        grad_output_quantizer=gq,
        activation_dtype=torch.bfloat16,
        fprop_gemm=GemmConfig(use_split_accumulator=False),
        dgrad_gemm=GemmConfig(),
        is_grad_enabled=True,
    )


CASES = {
    "permute-mask-probs": (pm, "moe_permute", lambda: _permute_bundle()),
    "permute-mask-padded": (pm, "moe_permute", lambda: _permute_bundle(pad=True)),
    "permute-mask-fp32": (pm, "moe_permute", lambda: _permute_bundle(dtype=torch.float32)),
    "permute-index": (pm, "moe_permute", lambda: _permute_bundle("index")),
    "unpermute-mask": (up, "moe_unpermute", lambda: _unpermute_bundle()),
    "unpermute-mask-noprobs": (up, "moe_unpermute", lambda: _unpermute_bundle(probs=False)),
    "unpermute-index": (up, "moe_unpermute", lambda: _unpermute_bundle("index")),
    "unpermute-index-noprobs": (up, "moe_unpermute", lambda: _unpermute_bundle("index", False)),
    "sort-chunks": (sk, "moe_sort_chunks", lambda: _sort_bundle()),
    "sort-chunks-noprobs": (sk, "moe_sort_chunks", lambda: _sort_bundle(False)),
    "pad-rows": (pr, "moe_pad_rows", _pad_bundle),
    "router-sigmoid": (rt, "moe_router", lambda: _router_bundle()),
    "router-softmax-dense": (
        rt,
        "moe_router",
        lambda: _router_bundle("softmax", bias=False, dense=torch.int16),
    ),
    "router-sqrtsoftplus-bitmap": (
        rt,
        "moe_router",
        lambda: _router_bundle("sqrtsoftplus", fmt="bitmap_u8"),
    ),
    "router-qb": (rt, "moe_router", lambda: _router_bundle(qb=True)),
    "aux-scores": (sc, "moe_aux_scores", lambda: _scores_bundle()),
    "aux-scores-softmax": (sc, "moe_aux_scores", lambda: _scores_bundle("softmax", "bytemap")),
    "aux-loss": (al, "moe_aux_loss", lambda: _loss_bundle()),
    "aux-loss-device-total": (al, "moe_aux_loss", lambda: _loss_bundle(True)),
    "activation-swiglu": (ac, "activation", lambda: _activation_bundle()),
    "activation-gelu-fp32": (ac, "activation", lambda: _activation_bundle("gelu", torch.float32)),
    "activation-clamped-swiglu": (ac, "activation", lambda: _activation_bundle("clamped_swiglu")),
    "grouped-gemm-bf16": (gg, "grouped_gemm", lambda: _grouped_bundle()),
    "grouped-gemm-fp8-current": (gg, "grouped_gemm", lambda: _grouped_bundle(True, False)),
}


def _flat(g, name):
    fwd_name = next(n for n in vars(g) if n.startswith("flatten_") and n.endswith("_fwd_args"))
    bwd_name = next(n for n in vars(g) if n.startswith("flatten_") and n.endswith("_bwd_args"))
    return getattr(g, fwd_name), getattr(g, bwd_name)


@pytest.mark.parametrize("case", list(CASES))
def test_opcheck(case):
    g, name, make = CASES[case]
    check_opcheck(g, name, *_flat(g, name), make())


@pytest.mark.parametrize("case", list(CASES))
def test_fake_layout_matches_real(case):
    g, name, make = CASES[case]
    check_fake_layouts(g, name, *_flat(g, name), make())


def test_mask_row_id_map_is_tes_layout():
    """TE's documented example (5 tokens, 3 experts): each token's rows descending, then
    its experts, then its count; -1 where TE leaves a value unused."""
    routing = torch.tensor(
        [[1, 1, 0], [1, 0, 1], [0, 0, 1], [1, 1, 0], [0, 0, 0]], dtype=torch.int32
    )
    r = -1
    expected = torch.tensor(
        [
            [3, 0, r, 1, 0, r, 2],
            [5, 1, r, 2, 0, r, 2],
            [6, r, r, 2, r, r, 1],
            [4, 2, r, 1, 0, r, 2],
            [r, r, r, r, r, r, 0],
        ],
        dtype=torch.int32,
    )
    assert torch.equal(_moe.mask_row_id_map(routing), expected)


def test_index_row_id_map_is_tes_layout():
    """Entry ``k * T + t``: the row of token t's k-th copy (copies sorted by expert,
    stably), -1 past num_out_tokens."""
    indices = torch.tensor([[2, 0], [0, 1], [1, 2]], dtype=torch.int32)
    # Copies by expert: (0,1):0 (1,0):1 (1,1):2 (2,0):3 (0,0):4 (2,1):5.
    assert _moe.index_row_id_map(indices, 6).tolist() == [4, 1, 3, 0, 2, 5]
    assert _moe.index_row_id_map(indices, 4).tolist() == [-1, 1, 3, 0, 2, -1]


def test_row_sources_invert_the_table_and_leave_unnamed_rows_at_minus_one():
    rows = torch.tensor([[3, 0, -1], [1, -1, -1], [7, 2, -1]])  # row 7 is past the 6 rows
    assert _moe.row_sources(rows, 6).tolist() == [1, 3, 7, 0, -1, -1]


def _python_sum(x, rows, counts, weights):
    out = torch.zeros(rows.shape[0], x.shape[1], dtype=torch.float64)
    for t in range(rows.shape[0]):
        n = rows.shape[1] if counts is None else int(counts[t])
        for j in range(n):
            r = int(rows[t, j])
            if r >= 0:
                w = 1.0 if weights is None else float(weights[t, j])
                out[t] += x[r].double() * w
    return out


@pytest.mark.parametrize("counts", [False, True])
@pytest.mark.parametrize("weights", [False, True])
def test_token_sum_torch_path_against_float64(counts, weights):
    x = _randn(20, 7, dtype=torch.bfloat16)
    rows = torch.randint(-1, 20, (9, 4), generator=GEN().manual_seed(1))
    c = torch.randint(0, 5, (9,), generator=GEN().manual_seed(2)) if counts else None
    w = torch.rand(9, 4, generator=GEN().manual_seed(3)) if weights else None
    got = _moe.token_sum(x, rows, c, w, torch.float32)
    ref = _python_sum(x, rows, c, w)
    torch.testing.assert_close(got.double(), ref, rtol=1e-6, atol=1e-6)


_INTERPRETED = """
import torch
from transformer_engine_ops.kernels import moe_kernels
from transformer_engine_ops.ops import _moe

for dtype in (torch.float32, torch.bfloat16, torch.float16):
    for counts in (False, True):
        for weights in (False, True):
            g = torch.Generator().manual_seed(7)
            x = torch.randn(23, 37, generator=g).to(dtype)
            rows = torch.randint(-1, 23, (9, 5), generator=g)
            c = torch.randint(0, 6, (9,), generator=g) if counts else None
            w = torch.rand(9, 5, generator=g) if weights else None
            # fp32 out: the interpreter's narrowing casts are numpy's, not the GPU's.
            kernel = moe_kernels.token_sum(x, rows, c, w, torch.float32)
            # The torch path of _moe.token_sum: the same fp32 products and sums.
            tokens, slots = rows.shape
            acc = torch.zeros(tokens, 37)
            for j in range(slots):
                take = rows[:, j] >= 0
                if c is not None:
                    take = take & (c > j)
                v = _moe.gather_rows(x, rows[:, j]).float()
                if w is not None:
                    v = v * w[:, j, None]
                acc = torch.where(take[:, None], acc + v, acc)
            assert torch.equal(kernel, acc), (dtype, counts, weights)
print("ok")
"""


@pytest.mark.slow
@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
def test_token_sum_kernel_under_the_interpreter_equals_the_torch_path():
    """The kernel's fp32 products and sums, walked in slot order, are the torch path's
    (a multiply-add the compiler may contract is not contracted by the interpreter;
    the GPU tests bound the compiled kernel's difference)."""
    done = run_interpreted(_INTERPRETED, timeout=600)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]
