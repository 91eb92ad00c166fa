"""The TP=2 bench (``benchmarks/tp_step.py``) runs end to end over gloo at its quick
sizes: every model x recipe x overlap measured, and the bytes it counts are exactly the
sequence-parallel collectives docs/distributed.md lists (its step times on a shared
CPU mean nothing and are not checked beyond being positive)."""

from __future__ import annotations

import pytest

from benchmarks import tp_step

# Per rank of two, each collective of a (seq * batch, hidden) bf16 activation moves half
# of it: 32 * 1 * 64 * 2 bytes / 2.
MOVED = 32 * 1 * 64 * 2 // 2
# NVFP4 moves, per usage gathered, half a byte an element and an E4M3 scale per 16
# elements: (1/2 + 1/16) / 2 of bf16's bytes.
FP4 = MOVED * 9 // 32
# An all-reduce of the amax and Inf flag (two fp32) moves twice 8 bytes / 2 per rank.
AMAX = 8
# LayerNormMLP with SP: all-gather the norm output (forward), reduce-scatter fc2's
# output, all-gather fc2's output gradient, reduce-scatter fc1's dgrad, re-gather the
# norm output for fc1's wgrad. bf16 moves bf16. FP8 current scaling as TE runs it
# quantizes the gathered tensors first (one amax all-reduce each for the norm output and
# fc2's output gradient) and moves one byte an element, re-gathering the kept local FP8
# shard for wgrad; with fp8_all_gather=False it gathers bf16 and keeps the gathered
# quantized input (no re-gather). NVFP4 (TE's default recipe) gathers the norm output
# as codes and scales (two all-gathers, for the forward and again for wgrad) with one
# amax all-reduce, and fc2's stochastically rounded output gradient in bf16. The
# TransformerLayer does the same around QKV/proj and fc1/fc2. Each entry: kind ->
# (calls, bytes).
EXPECTED = {
    "mlp/bf16": {"all_gather": (3, 3 * MOVED), "reduce_scatter": (2, 2 * MOVED)},
    "mlp/fp8_current": {
        "all_reduce": (2, 2 * AMAX),
        "all_gather": (3, 3 * MOVED // 2),
        "reduce_scatter": (2, 2 * MOVED),
    },
    "mlp/fp8_current_hp_gather": {"all_gather": (2, 2 * MOVED), "reduce_scatter": (2, 2 * MOVED)},
    "transformer/bf16": {"all_gather": (6, 6 * MOVED), "reduce_scatter": (4, 4 * MOVED)},
    "transformer/fp8_current": {
        "all_reduce": (4, 4 * AMAX),
        "all_gather": (6, 6 * MOVED // 2),
        "reduce_scatter": (4, 4 * MOVED),
    },
    "transformer/fp8_current_hp_gather": {
        "all_gather": (4, 4 * MOVED),
        "reduce_scatter": (4, 4 * MOVED),
    },
    "mlp/nvfp4": {
        "all_reduce": (1, AMAX),
        "all_gather": (5, 2 * FP4 + MOVED),
        "reduce_scatter": (2, 2 * MOVED),
    },
    "mlp/nvfp4_hp_gather": {"all_gather": (2, 2 * MOVED), "reduce_scatter": (2, 2 * MOVED)},
    "transformer/nvfp4": {
        "all_reduce": (2, 2 * AMAX),
        "all_gather": (10, 4 * FP4 + 2 * MOVED),
        "reduce_scatter": (4, 4 * MOVED),
    },
    "transformer/nvfp4_hp_gather": {
        "all_gather": (4, 4 * MOVED),
        "reduce_scatter": (4, 4 * MOVED),
    },
}


@pytest.mark.slow
@pytest.mark.distributed
def test_quick_gloo_run_counts_the_sequence_parallel_bytes() -> None:
    assert tp_step.QUICK["seq"] == 32 and tp_step.QUICK["hidden"] == 64
    data = tp_step.run("gloo", quick=True, steps=1)
    results = data["results"]
    assert sorted(results) == sorted(
        f"{m}/{r}/overlap-{o}"
        for m in tp_step.MODELS
        for r in tp_step.RECIPES
        for o in ("off", "on")
    )
    for config, expected in EXPECTED.items():
        calls = {kind: n for kind, (n, _) in expected.items()}
        moved = {kind: b for kind, (_, b) in expected.items()}
        for state in ("off", "on"):  # gloo: overlap falls back to the same collectives
            r = results[f"{config}/overlap-{state}"]
            assert r["calls"] == calls, (config, state, r["calls"])
            assert r["bytes"] == moved, (config, r["bytes"])
            assert r["step_s"] > 0 and r["comm_s"] > 0
        summary = data["summary"][config]
        assert summary["bytes_off"] == summary["bytes_on"] == sum(moved.values())
        assert summary["hidden_share"] is not None
    # FP8's gathers move half of bf16's bytes; its reduce-scatters stay bf16.
    assert data["summary"]["mlp/fp8_over_bf16_bytes"] == pytest.approx(
        (3.5 * MOVED + 16) / (5 * MOVED)
    )
    assert data["summary"]["mlp/nvfp4_over_bf16_bytes"] == pytest.approx(
        (2 * FP4 + 3 * MOVED + AMAX) / (5 * MOVED)
    )
    # The report's section (docs/benchmarks.md, from an H200 run's "tp" part) lists them.
    section = "\n".join(tp_step.report_lines(data))
    for config in EXPECTED:
        assert f"| {config} | " in section, section
    assert [row[0] for row in tp_step.report_targets(data)] == [
        f"TP=2 {m}/{r}: comm hidden by overlap" for m in tp_step.MODELS for r in tp_step.RECIPES
    ]
    assert sorted(EXPECTED) == sorted(f"{m}/{r}" for m in tp_step.MODELS for r in tp_step.RECIPES)
