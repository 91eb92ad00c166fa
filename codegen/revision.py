"""A git revision of the project, read into a private temporary folder.

``codegen diff`` reads the "before" side of a review with the generator's own reader,
so it needs REV's files as files. They come from ``git archive`` into a fresh temporary
folder: the user's working tree, index and HEAD are never touched.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path

# What the generator reads: op modules and the modules they import, the configuration,
# the templates. Everything else in the archive (images, data) is skipped.
_READ_SUFFIXES = (".py", ".pyi", ".toml", ".j2")


class RevisionError(Exception):
    """A revision that cannot be read: not a git repository, no such ref, no merge base."""


def _git(root: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    try:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, check=False)
    except OSError as exc:
        raise RevisionError(f"cannot run git: {exc.strerror}") from None


def _text(result: subprocess.CompletedProcess[bytes]) -> str:
    return result.stdout.decode("utf-8", "replace").strip()


def toplevel(root: Path) -> Path:
    """The repository's top folder (``root`` may be below it)."""
    result = _git(root, "rev-parse", "--show-toplevel")
    if result.returncode != 0:
        raise RevisionError(f"{root} is not inside a git repository")
    return Path(_text(result)).resolve()


def resolve(root: Path, rev: str) -> str:
    """The full commit id that ``rev`` names (a branch, tag, commit or ``HEAD~2``)."""
    toplevel(root)
    if not rev or rev.startswith("-"):
        raise RevisionError(f"not a revision: {rev!r}")
    result = _git(root, "rev-parse", "--verify", "--quiet", "--end-of-options", f"{rev}^{{commit}}")
    if result.returncode != 0:
        raise RevisionError(
            f"no commit named `{rev}` in this repository "
            "(name a branch, tag or commit; fetch a remote branch first)"
        )
    return _text(result)


def merge_base(root: Path, ref: str) -> str:
    """Where the current branch left ``ref``: the commit a pull request into ``ref`` changes."""
    try:
        base = resolve(root, ref)
    except RevisionError:
        raise RevisionError(
            f"no ref `{ref}` to review against (fetch it, or name the upstream branch: "
            f"`--merge-base BRANCH`, or `make review REVIEW_BASE=BRANCH`)"
        ) from None
    result = _git(root, "merge-base", "HEAD", base)
    if result.returncode != 0:
        raise RevisionError(f"HEAD and `{ref}` have no common ancestor")
    return _text(result)


def _keep(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo | None:
    """Regular files the generator reads, and links that stay inside the folder."""
    if member.isfile() and not member.name.endswith(_READ_SUFFIXES):
        return None
    try:
        return tarfile.data_filter(member, dest)
    except tarfile.FilterError:  # a link out of the tree: skipped, as the reader refuses it
        return None


@contextlib.contextmanager
def tree_at(root: Path, commit: str) -> Iterator[Path]:
    """The whole repository as it is at ``commit``, in a temporary folder removed afterwards.

    ``root`` may be a sub-folder of the repository (``examples/te_2_20``); it must exist
    at ``commit``. The whole repository is read, so paths out of the root (the
    generator's templates, a relative ``source_root``) resolve as they did at REV.
    """
    if not hasattr(tarfile, "data_filter"):
        raise RevisionError("reading a revision needs Python 3.10.12 or 3.11.4 or newer")
    top = toplevel(root)
    prefix = root.resolve().relative_to(top)
    folder = Path(tempfile.mkdtemp(prefix="codegen-review-"))
    try:
        with subprocess.Popen(
            ["git", "-C", str(top), "archive", "--format=tar", commit],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        ) as proc:
            assert proc.stdout is not None and proc.stderr is not None
            unreadable: tarfile.TarError | None = None
            try:
                with tarfile.open(fileobj=proc.stdout, mode="r|") as archive:
                    archive.extractall(folder, filter=_keep)
            except tarfile.TarError as exc:
                unreadable = exc
                proc.stdout.read()  # drain, so git's exit status says what went wrong
            error = proc.stderr.read().decode("utf-8", "replace").strip()
        if proc.returncode != 0:
            raise RevisionError(f"git archive {commit[:12]} failed: {error}")
        if unreadable is not None:
            raise RevisionError(f"cannot read git archive of {commit[:12]}: {unreadable}")
        if not (folder / prefix).is_dir():
            raise RevisionError(f"`{prefix.as_posix()}` does not exist at {commit[:12]}")
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
