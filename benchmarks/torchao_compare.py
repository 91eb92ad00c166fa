"""The Llama-8B-sized layer of ``benchmarks.transformer_layer`` under FP8, ours against
torchao's ``Float8Linear`` (an optional bench dependency: a torchao built for the torch
in use), one GPU, every contender compiled (``fullgraph=True``, Inductor).

* torchao tensorwise (``Float8LinearConfig.from_recipe_name("tensorwise")``) on the plain
  block's four ``nn.Linear``s against our ``Float8CurrentScaling`` (per-tensor scales);
* torchao rowwise against our ``Float8BlockScaling`` (TE's 1x128 / 128x128 blocks: the
  finer-grained scaling each offers);
* the plain block and ours in bf16 for reference.

Train step (forward + backward), medians of interleaved rounds, and each contender's
host time per step; ``python -m benchmarks.torchao_compare [--quick] [--out FILE]``, or
the ``torchao`` part of ``python -m benchmarks --device cuda`` (skipped, with the reason,
where torchao is not installed).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import torch

import transformer_engine_ops as te
from transformer_engine_ops.quantization import Float8BlockScaling, Float8CurrentScaling

from .common import (
    host_seconds,
    interleaved,
    kernel_profile,
    machine_info,
    measured_on,
    on_gpu,
    progress,
    ratio_stats,
    stats,
)
from .transformer_layer import LLAMA_8B, QUICK, PlainBlock, _ours


def _float8(block: torch.nn.Module, recipe: str) -> torch.nn.Module:
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    config = Float8LinearConfig.from_recipe_name(recipe)
    return convert_to_float8_training(block, config=config)


def run(quick: bool = False, rounds: int = 7) -> dict[str, Any]:
    cfg = QUICK if quick else LLAMA_8B
    device = "cuda"
    torch.manual_seed(0)
    ours = _ours(cfg, device)
    blocks = {}
    for name in ("bf16", "tensorwise", "rowwise"):
        block = PlainBlock(cfg["hidden"], cfg["ffn"], cfg["heads"], cfg["groups"], device)
        block.load_from(ours)
        blocks[name] = block if name == "bf16" else _float8(block, name)
    freqs = te.RotaryPositionEmbedding(cfg["hidden"] // cfg["heads"]).to(device)(cfg["seq"])
    flat = freqs[:, 0, 0, :]
    x = torch.randn(cfg["batch"], cfg["seq"], cfg["hidden"], device=device, dtype=torch.bfloat16)
    x.requires_grad_(True)
    grad = torch.randn_like(x)
    ours_c = torch.compile(ours, fullgraph=True)
    compiled = {name: torch.compile(b, fullgraph=True) for name, b in blocks.items()}

    def step(fn: Any, recipe: Any = None) -> Any:
        def run_once() -> None:
            x.grad = None
            if recipe is None:
                out = fn()
            else:
                with te.autocast(recipe=recipe):
                    out = fn()
            out.backward(grad)

        return run_once

    contenders = {
        "plain_bf16": step(lambda: compiled["bf16"](x, flat)),
        "torchao_tensorwise": step(lambda: compiled["tensorwise"](x, flat)),
        "torchao_rowwise": step(lambda: compiled["rowwise"](x, flat)),
        "ours_bf16": step(lambda: ours_c(x, rotary_pos_emb=freqs)),
        "ours_fp8_current": step(
            lambda: ours_c(x, rotary_pos_emb=freqs), recipe=Float8CurrentScaling()
        ),
        "ours_fp8_block": step(
            lambda: ours_c(x, rotary_pos_emb=freqs), recipe=Float8BlockScaling()
        ),
    }
    for name, fn in contenders.items():
        progress(f"torchao_compare: warming up {name}")
        for _ in range(3):
            fn()
    times = interleaved(contenders, 1 if quick else rounds, 0.2 if quick else 1.0, "train step")
    return {
        "machine": machine_info(),
        "config": cfg,
        "seconds": {name: stats(samples) for name, samples in times.items()},
        # Host time of one step (the device kept busy): near the step's time, a contender
        # is bound by the host and its figure follows the host's speed.
        "host_seconds": {name: host_seconds(fn) for name, fn in contenders.items()},
        # Kernels launched, GPU busy time and kernel time by kind, per step.
        "profile": {name: kernel_profile(fn) for name, fn in contenders.items()},
        "ours_current_over_torchao_tensorwise": ratio_stats(
            times["ours_fp8_current"], times["torchao_tensorwise"]
        ),
        "ours_block_over_torchao_rowwise": ratio_stats(
            times["ours_fp8_block"], times["torchao_rowwise"]
        ),
    }


# Goals of the Llama-sized layer's train step: (label, faster, slower, goal);
# the speed-up is slower's median step over faster's.
GOALS = (
    ("ours FP8 current scaling vs plain bf16", "ours_fp8_current", "plain_bf16", 1.5),
    (
        "ours FP8 current scaling vs torchao tensorwise",
        "ours_fp8_current",
        "torchao_tensorwise",
        1.1,
    ),
    ("ours FP8 block scaling vs plain bf16", "ours_fp8_block", "plain_bf16", 1.25),
    ("ours FP8 block scaling vs torchao rowwise", "ours_fp8_block", "torchao_rowwise", 1.15),
    ("ours bf16 vs plain bf16", "ours_bf16", "plain_bf16", 1.0),
)


def speedups(part: dict[str, Any]) -> list[tuple[str, float, float]]:
    """``(label, speed-up, goal)`` for each goal the part measured."""
    seconds = part.get("seconds", {})
    return [
        (label, seconds[slow]["median"] / seconds[fast]["median"], goal)
        for label, fast, slow, goal in GOALS
        if fast in seconds and slow in seconds
    ]


def report_targets(part: dict[str, Any] | None) -> list[list[str]]:
    """Target rows: each speed-up of the layer's train step against its goal."""
    if not part or "seconds" not in part:
        why = (part or {}).get("skipped") or (part or {}).get("error") or "not measured"
        return [
            ["Llama-sized layer train step", "see docs/transformer.md", why[:160], "**missed**"]
        ]
    return [
        [
            f"layer train step: {label}{on_gpu(part)}",
            f">= {goal}x",
            f"{x:.2f}x",
            "met" if x >= goal else "**missed**",
        ]
        for label, x, goal in speedups(part)
    ]


def report_lines(part: dict[str, Any] | None) -> list[str]:
    """The report's section: step time, host time and kernel profile of each contender."""
    out = ["### Llama-sized layer train step: ours against torchao and plain PyTorch", ""]
    if not part or "seconds" not in part:
        return out + [f"Not measured: {(part or {}).get('skipped', 'no results')}.", ""]
    cfg = part["config"]
    out += measured_on(part)
    out += [
        f"Hidden {cfg['hidden']}, FFN {cfg['ffn']} (SwiGLU), {cfg['heads']} heads in "
        f"{cfg['groups']} KV groups, RMSNorm, RoPE, causal, sequence {cfg['seq']}, batch "
        f"{cfg['batch']}; forward + backward, every contender compiled fullgraph, medians of "
        "interleaved rounds (benchmarks/torchao_compare.py). Host: one step's host time with "
        "the GPU kept busy. Kernels and GPU busy time: torch.profiler over three steps.",
        "",
        "| contender | step (median) | host time | kernels a step | GPU busy | GPU time by kind (ms) |",
        "|---|---|---|---|---|---|",
    ]
    for name, s in part["seconds"].items():
        host = part.get("host_seconds", {}).get(name, {}).get("median")
        prof = part.get("profile", {}).get(name)
        kinds = (
            ", ".join(f"{k} {v:.2f}" for k, v in prof["kernel_ms_by_group"].items())
            if prof
            else "-"
        )
        out.append(
            f"| {name} | {1e3 * s['median']:.2f} ms | "
            + (f"{1e3 * host:.2f} ms" if host is not None else "-")
            + (
                f" | {prof['kernels_per_step']:.0f} | {prof['gpu_busy_ms_per_step']:.2f} ms | {kinds} |"
                if prof
                else " | - | - | - |"
            )
        )
    return out + [""]


def run_if_installed() -> dict[str, Any]:
    """:func:`run`, or ``{"skipped": why}`` where torchao cannot be imported (it is an
    optional bench dependency: ``pip install -e .[bench]``, a torchao built for this torch)."""
    try:
        import torchao.float8  # noqa: F401
    except Exception as exc:  # an ImportError, or a torchao built for another torch
        return {"skipped": f"torchao is not importable: {type(exc).__name__}: {exc}"}
    return run()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    result = run(args.quick)
    for name, s in result["seconds"].items():
        host = result["host_seconds"][name]["median"]
        print(f"  {name:22s} {s['median'] * 1e3:8.2f} ms   host {host * 1e3:6.2f} ms")
    for name, p in result["profile"].items():
        print(
            f"  {name:22s} {p['kernels_per_step']:6.0f} kernels, GPU busy "
            f"{p['gpu_busy_ms_per_step']:7.2f} ms; "
            + ", ".join(f"{k} {v:.2f}" for k, v in p["kernel_ms_by_group"].items())
        )
    for label, x, goal in speedups(result):
        print(f"  {label}: {x:.3f}x (goal {goal}x)")
    if args.out:  # the layout of the other standalone GPU benches (python -m benchmarks --merge)
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump({"machine": result["machine"], "torchao": result}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
