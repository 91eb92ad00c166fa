"""``python -m benchmarks --merge``: a standalone GPU bench's results join the GPU
results file part by part, each part keeping the machine, date and commit that
measured it."""

from __future__ import annotations

import json

import pytest

from benchmarks.__main__ import merge_gpu_results
from benchmarks.common import measured_on, on_gpu

H100 = {"date": "2026-12-07T17:02:38+00:00", "commit": "93e6c4846d", "torch": "2.11.0"}
H100 = {**H100, "gpu": "NVIDIA H100 80GB HBM3"}


def test_parts_and_sub_parts_replace_theirs_and_carry_their_machine(tmp_path) -> None:
    path = tmp_path / "benchmarks_h200.json"
    old = {"machine": {"gpu": "NVIDIA H200"}, "gpu": {"version": 2, "shapes": {"large": 1}}}
    old["gpu"]["transformer_layer"] = {"train_step": {"seconds": 1}, "decode": {"seconds": 2}}
    path.write_text(json.dumps(old))
    layer = tmp_path / "tl.json"
    layer.write_text(json.dumps({"machine": H100, "transformer_layer": {"decode": {"seconds": 3}}}))
    torchao = tmp_path / "torchao.json"
    torchao.write_text(json.dumps({"machine": H100, "torchao": {"seconds": {"a": 4}}}))

    merged = merge_gpu_results(path, [layer, torchao])

    assert merged["machine"] == {"gpu": "NVIDIA H200"}  # the file's own run
    assert merged["gpu"]["shapes"] == {"large": 1}
    part = merged["gpu"]["transformer_layer"]
    assert part["train_step"] == {"seconds": 1}  # not in the new file: kept
    assert part["decode"] == {"seconds": 3, "machine": H100}
    assert merged["gpu"]["torchao"] == {"seconds": {"a": 4}, "machine": H100}
    assert on_gpu(part["decode"]) == " (NVIDIA H100 80GB HBM3)" and on_gpu(part["train_step"]) == ""
    line = measured_on(part["decode"])[0]
    assert "2026-12-07T17:02:38" in line and "`93e6c4846d`" in line and "H100" in line
    assert measured_on(part["train_step"]) == []


def test_a_file_that_is_no_bench_result_is_refused_naming_it(tmp_path) -> None:
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"gpu": {}}))
    with pytest.raises(SystemExit, match="other.json: not a standalone GPU bench"):
        merge_gpu_results(tmp_path / "none.json", [other])
