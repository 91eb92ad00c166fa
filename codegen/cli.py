"""``python -m codegen``: generate, check, diff, explain a bundle, print the kind table;
``python -m codegen diff --against REV``: what the bundle changes since REV break."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import kinds, output, review_cli
from .config import load_config
from .errors import CodegenError, ConfigError, PartialWriteError
from .pipeline import find_bundle, generate, read_all
from .render import FormatterError

REGENERATE = "make codegen"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m codegen", description=__doc__)
    p.add_argument(
        "--root",
        type=Path,
        default=Path.cwd(),
        help="project root holding pyproject.toml (default: the current directory)",
    )
    p.add_argument(
        "--source",
        action="append",
        dest="sources",
        metavar="PATH",
        help="read this op module instead of the configured sources (repeatable)",
    )
    mode = p.add_mutually_exclusive_group()
    mode.add_argument(
        "--check",
        action="store_true",
        help="render in memory; exit 1 with a short diff if generated/ is stale",
    )
    mode.add_argument(
        "--diff", action="store_true", help="print the full diff of generated files, write nothing"
    )
    p.add_argument(
        "command",
        nargs="?",
        choices=("generate", "explain", "kinds", "diff"),
        default="generate",
        help="generate (default); explain BUNDLE; kinds (the kind table); diff --against REV "
        "(which bundle changes since REV break keyword or positional callers, saved compiled "
        "graphs, exported programs)",
    )
    p.add_argument("bundle", nargs="?", help="bundle name, for `explain`")
    review_cli.add_arguments(p)
    return p


def _explain(config, sources, name: str | None) -> int:
    modules = read_all(config, sources)
    bundle = find_bundle(modules, name or "")
    if bundle is None:
        known = sorted({b.name for m in modules for op in m.ops for b in (op.forward, op.backward)})
        print(f"error: no bundle named {name!r}; known: {', '.join(known)}", file=sys.stderr)
        return 2
    rows = [("field", "annotation", "kind", "slots")]
    rows += [
        (
            f.name,
            f.annotation,
            f.type.kind.value,
            ", ".join(f"{s.type} {s.name}" for s in f.slots) or "(none: must be None)",
        )
        for f in bundle.fields
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    print(f"{bundle.name} ({bundle.location})")
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row[:3], widths, strict=False)) + "  " + row[3])
    return 0


def kind_table_markdown() -> str:
    return kinds.table_markdown()


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "diff":
        return review_cli.run(args, parser.error)
    if review_cli.diff_options_given(args):
        parser.error("--against, --merge-base, --format, --fail-on and --consumers go with `diff`")
    if args.command == "kinds":
        print(kind_table_markdown(), end="")
        return 0
    try:
        config = load_config(args.root.resolve())
        if args.command == "explain":
            return _explain(config, args.sources, args.bundle)
        generated = generate(config, args.sources)
        output.check_targets(config.root, generated.files)
        if args.check or args.diff:
            return _compare(config, generated.files, args)
        return _write(config, generated.files, args)
    except CodegenError as exc:
        print(exc, file=sys.stderr)
        print(f"{REGENERATE}: nothing was written", file=sys.stderr)
        return 1
    except (ConfigError, FormatterError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        print(f"{REGENERATE}: nothing was written", file=sys.stderr)
        return 2
    except PartialWriteError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _stale(config, files: dict[str, str], args) -> list[str]:
    return output.stale(config.root, config.output_dir, files) if args.sources is None else []


def _compare(config, files: dict[str, str], args) -> int:
    """``--check`` / ``--diff``: read the tree, print the difference, write nothing."""
    root = config.root
    changed = output.changed(root, files)
    stale = _stale(config, files, args)
    leftovers = output.debris(root, config.output_dir)
    if not changed and not stale and not leftovers:
        print(f"generated code is up to date ({len(files)} files)")
        return 0
    cap = output.DIFF_LINE_CAP if args.check else 10**9
    print(output.unified_diff(root, files, cap), end="")
    for rel in stale:
        print(f"stale generated file with no source: {rel}")
    for rel in leftovers:
        print(f"temp file left by an interrupted write: {rel}")
    if args.check:
        print(
            f"\ngenerated code is stale: run `{REGENERATE}` and commit the result", file=sys.stderr
        )
        return 1
    return 0


def _write(config, files: dict[str, str], args) -> int:
    leftovers = output.debris(config.root, config.output_dir)
    touched = output.write(config.root, files, _stale(config, files, args), leftovers)
    for line in touched:
        print(line)
    print(f"{len(files)} generated files, {len(touched)} changed")
    return 0
