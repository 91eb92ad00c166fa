"""``python -m conformance --te-src PATH``: run TE's own tests against this package.

Copies the chosen files of ``PATH/tests/pytorch`` (default: the eight of
``conformance.symbols.DEFAULT_FILES``) and their helpers into a temporary folder,
rewrites their TE imports and their device, skips the tests that reach a TE internal,
runs pytest there, and records the run under ``--label`` in the JSON beside ``--out``
(other runs kept), then renders ``--out`` from it.

The preparation (which reads TE's sources with libcst) and the run can happen on two
machines: ``--prepare-only DIR`` writes the folder and stops; ``--run-prepared DIR``
runs it (pytest and torch are all it needs) and reports. ``--merge JSON`` adds the runs
of another runs JSON to ``--json``; ``--render-only`` renders ``--out`` again.

Exit status: 0 when every test run passed or skipped (and, on the CPU, none skipped for
availability), 1 when some failed, errored or did not report, 2 when the run could not
be made (no such file, a TE name the lists in conformance/symbols.py do not cover).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shlex
import shutil
import sys
from pathlib import Path
from typing import Any

from . import report, runner, symbols

DOCS = Path(__file__).resolve().parent.parent / "docs"


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m conformance", description=__doc__)
    p.add_argument("--te-src", type=Path, help="a TE checkout (read only)")
    p.add_argument(
        "--files",
        nargs="+",
        default=list(symbols.DEFAULT_FILES),
        help="test files of tests/pytorch (default: the eight)",
    )
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument(
        "--sample",
        type=int,
        default=None,
        metavar="K",
        help="keep at most K parametrizations per test function (by SHA-256 of the test id)",
    )
    p.add_argument("--workers", type=int, default=0, metavar="N", help="pytest-xdist workers")
    p.add_argument("-k", "--keyword", default=None, help="pytest -k expression")
    p.add_argument(
        "--timeout", type=float, default=600.0, help="seconds per test phase (default 600)"
    )
    p.add_argument("--te-commit", default=None, help="TE's commit when TE_SRC is not a git tree")
    p.add_argument("--label", default=None, help="the run's name in the report")
    p.add_argument("--out", type=Path, default=DOCS / "te_conformance.md")
    p.add_argument("--json", type=Path, default=None, help="runs JSON (default: --out's .json)")
    p.add_argument("--results", type=Path, default=None, help="also write every test's outcome")
    p.add_argument(
        "--deadline",
        type=float,
        default=None,
        metavar="SECONDS",
        help="interrupt pytest after SECONDS and report what ran (the rest: not reported)",
    )
    p.add_argument("--keep", action="store_true", help="keep the temporary folder")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--prepare-only", type=Path, metavar="DIR", help="only prepare DIR")
    mode.add_argument("--run-prepared", type=Path, metavar="DIR", help="run a prepared DIR")
    mode.add_argument("--merge", type=Path, metavar="JSON", help="add another JSON's runs")
    mode.add_argument(
        "--render-only", action="store_true", help="only render --out from the runs JSON"
    )
    args = p.parse_args(argv)
    args.files = [f if f.endswith(".py") else f"{f}.py" for f in args.files]
    if args.sample is not None and args.sample < 1:
        p.error("--sample must be at least 1")
    if args.json is None:
        args.json = args.out.with_suffix(".json")
    if args.te_src is None and not (args.render_only or args.merge or args.run_prepared):
        p.error("--te-src is required")
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = _parse(argv)
    if args.render_only or args.merge:
        data = report.load_runs(args.json)
        if args.merge:
            data = report.save_runs(args.json, report.load_runs(args.merge)["runs"])
        args.out.write_text(report.render(data))
        print(f"wrote {args.out}")
        return 0
    try:
        if args.run_prepared:
            prepared, plan = runner.load_prepared(args.run_prepared)
        else:
            plan = {
                "te": runner.te_revision(args.te_src, args.te_commit),
                "device": args.device,
                "sample": args.sample,
                "timeout_s": args.timeout,
                "argv": argv,
            }
            root = args.prepare_only
            if root is not None:
                root.mkdir(parents=True, exist_ok=True)
            prepared = runner.prepare(_options(args), root=root, plan=plan)
            if args.prepare_only:
                print(f"prepared {prepared.root}")
                return 0
    except runner.RunnerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    keep = args.keep or args.run_prepared is not None
    try:
        started = dt.datetime.now(dt.timezone.utc)
        code, duration = runner.run_timed(_options(args, plan), prepared)
        collection, lines, session = report.read_results(prepared.results)
        if not collection and not lines:
            print(
                f"error: pytest (exit {code}) reported nothing; see {prepared.results}/pytest.log",
                file=sys.stderr,
            )
            keep = True
            return 2
        label = args.label or f"{plan['device']}: " + ", ".join(
            Path(f).stem for f in prepared.files
        )
        run = {
            "date": started.strftime("%Y-%m-%d %H:%M UTC"),
            "commit": runner.package_commit((args.json, args.out)),
            "command": _command(plan["argv"], argv, args.run_prepared is not None),
            "device": plan["device"],
            "device_name": session.get("device_name", ""),
            "torch": session.get("torch", ""),
            "python": session.get("python", ""),
            "te": plan["te"],
            "sample": plan["sample"],
            "keyword": args.keyword,
            "workers": args.workers,
            "timeout_s": plan["timeout_s"],
            "duration_s": round(duration, 1),
            "pytest_exit": code,
            "deadline_s": args.deadline,
            "availability": session.get("availability", {}),
            "rules": prepared.rules,
            "import_time_internal": {
                f"{m}.py": facts["import_time"]
                for m, facts in prepared.manifest.items()
                if facts["import_time"]
            },
            **report.fold(collection, lines, prepared.files),
        }
        status = report.exit_status(run)
        run["status"] = status
        data = report.save_runs(args.json, {label: run})
        args.out.write_text(report.render(data))
        if args.results is not None:
            outcomes = report.fold_outcomes(lines)
            args.results.write_text(json.dumps(outcomes, indent=1, sort_keys=True) + "\n")
        _summary(label, run, args)
        return status
    finally:
        if keep:
            print(f"kept {prepared.root}", file=sys.stderr)
        else:
            shutil.rmtree(prepared.root, ignore_errors=True)


def _options(args: argparse.Namespace, plan: dict[str, Any] | None = None) -> runner.Options:
    plan = plan or {}
    return runner.Options(
        te_src=args.te_src or Path("."),
        files=args.files,
        device=plan.get("device", args.device),
        sample=plan.get("sample", args.sample),
        workers=args.workers,
        keyword=args.keyword,
        timeout=plan.get("timeout_s", args.timeout),
        deadline=args.deadline,
    )


def _command(prepare_argv: list[str], argv: list[str], split: bool) -> str:
    command = "python -m conformance " + shlex.join(prepare_argv)
    if split:
        command += " && python -m conformance " + shlex.join(argv)
    return report.shown_command(command)


def _summary(label: str, run: dict[str, Any], args: argparse.Namespace) -> None:
    print(f"{label}: TE {run['te'].get('commit') or 'unknown'}, torch {run['torch']}")
    for name, row in run["files"].items():
        skipped = sum(row["skipped"].values())
        extra = f" collection error: {row['collection_error']}" if "collection_error" in row else ""
        print(
            f"  {name}: run {row['run']} passed {row['passed']} failed {row['failed']} "
            f"errors {row['errors']} skipped {skipped}{extra}"
        )
    for group in run["failure_groups"][:10]:
        print(f"  {group['count']:6d}  {group['cause']}")
    print(f"wrote {args.json} and {args.out}")


if __name__ == "__main__":
    sys.exit(main())
