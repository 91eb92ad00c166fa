"""A small GPT built from ``te.TransformerLayer``, trained eagerly and compiled, bf16 and
every recipe.

The model: a token embedding, two ``te.TransformerLayer`` (64 hidden, 4 heads in 2 KV
groups, RMSNorm, SwiGLU FFN of 128, rotary position embeddings, causal self
attention, dropout 0), a final ``te.RMSNorm`` and a ``te.Linear`` vocabulary head, bf16
parameters. It learns a next-token rule (each token is the previous one plus one, modulo
the vocabulary) for a few AdamW steps twice from the same initial weights: once eagerly
and once compiled with ``fullgraph=True`` on the default Inductor backend with its
default settings. The compiled run must take zero graph breaks and agree with eager bit
for bit (logits, loss and every gradient, every step); the script exits non-zero
otherwise. Why that holds on every host is ``demo/host.py``'s ``BASIS_NOTE``; the host's
vector ISAs are printed beside the table.

Run: ``python demo/gpt_demo.py [RECIPE ...]`` (a few minutes on 2 CPU cores, compilation
mostly; recipe names as printed, e.g. ``bf16``, to run only those).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import logging
import os
import sys
import time
from typing import Any

import torch
import torch.nn.functional as F
from exactness import BASIS, BASIS_NOTE, host_line
from torch._dynamo.utils import counters

import transformer_engine_ops as te
from transformer_engine_ops.quantization import (
    Float8BlockScaling,
    Float8CurrentScaling,
    MXFP8BlockScaling,
    NVFP4BlockScaling,
)

BACKEND = "inductor"
VOCAB, HIDDEN, FFN, HEADS, GROUPS, LAYERS = 128, 64, 128, 4, 2, 2
BATCH, SEQ = 4, 32
STEPS = 4  # the first compiled step includes compilation and is not timed
RECIPES: list[tuple[str, Any]] = [
    ("bf16", None),
    ("Float8CurrentScaling", Float8CurrentScaling),
    ("MXFP8BlockScaling", MXFP8BlockScaling),
    ("Float8BlockScaling", Float8BlockScaling),
    # Stochastic rounding and the random Hadamard transform off: the eager and compiled
    # runs start from different generator states (as in demo/linear_demo.py).
    (
        "NVFP4BlockScaling",
        functools.partial(NVFP4BlockScaling, disable_rht=True, disable_stochastic_rounding=True),
    ),
]


class GPT(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        dtype = torch.bfloat16
        # The token embedding as a one-hot product through a te.Linear: its gradient is
        # then the op's own GEMM. An embedding lookup's gradient is a scatter-add, which
        # Inductor would generate with its own summation order.
        self.embed = te.Linear(VOCAB, HIDDEN, bias=False, params_dtype=dtype)
        self.rope = te.RotaryPositionEmbedding(HIDDEN // HEADS)
        self.layers = torch.nn.ModuleList(
            te.TransformerLayer(
                HIDDEN,
                FFN,
                HEADS,
                num_gqa_groups=GROUPS,
                normalization="RMSNorm",
                activation="swiglu",
                bias=False,
                hidden_dropout=0.0,
                attention_dropout=0.0,
                layer_number=i + 1,
                attn_input_format="bshd",
                params_dtype=dtype,
            )
            for i in range(LAYERS)
        )
        self.norm = te.RMSNorm(HIDDEN, params_dtype=dtype)
        self.head = te.Linear(HIDDEN, VOCAB, bias=False, params_dtype=dtype)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(F.one_hot(tokens, VOCAB).to(self.embed.weight.dtype))
        freqs = self.rope(tokens.shape[1])
        for layer in self.layers:
            x = layer(x, rotary_pos_emb=freqs)
        return self.head(self.norm(x))


def _batch(gen: torch.Generator) -> torch.Tensor:
    start = torch.randint(0, VOCAB, (BATCH, 1), generator=gen)
    return (start + torch.arange(SEQ + 1)) % VOCAB


def _train_step(model: Any, params: list, opt: Any, tokens: torch.Tensor, recipe: Any) -> tuple:
    """One AdamW step; returns (logits, loss, gradients, seconds)."""
    opt.zero_grad(set_to_none=True)
    ctx = te.autocast(recipe=recipe()) if recipe is not None else contextlib.nullcontext()
    start = time.perf_counter()
    with ctx:
        logits = model(tokens[:, :-1])
    loss = F.cross_entropy(logits.float().reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
    loss.backward()
    opt.step()
    seconds = time.perf_counter() - start
    return logits.detach(), loss.detach(), [p.grad.clone() for p in params], seconds


def _max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().max().item()


def run(name: str, recipe: Any) -> dict[str, Any]:
    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    eager = GPT()
    compiled_model = copy.deepcopy(eager)
    compiled = torch.compile(compiled_model, fullgraph=True, backend=BACKEND)
    eager_params, comp_params = list(eager.parameters()), list(compiled_model.parameters())
    eager_opt = torch.optim.AdamW(eager_params, lr=3e-3)
    comp_opt = torch.optim.AdamW(comp_params, lr=3e-3)
    gen = torch.Generator().manual_seed(1)
    out_diff = grad_diff = 0.0
    eager_times, comp_times = [], []
    losses = []
    for i in range(STEPS):
        tokens = _batch(gen)
        y_e, loss_e, g_e, t_e = _train_step(eager, eager_params, eager_opt, tokens, recipe)
        y_c, loss_c, g_c, t_c = _train_step(compiled, comp_params, comp_opt, tokens, recipe)
        out_diff = max(out_diff, _max_abs_diff(y_c, y_e), _max_abs_diff(loss_c, loss_e))
        grad_diff = max(grad_diff, *(_max_abs_diff(a, b) for a, b in zip(g_c, g_e, strict=True)))
        losses.append(loss_e.item())
        if i > 0:
            eager_times.append(t_e)
            comp_times.append(t_c)
        print(
            f"  [{name}] step {i + 1}/{STEPS}: loss {loss_e.item():.4f}, eager "
            f"{t_e * 1e3:7.1f} ms, compiled {t_c * 1e3:7.1f} ms"
            f"{' (includes compile)' if i == 0 else ''}, max|diff| out {out_diff:g} "
            f"grads {grad_diff:g}",
            flush=True,
        )
    return dict(
        recipe=name,
        breaks=sum(counters["graph_break"].values()),
        compiles=counters["stats"]["unique_graphs"],
        out_diff=out_diff,
        grad_diff=grad_diff,
        first_loss=losses[0],
        last_loss=losses[-1],
        eager_ms=1e3 * sum(eager_times) / len(eager_times),
        comp_ms=1e3 * sum(comp_times) / len(comp_times),
    )


def main() -> int:
    # A CPU demo (its inputs are CPU tensors): modules built without a device stay on the
    # CPU of a CUDA machine too, whatever the environment held (device=None is TE's CUDA
    # default where CUDA is available).
    os.environ["TEOPS_DEFAULT_DEVICE"] = "cpu"
    torch.set_num_threads(min(torch.get_num_threads(), 2))
    logging.getLogger("torch._inductor.codecache").setLevel(logging.ERROR)
    print(
        f"GPT: vocab {VOCAB}, {LAYERS} x te.TransformerLayer ({HIDDEN} hidden, {HEADS} heads / "
        f"{GROUPS} KV groups, RMSNorm, SwiGLU {FFN}, RoPE), bf16 params, batch {BATCH} x "
        f"{SEQ} tokens, {STEPS} AdamW steps; torch.compile(fullgraph=True, "
        f"backend={BACKEND!r}) vs eager",
        flush=True,
    )
    print(host_line(), flush=True)
    chosen = sys.argv[1:]  # recipe names to run (default: all)
    rows = []
    for name, recipe in RECIPES:
        if chosen and name not in chosen:
            continue
        print(f"{name}:", flush=True)
        rows.append(run(name, recipe))
    header = (
        f"{'recipe':<21}| {'graph breaks':>12} | {'compiles':>8} | {'max|c-e| out':>12} | "
        f"{'max|c-e| grads':>14} | {'loss first->last':>16} | {'eager ms':>8} | "
        f"{'compiled ms':>11} | basis"
    )
    print()
    print(header)
    print("-" * len(header))
    for r in rows:
        print(
            f"{r['recipe']:<21}| {r['breaks']:>12} | {r['compiles']:>8} | "
            f"{r['out_diff']:>12g} | {r['grad_diff']:>14g} | "
            f"{r['first_loss']:>7.3f}->{r['last_loss']:<7.3f} | {r['eager_ms']:>8.1f} | "
            f"{r['comp_ms']:>11.1f} | {BASIS}"
        )
    print(BASIS_NOTE)
    bad = [r["recipe"] for r in rows if r["breaks"] or r["out_diff"] or r["grad_diff"]]
    if bad:
        print(f"\nFAIL: compiled differs from eager or broke the graph: {', '.join(bad)}")
        return 1
    print("\nOK: every recipe compiled with zero graph breaks, bit-identical to eager")
    return 0


if __name__ == "__main__":
    sys.exit(main())
