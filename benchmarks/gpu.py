"""Figure 6 (H200): training-step time, GEMM floors, per-op overhead, peak memory.

One process, one run (``python -m benchmarks --device cuda --out DIR``):

* **steps**: an 8-layer MLP of square layers, one training step (forward + backward,
  gradients set to None first), at 64x256 and 4096x8192: ``torch.nn.Linear`` bf16 and
  our ``Linear`` in bf16 and every recipe, each eager, ``torch.compile(fullgraph=True)``
  and ``mode='reduce-overhead'`` (CUDA graphs). ``torch.nn.Linear``, our bf16 and our
  FP8 current scaling (what the targets compare), every mode, are timed in the same
  interleaved rounds with their GEMM floors; each other recipe's modes in rounds of their
  own. A compiled mode that raises under ``fullgraph=True`` is recorded with its error
  and measured again without ``fullgraph`` (marked), so a fallback is reported, never
  hidden; a mode that fails that way too is reported as failed. Fallback warnings and
  graph breaks are recorded.
* **GEMM floors**: the 24 GEMMs of a step (8 layers x fprop TN, dgrad NN, wgrad NT)
  issued back to back on pre-made operands: bf16 ``torch.mm``, and FP8 ``_scaled_mm``
  (E4M3 x E4M3 forward, E5M2 x E4M3 backward) with bf16 out as our ``gemm`` issues it
  (and fp32 out, what it issued before).
* **quantization**: one 4096x8192 bf16 tensor quantized with both usages by every
  format (the fused Triton FP8 current-scaling kernels next to the reference torch
  ops), dequantized to bf16, and a bf16 copy (the memory-bandwidth yardstick).
* **per-op overhead** (64x256, no grad): ``teops::linear_fwd`` called through the
  dispatcher against its kernel ``linear_forward`` called directly, and
  ``torch.nn.functional.linear``.
* **sustained** (large shape): the FP8 and bf16 GEMM floors and our FP8 and bf16 steps
  in every mode, each run back to back for ``SUSTAINED_S`` seconds while
  ``nvidia-smi`` samples the SM clock, board power and throttle reasons. A training
  run is this steady state: an H200 doing these GEMMs sits at its ~700 W power cap and
  clocks down, the floor loop included, while the short interleaved timings above
  catch the GPU in varying power states.
* **memory**: peak ``torch.cuda.max_memory_allocated`` over one eager
  4096x8192 step for every recipe against ``torch.nn.Linear``, minus what was
  allocated before the step (parameters and input).

Timings are interleaved medians (``benchmarks.common``). Needs only torch, Triton (as
shipped with CUDA torch) and this repository; it writes JSON.
"""

from __future__ import annotations

import contextlib
import functools
import shutil
import statistics
import subprocess
import time
import traceback
import warnings
from collections.abc import Callable
from typing import Any, Optional

import torch

from transformer_engine_ops.kernels import cuda_kernels
from transformer_engine_ops.modules.autocast import autocast
from transformer_engine_ops.modules.linear import Linear
from transformer_engine_ops.ops.linear import linear_forward
from transformer_engine_ops.quantization import (
    DelayedScaling,
    Float8BlockQuantizer,
    Float8BlockScaling,
    Float8CurrentScaling,
    Float8CurrentScalingQuantizer,
    Float8Quantizer,
    MXFP8BlockScaling,
    MXFP8Quantizer,
    NVFP4BlockScaling,
    NVFP4Quantizer,
)
from transformer_engine_ops.quantization.float8 import _Float8PerTensorQuantizer

from . import moe, torchao_compare, tp_step, transformer_layer
from .common import (
    GPU_DEFAULT_PARTS,
    interleaved,
    paired_ratio,
    progress,
    ratio_stats,
    stats,
)
from .models import LAYERS, SHAPES, make_input, make_model

MODES = ("eager", "compiled", "reduce-overhead")
RECIPES: dict[str, Optional[Callable[[], Any]]] = {
    "bf16": None,
    "fp8_current": Float8CurrentScaling,
    "fp8_delayed": DelayedScaling,
    "mxfp8": MXFP8BlockScaling,
    "fp8_block": Float8BlockScaling,
    # TE's defaults (random Hadamard transform, stochastic rounding) are not implemented.
    "nvfp4": functools.partial(
        NVFP4BlockScaling, disable_rht=True, disable_stochastic_rounding=True
    ),
}


_DEV = ["cuda"]  # run(device=...) sets it; "cpu" only for the smoke test


def _sync() -> None:
    if _DEV[0] == "cuda":
        torch.cuda.synchronize()


def _short(exc: BaseException) -> str:
    lines = [ln for ln in str(exc).strip().splitlines() if ln.strip()]
    return f"{type(exc).__name__}: {lines[0][:300] if lines else ''}"


# A small step is host-bound: its rounds spread by 10-20% between hosts and
# within a run (other tenants, clocks), so its figures (here and figure 8) take more rounds than the
# GPU-bound large shape's.
SMALL_ROUNDS = 11

# --- steps -----------------------------------------------------------------------------


def _train_step(
    model: Any, params: list[torch.Tensor], x: torch.Tensor, recipe: Any, cudagraphs: bool
) -> Callable[[], None]:
    def step() -> None:
        if cudagraphs:
            torch.compiler.cudagraph_mark_step_begin()
        for p in params:
            p.grad = None
        x.grad = None
        ctx = autocast(recipe=recipe) if recipe is not None else contextlib.nullcontext()
        with ctx:
            y = model(x)
        y.float().pow(2).mean().backward()

    return step


def _graph_breaks() -> int:
    from torch._dynamo.utils import counters

    return sum(counters["graph_break"].values())


def _build(
    kind: str, recipe_name: str, mode: str, hidden: int, x: torch.Tensor
) -> tuple[Optional[Callable[[], None]], dict[str, Any]]:
    """(warmed-up step or None when it failed, what happened)."""
    factory = RECIPES[recipe_name]
    recipe = factory() if factory is not None else None
    model = make_model(kind, hidden, device=_DEV[0])
    params = list(model.parameters())
    info: dict[str, Any] = {"fullgraph": mode != "eager"}
    attempts = [True, False] if mode != "eager" else [None]
    for fullgraph in attempts:
        run: Any = model
        if fullgraph is not None:
            kw = {"mode": "reduce-overhead"} if mode == "reduce-overhead" else {}
            run = torch.compile(model, fullgraph=fullgraph, **kw)
        fn = _train_step(run, params, x, recipe, mode == "reduce-overhead")
        breaks = _graph_breaks()
        started = time.perf_counter()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                for _ in range(3):  # compile, record the CUDA graph, replay once
                    fn()
                _sync()
            except Exception as exc:  # reported, never fatal
                key = "fullgraph_error" if fullgraph else "error"
                info[key] = _short(exc)
                info["traceback_tail"] = traceback.format_exc().strip().splitlines()[-3:]
                continue
            finally:
                msgs = sorted({str(w.message)[:300] for w in caught})
                info.setdefault("warnings", []).extend(msgs)
        info["fullgraph"] = bool(fullgraph)
        info["graph_breaks"] = _graph_breaks() - breaks
        info["warmup_s"] = time.perf_counter() - started
        info.pop("error", None)
        return fn, info
    info["failed"] = True
    return None, info


# --- GEMM floors --------------------------------------------------------------------


def _gemm_floor(rows: int, hidden: int, which: str) -> Callable[[], None]:
    """The step's 3 x LAYERS GEMMs on pre-made operands, as our gemm issues them."""
    g = torch.Generator(device=_DEV[0]).manual_seed(0)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g, device=_DEV[0], dtype=torch.bfloat16)

    x, w, dy = rand(rows, hidden), rand(hidden, hidden), rand(rows, hidden)
    if which == "bf16":
        pairs = [(x, w.t()), (dy, w), (dy.t(), x)]

        def run() -> None:
            for _ in range(LAYERS):
                for a, b in pairs:
                    torch.mm(a, b)

        return run
    out = torch.bfloat16 if which == "fp8" else torch.float32
    e4, e5 = torch.float8_e4m3fn, torch.float8_e5m2
    one = torch.ones((), device=_DEV[0])
    # Rowwise data and the transposed (columnwise) buffers, as the quantizers make them;
    # _scaled_mm wants a row-major first and a column-major second operand.
    xq, wq, dyq = x.to(e4), w.to(e4), dy.to(e5)
    xt, wt, dyt = x.t().contiguous().to(e4), w.t().contiguous().to(e4), dy.t().contiguous()
    dyt = dyt.to(e5)
    pairs = [(xq, wq.t()), (dyq, wt.t()), (dyt, xt.t())]

    def run_fp8() -> None:
        for _ in range(LAYERS):
            for a, b in pairs:
                torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=out)

    return run_fp8


# --- quantization -------------------------------------------------------------------


def _quantization(rows: int, hidden: int, rounds: int) -> dict[str, Any]:
    x = torch.randn(rows, hidden, device=_DEV[0], dtype=torch.bfloat16)
    n = x.numel()
    cur = Float8CurrentScalingQuantizer()
    quantizers = {
        "fp8_current": cur,
        "fp8_delayed": Float8Quantizer(),
        "mxfp8": MXFP8Quantizer(),
        "fp8_block_1d": Float8BlockQuantizer(block_scaling_dim=1),
        "fp8_block_2d": Float8BlockQuantizer(block_scaling_dim=2),
        "nvfp4": NVFP4Quantizer(),
    }
    fns: dict[str, Callable[[], Any]] = {}
    copy_dst = torch.empty_like(x)
    fns["bf16 copy (read + write)"] = lambda: copy_dst.copy_(x)
    fused_ok = cuda_kernels.available()
    if fused_ok:
        fns["quantize fp8_current fused (Triton)"] = lambda: cur._quantize_impl(x)
    fns["quantize fp8_current reference ops"] = lambda: _Float8PerTensorQuantizer._quantize_impl(
        cur, x
    )
    for name, q in quantizers.items():
        if name == "fp8_current":
            continue
        fns[f"quantize {name} reference ops"] = lambda q=q: q._quantize_impl(x)
    for name, q in quantizers.items():
        value = q.with_internal(True).quantize(x)
        fns[f"dequantize {name} to bf16"] = lambda v=value: v.dequantize(torch.bfloat16)
    progress(f"quantization: timing {len(fns)} contenders at {rows}x{hidden}")
    runs = interleaved(fns, rounds=rounds, min_run_time=0.2, label="quantization")
    us = {k: stats([s * 1e6 for s in v]) for k, v in runs.items()}
    copy_s = us["bf16 copy (read + write)"]["median"] * 1e-6
    out: dict[str, Any] = {
        "shape": [rows, hidden],
        "us": us,
        "copy_GBps": 4 * n / copy_s / 1e9,
        "fused_unavailable": cuda_kernels.unavailable_reason(),
    }
    if fused_ok:
        fused_s = us["quantize fp8_current fused (Triton)"]["median"] * 1e-6
        # amax pass reads 2n, cast pass reads 2n and writes n + n bytes.
        out["fused_bytes"] = 6 * n
        out["fused_GBps"] = 6 * n / fused_s / 1e9
        out["fused_over_copy_time_for_its_bytes"] = fused_s / (copy_s * 6 / 4)
    return out


# --- per-op overhead ----------------------------------------------------------------


def _op_overhead(rows: int, hidden: int, rounds: int) -> dict[str, Any]:
    from transformer_engine_ops.generated.linear import flatten_linear_fwd_args, linear_fwd
    from transformer_engine_ops.ops.linear import LinearFwdArgs

    from .overhead import module_call_fields

    layer = Linear(hidden, hidden, params_dtype=torch.bfloat16, device=_DEV[0])
    ref = torch.nn.Linear(hidden, hidden, dtype=torch.bfloat16, device=_DEV[0])
    x = torch.randn(rows, hidden, device=_DEV[0], dtype=torch.bfloat16)
    with torch.no_grad():
        args = LinearFwdArgs(**module_call_fields(layer, x))
    fns = {
        "op call (teops::linear_fwd via dispatcher)": lambda: linear_fwd(
            *flatten_linear_fwd_args(args)
        ),
        "its kernel called directly (linear_forward)": lambda: linear_forward(args),
        "torch.nn.functional.linear": lambda: torch.nn.functional.linear(x, ref.weight, ref.bias),
    }
    with torch.no_grad():
        for fn in fns.values():
            fn()
        progress(f"per-op overhead: timing {len(fns)} calls at {rows}x{hidden}")
        runs = interleaved(fns, rounds=rounds, min_run_time=0.2, label="op overhead")
    us = {k: stats([s * 1e6 for s in v]) for k, v in runs.items()}
    keys = list(fns)
    over = [a - b for a, b in zip(runs[keys[0]], runs[keys[1]], strict=True)]
    return {
        "shape": [rows, hidden],
        "us": us,
        "overhead_us": stats([s * 1e6 for s in over]),
        "op_over_kernel": ratio_stats(runs[keys[0]], runs[keys[1]]),
        "op_over_torch": ratio_stats(runs[keys[0]], runs[keys[2]]),
    }


def _paired(rows: int, hidden: int, pairs: int) -> dict[str, Any]:
    """Figure 6's small step, ours against ``torch.nn.Linear`` in each mode (bf16),
    timed in alternating short blocks (``common.paired_ratio``): the precision its
    1.0x-level goals need, which rounds of ``interleaved`` do not give on a busy host."""
    x = make_input(rows, hidden, device=_DEV[0])
    out: dict[str, Any] = {"shape": [rows, hidden], "layers": LAYERS}
    for mode in MODES:
        steps = {}
        for kind in ("ours", "torch"):
            step, info = _build(kind, "bf16", mode, hidden, x)
            if step is None:
                raise RuntimeError(f"{kind}/{mode} failed to build: {info}")
            steps[kind] = step
        progress(f"paired: {mode}, {pairs} pairs at {rows}x{hidden}")
        out[mode] = paired_ratio(steps["ours"], steps["torch"], pairs=pairs, sync=_sync)
        r = out[mode]
        progress(
            f"  ours/torch.nn.Linear {mode}: {r['median']:.4f} "
            f"(95% CI {r['ci95'][0]:.4f}-{r['ci95'][1]:.4f})"
        )
    return out


# --- memory -------------------------------------------------------------------------


def _memory(rows: int, hidden: int) -> dict[str, Any]:
    out: dict[str, Any] = {"shape": [rows, hidden], "MiB": {}, "errors": {}}
    configs = [("torch", "bf16")] + [("ours", r) for r in RECIPES]
    for kind, recipe_name in configs:
        key = f"{kind}/{recipe_name}"
        torch.cuda.empty_cache()
        try:
            factory = RECIPES[recipe_name]
            model = make_model(kind, hidden, device=_DEV[0])
            x = make_input(rows, hidden, device=_DEV[0])
            step = _train_step(
                model, list(model.parameters()), x, factory() if factory else None, False
            )
            step()  # warm-up (allocator, lazy state)
            for p in model.parameters():
                p.grad = None
            _sync()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            step()
            _sync()
            peak = torch.cuda.max_memory_allocated()
            out["MiB"][key] = {
                "peak": peak / 2**20,
                "resident_before": base / 2**20,
                "step_peak_over_resident": (peak - base) / 2**20,
            }
            progress(
                f"memory {key}: peak {peak / 2**20:.0f} MiB, over resident "
                f"{(peak - base) / 2**20:.0f} MiB"
            )
            del model, x, step
        except Exception as exc:
            out["errors"][key] = _short(exc)
            progress(f"memory {key}: failed: {_short(exc)}")
    torch.cuda.empty_cache()
    return out


# --- the run ------------------------------------------------------------------------


def _floor_of(key: str) -> str:
    """The GEMM floor of a contender: FP8 recipes run _scaled_mm, the rest bf16 GEMMs."""
    return "gemm/fp8" if key.split("/")[1] in ("fp8_current", "fp8_delayed") else "gemm/bf16"


def _ratio_of_medians(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """a / b for two contenders timed apart; the interval spans their IQRs (n=0)."""
    x = a["median"] / b["median"]
    lo, hi = a["q1"] / b["q3"], a["q3"] / b["q1"]
    return {"median": x, "q1": lo, "q3": hi, "min": lo, "max": hi, "n": 0, "samples": []}


# Timed in one group: every target compares these (ours against torch.nn.Linear, FP8
# against our bf16); each other recipe is a group of its own.
TARGET_GROUP = (("torch", "bf16"), ("ours", "bf16"), ("ours", "fp8_current"))


def _groups(recipes: tuple[str, ...]) -> list[list[tuple[str, str]]]:
    """The contenders of a shape in timing groups (see :data:`TARGET_GROUP`)."""
    first = [c for c in TARGET_GROUP if c[0] == "torch" or c[1] in recipes]
    rest = [[("ours", r)] for r in recipes if ("ours", r) not in first]
    return [first, *rest]


def _shape(
    shape: str, rounds: int, min_run_time: float, recipes: tuple[str, ...]
) -> dict[str, Any]:
    """Every mode of the models and recipes of one group (:func:`_groups`) built, then
    all of them timed in the same interleaved rounds with their GEMM floors: each sees
    the host and the GPU in the same states as the contenders it is compared with and
    as the floor it is divided by (timed in separate stretches, their ratios followed
    the order they ran in), so every ratio of two contenders of a group is the median
    of per-round ratios. Fresh dynamo state per group (no recompile limit shared)."""
    rows, hidden = SHAPES[shape]
    x = make_input(rows, hidden, device=_DEV[0])
    whichs = ("bf16", "fp8", "fp8-fp32-out") if _DEV[0] == "cuda" else ("bf16",)
    floors = {f"gemm/{w}": _gemm_floor(rows, hidden, w) for w in whichs}
    ms: dict[str, Any] = {}
    samples: dict[str, list[float]] = {}
    group_of: dict[str, int] = {}
    builds: dict[str, Any] = {}
    over_floor: dict[str, Any] = {}
    floor_samples: dict[str, list[float]] = {k: [] for k in floors}
    for group, contenders in enumerate(_groups(recipes)):
        torch._dynamo.reset()
        steps: dict[str, Any] = {}
        for kind, recipe_name in contenders:
            for mode in MODES:
                key = f"{kind}/{recipe_name}/{mode}"
                progress(f"{shape} {rows}x{hidden} {key}: building and warming up")
                fn, info = _build(kind, recipe_name, mode, hidden, x)
                builds[key] = info
                if fn is None:
                    progress(f"  FAILED: {info.get('error') or info.get('fullgraph_error')}")
                    continue
                steps[key] = fn
                note = "" if info["fullgraph"] or mode == "eager" else " (without fullgraph)"
                progress(f"  ready in {info['warmup_s']:.1f} s{note}")
        if not steps:
            continue
        its_floors = sorted({_floor_of(k) for k in steps} & floors.keys())
        timed = {**steps, **{f: floors[f] for f in its_floors}}
        try:
            runs = interleaved(timed, rounds=rounds, min_run_time=min_run_time, label=shape)
        except Exception as exc:  # reported, never fatal
            for key in steps:
                builds[key]["timing_error"] = _short(exc)
            progress(f"  timing FAILED: {_short(exc)}")
            continue
        finally:
            del steps, timed
            torch._dynamo.reset()
            _sync()
            if _DEV[0] == "cuda":
                torch.cuda.empty_cache()
        for key, times in runs.items():
            if key in floors:
                floor_samples[key] += times
                continue
            ms[key], samples[key], group_of[key] = stats([t * 1e3 for t in times]), times, group
            floor = _floor_of(key)
            if floor in runs:
                over_floor[key] = ratio_stats(times, runs[floor])
            vs = f", {over_floor[key]['median']:.2f}x {floor}" if key in over_floor else ""
            progress(f"  {key}: {ms[key]['median']:.3f} ms{vs}")
    for floor, times in floor_samples.items():
        if times:
            ms[floor] = stats([t * 1e3 for t in times])
    steps = [k for k in ms if not k.startswith("gemm/")]

    def versus(base: str) -> dict[str, Any]:
        out = {}
        for k in steps:
            ref = f"{base}/{k.split('/')[2]}"
            if k.startswith("ours/") and ref in ms and k != ref:
                paired = group_of[k] == group_of[ref]
                out[k] = (
                    ratio_stats(samples[k], samples[ref])
                    if paired
                    else _ratio_of_medians(ms[k], ms[ref])
                )
        return out

    return {
        "shape": [rows, hidden],
        "ms": ms,
        "builds": builds,
        "over_gemm_floor": over_floor,
        "floor_of": {k: _floor_of(k) for k in steps},
        "over_torch_same_mode": versus("torch/bf16"),
        "over_bf16_same_mode": versus("ours/bf16"),
    }


# --- sustained steady state -----------------------------------------------------------

SUSTAINED_S = 4.0
_SMI_FIELDS = "clocks.sm,power.draw,clocks_throttle_reasons.active"


def _sampled(fn: Callable[[], None], seconds: float) -> dict[str, Any]:
    """``fn`` back to back for ``seconds`` (after one second of warm-up): ms per call,
    with the median SM clock and board power ``nvidia-smi`` saw meanwhile."""
    started = time.perf_counter()
    while time.perf_counter() - started < 1.0:
        fn()
    _sync()
    smi = None
    if shutil.which("nvidia-smi"):
        argv = ["nvidia-smi", f"--query-gpu={_SMI_FIELDS}", "--format=csv,noheader,nounits"]
        smi = subprocess.Popen(
            [*argv, "-i", str(torch.cuda.current_device()), "-lms", "100"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
    calls = 0
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        fn()
        calls += 1
    _sync()
    out: dict[str, Any] = {"ms": (time.perf_counter() - started) / calls * 1e3, "calls": calls}
    if smi is not None:
        smi.terminate()
        samples = [line.split(",") for line in smi.communicate()[0].splitlines() if line]
        samples = samples[len(samples) // 4 :]  # past the ramp
        with contextlib.suppress(ValueError, IndexError, statistics.StatisticsError):
            out["sm_clock_mhz"] = statistics.median(float(c[0]) for c in samples)
            out["power_w"] = statistics.median(float(c[1]) for c in samples)
            out["throttle_reasons"] = sorted({c[2].strip() for c in samples})
    return out


def _sustained(recipes: tuple[str, ...], seconds: float = SUSTAINED_S) -> dict[str, Any]:
    """The large shape's floors and steps in the steady state (see the module doc)."""
    rows, hidden = SHAPES["large"]
    x = make_input(rows, hidden, device=_DEV[0])
    result: dict[str, Any] = {"shape": [rows, hidden], "seconds": seconds, "runs": {}}
    for which in ("fp8", "bf16"):
        progress(f"sustained gemm/{which}")
        result["runs"][f"gemm/{which}"] = _sampled(_gemm_floor(rows, hidden, which), seconds)
    for recipe in [r for r in ("fp8_current", "bf16") if r in recipes]:
        for mode in MODES:
            key = f"ours/{recipe}/{mode}"
            progress(f"sustained {key}")
            torch._dynamo.reset()
            fn, info = _build("ours", recipe, mode, hidden, x)
            if fn is None:
                result["runs"][key] = {"failed": _how(info)}
                continue
            result["runs"][key] = _sampled(fn, seconds)
            del fn
            torch._dynamo.reset()
            torch.cuda.empty_cache()
    return result


def _how(info: dict[str, Any]) -> str:
    return str(info.get("fullgraph_error") or info.get("error") or "failed")


def run(
    save: Optional[Callable[[dict[str, Any]], None]] = None,
    shapes: tuple[str, ...] = ("small", "large"),
    *,
    device: str = "cuda",
    parts: tuple[str, ...] = GPU_DEFAULT_PARTS,
    recipes: tuple[str, ...] | None = None,
) -> dict[str, Any]:
    """All of figure 6; ``save(results)`` is called after each part (partial results).

    ``device="cpu"`` (with a shape such as ``"tiny"`` and no parts) only checks that
    the machinery runs: its numbers mean nothing.
    """
    _DEV[0] = device
    torch.backends.cuda.matmul.allow_tf32 = False
    torch._dynamo.config.cache_size_limit = 64  # many models compile the same code
    if hasattr(torch._dynamo.config, "accumulated_cache_size_limit"):
        torch._dynamo.config.accumulated_cache_size_limit = 1024
    results: dict[str, Any] = {
        "version": 2,
        # Quantizers cross as str codes since the kinds merge: no torch limits FP8 compile.
        "quantizer_compile_limitation": None,
        "fused_fp8_kernels": cuda_kernels.unavailable_reason() or "available",
        "shapes": {},
    }

    def checkpoint() -> None:
        if save is not None:
            save(results)

    runners: dict[str, Callable[[], Any]] = {
        "quantization": lambda: _quantization(*SHAPES["large"], rounds=3),
        "op_overhead": lambda: _op_overhead(*SHAPES["small"], rounds=5),
        "paired": lambda: _paired(*SHAPES["small"], pairs=300 if device == "cuda" else 4),
        "memory": lambda: _memory(*SHAPES["large"]),
        "sustained": lambda: _sustained(tuple(RECIPES) if recipes is None else recipes),
        "transformer_layer": lambda: transformer_layer.run(device=device),
        # The DeepSeek-V2-Lite-sized MoE layer against a per-expert loop and a
        # hand-written torch._grouped_mm layer; no host syncs, CUDA graphs.
        "moe": lambda: moe.run(device=device),
        # The same layer under FP8 against torchao's Float8Linear (the optional ``bench``
        # extra): recorded as skipped, with the reason, where torchao is not installed.
        "torchao": torchao_compare.run_if_installed,
        # Two GPUs (spawns its own NCCL ranks); not in the default parts.
        "tp": lambda: tp_step.run("nccl"),
    }
    for name in parts:
        part = runners[name]
        try:
            results[name] = part()
        except Exception as exc:
            results[name] = {"error": _short(exc)}
            progress(f"{name}: failed: {_short(exc)}")
        checkpoint()
    for shape in shapes:
        small = shape != "large"
        results["shapes"][shape] = _shape(
            shape,
            rounds=SMALL_ROUNDS if small else 5,
            min_run_time=0.15 if small else 0.25,
            recipes=tuple(RECIPES) if recipes is None else recipes,
        )
        checkpoint()
        torch.cuda.empty_cache()
    return results


__all__ = ["MODES", "RECIPES", "run"]
