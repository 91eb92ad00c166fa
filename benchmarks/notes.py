"""The prose of docs/benchmarks.md: how each figure is measured, and where time goes.

Kept apart from the table code so the analysis can be revised without touching it.
The numbers quoted here come from profiling sessions (cProfile, ``-X importtime``,
``timeit`` of single helpers) on the 2-core CPU machine; the tables above them are
regenerated on every run.
"""

NOTES = {
    "method": (
        "Every figure is a median over repeated rounds, printed with its interquartile "
        "range (IQR), its range and the number of rounds. Within a round every contender "
        "is measured once, in turn (interleaved), and a comparison is the median of the "
        "per-round ratios, so slow drifts of the machine cancel. In-process timings use "
        "`torch.utils.benchmark.Timer.blocked_autorange` (figures 1, 5, 6); subprocess "
        "wall times (figures 2, 3) and the one-shot time to the first compiled step "
        "(figure 4) are `time.perf_counter` around one event. The CPU machine is a "
        "2-core VM shared with other work (see the load average in the header): absolute "
        "microseconds move by up to 2x between runs, the interleaved ratios much less."
    ),
    "boundary_method": (
        "Round trip = unflatten(flatten(bundle)) of realistic bundles: a quantized FP8 "
        "weight storage (and, backward, a quantized saved input), plain tensors, six FP8 "
        "current-scaling quantizers, three `GemmConfig` values, a real c10d process group "
        "(single-process gloo) crossing by registry name and resolved back, a literal, "
        "Nones. *generated*: `generated/linear.py`. *pytree*: `torch.utils._pytree` with "
        "`register_dataclass` (no checks, does not flatten the quantized storage, does not "
        "translate the process group: less work). *reflection*: "
        "`benchmarks/reflection_plan.py`, TE 2.20's design (annotations resolved once by "
        "`get_type_hints` into a plan; per call: loop over the plan, dispatch on each "
        "field's kind, dict of slots, `cls.__new__` + `setattr`), producing the same slots "
        "with the same checks through the same runtime helpers."
    ),
    "import_method": (
        "Fresh interpreters, one per sample, alternating the two paths; each times "
        "`import torch`, then the bundles module `transformer_engine_ops.ops.linear` "
        "(and the quantization package it imports), then the registration: "
        "`import transformer_engine_ops.generated.linear` or "
        "`import benchmarks.reflection_registration` (same ops, derived by reflection at "
        "import, namespace `teops_reflect`). The figure is everything after "
        "`import torch`. Children run with bytecode caching on (this machine's "
        "environment sets `PYTHONDONTWRITEBYTECODE=1`, which adds about 35 ms of source "
        "compilation to every import of this package); a warm-up round is dropped."
    ),
    "codegen_method": (
        "Wall time of fresh `python -m codegen` (up-to-date tree: parses every source "
        "with libcst, renders with Jinja2, formats with ruff, rewrites nothing) and "
        "`python -m codegen --check`, alternated with `python -c pass` (the interpreter "
        "start-up floor); bytecode caching on, warm-up round dropped."
    ),
    "compile_method": (
        "Time to the first compiled training step (forward + backward, "
        "`torch.compile(fullgraph=True)`, Inductor, cold: `torch._dynamo.reset()`, "
        "FX-graph and AOT-autograd caches disabled, after one throwaway compile that "
        "absorbs process-wide first-use costs). *graphs* counts dynamo's compiled frames "
        "(`counters['stats']['unique_graphs']`). Dynamic: batch sizes 32, 48, 64, 96, 128 "
        "with the batch dimension marked dynamic (`torch._dynamo.mark_dynamic`). "
        "FP8 is FP8 current scaling through `autocast`; `torch.nn.Linear` has no FP8, "
        "so both of our configurations are compared against its bf16 model."
    ),
    "step_method": (
        "Forward + backward (loss = mean of squares, no optimizer) of the 8-layer MLP, "
        "eager and compiled, measured in turn after warm-up. `torch.nn.Linear` bf16 is "
        "shown at the small shape only: this CPU has no fast bf16 GEMM (no AVX512-BF16 / "
        "AMX), so its bf16 GEMMs run ~10x slower than fp32 ones and a medium step takes "
        "tens of seconds; our `gemm` computes in fp32 (see the analysis)."
    ),
    "gpu_method": (
        "Training step (forward + backward) of the same 8-layer MLP of our `Linear` on "
        "the H200: eager, `torch.compile(fullgraph=True)`, and "
        "`torch.compile(mode='reduce-overhead')` (CUDA graphs), bf16 and FP8 current "
        "scaling, next to the floor: the 24 GEMMs of a step issued back to back "
        "(`bf16/gemm`: bf16 `torch.mm`; `fp8/gemm`: `torch._scaled_mm`, fp32 out; "
        "`bf16-as-fp32/gemm`: the same GEMMs in fp32, what our `gemm` issued for plain CUDA "
        "operands before its native 16-bit path)."
    ),
    "gpu_pending": (
        "Not measured yet. Run on the H200 (torch and this repository only; no libcst, "
        "jinja2 or matplotlib needed): `python -m benchmarks --device cuda --out DIR`, "
        "copy `DIR/benchmarks_h200.json` to `docs/`, then `python -m benchmarks "
        "--report-only` (or `make bench`) here merges it into this report and its plots."
    ),
    "analysis": """\
**Boundary (target >= 10x: missed; about 2-3x against pytree, 2x against reflection).**
Before this work the generated round trip was no faster than pytree (ratio 1.0-1.3x):
rebuilding the quantized weight storage through `__tensor_unflatten__` took ~14 us of
the ~25 us (`timeit`) forward round trip (its `__init__` re-validates names, re-derives
usage and form with two quantizer copies' checks, recomputes expected buffers). Two
runtime fixes (trusted `QuantizedStorage._from_flat` for buffers a flatten produced;
a storage caching its `QuantizedMeta` keyed by its quantizer object) and a cheaper
subclass test in `check`/`check_optional` (`issubclass(type(v), T)` in C before the
Python-level `OpaqueBase.__instancecheck__`) brought it to ~12 us. What remains, per
forward round trip (timeit, this machine): the dataclass `__init__` with 33 keyword
arguments ~2.2 us; 33 field checks, one Python call each, ~3 us; the 33 `slot()`
iterator calls of the unflatten ~1.5 us; the quantized storage ~0.8 us out + ~2.3 us
back; the process group name and its c10d lookup ~0.5 us. pytree spends ~25-50 us on
its generic tree walk while doing less. 10x needs the generated code itself to do less
per field, which is the generator's to change (codegen/templates, not edited here):
one fused fast-path guard per bundle (`if type(a.x) is bool and type(a.y) is bool and
...`) falling back to the per-field checks only to name the bad field, and an
unflatten through `object.__new__` + one `__dict__.update(zip(FIELDS, slots))` instead
of `__init__` with iterator calls.

**Import + registration (met).** Of the time after `import torch`, about two thirds is
the bundles module and the quantization package it imports (~21 dataclasses, whose
methods `dataclasses` builds with `exec` at import), one third registration (two
`torch.library.custom_op` definitions with fake kernels, autograd and the quantized
dispatch rules). Reflection at import costs little on top (the plan is cheap next to
`custom_op`), so the generated path's advantage here is small; its wins are the
boundary per call, reviewable schemas and no import-time failure modes.

**Codegen (met).** Most of the wall time is importing libcst, Jinja2 and running the
pinned ruff formatter on the rendered files; interpreter start-up is the `python -c
pass` row.

**Compile (bf16 met at ~1.25x; FP8 just over, ~1.56x).** Our first compiled step
traces, per layer, the custom op's fake kernel and `setup_context` (TensorSpec plan
computations and the backward bundle's flatten in Python) and, under FP8, AOT's
handling of six opaque quantizer constants per op; `torch.nn.Linear`'s includes
Inductor code generation for its GEMM + bias, which our opaque op avoids. The FP8
surplus over bf16 (~1 s) is the quantizer constants (guards, `__fx_repr__`, equality
checks during AOT) and the larger spec plans. One graph over 10 steps and over 5
dynamic batch sizes for all three models.

**CPU step time.** Our compiled step is slower than eager (~0.75x small, ~1x medium): the custom op is opaque
to Inductor, so each layer's GEMM, bias add and casts run inside the op's Python
kernel (`linear_forward`, ~25 us of Python per call by cProfile, mostly `gemm`'s shape
checks and dtype casts) and only the ReLUs and the loss are compiled; compiling saves
the module's per-call Python (bundle construction, checks) and adds the op dispatch.
Our bf16 is faster than `torch.nn.Linear` bf16 on this CPU only because `gemm` computes
in fp32, which this CPU does ~10x faster than bf16. FP8 current scaling costs ~4x bf16
on the CPU: per layer and direction it computes an amax, a scale, a saturated cast and,
for the CPU GEMM, a dequantize, all as separate eager kernels inside the op.

**H200 (measured on torch 2.11).** Small shape: CUDA graphs (`reduce-overhead`) make
the bf16 step ~3.5x faster than eager (target met): eager is bound by the Python of
the module and op kernels, and plain `torch.compile` is *slower* than eager there,
because the custom op's real kernel still runs its Python per layer inside the
compiled graph and the compiled wrapper adds dispatch on top. Large shape: the bf16
step is within ~4% of its bf16 GEMM floor in all three modes (target met). Before
`gemm` ran two plain CUDA bf16 operands as one native `addmm`, it upcast them to fp32
and the same step took ~13x the floor: that is what the `bf16-as-fp32/gemm` row
measures (fp32 GEMMs, TF32 off).
FP8 (eager only on torch 2.11: quantized recipes fall back to eager under compile,
`runtime/opaque.quantizer_compile_limitation`) is ~4x its `_scaled_mm` floor at the
large shape: per layer and direction the current-scaling quantize (amax, scale,
saturated cast, transpose copy) runs as separate eager kernels, a cost of the same
order as the GEMMs; fusing amax+cast (a Triton/Inductor kernel, or compiling the
quantize on torch >= 2.12) is the lever.
""",
    "overhead_method": (
        "`benchmarks/overhead.py` (`python -m benchmarks --only overhead`; on a GPU "
        "`overhead.run(device='cuda')`, which `--device cuda` adds to its JSON). One layer, "
        "every contender called in turn within each round: `torch` is `torch.nn.Linear`; "
        "`kernel` the op's impls called directly on a ready bundle (`linear_forward`, and "
        "with autograd `linear_forward` + `linear_setup_context` + `linear_backward`); "
        "`op` is `teops::linear_fwd` on ready slots (dispatcher, argument conversion, "
        "unflatten, result packing; with autograd the op's own autograd node, its "
        "backward on the kept bundle); `compiled call` is `linear_compiled` run eagerly "
        "(flatten + op + user outputs: what a compiled graph is traced from); `eager call` "
        "is `linear_eager` (field checks + the generated autograd.Function); `module` is "
        "our `Linear` (bundle construction + eager call). *over the kernel* is the "
        "per-round difference to `kernel`, the fixed cost of that path. The MLP step is "
        "8 layers with ReLU between them, forward + backward, eager and "
        "`torch.compile(fullgraph=True)` (CUDA: also `reduce-overhead`); *per layer over "
        "torch.nn.Linear* is (ours - torch) / 8. CPU: float32 for both (our `gemm` "
        "computes in fp32 on the CPU, and this CPU's bf16 GEMMs are ~10x slower, which "
        "would hide the overhead); CUDA: bfloat16. *before* is the same module run on the "
        "tree before this work (commit 5789685), in the same session."
    ),
    "overhead_gpu_pending": (
        "H200: not measured here; `python -m benchmarks --device cuda` records this figure "
        "(key `overhead` of `benchmarks_h200.json`), and the targets table then checks "
        "issue 12's goals (compiled <= 1.2x, eager <= 1.3x, reduce-overhead <= 1x "
        "`torch.nn.Linear`)."
    ),
    "overhead_analysis": """OVERHEAD_ANALYSIS""",
}
