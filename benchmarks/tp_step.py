"""A tensor-parallel (TP=2) training step with sequence parallelism: bytes moved and
step time, overlap off and on.

* Models: ``te.LayerNormMLP`` (RMSNorm, SwiGLU; fc1 column-, fc2 row-parallel) and
  ``te.TransformerLayer`` (GQA; QKV and fc1 column-, proj and fc2 row-parallel), both
  with ``sequence_parallel=True``, at Llama-70B's sizes: hidden 8192, FFN 28672, 64 heads
  in 8 KV groups, sequence 8192, batch 1, bf16 parameters and activations.
* Recipes: bf16; FP8 current scaling as TE runs it (the sequence-parallel input and
  output gradient quantized with the TP group's amax and all-gathered in FP8,
  docs/distributed.md); NVFP4 with TE's default recipe (the inputs gathered as NVFP4
  codes and scales with the group's amaxes; the output gradients, stochastically
  rounded, gathered in bf16); and each with ``fp8_all_gather=False`` (gathered in
  high precision, quantized after): the bytes and time the quantized all-gather saves.
* Overlap: off, or on through ``runtime/comm_overlap.enable(tp_group)`` (the symmetric
  memory fused all-gather + GEMM and GEMM + reduce-scatter on NCCL; gloo falls back to
  the plain collectives, so on the CPU "on" measures the same work).
* Bytes moved: every ``torch.distributed`` collective the step issues is counted by a
  wrapper installed in the bench's rank processes only (also where our op modules bound
  a collective to a name of their own), and so is each fused op (it moves what the
  collective it replaces moves). Per rank, on a ring of ``tp`` ranks: an all-gather
  moves ``(tp-1)/tp`` of its output, a reduce-scatter ``(tp-1)/tp`` of its input, an
  all-reduce twice that of its tensor (NCCL's bus-bytes convention).
* Step time: forward + backward of the compiled (``fullgraph=True``) model, the median
  over timed steps of the slowest rank; the communication time of a step is measured in
  one more step with each collective timed on its own (synchronised before and after),
  so ``hidden`` = (time off - time on) / communication time off is the share of the
  communication that overlap hides (the goal: >= 60 %).

``python -m benchmarks.tp_step [--quick] [--backend gloo|nccl] [--out FILE]`` spawns the
two ranks itself (loopback, a free port, ``TORCH_SYMM_MEM_DISABLE_MULTICAST=1`` and
``NCCL_NVLS_ENABLE=0`` in every rank); NCCL needs two CUDA devices, ``--quick`` shrinks
every size (a smoke run over gloo on the CPU: its times mean nothing, its bytes are
exact). ``python -m benchmarks --device cuda --gpu-parts tp`` runs it as a part.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import transformer_engine_ops as te
from transformer_engine_ops.quantization import Float8CurrentScaling, NVFP4BlockScaling
from transformer_engine_ops.runtime import comm_overlap

WORLD = 2
LLAMA_70B = dict(hidden=8192, ffn=28672, heads=64, groups=8, seq=8192, batch=1)
# Quick: 16 local rows, so NVFP4 shards hold whole 16-row blocks and gather quantized.
QUICK = dict(hidden=64, ffn=128, heads=4, groups=2, seq=32, batch=1)
MODELS = ("mlp", "transformer")
# Recipe name -> recipe factory (None: bf16); "_hp_gather": the same recipe gathering
# the high-precision tensor (``fp8_all_gather=False``).
RECIPES: dict[str, Callable[[], Any] | None] = {
    "bf16": None,
    "fp8_current": Float8CurrentScaling,
    "fp8_current_hp_gather": lambda: Float8CurrentScaling(fp8_all_gather=False),
    "nvfp4": NVFP4BlockScaling,
    "nvfp4_hp_gather": lambda: NVFP4BlockScaling(fp8_all_gather=False),
}
# NVLink multicast stays off in every rank (docs/distributed.md, comm-GEMM overlap).
RANK_ENV = {"TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NCCL_NVLS_ENABLE": "0"}
PG_TIMEOUT_S = 300


# --- counting the collectives ----------------------------------------------------------


def _ring_bytes(kind: str, tensor: torch.Tensor, tp: int) -> int:
    """Bytes one rank sends (= receives) on a ring of ``tp`` ranks; ``tensor`` is the
    all-gather's output, the reduce-scatter's input, the all-reduce's tensor."""
    share = tensor.numel() * tensor.element_size() * (tp - 1) // tp
    return 2 * share if kind == "all_reduce" else share


class CommCounter:
    """Counts bytes and calls of every collective while installed; with ``timed`` it
    also times each one alone (synchronising the device before and after)."""

    # torch.distributed functions -> (kind, which argument is the counted tensor)
    _DIST = {
        "all_gather_into_tensor": ("all_gather", 0),
        "all_gather_single": ("all_gather", 0),
        "reduce_scatter_tensor": ("reduce_scatter", 1),
        "reduce_scatter_single": ("reduce_scatter", 1),
        "all_reduce": ("all_reduce", 0),
    }

    def __init__(self, tp: int, device: torch.device) -> None:
        self.tp, self.device = tp, device
        self.timed = False
        self.reset()

    def reset(self) -> None:
        self.bytes: dict[str, int] = {}
        self.calls: dict[str, int] = {}
        self.seconds = 0.0

    def _record(self, kind: str, tensor: torch.Tensor, fn: Callable[[], Any]) -> Any:
        self.bytes[kind] = self.bytes.get(kind, 0) + _ring_bytes(kind, tensor, self.tp)
        self.calls[kind] = self.calls.get(kind, 0) + 1
        if not self.timed:
            return fn()
        _sync(self.device)
        start = time.perf_counter()
        out = fn()
        if hasattr(out, "wait"):  # an asynchronous collective: time it to the end
            out.wait()
        _sync(self.device)
        self.seconds += time.perf_counter() - start
        return out

    def _wrap_dist(self, name: str, original: Callable) -> Callable:
        kind, index = self._DIST[name]

        @functools.wraps(original)
        def counted(*args: Any, **kwargs: Any) -> Any:
            return self._record(kind, args[index], lambda: original(*args, **kwargs))

        return counted

    def _wrap_fused(self, original: Callable, kind: str) -> Callable:
        @functools.wraps(original)
        def counted(a: torch.Tensor, b: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            # What the replaced collective moves: the gathered input (rows * tp, k), or
            # the product (rows, n) that is reduce-scattered.
            if kind == "all_gather":
                moved = a.new_empty((a.shape[0] * self.tp, a.shape[1]))
            else:  # an FP8 GEMM's product is reduce-scattered in its out_dtype
                dtype = kwargs.get("out_dtype", a.dtype)
                moved = a.new_empty((a.shape[0], b.shape[1]), dtype=dtype)
            return self._record(f"fused_{kind}", moved, lambda: original(a, b, *args, **kwargs))

        return counted

    @contextmanager
    def installed(self) -> Iterator[CommCounter]:
        """Wrap the collectives (in ``torch.distributed`` and wherever one of our modules
        bound one to its own name) and the fused ops; restore them on exit."""
        patches: list[tuple[Any, str, Any]] = []
        originals = {getattr(dist, name): name for name in self._DIST if hasattr(dist, name)}
        wrappers = {fn: self._wrap_dist(name, fn) for fn, name in originals.items()}
        modules = [dist] + [
            m
            for n, m in list(sys.modules.items())
            if n.startswith("transformer_engine_ops.") and m is not None
        ]
        for module in modules:
            for attr, value in list(vars(module).items()):
                if callable(value) and value in wrappers:
                    patches.append((module, attr, value))
                    setattr(module, attr, wrappers[value])
        for attr, kind in (
            ("all_gather_matmul", "all_gather"),
            ("matmul_reduce_scatter", "reduce_scatter"),
            ("scaled_matmul_reduce_scatter", "reduce_scatter"),
        ):
            original = getattr(comm_overlap, attr)
            patches.append((comm_overlap, attr, original))
            setattr(comm_overlap, attr, self._wrap_fused(original, kind))
        try:
            yield self
        finally:
            for module, attr, value in reversed(patches):
                setattr(module, attr, value)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# --- one rank --------------------------------------------------------------------------


def _model(kind: str, cfg: dict[str, int], group: Any, device: torch.device) -> torch.nn.Module:
    torch.manual_seed(0)
    common = dict(
        tp_group=group,
        tp_size=group.size(),
        sequence_parallel=True,
        set_parallel_mode=True,
        normalization="RMSNorm",
        activation="swiglu",
        bias=False,
        params_dtype=torch.bfloat16,
        device=device,
    )
    if kind == "mlp":
        return te.LayerNormMLP(cfg["hidden"], cfg["ffn"], **common)
    return te.TransformerLayer(
        cfg["hidden"],
        cfg["ffn"],
        cfg["heads"],
        num_gqa_groups=cfg["groups"],
        hidden_dropout=0.0,
        attention_dropout=0.0,
        self_attn_mask_type="causal",
        **common,
    )


def _autocast(recipe: str) -> Any:
    factory = RECIPES[recipe]
    return contextlib.nullcontext() if factory is None else te.autocast(recipe=factory())


def _timed_steps(step: Callable[[], None], steps: int, device: torch.device) -> list[float]:
    times = []
    for _ in range(steps):
        _sync(device)
        dist.barrier()
        start = time.perf_counter()
        step()
        _sync(device)
        times.append(time.perf_counter() - start)
    return times


def _measure(
    kind: str, recipe: str, overlap: bool, cfg: dict[str, int], opts: dict[str, Any], w: Any
) -> dict[str, Any]:
    group, device = w["group"], w["device"]
    model = _model(kind, cfg, group, device)
    compiled = torch.compile(model, fullgraph=True, backend=opts["compile_backend"])
    tp = group.size()
    # Each rank holds its sequence shard of the (seq, batch, hidden) activations.
    shape = (cfg["seq"] // tp, cfg["batch"], cfg["hidden"])
    gen = torch.Generator(device=device).manual_seed(1 + group.rank())
    x = torch.randn(shape, device=device, generator=gen, dtype=torch.bfloat16)
    dy = torch.randn(shape, device=device, generator=gen, dtype=torch.bfloat16)
    x.requires_grad_(True)

    def step() -> None:
        for p in model.parameters():
            p.grad = None
        x.grad = None
        with _autocast(recipe):
            y = compiled(x)
        y.backward(dy)

    counter = CommCounter(tp, device)
    if overlap:
        comm_overlap.enable(group)
    try:
        with counter.installed():
            for _ in range(opts["warmup"]):
                step()
            counter.reset()
            step()  # one counted step
            moved, calls = dict(counter.bytes), dict(counter.calls)
            counter.reset()
            counter.timed = True
            step()  # one step with every collective timed alone
            comm_s = counter.seconds
            counter.timed = False
        times = _timed_steps(step, opts["steps"], device)
    finally:
        comm_overlap.disable(group)
    return {
        "bytes": moved,
        "total_bytes": sum(moved.values()),
        "calls": calls,
        "comm_s": comm_s,
        "step_s": statistics.median(times),
        "step_samples": times,
    }


def _rank(rank: int, backend: str, cfg: dict, opts: dict, out: str) -> None:
    os.environ.update(RANK_ENV)
    if backend == "nccl":
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(1)
    from datetime import timedelta

    dist.init_process_group(
        backend, rank=rank, world_size=WORLD, timeout=timedelta(seconds=PG_TIMEOUT_S)
    )
    group = dist.new_group(list(range(WORLD)))
    w = {"group": group, "device": device}
    results: dict[str, Any] = {}
    try:
        for kind in opts["models"]:
            for recipe in opts["recipes"]:
                for overlap in (False, True):
                    torch._dynamo.reset()
                    record = _measure(kind, recipe, overlap, cfg, opts, w)
                    # The slowest rank's step is the step.
                    per_rank: list[Any] = [None] * WORLD
                    dist.all_gather_object(per_rank, record)
                    name = f"{kind}/{recipe}/overlap-{'on' if overlap else 'off'}"
                    results[name] = {
                        **per_rank[0],
                        "step_s": max(r["step_s"] for r in per_rank),
                        "comm_s": max(r["comm_s"] for r in per_rank),
                        "step_s_per_rank": [r["step_s"] for r in per_rank],
                    }
                    if rank == 0:
                        print(f"{name}: {_line(results[name])}", flush=True)
        if rank == 0:
            Path(out).write_text(json.dumps(results, indent=1) + "\n")
    finally:
        dist.destroy_process_group()


def _line(r: dict[str, Any]) -> str:
    return (
        f"{r['total_bytes'] / 2**20:.2f} MiB moved per rank in {sum(r['calls'].values())} "
        f"collectives, step {r['step_s'] * 1e3:.2f} ms, comm alone {r['comm_s'] * 1e3:.2f} ms"
    )


# --- the launcher ----------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(
    backend: str = "nccl",
    quick: bool = False,
    models: tuple[str, ...] = MODELS,
    recipes: tuple[str, ...] = tuple(RECIPES),
    steps: int | None = None,
    compile_backend: str | None = None,
) -> dict[str, Any]:
    """Spawn the two ranks, measure every model x recipe x overlap, return the results
    (``summary`` adds the comparisons)."""
    if backend == "nccl" and torch.cuda.device_count() < WORLD:
        raise RuntimeError(
            f"benchmarks.tp_step: NCCL needs {WORLD} CUDA devices, this machine has "
            f"{torch.cuda.device_count()} (use --backend gloo --quick on the CPU)"
        )
    cfg = QUICK if quick else LLAMA_70B
    opts = {
        "models": models,
        "recipes": recipes,
        "warmup": 1 if quick else 3,  # the first step compiles
        "steps": steps or (2 if quick else 10),
        "compile_backend": compile_backend or ("inductor" if backend == "nccl" else "aot_eager"),
    }
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), **RANK_ENV}
    if backend == "gloo":
        env.update(OMP_NUM_THREADS="1", TORCHINDUCTOR_COMPILE_THREADS="1")
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    with tempfile.TemporaryDirectory(prefix="teops-tp-bench-") as tmp:
        out = os.path.join(tmp, "results.json")
        try:
            mp.start_processes(
                _rank, args=(backend, cfg, opts, out), nprocs=WORLD, start_method="spawn"
            )
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        results = json.loads(Path(out).read_text())
    return {
        "backend": backend,
        "config": cfg,
        "options": opts,
        "results": results,
        "summary": summary(results),
    }


def summary(results: dict[str, Any]) -> dict[str, Any]:
    """Per model and recipe: bytes and step time with overlap off and on, the share of
    the off step's communication time that overlap hides; per model, FP8's bytes over
    bf16's."""
    out: dict[str, Any] = {}
    for name, off in results.items():
        kind, recipe, state = name.split("/")
        if state != "overlap-off":
            continue
        on = results[f"{kind}/{recipe}/overlap-on"]
        out[f"{kind}/{recipe}"] = {
            "bytes_off": off["total_bytes"],
            "bytes_on": on["total_bytes"],
            "step_off_s": off["step_s"],
            "step_on_s": on["step_s"],
            "comm_off_s": off["comm_s"],
            "hidden_share": (off["step_s"] - on["step_s"]) / off["comm_s"]
            if off["comm_s"] > 0
            else None,
        }
    for kind in MODELS:
        bf16 = out.get(f"{kind}/bf16")
        for recipe, key in (("fp8_current", "fp8"), ("nvfp4", "nvfp4")):
            quantized = out.get(f"{kind}/{recipe}")
            if bf16 and quantized and bf16["bytes_off"]:
                ratio = quantized["bytes_off"] / bf16["bytes_off"]
                out[f"{kind}/{key}_over_bf16_bytes"] = ratio
    return out


# --- the report (docs/benchmarks.md, from the --device cuda run's "tp" part) -------------

HIDDEN_GOAL = 0.6  # overlap hides >= 60 % of the communication time


def report_targets(tp: dict[str, Any]) -> list[list[str]]:
    """Target rows: the share of the communication overlap hides, per model and recipe."""
    rows = []
    for name, s in tp.get("summary", {}).items():
        if not isinstance(s, dict) or s.get("hidden_share") is None:
            continue
        share = s["hidden_share"]
        met = "met" if share >= HIDDEN_GOAL else "**missed**"
        rows.append([f"TP=2 {name}: comm hidden by overlap", ">= 60%", f"{share:.0%}", met])
    return rows


def report_lines(tp: dict[str, Any]) -> list[str]:
    """The report's section: bytes moved and step times, overlap off and on."""
    out = ["### TP=2 sequence-parallel step: bytes moved and comm-GEMM overlap", ""]
    if "summary" not in tp:
        return out + [f"Not measured: {tp.get('error', 'no results')}.", ""]
    cfg = tp["config"]
    out += [
        f"{tp['backend']}, hidden {cfg['hidden']}, FFN {cfg['ffn']} (SwiGLU), {cfg['heads']} "
        f"heads in {cfg['groups']} KV groups, sequence {cfg['seq']}, batch {cfg['batch']}; "
        f"compiled ({tp['options']['compile_backend']}), median of "
        f"{tp['options']['steps']} steps of the slowest rank (docs/distributed.md).",
        "",
        "| model/recipe | MiB moved per rank (off / on) | step off | step on | comm alone "
        "(off) | comm hidden |",
        "|---|---|---|---|---|---|",
    ]
    for name, s in tp["summary"].items():
        if not isinstance(s, dict):
            continue
        share = "" if s["hidden_share"] is None else f"{s['hidden_share']:.0%}"
        out.append(
            f"| {name} | {s['bytes_off'] / 2**20:.1f} / {s['bytes_on'] / 2**20:.1f} | "
            f"{s['step_off_s'] * 1e3:.2f} ms | {s['step_on_s'] * 1e3:.2f} ms | "
            f"{s['comm_off_s'] * 1e3:.2f} ms | {share} |"
        )
    out.append("")
    for kind in MODELS:
        for key, name in (("fp8", "FP8 current scaling"), ("nvfp4", "NVFP4")):
            ratio = tp["summary"].get(f"{kind}/{key}_over_bf16_bytes")
            if ratio is not None:
                out += [f"{kind}: {name} moves {ratio:.2f}x bf16's bytes.", ""]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.tp_step", description=__doc__)
    p.add_argument("--backend", choices=("gloo", "nccl"), default="nccl")
    p.add_argument("--quick", action="store_true", help="tiny sizes (a smoke run)")
    p.add_argument("--models", nargs="*", choices=MODELS, default=list(MODELS))
    p.add_argument("--recipes", nargs="*", choices=tuple(RECIPES), default=list(RECIPES))
    p.add_argument("--steps", type=int, default=None, help="timed steps per configuration")
    p.add_argument("--compile-backend", default=None, help="inductor (NCCL) / aot_eager (gloo)")
    p.add_argument("--out", type=Path, default=None, help="write the results as JSON")
    args = p.parse_args(argv)
    try:
        data = run(
            args.backend,
            args.quick,
            tuple(args.models),
            tuple(args.recipes),
            args.steps,
            args.compile_backend,
        )
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for name, s in data["summary"].items():
        print(f"{name}: {json.dumps(s)}")
    if args.out:
        args.out.write_text(json.dumps(data, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
