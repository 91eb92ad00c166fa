"""``python -m benchmarks``: run the figures, write the results JSON and the report.

* CPU (default): figures 1-5, 7 (memory), 8 (op overhead), 9 (block), 10 (compile
  time versus depth), 11 (compiled entry) and 12 (compile time of a
  ``te.TransformerLayer`` stack, whole and regional) ->
  ``<out>/benchmarks_cpu.json``, then ``report`` writes ``<out>/benchmarks.md`` and
  ``<out>/benchmarks/*.png``, merging
  ``<out>/benchmarks_h200.json`` when present (the CPU run never erases H200 numbers).
* ``--device cuda --out DIR``: figure 6 (and, with the ``op_overhead`` part, figure 8) ->
  ``DIR/benchmarks_h200.json`` (rewritten after each part, so a cut-short run keeps what
  it measured); needs only torch (with its Triton) and this repository. Copy that file
  into docs/ and run ``python -m benchmarks
  --report-only`` (or ``make bench``) to regenerate the report with it.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

from .common import GPU_DEFAULT_PARTS, GPU_PARTS, machine_info, progress

DOCS = Path(__file__).resolve().parent.parent / "docs"
FIGURES = (
    "boundary",
    "import",
    "codegen",
    "compile",
    "step",
    "memory",
    "overhead",
    "block",
    "compile_depth",
    "entry",
    "stack_compile",
)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--out", type=Path, default=DOCS, help="folder for JSON/report (docs/)")
    p.add_argument("--only", nargs="*", choices=FIGURES, help="CPU figures to run (default all)")
    p.add_argument("--quick", action="store_true", help="tiny sizes and few rounds (smoke)")
    p.add_argument("--report-only", action="store_true", help="rebuild the report from JSON")
    p.add_argument(
        "--gpu-shapes",
        nargs="*",
        choices=("small", "large"),
        default=["small", "large"],
        help="step shapes of the --device cuda run",
    )
    p.add_argument(
        "--gpu-parts",
        nargs="*",
        choices=GPU_PARTS,
        default=list(GPU_DEFAULT_PARTS),
        help="other parts of the --device cuda run (tp: the TP=2 step, needs 2 GPUs)",
    )
    p.add_argument(
        "--gpu-recipes",
        nargs="*",
        default=None,
        help="our recipes timed per step shape on --device cuda (default: every recipe)",
    )
    p.add_argument("--threads", type=int, default=2, help="torch intra-op threads on the CPU")
    p.add_argument(
        "--merge",
        nargs="+",
        type=Path,
        default=None,
        metavar="FILE",
        help="merge the results files of the standalone GPU benches (transformer_layer, moe, "
        "torchao_compare --out) into OUT/benchmarks_h200.json, then write the report",
    )
    return p.parse_args(argv)


# The GPU parts a standalone bench writes (``{"machine": ..., part: results}``), and
# whether its results hold sub-parts that are merged one by one.
_MERGED_PARTS = {"transformer_layer": True, "moe": True, "torchao": False}


def merge_gpu_results(path: Path, files: list[Path]) -> dict[str, Any]:
    """The GPU results file at ``path`` with each standalone bench's results of
    ``files`` in place of the same part (or sub-part), each carrying the machine, date
    and commit of the run that measured it (the rest of the file keeps its own)."""
    data = json.loads(path.read_text()) if path.exists() else {"gpu": {"version": 2}}
    for file in files:
        new = json.loads(file.read_text())
        found = [part for part in _MERGED_PARTS if part in new]
        if "machine" not in new or not found:
            raise SystemExit(
                f"error: {file}: not a standalone GPU bench's results (a 'machine' and one of "
                f"{', '.join(_MERGED_PARTS)})"
            )
        for part in found:
            if _MERGED_PARTS[part]:
                target = data["gpu"].setdefault(part, {})
                for sub, results in new[part].items():
                    target[sub] = {**results, "machine": new["machine"]}
            else:
                data["gpu"][part] = {**new[part], "machine": new["machine"]}
    return data


def merge_partial_cpu(
    old: dict[str, Any], new: dict[str, Any], figures: tuple[str, ...]
) -> dict[str, Any]:
    """The CPU results ``old`` with the ``figures`` a partial run measured (``new``)
    in place: the other figures keep the machine, date and commit of the run that
    measured them, and each new figure carries its own."""
    return {**old, **{key: {**new[key], "machine": new["machine"]} for key in figures}}


def _write(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, default=str) + "\n")
    progress(f"wrote {path}")


def run_cpu(only: tuple[str, ...], quick: bool) -> dict[str, Any]:
    from . import (
        block,
        boundary,
        codegen_time,
        compile_depth,
        compile_time,
        compiled_entry,
        import_time,
        memory,
        overhead,
        step_time,
        transformer_compile,
    )

    results: dict[str, Any] = {}
    if "boundary" in only:
        results["boundary"] = boundary.run(
            rounds=3 if quick else 7, min_run_time=0.05 if quick else 0.2
        )
    if "import" in only:
        results["import"] = import_time.run(rounds=1 if quick else 7)
    if "codegen" in only:
        results["codegen"] = codegen_time.run(rounds=1 if quick else 7)
    models = None
    if "compile" in only:
        results["compile"], models = compile_time.run(
            rounds=1 if quick else 3, steps=2 if quick else 10, dynamic=not quick
        )
    if "step" in only:
        results["step"] = step_time.run(
            shapes=("small",),
            rounds=2 if quick else 5,
            reuse=models,
            min_run_time={"small": 0.05 if quick else 0.3},
        )
        if not quick:  # about 1-3 s a step on 2 cores: fewer rounds
            results["step"].update(step_time.run(shapes=("medium",), rounds=3))
    if "memory" in only:
        results["memory"] = memory.run(quick=quick)
    if "overhead" in only:
        results["overhead"] = overhead.run(
            shape=(8, 32) if quick else (64, 256),
            rounds=1 if quick else 5,
            min_run_time=0.02 if quick else 0.2,
        )
    if "block" in only:
        results["block"] = block.run(
            rounds=1 if quick else 3,
            steps=1 if quick else 3,
            step_rounds=2 if quick else 5,
            min_run_time=0.05 if quick else 0.3,
        )
    if "compile_depth" in only:
        results["compile_depth"] = (
            compile_depth.run(depths=(1,), rounds=1, rows=8, hidden=16, fill_bytecode_cache=False)
            if quick
            else compile_depth.run()
        )
    if "entry" in only:
        results["entry"] = (
            compiled_entry.run(layers=(1,), rounds=3, calls=100) if quick else compiled_entry.run()
        )
    if "stack_compile" in only:
        results["stack_compile"] = (
            transformer_compile.run(rounds=1, layers=2) if quick else transformer_compile.run()
        )
    return results


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    logging.getLogger("torch._inductor.codecache").setLevel(logging.ERROR)
    started = time.time()
    if args.device == "cuda":
        if not torch.cuda.is_available():
            print("error: --device cuda but torch.cuda.is_available() is False", file=sys.stderr)
            return 2
        from . import gpu, overhead

        machine = machine_info()
        path = args.out / "benchmarks_h200.json"

        def save_partial(results: dict[str, Any]) -> None:
            _write(path, {"machine": machine, "gpu": results, "partial": True})

        data = {
            "machine": machine,
            "gpu": gpu.run(
                save=save_partial,
                shapes=tuple(args.gpu_shapes),
                parts=tuple(args.gpu_parts),
                recipes=None if args.gpu_recipes is None else tuple(args.gpu_recipes),
            ),
        }
        if "op_overhead" in args.gpu_parts:  # figure 7: the op path against nn.Linear
            _write(path, {**data, "partial": True})
            data["overhead"] = overhead.run(device="cuda", rounds=gpu.SMALL_ROUNDS)
        data["seconds"] = time.time() - started
        _write(path, data)
        return 0
    if args.merge:
        path = args.out / "benchmarks_h200.json"
        _write(path, merge_gpu_results(path, args.merge))
        args.report_only = True
    if not args.report_only:
        # The CPU figures: modules built without a device stay on the CPU of a CUDA
        # machine too, whatever the environment held (device=None is TE's CUDA default
        # where CUDA is available); the processes the figures start inherit it.
        os.environ["TEOPS_DEFAULT_DEVICE"] = "cpu"
        torch.set_num_threads(args.threads)
        only = tuple(args.only or FIGURES)
        data = {"machine": machine_info(), "quick": args.quick, **run_cpu(only, args.quick)}
        data["seconds"] = time.time() - started
        path = args.out / "benchmarks_cpu.json"
        if args.only and path.exists():
            data = merge_partial_cpu(json.loads(path.read_text()), data, only)
        _write(path, data)
    from . import report

    for written in report.write(args.out):
        progress(f"wrote {written}")
    progress(f"done in {time.time() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
