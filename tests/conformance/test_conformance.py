"""The conformance runner (conformance/) on a fake TE checkout of its own (fake_te/):
the rewrite of imports and device, the static skips naming their TE internal, the
sampling, the report's counts and groups, and the exit status. No TE repository is
needed."""

from __future__ import annotations

import hashlib
import json
import textwrap
from pathlib import Path

import pytest

from conformance import analysis, report, rewrite, runner, symbols
from conformance.__main__ import main
from conformance.shim import _teops_plugin

FAKE_TE = Path(__file__).resolve().parent / "fake_te"
FAKE_TESTS = FAKE_TE / "tests" / "pytorch"
OFFERED = {
    "transformer_engine_ops": frozenset({"Linear", "DType", "autocast", "is_fp8_available"}),
    "transformer_engine_ops.recipe": frozenset({"DelayedScaling", "Format"}),
}


def _rewrite(source: str) -> str:
    return rewrite.rewrite_source(textwrap.dedent(source), "t.py", OFFERED).source


# -- symbols -------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "kind", "target"),
    [
        ("transformer_engine.pytorch", "module", "transformer_engine_ops"),
        ("transformer_engine.pytorch.Linear", "public", "transformer_engine_ops.Linear"),
        (
            "transformer_engine.pytorch.tensor.float8_tensor.Float8Quantizer",
            "public",
            "transformer_engine_ops.Float8Quantizer",
        ),
        ("transformer_engine.common.recipe.Format", "module", "transformer_engine_ops.recipe"),
        ("transformer_engine_torch.DType.kFloat8E4M3", "mapped", "transformer_engine_ops.DType"),
        ("transformer_engine_torch.quantize", "internal", ""),
        (
            "transformer_engine.pytorch.quantization.FP8GlobalStateManager.reset",
            "support",
            "_teops_te.fp8_global_state_reset",
        ),
        ("transformer_engine.pytorch.quantization.FP8GlobalStateManager.get_x", "internal", ""),
        ("transformer_engine.pytorch.ops.Linear", "missing", ""),
        (
            "transformer_engine.pytorch.ops.basic.l2normalization.L2Normalization",
            "mapped",
            "transformer_engine_ops.modules.l2normalization.L2Normalization",
        ),
    ],
)
def test_resolve_takes_the_longest_entry(name: str, kind: str, target: str) -> None:
    res = symbols.resolve(name)
    assert (res.kind, res.target) == (kind, target)
    assert name.startswith(res.key)


def test_resolve_refuses_an_unlisted_deep_name() -> None:
    with pytest.raises(symbols.Unclassified):
        symbols.resolve("transformer_engine.pytorch.module.base.something_new")


# -- rewrite -------------------------------------------------------------------------
def test_rewrite_maps_imports_and_keeps_line_numbers() -> None:
    source = textwrap.dedent(
        """\
        import torch
        import transformer_engine.pytorch as te
        import transformer_engine_torch as tex
        from transformer_engine.pytorch import (
            Linear,
            Fp8Padding,
        )
        from transformer_engine.common import recipe
        from transformer_engine.pytorch.utils import init_method_normal

        x = tex.DType.kFloat8E4M3
        y = tex.quantize
        """
    )
    out = rewrite.rewrite_source(source, "t.py", OFFERED)
    lines = out.source.splitlines()
    assert len(lines) == len(source.splitlines())
    # transformer_engine_ops itself for `tex.DType` (rewritten below), `te` as TE binds it
    assert lines[1] == (
        "import _teops_te; import transformer_engine_ops; import transformer_engine_ops as te"
    )
    assert lines[2] == "tex = _teops_te.internal('transformer_engine_torch')"
    assert lines[3:5] == ["", ""]
    assert lines[6] == (
        "from transformer_engine_ops import Linear; "
        "Fp8Padding = _teops_te.missing('transformer_engine.pytorch.Fp8Padding')"
    )
    assert lines[7] == "from transformer_engine_ops import recipe"
    assert lines[8] == "from _teops_te import init_method_normal"
    assert lines[10] == "x = transformer_engine_ops.DType.kFloat8E4M3"
    assert lines[11] == "y = tex.quantize"
    assert out.rules["bind-internal"] == 1
    assert out.rules["bind-missing"] == 1
    assert out.rules["reference"] == 1


def test_rewrite_resolves_references_through_the_namespace() -> None:
    out = _rewrite(
        """\
        import transformer_engine
        from transformer_engine.pytorch.quantization import FP8GlobalStateManager

        r = transformer_engine.common.recipe.DelayedScaling()
        o = transformer_engine.pytorch.ops.Linear
        FP8GlobalStateManager.reset()
        FP8GlobalStateManager.copy_x()
        """
    )
    lines = out.splitlines()
    assert lines[0] == "import _teops_te; import transformer_engine_ops.recipe"
    assert lines[3] == "r = transformer_engine_ops.recipe.DelayedScaling()"
    assert lines[4] == "o = _teops_te.missing('transformer_engine.pytorch.ops').Linear"
    assert lines[5] == "_teops_te.fp8_global_state_reset()"
    assert lines[6] == "FP8GlobalStateManager.copy_x()"


def test_rewrite_respects_scopes() -> None:
    out = _rewrite(
        """\
        from transformer_engine.common import recipe

        def f(recipe):
            return recipe.nvfp4()
        """
    )
    assert "return recipe.nvfp4()" in out


def test_rewrite_makes_the_device_a_variable() -> None:
    out = _rewrite(
        """\
        import pytest
        import torch

        torch.cuda.manual_seed(1)

        @pytest.mark.parametrize("move", ["cuda", "cpu"])
        def f(move, device="cuda"):
            a = torch.randn(2, device="cuda").cuda()
            with torch.autocast(device_type="cuda"):
                b = a.to("cuda")
            torch.cuda.synchronize()
            kwargs = {"device": "cuda"}
            kwargs["device"] = "cuda"
            c = torch.device("cuda")
            return move == "cuda"
        """
    )
    assert '["cuda", "cpu"]' in out  # a parametrize value, compared later: kept
    assert "_teops_device.cuda.manual_seed(1)" in out
    assert "def f(move, device=_teops_device.DEVICE):" in out
    assert "torch.randn(2, device=_teops_device.DEVICE).to(_teops_device.DEVICE)" in out
    assert "torch.autocast(device_type=_teops_device.DEVICE)" in out
    assert "a.to(_teops_device.DEVICE)" in out
    assert "_teops_device.cuda.synchronize()" in out
    assert '{"device": _teops_device.DEVICE}' in out
    assert 'kwargs["device"] = _teops_device.DEVICE' in out
    assert "torch.device(_teops_device.DEVICE)" in out
    assert 'return move == "cuda"' in out
    assert out.splitlines()[0] == "import _teops_device; import pytest"


def test_rewrite_refuses_an_unclassified_name_with_its_position() -> None:
    with pytest.raises(rewrite.RewriteError) as excinfo:
        _rewrite(
            """\
            import torch
            from transformer_engine.pytorch.module.base import something_new
            """
        )
    assert "t.py:2:" in str(excinfo.value)
    assert "transformer_engine.pytorch.module.base.something_new" in str(excinfo.value)


# -- analysis ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def manifest() -> dict:
    sources = {p.stem: p.read_text() for p in FAKE_TESTS.glob("*.py")}
    return analysis.analyze(sources)


def _first(manifest: dict, unit: str) -> dict:
    return manifest["test_fake"]["units"][unit][0]


@pytest.mark.parametrize(
    ("unit", "symbol", "via"),
    [
        ("test_uses_the_extension", "transformer_engine_torch", []),
        (
            "fp8_enabled",
            "transformer_engine.pytorch.quantization.FP8GlobalStateManager",
            [],
        ),
        (
            "test_helper_reaches_internal",
            "transformer_engine.pytorch.module.base.get_dummy_wgrad",
            ["utils.reads_dummy_wgrad"],
        ),
        ("test_reads_internal_attribute", ".fp8_meta", []),
        (
            "test_subclasses_internal",
            "transformer_engine.pytorch.module.base.TransformerEngineBaseModule",
            ["ToyModule"],
        ),
        ("test_parametrized_by_internal", "transformer_engine_torch", []),
        ("test_cuda_memory_statistics", "torch.cuda.max_memory_allocated", []),
    ],
)
def test_analysis_names_the_internal_a_test_reaches(
    manifest: dict, unit: str, symbol: str, via: list
) -> None:
    entry = _first(manifest, unit)
    assert (entry["symbol"], entry["via"]) == (symbol, via)
    assert entry["where"].startswith(("test_fake.py:", "utils.py:"))


@pytest.mark.parametrize(
    "unit",
    [
        "test_linear_on_the_device",
        "test_recipe_through_the_namespace",
        "test_missing_public_name",
        "test_recipe_parameter_shadows_the_import",
        "reset_global_state",  # FP8GlobalStateManager.reset is mapped, not internal
    ],
)
def test_analysis_leaves_tests_without_internals(manifest: dict, unit: str) -> None:
    assert unit not in manifest["test_fake"]["units"]


def test_analysis_keeps_the_conditions_on_parameters(manifest: dict) -> None:
    entry = _first(manifest, "test_internal_under_a_condition")
    assert entry["guards"] == [["mode", "eq", "internal"], ["flag", "truthy", None]]


@pytest.mark.parametrize(
    ("condition", "guards"),
    [
        ("if p and q == 2:", [["p", "truthy", None], ["q", "eq", 2]]),
        ("if not p:", [["p", "falsy", None]]),
        (
            "if p is not None and q in ('a', 'b'):",
            [["p", "not_none", None], ["q", "in", ["a", "b"]]],
        ),
        ("if p or q:", []),  # neither alone: not known
        ("if p and helper():", [["p", "truthy", None]]),
        ("if other:", []),  # not a parameter
    ],
)
def test_analysis_reads_conditions(condition: str, guards: list) -> None:
    source = f"""\
import transformer_engine_torch as tex


def test_f(p, q):
    {condition}
        tex.quantize()
"""
    entry = analysis.analyze({"test_g": source})["test_g"]["units"]["test_f"][0]
    assert entry["guards"] == guards


def test_analysis_guards_the_else_branch_and_short_circuits() -> None:
    source = """\
import transformer_engine_torch as tex


def test_f(p, q):
    if p == 1:
        pass
    else:
        tex.a()
    x = q or tex.b()
"""
    entries = analysis.analyze({"test_g": source})["test_g"]["units"]["test_f"]
    assert [e["guards"] for e in entries] == [[["p", "ne", 1]], [["q", "falsy", None]]]


@pytest.mark.parametrize(
    ("values", "held"),
    [
        ({"mode": "internal", "flag": True}, True),
        ({"mode": "internal", "flag": False}, False),
        ({"mode": "plain", "flag": True}, False),
        ({"flag": True}, True),  # mode has no value here: taken to hold
    ],
)
def test_plugin_evaluates_conditions(values: dict, held: bool) -> None:
    guards = [["mode", "eq", "internal"], ["flag", "truthy", None]]
    assert _teops_plugin.guards_hold(guards, values) is held


def test_analysis_finds_availability_sites(manifest: dict) -> None:
    source = (FAKE_TESTS / "test_fake.py").read_text().splitlines()
    lines = manifest["test_fake"]["availability_lines"]
    assert [source[n - 1].strip() for n in lines] == [
        'pytest.skip("a skip under an availability condition")'
    ]


# -- sampling ------------------------------------------------------------------------
def test_sampling_is_a_hash_of_the_test_id() -> None:
    ids = [f"test_x.py::test_f[{i}]" for i in range(50)] + ["test_x.py::test_g"]
    kept = _teops_plugin.sample(ids, 7)
    assert kept == _teops_plugin.sample(list(reversed(ids)), 7)
    expected = sorted(ids[:50], key=lambda n: hashlib.sha256(n.encode()).hexdigest())[:7]
    assert kept == {*expected, "test_x.py::test_g"}
    assert _teops_plugin.sample(ids[:3], 7) == set(ids[:3])


# -- report --------------------------------------------------------------------------
def test_normalize_replaces_numbers_and_addresses() -> None:
    assert report.normalize("shape torch.Size([32, 64]) at 0x7f00ab\nmore") == (
        "shape torch.Size([N, N]) at 0x…"
    )
    assert report.normalize("fp8 e4m3 dtype") == "fp8 e4m3 dtype"


def _line(nodeid: str, when: str, outcome: str, **extra: object) -> dict:
    return {"nodeid": nodeid, "when": when, "outcome": outcome, "duration": 0.1, **extra}


def test_fold_counts_outcomes_and_groups_failures() -> None:
    def fail(message: str) -> dict:
        return {"type": "ValueError", "message": message, "package_frame": "m.py:3 in f"}

    collection = {
        "collected": ["a.py::t[1]", "a.py::t[2]", "a.py::u", "a.py::v", "a.py::w", "b.py::x"],
        "selected": ["a.py::t[1]", "a.py::t[2]", "a.py::u", "a.py::v", "a.py::w"],
        "kept": ["a.py::t[1]", "a.py::t[2]", "a.py::u", "a.py::v", "a.py::w"],
    }
    lines = [
        _line("a.py::t[1]", "call", "failed", teops_failure=fail("bad size 3")),
        _line("a.py::t[2]", "call", "failed", teops_failure=fail("bad size 4")),
        _line("a.py::u", "setup", "skipped", teops_skip={"category": "internal", "symbol": "tex"}),
        _line("a.py::v", "setup", "failed", teops_failure=fail("no fixture")),
        {"collect_error": "b.py", "longrepr": "E   RuntimeError: no CUDA 12"},
    ]
    folded = report.fold(collection, lines, ["a.py", "b.py"])
    a = folded["files"]["a.py"]
    assert (a["collected"], a["deselected"], a["sampled_out"], a["run"]) == (5, 0, 0, 5)
    assert (a["passed"], a["failed"], a["errors"], a["skipped"]["internal"]) == (0, 2, 1, 1)
    assert a["not_reported"] == 1  # kept, but the run stopped before it (--deadline)
    assert folded["files"]["b.py"]["collection_error"] == "RuntimeError: no CUDA N"
    first = folded["failure_groups"][0]
    assert (first["cause"], first["count"], first["files"]) == (
        "ValueError: bad size N",
        2,
        {"a.py": 2},
    )
    assert folded["skip_groups"]["internal"][0]["key"] == "tex"


# -- a run ----------------------------------------------------------------------------
@pytest.mark.slow
def test_a_run_on_the_fake_checkout(tmp_path: Path) -> None:
    out = tmp_path / "conformance.md"
    argv = [
        "--te-src",
        str(FAKE_TE),
        "--te-commit",
        "fixture",
        "--files",
        "test_fake.py",
        "--sample",
        "5",
        "--out",
        str(out),
        "--results",
        str(tmp_path / "results.json"),
    ]
    assert main(argv) == 1  # failures, and a skip for availability on the CPU
    run = json.loads(out.with_suffix(".json").read_text())["runs"]["cpu: test_fake"]
    row = run["files"]["test_fake.py"]
    assert (row["collected"], row["sampled_out"], row["run"]) == (62, 35, 27)
    assert (row["passed"], row["failed"], row["errors"]) == (14, 3, 0)
    assert row["skipped"] == {
        "internal": 7,
        "cuda-only": 1,
        "availability": 1,
        "test": 1,
        "xfail": 0,
    }
    causes = {g["cause"]: g["count"] for g in run["failure_groups"]}
    assert causes == {
        "AssertionError: assert N == N": 2,
        "TENameMissing: transformer_engine_ops does not offer TE's "
        "transformer_engine.pytorch.CudaRNGStatesTracker": 1,
    }
    internals = {g["key"]: g["count"] for g in run["skip_groups"]["internal"]}
    assert internals == {
        "transformer_engine_torch": 3,
        "transformer_engine.pytorch.quantization.FP8GlobalStateManager": 1,
        "transformer_engine.pytorch.module.base.get_dummy_wgrad": 1,
        "transformer_engine.pytorch.module.base.TransformerEngineBaseModule": 1,
        ".fp8_meta": 1,
    }
    outcomes = json.loads((tmp_path / "results.json").read_text())
    many = sorted(n for n in outcomes if n.startswith("test_fake.py::test_many["))
    all_many = [f"test_fake.py::test_many[{i}]" for i in range(40)]
    assert set(many) == _teops_plugin.sample(all_many, 5)
    conditional = {
        n: r["outcome"] for n, r in outcomes.items() if "test_internal_under_a_condition" in n
    }
    assert conditional == {
        "test_fake.py::test_internal_under_a_condition[True-plain]": "passed",
        "test_fake.py::test_internal_under_a_condition[False-plain]": "passed",
        "test_fake.py::test_internal_under_a_condition[True-internal]": "skipped",
        "test_fake.py::test_internal_under_a_condition[False-internal]": "passed",
    }
    skip = outcomes["test_fake.py::test_helper_reaches_internal"]["skip"]
    assert skip["reason"].startswith(
        "TE internal transformer_engine.pytorch.module.base.get_dummy_wgrad (get_dummy_wgrad at"
    )
    assert run["te"]["commit"] == "fixture" and run["te"]["version"] == "0.0.1.fixture"
    # This package's commit (None outside git), the report files themselves aside.
    assert run["commit"] == runner.package_commit((out, out.with_suffix(".json")))
    text = out.read_text()
    assert f"| cpu: test_fake | {run['date']} | {run['commit'] or 'not recorded'} | cpu (" in text
    assert "| test_fake.py | cpu: test_fake | 62 | 0 | 35 | 27 | 14 | 3 | 0 | 7 | 1 | 1 | 1 |" in (
        text
    )


def test_a_missing_file_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    argv = ["--te-src", str(FAKE_TE), "--files", "test_none.py", "--out", str(tmp_path / "r.md")]
    assert main(argv) == 2
    assert "no test_none.py" in capsys.readouterr().err


def test_the_report_shows_commands_without_paths() -> None:
    command = (
        "python -m conformance --te-src /home/me/te --files test_x.py --prepare-only /tmp/p "
        "--out docs/r.md && python -m conformance --run-prepared /tmp/p -k 'not big' --keep"
    )
    assert report.shown_command(command) == (
        "python -m conformance --te-src $TE_SRC --files test_x.py --prepare-only DIR "
        "&& python -m conformance --run-prepared DIR -k 'not big'"
    )


def test_exit_status_counts_availability_skips_on_the_cpu_only() -> None:
    row = {
        "failed": 0,
        "errors": 0,
        "not_reported": 0,
        "skipped": {"availability": 1},
    }
    assert report.exit_status({"device": "cpu", "files": {"a.py": row}}) == 1
    assert report.exit_status({"device": "cuda", "files": {"a.py": row}}) == 0


def test_prepare_writes_the_shim_and_the_manifest(tmp_path: Path) -> None:
    options = runner.Options(te_src=FAKE_TE, files=["test_fake.py"])
    prepared = runner.prepare(options, offered=OFFERED, root=tmp_path)
    names = sorted(p.name for p in prepared.tests.iterdir())
    assert names == [
        "_teops_device.py",
        "_teops_plugin.py",
        "_teops_run.json",
        "_teops_te.py",
        "conftest.py",
        "pytest.ini",
        "test_fake.py",
        "utils.py",
    ]
    config = json.loads((prepared.tests / "_teops_run.json").read_text())
    assert "test_uses_the_extension" in config["manifest"]["test_fake"]["units"]


@pytest.mark.slow
def test_prepare_on_one_machine_run_on_another(tmp_path: Path) -> None:
    """--prepare-only writes a folder that --run-prepared runs without TE's checkout
    (or libcst); --merge adds its runs to another runs JSON."""
    folder = tmp_path / "prepared"
    common = ["--files", "test_fake.py", "--sample", "2", "--te-commit", "fixture"]
    assert main(["--te-src", str(FAKE_TE), *common, "--prepare-only", str(folder)]) == 0
    config = json.loads((folder / "tests" / "_teops_run.json").read_text())
    assert config["sample"] == 2 and str(tmp_path) not in json.dumps(config)
    moved = tmp_path / "elsewhere"
    folder.rename(moved)
    first = tmp_path / "first.md"
    argv = [
        "--run-prepared",
        str(moved),
        "-k",
        "test_many",
        "--label",
        "split",
        "--out",
        str(first),
    ]
    assert main(argv) == 0
    run = json.loads(first.with_suffix(".json").read_text())["runs"]["split"]
    assert run["te"]["commit"] == "fixture" and run["sample"] == 2
    assert run["files"]["test_fake.py"]["passed"] == 2
    assert run["command"] == (
        "python -m conformance --te-src $TE_SRC --files test_fake.py --sample 2 --te-commit "
        "fixture --prepare-only DIR && python -m conformance --run-prepared DIR -k test_many "
        "--label split"
    )
    second = tmp_path / "second.md"
    assert main(["--merge", str(first.with_suffix(".json")), "--out", str(second)]) == 0
    assert list(json.loads(second.with_suffix(".json").read_text())["runs"]) == ["split"]
    assert "| test_fake.py | split |" in second.read_text()


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_the_run_builds_modules_on_its_device(
    device: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TE's tests build modules without a device (TE's "cuda"); the package resolves
    that through TEOPS_DEFAULT_DEVICE, which the run sets to its device whatever the
    caller's environment holds, so a CPU run on a CUDA machine stays on the CPU."""
    monkeypatch.setenv("TEOPS_DEFAULT_DEVICE", "meta")
    seen: dict[str, str] = {}

    class Finished:
        def __init__(self, cmd: list[str], env: dict[str, str], **kwargs: object) -> None:
            seen.update(env)
            self.stdout: list[str] = []

        def wait(self) -> int:
            return 0

    monkeypatch.setattr(runner.subprocess, "Popen", Finished)
    prepared = runner.Prepared(tmp_path, tmp_path, tmp_path, ["test_fake.py"], {}, {})
    options = runner.Options(te_src=FAKE_TE, files=["test_fake.py"], device=device)
    assert runner.run_pytest(options, prepared, echo=False) == 0
    assert seen["TEOPS_DEFAULT_DEVICE"] == device
    assert seen["TEOPS_CONFORMANCE_DEVICE"] == device


@pytest.mark.slow
def test_a_test_past_the_timeout_fails(tmp_path: Path) -> None:
    out = tmp_path / "r.md"
    argv = ["--te-src", str(FAKE_TE), "--files", "test_fake.py", "-k", "test_sleeps"]
    assert main([*argv, "--timeout", "1", "--te-commit", "fixture", "--out", str(out)]) == 1
    run = json.loads(out.with_suffix(".json").read_text())["runs"]["cpu: test_fake"]
    assert [g["cause"] for g in run["failure_groups"]] == [
        "TestTimeout: test phase exceeded the conformance timeout of N s"
    ]
