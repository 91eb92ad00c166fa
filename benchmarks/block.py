"""Figure 9: compile time and CPU step time of a transformer-style block.

The block of ``demo/``: ``LayerNormLinear`` -> ``Linear`` -> residual -> ``LayerNormMLP``
(gelu, its own residual), against the same block built from ``torch.nn`` modules
(``nn.LayerNorm`` + ``nn.Linear``; ``nn.Linear``; ``nn.LayerNorm`` + ``nn.Linear`` +
tanh-gelu + ``nn.Linear``), bf16 parameters, same initial weights. Contenders:
``torch/bf16``, ``ours/bf16``, ``ours/fp8`` (FP8 current scaling through ``autocast``).

Compile: per round, each contender in turn: ``torch._dynamo.reset()``, a fresh model,
``torch.compile(fullgraph=True)``, wall time of the first training step (caches cold,
as figure 4), then a few more steps (recompiles must stay 0). Step: the last round's
eager and compiled models, every one measured in turn within each round
(``blocked_autorange``), as figure 5.
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.nn.functional as F
from torch._dynamo.utils import counters

from transformer_engine_ops.modules import LayerNormLinear, LayerNormMLP, Linear

from .common import interleaved, progress, ratio_stats, stats
from .compile_time import _breaks, _cold_caches, _graphs
from .models import make_input, train_step
from .step_time import _step_fn

CONFIGS = (("torch", "bf16"), ("ours", "bf16"), ("ours", "fp8"))
# (rows, hidden, ffn) as in demo/linear_demo.py: 64 tokens, 256 features, 512 FFN.
SHAPE = (64, 256, 512)


class TorchBlock(torch.nn.Module):
    """The block from ``torch.nn`` modules, parameter for parameter the same as ours."""

    def __init__(self, hidden: int, ffn: int) -> None:
        super().__init__()
        kw: dict[str, Any] = {"dtype": torch.bfloat16}
        self.ln1 = torch.nn.LayerNorm(hidden, eps=1e-5, **kw)
        self.qkv = torch.nn.Linear(hidden, hidden, **kw)
        self.proj = torch.nn.Linear(hidden, hidden, **kw)
        self.ln2 = torch.nn.LayerNorm(hidden, eps=1e-5, **kw)
        self.fc1 = torch.nn.Linear(hidden, ffn, **kw)
        self.fc2 = torch.nn.Linear(ffn, hidden, **kw)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.proj(self.qkv(self.ln1(x)))
        # TE's "gelu" is the tanh approximation.
        return h + self.fc2(F.gelu(self.fc1(self.ln2(h)), approximate="tanh"))


class OurBlock(torch.nn.Module):
    """``LayerNormLinear`` -> ``Linear`` -> residual -> ``LayerNormMLP`` (+ residual)."""

    def __init__(self, hidden: int, ffn: int) -> None:
        super().__init__()
        kw: dict[str, Any] = {"params_dtype": torch.bfloat16}
        self.ln_qkv = LayerNormLinear(hidden, hidden, **kw)
        self.proj = Linear(hidden, hidden, **kw)
        self.mlp = LayerNormMLP(hidden, ffn, **kw)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.proj(self.ln_qkv(x))
        return h + self.mlp(h)


def make_block(kind: str, hidden: int, ffn: int, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    if kind == "ours":
        return OurBlock(hidden, ffn)
    if kind == "torch":
        return TorchBlock(hidden, ffn)
    raise ValueError(f"unknown block kind {kind!r}")


def _compile_once(kind: str, recipe: str, steps: int) -> dict[str, Any]:
    rows, hidden, ffn = SHAPE
    torch._dynamo.reset()
    counters.clear()
    model = make_block(kind, hidden, ffn)
    compiled = torch.compile(model, fullgraph=True)
    x = make_input(rows, hidden)
    start = time.perf_counter()
    train_step(compiled, x, recipe)
    first = time.perf_counter() - start
    graphs_first = _graphs()
    for _ in range(steps):
        train_step(compiled, x, recipe)
    return {
        "first_step_s": first,
        "graphs_after_first": graphs_first,
        "graphs_after_steps": _graphs(),
        "recompiles": _graphs() - graphs_first,
        "graph_breaks": _breaks(),
        "model": model,
        "compiled": compiled,
    }


def run(
    rounds: int = 3,
    steps: int = 3,
    step_rounds: int = 5,
    min_run_time: float = 0.3,
    configs: tuple[tuple[str, str], ...] = CONFIGS,
) -> dict[str, Any]:
    _cold_caches()
    rows, hidden, ffn = SHAPE
    progress(
        f"figure 9: block compile + step, {len(configs)} configs x {rounds} rounds, "
        f"{rows}x{hidden}, FFN {ffn}"
    )
    # A throwaway compile absorbs the process-wide first-use costs (as figure 4).
    torch._dynamo.reset()
    warm = torch.compile(make_block("torch", hidden, ffn), fullgraph=True)
    train_step(warm, make_input(4, hidden), "bf16")
    first: dict[str, list[float]] = {}
    counts: dict[str, dict[str, int]] = {}
    models: dict[tuple[str, str], Any] = {}
    for r in range(rounds):
        for kind, recipe in configs:
            name = f"{kind}/{recipe}"
            out = _compile_once(kind, recipe, steps)
            first.setdefault(name, []).append(out["first_step_s"])
            counts[name] = {
                k: out[k]
                for k in ("graphs_after_first", "graphs_after_steps", "recompiles", "graph_breaks")
            }
            models[(kind, recipe)] = (out["model"], out["compiled"])
            progress(
                f"  round {r + 1}/{rounds} {name}: first step {out['first_step_s']:.2f} s, "
                f"graphs {out['graphs_after_first']} -> {out['graphs_after_steps']}, "
                f"breaks {out['graph_breaks']}"
            )
    base = first.get("torch/bf16")
    result: dict[str, Any] = {
        "shape": [rows, hidden, ffn],
        "steps": steps,
        "first_step_s": {k: stats(v) for k, v in first.items()},
        "compile_ratio_vs_torch": {
            k: ratio_stats(v, base) for k, v in first.items() if base and k != "torch/bf16"
        },
        "counts": counts,
    }
    x = make_input(rows, hidden)
    fns: dict[str, Any] = {}
    for (kind, recipe), (eager, compiled) in models.items():
        for mode, model in (("eager", eager), ("compiled", compiled)):
            fn = _step_fn(model, x, recipe)
            fn()
            fn()
            fns[f"{kind}/{recipe}/{mode}"] = fn
    runs = interleaved(fns, rounds=step_rounds, min_run_time=min_run_time, label="block")
    result["step_ms"] = {k: stats([s * 1e3 for s in v]) for k, v in runs.items()}
    result["eager_over_compiled"] = {
        f"{kind}/{recipe}": ratio_stats(
            runs[f"{kind}/{recipe}/eager"], runs[f"{kind}/{recipe}/compiled"]
        )
        for kind, recipe in configs
    }
    result["step_ratio_vs_torch_same_mode"] = {
        k: ratio_stats(v, runs[f"torch/bf16/{k.rsplit('/', 1)[1]}"])
        for k, v in runs.items()
        if not k.startswith("torch/") and f"torch/bf16/{k.rsplit('/', 1)[1]}" in runs
    }
    for k, v in result["step_ms"].items():
        progress(f"  block step {k}: {v['median']:.2f} ms (IQR {v['q1']:.2f}-{v['q3']:.2f})")
    return result
