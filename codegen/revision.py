"""A git revision of the project, read into a private temporary folder, as data.

``codegen diff`` reads the "before" side of a review with the generator's own reader,
so it needs REV's files as files. They come from git's objects (``ls-tree`` and
``cat-file``) into a fresh temporary folder: the user's working tree, index and HEAD
are never touched.

REV is untrusted (docs/review.md, "What `codegen diff` trusts"). Its tree is checked
before anything is written: every path stays inside the folder (no ``..`` entry),
every link is resolved through the tree itself, links to links and through linked
folders included, and one that leads out of the tree is refused; sizes are bounded
before a byte is read, and a binary file (a NUL byte) is refused. The copy holds regular
files only: a link becomes a copy of what it resolves to, so nothing reading the copy
can be led out of it.
"""

from __future__ import annotations

import bisect
import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

# What the generator reads: op modules and the modules they import, the configuration,
# the templates. Everything else in the repository (images, data) is skipped.
READ_SUFFIXES = (".py", ".pyi", ".toml", ".j2")
_SYMLINK = "120000"

# Bounds on what a revision may make ``codegen diff`` copy (docs/review.md, "Bounds").
MAX_FILE_BYTES = 1 << 20  # one file the generator may read
MAX_TOTAL_BYTES = 64 << 20  # every file copied, a folder reached through links counted again
MAX_FILES = 20_000  # files copied
MAX_LINK_HOPS = 40  # links followed to resolve one path (the kernel's ELOOP bound)
MAX_LINK_BYTES = 4096  # one link's target (PATH_MAX)


class RevisionError(Exception):
    """A revision that cannot be read: not a git repository, no such ref, no merge base."""


class UnsafeRevision(RevisionError):
    """A revision whose tree cannot be copied safely: a path or link out of the copy, a
    file over the bounds, a file that is not text. The message names the path."""


def _git(root: Path, *args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    try:
        return subprocess.run(
            ["git", "-C", str(root), *args], input=stdin, capture_output=True, check=False
        )
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


# --- The tree, as git lists it ---------------------------------------------------------


@dataclass(frozen=True)
class _Blob:
    object_id: str
    size: int


class _Tree:
    """Every path of a commit (files, links, folders) and the links' targets, in memory.

    Links are resolved here, through this tree alone, as the kernel would resolve them
    in a checkout: component by component, a link's target read from its folder, ``..``
    after a linked folder leaving the folder the link leads to.
    """

    def __init__(self, files: dict[str, _Blob], links: dict[str, str], folders: set[str]):
        self.files, self.links, self.folders = files, links, folders
        self._sorted = sorted([*files, *links])

    def under(self, folder: str) -> list[str]:
        """Every file and link below ``folder`` (``""``: the whole tree), sorted."""
        if not folder:
            return list(self._sorted)
        prefix = folder + "/"
        start = bisect.bisect_left(self._sorted, prefix)
        end = bisect.bisect_left(self._sorted, prefix[:-1] + chr(ord("/") + 1))
        return self._sorted[start:end]

    def resolve(self, link: str) -> tuple[str, str]:
        """(``"file"``, ``"folder"`` or ``"missing"``, the path it resolves to) for the link
        at ``link``; ``UnsafeRevision`` if the resolution leaves the tree or loops."""
        done = link.split("/")[:-1]  # the folder reached so far, links resolved
        todo: list[str] = []  # components still to walk, the next one last
        via, hops = link, 0

        def follow(at: str) -> bool:
            """Walk the link at ``at`` next; False for an empty target (no such path)."""
            nonlocal via, hops
            via, hops = at, hops + 1
            if hops > MAX_LINK_HOPS:
                raise UnsafeRevision(
                    f"{link}: a link that does not resolve (more than {MAX_LINK_HOPS} links "
                    "in a row: a cycle of links)"
                )
            target = self.links[at]
            if target.startswith("/"):
                raise self._out(link, at)
            todo.extend(reversed(target.split("/")))
            return bool(target)

        if not follow(link):
            return "missing", ""
        while todo:
            part = todo.pop()
            if part in ("", "."):
                continue
            if part == "..":
                if not done:
                    raise self._out(link, via)
                done.pop()
                continue
            here = "/".join([*done, part])
            if here in self.links:
                if not follow(here):  # relative to `done`, the link's folder
                    return "missing", ""
            elif here in self.files:
                if any(p not in ("", ".") for p in todo):
                    return "missing", ""  # a file used as a folder
                return "file", here
            elif here in self.folders:
                done.append(part)
            else:
                return "missing", ""
        return "folder", "/".join(done)

    def _out(self, link: str, via: str) -> UnsafeRevision:
        through = f" (through `{via}` -> `{self.links[via]}`)" if via != link else ""
        return UnsafeRevision(
            f"{link}: a link to `{self.links[link]}` that leads out of the revision{through}; "
            "codegen diff follows no link out of the tree it reviews"
        )


def _check_path(path: str) -> None:
    parts = path.split("/")
    for bad, what in (("..", "a `..` component"), (".", "a `.` component"), ("", "an empty name")):
        if bad in parts:
            raise UnsafeRevision(
                f"{path}: a path with {what}, which git refuses to check out; "
                "codegen diff will not write it"
            )
    if any(p.lower() == ".git" for p in parts):
        raise UnsafeRevision(
            f"{path}: a path through a `.git` folder, which git refuses to check out; "
            "codegen diff will not write it"
        )


def _list_tree(top: Path, commit: str) -> _Tree:
    result = _git(top, "ls-tree", "-r", "-l", "-z", "--full-tree", commit)
    if result.returncode != 0:
        error = result.stderr.decode("utf-8", "replace").strip()
        raise RevisionError(f"cannot list the files of {commit[:12]}: {error}")
    files: dict[str, _Blob] = {}
    links: dict[str, _Blob] = {}
    folders: set[str] = set()
    for record in result.stdout.split(b"\0"):
        meta, _, raw_path = record.partition(b"\t")
        if not raw_path:
            continue
        mode, kind, object_id, size = meta.decode("ascii").split()
        path = os.fsdecode(raw_path)
        _check_path(path)
        if path in files or path in links or path in folders:
            raise UnsafeRevision(f"{path}: listed twice in the revision's tree")
        parts = path.split("/")
        folders.update("/".join(parts[:i]) for i in range(1, len(parts)))
        if kind == "commit":  # a submodule: an empty folder in a checkout
            folders.add(path)
        elif kind == "blob":
            (links if mode == _SYMLINK else files)[path] = _Blob(object_id, int(size))
    clash = sorted((files.keys() | links.keys()) & folders)
    if clash:
        raise UnsafeRevision(f"{clash[0]}: both a file and a folder in the revision's tree")
    if len(links) > MAX_FILES:
        raise UnsafeRevision(f"the revision holds more than {MAX_FILES} links")
    long_links = [p for p, blob in links.items() if blob.size > MAX_LINK_BYTES]
    if long_links:
        raise UnsafeRevision(
            f"{long_links[0]}: a link whose target is longer than {MAX_LINK_BYTES} bytes"
        )
    link_paths = sorted(links)
    targets = _contents(top, [links[p].object_id for p in link_paths])
    return _Tree(
        files, {p: os.fsdecode(t) for p, t in zip(link_paths, targets, strict=True)}, folders
    )


def _contents(top: Path, object_ids: list[str]) -> list[bytes]:
    """The blobs' bytes, in order, from one ``git cat-file --batch``."""
    if not object_ids:
        return []
    result = _git(top, "cat-file", "--batch", stdin="".join(i + "\n" for i in object_ids).encode())
    if result.returncode != 0:
        raise RevisionError(f"git cat-file failed: {result.stderr.decode('utf-8', 'replace')}")
    data, at, contents = result.stdout, 0, []
    for object_id in object_ids:
        end = data.index(b"\n", at)
        header = data[at:end].split()
        if len(header) != 3:
            raise RevisionError(f"git cannot read the object {object_id} (a partial clone?)")
        size = int(header[2])
        contents.append(data[end + 1 : end + 1 + size])
        at = end + 1 + size + 1
    return contents


# --- What the copy holds ---------------------------------------------------------------


def _plan(tree: _Tree) -> dict[str, _Blob]:
    """Where each file of the copy goes -> the blob it holds: every file the generator may
    read by its name, and what each link (to a file or a folder) resolves to."""
    resolved = {link: tree.resolve(link) for link in sorted(tree.links)}  # any link out first
    plan: dict[str, _Blob] = {}
    total = 0

    def add(out: str, blob: _Blob) -> None:
        nonlocal total
        if not out.endswith(READ_SUFFIXES):
            return
        if blob.size > MAX_FILE_BYTES:
            raise UnsafeRevision(
                f"{out}: {blob.size} bytes, more than the {MAX_FILE_BYTES} bytes codegen diff "
                "reads from one file of a revision"
            )
        total += blob.size
        if len(plan) >= MAX_FILES or total > MAX_TOTAL_BYTES:
            raise UnsafeRevision(
                f"the revision's files to read exceed {MAX_FILES} files or {MAX_TOTAL_BYTES} "
                f"bytes (at {out}, a folder reached through links counted again); "
                "codegen diff copies no more"
            )
        plan[out] = blob

    def place(out: str, real: str, expanding: tuple[str, ...]) -> None:
        """The file or link at ``real`` in the tree, copied to ``out``."""
        if real in tree.files:
            add(out, tree.files[real])
            return
        kind, target = resolved[real]
        if kind == "file":
            add(out, tree.files[target])
        elif kind == "folder":
            if not target or target in expanding or real.startswith(f"{target}/"):
                raise UnsafeRevision(
                    f"{real}: a link to the folder `{target or '.'}`, which holds the link: "
                    "codegen diff copies no folder into itself"
                )
            for inner in tree.under(target):
                place(f"{out}/{inner[len(target) + 1 :]}", inner, (*expanding, target))
        # "missing": a dangling link, as a checkout would hold it: no file.

    for path in sorted([*tree.files, *tree.links]):
        place(path, path, ())
    return plan


def _check_binary(path: str, data: bytes) -> None:
    """Refuse a file holding a NUL byte: no text the generator reads has one (Python
    refuses such a source outright). Text that does not decode is the reader's to report
    (an op module at the byte's position), as for the working tree."""
    nul = data.find(b"\0")
    if nul >= 0:
        raise UnsafeRevision(
            f"{path}: a binary file (a NUL byte at offset {nul}); codegen diff reads text only"
        )


@contextlib.contextmanager
def tree_at(root: Path, commit: str) -> Iterator[Path]:
    """The repository's files as they are at ``commit``, in a temporary folder removed
    afterwards: the op modules and every module they may import, the configuration and
    the templates (files ending in .py, .pyi, .toml, .j2), links replaced by copies of
    what they resolve to.

    Read from git's objects, not with ``git archive``, so no ``export-ignore`` or
    ``export-subst`` attribute changes what the reader sees. ``root`` may be a
    sub-folder of the repository (``examples/te_2_20``); it must exist at ``commit``.
    The whole repository is read, so paths out of the root (the generator's templates,
    a relative ``source_root``) resolve as they did at REV. ``UnsafeRevision`` (before
    anything is written) for a path or link out of the tree, a file over the bounds, a
    binary file.
    """
    top = toplevel(root)
    prefix = root.resolve().relative_to(top).as_posix()
    plan = _plan(_list_tree(top, commit))
    if prefix != "." and not any(path.startswith(f"{prefix}/") for path in plan):
        raise RevisionError(f"`{prefix}` holds no file the generator reads at {commit[:12]}")
    object_ids = sorted({blob.object_id for blob in plan.values()})
    data = dict(zip(object_ids, _contents(top, object_ids), strict=True))
    for path, blob in plan.items():
        _check_binary(path, data[blob.object_id])
    folder = None
    try:
        folder = Path(tempfile.mkdtemp(prefix="codegen-review-"))
        for path, blob in plan.items():
            target = folder / path
            try:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data[blob.object_id])
            except OSError as exc:
                raise UnsafeRevision(f"{path}: cannot be written: {exc.strerror}") from None
        yield folder
    finally:
        if folder is not None:
            _remove(folder)


def _remove(folder: Path) -> None:
    """Remove the copy, even when an exception (a deadline's timer) interrupts the first
    try: it is raised once the copy is gone."""
    interrupted: BaseException | None = None
    for _ in range(2):
        try:
            shutil.rmtree(folder, ignore_errors=True)
            break
        except BaseException as exc:  # re-raised below
            interrupted = exc
    if interrupted is not None:
        raise interrupted
