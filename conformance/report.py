"""Fold a run's results into counts and groups, keep runs in a JSON file, and render
the Markdown report from it.

A test's outcome comes from its phase reports: *failed* when its call failed, *error*
when its setup or teardown failed, else *skipped* when a phase skipped (by category:
``internal``, ``cuda-only``, ``availability``, ``test``, ``xfail``), else *passed*.

Failures are grouped by cause: the exception's type and the first line of its message,
with hexadecimal addresses and numbers replaced (``torch.Size([32, 64])`` and
``torch.Size([8, 16])`` are one cause); each group lists its count per file, where in
this package it was raised most often, and example test ids. Skips are grouped by the
TE internal (or CUDA-only function) they name, the tests' own skips by reason.
"""

from __future__ import annotations

import json
import re
import shlex
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from . import symbols

SKIP_CATEGORIES = ("internal", "cuda-only", "availability", "test", "xfail")
_HEX = re.compile(r"0x[0-9a-fA-F]+")
_NUMBER = re.compile(r"(?<![\w.])[-+]?\d+(\.\d+)?([eE][-+]?\d+)?(?![\w])")
_TMP = re.compile(r"/tmp/teops-conformance-[^/\s]+/")
EXAMPLES = 3


def normalize(message: str) -> str:
    """The first line of a message with addresses and numbers replaced."""
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    first = lines[0] if lines else ""
    first = _TMP.sub("", first)
    first = _HEX.sub("0x…", first)
    first = _NUMBER.sub("N", first)
    return first[:200]


def _file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def read_results(results: Path) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any]]:
    """(collection record, result lines, session info) of a results folder."""
    collections = sorted(results.glob("collection-*.json"))
    collection = json.loads(collections[0].read_text()) if collections else {}
    lines = []
    path = results / "results.jsonl"
    if path.is_file():
        lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    session_path = results / "session.json"
    session = json.loads(session_path.read_text()) if session_path.is_file() else {}
    return collection, lines, session


def fold_outcomes(lines: Iterable[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """nodeid -> {"outcome", "category"?, "failure"?, "skip"?, "duration"}."""
    phases: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for line in lines:
        if "nodeid" in line:
            phases[line["nodeid"]].append(line)
    out: dict[str, dict[str, Any]] = {}
    for nodeid, reports in phases.items():
        result: dict[str, Any] = {"duration": round(sum(r.get("duration", 0) for r in reports), 3)}
        failed = [r for r in reports if r["outcome"] == "failed"]
        skipped = [r for r in reports if r["outcome"] == "skipped"]
        if failed:
            call = [r for r in failed if r["when"] == "call"]
            first = (call or failed)[0]
            result["outcome"] = "failed" if call else "error"
            result["phase"] = first["when"]
            result["failure"] = _failure_of(first)
        elif skipped:
            first = skipped[0]
            category = (
                "xfail"
                if first.get("xfail")
                else first.get("teops_skip", {}).get("category", "test")
            )
            result["outcome"] = "skipped"
            result["category"] = category
            result["skip"] = {**first.get("teops_skip", {}), "reason": first.get("reason", "")}
        else:
            result["outcome"] = "passed"
        out[nodeid] = result
    return out


def _failure_of(report: dict[str, Any]) -> dict[str, Any]:
    info = report.get("teops_failure")
    if info:
        return info
    text = report.get("longrepr", "") or ""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return {
        "type": "pytest",
        "message": lines[-1] if lines else "failed without an exception",
        "package_frame": None,
        "test_frame": None,
    }


def fold(
    collection: Mapping[str, Any],
    lines: list[dict[str, Any]],
    files: Iterable[str],
) -> dict[str, Any]:
    """Per-file counts, failure groups and skip groups of one run."""
    outcomes = fold_outcomes(lines)
    collect_errors = {
        _file_of(line["collect_error"]): normalize(_last_error_line(line.get("longrepr", "")))
        for line in lines
        if "collect_error" in line
    }
    collected = Counter(_file_of(n) for n in collection.get("collected", []))
    selected = Counter(_file_of(n) for n in collection.get("selected", []))
    kept = Counter(_file_of(n) for n in collection.get("kept", []))
    per_file: dict[str, dict[str, Any]] = {}
    for name in files:
        row: dict[str, Any] = {
            "collected": collected.get(name, 0),
            "deselected": collected.get(name, 0) - selected.get(name, 0),
            "sampled_out": selected.get(name, 0) - kept.get(name, 0),
            "run": kept.get(name, 0),
            "passed": 0,
            "failed": 0,
            "errors": 0,
            "skipped": dict.fromkeys(SKIP_CATEGORIES, 0),
            "not_reported": 0,
        }
        if name in collect_errors:
            row["collection_error"] = collect_errors[name]
        per_file[name] = row
    for nodeid in collection.get("kept", []):
        row = per_file.get(_file_of(nodeid))
        if row is None:
            continue
        result = outcomes.get(nodeid)
        if result is None:
            row["not_reported"] += 1
        elif result["outcome"] == "passed":
            row["passed"] += 1
        elif result["outcome"] == "failed":
            row["failed"] += 1
        elif result["outcome"] == "error":
            row["errors"] += 1
        else:
            row["skipped"][result["category"]] += 1
    functions = _sampled_functions(collection)
    return {
        "files": per_file,
        "sampled_functions": functions,
        "failure_groups": failure_groups(outcomes),
        "skip_groups": skip_groups(outcomes),
    }


def _last_error_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in reversed(lines):
        if line.startswith("E "):
            return line[2:].strip()
    return lines[-1] if lines else "collection failed"


def _sampled_functions(collection: Mapping[str, Any]) -> dict[str, dict[str, int]]:
    """Test functions the sampling cut: selected and kept parametrizations."""
    selected = Counter(n.split("[", 1)[0] for n in collection.get("selected", []))
    kept = Counter(n.split("[", 1)[0] for n in collection.get("kept", []))
    return {
        name: {"selected": count, "kept": kept.get(name, 0)}
        for name, count in sorted(selected.items())
        if kept.get(name, 0) < count
    }


def failure_groups(outcomes: Mapping[str, dict[str, Any]]) -> list[dict[str, Any]]:
    groups: dict[str, dict[str, Any]] = {}
    for nodeid in sorted(outcomes):
        result = outcomes[nodeid]
        if result["outcome"] not in ("failed", "error"):
            continue
        failure = result["failure"]
        kind = failure["type"].rsplit(".", 1)[-1] if failure["type"] != "pytest" else "pytest"
        key = f"{kind}: {normalize(failure.get('message', ''))}"
        group = groups.setdefault(
            key,
            {
                "cause": key,
                "type": failure["type"],
                "count": 0,
                "files": Counter(),
                "raised_at": Counter(),
                "examples": [],
                "message": _first_line(failure.get("message", "")),
            },
        )
        group["count"] += 1
        group["files"][_file_of(nodeid)] += 1
        if failure.get("package_frame"):
            group["raised_at"][failure["package_frame"]] += 1
        if len(group["examples"]) < EXAMPLES:
            group["examples"].append(nodeid)
    out = []
    for group in sorted(groups.values(), key=lambda g: (-g["count"], g["cause"])):
        group["files"] = dict(group["files"].most_common())
        group["raised_at"] = [f"{where} ({n})" for where, n in group["raised_at"].most_common(2)]
        out.append(group)
    return out


def _first_line(message: str) -> str:
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    first = _TMP.sub("", lines[0]) if lines else ""
    return first[:300]


def skip_groups(outcomes: Mapping[str, dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    groups: dict[str, dict[str, dict[str, Any]]] = {c: {} for c in SKIP_CATEGORIES}
    for nodeid in sorted(outcomes):
        result = outcomes[nodeid]
        if result["outcome"] != "skipped":
            continue
        category = result["category"]
        skip = result.get("skip", {})
        key = skip.get("symbol") or normalize(skip.get("reason", ""))
        group = groups[category].setdefault(
            key, {"key": key, "count": 0, "files": Counter(), "examples": [], "reason": ""}
        )
        group["count"] += 1
        group["files"][_file_of(nodeid)] += 1
        if len(group["examples"]) < EXAMPLES:
            group["examples"].append(nodeid)
            group["reason"] = group["reason"] or _first_line(skip.get("reason", ""))
    out: dict[str, list[dict[str, Any]]] = {}
    for category, members in groups.items():
        ordered = sorted(members.values(), key=lambda g: (-g["count"], g["key"]))
        for group in ordered:
            group["files"] = dict(group["files"].most_common())
        out[category] = ordered
    return out


def exit_status(run: Mapping[str, Any]) -> int:
    """0 when every test run passed or skipped (not for availability on the CPU), 1
    otherwise."""
    for row in run["files"].values():
        if row["failed"] or row["errors"] or row["not_reported"] or "collection_error" in row:
            return 1
        if run["device"] == "cpu" and row["skipped"]["availability"]:
            return 1
    return 0


# -- the JSON file of runs ----------------------------------------------------------
def load_runs(path: Path) -> dict[str, Any]:
    if path.is_file():
        data = json.loads(path.read_text())
        if isinstance(data, dict) and isinstance(data.get("runs"), dict):
            return data
    return {"runs": {}}


def save_runs(path: Path, runs: Mapping[str, Any]) -> dict[str, Any]:
    """Add (or replace, by label) runs in the runs JSON; returns its new content."""
    data = load_runs(path)
    data["runs"].update(runs)
    data["runs"] = dict(sorted(data["runs"].items()))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")
    return data


# -- Markdown ------------------------------------------------------------------------
def _table(header: list[str], rows: Iterable[list[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return out


def _code(text: str) -> str:
    return "`" + text.replace("`", "'") + "`" if text else ""


_OUTPUT_OPTIONS = ("--results", "--out", "--json")
_FOLDER_OPTIONS = ("--prepare-only", "--run-prepared")


def shown_command(command: str) -> str:
    """A run's command as the report shows it: TE's checkout as ``$TE_SRC``, without
    the options that only say where files go (they change no result)."""
    shown: list[str] = []
    for part in command.split(" && "):
        words = shlex.split(part)
        out: list[str] = []
        skip = False
        for i, word in enumerate(words):
            if skip:
                skip = False
                continue
            if word in _OUTPUT_OPTIONS:
                skip = True
                continue
            if word == "--keep":
                continue
            if i > 0 and words[i - 1] == "--te-src":
                out.append("$TE_SRC")
                continue
            if i > 0 and words[i - 1] in _FOLDER_OPTIONS:
                out.append("DIR")
                continue
            out.append(word)
        shown.append(shlex.join(out).replace("'$TE_SRC'", "$TE_SRC"))
    return " && ".join(shown)


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def _te(run: Mapping[str, Any]) -> str:
    te = run.get("te", {})
    commit = te.get("commit") or "unknown"
    bits = [commit[:12]]
    if te.get("tag"):
        bits.append(te["tag"])
    if te.get("version"):
        bits.append(te["version"])
    return " ".join(bits)


def _merge_device(runs: Mapping[str, Mapping[str, Any]], device: str) -> dict[str, Any]:
    """One view of a device's runs: each file from the last run (by label order) that ran
    it; the failure and skip groups summed over those runs' files."""
    files: dict[str, tuple[str, dict[str, Any]]] = {}
    for label, run in runs.items():
        if run["device"] != device:
            continue
        for name, row in run["files"].items():
            files[name] = (label, row)
    groups: dict[str, dict[str, Any]] = {}
    skips: dict[str, dict[str, dict[str, Any]]] = {c: {} for c in SKIP_CATEGORIES}
    for label, run in runs.items():
        if run["device"] != device:
            continue
        owned = {name for name, (owner, _) in files.items() if owner == label}
        for group in run["failure_groups"]:
            counts = {f: n for f, n in group["files"].items() if f in owned}
            if not counts:
                continue
            merged = groups.setdefault(
                group["cause"],
                {**group, "count": 0, "files": Counter(), "examples": [], "raised_at": []},
            )
            merged["count"] += sum(counts.values())
            merged["files"].update(counts)
            merged["examples"] += [e for e in group["examples"] if _file_of(e) in owned]
            merged["raised_at"] = merged["raised_at"] or group["raised_at"]
        for category, members in run["skip_groups"].items():
            for group in members:
                counts = {f: n for f, n in group["files"].items() if f in owned}
                if not counts:
                    continue
                merged = skips[category].setdefault(
                    group["key"], {**group, "count": 0, "files": Counter(), "examples": []}
                )
                merged["count"] += sum(counts.values())
                merged["files"].update(counts)
                merged["examples"] += [e for e in group["examples"] if _file_of(e) in owned]
    return {
        "files": files,
        "failure_groups": sorted(groups.values(), key=lambda g: (-g["count"], g["cause"])),
        "skip_groups": {
            c: sorted(m.values(), key=lambda g: (-g["count"], g["key"])) for c, m in skips.items()
        },
    }


def _counts(files: Mapping[str, int]) -> str:
    return ", ".join(f"{name} {n}" for name, n in files.items())


def render(data: Mapping[str, Any], top: int = 25) -> str:
    runs: dict[str, Any] = data["runs"]
    out = [
        "# TE conformance",
        "",
        "Generated by `make te-conformance` (`python -m conformance`) from",
        "`docs/te_conformance.json`; do not edit by hand. TE's own tests (`tests/pytorch` of a",
        "TE checkout, never copied into this repository) run against this package: the runner",
        "copies the chosen files into a temporary folder, rewrites their TE imports and their",
        "device (the rules are listed below), skips the tests that reach a TE internal (a fixed",
        "list, found by reading the tests: `conformance/symbols.py`), and runs pytest.",
        "A test that reaches a public TE name this package lacks fails; it is not skipped.",
        "",
        "## Runs",
        "",
    ]
    rows = []
    for label, run in runs.items():
        totals = Counter()
        for row in run["files"].values():
            totals.update({k: row[k] for k in ("run", "passed", "failed", "errors")})
        rows.append(
            [
                label,
                run["date"],
                run.get("commit") or "not recorded",
                f"{run['device']} ({run['device_name']})",
                run["torch"],
                _te(run),
                str(run.get("sample") or ""),
                _code(run.get("keyword") or ""),
                str(run.get("workers", 0)),
                _duration(run["duration_s"]),
                f"{totals['run']} / {totals['passed']} / {totals['failed']} / {totals['errors']}",
                _code(shown_command(run["command"])),
            ]
        )
    out += _table(
        [
            "run",
            "date",
            "commit",
            "device",
            "torch",
            "TE commit",
            "sample",
            "-k",
            "workers",
            "time",
            "run / passed / failed / errors",
            "command",
        ],
        rows,
    )
    for device in sorted({run["device"] for run in runs.values()}):
        out += _render_device(runs, device, top)
    out += _render_import_time(runs)
    out += _render_availability(runs)
    out += _render_rules(runs)
    return "\n".join(out) + "\n"


def _render_device(runs: Mapping[str, Any], device: str, top: int) -> list[str]:
    view = _merge_device(runs, device)
    name = "CPU" if device == "cpu" else "CUDA"
    out = ["", f"## {name}: per file", ""]
    rows = []
    for file, (label, row) in sorted(view["files"].items()):
        skipped = row["skipped"]
        rows.append(
            [
                file,
                label,
                str(row["collected"]),
                str(row["deselected"]),
                str(row["sampled_out"]),
                str(row["run"]),
                str(row["passed"]),
                str(row["failed"]),
                str(row["errors"]),
                str(skipped["internal"]),
                str(skipped["cuda-only"]),
                str(skipped["test"] + skipped["xfail"]),
                str(skipped["availability"]),
                str(row["not_reported"]),
                row.get("collection_error", ""),
            ]
        )
    out += _table(
        [
            "file",
            "from run",
            "collected",
            "deselected (-k)",
            "sampled out",
            "run",
            "passed",
            "failed",
            "errors",
            "skipped: TE internal",
            "skipped: CUDA only",
            "skipped: test's own",
            "skipped: availability",
            "not reported",
            "collection error",
        ],
        rows,
    )
    if device == "cpu":
        out += [
            "",
            "A skip for availability on the CPU counts as a failure of the run: this package",
            "answers every availability query True there.",
        ]
    sampled = [
        (label, function, counts)
        for label, run in runs.items()
        if run["device"] == device
        for function, counts in run.get("sampled_functions", {}).items()
    ]
    if sampled:
        out += ["", f"### {name}: sampled test functions", ""]
        out += _table(
            ["run", "test function", "parametrizations", "run (by SHA-256 of the test id)"],
            (
                [label, _code(function), str(c["selected"]), str(c["kept"])]
                for label, function, c in sampled
            ),
        )
    blocked = [
        (file, row["collection_error"])
        for file, (_, row) in sorted(view["files"].items())
        if "collection_error" in row
    ]
    if blocked:
        out += ["", f"### {name}: files that fail to import (none of their tests ran)", ""]
        out += _table(["file", "error"], ([file, _code(error)] for file, error in blocked))
    groups = view["failure_groups"]
    out += ["", f"### {name}: failures by cause ({len(groups)} causes, the first {top})", ""]
    out += _table(
        ["tests", "cause", "per file", "raised in transformer_engine_ops", "examples"],
        (
            [
                str(g["count"]),
                _code(g["cause"]),
                _counts(g["files"]),
                "<br>".join(_code(w) for w in g["raised_at"]),
                "<br>".join(_code(e) for e in g["examples"][:EXAMPLES]),
            ]
            for g in groups[:top]
        ),
    )
    skips = view["skip_groups"]
    out += ["", f"### {name}: skips by TE internal", ""]
    out += _table(
        ["tests", "internal", "why", "per file", "example"],
        (
            [
                str(g["count"]),
                _code(g["key"]),
                _why(g["key"]),
                _counts(g["files"]),
                _code(g["examples"][0]),
            ]
            for g in skips["internal"]
        ),
    )
    if skips["cuda-only"]:
        out += ["", f"### {name}: skips for CUDA-only functions", ""]
        out += _table(
            ["tests", "function", "per file", "example"],
            (
                [str(g["count"]), _code(g["key"]), _counts(g["files"]), _code(g["examples"][0])]
                for g in skips["cuda-only"]
            ),
        )
    if skips["availability"]:
        out += ["", f"### {name}: skips for availability", ""]
        out += _table(
            ["tests", "reason", "per file", "example"],
            (
                [str(g["count"]), _code(g["key"]), _counts(g["files"]), _code(g["examples"][0])]
                for g in skips["availability"]
            ),
        )
    own = skips["test"] + skips["xfail"]
    if own:
        out += ["", f"### {name}: the tests' own skips", ""]
        out += _table(
            ["tests", "reason", "per file"],
            ([str(g["count"]), _code(g["key"]), _counts(g["files"])] for g in own),
        )
    return out


def _why(key: str) -> str:
    if key.startswith("."):
        return symbols.INTERNAL_ATTRIBUTES.get(key[1:], "")
    return symbols.INTERNAL.get(key, "")


def _render_import_time(runs: Mapping[str, Any]) -> list[str]:
    rows = [
        [label, file, _code(use["symbol"]), _code(use["used"]), use["where"]]
        for label, run in runs.items()
        for file, uses in run.get("import_time_internal", {}).items()
        for use in uses
    ]
    if not rows:
        return []
    out = [
        "",
        "## TE internals reached on import",
        "",
        "Module-level code reaching a TE internal runs on its placeholder while the module",
        "is imported (no test runs it):",
        "",
    ]
    return out + _table(["run", "file", "internal", "code", "where"], rows)


def _render_availability(runs: Mapping[str, Any]) -> list[str]:
    out = ["", "## Availability answers", ""]
    rows = []
    for label, run in runs.items():
        for name, answer in run.get("availability", {}).items():
            if "error" in answer:
                value = f"raises {answer['error']}"
            elif "value" in answer:
                value = str(tuple(answer["value"]))
            else:
                value = f"{answer['available']} ({answer['reason']})"
            rows.append([label, f"`{name}`", value])
    return out + _table(["run", "query", "answer"], rows)


def _render_rules(runs: Mapping[str, Any]) -> list[str]:
    out = [
        "",
        "## The rewrite",
        "",
        "Only imports, TE-qualified references and the device change; every other line is",
        "TE's, at TE's line number. Each rule and how often it applied per file (the last",
        "run of each file):",
        "",
    ]
    per_file: dict[str, dict[str, int]] = {}
    for run in runs.values():
        per_file.update(run.get("rules", {}))
    names = list(symbols.RULES)
    out += _table(
        ["rule", "what", *sorted(per_file)],
        (
            [
                _code(rule),
                symbols.RULES[rule],
                *(str(per_file[f].get(rule, 0)) for f in sorted(per_file)),
            ]
            for rule in names
        ),
    )
    out += ["", "TE modules and names mapped to this package or to the shim:", ""]
    mapped = [[_code(k), _code(v)] for k, v in symbols.MODULES.items()]
    mapped += [[_code(k), _code(f"{m}.{a}")] for k, (m, a) in symbols.MAPPED.items()]
    mapped += [[_code(k), _code(f"_teops_te.{a}")] for k, a in symbols.SUPPORT.items()]
    mapped += [
        [
            _code("transformer_engine.pytorch[.<module>...].<public name>"),
            "`transformer_engine_ops.<public name>` (a name this package lacks: a failing placeholder)",
        ]
    ]
    mapped += [[_code(k), f"a failing placeholder: {v}"] for k, v in symbols.MISSING.items()]
    out += _table(["TE", "here"], mapped)
    out += ["", "TE internals (a test reaching one is skipped, naming it):", ""]
    internals = [[_code(k), v] for k, v in symbols.INTERNAL.items()]
    internals += [[_code("." + k), v] for k, v in symbols.INTERNAL_ATTRIBUTES.items()]
    out += _table(["internal", "why"], internals)
    out += [
        "",
        "On the CPU, a test reaching one of these `torch.cuda` functions (no CPU counterpart)",
        "is skipped, naming it: " + ", ".join(f"`{n}`" for n in sorted(symbols.CUDA_ONLY)) + ".",
    ]
    return out
