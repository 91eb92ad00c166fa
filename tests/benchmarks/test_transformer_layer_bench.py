"""The H200 transformer-layer bench compares like with like: its plain PyTorch block,
loaded from our layer's state dict, computes our layer's output (eagerly, bf16), and
its static-cache decode step computes the block's output at the decoded position."""

from __future__ import annotations

import torch

import transformer_engine_ops as te
from benchmarks import transformer_layer as bench

CFG = dict(hidden=64, ffn=128, heads=4, groups=2, seq=16, batch=2)


def _pair() -> tuple[te.TransformerLayer, bench.PlainBlock, torch.Tensor]:
    torch.manual_seed(0)
    ours = bench._ours(CFG, "cpu")
    plain = bench.PlainBlock(CFG["hidden"], CFG["ffn"], CFG["heads"], CFG["groups"], "cpu")
    plain.load_from(ours)
    freqs = te.RotaryPositionEmbedding(CFG["hidden"] // CFG["heads"])(CFG["seq"])
    return ours, plain, freqs


def test_plain_block_computes_our_layer() -> None:
    ours, plain, freqs = _pair()
    x = torch.randn(CFG["batch"], CFG["seq"], CFG["hidden"]).to(torch.bfloat16)
    with torch.no_grad():
        want = ours(x, rotary_pos_emb=freqs).float()
        got = plain(x, freqs[:, 0, 0, :]).float()
    assert (got - want).abs().max().item() <= 0.02 * want.abs().max().item()


def test_plain_decode_equals_its_full_forward_at_the_position() -> None:
    _, plain, freqs = _pair()
    flat = freqs[:, 0, 0, :]
    x = torch.randn(CFG["batch"], CFG["seq"], CFG["hidden"]).to(torch.bfloat16)
    d = CFG["hidden"] // CFG["heads"]
    k_cache = torch.zeros(CFG["batch"], CFG["seq"], CFG["groups"], d, dtype=torch.bfloat16)
    v_cache = torch.zeros_like(k_cache)
    with torch.no_grad():
        full = plain(x, flat)
        for pos in range(CFG["seq"]):
            step = plain.decode(x[:, pos : pos + 1], flat, torch.tensor(pos), k_cache, v_cache)
        assert (
            step[:, 0].float() - full[:, -1].float()
        ).abs().max().item() <= 0.02 * full.float().abs().max().item()


def test_the_torchao_part_is_recorded_as_skipped_with_its_reason(monkeypatch) -> None:
    """Without an importable torchao (an optional bench dependency) the GPU run's
    ``torchao`` part records why it did not run instead of failing the whole run."""
    import builtins

    from benchmarks import torchao_compare

    real_import = builtins.__import__

    def no_torchao(name, *args, **kwargs):
        if name == "torchao" or name.startswith("torchao."):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_torchao)
    result = torchao_compare.run_if_installed()
    assert list(result) == ["skipped"]
    assert "torchao is not importable" in result["skipped"]
    assert "ImportError" in result["skipped"]


def _seconds(ms: float) -> dict:
    return {"median": ms / 1e3, "q1": ms / 1e3, "q3": ms / 1e3}


def test_layer_goal_rows_read_speed_ups_from_the_medians() -> None:
    """Each goal row divides the slower contender's median step by the faster one's and
    is met exactly when that reaches the goal; the section lists every contender."""
    from benchmarks import torchao_compare

    ms = dict(
        plain_bf16=10.0,
        torchao_tensorwise=8.0,
        torchao_rowwise=10.0,
        ours_bf16=10.5,
        ours_fp8_current=6.0,
        ours_fp8_block=8.5,
    )
    part = {
        "config": {**CFG},
        "seconds": {k: _seconds(v) for k, v in ms.items()},
        "host_seconds": {k: _seconds(1.0) for k in ms},
        "profile": {
            k: {
                "kernels_per_step": 100,
                "gpu_busy_ms_per_step": v,
                "kernel_ms_by_group": {"gemm": v},
            }
            for k, v in ms.items()
        },
    }
    rows = {row[0]: row for row in torchao_compare.report_targets(part)}
    current = rows["layer train step: ours FP8 current scaling vs plain bf16"]
    assert current[2:] == ["1.67x", "met"]
    assert rows["layer train step: ours FP8 current scaling vs torchao tensorwise"][2:] == [
        "1.33x",
        "met",
    ]
    assert rows["layer train step: ours FP8 block scaling vs plain bf16"][3] == "**missed**"
    assert rows["layer train step: ours bf16 vs plain bf16"][2:] == ["0.95x", "**missed**"]
    section = "\n".join(torchao_compare.report_lines(part))
    assert all(f"| {name} |" in section for name in ms)
    missing = torchao_compare.report_targets({"skipped": "torchao is not importable"})
    assert missing[0][2:] == ["torchao is not importable", "**missed**"]


def test_decode_goal_row() -> None:
    decode = {
        "config": {**CFG, "batch": 8, "cached": 4096},
        "seconds": {"plain_decode": _seconds(0.25), "ours_decode": _seconds(0.5)},
        "tokens_per_second": {
            "plain_decode": {"median": 32000.0},
            "ours_decode": {"median": 16000.0},
        },
    }
    (row,) = bench.report_targets({"decode": decode})
    assert row[2:] == ["0.50x", "**missed**"]
    assert "| ours_decode | 16000 |" in "\n".join(bench.report_lines({"decode": decode}))


def test_cuda_graph_train_step_goal_row_and_section() -> None:
    graphs = {
        "seconds": {
            "plain_bf16_graphs": _seconds(10.0),
            "ours_fp8_current_graphs": _seconds(7.2),
        },
        "plain_graphs_over_ours_fp8_graphs": {"median": 1.39},
        "profile": {
            "ours_fp8_current_graphs": {
                "host_ms_per_step": 0.4,
                "kernels_per_step": 87,
                "gpu_busy_ms_per_step": 7.1,
            }
        },
    }
    graph_row, decode_row = bench.report_targets({"train_step_graphs": graphs})
    assert "reduce-overhead" in graph_row[0] and graph_row[2:] == ["1.39x", "**missed**"]
    assert decode_row[2:] == ["not measured", "**missed**"]
    graphs["plain_graphs_over_ours_fp8_graphs"] = {"median": 1.52}
    assert bench.report_targets({"train_step_graphs": graphs})[0][2:] == ["1.52x", "met"]
    text = "\n".join(bench.report_lines({"train_step_graphs": graphs}))
    assert "| ours_fp8_current_graphs | 7.20 ms | 0.40 ms | 87 | 7.10 ms |" in text
    assert "| plain_bf16_graphs | 10.00 ms | - | - | - |" in text
    # Without the part, no row and no section.
    assert len(bench.report_targets({})) == 1
    assert "under CUDA graphs" not in "\n".join(bench.report_lines({}))[:60]
