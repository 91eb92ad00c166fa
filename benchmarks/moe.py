"""A DeepSeek-V2-Lite-sized MoE layer on one GPU: ours (TE's helpers and two
``te.GroupedLinear``) against the same layer with a per-expert loop of ``F.linear`` and
against a hand-written ``torch._grouped_mm`` layer, all compiled (``fullgraph=True``).

* The layer (``demo/moe_demo.py``'s ``MoELayer``): router (a bias-free linear, softmax
  top-k with TE's score function over fp32 logits), ``te.moe_permute``,
  ``GroupedLinear`` fc1 (hidden -> 2 x FFN), SwiGLU, ``GroupedLinear`` fc2 (FFN ->
  hidden), ``te.moe_unpermute`` merging with the routing probabilities; no biases, bf16
  parameters and activations. Sizes: hidden 2048, 64
  experts, top-6, expert FFN 1408, 8192 tokens (``--quick``: hidden 64, 8 experts,
  top-2, FFN 32, 64 tokens; a smoke run, also on the CPU: its numbers mean nothing).
* Contenders (train step: forward + backward of the layer, one fixed batch; interleaved
  rounds, medians): ``ours_bf16`` (the row counts on the device: the grouped GEMM; each
  GroupedLinear's weights one ``[E, N, K]`` parameter, TE's ``single_grouped_weight``),
  ``ours_bf16_per_expert_weights`` (TE's default, one parameter per expert, stacked at
  every call), ``ours_fp8_current`` and ``ours_fp8_block`` (under ``te.autocast``), ``loop_bf16``
  (our router and permutation, the experts as a Python loop of ``F.linear`` over the
  rows split by a host list of counts, given before the call), ``grouped_mm_bf16`` (a
  hand-written layer: ``argsort`` dispatch, ``torch._grouped_mm`` on one ``[E, N, K]``
  weight per layer, ``index_add`` combine). The three bf16 layers are first checked to
  compute the same output from the same weights (bf16 tolerance).
* Checks (CUDA): one eager step of ours under ``torch.cuda.set_sync_debug_mode("error")``
  (no host synchronization), and ours compiled with ``mode="reduce-overhead"``: replays
  on batches routed differently equal eager's (bit for bit in bf16), and no graph is
  kept out of CUDA graphs (Inductor's ``cudagraph_skips`` counter).

Standalone: ``python -m benchmarks.moe [--quick] [--out FILE]``; ``python -m benchmarks
--device cuda`` runs it as its ``moe`` part.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import transformer_engine_ops as te
from transformer_engine_ops.quantization import Float8BlockScaling, Float8CurrentScaling

from .common import interleaved, machine_info, measured_on, on_gpu, progress, ratio_stats, stats

# The layer is the demo's (demo/moe_demo.py): the bench times what `make demo` checks.
_DEMO = Path(__file__).resolve().parent.parent / "demo"
if str(_DEMO) not in sys.path:
    sys.path.insert(0, str(_DEMO))
from moe_demo import MoELayer  # noqa: E402

DEEPSEEK_V2_LITE = dict(hidden=2048, experts=64, topk=6, ffn=1408, tokens=8192)
QUICK = dict(hidden=64, experts=8, topk=2, ffn=32, tokens=64)
GOALS = {
    "loop_over_ours_bf16": 2.0,
    "grouped_mm_over_ours_bf16": 0.95,
    "ours_bf16_over_ours_fp8_current": 1.3,
    "ours_bf16_over_ours_fp8_block": 1.1,
}


class LoopLayer(nn.Module):
    """Ours with the experts as a loop of ``F.linear`` over the rows split by
    ``m_splits``, a host list (the same weights, one parameter each)."""

    def __init__(self, ours: MoELayer) -> None:
        super().__init__()
        self.ours = ours
        self.w1 = nn.ParameterList(nn.Parameter(w.detach().clone()) for w in ours.fc1._weights())
        self.w2 = nn.ParameterList(nn.Parameter(w.detach().clone()) for w in ours.fc2._weights())

    def forward(self, x: torch.Tensor, m_splits: list[int]) -> torch.Tensor:
        probs, routing = self.ours.route(x)
        rows, row_id_map = te.moe_permute(x, routing, num_out_tokens=x.shape[0] * self.ours.topk)
        outs = []
        for i, part in enumerate(rows.split(m_splits)):
            a, b = F.linear(part, self.w1[i]).chunk(2, dim=-1)
            outs.append(F.linear(F.silu(a) * b, self.w2[i]))
        h = torch.cat(outs)
        return te.moe_unpermute(h, row_id_map, merging_probs=probs, restore_shape=x.shape)


class GroupedMMLayer(nn.Module):
    """A hand-written MoE layer on ``torch._grouped_mm``: softmax top-k, ``argsort``
    dispatch, one ``[E, N, K]`` weight per GEMM, ``index_add`` combine (the same router
    weight and expert weights as ours)."""

    def __init__(self, ours: MoELayer) -> None:
        super().__init__()
        self.topk = ours.topk
        self.router = nn.Parameter(ours.router.weight.detach().clone())
        self.w1 = nn.Parameter(torch.stack([w.detach() for w in ours.fc1._weights()]))
        self.w2 = nn.Parameter(torch.stack([w.detach() for w in ours.fc2._weights()]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        experts = self.w1.shape[0]
        scores = torch.softmax(F.linear(x, self.router).float(), dim=-1)
        probs, chosen = scores.topk(self.topk, dim=-1)
        flat = chosen.reshape(-1)
        order = torch.argsort(flat, stable=True)
        token = order // self.topk
        counts = torch.bincount(flat, minlength=experts)
        offsets = torch.cumsum(counts, 0).to(torch.int32)
        grouped = torch._grouped_mm
        h = grouped(x[token], self.w1.transpose(-2, -1), offs=offsets)
        a, b = h.chunk(2, dim=-1)
        y = grouped(F.silu(a) * b, self.w2.transpose(-2, -1), offs=offsets)
        y = (y.float() * probs.reshape(-1)[order, None]).to(x.dtype)
        return torch.zeros_like(x).index_add_(0, token, y)


def _check_same_layer(ours: Any, loop: Any, grouped: Any, x: torch.Tensor, splits: list) -> float:
    with torch.no_grad():
        a = ours(x).float()
        b = loop(x, splits).float()
        c = grouped(x).float()
    scale = a.abs().max().item()
    diff = max((a - b).abs().max().item(), (a - c).abs().max().item())
    progress(f"moe: the three bf16 layers' outputs max|diff| {diff:.3g} (scale {scale:.3g})")
    if diff > 0.05 * scale:
        raise AssertionError(f"the bf16 MoE layers disagree: {diff} vs scale {scale}")
    return diff


def _no_sync_step(ours: MoELayer, x: torch.Tensor, recipe: Any) -> str:
    """One eager train step of ours with host synchronizations turned into errors."""
    ctx = te.autocast(recipe=recipe) if recipe is not None else contextlib.nullcontext()
    ours(x).sum().backward()  # warm-up: lazy initializations may synchronize once
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with ctx:
            out = ours(x)
        out.float().square().sum().backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    return "no synchronization"


def _cuda_graphs(cfg: dict[str, int], device: Any) -> dict[str, Any]:
    """Ours under ``mode="reduce-overhead"``: replays on differently routed batches
    against eager, and Inductor's CUDA-graph skips."""
    from torch._dynamo.utils import counters

    ours = _layer(cfg, device)
    compiled = torch.compile(ours, fullgraph=True, mode="reduce-overhead")
    counters.clear()

    def step(fn: Any, x: torch.Tensor) -> list[torch.Tensor]:
        for p in ours.parameters():
            p.grad = None
        x = x.detach().clone().requires_grad_(True)
        out = fn(x)
        out.backward(torch.ones_like(out))
        return [out.detach().clone(), x.grad.clone(), *[p.grad.clone() for p in ours.parameters()]]

    equal, splits_seen = [], []
    for seed in range(5):
        gen = torch.Generator(device=device).manual_seed(seed)
        x = torch.randn(cfg["tokens"], cfg["hidden"], generator=gen, device=device)
        x = x.to(torch.bfloat16)
        splits_seen.append(ours.route(x)[1].sum(0).tolist())
        got = step(compiled, x)
        want = step(ours, x)
        equal.append(all(torch.equal(a, b) for a, b in zip(got, want, strict=True)))
    return {
        "replays_equal_eager": equal,
        "distinct_routings": len({tuple(s) for s in splits_seen}),
        "cudagraph_skips": int(counters["inductor"]["cudagraph_skips"]),
    }


@contextlib.contextmanager
def _single_grouped_weights() -> Any:
    """TE's gate of ``single_grouped_weight`` open (its experimental warning silenced)."""
    name = "NVTE_GROUPED_LINEAR_SINGLE_PARAM"
    previous = os.environ.get(name)
    os.environ[name] = "1"
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="GroupedLinear is using single_grouped")
            yield
    finally:
        if previous is None:
            del os.environ[name]
        else:
            os.environ[name] = previous


def _layer(cfg: dict[str, int], device: Any, single: bool = True) -> MoELayer:
    """Ours: with ``single``, each GroupedLinear's weights one ``[E, N, K]`` parameter
    (TE's ``single_grouped_weight``), read by the grouped GEMM as they are; otherwise
    one parameter per expert (TE's default), stacked at every call."""
    torch.manual_seed(0)
    with _single_grouped_weights():
        return MoELayer(
            cfg["hidden"],
            cfg["experts"],
            cfg["topk"],
            cfg["ffn"],
            device=device,
            single_grouped_weight=single,
        )


def _train(cfg: dict[str, int], device: Any, rounds: int, min_run_time: float) -> dict[str, Any]:
    ours = _layer(cfg, device)
    per_expert = _layer(cfg, device, single=False)
    loop, grouped = LoopLayer(ours), GroupedMMLayer(ours)
    gen = torch.Generator(device=device).manual_seed(1)
    x = torch.randn(cfg["tokens"], cfg["hidden"], generator=gen, device=device)
    x = x.to(torch.bfloat16).requires_grad_(True)
    grad = torch.randn(x.shape, generator=gen, device=device).to(x.dtype)
    splits = ours.route(x)[1].sum(0).tolist()  # the loop's host list, given before the calls
    difference = _check_same_layer(ours, loop, grouped, x, splits)
    ours_c = torch.compile(ours, fullgraph=True)
    per_expert_c = torch.compile(per_expert, fullgraph=True)
    loop_c = torch.compile(loop, fullgraph=True)
    grouped_c = torch.compile(grouped, fullgraph=True)

    def step(fn: Any, *args: Any, recipe: Any = None) -> Any:
        def run() -> None:
            x.grad = None
            ctx = te.autocast(recipe=recipe) if recipe is not None else contextlib.nullcontext()
            with ctx:
                out = fn(x, *args)
            out.backward(grad)

        return run

    contenders = {
        "ours_bf16": step(ours_c),
        "ours_bf16_per_expert_weights": step(per_expert_c),
        "ours_fp8_current": step(ours_c, recipe=Float8CurrentScaling()),
        "ours_fp8_block": step(ours_c, recipe=Float8BlockScaling()),
        "loop_bf16": step(loop_c, splits),
        "grouped_mm_bf16": step(grouped_c),
    }
    for name, fn in contenders.items():  # compile and warm up
        progress(f"moe: warming up {name}")
        for _ in range(3):
            fn()
    times = interleaved(contenders, rounds, min_run_time, label="moe train step")
    ratios = {
        "loop_over_ours_bf16": ratio_stats(times["loop_bf16"], times["ours_bf16"]),
        "grouped_mm_over_ours_bf16": ratio_stats(times["grouped_mm_bf16"], times["ours_bf16"]),
        "ours_bf16_over_ours_fp8_current": ratio_stats(
            times["ours_bf16"], times["ours_fp8_current"]
        ),
        "ours_bf16_over_ours_fp8_block": ratio_stats(times["ours_bf16"], times["ours_fp8_block"]),
    }
    return {
        "config": cfg,
        "check_max_abs_diff": difference,
        "splits": splits,
        "seconds": {name: stats(samples) for name, samples in times.items()},
        "ratios": ratios,
        "goals": {
            name: {"goal": goal, "met": ratios[name]["median"] >= goal}
            for name, goal in GOALS.items()
        },
    }


PARTS = ("train_step", "no_sync", "cuda_graphs")


def run(
    quick: bool = False, device: str = "cuda", parts: tuple[str, ...] = PARTS
) -> dict[str, Any]:
    """The train-step comparison and, on CUDA, the synchronization and CUDA-graph
    checks (``quick``: tiny sizes, one round)."""
    cfg = QUICK if quick else DEEPSEEK_V2_LITE
    rounds, min_run_time = (1, 0.05) if quick else (7, 0.5)
    results: dict[str, Any] = {}
    steps = {
        "train_step": lambda: _train(cfg, device, rounds, min_run_time),
        "no_sync": lambda: _no_sync_checks(cfg, device),
        "cuda_graphs": lambda: _cuda_graphs(cfg, device),
    }
    for name, part in steps.items():
        if name not in parts or (name != "train_step" and device == "cpu"):
            continue
        # Each part compiles fresh layers of one class: the earlier parts' graphs of
        # the same forward would count against Dynamo's recompile limit.
        torch._dynamo.reset()
        try:
            results[name] = part()
        except Exception as exc:  # keep the other parts' numbers
            results[name] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
            progress(f"moe {name}: failed: {results[name]['error']}")
    return results


def _no_sync_checks(cfg: dict[str, int], device: Any) -> dict[str, Any]:
    ours = _layer(cfg, device)
    x = torch.randn(cfg["tokens"], cfg["hidden"], device=device).to(torch.bfloat16)
    x.requires_grad_(True)
    return {
        "bf16": _no_sync_step(ours, x, None),
        "fp8_current": _no_sync_step(ours, x, Float8CurrentScaling()),
    }


NAMES = {
    "loop_over_ours_bf16": "per-expert F.linear loop / ours (bf16)",
    "grouped_mm_over_ours_bf16": "hand-written torch._grouped_mm layer / ours (bf16)",
    "ours_bf16_over_ours_fp8_current": "ours bf16 / ours FP8 current scaling",
    "ours_bf16_over_ours_fp8_block": "ours bf16 / ours FP8 block scaling",
}


def report_targets(part: dict[str, Any] | None) -> list[list[str]]:
    """Target rows of the MoE layer: each speed ratio against its goal, the host
    synchronizations and the CUDA graphs (missed where not measured)."""
    part = part or {}
    train = part.get("train_step", {})
    rows = []
    for key, name in NAMES.items():
        goal = GOALS[key]
        r = train.get("ratios", {}).get(key)
        if r is None:
            rows.append(
                [f"MoE step: {name}{on_gpu(train)}", f">= {goal}x", "not measured", "**missed**"]
            )
        else:
            met = "met" if r["median"] >= goal else "**missed**"
            rows.append(
                [f"MoE step: {name}{on_gpu(train)}", f">= {goal}x", f"{r['median']:.2f}x", met]
            )
    sync = part.get("no_sync", {})
    ok = sync and "error" not in sync
    rows.append(
        [
            "MoE step: no host synchronization (bf16, FP8 current)" + on_gpu(sync),
            'set_sync_debug_mode("error") quiet',
            "quiet" if ok else str(sync.get("error", "not measured"))[:160],
            "met" if ok else "**missed**",
        ]
    )
    graphs = part.get("cuda_graphs", {})
    ok = bool(graphs.get("replays_equal_eager")) and all(graphs["replays_equal_eager"])
    ok = ok and graphs.get("cudagraph_skips") == 0
    shown = (
        f"{graphs.get('distinct_routings')} routings, replays equal eager: "
        f"{graphs.get('replays_equal_eager')}, skips {graphs.get('cudagraph_skips')}"
        if "replays_equal_eager" in graphs
        else str(graphs.get("error", "not measured"))[:160]
    )
    rows.append(
        [
            'MoE step under mode="reduce-overhead"' + on_gpu(graphs),
            "all in CUDA graphs, replays equal eager",
            shown,
            "met" if ok else "**missed**",
        ]
    )
    return rows


def report_lines(part: dict[str, Any] | None) -> list[str]:
    """The report's section: the MoE layer's step times."""
    out = ["### MoE layer train step (DeepSeek-V2-Lite sizes)", ""]
    train = (part or {}).get("train_step", {})
    if "seconds" not in train:
        return out + [f"Not measured: {train.get('error', 'no results')}.", ""]
    cfg = train["config"]
    out += measured_on(train)
    out += [
        f"Hidden {cfg['hidden']}, {cfg['experts']} experts, top-{cfg['topk']}, expert FFN "
        f"{cfg['ffn']} (SwiGLU), {cfg['tokens']} tokens, bf16; forward + backward, "
        "compiled fullgraph, interleaved rounds (benchmarks/moe.py, docs/moe.md).",
        "",
        "| layer | step (median) | quartiles |",
        "|---|---|---|",
    ]
    for name, s in train["seconds"].items():
        spread = f"{1e3 * s['q1']:.3f} - {1e3 * s['q3']:.3f} ms"
        out.append(f"| {name} | {1e3 * s['median']:.3f} ms | {spread} |")
    return out + [""]


def _print(results: dict[str, Any]) -> None:
    train = results.get("train_step", {})
    if "seconds" in train:
        print("\nMoE train step (forward + backward), median ms:")
        for name, s in train["seconds"].items():
            print(f"  {name:<18} {1e3 * s['median']:9.2f}")
        for name, r in train["ratios"].items():
            goal = train["goals"][name]
            print(
                f"  {name:<34} {r['median']:.3f}x (goal {goal['goal']}x: {'met' if goal['met'] else 'not met'})"
            )
    for name in ("no_sync", "cuda_graphs"):
        if name in results:
            print(f"\n{name}: {results[name]}")
    for name, part in results.items():
        if "error" in part:
            print(f"\n{name}: {part['error']}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.moe", description=__doc__)
    p.add_argument("--quick", action="store_true", help="tiny sizes, one round (smoke)")
    p.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--only", choices=PARTS, default=None, help="run one part")
    args = p.parse_args(argv)
    if args.device == "cpu" and not args.quick:
        print("error: the full sizes need a CUDA device (use --quick on the CPU)", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False
    parts = PARTS if args.only is None else (args.only,)
    results = {"machine": machine_info(), "moe": run(args.quick, args.device, parts)}
    _print(results["moe"])
    if args.out is not None:
        args.out.write_text(json.dumps(results, indent=1, default=str) + "\n")
        progress(f"wrote {args.out}")
    failed = any("error" in part for part in results["moe"].values())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
