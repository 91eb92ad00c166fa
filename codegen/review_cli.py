"""``python -m codegen diff --against REV``: what a bundle change means, for a PR review.

Both sides go through the working tree's reader, configuration loader, emitter and
templates: the working tree as it is, and REV's files read from git into a temporary
folder (``revision.tree_at``; nothing is checked out). REV is untrusted (docs/review.md,
"What `codegen diff` trusts"): its files are read as data and nothing it holds is
rendered, imported or run; a change to its templates is reported as a text diff of the
template files. The configuration (namespace, kinds) is each side's own.
``review.compare`` classifies the differences; the report is laid out by
``templates/review/``.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import difflib
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import jinja2

from . import emit, render, revision
from .config import Config, load_config
from .errors import CodegenError, ConfigError
from .parsing import libcst_budget
from .pipeline import TEMPLATE_DIR, read_all
from .review import RULES, Consumer, OpReview, OpSide, compare
from .schema_text import Schema, parse_schema
from .sources import select as select_sources

REVIEW_TEMPLATES = TEMPLATE_DIR / "review"
FORMATS = {"text": "diff.txt.j2", "markdown": "diff.md.j2"}
RULES_DOC = "docs/review.md"

# Bounds on reading a revision (docs/review.md, "Bounds"); revision.py bounds its files.
MAX_OP_MODULE_BYTES = 256 << 10  # one op module (libcst takes seconds per MiB)
MAX_LIBCST_BYTES = 1 << 20  # all libcst parses of the revision: op modules, alias modules
REVISION_DEADLINE_S = 60.0  # copying and reading the revision, its template diff included
TEMPLATE_DIFF_MAX_BYTES = 64 << 10  # a template larger than this is not diffed
TEMPLATE_DIFF_MAX_LINES = 2000  # nor one of more lines (difflib's work grows as their product)
TEMPLATE_DIFF_SHOWN_LINES = 400  # diff lines shown, all templates together


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "diff: what the bundle changes since a git revision break, and for whom "
        "(unlike --diff, the text diff of generated files)"
    )
    against = group.add_mutually_exclusive_group()
    against.add_argument("--against", metavar="REV", help="compare the working tree with REV")
    against.add_argument(
        "--merge-base",
        metavar="REF",
        help="compare with the merge base of HEAD and REF (what a PR into REF changes)",
    )
    group.add_argument("--format", choices=tuple(FORMATS), default="text")
    group.add_argument(
        "--fail-on",
        choices=("breaking",),
        help="exit 1 when a change breaks one of the consumers (for CI)",
    )
    group.add_argument(
        "--consumers",
        type=_consumers,
        default=tuple(Consumer),
        metavar="LIST",
        help="comma-separated consumers to report and fail on (default: all of "
        + ", ".join(c.value for c in Consumer)
        + ")",
    )


def _consumers(text: str) -> tuple[Consumer, ...]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    known = {c.value: c for c in Consumer}
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown consumer(s) {', '.join(unknown) or '(none given)'}; "
            f"choose from {', '.join(known)}"
        )
    return tuple(c for c in Consumer if c.value in names)


def diff_options_given(args: argparse.Namespace) -> bool:
    return bool(
        args.against or args.merge_base or args.fail_on or args.format != "text"
    ) or args.consumers != tuple(Consumer)


# --- Reading a side --------------------------------------------------------------------

_SCHEMA_CONSTANTS = ("FORWARD_OP", "FORWARD_SCHEMA", "BACKWARD_OP", "BACKWARD_SCHEMA")


def _rendered_constants(code: str) -> dict[str, str]:
    """The op names and schemas a rendered op module defines; KeyError if one is missing."""
    constants = {}
    for node in ast.parse(code).body:
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and node.targets[0].id in _SCHEMA_CONSTANTS
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            constants[node.targets[0].id] = node.value.value
    missing = [key for key in _SCHEMA_CONSTANTS if key not in constants]
    if missing:
        raise KeyError(f"no string constant {', '.join(missing)}")
    for key in ("FORWARD_SCHEMA", "BACKWARD_SCHEMA"):
        parse_schema(constants[key])
    return constants


def read_side(
    root: Path, template_dir: Path, notes: list[str], label: str, config: Config | None = None
) -> dict[str, OpSide]:
    """Every configured op at ``root`` (``config``: its configuration, already loaded),
    with the schemas ``template_dir`` renders for it.

    An op module this generator reads but would not generate, or templates that cannot
    render its context, leave the schemas derived from the IR, with a note saying so.
    """
    config = config or load_config(root)
    modules = read_all(config)
    env = render.environment(template_dir)
    sides = {}
    for module in modules:
        (op,) = module.ops
        derived = {
            "FORWARD_OP": f"{config.namespace}::{op.name}_fwd",
            "FORWARD_SCHEMA": emit.schema_string(op.forward),
            "BACKWARD_OP": f"{config.namespace}::{op.name}_bwd",
            "BACKWARD_SCHEMA": emit.schema_string(op.backward),
        }
        try:
            code = env.get_template("op_module.py.j2").render(
                emit.op_module_context(module, config)
            )
            constants = _rendered_constants(code)
        except (jinja2.TemplateError, SyntaxError, ValueError, KeyError, CodegenError) as exc:
            # CodegenError: REV's op module is one this generator reads but would not
            # generate (a plain call taking the bundle, from before the keyword entry).
            notes.append(
                f"{label}: {module.path}: its schemas come from the bundles, not the templates "
                f"({type(exc).__name__}: {exc})"
            )
            constants = derived
        sides[op.name] = OpSide(
            op,
            module.path,
            Schema(constants["FORWARD_OP"], constants["FORWARD_SCHEMA"]),
            Schema(constants["BACKWARD_OP"], constants["BACKWARD_SCHEMA"]),
        )
    return sides


def read_revision_side(root: Path, copy: Path, notes: list[str], label: str) -> dict[str, OpSide]:
    """Every configured op of the revision copied to ``copy`` (``root`` is the project's
    folder in it), read as data: its configuration confined to the copy, what libcst
    parses within the bounds, its schemas rendered by the working tree's templates."""
    config = load_config(root, confine_to=copy)
    base = config.reading.source_root or config.root
    for rel in select_sources(config):
        try:
            size = (base / rel).stat().st_size
        except OSError:
            continue  # read_all says the op module is missing
        if size > MAX_OP_MODULE_BYTES:
            raise CannotCompare(
                f"error: {label}: {(base / rel).relative_to(copy).as_posix()}: {size} bytes, "
                f"more than the {MAX_OP_MODULE_BYTES} bytes codegen diff reads as a "
                "revision's op module"
            )
    with libcst_budget(MAX_LIBCST_BYTES):
        return read_side(root, TEMPLATE_DIR, notes, label, config)


@dataclass(frozen=True)
class TemplateChange:
    """A template file of the generator that differs between REV and the working tree."""

    path: str  # repository-relative: templates/_schema.j2
    status: str  # added, removed, changed
    diff: tuple[str, ...]  # unified diff lines shown (REV first), maybe cut short
    note: str = ""  # why (part of) the diff is not shown


def template_changes(top: Path, copy: Path, against: str) -> tuple[TemplateChange, ...]:
    """REV's templates against the working tree's, as text: never rendered.

    Empty unless the reviewed repository holds the templates of the generator that runs
    (this one does). A template too large to diff is named with its sizes; the diff
    lines shown stop after TEMPLATE_DIFF_SHOWN_LINES.
    """
    try:
        rel = TEMPLATE_DIR.relative_to(top)
    except ValueError:
        return ()
    sides = []
    for folder in (copy / rel, TEMPLATE_DIR):
        files = sorted(p for p in folder.rglob("*.j2") if p.is_file()) if folder.is_dir() else []
        sides.append({p.relative_to(folder).as_posix(): p for p in files})
    before, after = sides
    changes = []
    budget = TEMPLATE_DIFF_SHOWN_LINES
    for name in sorted(before.keys() | after.keys()):
        old = before[name].read_bytes() if name in before else b""
        new = after[name].read_bytes() if name in after else b""
        if old == new:
            continue
        status = "added" if name not in before else "removed" if name not in after else "changed"
        path = (rel / name).as_posix()
        try:
            old_lines = old.decode("utf-8").splitlines()
            new_lines = new.decode("utf-8").splitlines()
        except UnicodeDecodeError:
            changes.append(TemplateChange(path, status, (), "not UTF-8 text: not shown"))
            continue
        if max(len(old), len(new)) > TEMPLATE_DIFF_MAX_BYTES or (
            max(len(old_lines), len(new_lines)) > TEMPLATE_DIFF_MAX_LINES
        ):
            size = f"{len(old)} bytes at {against}, {len(new)} now"
            changes.append(TemplateChange(path, status, (), f"{size}: too large to show as a diff"))
            continue
        lines = list(
            difflib.unified_diff(old_lines, new_lines, f"{against}:{path}", path, lineterm="", n=2)
        )
        shown, budget = lines[: max(budget, 0)], budget - len(lines)
        note = (
            f"{len(lines) - len(shown)} more diff lines not shown"
            if len(shown) < len(lines)
            else ""
        )
        changes.append(TemplateChange(path, status, tuple(shown), note))
    return tuple(changes)


# --- The report --------------------------------------------------------------------------


@dataclass(frozen=True)
class Report:
    against: str
    commit: str
    merge_base: bool
    reviews: tuple[OpReview, ...]
    consumers: tuple[Consumer, ...]
    notes: tuple[str, ...]
    templates: tuple[TemplateChange, ...] = ()

    def breaking(self) -> list[Consumer]:
        return [c for c in self.consumers if any(r.breaks((c,)) for r in self.reviews)]

    def breaking_count(self) -> int:
        return sum(f.breaks(self.consumers) for r in self.reviews for f in r.findings)


def _markdown_cell(text: str) -> str:
    return text.replace("|", "\\|")


def _markdown_fence(lines: tuple[str, ...]) -> str:
    """A code fence longer than any run of backticks in ``lines``, so none closes it."""
    longest = max((len(run) for line in lines for run in re.findall("`+", line)), default=0)
    return "`" * max(3, longest + 1)


def _markdown_code(text: str) -> str:
    """``text`` as a Markdown code span that no backtick in it ends."""
    longest = max((len(run) for run in re.findall("`+", text)), default=0)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{'`' * (longest + 1)}{pad}{text}{pad}{'`' * (longest + 1)}"


def _environment() -> jinja2.Environment:
    env = render.environment(REVIEW_TEMPLATES)
    env.filters["cell"] = _markdown_cell
    env.filters["fence"] = _markdown_fence
    env.filters["code"] = _markdown_code
    return env


# What a terminal or a Markdown page would act on rather than show: C0 and C1 control
# characters (an escape sequence can retitle or clear a terminal, a carriage return
# overwrite a line) and the bidirectional overrides that reorder text as shown.
_UNPRINTABLE = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]"
)


def printable(text: str) -> str:
    """``text`` with every control or bidirectional character written as an escape
    (``\\x1b``, ``\\u202e``): a report and its errors quote a revision's text."""
    return _UNPRINTABLE.sub(
        lambda m: f"\\x{ord(m[0]):02x}" if ord(m[0]) < 0x100 else f"\\u{ord(m[0]):04x}", text
    )


def render_report(report: Report, fmt: str) -> str:
    text = (
        _environment()
        .get_template(FORMATS[fmt])
        .render(report=report, consumers=report.consumers, rules_doc=RULES_DOC, rules=RULES)
    )
    return printable(text)


# --- The command -------------------------------------------------------------------------


class CannotCompare(Exception):
    """A side that cannot be read: no such revision, or a reader or configuration error."""


class _Overtime(BaseException):
    """Raised by the deadline's timer; a BaseException, so no ``except Exception`` in the
    reader or a library swallows it."""


@contextlib.contextmanager
def deadline(seconds: float, label: str) -> Iterator[None]:
    """``CannotCompare`` when the block runs longer than ``seconds``.

    A real-time timer signal (SIGALRM) interrupts the block, so only the main thread of
    a POSIX process sets one; elsewhere the block runs unbounded. A timer already set
    (a test harness's) is put back, less the time the block took.
    """
    if seconds <= 0 or not hasattr(signal, "setitimer"):
        yield
        return
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum: int, frame: object) -> None:
        raise _Overtime

    previous = signal.signal(signal.SIGALRM, expire)
    start = time.monotonic()
    outer, _ = signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        try:
            yield
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)  # the timer may fire up to here
    except _Overtime:
        raise CannotCompare(
            f"error: {label}: reading the revision took more than {seconds:g} s; codegen diff "
            "stops there (see the bounds in docs/review.md)"
        ) from None
    finally:
        signal.signal(signal.SIGALRM, previous)
        if outer:
            signal.setitimer(signal.ITIMER_REAL, max(outer - (time.monotonic() - start), 1e-3))


def review_against(
    root: Path,
    commit: str,
    against: str,
    merge_base: bool = False,
    consumers: tuple[Consumer, ...] = tuple(Consumer),
    time_limit: float | None = None,
) -> Report:
    """The working tree at ``root`` against ``commit`` (which the user called ``against``).

    The revision's side is copied and read within ``time_limit`` seconds (default
    REVISION_DEADLINE_S); messages about it name its files by their path in the
    repository, not in the temporary copy.
    """
    notes: list[str] = []
    try:
        after = read_side(root, TEMPLATE_DIR, notes, "working tree")
    except CodegenError as exc:
        raise CannotCompare(str(exc)) from None
    except ConfigError as exc:
        raise CannotCompare(f"error: {exc}") from None
    label = f"at {against} ({commit[:12]})"
    limit = REVISION_DEADLINE_S if time_limit is None else time_limit
    try:
        top = revision.toplevel(root)
        with deadline(limit, label), revision.tree_at(root, commit) as copy:

            def relative(text: str) -> str:
                for folder in (copy, copy.resolve()):
                    text = text.replace(f"{folder}/", "")
                return text

            try:
                before = read_revision_side(copy / root.relative_to(top), copy, notes, label)
                templates = template_changes(top, copy, against)
            except CodegenError as exc:
                raise CannotCompare(relative(f"{label}: {exc}")) from None
            except ConfigError as exc:
                raise CannotCompare(relative(f"error: {label}: {exc}")) from None
            notes = [relative(note) for note in notes]
    except revision.UnsafeRevision as exc:
        raise CannotCompare(f"error: {label}: {exc}") from None
    except revision.RevisionError as exc:
        raise CannotCompare(f"error: {exc}") from None
    return Report(
        against,
        commit[:12],
        merge_base,
        compare(before, after),
        consumers,
        tuple(notes),
        templates,
    )


def run(args: argparse.Namespace, fail: Callable[[str], None]) -> int:
    """Exit 0 (or 1 with ``--fail-on breaking`` and a breaking change); 2 when it cannot
    compare (no such revision, a side the reader rejects), saying why."""
    if not (args.against or args.merge_base):
        fail("`diff` needs --against REV or --merge-base REF")
    if args.check or args.diff or args.sources or args.bundle:
        fail(
            "`diff` reviews every configured source; it takes no --check, --diff, --source "
            "or bundle name"
        )
    root = args.root.resolve()
    try:
        if args.merge_base:
            commit, against = revision.merge_base(root, args.merge_base), args.merge_base
        else:
            commit, against = revision.resolve(root, args.against), args.against
        report = review_against(root, commit, against, bool(args.merge_base), args.consumers)
    except (revision.RevisionError, CannotCompare) as exc:
        text = str(exc) if isinstance(exc, CannotCompare) else f"error: {exc}"
        print(printable(text), file=sys.stderr)
        print("codegen diff: cannot compare", file=sys.stderr)
        return 2
    print(render_report(report, args.format), end="")
    if args.fail_on == "breaking" and report.breaking():
        names = ", ".join(c.title for c in report.breaking())
        print(f"codegen diff: breaking changes for {names}", file=sys.stderr)
        return 1
    return 0
