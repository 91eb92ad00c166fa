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
    "block_method": (
        "`benchmarks/block.py` (`python -m benchmarks --only block`). The block of "
        "`demo/`: `LayerNormLinear` -> `Linear` -> residual -> `LayerNormMLP` (gelu) + "
        "residual, against the same block of `torch.nn` modules (`nn.LayerNorm` + "
        "`nn.Linear`; `nn.Linear`; `nn.LayerNorm` + `nn.Linear` + tanh-gelu + "
        "`nn.Linear`), bf16 parameters. Compile: time to the first compiled training "
        "step, cold, as figure 4 (per round every contender in turn, after one "
        "throwaway compile). Step: forward + backward (loss = mean of squares, no "
        "optimizer) of the last round's eager and compiled models, measured in turn "
        "within each round, as figure 5. FP8 is FP8 current scaling through `autocast`, "
        "compared against the `torch.nn` block in bf16."
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
    "gpu_method_v2": (
        "One process, one run of `python -m benchmarks --device cuda`. Training step "
        "(forward + backward, loss = mean of squares, gradients set to None first) of the "
        "8-layer MLP of square layers: `torch.nn.Linear` bf16 (`torch/...`) and our "
        "`Linear` in bf16 and under every recipe through `autocast` (`ours/...`), each "
        "eager, `torch.compile(fullgraph=True)` and `mode='reduce-overhead'` (CUDA "
        "graphs). A compiled mode that raises under `fullgraph=True` is measured again "
        "without it and marked in *how it ran*; one that fails that way too is listed as "
        "failed. GEMM floors: the 24 GEMMs of a step (8 layers x fprop TN, dgrad NN, "
        "wgrad NT) back to back on pre-made operands: `gemm/bf16` bf16 `torch.mm`; "
        "`gemm/fp8` `torch._scaled_mm` on the rowwise and transposed buffers (E4M3 x E4M3 "
        "forward, E5M2 x E4M3 backward) with bf16 out, as our `gemm` issues it; "
        "`gemm/fp8-fp32-out` the same with fp32 out, as it issued before. Recipes "
        "without a Hopper GEMM (MXFP8, FP8 block, NVFP4) dequantize to bf16 and run "
        "bf16 GEMMs, so their floor is `gemm/bf16`."
    ),
    "gpu_quantization_method": (
        "One 4096x8192 bf16 tensor, both usages (rowwise data and the transposed "
        "columnwise copy): *fused* is `Float8CurrentScalingQuantizer` on CUDA (two Triton "
        "kernels: amax, then scale + cast + transpose; bit for bit the reference); "
        "*reference ops* is the format's plain-torch quantize (separate eager kernels), "
        "which every other format still runs on CUDA. *dequantize* is what a Hopper GEMM "
        "of a block format pays per operand before its bf16 GEMM. The bf16 copy reads "
        "and writes 2 bytes per element: the bandwidth yardstick."
    ),
    "gpu_memory_method": (
        "`torch.cuda.max_memory_allocated` over one eager training step after a "
        "warm-up step, gradients set to None before it; *allocated before* is parameters "
        "and input, *step peak over that* is what the step itself adds (activations "
        "saved for backward, quantized copies, gradients, workspaces)."
    ),
    "gpu_analysis": """\
**FP8 current scaling (large shape).** The fused Triton quantize (amax pass, then
scale + cast + transpose in one pass; bit for bit the reference) takes the step from
46.5 ms (issue 12) to ~15.6 ms, now in all three modes: on torch 2.11 quantizers cross
as strings (`runtime/codec.py`), so FP8 compiles fully (`fullgraph=True`) and runs
under CUDA graphs. That is 1.43-1.46x its `_scaled_mm` floor and 1.26-1.30x faster
than our bf16 step: both targets (<= 1.25x, >= 1.4x) are missed. What is left is the
quantize itself: per layer the input, the 8192x8192 weight and the output gradient are
quantized, 128 M elements, ~0.45 ms per layer at ~120 us per 4096x8192 tensor, ~3.5 ms
a step. The amax pass runs near copy speed; the cast + transpose pass is ~2.5x slower
than a copy of its bytes: the transposed uint8 stores through `tl.trans` are the bound.
Levers: a transpose written with wider packed stores, and caching the quantized weight
across steps where the weight does not change (TE's `is_first_microbatch`, which runs
eagerly under compile today). GEMMs write bf16 from `_scaled_mm`'s epilogue; all
three Linear GEMMs read the rowwise or transposed buffers directly.

**Block formats on Hopper.** Hopper has no MXFP8 or NVFP4 GEMM (and `_scaled_mm`
takes no block scales there), so each operand is dequantized to bf16 (exact for MXFP8
and power-of-two FP8 block scales) and multiplied by one bf16 GEMM: the floor is the
bf16 GEMM floor plus the dequantize traffic (~0.3 ms per 4096x8192 operand, ~1 ms for
NVFP4), so on this GPU these formats can only save memory, never time. Their
quantizers are still the reference torch ops (2-3 ms per 4096x8192 tensor in the
quantization table), so their steps run at several times the bf16 floor (earlier run:
MXFP8 ~100 ms, FP8 block ~96 ms, NVFP4 ~276 ms at 4096x8192; this run timed bf16 and
FP8 current scaling only per shape, to fit the device budget).

**Small shape.** Bound by Python per call, not by the GPU: our eager step is ~2.6-2.9x
`torch.nn.Linear`'s and compiled ~2.3-3.0x (both targets missed). The op path's fixed
cost was halved on the CPU (figure 8), but each layer still runs the plan functions,
quantizer and GEMM dispatch in Python, and the compiled graph still calls a Python
kernel per layer and direction. CUDA graphs remove all of it: `reduce-overhead` is
0.98-1.08x `torch.nn.Linear`'s.

**Memory.** Peak over resident for one 4096x8192 eager step: bf16 1.10x
`torch.nn.Linear`'s; quantized recipes add more (FP8 1.45x, NVFP4 2.3x of
`torch.nn.Linear`'s) even though the saved activations shrink (figure 7): the peak is
set by transient quantized copies, bf16 weight casts and the dequantized operands of
block-format GEMMs, not by what is kept for backward.
""",
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

The H200 figures have their own analysis at the end of figure 6.
""",
    "block_analysis": """\
**Compile.** Our block reaches its first compiled step in ~0.4x the `torch.nn` block's
time (bf16 ~0.40x, FP8 current scaling ~0.48x; per-round ratios spread 0.31-0.55 on
this shared machine): our three modules are three opaque ops, so Inductor generates
code only for the residual adds and the loss, where the `torch.nn` block has Inductor
generate and fuse its two LayerNorms, the tanh-gelu and six GEMM + bias epilogues,
forward and backward. One graph, no recompiles, no breaks for all three.

**CPU step.** Ours is ~2.7x (eager) / ~2.8x (compiled) the `torch.nn` block, and
compiling does not help (~0.9x, as in figure 5: the ops are opaque, Inductor only
saves the residuals' and the loss's dispatch). By `torch.profiler` over 10 eager bf16
steps (one session, not a regenerated figure) ours spends, per step, ~1.1 ms in
fp32 `aten::mm` (12 GEMMs; our `gemm` computes bf16 operands in fp32), ~0.65 ms in
~110 dtype copies, ~0.5 ms in the norm and gelu formulas as separate eager kernels
(`mul`, `add_`...), and ~1.6 ms of Python in the four autograd Functions' forward and
backward (bundle plans, checks, flatten). FP8 current scaling costs ~3.7x our bf16
(~10x the `torch.nn` block): each of the 4 GEMMs quantizes its input, weight and
output gradient as separate amax / scale / cast kernels and dequantizes for the CPU
GEMM. The H200 is where these recipes are meant to pay (figure 6); this CPU figure
shows the fixed costs that figure 8 itemizes per `Linear` call, here for the whole
family.""",
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
        "would hide the overhead), timed as CPU time of the process on one torch thread "
        "(`time.process_time`: on this shared VM wall time mostly measures the wait for a "
        "core); CUDA: bfloat16, wall time. *before* is the same module run on `main` "
        "without this work (commit 1929646), in the same session."
    ),
    "overhead_gpu_pending": (
        "H200: not measured here; `python -m benchmarks --device cuda` records this figure "
        "(key `overhead` of `benchmarks_h200.json`), and the targets table then checks "
        "issue 12's goals (compiled <= 1.2x, eager <= 1.3x, reduce-overhead <= 1x "
        "`torch.nn.Linear`)."
    ),
    "overhead_analysis": """**Per-call overhead of the op path (CPU, 64x256 fp32, process CPU time on one thread;
before = current main without this work, measured in the same session).** Issue 12's
goals are H200 goals; the CPU is the proxy: our step minus torch.nn.Linear's, per layer.

*What was removed.* The ops were `torch.library.custom_op`s. A call from a compiled
graph (grad off) went through torch's Python autograd kernel, which re-entered the
dispatcher (every one of the ~36 slots converted Python -> C++ -> Python a second time:
about 1 us a slot here, ScalarType, value types and descriptions ~2-2.5 us), then a
backend wrapper checking output aliasing and a dynamo-disable wrapper. With autograd,
every call ran the op's spec (the fake) again in `setup_context` to split the flat
result, unflattened the inputs twice, flattened and checked the backward bundle, and
went through torch's tensor-list autograd adapter (a pytree walk per call). The ops
are now defined on a `Library` with our own Autograd kernel: no gradient to record and
the backend next -> the kernel is called straight (one conversion); with gradients and
real tensors the op's autograd node runs the impls directly and keeps the backward
bundle, the backward runs `backward_impl` on it (no spec, no flatten); traced (fake
tensors), it re-dispatches and splits the result by the layout the kernel recorded.
Measured: the no-grad op call over its kernel ~99 -> ~59 us; the op with autograd
(forward + backward) over the impls ~1140 -> ~365 us; the compiled MLP step ~2.2x ->
~2.0x torch.nn.Linear compiled (~494 -> ~376 us a layer over it); the eager step
~1.8x, unchanged (the module's eager path never used the op).

*What remains, per layer, and whose it is.* (1) The impls themselves: the kernel
alone (`linear_forward` + `linear_backward`, no autograd) costs ~45 us more than
torch.nn.Linear without grad and ~100 us more fwd+bwd (`gemm`'s operand checks,
dtype casts and a separate bias add instead of one `addmm`, the bias gradient's
fp32 round trip; `ops/linear.py` and `quantization/gemm.py`). Run as an autograd node
(a minimal `autograd.Function` around the same impls, no generated code) they cost
another ~110 us over the same impls run directly: this is not the calling side (the
generated eager path adds ~13 us over that minimal Function). (2) The remaining op
fixed cost, ~59 us without grad: ~36 slot conversions once (~35 us), unflatten (~7),
result packing and sentinels (~5), our autograd kernel (~3). Fewer, cheaper slots (the
schema is the generator's: scalar flags packed into one int, value types and
descriptions as plain strings, which the str-coded quantizers already start) would
cut the largest part. (3) Inductor's graph calls the op with value-type arguments
built anew on every call (`GemmConfig(...)`, `QuantizedMeta(...)` in its Python
wrapper) and asserts every output's size and stride. Until (1) and (2) shrink, the
H200 goals (compiled <= 1.2x, eager <= 1.3x) are not reachable on this proxy: the CPU
step ratios here are 2.0x compiled and 1.85x eager.""",
}
