"""A Llama-8B-sized ``te.TransformerLayer`` on one GPU, against the same block written
in plain PyTorch, all compiled (``fullgraph=True``, Inductor).

* Train step (forward + backward), hidden 4096, 32 heads in 8 KV groups, SwiGLU FFN
  14336, RMSNorm, RoPE, no biases, sequence 4096, batch 1, bf16 parameters and
  activations: ours in bf16, ours under FP8 current scaling, and the plain block
  (``torch.nn.Linear`` + ``F.scaled_dot_product_attention`` + ``torch.nn.RMSNorm``)
  with the same weights; the two bf16 blocks are first checked to compute the same
  output (bf16 tolerance), so the timing compares like with like.
* Decode: one new token per sequence against a KV cache (batch 8, 4096 cached
  positions), compiled with ``mode="reduce-overhead"`` (CUDA graphs): ours through
  ``te.InferenceParams``, the plain block through a static cache it updates with
  ``index_copy_``, filled with ours' cached keys and values; one eager step of each is
  first checked to give the same output (bf16 tolerance); tokens per second.

Standalone: ``python -m benchmarks.transformer_layer [--quick] [--only PART] [--out
FILE]`` (prints a table; ``--only PART`` runs one of ``train_step``,
``train_step_graphs`` (the train step also under ``mode="reduce-overhead"``), ``decode``;
``--out`` writes the numbers as JSON). ``python -m benchmarks --device cuda``
runs it as its ``transformer_layer`` part. ``--quick`` shrinks every size (a smoke run,
also on the CPU: its numbers mean nothing).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import transformer_engine_ops as te
from transformer_engine_ops.quantization import Float8CurrentScaling

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

LLAMA_8B = dict(hidden=4096, ffn=14336, heads=32, groups=8, seq=4096, batch=1)
QUICK = dict(hidden=256, ffn=512, heads=8, groups=2, seq=128, batch=1)
DECODE = dict(batch=8, cached=4096)
DECODE_QUICK = dict(batch=2, cached=64)


def _rope(t: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """RoPE on ``[b, s, h, d]`` with ``freqs`` ``[s, d]`` (or ``[b, s, d]``), fp32 math."""
    x = t.float()
    x1, x2 = x.chunk(2, dim=-1)
    angles = freqs.unsqueeze(-2)
    out = x * angles.cos() + torch.cat((-x2, x1), dim=-1) * angles.sin()
    return out.to(t.dtype)


class PlainBlock(nn.Module):
    """The same layer in plain PyTorch (bshd), weights in TE's layout."""

    def __init__(self, hidden: int, ffn: int, heads: int, groups: int, device: Any) -> None:
        super().__init__()
        kw = dict(bias=False, dtype=torch.bfloat16, device=device)
        self.heads, self.groups, self.head_dim = heads, groups, hidden // heads
        self.norm1 = nn.RMSNorm(hidden, eps=1e-5, dtype=torch.bfloat16, device=device)
        self.qkv = nn.Linear(hidden, hidden + 2 * groups * self.head_dim, **kw)
        self.proj = nn.Linear(hidden, hidden, **kw)
        self.norm2 = nn.RMSNorm(hidden, eps=1e-5, dtype=torch.bfloat16, device=device)
        self.fc1 = nn.Linear(hidden, 2 * ffn, **kw)
        self.fc2 = nn.Linear(ffn, hidden, **kw)

    def load_from(self, layer: te.TransformerLayer) -> None:
        sd = layer.state_dict()
        qkv = "self_attention.layernorm_qkv."
        with torch.no_grad():
            self.norm1.weight.copy_(sd[f"{qkv}layer_norm_weight"])
            self.qkv.weight.copy_(
                torch.cat([sd[f"{qkv}{n}_weight"] for n in ("query", "key", "value")])
            )
            self.proj.weight.copy_(sd["self_attention.proj.weight"])
            self.norm2.weight.copy_(sd["layernorm_mlp.layer_norm_weight"])
            self.fc1.weight.copy_(sd["layernorm_mlp.fc1_weight"])
            self.fc2.weight.copy_(sd["layernorm_mlp.fc2_weight"])

    def _qkv(self, x: torch.Tensor, freqs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        b, s, _ = x.shape
        d, h, g = self.head_dim, self.heads, self.groups
        q, k, v = self.qkv(self.norm1(x)).split((h * d, g * d, g * d), dim=-1)
        q, k = _rope(q.view(b, s, h, d), freqs), _rope(k.view(b, s, g, d), freqs)
        return q, k, v.view(b, s, g, d)

    def _finish(self, x: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        h = x + self.proj(context.transpose(1, 2).flatten(2))
        gate, up = self.fc1(self.norm2(h)).chunk(2, dim=-1)
        return h + self.fc2(F.silu(gate) * up)

    def forward(self, x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
        q, k, v = self._qkv(x, freqs)
        context = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True, enable_gqa=True
        )
        return self._finish(x, context)

    def decode(
        self,
        x: torch.Tensor,
        freqs: torch.Tensor,
        position: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
    ) -> torch.Tensor:
        """One token per sequence at ``position`` (a 0-d tensor, the same for every
        sequence) against the static caches ``[b, max, g, d]``."""
        q, k, v = self._qkv(x, freqs.index_select(0, position.view(1)))
        k_cache.index_copy_(1, position.view(1), k)
        v_cache.index_copy_(1, position.view(1), v)
        visible = torch.arange(k_cache.shape[1], device=x.device) <= position
        context = F.scaled_dot_product_attention(
            q.transpose(1, 2),
            k_cache.transpose(1, 2),
            v_cache.transpose(1, 2),
            attn_mask=visible.view(1, 1, 1, -1),
            enable_gqa=True,
        )
        return self._finish(x, context)


def _ours(cfg: dict[str, int], device: Any) -> te.TransformerLayer:
    return te.TransformerLayer(
        cfg["hidden"],
        cfg["ffn"],
        cfg["heads"],
        num_gqa_groups=cfg["groups"],
        normalization="RMSNorm",
        activation="swiglu",
        bias=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        attn_input_format="bshd",
        params_dtype=torch.bfloat16,
        device=device,
    )


def _train(
    cfg: dict[str, int], device: Any, rounds: int, min_run_time: float, graphs: bool = False
) -> dict[str, Any]:
    """The train step of ours (bf16 and FP8 current scaling) and the plain block, compiled
    fullgraph; with ``graphs`` the plain block and ours FP8 also under
    ``mode="reduce-overhead"`` (CUDA graphs: no host time a step), beside the default."""
    torch.manual_seed(0)
    ours = _ours(cfg, device)
    plain = PlainBlock(cfg["hidden"], cfg["ffn"], cfg["heads"], cfg["groups"], device)
    plain.load_from(ours)
    head_dim = cfg["hidden"] // cfg["heads"]
    rope = te.RotaryPositionEmbedding(head_dim).to(device)
    freqs = rope(cfg["seq"])
    flat_freqs = freqs[:, 0, 0, :]
    x = torch.randn(cfg["batch"], cfg["seq"], cfg["hidden"], device=device, dtype=torch.bfloat16)
    x.requires_grad_(True)
    grad = torch.randn_like(x)
    ours_c = torch.compile(ours, fullgraph=True)
    plain_c = torch.compile(plain, fullgraph=True)
    with torch.no_grad():
        a, b = ours_c(x, rotary_pos_emb=freqs), plain_c(x, flat_freqs)
    difference = (a.float() - b.float()).abs().max().item()
    scale = b.float().abs().max().item()
    progress(
        f"transformer_layer: ours vs plain output max|diff| {difference:.3g} (scale {scale:.3g})"
    )
    if difference > 0.05 * scale:
        raise AssertionError(f"ours and the plain block disagree: {difference} vs scale {scale}")

    def step(fn: Any, *args: Any, recipe: Any = None) -> Any:
        def run() -> None:
            x.grad = None
            if recipe is None:
                out = fn(x, *args)
            else:
                with te.autocast(recipe=recipe):
                    out = fn(x, *args)
            out.backward(grad)

        return run

    contenders = {"plain_bf16": step(plain_c, flat_freqs)}
    if not graphs:
        contenders["ours_bf16"] = step(lambda t, f: ours_c(t, rotary_pos_emb=f), freqs)
    contenders["ours_fp8_current"] = step(
        lambda t, f: ours_c(t, rotary_pos_emb=f), freqs, recipe=Float8CurrentScaling()
    )
    if graphs:
        mode = "reduce-overhead"
        ours_g = torch.compile(ours, fullgraph=True, mode=mode)
        plain_g = torch.compile(plain, fullgraph=True, mode=mode)

        def in_graphs(run: Any) -> Any:
            def graphed() -> None:
                torch.compiler.cudagraph_mark_step_begin()
                run()

            return graphed

        contenders["plain_bf16_graphs"] = in_graphs(step(plain_g, flat_freqs))
        contenders["ours_fp8_current_graphs"] = in_graphs(
            step(lambda t, f: ours_g(t, rotary_pos_emb=f), freqs, recipe=Float8CurrentScaling())
        )
    for name, fn in contenders.items():  # compile and warm up
        progress(f"transformer_layer: warming up {name}")
        for _ in range(3):
            fn()
    times = interleaved(contenders, rounds, min_run_time, label="train step")
    profile = {}
    if torch.device(device).type == "cuda":  # launches, GPU busy time and host time a step
        for name, fn in contenders.items():
            host = host_seconds(fn)["median"]
            profile[name] = {**kernel_profile(fn), "host_ms_per_step": 1e3 * host}
    return {
        "config": cfg,
        "check_max_abs_diff": difference,
        "seconds": {name: stats(samples) for name, samples in times.items()},
        "profile": profile,
        "plain_over_ours_fp8": ratio_stats(times["plain_bf16"], times["ours_fp8_current"]),
        **(
            {
                "plain_graphs_over_ours_fp8_graphs": ratio_stats(
                    times["plain_bf16_graphs"], times["ours_fp8_current_graphs"]
                )
            }
            if graphs
            else {"ours_bf16_over_plain": ratio_stats(times["ours_bf16"], times["plain_bf16"])}
        ),
    }


def _decode(
    cfg: dict[str, int], dec: dict[str, int], device: Any, rounds: int, min_run_time: float
) -> dict[str, Any]:
    torch.manual_seed(0)
    batch, cached = dec["batch"], dec["cached"]
    head_dim = cfg["hidden"] // cfg["heads"]
    max_len = cached + 64
    ours = _ours(cfg, device).eval()
    plain = PlainBlock(cfg["hidden"], cfg["ffn"], cfg["heads"], cfg["groups"], device).eval()
    plain.load_from(ours)
    freqs = te.RotaryPositionEmbedding(head_dim).to(device)(max_len)
    flat_freqs = freqs[:, 0, 0, :]
    params = te.InferenceParams(
        batch, max_len, cfg["groups"], head_dim, torch.bfloat16, qkv_format="bshd", device=device
    )
    shape = (batch, max_len, cfg["groups"], head_dim)
    k_cache = torch.zeros(shape, dtype=torch.bfloat16, device=device)
    v_cache = torch.zeros_like(k_cache)
    torch._dynamo.mark_static_address(k_cache)
    torch._dynamo.mark_static_address(v_cache)
    position = torch.tensor(cached, device=device)
    token = torch.randn(batch, 1, cfg["hidden"], dtype=torch.bfloat16, device=device)
    step_dict = OrderedDict((i, 1) for i in range(batch))
    with torch.no_grad():
        # Fill the caches: the prompt through ours eagerly, its cached keys and values
        # (after RoPE, as the plain block caches them) copied into the plain block's.
        params.pre_step(OrderedDict((i, cached) for i in range(batch)))
        prompt = torch.randn(batch, cached, cfg["hidden"], dtype=torch.bfloat16, device=device)
        ours(prompt, rotary_pos_emb=freqs, inference_params=params)
        ours_k, ours_v = params.cache[ours.self_attention.layer_number]
        k_cache.copy_(ours_k[:batch])  # non-paged: batch entry i is page i
        v_cache.copy_(ours_v[:batch])
        # One eager decode step each from the same caches: the same token's output.
        params.pre_step(step_dict)
        a = ours(token, rotary_pos_emb=freqs, inference_params=params).float()
        b = plain.decode(token, flat_freqs, position, k_cache, v_cache).float()
    difference, scale = (a - b).abs().max().item(), b.abs().max().item()
    progress(
        f"transformer_layer: decode ours vs plain max|diff| {difference:.3g} (scale {scale:.3g})"
    )
    if difference > 0.05 * scale:
        raise AssertionError(f"ours' and the plain decode disagree: {difference} vs scale {scale}")
    ours_c = torch.compile(ours, fullgraph=True, mode="reduce-overhead")
    plain_c = torch.compile(plain.decode, fullgraph=True, mode="reduce-overhead")

    rewind = {"steps_left": 0}

    def ours_step() -> None:
        # TE's decode loop: pre_step (host bookkeeping, in ours' time), then the
        # compiled step. Both blocks attend over their whole static cache under a length
        # mask, so the time does not depend on the length; every max_len - cached steps
        # the sequences are restarted at `cached` tokens (host side) to stay in the cache.
        if rewind["steps_left"] == 0:
            params.reset()
            params.pre_step(OrderedDict((i, cached) for i in range(batch)))
            rewind["steps_left"] = max_len - cached
        params.pre_step(step_dict)
        rewind["steps_left"] -= 1
        with torch.no_grad():
            ours_c(token, rotary_pos_emb=freqs, inference_params=params)

    def plain_step() -> None:
        with torch.no_grad():
            plain_c(token, flat_freqs, position, k_cache, v_cache)

    contenders = {"plain_decode": plain_step, "ours_decode": ours_step}
    for name, fn in contenders.items():
        progress(f"transformer_layer: warming up {name}")
        for _ in range(4):
            fn()
    times = interleaved(contenders, rounds, min_run_time, label="decode step")
    return {
        "config": {**cfg, **dec},
        "seconds": {name: stats(samples) for name, samples in times.items()},
        "tokens_per_second": {
            name: stats([batch / s for s in samples]) for name, samples in times.items()
        },
        "ours_over_plain": ratio_stats(times["ours_decode"], times["plain_decode"]),
    }


PARTS = ("train_step", "train_step_graphs", "decode")


def run(
    quick: bool = False, device: str = "cuda", parts: tuple[str, ...] = PARTS
) -> dict[str, Any]:
    """The train-step and decode comparisons (``quick``: tiny sizes, one round), or
    those of ``parts``."""
    cfg = QUICK if quick else LLAMA_8B
    dec = DECODE_QUICK if quick else DECODE
    rounds, min_run_time = (1, 0.05) if quick else (5, 0.5)
    results: dict[str, Any] = {}
    for name, part in (
        ("train_step", lambda: _train(cfg, device, rounds, min_run_time)),
        ("train_step_graphs", lambda: _train(cfg, device, rounds, min_run_time, graphs=True)),
        ("decode", lambda: _decode(cfg, dec, device, rounds, min_run_time)),
    ):
        if name not in parts:
            continue
        try:
            results[name] = part()
        except Exception as exc:  # keep the other part's numbers
            results[name] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
            progress(f"transformer_layer {name}: failed: {results[name]['error']}")
    return results


DECODE_GOAL = 1.0  # ours' tokens/s over the plain block's, under CUDA graphs


def report_targets(part: dict[str, Any] | None) -> list[list[str]]:
    """The target rows: the train step under CUDA graphs (where measured) and decode."""
    return _graphs_target(part) + _decode_target(part)


def _decode_target(part: dict[str, Any] | None) -> list[list[str]]:
    """The decode target row: ours' tokens per second over the plain block's."""
    decode = (part or {}).get("decode", {})
    cfg = decode.get("config", {})
    label = (
        f"decode under CUDA graphs, batch {cfg.get('batch', '?')}, {cfg.get('cached', '?')} cached"
        + on_gpu(decode)
    )
    if "tokens_per_second" not in decode:
        return [
            [
                label,
                f">= {DECODE_GOAL}x plain",
                decode.get("error", "not measured")[:160],
                "**missed**",
            ]
        ]
    tps = decode["tokens_per_second"]
    x = tps["ours_decode"]["median"] / tps["plain_decode"]["median"]
    return [
        [
            label,
            f">= {DECODE_GOAL}x plain",
            f"{x:.2f}x",
            "met" if x >= DECODE_GOAL else "**missed**",
        ]
    ]


GRAPHS_GOAL = 1.5  # the plain block's step over ours FP8's, both under CUDA graphs


def _graphs_target(part: dict[str, Any] | None) -> list[list[str]]:
    graphs = (part or {}).get("train_step_graphs")
    if not graphs:
        return []
    label = 'layer train step, both mode="reduce-overhead": ours FP8 current vs plain bf16'
    label += on_gpu(graphs)
    if "plain_graphs_over_ours_fp8_graphs" not in graphs:
        return [[label, f">= {GRAPHS_GOAL}x", graphs.get("error", "?")[:160], "**missed**"]]
    x = graphs["plain_graphs_over_ours_fp8_graphs"]["median"]
    return [[label, f">= {GRAPHS_GOAL}x", f"{x:.2f}x", "met" if x >= GRAPHS_GOAL else "**missed**"]]


def _graphs_lines(part: dict[str, Any] | None) -> list[str]:
    graphs = (part or {}).get("train_step_graphs")
    if not graphs:
        return []
    out = ["### Llama-sized layer train step under CUDA graphs", ""]
    if "seconds" not in graphs:
        return out + [f"Not measured: {graphs.get('error', 'no results')}.", ""]
    out += measured_on(graphs)
    out += [
        "Forward + backward, each contender compiled fullgraph by default and with mode="
        '"reduce-overhead" (CUDA graphs: the host launches one graph a step), medians of '
        "interleaved rounds (benchmarks/transformer_layer.py, part train_step_graphs).",
        "",
        "| contender | step (median) | host time | kernels a step | GPU busy |",
        "|---|---|---|---|---|",
    ]
    for name, s in graphs["seconds"].items():
        p = graphs.get("profile", {}).get(name, {})
        host = f"{p['host_ms_per_step']:.2f} ms" if p else "-"
        kernels = f"{p['kernels_per_step']:.0f}" if p else "-"
        busy = f"{p['gpu_busy_ms_per_step']:.2f} ms" if p else "-"
        out.append(f"| {name} | {1e3 * s['median']:.2f} ms | {host} | {kernels} | {busy} |")
    return out + [""]


def report_lines(part: dict[str, Any] | None) -> list[str]:
    """The report's sections: the train step under CUDA graphs (where measured), and
    decode tokens per second, ours and the plain block."""
    return _graphs_lines(part) + _decode_lines(part)


def _decode_lines(part: dict[str, Any] | None) -> list[str]:
    out = ["### Llama-sized layer decode (CUDA graphs)", ""]
    decode = (part or {}).get("decode", {})
    if "tokens_per_second" not in decode:
        return out + [f"Not measured: {decode.get('error', 'no results')}.", ""]
    cfg = decode["config"]
    out += measured_on(decode)
    out += [
        f"One new token per sequence, batch {cfg['batch']}, {cfg['cached']} cached positions, "
        'compiled with mode="reduce-overhead" (benchmarks/transformer_layer.py).',
        "",
        "| contender | tokens/s (median) | step (median) |",
        "|---|---|---|",
    ]
    for name, t in decode["tokens_per_second"].items():
        step = decode["seconds"][name]["median"]
        out.append(f"| {name} | {t['median']:.0f} | {1e3 * step:.3f} ms |")
    return out + [""]


def _print(results: dict[str, Any]) -> None:
    for part in ("train_step", "train_step_graphs"):
        train = results.get(part, {})
        if "seconds" not in train:
            continue
        print(f"\n{part} (forward + backward), median ms:")
        for name, s in train["seconds"].items():
            print(f"  {name:<24} {1e3 * s['median']:9.2f}")
        for key in (
            "ours_bf16_over_plain",
            "plain_over_ours_fp8",
            "plain_graphs_over_ours_fp8_graphs",
        ):
            if key in train:
                print(f"  {key}: {train[key]['median']:.3f}x")
        for name, p in train.get("profile", {}).items():
            print(
                f"  {name:<24} {p['kernels_per_step']:6.0f} kernels, GPU busy "
                f"{p['gpu_busy_ms_per_step']:7.2f} ms, host {p['host_ms_per_step']:6.2f} ms; "
                + ", ".join(f"{k} {v:.2f}" for k, v in p["kernel_ms_by_group"].items())
            )
    decode = results.get("decode", {})
    if "tokens_per_second" in decode:
        print("\ndecode under CUDA graphs, tokens/s (median):")
        for name, s in decode["tokens_per_second"].items():
            print(f"  {name:<18} {s['median']:11.1f}")
    for name, part in results.items():
        if "error" in part:
            print(f"\n{name}: {part['error']}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.transformer_layer", description=__doc__)
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
    results = {
        "machine": machine_info(),
        "transformer_layer": run(args.quick, args.device, parts),
    }
    _print(results["transformer_layer"])
    if args.out is not None:
        args.out.write_text(json.dumps(results, indent=1, default=str) + "\n")
        progress(f"wrote {args.out}")
    failed = any("error" in part for part in results["transformer_layer"].values())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
