"""Dynamo alone: what tracing a layer of figure 10's MLP costs, and where it goes.

``python -m benchmarks.dynamo_trace --kind ours --recipe fp8 --layers 32`` compiles the
MLP's forward with a backend that returns the captured graph as it is (no AOTAutograd,
no Inductor), after a one-layer warm-up compile of the same contender at another shape
(imports and first-use costs), and reports per layer:

* the process CPU time of the trace (``time.process_time``: a loaded machine stretches
  it, so compare contenders interleaved, in fresh processes);
* with ``--attribute``, a count that does not depend on the load: the Python calls made
  while Dynamo traces (``sys.setprofile`` call events), each attributed to the
  innermost user function Dynamo was inlining then (its own calls, and with those of
  the functions it inlined), or to ``<frame>``: the model's own frame, module calls,
  and at its return the graph and its guards. docs/benchmarks.md, figure 10, reads its
  breakdown from this.

FP8 runs under ``te.autocast(recipe=Float8CurrentScaling())`` around the compiled call,
as ``models.train_step`` does.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import sys
import time
from collections.abc import Iterator
from typing import Any

# Figure 10's shapes (compile_depth.HIDDEN, ROWS), written here: importing compile_depth
# imports benchmarks.common and with it torch.utils.benchmark, whose setuptools import
# alone makes every Dynamo trace in the process ~2x slower (torch.nn.Linear's included).
HIDDEN = 128
ROWS = 64
FRAME = "<frame>"


def _where(code: Any) -> str:
    """A traced function's name and where it is defined (``module/file.py:line``)."""
    folder, _, name = code.co_filename.rpartition("/")
    return f"{code.co_name} ({folder.rpartition('/')[2]}/{name}:{code.co_firstlineno})"


@contextlib.contextmanager
def _attributed_calls(own: collections.Counter, total: collections.Counter) -> Iterator[None]:
    """Count the Python calls made inside the block into ``own[function]`` (the
    innermost function Dynamo was inlining) and ``total[function]`` (with the functions
    it inlined); Dynamo's inliner is patched for the block only."""
    from torch._dynamo.symbolic_convert import InliningInstructionTranslator as Inliner

    stack = [FRAME]
    count = [0]
    original = Inliner.inline_call_

    def inline_call_(tracer: Any) -> Any:
        where = _where(tracer.f_code)
        stack.append(where)
        before = count[0]
        try:
            return original(tracer)
        finally:
            stack.pop()
            total[where] += count[0] - before

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call" or event == "c_call":
            count[0] += 1
            own[stack[-1]] += 1

    Inliner.inline_call_ = inline_call_  # type: ignore[method-assign]
    sys.setprofile(profile)
    try:
        yield
    finally:
        sys.setprofile(None)
        Inliner.inline_call_ = original  # type: ignore[method-assign]
    total[FRAME] = count[0]


def measure(
    kind: str,
    recipe: str,
    layers: int,
    rows: int = ROWS,
    hidden: int = HIDDEN,
    attribute: bool = False,
    top: int = 25,
) -> dict[str, Any]:
    """One Dynamo trace of the ``layers``-layer MLP's forward in this process."""
    import torch

    from .models import make_input, make_model, recipe_context

    def as_captured(gm: Any, example_inputs: Any) -> Any:
        return gm.forward

    torch.set_num_threads(1)
    warm = torch.compile(make_model(kind, 16, layers=1), backend=as_captured, fullgraph=True)
    with recipe_context(recipe):
        warm(make_input(4, 16))
    torch._dynamo.reset()

    compiled = torch.compile(
        make_model(kind, hidden, layers=layers), backend=as_captured, fullgraph=True
    )
    x = make_input(rows, hidden)
    own: collections.Counter = collections.Counter()
    total: collections.Counter = collections.Counter()
    counting = _attributed_calls(own, total) if attribute else contextlib.nullcontext()
    start = time.process_time()
    with counting, recipe_context(recipe):
        compiled(x)
    seconds = time.process_time() - start
    out: dict[str, Any] = {"layers": layers, "cpu_ms_per_layer": 1000 * seconds / layers}
    if attribute:  # the profile hook slows the trace: its CPU time is not the trace's
        out["cpu_ms_per_layer"] = None
        out["calls_per_layer"] = round(total[FRAME] / layers)
        out["by_function"] = [
            {"function": f, "own": round(n / layers), "with_inlined": round(total[f] / layers)}
            for f, n in own.most_common(top)
        ]
    return out


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.dynamo_trace", description=__doc__)
    p.add_argument("--kind", choices=("torch", "ours"), default="ours")
    p.add_argument("--recipe", choices=("bf16", "fp8"), default="bf16")
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--rows", type=int, default=ROWS)
    p.add_argument("--hidden", type=int, default=HIDDEN)
    p.add_argument("--attribute", action="store_true", help="count and attribute the calls")
    p.add_argument("--top", type=int, default=25, help="functions listed with --attribute")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    out = measure(
        args.kind, args.recipe, args.layers, args.rows, args.hidden, args.attribute, args.top
    )
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
