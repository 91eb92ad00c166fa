"""Compile time of a 24-layer ``te.TransformerLayer`` stack against the same stack of the
plain block (``benchmarks.transformer_layer.PlainBlock``: ``torch.nn.Linear`` +
``F.scaled_dot_product_attention`` + ``torch.nn.RMSNorm``), CPU, cold caches.

Each measurement is a fresh interpreter with Inductor's, AOTAutograd's and Triton's
caches off and pointed at a fresh folder (``compile_depth.cold_cache_env``), which first
compiles a one-layer ``torch.nn.Linear`` (not measured: the process-wide first-use
costs), then times the first training step (forward + backward, ``fullgraph=True``,
Inductor) of a small Llama-shaped stack (hidden 128, 4 heads in 2 KV groups, SwiGLU FFN
256, RMSNorm, RoPE, bf16; batch 2, sequence 32). Rounds interleave the two; the ratio
is the median of the per-round CPU-time ratios ours / plain.

``python -m benchmarks.transformer_compile [--rounds N] [--layers N]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .common import ratio_stats, stats
from .compile_depth import _cpu_seconds, cold_cache_env

CONFIG = dict(hidden=128, ffn=256, heads=4, groups=2, seq=32, batch=2)


def _child(kind: str, layers: int) -> dict[str, Any]:
    import torch
    from torch import nn
    from torch._dynamo.utils import counters

    import transformer_engine_ops as te

    from .transformer_layer import PlainBlock, _ours

    torch.set_num_threads(2)
    warm = torch.compile(nn.Linear(16, 16), fullgraph=True)
    warm(torch.randn(4, 16, requires_grad=True)).sum().backward()
    torch._dynamo.reset()
    counters.clear()
    cfg = CONFIG
    freqs = te.RotaryPositionEmbedding(cfg["hidden"] // cfg["heads"])(cfg["seq"])
    ours = [_ours(cfg, "cpu") for _ in range(layers)]
    if kind == "plain":
        blocks = []
        for layer in ours:
            block = PlainBlock(cfg["hidden"], cfg["ffn"], cfg["heads"], cfg["groups"], "cpu")
            block.load_from(layer)
            blocks.append(block)
        flat = freqs[:, 0, 0, :]

        def model(x: torch.Tensor) -> torch.Tensor:
            for block in blocks:
                x = block(x, flat)
            return x
    else:

        def model(x: torch.Tensor) -> torch.Tensor:
            for layer in ours:
                x = layer(x, rotary_pos_emb=freqs)
            return x

    x = torch.randn(cfg["batch"], cfg["seq"], cfg["hidden"], dtype=torch.bfloat16)
    x.requires_grad_(True)
    compiled = torch.compile(model, fullgraph=True)
    start, cpu_start = time.perf_counter(), _cpu_seconds()
    compiled(x).float().sum().backward()
    return {
        "wall_s": time.perf_counter() - start,
        "cpu_s": _cpu_seconds() - cpu_start,
        "graphs": int(counters["stats"]["unique_graphs"]),
        "graph_breaks": int(sum(counters["graph_break"].values())),
    }


def measure(kind: str, layers: int) -> dict[str, Any]:
    """One cold first training step of ``kind`` ("ours" or "plain") in a fresh process."""
    root = Path(__file__).resolve().parent.parent
    argv = [sys.executable, "-m", "benchmarks.transformer_compile", "--child", kind]
    argv += ["--layers", str(layers)]
    with tempfile.TemporaryDirectory(prefix="teops-cold-compile-") as folder:
        env = {**os.environ, **cold_cache_env(folder)}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=root)
    if proc.returncode != 0:
        raise RuntimeError(f"transformer_compile child {kind} failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run(rounds: int, layers: int) -> dict[str, Any]:
    samples: dict[str, list[dict[str, Any]]] = {"plain": [], "ours": []}
    for _ in range(rounds):
        for kind in samples:
            samples[kind].append(measure(kind, layers))
            print(kind, samples[kind][-1], flush=True)
    cpu = {kind: [s["cpu_s"] for s in got] for kind, got in samples.items()}
    return {
        "layers": layers,
        "config": CONFIG,
        "cpu_s": {kind: stats(values) for kind, values in cpu.items()},
        "ours_over_plain_cpu": ratio_stats(cpu["ours"], cpu["plain"]),
        "graph_breaks": {kind: [s["graph_breaks"] for s in got] for kind, got in samples.items()},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", choices=("ours", "plain"))
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(_child(args.child, args.layers)))
        return 0
    result = run(args.rounds, args.layers)
    ratio = result["ours_over_plain_cpu"]
    print(f"ours / plain, CPU time, first compiled step: {ratio['median']:.3f}x (n={ratio['n']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
