"""A mixture-of-experts layer built as TE users build one, trained eagerly and compiled,
bf16 and FP8.

The layer (:class:`MoELayer`): a bias-free router (``te.Linear``, run without the
recipe), TE's softmax top-k (``fused_topk_with_score_function``), ``te.moe_permute``,
a ``te.GroupedLinear`` fc1, SwiGLU, a ``te.GroupedLinear`` fc2 and ``te.moe_unpermute``
merging the experts' rows with the routing probabilities. The experts' row counts stay
on the device (``routing_map.sum(0)``): no host synchronization, and one compiled graph
whatever the routing. Here 8 experts, top-2, hidden 64, expert FFN 32, 128 tokens, bf16
parameters; it learns a fixed random linear map for a few AdamW steps twice from the
same initial weights: once eagerly, once compiled with ``fullgraph=True`` on Inductor.
The compiled run must take zero graph breaks, compile one graph and agree with eager bit
for bit (output, loss and every gradient, every step); the script exits non-zero
otherwise. bf16 and FP8 current scaling run on GroupedLinear's grouped GEMM, FP8 block
scaling on its per-expert loop.

Run: ``python demo/moe_demo.py [RECIPE ...]`` (about a minute on 2 CPU cores).
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import sys
import time
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch._dynamo.utils import counters

import transformer_engine_ops as te
from transformer_engine_ops.modules.activation import activation
from transformer_engine_ops.quantization import Float8BlockScaling, Float8CurrentScaling
from transformer_engine_ops.router import fused_topk_with_score_function

BACKEND = "inductor"
HIDDEN, EXPERTS, TOPK, FFN, TOKENS = 64, 8, 2, 32, 128
STEPS = 4  # the first compiled step includes compilation and is not timed
RECIPES: list[tuple[str, Any]] = [
    ("bf16", None),
    ("Float8CurrentScaling", Float8CurrentScaling),
    ("Float8BlockScaling", Float8BlockScaling),
]


class MoELayer(nn.Module):
    """Router, permutation, two ``te.GroupedLinear`` with SwiGLU between, unpermutation.
    ``forward(x)`` takes ``[tokens, hidden]``."""

    def __init__(
        self,
        hidden: int,
        experts: int,
        topk: int,
        ffn: int,
        *,
        device: Any = None,
        single_grouped_weight: bool = False,
    ) -> None:
        super().__init__()
        dtype = torch.bfloat16
        self.topk = topk
        self.router = te.Linear(hidden, experts, bias=False, params_dtype=dtype, device=device)
        # ``single_grouped_weight`` (TE's, behind NVTE_GROUPED_LINEAR_SINGLE_PARAM): each
        # GroupedLinear holds one [experts, out, in] weight instead of one per expert; TE
        # asks for its grouped-tensor path with it (``use_grouped_tensor=True``).
        grouped = dict(
            bias=False,
            params_dtype=dtype,
            device=device,
            single_grouped_weight=single_grouped_weight,
            use_grouped_tensor=single_grouped_weight,
        )
        self.fc1 = te.GroupedLinear(experts, hidden, 2 * ffn, **grouped)
        self.fc2 = te.GroupedLinear(experts, ffn, hidden, **grouped)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(probs [T, E] fp32, routing map [T, E] bool)``: the router in bf16 without
        the recipe (as MoE models keep it), TE's softmax top-k over fp32 logits."""
        with te.autocast(enabled=False):
            logits = self.router(x)
        return fused_topk_with_score_function(
            logits.float(), self.topk, True, None, None, None, "softmax", None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        probs, routing = self.route(x)
        rows, row_id_map = te.moe_permute(x, routing, num_out_tokens=x.shape[0] * self.topk)
        m_splits = routing.sum(0)  # the experts' row counts, on the device
        h = activation(self.fc1(rows, m_splits), "swiglu")
        h = self.fc2(h, m_splits)
        return te.moe_unpermute(h, row_id_map, merging_probs=probs, restore_shape=x.shape)


def _batch(gen: torch.Generator, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(TOKENS, HIDDEN, generator=gen).to(torch.bfloat16)
    return x, x.float() @ target


def _train_step(model: Any, params: list, opt: Any, batch: tuple, recipe: Any) -> tuple:
    """One AdamW step; returns (output, loss, gradients, seconds). The loss is computed
    outside the model (eagerly in both runs)."""
    x, y = batch
    opt.zero_grad(set_to_none=True)
    ctx = te.autocast(recipe=recipe()) if recipe is not None else contextlib.nullcontext()
    start = time.perf_counter()
    with ctx:
        out = model(x)
    loss = F.mse_loss(out.float(), y)
    loss.backward()
    opt.step()
    seconds = time.perf_counter() - start
    return out.detach(), loss.detach(), [p.grad.clone() for p in params], seconds


def _max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().max().item()


def run(name: str, recipe: Any) -> dict[str, Any]:
    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    eager = MoELayer(HIDDEN, EXPERTS, TOPK, FFN)
    compiled_model = copy.deepcopy(eager)
    compiled = torch.compile(compiled_model, fullgraph=True, backend=BACKEND)
    eager_params, comp_params = list(eager.parameters()), list(compiled_model.parameters())
    eager_opt = torch.optim.AdamW(eager_params, lr=1e-2)
    comp_opt = torch.optim.AdamW(comp_params, lr=1e-2)
    gen = torch.Generator().manual_seed(1)
    target = 0.02 * torch.randn(HIDDEN, HIDDEN, generator=gen) / HIDDEN**0.5
    out_diff = grad_diff = 0.0
    eager_times, comp_times, losses, routings = [], [], [], set()
    for i in range(STEPS):
        batch = _batch(gen, target)
        routings.add(tuple(eager.route(batch[0])[1].sum(0).tolist()))
        y_e, loss_e, g_e, t_e = _train_step(eager, eager_params, eager_opt, batch, recipe)
        y_c, loss_c, g_c, t_c = _train_step(compiled, comp_params, comp_opt, batch, recipe)
        out_diff = max(out_diff, _max_abs_diff(y_c, y_e), _max_abs_diff(loss_c, loss_e))
        grad_diff = max(grad_diff, *(_max_abs_diff(a, b) for a, b in zip(g_c, g_e, strict=True)))
        losses.append(loss_e.item())
        if i > 0:
            eager_times.append(t_e)
            comp_times.append(t_c)
        print(
            f"  [{name}] step {i + 1}/{STEPS}: loss {loss_e.item():.4e}, eager "
            f"{t_e * 1e3:7.1f} ms, compiled {t_c * 1e3:7.1f} ms"
            f"{' (includes compile)' if i == 0 else ''}, max|diff| out {out_diff:g} "
            f"grads {grad_diff:g}",
            flush=True,
        )
    return dict(
        recipe=name,
        breaks=sum(counters["graph_break"].values()),
        compiles=counters["stats"]["unique_graphs"],
        routings=len(routings),
        out_diff=out_diff,
        grad_diff=grad_diff,
        first_loss=losses[0],
        last_loss=losses[-1],
        eager_ms=1e3 * sum(eager_times) / len(eager_times),
        comp_ms=1e3 * sum(comp_times) / len(comp_times),
    )


def main() -> int:
    from exactness import BASIS, BASIS_NOTE, host_line

    # A CPU demo (its inputs are CPU tensors): modules built without a device stay on the
    # CPU of a CUDA machine too (device=None is TE's CUDA default where CUDA is available).
    os.environ["TEOPS_DEFAULT_DEVICE"] = "cpu"
    torch.set_num_threads(min(torch.get_num_threads(), 2))
    logging.getLogger("torch._inductor.codecache").setLevel(logging.ERROR)
    print(
        f"MoE layer: {EXPERTS} experts, top-{TOPK}, hidden {HIDDEN}, expert FFN {FFN} "
        f"(SwiGLU), {TOKENS} tokens, bf16 params, {STEPS} AdamW steps; "
        f"torch.compile(fullgraph=True, backend={BACKEND!r}) vs eager",
        flush=True,
    )
    print(host_line(), flush=True)
    chosen = sys.argv[1:]
    rows = []
    for name, recipe in RECIPES:
        if chosen and name not in chosen:
            continue
        print(f"{name}:", flush=True)
        rows.append(run(name, recipe))
    header = (
        f"{'recipe':<21}| {'graph breaks':>12} | {'compiles':>8} | {'routings':>8} | "
        f"{'max|c-e| out':>12} | {'max|c-e| grads':>14} | {'loss first->last':>19} | "
        f"{'eager ms':>8} | {'compiled ms':>11} | basis"
    )
    print()
    print(header)
    print("-" * len(header))
    for r in rows:
        print(
            f"{r['recipe']:<21}| {r['breaks']:>12} | {r['compiles']:>8} | {r['routings']:>8} | "
            f"{r['out_diff']:>12g} | {r['grad_diff']:>14g} | "
            f"{r['first_loss']:.2e}->{r['last_loss']:.2e} | {r['eager_ms']:>8.1f} | "
            f"{r['comp_ms']:>11.1f} | {BASIS}"
        )
    print(BASIS_NOTE)
    bad = [
        r["recipe"]
        for r in rows
        if r["breaks"] or r["compiles"] != 1 or r["out_diff"] or r["grad_diff"]
    ]
    if bad:
        print(
            f"\nFAIL: compiled differs from eager, recompiled or broke the graph: {', '.join(bad)}"
        )
        return 1
    print("\nOK: every recipe compiled once with zero graph breaks, bit-identical to eager")
    return 0


if __name__ == "__main__":
    sys.exit(main())
