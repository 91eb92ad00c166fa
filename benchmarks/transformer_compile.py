"""Figure 12: compile time of a ``te.TransformerLayer`` stack, compiled whole and
regionally, against the same stack of the plain block (``benchmarks.transformer_layer.
PlainBlock``: ``torch.nn.Linear`` + ``F.scaled_dot_product_attention`` +
``torch.nn.RMSNorm``), CPU, cold caches.

Each measurement is a fresh interpreter with Inductor's, AOTAutograd's and Triton's
caches off and pointed at a fresh folder (``compile_depth.cold_cache_env``), which first
compiles a one-layer ``torch.nn.Linear`` (not measured: the process-wide first-use
costs), then times the first training step (forward + backward, ``fullgraph=True``,
Inductor) of a small Llama-shaped stack (hidden 128, 4 heads in 2 KV groups, SwiGLU FFN
256, RMSNorm, RoPE, bf16; batch 2, sequence 32). Two ways to compile a stack:

* ``whole``: ``torch.compile(model, fullgraph=True)``; Dynamo, AOTAutograd and Inductor
  see every layer.
* ``regional``: the same, with each layer's call a ``torch.compiler.
  nested_compile_region``, so the repeated layer is compiled once and called N times.

Rounds interleave the contenders; each ratio is the median of per-round CPU-time
ratios (the process's and its C++ compiler runs': the steadier figure on a shared
machine).

``python -m benchmarks.transformer_compile [--rounds N] [--layers N]``, also the
``stack_compile`` figure of ``python -m benchmarks``.
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

from .common import bytecode_env, progress, ratio_stats, stats
from .compile_depth import _cpu_seconds, cold_cache_env

CONFIG = dict(hidden=128, ffn=256, heads=4, groups=2, seq=32, batch=2)
LAYERS = 32
# (stack, way) of each contender, in the order a round measures them.
CONTENDERS = (("plain", "whole"), ("plain", "regional"), ("ours", "whole"), ("ours", "regional"))
# The goals: (label, numerator, denominator, bound) on the median CPU-time ratio.
GOALS = (
    ("ours regional / plain whole", "ours/regional", "plain/whole", 0.5),
    ("ours regional / plain regional", "ours/regional", "plain/regional", 1.1),
)


def _child(stack: str, way: str, layers: int) -> dict[str, Any]:
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
    layer_modules: list[nn.Module] = [_ours(cfg, "cpu") for _ in range(layers)]
    if stack == "plain":
        blocks = []
        for layer in layer_modules:
            block = PlainBlock(cfg["hidden"], cfg["ffn"], cfg["heads"], cfg["groups"], "cpu")
            block.load_from(layer)
            blocks.append(block)
        layer_modules, rope = blocks, freqs[:, 0, 0, :]

        def call(layer: nn.Module, x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
            return layer(x, rope)
    else:
        rope = freqs

        def call(layer: nn.Module, x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
            return layer(x, rotary_pos_emb=rope)

    if way == "regional":
        call = torch.compiler.nested_compile_region(call)

    def model(x: torch.Tensor) -> torch.Tensor:
        for layer in layer_modules:
            x = call(layer, x, rope)
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


def measure(stack: str, way: str, layers: int) -> dict[str, Any]:
    """One cold first training step of ``stack`` ("ours" or "plain") compiled ``way``
    ("whole" or "regional"), in a fresh process."""
    root = Path(__file__).resolve().parent.parent
    argv = [sys.executable, "-m", "benchmarks.transformer_compile", "--child", stack, way]
    argv += ["--layers", str(layers)]
    with tempfile.TemporaryDirectory(prefix="teops-cold-compile-") as folder:
        env = {**os.environ, **bytecode_env(), **cold_cache_env(folder)}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=root)
    if proc.returncode != 0:
        raise RuntimeError(
            f"transformer_compile child {stack}/{way} failed:\n{proc.stderr[-4000:]}"
        )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run(
    rounds: int = 3,
    layers: int = LAYERS,
    contenders: tuple[tuple[str, str], ...] = CONTENDERS,
    fill_bytecode_cache: bool = True,
) -> dict[str, Any]:
    """``rounds`` interleaved rounds of ``contenders`` (after one dropped round at one
    layer that fills the bytecode cache)."""
    if fill_bytecode_cache:
        for stack, way in contenders:
            measure(stack, way, 1)
    samples: dict[str, list[dict[str, Any]]] = {f"{s}/{w}": [] for s, w in contenders}
    for index in range(rounds):
        for stack, way in contenders:
            got = measure(stack, way, layers)
            samples[f"{stack}/{way}"].append(got)
            progress(f"stack compile round {index + 1}/{rounds}: {stack}/{way} {got}")
    cpu = {key: [s["cpu_s"] for s in got] for key, got in samples.items()}
    pairs = [(label, a, b) for label, a, b, _ in GOALS]
    pairs.append(("ours whole / plain whole", "ours/whole", "plain/whole"))
    return {
        "layers": layers,
        "rounds": rounds,
        "config": CONFIG,
        "cpu_s": {key: stats(values) for key, values in cpu.items()},
        "wall_s": {key: stats([s["wall_s"] for s in got]) for key, got in samples.items()},
        "cpu_samples_s": cpu,
        "ratios": {
            label: ratio_stats(cpu[a], cpu[b]) for label, a, b in pairs if a in cpu and b in cpu
        },
        "graphs": {key: sorted({s["graphs"] for s in got}) for key, got in samples.items()},
        "graph_breaks": {key: sum(s["graph_breaks"] for s in got) for key, got in samples.items()},
    }


def report_targets(r: dict[str, Any]) -> list[list[str]]:
    """The goal rows of the report's targets table (a ratio not measured: missed)."""
    rows = []
    for label, _, _, bound in GOALS:
        got = r["ratios"].get(label)
        rows.append(
            [
                f"compile time, {r['layers']}-layer TransformerLayer stack (CPU): {label}",
                f"<= {bound}x",
                f"{got['median']:.2f}x" if got else "not measured",
                "met" if got and got["median"] <= bound else "**missed**",
            ]
        )
    return rows


def report_section(r: dict[str, Any], method: str) -> list[str]:
    """Figure 12 of the report: each contender's first compiled step and the ratios."""
    out = [f"## 12. Compile time of a {r['layers']}-layer TransformerLayer stack", ""]
    out += [method, ""]
    out += ["| stack | compiled | CPU time (median, range) | wall | graphs | graph breaks |"]
    out += ["|---|---|---|---|---|---|"]
    for key, s in r["cpu_s"].items():
        stack, way = key.split("/")
        name = "te.TransformerLayer" if stack == "ours" else "plain block"
        w = r["wall_s"][key]
        graphs = ", ".join(str(g) for g in r["graphs"][key])
        out.append(
            f"| {name} | {way} | {s['median']:.1f} s ({s['min']:.1f}-{s['max']:.1f}) "
            f"| {w['median']:.1f} s | {graphs} | {r['graph_breaks'][key]} |"
        )
    out += ["", "| ratio (CPU time, median of per-round ratios) | median | range |"]
    out += ["|---|---|---|"]
    for label, s in r["ratios"].items():
        out.append(f"| {label} | {s['median']:.2f}x | {s['min']:.2f}-{s['max']:.2f}x |")
    return out + [""]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", nargs=2, metavar=("STACK", "WAY"))
    parser.add_argument("--layers", type=int, default=LAYERS)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, help="write the results JSON here")
    args = parser.parse_args(argv)
    if args.child:
        stack, way = args.child
        print(json.dumps(_child(stack, way, args.layers)))
        return 0
    result = run(args.rounds, args.layers)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    for label, s in result["ratios"].items():
        print(f"{label}, CPU time, first compiled step: {s['median']:.3f}x (n={s['n']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
