"""A git revision of the project, read into a private temporary folder.

``codegen diff`` reads the "before" side of a review with the generator's own reader,
so it needs REV's files as files. They come from git's objects (``ls-tree`` and
``cat-file``) into a fresh temporary folder: the user's working tree, index and HEAD
are never touched.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

# What the generator reads: op modules and the modules they import, the configuration,
# the templates. Everything else in the repository (images, data) is skipped.
_READ_SUFFIXES = (".py", ".pyi", ".toml", ".j2")
_SYMLINK = b"120000"


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


def _entries(top: Path, commit: str) -> list[tuple[bytes, bytes, str]]:
    """(mode, object id, path) of every file the generator may read at ``commit``."""
    result = _git(top, "ls-tree", "-r", "-z", "--full-tree", commit)
    if result.returncode != 0:
        error = result.stderr.decode("utf-8", "replace").strip()
        raise RevisionError(f"cannot list the files of {commit[:12]}: {error}")
    entries = []
    for record in result.stdout.split(b"\0"):
        meta, _, raw_path = record.partition(b"\t")
        if not raw_path:
            continue
        mode, kind, object_id = meta.split()
        path = os.fsdecode(raw_path)
        if kind == b"blob" and (mode == _SYMLINK or path.endswith(_READ_SUFFIXES)):
            entries.append((mode, object_id, path))
    return entries


def _contents(top: Path, object_ids: list[bytes]) -> list[bytes]:
    """The blobs' bytes, in order, from one ``git cat-file --batch``."""
    result = subprocess.run(
        ["git", "-C", str(top), "cat-file", "--batch"],
        input=b"".join(i + b"\n" for i in object_ids),
        capture_output=True,
        check=False,
    )
    if result.returncode != 0:
        raise RevisionError(f"git cat-file failed: {result.stderr.decode('utf-8', 'replace')}")
    data, at, contents = result.stdout, 0, []
    for _ in object_ids:
        end = data.index(b"\n", at)
        size = int(data[at:end].split()[2])
        contents.append(data[end + 1 : end + 1 + size])
        at = end + 1 + size + 1
    return contents


def _inside(path: str, target: str) -> bool:
    """Whether a link at ``path`` to ``target`` stays inside the tree."""
    resolved = posixpath.normpath(posixpath.join(posixpath.dirname(path), target))
    return not posixpath.isabs(target) and resolved != ".." and not resolved.startswith("../")


@contextlib.contextmanager
def tree_at(root: Path, commit: str) -> Iterator[Path]:
    """The repository's files as they are at ``commit``, in a temporary folder removed
    afterwards: the op modules and every module they may import, the configuration and
    the templates (files ending in .py, .pyi, .toml, .j2), and the links among them.

    Read from git's objects, not with ``git archive``, so no ``export-ignore`` or
    ``export-subst`` attribute changes what the reader sees. ``root`` may be a
    sub-folder of the repository (``examples/te_2_20``); it must exist at ``commit``.
    The whole repository is read, so paths out of the root (the generator's templates,
    a relative ``source_root``) resolve as they did at REV. A link out of the repository
    is left out, as the reader refuses to follow one.
    """
    top = toplevel(root)
    prefix = root.resolve().relative_to(top).as_posix()
    entries = _entries(top, commit)
    if prefix != "." and not any(path.startswith(f"{prefix}/") for _, _, path in entries):
        raise RevisionError(f"`{prefix}` holds no file the generator reads at {commit[:12]}")
    folder = Path(tempfile.mkdtemp(prefix="codegen-review-"))
    try:
        contents = _contents(top, [object_id for _, object_id, _ in entries])
        links = []
        for (mode, _, path), content in zip(entries, contents, strict=True):
            if mode == _SYMLINK:
                links.append((path, os.fsdecode(content)))
                continue
            target = folder / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(content)
        for path, link in links:  # after the files: a link never leads a write elsewhere
            if _inside(path, link):
                (folder / path).parent.mkdir(parents=True, exist_ok=True)
                (folder / path).symlink_to(link)
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
