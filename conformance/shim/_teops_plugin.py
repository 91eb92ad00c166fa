"""The pytest plugin of a conformance run (the generated conftest.py loads it).

It reads the run's settings (``TEOPS_CONFORMANCE_CONFIG``, a JSON file the runner
writes) and, in each test process:

* samples: keeps at most ``sample`` parametrizations of each test function, those whose
  node id has the smallest SHA-256 (the same in every process and every run);
* skips each test that reaches a TE internal (or, on the CPU, a CUDA-only ``torch.cuda``
  function), the reason naming it, from the runner's static analysis (``manifest``):
  the test function's own entries whose conditions hold for the test's parameters, and
  those of every fixture it requests;
* limits each phase of a test (setup, call, teardown) to ``timeout`` seconds (SIGALRM);
* records, with each report, what failed (exception type, message, the innermost frame
  in transformer_engine_ops and in the test files) and why a test skipped (the runner's
  skip, an availability skip, or the test's own).

The controlling process writes ``results.jsonl`` (one line per phase report) and
``session.json`` (torch version, device, the package's availability answers); every
process that collects writes ``collection-<worker>.json``.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
import tempfile
import traceback
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pytest

_AVAILABILITY = (
    "is_fp8_available",
    "is_mxfp8_available",
    "is_fp8_block_scaling_available",
    "is_nvfp4_available",
    "is_bf16_available",
)
PACKAGE = "transformer_engine_ops"


def sampling_key(nodeid: str) -> str:
    return hashlib.sha256(nodeid.encode()).hexdigest()


def sample(nodeids: Iterable[str], per_function: int) -> set[str]:
    """The node ids kept: at most ``per_function`` of each test function (node id
    without its ``[...]`` parameters), the smallest SHA-256 first."""
    groups: dict[str, list[str]] = defaultdict(list)
    for nodeid in nodeids:
        groups[nodeid.split("[", 1)[0]].append(nodeid)
    kept: set[str] = set()
    for members in groups.values():
        kept.update(sorted(members, key=sampling_key)[:per_function])
    return kept


def _load_config() -> dict[str, Any]:
    path = os.environ.get("TEOPS_CONFORMANCE_CONFIG")
    if not path:
        return {}
    return json.loads(Path(path).read_text())


CONFIG = _load_config()
if CONFIG:
    # The folder the runner prepared: tests/ (this file), results/, scratch/.
    _ROOT = Path(os.environ["TEOPS_CONFORMANCE_CONFIG"]).resolve().parent.parent
    CONFIG.update(
        tests=str(_ROOT / "tests"),
        results=str(_ROOT / "results"),
        scratch=str(_ROOT / "scratch"),
    )
    # Each process compiles into its own Inductor cache, never a stale one.
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(
        prefix="inductor-", dir=CONFIG["scratch"]
    )


def _worker(config: pytest.Config) -> str:
    workerinput = getattr(config, "workerinput", None)
    return workerinput["workerid"] if workerinput else "main"


def _is_controller(config: pytest.Config) -> bool:
    return not hasattr(config, "workerinput")


def _results_dir() -> Path:
    return Path(CONFIG["results"])


# -- collection ------------------------------------------------------------------
_COLLECTED = pytest.StashKey[list[str]]()


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    config.stash[_COLLECTED] = [item.nodeid for item in items]


@pytest.hookimpl(trylast=True, specname="pytest_collection_modifyitems")
def pytest_collection_modifyitems_last(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    """After ``-k``: sample, then mark the runner's skips, and record the collection."""
    if not CONFIG:
        return
    collected = config.stash.get(_COLLECTED, [item.nodeid for item in items])
    selected = [item.nodeid for item in items]
    kept = set(selected)
    if CONFIG.get("sample"):
        kept = sample(selected, int(CONFIG["sample"]))
        dropped = [item for item in items if item.nodeid not in kept]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = [item for item in items if item.nodeid in kept]
    marks: dict[str, dict[str, Any]] = {}
    for item in items:
        found = runner_skip(item)
        if found is not None:
            marks[item.nodeid] = found
            item.add_marker(pytest.mark.skip(reason=found["reason"]))
            item.user_properties.append(("teops_skip", json.dumps(found)))
    record = {
        "collected": collected,
        "selected": selected,
        "kept": sorted(kept),
        "runner_skips": marks,
    }
    out = _results_dir() / f"collection-{_worker(config)}.json"
    out.write_text(json.dumps(record))
    # Every test module is imported: from here on a placeholder fails where it is used.
    te = sys.modules.get("_teops_te")
    if te is not None:
        te.RUNNING = True


def _units(module: str) -> dict[str, list[dict[str, Any]]]:
    return CONFIG.get("manifest", {}).get(module, {}).get("units", {})


def _entries_of(func: Any) -> list[dict[str, Any]]:
    func = getattr(func, "__func__", func)
    module = getattr(func, "__module__", None)
    qualname = getattr(func, "__qualname__", None)
    if not module or not qualname:
        return []
    return _units(module).get(qualname, [])


def _holds(op: str, value: Any, literal: Any) -> bool:
    if op == "truthy":
        return bool(value)
    if op == "falsy":
        return not bool(value)
    if op == "eq":
        return bool(value == literal)
    if op == "ne":
        return bool(value != literal)
    if op == "is_none":
        return value is None
    if op == "not_none":
        return value is not None
    if op == "in":
        return value in literal
    if op == "not_in":
        return value not in literal
    raise ValueError(op)


def guards_hold(guards: Iterable[Sequence[Any]], values: dict[str, Any]) -> bool:
    """Whether an entry's conditions on test parameters hold for one parametrization
    (a condition on a parameter without a value here, or one that cannot be evaluated,
    is taken to hold: the skip errs towards skipping)."""
    for name, op, literal in guards:
        if name not in values:
            continue
        try:
            held = _holds(op, values[name], literal)
        except Exception:
            continue
        if not held:
            return False
    return True


def runner_skip(item: pytest.Item) -> dict[str, Any] | None:
    """The runner's skip for an item: the first TE internal (or, on the CPU, CUDA-only
    function) its test function reaches under this parametrization, or one of its
    fixtures reaches."""
    callspec = getattr(item, "callspec", None)
    values = dict(callspec.params) if callspec is not None else {}
    entries = [
        entry
        for entry in _entries_of(getattr(item, "function", None))
        if guards_hold(entry.get("guards", ()), values)
    ]
    fixtureinfo = getattr(item, "_fixtureinfo", None)
    if fixtureinfo is not None:
        for name in item.fixturenames:  # type: ignore[attr-defined]
            for fixturedef in fixtureinfo.name2fixturedefs.get(name, ()):
                # a fixture's conditions are on its own parameters: taken to hold
                entries.extend(_entries_of(fixturedef.func))
    device = CONFIG.get("device")
    for entry in entries:
        if entry["category"] == "cuda-only" and device != "cpu":
            continue
        what = "TE internal" if entry["category"] == "internal" else "needs CUDA:"
        via = f" via {' -> '.join(entry['via'])}" if entry["via"] else ""
        reason = f"{what} {entry['symbol']} ({entry['used']} at {entry['where']}{via})"
        return {**entry, "reason": reason}
    return None


# -- running ---------------------------------------------------------------------
class TestTimeout(Exception):  # noqa: N818 - the name a report shows
    """A test phase ran longer than the run's per-test timeout."""


def _alarm(signum: int, frame: Any) -> None:
    raise TestTimeout(f"test phase exceeded the conformance timeout of {CONFIG['timeout']} s")


def _timed(item: pytest.Item) -> Any:
    seconds = float(CONFIG.get("timeout") or 0)
    if seconds <= 0 or not hasattr(signal, "SIGALRM"):
        return (yield)
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        return (yield)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Any:
    return (yield from _timed(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Any:
    return (yield from _timed(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    return (yield from _timed(item))


def _frame_text(entry: traceback.FrameSummary, root: str) -> str:
    path = entry.filename
    if root and path.startswith(root):
        path = os.path.relpath(path, root)
    return f"{path}:{entry.lineno} in {entry.name}"


def describe_exception(exc: BaseException, tests_dir: str, package_dir: str) -> dict[str, Any]:
    """The type, message and innermost package and test frames of an exception."""
    kind = type(exc)
    name = kind.__qualname__
    if kind.__module__ not in ("builtins", "__main__"):
        name = f"{kind.__module__}.{name}"
    message = str(exc)
    frames = traceback.extract_tb(exc.__traceback__)
    in_package = [f for f in frames if package_dir and f.filename.startswith(package_dir)]
    in_tests = [f for f in frames if tests_dir and f.filename.startswith(tests_dir)]
    return {
        "type": name,
        "message": message[:2000],
        "package_frame": _frame_text(in_package[-1], os.path.dirname(package_dir))
        if in_package
        else None,
        "test_frame": _frame_text(in_tests[-1], tests_dir) if in_tests else None,
    }


def _package_dir() -> str:
    module = sys.modules.get(PACKAGE)
    file = getattr(module, "__file__", None)
    return os.path.dirname(os.path.abspath(file)) + os.sep if file else ""


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if not CONFIG:
        return report
    if report.failed and call.excinfo is not None:
        tests_dir = str(Path(CONFIG["tests"]).resolve()) + os.sep
        info = describe_exception(call.excinfo.value, tests_dir, _package_dir())
        report.user_properties.append(("teops_failure", json.dumps(info)))
    elif report.skipped and not any(k == "teops_skip" for k, _ in item.user_properties):
        where = None
        if isinstance(report.longrepr, tuple):
            path, line, reason = report.longrepr
            where = (os.path.basename(str(path)), int(line))
        else:
            reason = str(report.longrepr)
        kind = skip_category(where, reason)
        report.user_properties.append(("teops_skip", json.dumps({"category": kind})))
    return report


def skip_category(where: Sequence[Any] | None, reason: str) -> str:
    """``availability`` for a skip at one of the analysis's availability sites, or whose
    reason carries the reason of an availability query that answered False; else
    ``test`` (the test's own condition)."""
    if where is not None:
        module = os.path.splitext(str(where[0]))[0]
        lines = CONFIG.get("manifest", {}).get(module, {}).get("availability_lines", [])
        if int(where[1]) in lines:
            return "availability"
    for answer in _availability_answers().values():
        if answer.get("available") is False and answer.get("reason") and answer["reason"] in reason:
            return "availability"
    return "test"


_ANSWERS: dict[str, dict[str, Any]] = {}


def _availability_answers() -> dict[str, dict[str, Any]]:
    if not _ANSWERS:
        try:
            import transformer_engine_ops as te
        except Exception as exc:  # pragma: no cover - reported, not raised
            _ANSWERS["import"] = {"error": f"{type(exc).__name__}: {exc}"}
            return _ANSWERS
        for name in _AVAILABILITY:
            try:
                available, reason = getattr(te, name)(return_reason=True)
                _ANSWERS[name] = {"available": bool(available), "reason": str(reason)}
            except Exception as exc:
                _ANSWERS[name] = {"error": f"{type(exc).__name__}: {exc}"}
        try:
            _ANSWERS["get_device_compute_capability"] = {
                "value": list(te.get_device_compute_capability())
            }
        except Exception as exc:
            _ANSWERS["get_device_compute_capability"] = {"error": f"{type(exc).__name__}: {exc}"}
    return _ANSWERS


# -- recording (controlling process) ------------------------------------------------
def pytest_sessionstart(session: pytest.Session) -> None:
    if not CONFIG or not _is_controller(session.config):
        return
    import torch

    device = CONFIG["device"]
    if device == "cuda" and torch.cuda.is_available():
        device_name = torch.cuda.get_device_name()
    else:
        import platform

        device_name = _cpu_name() or platform.machine()
    info = {
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "device": device,
        "device_name": device_name,
        "availability": _availability_answers(),
    }
    (_results_dir() / "session.json").write_text(json.dumps(info))
    (_results_dir() / "results.jsonl").write_text("")


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def _append(record: dict[str, Any]) -> None:
    with (_results_dir() / "results.jsonl").open("a") as out:
        out.write(json.dumps(record) + "\n")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if not CONFIG or not _controller_process():
        return
    props = {k: json.loads(v) for k, v in report.user_properties if k.startswith("teops_")}
    record: dict[str, Any] = {
        "nodeid": report.nodeid,
        "when": report.when,
        "outcome": report.outcome,
        "duration": round(report.duration, 3),
        **props,
    }
    if hasattr(report, "wasxfail"):
        record["xfail"] = True
    if report.skipped and isinstance(report.longrepr, tuple):
        record["reason"] = str(report.longrepr[2]).removeprefix("Skipped: ")
    if report.failed and "teops_failure" not in props:
        record["longrepr"] = report.longreprtext[-3000:]
    _append(record)


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if not CONFIG or not _controller_process() or not report.failed:
        return
    _append({"collect_error": report.nodeid, "longrepr": report.longreprtext[-4000:]})


_CONTROLLER: list[bool] = []


def pytest_configure(config: pytest.Config) -> None:
    _CONTROLLER[:] = [_is_controller(config)]


def _controller_process() -> bool:
    return bool(_CONTROLLER and _CONTROLLER[0])
