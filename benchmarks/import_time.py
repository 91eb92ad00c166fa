"""Figure 2: import + registration time of the generated ops, minus ``import torch``.

Each sample is a fresh interpreter that times, with ``time.perf_counter``, ``import
torch``, then the bundles module (``transformer_engine_ops.ops.linear``: what any
registration path must import), then the registration path under test:

* ``generated``: ``import transformer_engine_ops.generated.linear`` (schemas, glue,
  both ops defined with fake kernels, autograd and quantized dispatch);
* ``reflection``: ``import benchmarks.reflection_registration`` (the same ops derived by
  reflection at import, in namespace ``teops_reflect``).

The figure is (total - import torch); the two paths alternate, one process each per
round, so machine noise hits both. Children run with bytecode caching on
(:func:`benchmarks.common.bytecode_env`); the first round fills the cache and is dropped.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from .common import bytecode_env, progress, ratio_stats, stats, timed_subprocess

ROOT = Path(__file__).resolve().parent.parent
MODULES = {
    "generated": "transformer_engine_ops.generated.linear",
    "reflection": "benchmarks.reflection_registration",
}
_CHILD = """
import json, sys, time
t0 = time.perf_counter()
import torch
t1 = time.perf_counter()
import transformer_engine_ops.ops.linear
t2 = time.perf_counter()
import importlib
mod = importlib.import_module(sys.argv[1])
t3 = time.perf_counter()
assert mod.linear_fwd is not None and mod.linear_bwd is not None
print(json.dumps({"torch": t1 - t0, "bundles": t2 - t1, "register": t3 - t2}))
"""


def sample(path: str) -> dict[str, float]:
    out = timed_subprocess([sys.executable, "-c", _CHILD, MODULES[path]], env=_env())
    return json.loads(out.strip().splitlines()[-1])


def _env() -> dict[str, str]:
    import os

    paths = [str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {"PYTHONPATH": os.pathsep.join(paths), **bytecode_env()}


def run(rounds: int = 7, warmup: bool = True) -> dict[str, Any]:
    progress(f"figure 2: import + registration, fresh subprocesses ({rounds} rounds)")
    samples: dict[str, list[dict[str, float]]] = {k: [] for k in MODULES}
    for i in range(rounds + int(warmup)):  # a warm-up round fills the caches; dropped
        for path in MODULES:
            s = sample(path)
            if i >= int(warmup):
                samples[path].append(s)
    over = {k: [(s["bundles"] + s["register"]) * 1e3 for s in v] for k, v in samples.items()}
    result: dict[str, Any] = {
        "import_torch_ms": stats([s["torch"] * 1e3 for v in samples.values() for s in v]),
        "over_torch_ms": {k: stats(v) for k, v in over.items()},
        "bundles_ms": {k: stats([s["bundles"] * 1e3 for s in v]) for k, v in samples.items()},
        "register_ms": {k: stats([s["register"] * 1e3 for s in v]) for k, v in samples.items()},
        "ratio_reflection_vs_generated": ratio_stats(over["reflection"], over["generated"]),
    }
    progress(
        f"  import torch {result['import_torch_ms']['median']:.0f} ms; over it: generated "
        f"{result['over_torch_ms']['generated']['median']:.1f} ms, reflection "
        f"{result['over_torch_ms']['reflection']['median']:.1f} ms"
    )
    return result
