"""TE's fused MoE router functions (``transformer_engine_ops.router``): top-k with every
score function, grouped top-k, expert bias and scaling against a plain PyTorch
reference (probabilities, routing map, and the logits' gradient through autograd of the
reference); the bitmap and dense-index routing outputs; Quantile Balancing's
selection and histogram; the auxiliary-loss scores and loss; compiled
(``fullgraph=True``) equal to eager bit for bit; TE's messages."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from inductor_widths import SCALAR, inductor_width
from module_cases import graph_breaks

from transformer_engine_ops.router import (
    QBHistogramMode,
    RoutingMapFormat,
    fused_compute_score_for_moe_aux_loss,
    fused_moe_aux_loss,
    fused_topk_with_score_function,
)

GEN = torch.Generator


def _logits(tokens, experts, seed=0, dtype=torch.float32):
    return torch.randn(tokens, experts, generator=GEN().manual_seed(seed)).to(dtype)


def reference_topk(logits, topk, pre, groups, group_topk, scale, score_function, bias):
    """The router in plain PyTorch (float32 scores), differentiable in ``logits``."""
    x = logits.float()
    if score_function == "softmax":
        scores = torch.softmax(x, dim=-1) if pre else x
        choose = scores
    else:
        scores = torch.sigmoid(x) if score_function == "sigmoid" else F.softplus(x).sqrt()
        choose = scores if bias is None else scores + bias
    if group_topk:
        t, e = choose.shape
        best = choose.detach().view(t, groups, -1).topk(topk // group_topk, dim=-1)[0].sum(-1)
        keep = torch.zeros(t, groups, dtype=torch.bool)
        keep.scatter_(1, best.topk(group_topk, dim=-1)[1], True)
        keep = keep.unsqueeze(-1).expand(t, groups, e // groups).reshape(t, e)
        choose = choose.masked_fill(~keep, float("-inf"))
    index = choose.detach().topk(topk, dim=-1)[1]
    values = scores.gather(1, index)
    if score_function == "softmax":
        probs = values if pre else torch.softmax(values, dim=-1)
    else:
        probs = values / (values.sum(-1, keepdim=True) + 1e-20) if topk > 1 else values
    if scale:
        probs = probs * scale
    out = torch.zeros_like(logits).scatter(1, index, probs.to(logits.dtype))
    return out, torch.zeros_like(logits, dtype=torch.bool).scatter(1, index, True)


CASES = {
    "softmax": dict(score_function="softmax"),
    "softmax-pre": dict(score_function="softmax", pre=True),
    "softmax-grouped-scaled": dict(score_function="softmax", groups=4, group_topk=2, scale=1.2),
    "sigmoid": dict(score_function="sigmoid"),
    "sigmoid-bias-grouped": dict(score_function="sigmoid", bias=True, groups=4, group_topk=2),
    "sqrtsoftplus-bias-scaled": dict(score_function="sqrtsoftplus", bias=True, scale=2.5),
    "sigmoid-top1": dict(score_function="sigmoid", topk=1),
}


def _call(logits, case, **extra):
    c = {"topk": 4, "pre": False, "groups": None, "group_topk": None, "scale": None, **case}
    bias = torch.linspace(-0.3, 0.3, logits.shape[-1]) if c.get("bias") else None
    args = (
        logits,
        c["topk"],
        c["pre"],
        c["groups"],
        c["group_topk"],
        c["scale"],
        c["score_function"],
        bias,
    )
    return args, extra


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", list(CASES))
def test_topk_against_the_reference(case, dtype):
    logits = _logits(33, 16, dtype=dtype).requires_grad_(True)
    ref_logits = logits.detach().clone().requires_grad_(True)
    args, _ = _call(logits, CASES[case])
    probs, routing = fused_topk_with_score_function(*args)
    ref_probs, ref_map = reference_topk(ref_logits, *args[1:])
    assert probs.dtype == dtype and routing.dtype == torch.bool
    assert torch.equal(routing, ref_map)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(probs, ref_probs, rtol=tol, atol=tol)
    g = _logits(33, 16, seed=3, dtype=dtype)
    probs.backward(g)
    ref_probs.backward(g)
    torch.testing.assert_close(logits.grad, ref_logits.grad, rtol=tol, atol=tol)


def test_leading_dims_are_kept():
    logits = _logits(24, 8).view(12, 2, 8)
    probs, routing = fused_topk_with_score_function(
        logits, 2, False, None, None, None, "softmax", None
    )
    assert probs.shape == (12, 2, 8) and routing.shape == (12, 2, 8)
    indices = torch.empty(12, 2, 2, dtype=torch.int16)
    _, routing = fused_topk_with_score_function(
        logits, 2, False, None, None, None, "softmax", None, topk_indices=indices
    )
    assert routing is indices


@pytest.mark.parametrize("dtype", [torch.int16, torch.int32, torch.int64])
def test_dense_indices_are_written_in_place(dtype):
    logits = _logits(9, 12).requires_grad_(True)
    buffer = torch.full((9, 3), -7, dtype=dtype)
    probs, routing = fused_topk_with_score_function(
        logits, 3, False, None, None, None, "sigmoid", None, topk_indices=buffer
    )
    assert routing is buffer and routing.dtype == dtype
    _, ref_map = fused_topk_with_score_function(
        logits.detach(), 3, False, None, None, None, "sigmoid", None
    )
    rebuilt = torch.zeros(9, 12, dtype=torch.bool).scatter_(1, buffer.long(), True)
    assert torch.equal(rebuilt, ref_map)


def _packed(bytemap):
    t, e = bytemap.shape
    bits = F.pad(bytemap.to(torch.int64), (0, (-e) % 8)).view(t, -1, 8)
    return (bits << torch.arange(8)).sum(-1).to(torch.uint8)


@pytest.mark.parametrize("fmt", ["bitmap_u8", RoutingMapFormat.BITMAP_U8, 1])
@pytest.mark.parametrize("experts", [16, 13])
def test_bitmap_is_the_lsb_first_bytemap_with_the_same_probs_and_gradient(fmt, experts):
    logits = _logits(10, experts).requires_grad_(True)
    other = logits.detach().clone().requires_grad_(True)
    probs, bytemap = fused_topk_with_score_function(
        logits, 3, False, None, None, None, "sqrtsoftplus", None
    )
    bprobs, bitmap = fused_topk_with_score_function(
        other, 3, False, None, None, None, "sqrtsoftplus", None, routing_map_format=fmt
    )
    assert bitmap.dtype == torch.uint8 and bitmap.shape == (10, (experts + 7) // 8)
    assert torch.equal(bitmap, _packed(bytemap))
    assert torch.equal(probs, bprobs)
    probs.sum().backward()
    bprobs.sum().backward()
    assert torch.equal(logits.grad, other.grad)


def test_tes_messages():
    logits = _logits(4, 8)
    call = fused_topk_with_score_function
    with pytest.raises(ValueError, match="does not support float64 router type"):
        call(logits.double(), 2, False, None, None, None, "softmax", None)
    with pytest.raises(ValueError, match="routing_map_format string must be 'bytemap'"):
        call(logits, 2, False, None, None, None, "softmax", None, routing_map_format="BYTEMAP")
    with pytest.raises(ValueError, match="routing_map_format int must be one of"):
        call(logits, 2, False, None, None, None, "softmax", None, routing_map_format=5)
    with pytest.raises(TypeError, match="routing_map_format must be an int"):
        call(logits, 2, False, None, None, None, "softmax", None, routing_map_format=1.0)
    bias, hist = torch.zeros(8), torch.zeros(8, 10, dtype=torch.int32)
    with pytest.raises(ValueError, match="provided together"):
        call(logits, 2, False, None, None, None, "sigmoid", bias, qb_histogram=hist)
    bounds = torch.tensor([-1.0, 1.0])
    qb = dict(qb_histogram=hist, qb_bin_bounds=bounds, qb_histogram_mode="two_kernel")
    with pytest.raises(ValueError, match="only supports score_function='sigmoid'"):
        call(logits, 2, False, None, None, None, "softmax", bias, **qb)
    with pytest.raises(ValueError, match="requires expert_bias"):
        call(logits, 2, False, None, None, None, "sigmoid", None, **qb)
    with pytest.raises(ValueError, match="does not support grouped Top-k"):
        call(logits, 2, False, 2, 1, None, "sigmoid", bias, **qb)
    with pytest.raises(ValueError, match="qb_histogram_mode must be 'two_kernel' or"):
        call(
            logits, 2, False, None, None, None, "sigmoid", bias, **{**qb, "qb_histogram_mode": "x"}
        )


# --- Quantile Balancing ---------------------------------------------------------------


def reference_qb(logits, topk, bias, bounds, bins):
    raw = torch.sigmoid(logits.float())
    biased = raw + bias
    values, ids = torch.topk(biased, k=topk + 1, dim=-1)
    cutoff = values.min(dim=-1).values
    dropped = ids.masked_fill(values != cutoff[:, None], -1).max(dim=-1).values
    chosen = ids[ids != dropped[:, None]].reshape(-1, topk)
    picked = raw.gather(1, chosen)
    p = picked / (picked.sum(-1, keepdim=True) + 1e-20) if topk > 1 else picked
    probs = torch.zeros_like(raw).scatter(1, chosen, p).to(logits.dtype)
    routing = torch.zeros_like(raw, dtype=torch.bool).scatter(1, chosen, True)
    need = cutoff[:, None] - raw
    scale = bins / (bounds[1] - bounds[0])
    index = torch.floor((need - bounds[0]) * scale).to(torch.int64).clamp(0, bins - 1)
    index = index + torch.arange(raw.shape[1]) * bins
    counts = torch.bincount(index.reshape(-1), minlength=raw.shape[1] * bins)
    return probs, routing, counts.view(raw.shape[1], bins).to(torch.int32)


@pytest.mark.parametrize("mode", ["two_kernel", "fused_atomic"])
@pytest.mark.parametrize("output", ["bytemap", "bitmap_u8", "dense"])
def test_quantile_balancing_selection_and_histogram(mode, output):
    logits = _logits(57, 48, seed=5).requires_grad_(True)
    bias = torch.linspace(-0.2, 0.2, 48)
    bounds = torch.stack((bias.min() - 1.0, bias.max() + 1.0))
    hist = torch.zeros(48, 100, dtype=torch.int32)
    dense = torch.empty(57, 6, dtype=torch.int32) if output == "dense" else None
    probs, routing = fused_topk_with_score_function(
        logits,
        6,
        False,
        None,
        None,
        None,
        "sigmoid",
        bias,
        routing_map_format="bitmap_u8" if output == "bitmap_u8" else "bytemap",
        topk_indices=dense,
        qb_histogram=hist,
        qb_bin_bounds=bounds,
        qb_histogram_mode=mode,
    )
    ref = logits.detach().clone().requires_grad_(True)
    ref_probs, ref_map, ref_hist = reference_qb(ref, 6, bias, bounds, 100)
    torch.testing.assert_close(probs, ref_probs)
    assert torch.equal(hist, ref_hist)
    if output == "dense":
        routing = torch.zeros(57, 48, dtype=torch.bool).scatter_(1, routing.long(), True)
    elif output == "bitmap_u8":
        ref_map = _packed(ref_map)
    assert torch.equal(routing, ref_map)
    g = _logits(57, 48, seed=6)
    probs.backward(g)
    ref_probs.backward(g)
    torch.testing.assert_close(logits.grad, ref.grad, atol=1e-5, rtol=1e-5)


def test_quantile_balancing_histogram_accumulates_and_drops_the_highest_tied_expert():
    logits = torch.tensor([[3.0, 3.0, 3.0, -1.0, -2.0, -3.0, -4.0, -5.0]])
    bias = torch.zeros(8)
    hist = torch.zeros(8, 8, dtype=torch.int32)
    bounds = torch.tensor([-0.05, 0.05])
    args = (logits, 2, False, None, None, None, "sigmoid", bias)
    qb = dict(qb_histogram=hist, qb_bin_bounds=bounds, qb_histogram_mode="fused_atomic")
    _, routing = fused_topk_with_score_function(*args, **qb)
    assert routing[0, :3].tolist() == [True, True, False]
    fused_topk_with_score_function(*args, **qb)
    assert hist.sum().item() == 2 * 8  # every expert counted once a call


@pytest.mark.parametrize("bounds", [[1.0, 1.0], [1.0, -1.0], [float("nan"), 1.0]])
def test_quantile_balancing_refuses_bounds_that_are_not_finite_and_increasing(bounds):
    logits, bias = _logits(8, 16), torch.zeros(16)
    hist = torch.zeros(16, 32, dtype=torch.int32)
    with pytest.raises(ValueError, match="finite with lower < upper"):
        fused_topk_with_score_function(
            logits,
            4,
            False,
            None,
            None,
            None,
            "sigmoid",
            bias,
            qb_histogram=hist,
            qb_bin_bounds=torch.tensor(bounds),
            qb_histogram_mode=QBHistogramMode.TWO_KERNEL,
        )


def test_quantile_balancing_reads_bounds_again_after_an_in_place_update():
    logits, bias = _logits(8, 16), torch.zeros(16)
    hist = torch.zeros(16, 32, dtype=torch.int32)
    bounds = torch.tensor([-1.0, 1.0])
    qb = dict(qb_histogram=hist, qb_bin_bounds=bounds, qb_histogram_mode="two_kernel")
    fused_topk_with_score_function(logits, 4, False, None, None, None, "sigmoid", bias, **qb)
    bounds.fill_(0.0)
    with pytest.raises(ValueError, match="finite with lower < upper"):
        fused_topk_with_score_function(logits, 4, False, None, None, None, "sigmoid", bias, **qb)


# --- the auxiliary loss -----------------------------------------------------------------


@pytest.mark.parametrize("score_function", ["softmax", "sigmoid", "sqrtsoftplus"])
@pytest.mark.parametrize("fmt", ["bytemap", "bitmap_u8"])
def test_aux_loss_scores_against_the_reference(score_function, fmt):
    logits = _logits(21, 12, seed=7).requires_grad_(True)
    ref = logits.detach().clone().requires_grad_(True)
    routing, scores = fused_compute_score_for_moe_aux_loss(logits, 3, score_function, fmt)
    if score_function == "softmax":
        expected = torch.softmax(ref, dim=-1)
    else:
        a = torch.sigmoid(ref) if score_function == "sigmoid" else F.softplus(ref).sqrt()
        expected = a / (a.sum(-1, keepdim=True) + 1e-20)
    index = expected.detach().topk(3, dim=-1)[1]
    ref_map = torch.zeros(21, 12, dtype=torch.bool).scatter_(1, index, True)
    assert scores.dtype == torch.float32
    torch.testing.assert_close(scores, expected)
    assert torch.equal(routing, ref_map if fmt == "bytemap" else _packed(ref_map))
    g = _logits(21, 12, seed=8)
    scores.backward(g)
    expected.backward(g)
    torch.testing.assert_close(logits.grad, ref.grad)


@pytest.mark.parametrize("total", ["int", "tensor"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_aux_loss_against_the_reference(total, dtype):
    probs = _logits(40, 16, seed=9, dtype=dtype).requires_grad_(True)
    ref = probs.detach().double().requires_grad_(True)
    counts = torch.randint(1, 100, (16,), generator=GEN().manual_seed(1), dtype=torch.int32)
    tokens = torch.tensor(40) if total == "tensor" else 40
    loss = fused_moe_aux_loss(probs, counts, tokens, 8, 4, 0.01)
    expected = (ref.sum(0) * counts.double()).sum() * (8 * 0.01 / (4 * 40 * 40))
    assert loss.dtype == dtype and loss.shape == ()
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(loss.double(), expected, rtol=tol, atol=1e-7)
    loss.backward()
    expected.backward()
    torch.testing.assert_close(probs.grad.double(), ref.grad, rtol=tol, atol=1e-9)


# --- compiled -----------------------------------------------------------------------


def _router_step(logits, bias, hist, bounds):
    probs, routing = fused_topk_with_score_function(
        logits, 4, False, None, None, 1.5, "sigmoid", bias
    )
    qprobs, _ = fused_topk_with_score_function(
        logits,
        4,
        False,
        None,
        None,
        None,
        "sigmoid",
        bias,
        qb_histogram=hist,
        qb_bin_bounds=bounds,
        qb_histogram_mode="two_kernel",
    )
    rmap, scores = fused_compute_score_for_moe_aux_loss(logits, 4, "softmax")
    loss = fused_moe_aux_loss(scores, rmap.sum(0), logits.shape[0], 16, 4, 0.01)
    return probs, qprobs, loss


@pytest.mark.parametrize("width", [None, SCALAR], ids=["native", "scalar"])
def test_compiled_fullgraph_equals_eager_bitwise(width):
    logits = _logits(30, 16, seed=11)
    bias = torch.linspace(-0.1, 0.1, 16)
    bounds = torch.tensor([-1.0, 1.0])

    cotangents = (_logits(30, 16, seed=12), _logits(30, 16, seed=13), torch.tensor(2.0))

    def run(fn):
        # The ops' outputs and the logits' gradient (reductions outside the ops would
        # be Inductor's to order: the test keeps them out of the compiled function).
        x = logits.clone().requires_grad_(True)
        hist = torch.zeros(16, 20, dtype=torch.int32)
        outs = fn(x, bias, hist, bounds)
        torch.autograd.backward(outs, cotangents)
        return (*(o.detach() for o in outs), x.grad, hist)

    eager = run(_router_step)
    with inductor_width(width):
        got = run(torch.compile(_router_step, fullgraph=True))
        assert graph_breaks() == 0
    for a, b in zip(got, eager, strict=True):
        assert torch.equal(a, b)
