"""Figure 6 (H200): training-step time eager vs compiled vs compiled with CUDA graphs.

For bf16 and FP8 current scaling, at a small shape (CPU-overhead bound) and a large one
(4096 tokens x 8192 hidden), each next to the time of its GEMMs alone, the floor: the
24 GEMMs of a step (8 layers x fprop, dgrad, wgrad) issued back to back on pre-made
operands (bf16 ``torch.mm``; FP8 ``torch._scaled_mm``, E4M3 x E4M3 forward, E5M2 x E4M3
backward, fp32 out, as our ``gemm`` issues them). A second row, ``gemm_fp32_ms``, is
the same GEMMs in fp32: what ``gemm`` issued for plain CUDA operands before its native
16-bit path.

Needs only torch and this repository (no libcst, jinja2 or matplotlib): it writes JSON;
the CPU run turns it into tables and plots. On torch < 2.12 quantized recipes fall back
to eager inside compiled regions (``runtime.opaque.quantizer_compile_limitation``), so
there FP8 is measured eagerly only and the JSON says so.
"""

from __future__ import annotations

from typing import Any

import torch

from transformer_engine_ops.runtime.opaque import quantizer_compile_limitation

from .common import interleaved, progress, ratio_stats, stats
from .models import LAYERS, SHAPES, make_input, make_model, train_step

RECIPES = ("bf16", "fp8")
MODES = ("eager", "compiled", "reduce-overhead")


def _gemm_floor(rows: int, hidden: int, recipe: str, device: str) -> Any:
    """A callable issuing the step's 3 x LAYERS GEMMs on pre-made operands."""
    g = torch.Generator(device=device).manual_seed(0)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g, device=device, dtype=torch.bfloat16)

    x, w, dy = rand(rows, hidden), rand(hidden, hidden), rand(rows, hidden)
    if recipe == "bf16-as-fp32":
        x, w, dy = x.float(), w.float(), dy.float()
    if recipe in ("bf16", "bf16-as-fp32"):
        pairs = [(x, w.t()), (dy, w), (dy.t(), x)]

        def run() -> None:
            for _ in range(LAYERS):
                for a, b in pairs:
                    torch.mm(a, b)

        return run
    e4, e5 = torch.float8_e4m3fn, torch.float8_e5m2
    one = torch.ones((), device=device)
    # _scaled_mm wants a row-major first and a column-major second operand.
    xq, wq, dyq = x.to(e4), w.to(e4), dy.to(e5)
    xt, wt, dyt = x.t().contiguous().to(e4), w.t().contiguous().to(e4), dy.t().contiguous()
    dyt = dyt.to(e5)
    pairs = [(xq, wq.t()), (dyq, wt.t()), (dyt, xt.t())]

    def run_fp8() -> None:
        for _ in range(LAYERS):
            for a, b in pairs:
                torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.float32)

    return run_fp8


def _step(model: Any, x: torch.Tensor, recipe: str, cudagraphs: bool) -> Any:
    params = list(getattr(model, "_orig_mod", model).parameters())

    def step() -> None:
        if cudagraphs:
            torch.compiler.cudagraph_mark_step_begin()
        for p in params:
            p.grad = None
        x.grad = None
        train_step(model, x, recipe)

    return step


def run(
    shapes: tuple[str, ...] = ("small", "large"),
    rounds: int = 5,
    min_run_time: float = 0.5,
    device: str = "cuda",
) -> dict[str, Any]:
    torch.backends.cuda.matmul.allow_tf32 = False  # keep fp32 GEMMs fp32, as on the CPU
    limitation = quantizer_compile_limitation()
    results: dict[str, Any] = {"quantizer_compile_limitation": limitation, "shapes": {}}
    for shape in shapes:
        rows, hidden = SHAPES[shape]
        x = make_input(rows, hidden, device=device)
        fns: dict[str, Any] = {}
        skipped: dict[str, str] = {}
        for recipe in RECIPES:
            for mode in MODES:
                key = f"{recipe}/{mode}"
                if recipe == "fp8" and mode != "eager" and limitation is not None:
                    skipped[key] = f"not measured: falls back to eager ({limitation})"
                    continue
                progress(f"figure 6: {shape} {rows}x{hidden} {key}: building and warming up")
                torch._dynamo.reset()
                model = make_model("ours", hidden, device=device)
                if mode != "eager":
                    kw = {"mode": "reduce-overhead"} if mode == "reduce-overhead" else {}
                    model = torch.compile(model, fullgraph=True, **kw)
                fn = _step(model, x, recipe, mode == "reduce-overhead")
                for _ in range(3):  # compile, record the CUDA graph, replay once
                    fn()
                torch.cuda.synchronize()
                fns[key] = fn
        for recipe in ("bf16", "fp8", "bf16-as-fp32"):
            fns[f"{recipe}/gemm"] = _gemm_floor(rows, hidden, recipe, device)
        progress(f"figure 6: {shape}: timing {len(fns)} contenders, {rounds} rounds")
        runs = interleaved(fns, rounds=rounds, min_run_time=min_run_time, label=shape)
        ms = {k: stats([s * 1e3 for s in v]) for k, v in runs.items()}
        vs_gemm = {
            k: ratio_stats(v, runs[f"{k.split('/')[0]}/gemm"])
            for k, v in runs.items()
            if not k.endswith("/gemm") and not k.startswith("bf16-as-fp32")
        }
        vs_eager = {
            k: ratio_stats(runs[f"{k.split('/')[0]}/eager"], v)
            for k, v in runs.items()
            if k.split("/")[1] in ("compiled", "reduce-overhead")
        }
        results["shapes"][shape] = {
            "shape": [rows, hidden],
            "ms": ms,
            "over_gemm_floor": vs_gemm,
            "eager_over_mode": vs_eager,
            "skipped": skipped,
        }
        for k, v in ms.items():
            progress(f"  {shape} {k}: {v['median']:.3f} ms (IQR {v['q1']:.3f}-{v['q3']:.3f})")
        del fns, runs
        torch._dynamo.reset()
        torch.cuda.empty_cache()
    return results
