"""``codegen diff --against REV`` on a hostile revision: nothing REV holds is run.

REV is untrusted input (docs/review.md, "What `codegen diff` trusts"): its templates,
Python and configuration are read as data, never rendered, imported or executed, and
what cannot be compared safely is refused with exit code 2 within seconds. Each test
commits a hostile revision in a throw-away repository (review_support), puts the
working tree back to a harmless state, and runs the command in a subprocess with a
timeout, a canary file standing for any command REV could run.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
from codegen_support import run_main
from review_support import (
    GIT_ENV,
    OP_MODULE,
    PYPROJECT,
    SCALE,
    add_generator,
    commit,
    edit,
    git,
    make_project,
    run_diff,
)

from codegen import review_cli, revision

SCHEMA_TEMPLATE = "templates/_schema.j2"
OP_TEMPLATE = "templates/op_module.py.j2"


@pytest.fixture(autouse=True)
def _isolated_git(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in GIT_ENV.items():
        monkeypatch.setenv(key, value)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return make_project(tmp_path / "project")


@pytest.fixture
def tmpdir(tmp_path: Path) -> Path:
    """TMPDIR of the command: the revision's copy goes here, and is gone afterwards."""
    return tmp_path / "tmp"


def _commit_then_restore(project: Path, rel: str, text: str | bytes) -> str:
    """Commit ``rel`` holding ``text``, then put the working tree's ``rel`` back."""
    path = project / rel
    before = path.read_bytes()
    if isinstance(text, str):
        text = text.encode("utf-8")
    path.write_bytes(text)
    rev = commit(project, f"hostile {rel}")
    path.write_bytes(before)
    return rev


def _cannot_compare(result: subprocess.CompletedProcess[str], *phrases: str) -> None:
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert result.stderr.endswith("codegen diff: cannot compare\n"), result.stderr
    assert "Traceback" not in result.stderr
    for phrase in phrases:
        assert phrase in result.stderr, result.stderr


def _left_nothing(tmpdir: Path, *expected: str) -> None:
    """The revision's copy is removed and nothing was written beside it."""
    assert sorted(p.name for p in tmpdir.iterdir()) == sorted(expected)


# --- Links: resolved through the revision, never out of it ----------------------------


def _links_then_restore(project: Path, links: dict[str, str]) -> None:
    """Commit ``links`` (path -> target), then put the working tree back as it was."""
    saved = {rel: (project / rel).read_bytes() for rel in links if (project / rel).is_file()}
    for rel, target in links.items():
        path = project / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)
        path.symlink_to(target)
    commit(project, "links")
    for rel in links:
        (project / rel).unlink()
        if rel in saved:
            (project / rel).write_bytes(saved[rel])


def test_a_link_out_through_a_linked_folder_is_refused(project: Path, tmpdir: Path) -> None:
    """``esc/up -> ..`` is the tree's root, so ``esc/up/../x.toml`` is beside the tree."""
    tmpdir.mkdir()
    (tmpdir / "x.toml").write_text(
        PYPROJECT.replace('namespace = "demo"', 'namespace = "leaked"'), encoding="utf-8"
    )
    _links_then_restore(project, {"esc/up": "..", "pyproject.toml": "esc/up/../x.toml"})

    result = run_diff(project, "--against", "HEAD", tmpdir=tmpdir)

    assert "leaked" not in result.stdout
    _cannot_compare(
        result, "pyproject.toml: a link to `esc/up/../x.toml` that leads out of the revision"
    )
    _left_nothing(tmpdir, "x.toml")


def test_an_absolute_link_is_refused(project: Path, tmpdir: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside.py"
    outside.write_text((project / "demo/types.py").read_text(encoding="utf-8"), encoding="utf-8")
    _links_then_restore(project, {"demo/types.py": str(outside)})

    result = run_diff(project, "--against", "HEAD", tmpdir=tmpdir)

    _cannot_compare(result, f"demo/types.py: a link to `{outside}` that leads out of the revision")
    _left_nothing(tmpdir)


def test_a_chain_of_links_out_is_refused_at_its_first_link(project: Path, tmpdir: Path) -> None:
    _links_then_restore(
        project,
        {
            "demo/types.py": "../lib/first.py",
            "lib/first.py": "second.py",
            "lib/second.py": "../../outside.py",
        },
    )

    result = run_diff(project, "--against", "HEAD", tmpdir=tmpdir)

    _cannot_compare(
        result,
        "demo/types.py: a link to `../lib/first.py` that leads out of the revision "
        "(through `lib/second.py` -> `../../outside.py`)",
    )
    _left_nothing(tmpdir)


def _tree_error(project: Path) -> str:
    with pytest.raises(revision.UnsafeRevision) as exc:
        with revision.tree_at(project, revision.resolve(project, "HEAD")):
            pass
    return str(exc.value)


def test_a_cycle_of_links_is_refused(project: Path) -> None:
    (project / "demo/a.py").symlink_to("b.py")
    (project / "demo/b.py").symlink_to("a.py")
    commit(project, "a.py -> b.py -> a.py")

    assert _tree_error(project) == (
        "demo/a.py: a link that does not resolve (more than 40 links in a row: a cycle of links)"
    )


def test_a_link_to_a_folder_that_holds_it_is_refused(project: Path) -> None:
    (project / "lib").mkdir()
    (project / "lib/again").symlink_to("../lib")
    commit(project, "lib/again -> ../lib")

    assert _tree_error(project) == (
        "lib/again: a link to the folder `lib`, which holds the link: codegen diff copies no "
        "folder into itself"
    )


def test_folder_links_that_lead_to_each_other_are_refused(project: Path) -> None:
    for here, there in (("a", "b"), ("b", "a")):
        (project / here).mkdir()
        (project / here / "x.py").write_text("", encoding="utf-8")
        (project / here / "to").symlink_to(f"../{there}")
    commit(project, "a/to -> ../b, b/to -> ../a")

    assert _tree_error(project).startswith("a/to: a link to the folder `b`, which holds the link")


def test_folder_links_that_multiply_a_folder_stop_at_the_bounds(project: Path) -> None:
    """Two links a level to the next level: 2**16 paths to one file."""
    levels = 16
    for level in range(levels):
        (project / f"l{level}").mkdir()
        for name in ("x", "y"):
            (project / f"l{level}" / name).symlink_to(f"../l{level + 1}")
    (project / f"l{levels}").mkdir()
    (project / f"l{levels}/leaf.py").write_text("", encoding="utf-8")
    commit(project, "links that double a folder at every level")

    message = _tree_error(project)

    assert message.startswith(
        f"the revision's files to read exceed {revision.MAX_FILES} files or "
        f"{revision.MAX_TOTAL_BYTES} bytes (at l"
    )


# --- Paths, sizes, binary files -------------------------------------------------------


def test_a_tree_entry_named_dot_dot_writes_nothing_outside_the_copy(
    project: Path, tmpdir: Path
) -> None:
    """git refuses to check out such a tree, but a fetched one can hold it."""
    blob = git(project, "hash-object", "-w", "--stdin", input_text="x = 1\n")
    inner = git(project, "mktree", input_text=f"100644 blob {blob}\tevil.py\n")
    listing = git(project, "ls-tree", "HEAD")
    tree = git(project, "mktree", input_text=f"{listing}\n040000 tree {inner}\t..\n")
    crafted = git(project, "commit-tree", tree, "-p", "HEAD", "-m", "a `..` entry")

    result = run_diff(project, "--against", crafted, tmpdir=tmpdir)

    _left_nothing(tmpdir)
    _cannot_compare(result, "../evil.py: a path with a `..` component")


@pytest.mark.slow
def test_a_100_mb_source_file_is_refused_before_it_is_read(project: Path, tmpdir: Path) -> None:
    padding = b"# " + b"x" * 77 + b"\n"
    with (project / OP_MODULE).open("ab") as module:
        module.write(padding * (100 * 2**20 // len(padding)))
    commit(project, "a 100 MB op module")
    git(project, "checkout", "HEAD~1", "--", OP_MODULE)

    result = run_diff(project, "--against", "HEAD", tmpdir=tmpdir)

    _cannot_compare(result, "demo/scale.py: 104858", "more than the 1048576 bytes")
    _left_nothing(tmpdir)


def test_the_total_size_of_a_revision_is_bounded(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(revision, "MAX_TOTAL_BYTES", 1000)

    assert _tree_error(project).startswith(
        f"the revision's files to read exceed {revision.MAX_FILES} files or 1000 bytes (at "
    )


def test_a_nul_byte_in_a_module_the_reader_resolves_is_refused(project: Path, tmpdir: Path) -> None:
    types = (project / "demo/types.py").read_bytes()
    _commit_then_restore(project, "demo/types.py", types.replace(b"pass", b"pass  # \x00", 1))

    result = run_diff(project, "--against", "HEAD", tmpdir=tmpdir)

    _cannot_compare(result, "demo/types.py: a binary file (a NUL byte at offset")
    _left_nothing(tmpdir)


# --- Templates: REV's are never rendered ----------------------------------------------


def _hostile_template(project: Path, rel: str, line: str) -> None:
    add_generator(project)
    text = (project / rel).read_text(encoding="utf-8")
    _commit_then_restore(project, rel, line + "\n" + text)


def test_a_template_injection_at_rev_runs_nothing(
    project: Path, tmpdir: Path, tmp_path: Path
) -> None:
    canary = tmp_path / "canary"
    injection = f"{{{{ cycler.__init__.__globals__.os.system('touch {canary}') }}}}"
    _hostile_template(project, SCHEMA_TEMPLATE, injection)

    result = run_diff(project, "--against", "HEAD", tmpdir=tmpdir, own_generator=True)

    assert not canary.exists()
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("codegen diff: no bundle changes against HEAD (")
    assert "templates changed since HEAD" in result.stdout
    assert f"    -{injection}" in result.stdout  # shown as text, removed by the working tree
    _left_nothing(tmpdir)


def test_a_template_that_loops_for_ever_at_rev_is_not_rendered(project: Path, tmpdir: Path) -> None:
    _hostile_template(project, OP_TEMPLATE, "{% for i in range(10 ** 15) %}{% endfor %}")

    result = run_diff(project, "--against", "HEAD", tmpdir=tmpdir, own_generator=True)

    assert result.returncode == 0, result.stderr
    assert "changed templates/op_module.py.j2" in result.stdout
    _left_nothing(tmpdir)


def test_a_template_of_nested_loops_at_rev_is_not_rendered(project: Path, tmpdir: Path) -> None:
    loops = (
        "{% for a in range(10 ** 6) %}{% for b in range(10 ** 6) %}{{ a * b }}"
        "{% endfor %}{% endfor %}"
    )
    _hostile_template(project, SCHEMA_TEMPLATE, loops)

    result = run_diff(project, "--against", "HEAD", tmpdir=tmpdir, own_generator=True)

    assert result.returncode == 0, result.stderr
    assert "changed templates/_schema.j2" in result.stdout
    _left_nothing(tmpdir)


def test_a_template_that_is_not_text_at_rev_is_named_not_shown(project: Path, tmpdir: Path) -> None:
    add_generator(project)
    _commit_then_restore(project, SCHEMA_TEMPLATE, b"{{ row }}\xff\xfe\n")

    result = run_diff(project, "--against", "HEAD", tmpdir=tmpdir, own_generator=True)

    assert result.returncode == 0, result.stderr
    assert "  changed templates/_schema.j2\n    (not UTF-8 text: not shown)\n" in result.stdout
    assert "note:" not in result.stdout
    _left_nothing(tmpdir)


def test_a_template_diff_is_bounded(project: Path, tmpdir: Path) -> None:
    add_generator(project)
    lines = {"templates/long.j2": 3000, "templates/many.j2": 1000}
    for rel, count in lines.items():
        (project / rel).write_text("".join(f"{{# {i} #}}\n" for i in range(count)), "utf-8")
    commit(project, "templates with many lines")
    for rel in lines:
        (project / rel).unlink()

    result = run_diff(project, "--against", "HEAD", tmpdir=tmpdir, own_generator=True)

    assert result.returncode == 0, result.stderr
    assert (
        "  removed templates/long.j2\n    (31890 bytes at HEAD, 0 now: too large to show as a "
        "diff)\n" in result.stdout
    )
    assert "  removed templates/many.j2\n" in result.stdout
    assert "    (603 more diff lines not shown)\n" in result.stdout
    assert len(result.stdout.splitlines()) < 420
    _left_nothing(tmpdir)


# --- Python and configuration at REV: read as data ------------------------------------


def test_python_files_at_rev_are_never_imported_or_run(
    project: Path, tmpdir: Path, tmp_path: Path
) -> None:
    canary = tmp_path / "canary"
    payload = f"import pathlib\npathlib.Path({str(canary)!r}).write_text('ran')\n"
    hostile = {
        "sitecustomize.py": payload,
        "usercustomize.py": payload,
        "conftest.py": payload,
        "evil.pth": f"import pathlib; pathlib.Path({str(canary)!r}).write_text('ran')\n",
        "demo/conftest.py": payload,
        "demo/__init__.py": payload,
        "demo/types.py": payload + (project / "demo/types.py").read_text(encoding="utf-8"),
        OP_MODULE: SCALE.replace("import torch\n", "import torch\n\n" + payload),
        "ruff.toml": "line-length = 1\n",
    }
    for rel, text in hostile.items():
        (project / rel).write_text(text, encoding="utf-8")
    commit(project, "a revision that runs code when imported")
    for rel in hostile:
        (project / rel).unlink()
    git(project, "checkout", "HEAD~1", "--", ".")

    result = run_diff(project, "--against", "HEAD", tmpdir=tmpdir)

    assert not canary.exists()
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("codegen diff: no bundle changes against HEAD (")
    _left_nothing(tmpdir)


def test_a_review_runs_no_program_but_git(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """REV's text reaches no formatter, linter or shell: only git reads the revision."""
    edit(project, "    factor: float\n    mode", "    mode")
    started: list[str] = []
    popen = subprocess.Popen

    def record(args: list[str], *rest: object, **kwargs: object) -> subprocess.Popen:
        started.append(args[0])
        return popen(args, *rest, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr(subprocess, "Popen", record)

    result = run_main("--root", str(project), "diff", "--against", "HEAD")

    assert result.rc == 0, result.err
    assert "FIELD_REMOVED ScaleFwdArgs.factor" in result.out
    assert started and set(started) == {"git"}


def test_a_configuration_that_is_not_utf8_at_rev_is_a_clear_error(
    project: Path, tmpdir: Path
) -> None:
    _commit_then_restore(project, "pyproject.toml", PYPROJECT.encode() + b"# \xe9\n")

    result = run_diff(project, "--against", "HEAD", tmpdir=tmpdir)

    _cannot_compare(
        result,
        "error: at HEAD (",
        "): pyproject.toml: cannot read the generator config: 'utf-8' codec can't decode",
    )
    _left_nothing(tmpdir)


def test_a_source_root_out_of_the_revision_is_refused(
    project: Path, tmpdir: Path, tmp_path: Path
) -> None:
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "demo").mkdir(parents=True)
    (elsewhere / OP_MODULE).write_text(
        SCALE.replace("    factor: float\n", "    factor: float\n    leaked: int = 0\n", 1),
        encoding="utf-8",
    )
    _commit_then_restore(
        project,
        "pyproject.toml",
        PYPROJECT.replace(
            'namespace = "demo"\n', f'namespace = "demo"\nsource_root = "{elsewhere}"\n'
        ),
    )

    result = run_diff(project, "--against", "HEAD", tmpdir=tmpdir)

    assert "leaked" not in result.stdout
    _cannot_compare(result, "pyproject.toml: source_root", "outside the revision")
    _left_nothing(tmpdir)


def test_a_source_root_naming_an_environment_variable_is_not_expanded(
    project: Path, tmpdir: Path
) -> None:
    _commit_then_restore(
        project,
        "pyproject.toml",
        PYPROJECT.replace(
            'namespace = "demo"\n', 'namespace = "demo"\nsource_root = "${REVIEW_SECRET}"\n'
        ),
    )

    result = run_diff(
        project, "--against", "HEAD", tmpdir=tmpdir, env={"REVIEW_SECRET": "s3cr3t-t0ken"}
    )

    assert "s3cr3t-t0ken" not in result.stdout + result.stderr
    _cannot_compare(result, "source_root", "not expanded")
    _left_nothing(tmpdir)


def test_a_revision_does_not_see_the_environment(project: Path, tmpdir: Path) -> None:
    """Nothing in REV's configuration names the reviewer's environment or home."""
    _commit_then_restore(
        project,
        "pyproject.toml",
        PYPROJECT.replace('namespace = "demo"\n', 'namespace = "demo"\nsource_root = "~"\n'),
    )

    result = run_diff(project, "--against", "HEAD", tmpdir=tmpdir)

    assert "read under source_root" not in result.stderr
    _cannot_compare(result, "source_root", "not expanded")


def test_a_sources_pattern_with_two_recursive_globs_is_refused(project: Path, tmpdir: Path) -> None:
    deep = project / "/".join(["d"] * 150)
    deep.mkdir(parents=True)
    (deep / "x.py").write_text("", encoding="utf-8")
    _commit_then_restore(
        project,
        "pyproject.toml",
        PYPROJECT.replace('["demo/scale.py"]', '["**/**/**/**/scale.py"]'),
    )

    result = run_diff(project, "--against", "HEAD", tmpdir=tmpdir)

    _cannot_compare(result, "`**/**/**/**/scale.py`", "more than one `**`")
    _left_nothing(tmpdir)


@pytest.mark.parametrize("entry", ["../*/scale.py", "/etc/*.py", "demo/../../**/*.py"])
def test_a_sources_entry_out_of_the_revision_is_refused_before_it_is_globbed(
    project: Path, entry: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _commit_then_restore(
        project, "pyproject.toml", PYPROJECT.replace('["demo/scale.py"]', f'["{entry}"]')
    )
    globbed: list[str] = []
    glob = Path.glob

    def record(self: Path, pattern: str) -> object:
        globbed.append(pattern)
        return glob(self, pattern)

    monkeypatch.setattr(Path, "glob", record)

    result = run_main("--root", str(project), "diff", "--against", "HEAD")

    assert entry not in globbed
    assert result.rc == 2
    assert f"pyproject.toml: sources entry `{entry}` leads out of the revision" in result.err


def test_an_op_module_over_its_bound_is_refused_before_libcst_reads_it(project: Path) -> None:
    padding = "# " + "x" * 77 + "\n"
    _commit_then_restore(project, OP_MODULE, SCALE + padding * (300 * 1024 // len(padding)))

    result = run_main("--root", str(project), "diff", "--against", "HEAD")

    assert result.rc == 2
    assert ": demo/scale.py: 307935 bytes, more than" in result.err
    assert "more than the 262144 bytes codegen diff reads as a revision's op module" in result.err


def test_a_module_libcst_parses_for_an_alias_counts_against_the_bound(project: Path) -> None:
    """An op module under its bound can still make libcst parse a 1 MiB module for a
    type alias: everything libcst parses at REV is bounded together."""
    types = (project / "demo/types.py").read_text(encoding="utf-8")
    types += "\nimport torch\nfrom typing import Optional\n\nMaybeTensor = Optional[torch.Tensor]\n"
    statement = "_pad_{:07} = 1\n"  # code, not comments: libcst's work is per node
    count = (1_048_000 - len(types)) // len(statement.format(0))
    types += "".join(statement.format(i) for i in range(count))
    (project / "demo/types.py").write_text(types, encoding="utf-8")
    edit(project, "from demo.types import Recipe", "from demo.types import MaybeTensor, Recipe")
    edit(project, "    bias: Optional[torch.Tensor] = None", "    bias: MaybeTensor = None")
    commit(project, "an alias from a module of 1 MB")
    git(project, "checkout", "HEAD~1", "--", ".")

    result = run_main("--root", str(project), "diff", "--against", "HEAD")

    assert result.rc == 2, result.out
    assert (
        "): demo/types.py:1:1: error: with this module, libcst would parse more than the "
        "1048576 bytes it may parse here"
    ) in result.err


def test_a_relative_import_above_the_top_level_looks_for_no_file_out_of_the_revision(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a top-level module, `from .etc.x import y` names the module `.etc.x`, which as a
    path (`/etc/x.py`) is out of the root."""
    (project / "scale.py").write_text(
        SCALE.replace("from demo.types import Recipe", "from .etc.teops_probe import Recipe"),
        encoding="utf-8",
    )
    (project / OP_MODULE).unlink()
    edit(project, '"demo/scale.py"', '"scale.py"', rel="pyproject.toml")
    commit(project, "a top-level op module")
    git(project, "checkout", "HEAD~1", "--", ".")
    (project / "scale.py").unlink()
    looked: list[str] = []
    is_file = Path.is_file

    def record(self: Path) -> bool:
        looked.append(str(self))
        return is_file(self)

    monkeypatch.setattr(Path, "is_file", record)

    result = run_main("--root", str(project), "diff", "--against", "HEAD")

    assert not [path for path in looked if path.startswith("/etc/")]
    assert result.rc == 2


def test_reading_a_revision_stops_at_the_deadline(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def slow(*args: object) -> None:
        time.sleep(30)

    monkeypatch.setattr(review_cli, "read_revision_side", slow)
    start = time.monotonic()

    with pytest.raises(review_cli.CannotCompare) as exc:
        review_cli.review_against(
            project, revision.resolve(project, "HEAD"), "HEAD", time_limit=0.5
        )

    assert time.monotonic() - start < 10
    assert str(exc.value).startswith("error: at HEAD (")
    assert "reading the revision took more than 0.5 s" in str(exc.value)


# --- What reaches the terminal --------------------------------------------------------


def test_control_characters_from_rev_reach_the_terminal_escaped(
    project: Path, tmpdir: Path
) -> None:
    """A file name is any bytes but `/` and NUL; an error that names it prints it escaped."""
    name = "demo/\x1b]0;owned\x07\u202ecod.py"
    (project / name).write_text(SCALE.replace('"scale"', '"other"'), encoding="utf-8")
    commit(project, "an op module no entry of `sources` lists")
    (project / name).unlink()

    result = run_diff(project, "--against", "HEAD", tmpdir=tmpdir)

    assert not any(c in result.stdout + result.stderr for c in "\x1b\x07\u202e")
    _cannot_compare(result, "demo/\\x1b]0;owned\\x07\\u202ecod.py:")
    _left_nothing(tmpdir)


def test_printable_escapes_what_a_terminal_acts_on() -> None:
    assert review_cli.printable("a\tb\nc\rd\x1b[2J\x9b\u2066e\u00e9") == (
        "a\tb\nc\\x0dd\\x1b[2J\\x9b\\u2066e\u00e9"
    )
