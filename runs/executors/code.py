"""Code at the pinned commit: a clean checkout of the repository at the SHA approval pinned,
made from a mirror cached under ``var/`` (``RUNS_CODE_DIR``), the same commit as a source
archive for a pool's agents, and a checkout copied into a job's folder for the schedulers
that ship that folder (Iris, Ray).

The mirror is a bare clone (``git clone --mirror``), fetched again only when the commit is
not in it yet; each commit is checked out once, as a detached worktree
(``git worktree add --detach``) under ``trees/<sha>``, which jobs of every run at that
commit share and never write to (they write in their own working folder). A commit the
repository does not have is a ``CodeError`` saying so, raised before anything is submitted.
No network in tests: the repository is a local path there.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

GIT_TIMEOUT_SECONDS = 300
SHA = re.compile(r"[0-9a-f]{40}")
REF = re.compile(r"[A-Za-z0-9._/\-]{1,255}")


class CodeError(Exception):
    """The pinned code cannot be had: the reason, in words (shown on the run)."""


@dataclass(frozen=True)
class Checkout:
    repository: str
    sha: str
    path: Path
    clean: bool


def _git(*args: str, cwd: Path | None = None, timeout: float = GIT_TIMEOUT_SECONDS) -> str:
    env = {
        **os.environ,
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_CONFIG_NOSYSTEM": "1",
        "LC_ALL": "C",
    }
    try:
        done = subprocess.run(  # noqa: S603
            ["git", *args],  # noqa: S607
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise CodeError(f"git {args[0]} could not run: {exc}") from exc
    if done.returncode != 0:
        raise CodeError(f"git {args[0]} failed: {done.stderr.strip()[-500:]}")
    return done.stdout


# Where the site's own source puts what its recipes import, besides the root (``trainers``):
# the client package (``marin_client``) lives under ``client/``.
SITE_IMPORT_PATHS = ["", "client"]


def site_checkout() -> tuple[str, str]:
    """The site's own repository (its ``BASE_DIR``, when that is a git checkout) and the
    commit at its HEAD, or ("", ""): what a pool's launch pins when nothing else is set
    (``RUNS_CODE_REPOSITORY`` unset, no ref given), so an agent runs the site's recipes."""
    base = Path(settings.BASE_DIR)
    if not (base / ".git").exists():
        return "", ""
    try:
        sha = _git("rev-parse", "--verify", "HEAD^{commit}", cwd=base).strip()
    except CodeError:
        return "", ""
    return str(base), sha


def import_paths(repository: str) -> list[str]:
    """The folders of a commit's tree a job imports from (relative; "" is its root)."""
    return list(SITE_IMPORT_PATHS) if repository == str(Path(settings.BASE_DIR)) else [""]


def code_dir() -> Path:
    return Path(settings.RUNS_CODE_DIR)


def _mirror_path(repository: str) -> Path:
    digest = hashlib.sha256(repository.encode()).hexdigest()[:16]
    return code_dir() / "mirrors" / f"{digest}.git"


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """One worker at a time per mirror (a clone, a fetch or a worktree add)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with (path.parent / f"{path.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _has_commit(mirror: Path, ref: str) -> str:
    """The full SHA of ``ref`` in the mirror, or "" when it has no such commit."""
    try:
        return _git("rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}", cwd=mirror).strip()
    except CodeError:
        return ""


def commit_resolve(*, repository: str, ref: str) -> str:
    """The full SHA of ``ref`` (a SHA, a tag or a branch) in ``repository``, cloning or
    fetching the mirror as needed; CodeError saying the commit does not exist otherwise."""
    if not REF.fullmatch(ref) or ref.startswith("-") or ".." in ref:
        raise CodeError(f"'{ref[:60]}' is not a git ref")
    mirror = _mirror_path(repository)
    with _locked(mirror):
        if not (mirror / "HEAD").exists():
            _git("clone", "--mirror", "--quiet", "--", repository, str(mirror))
        elif (sha := _has_commit(mirror, ref)) and SHA.fullmatch(ref):
            return sha  # a commit never changes; a branch or tag may have moved: fetch
        else:
            _git("fetch", "--quiet", "--prune", "origin", cwd=mirror)
        sha = _has_commit(mirror, ref)
    if not sha:
        raise CodeError(f"commit {ref[:60]} does not exist in {repository}")
    return sha


def checkout_materialize(*, repository: str, ref: str) -> Checkout:
    """A clean checkout of ``ref`` of ``repository`` (made once per commit, then reused),
    and whether its tree is clean (nothing changed or added since it was checked out)."""
    sha = commit_resolve(repository=repository, ref=ref)
    mirror = _mirror_path(repository)
    tree = code_dir() / "trees" / sha
    with _locked(mirror):
        if not (tree / ".git").exists():
            tree.parent.mkdir(parents=True, exist_ok=True)
            _git("worktree", "prune", cwd=mirror)
            _git("worktree", "add", "--detach", "--force", str(tree), sha, cwd=mirror)
    head = _git("rev-parse", "HEAD", cwd=tree).strip()
    status = _git("status", "--porcelain", "--untracked-files=all", cwd=tree)
    return Checkout(repository=repository, sha=sha, path=tree, clean=head == sha and not status)


def archive_path(*, repository: str, sha: str) -> Path:
    """A gzipped tar of the commit's tree (``git archive``), made once and kept; what an
    agent fetches to run the same code on its own machine."""
    if not SHA.fullmatch(sha):
        raise CodeError(f"'{sha[:60]}' is not a full commit SHA")
    mirror = _mirror_path(repository)
    path = code_dir() / "archives" / f"{sha}.tar.gz"
    if path.exists():
        return path
    commit_resolve(repository=repository, ref=sha)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".{os.getpid()}.part")
    with _locked(mirror):
        _git("archive", "--format=tar.gz", f"--output={partial}", sha, cwd=mirror)
        partial.replace(path)
    return path


def checkout_copy(source: Path, workdir: Path) -> None:
    """Copy a checkout (shared by every job at its commit, never written to) into a job's
    working folder, its ``.git`` left out: the folder a scheduler ships (Iris's bundle,
    Ray's ``working_dir``) and the job starts in. A copy, not links: a job writing a file
    of its tree must not change the checkout the others run."""
    shutil.copytree(
        source,
        workdir,
        ignore=shutil.ignore_patterns(".git"),
        symlinks=True,
        dirs_exist_ok=True,
    )
