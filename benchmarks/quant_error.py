"""The error of each recipe's GEMMs against float64, NVFP4's variants next to the FP8 formats.

``python -m benchmarks.quant_error`` (CPU, about a minute) quantizes a Linear layer's
operands with each recipe's quantizer for their role (input, weight, output gradient:
``recipe.make_quantizer``), runs its three GEMMs through ``quantization.gemm``
(fprop ``TN``, dgrad ``NN``, wgrad ``NT``: each reads the usage TE's GEMM reads, so
the wgrad sees the transformed columnwise data of the random Hadamard transform) and
reports ``|C - C64|_F / |C64|_F`` with ``C64`` the float64 product of the unquantized
operands. A bf16 row (operands rounded to bf16) gives the floor. Stochastic rounding
is unbiased rather than closer: the "wgrad, mean of 8" column averages 8 draws
(rng offsets 0..7), where its error shrinks and a round-to-nearest recipe's does not.

Two data sets: Gaussian operands, and "outliers" (8 input channels 32x larger, as in
LLM activations, one input element in 256 another 64x larger, and a log-normal
heavy-tailed output gradient), where the transform and 4over6 are meant to help. It rewrites the table between the markers in docs/quantization.md and
``docs/quantization_error.png`` (with ``--out``, elsewhere); ``--quick`` runs small.
"""

from __future__ import annotations

import argparse
import math
import re
from pathlib import Path
from typing import Any, Optional

import torch

from transformer_engine_ops.quantization import gemm
from transformer_engine_ops.quantization.stochastic import uses_stochastic_rounding
from transformer_engine_ops.recipe import (
    Float8BlockScaling,
    Float8CurrentScaling,
    Format,
    MXFP8BlockScaling,
    NVFP4BlockScaling,
)

DOCS = Path(__file__).resolve().parent.parent / "docs"
BEGIN = "<!-- quant-error:begin (python -m benchmarks.quant_error) -->"
END = "<!-- quant-error:end -->"
DRAWS = 8
_PLAIN_NVFP4 = dict(
    disable_rht=True, disable_stochastic_rounding=True, disable_2d_quantization=True
)


def recipes() -> list[tuple[str, Optional[Any]]]:
    """(label, recipe) in table order; None is the bf16 floor."""
    return [
        ("bf16 operands", None),
        ("FP8 current scaling, HYBRID (E4M3 fwd, E5M2 grads)", Float8CurrentScaling()),
        ("FP8 current scaling, E4M3", Float8CurrentScaling(fp8_format=Format.E4M3)),
        ("MXFP8 (1x32 blocks, E8M0 scales)", MXFP8BlockScaling(fp8_format=Format.E4M3)),
        ("FP8 block scaling (1x128, 128x128 weights)", Float8BlockScaling()),
        ("NVFP4, no technique (1x16 blocks everywhere)", NVFP4BlockScaling(**_PLAIN_NVFP4)),
        ("NVFP4 default: RHT, SR on grads, 2-D weights", NVFP4BlockScaling()),
        (
            "NVFP4, 2-D weights only",
            NVFP4BlockScaling(disable_rht=True, disable_stochastic_rounding=True),
        ),
        (
            "NVFP4, RHT only",
            NVFP4BlockScaling(disable_stochastic_rounding=True, disable_2d_quantization=True),
        ),
        (
            "NVFP4, SR on grads only",
            NVFP4BlockScaling(disable_rht=True, disable_2d_quantization=True),
        ),
        (
            "NVFP4, 4over6 (weights and activations, MAE, 256)",
            NVFP4BlockScaling(
                nvfp4_4over6="all",
                disable_rht=True,
                disable_stochastic_rounding=True,
                disable_2d_quantization=True,
            ),
        ),
        (
            "NVFP4, row-scaled activations",
            NVFP4BlockScaling(row_scaled_activation=True, **_PLAIN_NVFP4),
        ),
    ]


def operands(kind: str, tokens: int, features: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """float32 x (tokens, features), w (features, features), dy (tokens, features)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, features, generator=g)
    w = torch.randn(features, features, generator=g) * features**-0.5
    dy = torch.randn(tokens, features, generator=g) * 1e-3
    if kind == "outliers":
        channels = torch.randperm(features, generator=g)[:8]
        x[:, channels] *= 32.0
        spikes = torch.rand(tokens, features, generator=g) < 1 / 256
        x = torch.where(spikes, x * 64.0, x)  # single large elements, scattered
        dy = dy * torch.exp(torch.randn(tokens, features, generator=g))  # log-normal tails
    elif kind != "gaussian":
        raise ValueError(f"unknown data set {kind!r}")
    return {"x": x, "w": w, "dy": dy}


def _quantize(recipe: Any, role: str, t: torch.Tensor, offset: int) -> Any:
    if recipe is None:
        return t.to(torch.bfloat16).float()
    q = recipe.make_quantizer(role)
    if uses_stochastic_rounding(q):
        return q.quantize_stochastic(t, torch.tensor([2026, offset], dtype=torch.int64))
    return q.quantize(t)


def _rel(c: torch.Tensor, ref: torch.Tensor) -> float:
    return float(torch.linalg.norm(c.double() - ref) / torch.linalg.norm(ref))


def measure(recipe: Any, ops: dict[str, torch.Tensor]) -> dict[str, float]:
    """Relative Frobenius errors of fprop, dgrad, wgrad and the mean of ``DRAWS``
    wgrads (stochastic draws at offsets 0..DRAWS-1; a deterministic recipe repeats)."""
    x, w, dy = ops["x"], ops["w"], ops["dy"]
    x64, w64, dy64 = x.double(), w.double(), dy.double()
    qx, qw = _quantize(recipe, "input", x, 0), _quantize(recipe, "weight", w, 0)
    f32 = torch.float32
    wgrads = []
    for draw in range(DRAWS):
        qdy = _quantize(recipe, "grad_output", dy, draw)
        wgrads.append(gemm(qx, qdy, layout="NT", out_dtype=f32).double())
        if draw == 0:
            fprop = gemm(qw, qx, layout="TN", out_dtype=f32)
            dgrad = gemm(qw, qdy, layout="NN", out_dtype=f32)
    wgrad_ref = dy64.T @ x64
    return {
        "fprop": _rel(fprop, x64 @ w64.T),
        "dgrad": _rel(dgrad, dy64 @ w64),
        "wgrad": _rel(wgrads[0], wgrad_ref),
        f"wgrad, mean of {DRAWS}": _rel(torch.stack(wgrads).mean(0), wgrad_ref),
    }


def run(tokens: int, features: int) -> dict[str, dict[str, dict[str, float]]]:
    """{data set: {recipe label: {GEMM: relative error}}}."""
    results: dict[str, dict[str, dict[str, float]]] = {}
    for kind in ("gaussian", "outliers"):
        ops = operands(kind, tokens, features)
        results[kind] = {label: measure(r, ops) for label, r in recipes()}
    return results


def table(results: dict[str, dict[str, dict[str, float]]], tokens: int, features: int) -> str:
    kinds = list(results)
    columns = list(next(iter(results[kinds[0]].values())))
    header = ["recipe"] + [f"{c} ({k})" for k in kinds for c in columns]
    lines = [
        f"Relative error `|C - C64|_F / |C64|_F` of a Linear layer's GEMMs, "
        f"{tokens} tokens x {features} features (square weight), against the float64 "
        "product of the unquantized operands:",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    for label in results[kinds[0]]:
        cells = [f"{results[k][label][c]:.2e}" for k in kinds for c in columns]
        lines.append("| " + " | ".join([label, *cells]) + " |")
    return "\n".join(lines)


def write_doc(doc: Path, text: str) -> None:
    """Replace what lies between the markers of ``doc`` with ``text``."""
    body = doc.read_text()
    pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
    if not pattern.search(body):
        raise SystemExit(f"{doc}: no '{BEGIN}' ... '{END}' markers to write the table between")
    doc.write_text(pattern.sub(lambda _: f"{BEGIN}\n{text}\n{END}", body))


def plot(results: dict[str, dict[str, dict[str, float]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = list(results)
    labels = list(results[kinds[0]])
    columns = list(results[kinds[0]][labels[0]])
    fig, axes = plt.subplots(1, len(kinds), figsize=(15, 6.5), sharey=True)
    width = 0.8 / len(columns)
    for ax, kind in zip(axes, kinds, strict=True):
        for i, column in enumerate(columns):
            values = [results[kind][label][column] for label in labels]
            ax.barh(
                [y + (i - (len(columns) - 1) / 2) * width for y in range(len(labels))],
                values,
                height=width,
                label=column,
            )
        ax.set_xscale("log")
        ax.set_title(f"{kind} operands")
        ax.set_xlabel("relative error against float64 (log)")
        ax.grid(axis="x", which="both", alpha=0.3)
    axes[0].set_yticks(range(len(labels)), labels)
    axes[0].invert_yaxis()
    handles, names = axes[0].get_legend_handles_labels()
    fig.legend(handles, names, loc="lower center", ncol=len(columns))
    fig.suptitle("GEMM error of each recipe against the float64 product (docs/quantization.md)")
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: Optional[list[str]] = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.quant_error", description=__doc__)
    p.add_argument("--out", type=Path, default=DOCS, help="folder of quantization.md and the png")
    p.add_argument("--quick", action="store_true", help="small operands (a smoke run)")
    args = p.parse_args(argv)
    tokens, features = (64, 64) if args.quick else (2048, 1024)
    torch.set_num_threads(max(1, min(4, torch.get_num_threads())))
    results = run(tokens, features)
    text = table(results, tokens, features)
    print(text)
    if not math.isfinite(sum(v for r in results.values() for m in r.values() for v in m.values())):
        raise SystemExit("a non-finite error: not written")
    write_doc(args.out / "quantization.md", text)
    plot(results, args.out / "quantization_error.png")


if __name__ == "__main__":
    main()
