"""``python -m codegen diff --against REV``: each bundle change, classified per consumer.

Every test commits the small project of review_support in a throw-away git repository,
edits its working tree and reviews the edit against a revision. The Markdown report is
compared with golden/review_scale.md; after an intended change, regenerate it with::

    UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/codegen -k golden -p no:cacheprovider
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from codegen_support import REPO_ROOT, run_main
from review_support import (
    GIT_ENV,
    OP_MODULE,
    add_generator,
    commit,
    edit,
    git,
    make_project,
    run_diff,
)

from codegen import revision
from codegen.pipeline import TEMPLATE_DIR
from codegen.review import RULES, Consumer, Finding, OpSide, compare
from codegen.review_cli import (
    Report,
    TemplateChange,
    read_side,
    render_report,
    review_against,
)
from codegen.schema_text import Schema

GOLDEN = Path(__file__).resolve().parent / "golden" / "review_scale.md"
KEYWORD, POSITIONAL, COMPILED, EXPORTED = tuple(Consumer)


@pytest.fixture(autouse=True)
def _isolated_git(monkeypatch: pytest.MonkeyPatch) -> None:
    """The generator's own git calls see no user or system configuration either."""
    for key, value in GIT_ENV.items():
        monkeypatch.setenv(key, value)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return make_project(tmp_path / "project")


def review(root: Path, rev: str = "HEAD") -> Report:
    return review_against(root, revision.resolve(root, rev), rev)


def only_finding(report: Report, rule: str) -> Finding:
    found = [f for r in report.reviews for f in r.findings if f.rule == rule]
    assert len(found) == 1, [f.rule for r in report.reviews for f in r.findings]
    return found[0]


def rules(report: Report) -> list[str]:
    return [f.rule for r in report.reviews for f in r.findings]


# --- Field changes -----------------------------------------------------------------------


def test_appending_an_optional_field_is_compatible_for_callers_and_breaks_exported_programs(
    project: Path,
) -> None:
    edit(
        project,
        "    bias: Optional[torch.Tensor] = None\n",
        "    bias: Optional[torch.Tensor] = None\n    scale_out: Optional[torch.Tensor] = None\n",
    )

    report = review(project)

    finding = only_finding(report, "FIELD_ADDED")
    assert finding.subject == "ScaleFwdArgs.scale_out"
    assert "added at position 6 of 6" in finding.summary
    assert not finding.verdict(KEYWORD).breaking
    assert "default" in finding.verdict(KEYWORD).reason
    assert not finding.verdict(POSITIONAL).breaking
    assert finding.verdict(COMPILED).breaking
    assert finding.verdict(EXPORTED).breaking
    assert "no schema default for `scale_out`" in finding.verdict(EXPORTED).reason
    (change,) = report.reviews[0].schemas
    assert change.before is not None and change.after is not None
    assert change.after.text == change.before.text.replace(
        ") -> Tensor[]", ", Tensor? scale_out) -> Tensor[]"
    )


def test_a_required_field_inserted_in_the_middle_breaks_keyword_and_positional_callers(
    project: Path,
) -> None:
    edit(project, "    factor: float\n    mode", "    factor: float\n    steps: int\n    mode")

    finding = only_finding(review(project), "FIELD_ADDED")

    assert finding.verdict(KEYWORD).breaking
    assert "without `steps=` raises" in finding.verdict(KEYWORD).reason
    assert finding.verdict(POSITIONAL).breaking
    assert "inserted before `mode`" in finding.verdict(POSITIONAL).reason
    assert finding.verdict(COMPILED).reason.startswith(
        "new slot(s) `SymInt steps` at slot index 2, shifting the 3 slot(s) after it:"
    )


def test_removing_a_field_breaks_every_consumer_with_the_reason(project: Path) -> None:
    edit(project, '    mode: Literal["fast", "exact"]\n', "")

    finding = only_finding(review(project), "FIELD_REMOVED")

    assert finding.subject == "ScaleFwdArgs.mode"
    assert all(finding.verdict(c).breaking for c in Consumer)
    assert "ScaleFwdArgs(mode=...)` raises" in finding.verdict(KEYWORD).reason
    assert "from `recipe` on fill the wrong fields" in finding.verdict(POSITIONAL).reason
    assert finding.verdict(COMPILED).reason.startswith(
        "slot(s) `str mode` removed from slot index 2, shifting the 2 slot(s) after it:"
    )
    assert "drops its `mode` silently" in finding.verdict(EXPORTED).reason


def test_retyping_a_field_breaks_every_consumer_with_the_slots_before_and_after(
    project: Path,
) -> None:
    edit(project, "    factor: float\n    mode", "    factor: int\n    mode")

    finding = only_finding(review(project), "FIELD_TYPE_CHANGED")

    assert finding.subject == "ScaleFwdArgs.factor"
    assert finding.summary == "`float` -> `int` (kind scalar)"
    assert all(finding.verdict(c).breaking for c in Consumer)
    assert "`float factor` -> `SymInt factor`" in finding.verdict(COMPILED).reason


def test_reordering_fields_breaks_positional_callers_and_saved_graphs_only(project: Path) -> None:
    edit(project, "    factor: float\n    mode: Literal", "    mode: Literal")
    edit(project, '"exact"]\n', '"exact"]\n    factor: float\n')

    finding = only_finding(review(project), "FIELD_MOVED")

    assert finding.summary == "`factor` moved from position 2 of 5 to position 3 of 5"
    assert not finding.verdict(KEYWORD).breaking
    assert finding.verdict(POSITIONAL).breaking
    assert finding.verdict(COMPILED).breaking
    assert "by position" in finding.verdict(COMPILED).reason
    assert not finding.verdict(EXPORTED).breaking
    assert "matched by name" in finding.verdict(EXPORTED).reason


def test_making_a_field_optional_is_compatible_everywhere(project: Path) -> None:
    edit(project, "    inp: torch.Tensor\n", "    inp: Optional[torch.Tensor]\n")

    finding = only_finding(review(project), "FIELD_TYPE_WIDENED")

    assert not finding.breaks()
    assert "`Tensor inp` -> `Tensor? inp`" in finding.verdict(COMPILED).reason


def test_literal_choices_added_are_compatible_and_removed_ones_break(project: Path) -> None:
    edit(project, 'Literal["fast", "exact"]', 'Literal["fast", "exact", "fused"]')
    added = only_finding(review(project), "FIELD_CHOICES_ADDED")
    assert not added.breaks()
    assert "'fused'" in added.summary

    edit(project, 'Literal["fast", "exact", "fused"]', 'Literal["exact"]')
    removed = only_finding(review(project), "FIELD_CHOICES_REMOVED")
    assert all(removed.verdict(c).breaking for c in Consumer)
    assert "'fast'" in removed.verdict(EXPORTED).reason


def test_a_default_added_is_compatible_everywhere(project: Path) -> None:
    edit(project, "recipe: Optional[Recipe]\n", "recipe: Optional[Recipe] = None\n")

    finding = only_finding(review(project), "FIELD_DEFAULT_ADDED")

    assert finding.summary == "`recipe` now defaults to `None`"
    assert not finding.breaks()


def test_a_default_removed_breaks_callers_only(project: Path) -> None:
    edit(project, "bias: Optional[torch.Tensor] = None", "bias: Optional[torch.Tensor]")

    finding = only_finding(review(project), "FIELD_DEFAULT_REMOVED")

    assert finding.verdict(KEYWORD).breaking and finding.verdict(POSITIONAL).breaking
    assert not finding.verdict(COMPILED).breaking and not finding.verdict(EXPORTED).breaking


@pytest.mark.parametrize(
    "spelling", ["(None)", "field(default=None)", "dataclasses.field(default=None)"]
)
def test_the_same_default_spelled_otherwise_reports_nothing(project: Path, spelling: str) -> None:
    edit(
        project, "bias: Optional[torch.Tensor] = None", f"bias: Optional[torch.Tensor] = {spelling}"
    )

    assert review(project).reviews == ()


def test_a_changed_default_is_breaking_for_callers_that_leave_it_out(project: Path) -> None:
    edit(project, "bias: Optional[torch.Tensor] = None", "bias: Optional[torch.Tensor] = 0")

    finding = only_finding(review(project), "FIELD_DEFAULT_CHANGED")

    assert finding.verdict(KEYWORD).reason == (
        "a caller that leaves `bias` out now gets `0`, silently"
    )
    assert not finding.verdict(EXPORTED).breaking


def test_a_docstring_or_comment_change_reports_nothing(project: Path) -> None:
    edit(project, '"""What the forward reads."""', '"""What the forward reads, reworded."""')
    edit(project, "    factor: float\n    mode", "    factor: float  # a comment\n    mode")
    edit(project, '"""A small op to review', '"""A small, documented op to review')

    assert review(project).reviews == ()
    result = run_main("--root", str(project), "diff", "--against", "HEAD", "--fail-on", "breaking")
    assert result.rc == 0, result.err
    assert result.out.startswith("codegen diff: no bundle changes against HEAD (")


# --- Op-level and configuration changes --------------------------------------------------


def test_a_namespace_change_in_the_configuration_is_reported(project: Path) -> None:
    edit(project, 'namespace = "demo"', 'namespace = "demo2"', rel="pyproject.toml")

    report = review(project)

    finding = only_finding(report, "OP_QUALNAME_CHANGED")
    assert finding.summary == (
        "`demo::scale_fwd` -> `demo2::scale_fwd`; `demo::scale_bwd` -> `demo2::scale_bwd`"
    )
    assert not finding.verdict(KEYWORD).breaking
    assert finding.verdict(COMPILED).breaking
    assert finding.verdict(EXPORTED).breaking
    assert [c.after.qualname for c in report.reviews[0].schemas if c.after] == [
        "demo2::scale_fwd",
        "demo2::scale_bwd",
    ]


def test_a_kind_change_in_the_configuration_is_a_retyped_field(project: Path) -> None:
    edit(
        project,
        'value = ["demo.types.Recipe"]',
        'quantizer = ["demo.types.Recipe"]',
        rel="pyproject.toml",
    )
    edit(project, 'quantizer = ["demo.types.Quantizer"]\n', "", rel="pyproject.toml")

    finding = only_finding(review(project), "FIELD_TYPE_CHANGED")

    assert finding.subject == "ScaleFwdArgs.recipe"
    assert finding.summary == (
        "`Optional[Recipe]`: kind value -> quantizer, from the configuration "
        "(the annotation is unchanged)"
    )
    assert finding.breaks()


def test_grad_fields_and_bundle_names_are_op_level_findings(project: Path) -> None:
    edit(project, 'grad_fields=("inp",)', 'grad_fields=("inp", "bias")')
    edit(project, "class ScaleBwdArgs", "class ScaleBackwardArgs")
    edit(project, "backward=ScaleBwdArgs", "backward=ScaleBackwardArgs")

    report = review(project)

    assert rules(report) == ["OP_GRAD_FIELDS_CHANGED", "BUNDLE_RENAMED"]
    renamed = only_finding(report, "BUNDLE_RENAMED")
    assert renamed.verdict(KEYWORD).breaking and not renamed.verdict(COMPILED).breaking


def test_an_added_and_a_removed_op(project: Path) -> None:
    (project / "demo/shift.py").write_text(
        (project / OP_MODULE)
        .read_text(encoding="utf-8")
        .replace("Scale", "Shift")
        .replace('"scale"', '"shift"')
        .replace("SCALE", "SHIFT"),
        encoding="utf-8",
    )
    (project / OP_MODULE).unlink()  # an op module left unlisted is an error of its own
    edit(project, '"demo/scale.py"', '"demo/shift.py"', rel="pyproject.toml")

    report = review(project)

    assert [(r.name, [f.rule for f in r.findings]) for r in report.reviews] == [
        ("scale", ["OP_REMOVED"]),
        ("shift", ["OP_ADDED"]),
    ]
    assert report.breaking() == list(Consumer)


def test_a_field_of_an_unsupported_kind_adds_no_slot(project: Path) -> None:
    edit(project, "from typing import Literal", "from typing import Any, Literal")
    edit(
        project,
        "    bias: Optional[torch.Tensor] = None\n",
        "    bias: Optional[torch.Tensor] = None\n    hook: Any = None\n",
    )

    finding = only_finding(review(project), "FIELD_ADDED")

    assert not finding.breaks()
    assert finding.verdict(EXPORTED).reason == "it adds no schema slot (its value must be None)"


def test_a_meta_type_change_in_the_configuration_is_a_slot_finding(project: Path) -> None:
    edit(
        project,
        'quantizer = ["demo.types.Quantizer"]',
        'quantizer = ["demo.types.Quantizer"]\ntensor_or_quantized = ["demo.types.Quantized"]',
        rel="pyproject.toml",
    )
    edit(project, "from demo.types import Recipe", "from demo.types import Quantized, Recipe")
    edit(project, "    inp: torch.Tensor\n", "    inp: torch.Tensor\n    w: Quantized\n")
    edit(
        project,
        "class Recipe:",
        "class Quantized:\n    pass\n\n\nclass Recipe:",
        rel="demo/types.py",
    )
    commit(project, "a tensor-or-quantized field")
    edit(project, 'meta_type = "str"', 'meta_type = "demo.Meta"', rel="pyproject.toml")

    finding = only_finding(review(project), "SLOT_TYPE_CHANGED")

    assert finding.subject == "demo::scale_fwd: w__meta"
    assert finding.summary == "slot `str w__meta` -> `demo.Meta w__meta` (field `w`)"
    assert [finding.verdict(c).breaking for c in Consumer] == [False, False, True, True]


def _with_forward_schema(side: dict[str, OpSide], text: str) -> dict[str, OpSide]:
    op = side["scale"]
    return {"scale": replace(op, forward=Schema(op.forward.qualname, text))}


FORWARD = "(Tensor inp, float factor, str mode, str? recipe, Tensor? bias) -> Tensor[]"


@pytest.mark.parametrize(
    ("schema", "rule", "verdicts"),
    [
        (FORWARD.replace(") ->", ", bool extra) ->"), "SLOT_ADDED", "✓✓✗✗"),
        (FORWARD.replace(") ->", ", bool extra=False) ->"), "SLOT_ADDED", "✓✓✗✓"),
        (FORWARD.replace(", Tensor? bias", ""), "SLOT_REMOVED", "✓✓✗✗"),
        (FORWARD.replace("str mode", "str? mode"), "SLOT_TYPE_CHANGED", "✓✓✓✓"),
        (FORWARD.replace("float factor", "SymInt factor"), "SLOT_TYPE_CHANGED", "✓✓✗✗"),
        (FORWARD.replace("float factor, str mode", "str mode, float factor"), "SLOT_MOVED", "✓✓✗✓"),
        (FORWARD.replace("str? recipe", "str? recipe=None"), "SLOT_DEFAULT_CHANGED", "✓✓✓✓"),
        (FORWARD.replace("-> Tensor[]", "-> Tensor"), "SCHEMA_RETURNS_CHANGED", "✓✓✗✗"),
        (FORWARD.replace(", ", " , "), "SCHEMA_TEXT_CHANGED", "✓✓✓✓"),
    ],
)
def test_schema_changes_no_field_explains_are_slot_findings(
    project: Path, schema: str, rule: str, verdicts: str
) -> None:
    before = read_side(project, TEMPLATE_DIR, [], "before")
    assert before["scale"].forward.text == FORWARD

    (op,) = compare(before, _with_forward_schema(before, schema))

    (finding,) = op.findings
    assert finding.rule == rule
    assert "".join("✗" if finding.verdict(c).breaking else "✓" for c in Consumer) == verdicts
    assert [c.role for c in op.schemas] == ["forward"]


def test_a_removed_schema_default_breaks_exported_programs(project: Path) -> None:
    with_default = _with_forward_schema(
        read_side(project, TEMPLATE_DIR, [], "before"),
        FORWARD.replace("str? recipe", "str? recipe=None"),
    )
    (op,) = compare(with_default, read_side(project, TEMPLATE_DIR, [], "after"))

    (finding,) = op.findings
    assert finding.rule == "SLOT_DEFAULT_CHANGED"
    assert finding.verdict(EXPORTED).breaking
    assert "left `recipe` out" in finding.verdict(EXPORTED).reason


# --- Templates ---------------------------------------------------------------------------


def test_a_template_change_to_the_schema_is_a_slot_finding(project: Path, tmp_path: Path) -> None:
    templates = shutil.copytree(TEMPLATE_DIR, tmp_path / "templates")
    schema = templates / "_schema.j2"
    text = schema.read_text(encoding="utf-8")
    # Every optional slot gets a schema default, as a later format might write them.
    schema.write_text(
        text.replace(
            "{{ row[3] }} {{ row[2] }}",
            "{{ row[3] }} {{ row[2] }}{{ '=None' if row[3].endswith('?') }}",
        ),
        encoding="utf-8",
    )
    notes: list[str] = []
    before = read_side(project, TEMPLATE_DIR, notes, "before")
    after = read_side(project, templates, notes, "after")

    (op,) = compare(before, after)

    assert notes == []
    assert [f.rule for f in op.findings] == ["SLOT_DEFAULT_CHANGED"] * 2
    assert op.findings[0].subject == "demo::scale_fwd: recipe"
    assert not any(f.breaks() for f in op.findings)


def test_templates_that_do_not_render_leave_the_schemas_of_the_bundles_with_a_note(
    project: Path, tmp_path: Path
) -> None:
    templates = shutil.copytree(TEMPLATE_DIR, tmp_path / "templates")
    (templates / "_schema.j2").write_text("{{ b.no_such_key }}\n", encoding="utf-8")
    notes: list[str] = []

    side = read_side(project, templates, notes, "at REV")

    assert side["scale"].forward.qualname == "demo::scale_fwd"
    assert side["scale"].forward.text.startswith("(Tensor inp, float factor, str mode")
    assert len(notes) == 1 and notes[0].startswith("at REV: demo/scale.py: its schemas come")


def test_a_template_change_at_rev_is_shown_as_text_never_rendered(
    project: Path, tmp_path: Path
) -> None:
    """A repository holding the generator (as this one does): REV's templates are
    untrusted, so both sides render with the working tree's and REV's show as a diff."""
    add_generator(project)
    edit(
        project,
        "{{ row[3] }} {{ row[2] }}",
        "{{ row[3] }} {{ row[2] }}{{ '=None' if row[3].endswith('?') }}",
        rel="templates/_schema.j2",
    )

    result = run_diff(project, "--against", "HEAD", tmpdir=tmp_path / "tmp", own_generator=True)

    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("codegen diff: no bundle changes against HEAD (")
    assert "SLOT_DEFAULT_CHANGED" not in result.stdout
    assert "\n  changed templates/_schema.j2\n    --- HEAD:templates/_schema.j2\n" in result.stdout
    assert "    +++ templates/_schema.j2\n" in result.stdout
    assert (
        """    +    "{{ ", " if not loop.first }}{{ row[3] }} {{ row[2] }}{{ '=None' if """
        """row[3].endswith('?') }}"\n"""
    ) in result.stdout
    assert "note:" not in result.stdout


def test_a_template_diff_in_markdown_stays_in_its_fence() -> None:
    """A template line with backticks neither closes the diff's fence nor its name's span."""
    change = TemplateChange("templates/a`b.j2", "changed", ("--- x", "+``` not a fence"))
    report = Report("HEAD", "0" * 12, False, (), tuple(Consumer), (), (change,))

    text = render_report(report, "markdown")

    assert "``templates/a`b.j2`` (changed)\n\n````diff\n--- x\n+``` not a fence\n````\n" in text


# --- The command -------------------------------------------------------------------------


def _normalized_report(project: Path, *argv: str) -> str:
    result = run_main("--root", str(project), "diff", *argv)
    assert result.rc == 0, result.err
    base = revision.resolve(project, "HEAD")
    return result.out.replace(base[:12], "<commit>")


def test_markdown_report_matches_the_golden_file(project: Path) -> None:
    edit(
        project,
        "    bias: Optional[torch.Tensor] = None\n",
        "    bias: Optional[torch.Tensor] = None\n    out_dtype: Optional[torch.dtype] = None\n",
    )
    edit(project, 'Literal["fast", "exact"]', 'Literal["exact"]')
    edit(
        project,
        "    grad_outputs: list[torch.Tensor]\n    factor: float\n",
        "    factor: float\n    grad_outputs: list[torch.Tensor]\n",
    )

    text = _normalized_report(project, "--against", "HEAD", "--format", "markdown")

    if os.environ.get("UPDATE_GOLDEN"):
        GOLDEN.write_text(text, encoding="utf-8")
    assert text == GOLDEN.read_text(encoding="utf-8")


def test_fail_on_breaking_exits_1_and_names_the_consumers(project: Path) -> None:
    edit(project, "    factor: float\n    mode", "    mode")

    failing = run_main("--root", str(project), "diff", "--against", "HEAD", "--fail-on", "breaking")
    reported = run_main("--root", str(project), "diff", "--against", "HEAD")
    keyword_only = run_main(
        "--root",
        str(project),
        "diff",
        "--against",
        "HEAD",
        "--fail-on",
        "breaking",
        "--consumers",
        "keyword",
    )

    assert failing.rc == 1
    assert failing.err.strip() == (
        "codegen diff: breaking changes for keyword callers, positional callers, "
        "saved compiled graphs, exported programs"
    )
    assert reported.rc == 0 and "FIELD_REMOVED ScaleFwdArgs.factor" in reported.out
    assert keyword_only.rc == 1 and "exported programs" not in keyword_only.out


def test_fail_on_breaking_passes_a_compatible_change(project: Path) -> None:
    edit(project, 'Literal["fast", "exact"]', 'Literal["fast", "exact", "fused"]')

    result = run_main("--root", str(project), "diff", "--against", "HEAD", "--fail-on", "breaking")

    assert result.rc == 0, result.out + result.err
    assert "0 breaking changes" in result.out


def test_merge_base_reviews_only_what_the_branch_changed(project: Path) -> None:
    git(project, "checkout", "-q", "-b", "feature")
    edit(project, "    factor: float\n    mode", "    factor: float\n    steps: int = 1\n    mode")
    commit(project, "feature: steps")
    git(project, "checkout", "-q", "main")
    edit(
        project,
        '"""What the backward reads."""',
        '"""What the backward reads."""\n\n    extra: bool = False',
    )
    commit(project, "main moves on")
    git(project, "checkout", "-q", "feature")

    result = run_main("--root", str(project), "diff", "--merge-base", "main")

    assert result.rc == 0, result.err
    assert "merge base of HEAD and main" in result.out
    assert "ScaleFwdArgs.steps" in result.out
    assert "extra" not in result.out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--against", "no-such-branch"), "error: no commit named `no-such-branch`"),
        (("--merge-base", "origin/main"), "error: no ref `origin/main` to review against"),
        (("--against=--all",), "error: not a revision: '--all'"),
    ],
)
def test_a_missing_revision_is_a_clear_error(
    project: Path, argv: tuple[str, ...], message: str
) -> None:
    result = run_main("--root", str(project), "diff", *argv)

    assert result.rc == 2
    assert result.err.startswith(message)
    assert "Traceback" not in result.err


def test_a_reader_error_at_rev_names_the_revision(project: Path) -> None:
    edit(project, "    factor: float\n    mode", "    factor: Unknown\n    mode")
    broken = commit(project, "factor: an annotation the generator cannot classify")
    edit(project, "    factor: Unknown\n    mode", "    factor: float\n    mode")

    result = run_main("--root", str(project), "diff", "--against", "HEAD")

    assert result.rc == 2
    assert result.err.startswith(f"at HEAD ({broken[:12]}): demo/scale.py:19:13: error: ")
    assert result.err.endswith("codegen diff: cannot compare\n")
    assert "Traceback" not in result.err


def test_diff_never_touches_the_working_tree_or_the_index(project: Path) -> None:
    edit(project, "    factor: float\n    mode", "    mode")
    git(project, "add", OP_MODULE)
    status, head = git(project, "status", "--porcelain"), git(project, "rev-parse", "HEAD")

    assert run_main("--root", str(project), "diff", "--against", "HEAD").rc == 0

    assert (git(project, "status", "--porcelain"), git(project, "rev-parse", "HEAD")) == (
        status,
        head,
    )


def test_the_review_options_need_the_diff_command(project: Path) -> None:
    with pytest.raises(SystemExit) as exc:
        run_main("--root", str(project), "--against", "HEAD")
    assert exc.value.code == 2
    with pytest.raises(SystemExit):
        run_main("--root", str(project), "diff")
    with pytest.raises(SystemExit):
        run_main("--root", str(project), "diff", "ScaleFwdArgs", "--against", "HEAD")
    with pytest.raises(SystemExit):
        run_main("--root", str(project), "diff", "--check", "--against", "HEAD")


def test_diff_of_this_repository_against_its_own_head_runs(tmp_path: Path) -> None:
    """The real op modules read on both sides, within the bounds a revision must keep (a
    corpus file that is not UTF-8 is the reader's to judge, not a refusal)."""
    result = run_main("--root", str(REPO_ROOT), "diff", "--against", "HEAD")
    assert result.rc == 0, result.err
    assert not [line for line in result.out.splitlines() if line.startswith("note:")]


def test_every_rule_is_documented_with_its_meaning() -> None:
    doc = (REPO_ROOT / "docs/review.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| `([A-Z_]+)` \| ([^|]+) \|", doc, re.MULTILINE)
    assert {rule: meaning.strip() for rule, meaning in rows} == RULES


def test_a_project_below_the_repository_root_is_read_at_its_place(tmp_path: Path) -> None:
    project = make_project(tmp_path / "repo" / "examples" / "demo", repository=tmp_path / "repo")
    edit(project, "    factor: float\n    mode", "    mode")

    report = review(project)

    assert rules(report) == ["FIELD_REMOVED"]


def test_outside_a_git_repository_diff_says_so(tmp_path: Path) -> None:
    result = run_main("--root", str(tmp_path), "diff", "--against", "HEAD")

    assert result.rc == 2
    assert result.err.startswith(f"error: {tmp_path} is not inside a git repository")


def test_export_attributes_do_not_change_what_is_read_at_rev(project: Path) -> None:
    (project / ".gitattributes").write_text(
        "demo/scale.py export-ignore\ndemo/types.py export-subst\n", encoding="utf-8"
    )
    edit(project, "class Quantizer:", "# $Format:%H$\nclass Quantizer:", rel="demo/types.py")
    commit(project, "export attributes")

    with revision.tree_at(project, revision.resolve(project, "HEAD")) as copy:
        assert (copy / OP_MODULE).read_text(encoding="utf-8") == (project / OP_MODULE).read_text(
            encoding="utf-8"
        )
        assert "$Format:%H$" in (copy / "demo/types.py").read_text(encoding="utf-8")
    assert review(project).reviews == ()


def test_links_inside_the_revision_are_copied_as_what_they_resolve_to(project: Path) -> None:
    """A link to a file, to a link or to a folder becomes a copy of what it resolves to, so
    the copy holds no link; a dangling link is no file, as in a checkout. (Links out of
    the revision are refused: test_codegen_review_hostile.)"""
    (project / "demo/inside.py").symlink_to("types.py")
    (project / "demo/again.py").symlink_to("inside.py")
    (project / "lib").symlink_to("demo")
    (project / "demo/dangling.py").symlink_to("nowhere.py")
    commit(project, "links")

    with revision.tree_at(project, revision.resolve(project, "HEAD")) as copy:
        types = (copy / "demo/types.py").read_bytes()
        for rel in ("demo/inside.py", "demo/again.py", "lib/types.py", "lib/again.py"):
            assert (copy / rel).read_bytes() == types, rel
        assert (copy / "lib/scale.py").read_bytes() == (copy / OP_MODULE).read_bytes()
        assert not (copy / "demo/dangling.py").exists()
        assert not any(path.is_symlink() for path in copy.rglob("*"))
    assert review(project).reviews == ()


def test_a_root_that_did_not_exist_at_rev_is_a_clear_error(tmp_path: Path) -> None:
    repository = tmp_path / "repo"
    make_project(repository / "first", repository=repository)
    later = repository / "later"
    shutil.copytree(repository / "first", later)

    result = run_main("--root", str(later), "diff", "--against", "HEAD")

    assert result.rc == 2
    assert result.err.startswith("error: `later` holds no file the generator reads at ")
