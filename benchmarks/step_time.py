"""Figure 5: CPU training-step time (forward + backward) of the MLP, eager vs compiled.

Per shape: our ``Linear`` (bf16, FP8 current scaling) and ``torch.nn.Linear`` (bf16), each
eager and compiled (fullgraph, Inductor), all measured in turn within each round with
``torch.utils.benchmark`` (``blocked_autorange``), after warm-up steps that include the
compilation.
"""

from __future__ import annotations

from typing import Any

import torch

from .common import interleaved, progress, ratio_stats, stats
from .compile_time import _cold_caches
from .models import SHAPES, make_input, make_model, train_step

CONFIGS = {"small": (("torch", "bf16"), ("ours", "bf16"), ("ours", "fp8"))}
# torch.nn.Linear in bf16 runs its GEMMs in bf16 on the CPU, which this machine does
# ~100x slower than fp32 (no AVX512-BF16/AMX): 30+ s a medium step, so it is left out.
CONFIGS["medium"] = (("ours", "bf16"), ("ours", "fp8"))
CONFIGS["tiny"] = CONFIGS["small"]


def run(
    shapes: tuple[str, ...] = ("small", "medium"),
    rounds: int = 5,
    min_run_time: dict[str, float] | None = None,
    reuse: dict[tuple[str, str], Any] | None = None,
    configs: dict[str, tuple[tuple[str, str], ...]] | None = None,
) -> dict[str, Any]:
    _cold_caches()
    min_run_time = min_run_time or {"tiny": 0.01, "small": 0.3, "medium": 1.0}
    results: dict[str, Any] = {}
    for shape in shapes:
        rows, hidden = SHAPES[shape]
        progress(f"figure 5: CPU step time, {shape} {rows}x{hidden}, {rounds} rounds")
        x = make_input(rows, hidden)
        fns: dict[str, Any] = {}
        for kind, recipe in (configs or CONFIGS)[shape]:
            if reuse and shape in ("small", "tiny") and (kind, recipe) in reuse:
                eager, compiled = reuse[(kind, recipe)]
            else:
                torch._dynamo.reset()
                eager = make_model(kind, hidden)
                compiled = torch.compile(eager, fullgraph=True)
            for mode, model in (("eager", eager), ("compiled", compiled)):
                fn = _step_fn(model, x, recipe)
                fn()  # warm-up (compiles the compiled variant)
                fn()
                fns[f"{kind}/{recipe}/{mode}"] = fn
            progress(f"  {kind}/{recipe}: warmed up")
        runs = interleaved(fns, rounds=rounds, min_run_time=min_run_time[shape], label=shape)
        ms = {k: stats([s * 1e3 for s in v]) for k, v in runs.items()}
        speedup = {}
        for kind, recipe in (configs or CONFIGS)[shape]:
            key = f"{kind}/{recipe}"
            speedup[key] = ratio_stats(runs[f"{key}/eager"], runs[f"{key}/compiled"])
        vs_torch = {
            f"{k}": ratio_stats(v, runs[f"torch/bf16/{k.rsplit('/', 1)[1]}"])
            for k, v in runs.items()
            if not k.startswith("torch/") and f"torch/bf16/{k.rsplit('/', 1)[1]}" in runs
        }
        results[shape] = {
            "shape": [rows, hidden],
            "ms": ms,
            "eager_over_compiled": speedup,
            "ratio_vs_torch_same_mode": vs_torch,
        }
        for k, v in ms.items():
            progress(f"  {k}: {v['median']:.2f} ms (IQR {v['q1']:.2f}-{v['q3']:.2f})")
    return results


def _step_fn(model: Any, x: torch.Tensor, recipe: str) -> Any:
    params = list(getattr(model, "_orig_mod", model).parameters())

    def step() -> None:
        for p in params:
            p.grad = None
        x.grad = None
        train_step(model, x, recipe)

    return step
