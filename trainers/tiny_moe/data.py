"""The tiny recipe's corpus: the Python standard library's own source, read where it lies.

Every machine that runs Python has it, so nothing is downloaded and nothing is committed.
Two sources are cut from the same files:

- ``code``: the source with its comments and docstrings taken out;
- ``docs``: those docstrings and comments, in the order they appear.

The files are a fixed subset of the top-level modules of ``sysconfig.get_paths()["stdlib"]``:
those whose name's CRC-32 is a multiple of ``SUBSET_MODULUS``, read in sorted order until
``MAX_SOURCE_BYTES`` of source is taken. A file that is missing, unreadable or does not
parse is skipped; since a file's membership depends on its own name only, a trimmed standard
library gives a smaller corpus of the same files, not a different one (or, when almost
nothing is left, a ``CorpusError``). Files whose name's hash falls in one bucket in
``EVAL_BUCKETS`` are held out, in both sources, as the eval split. Text is UTF-8 bytes, one
token per byte.

Cutting the sources takes about half a second, longer than a short run's training, so the
corpus is kept in the user's cache folder (``$XDG_CACHE_HOME``, else ``~/.cache``, under
``marin-tiny-moe/``) under a key of everything it is cut from: this module's own source, the
interpreter, the folder and each candidate file's name, size and modification time. A
changed file or rule gives a new key; a cache that cannot be read or written is passed by.
"""

from __future__ import annotations

import ast
import hashlib
import io
import os
import sys
import sysconfig
import tempfile
import tokenize
import zipfile
import zlib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

SOURCES = ("code", "docs")
MAX_SOURCE_BYTES = 700_000  # of the files read: about 0.5 MB of code, 0.15 MB of docs
MAX_FILE_BYTES = 120_000  # no one module dominates the corpus
SUBSET_MODULUS = 2  # half of the modules, spread over the alphabet
EVAL_BUCKETS = 7  # of the subset, one name in seven is held out
MIN_SOURCE_TOKENS = 4_096  # per source and split, or the corpus is refused


class CorpusError(RuntimeError):
    """The standard library here has too little source to train on."""


@dataclass(frozen=True)
class Corpus:
    """Each source's training and eval bytes, as int64 token arrays, and the files used."""

    train: dict[str, np.ndarray]
    eval: dict[str, np.ndarray]
    files: tuple[str, ...]  # every file taken, in order
    eval_files: tuple[str, ...]  # those held out


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def split_source(text: str) -> tuple[str, str] | None:
    """``(code, docs)`` of one module's source, or None when it does not parse."""
    try:
        tree = ast.parse(text)
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (SyntaxError, ValueError, tokenize.TokenError):
        return None
    lines = text.splitlines()
    removed: set[int] = set()  # 0-based lines that were only a docstring
    cut: dict[int, int] = {}  # 0-based line -> column where a comment starts
    pieces: list[tuple[int, str]] = []  # (line, text) of every docstring and comment
    for node in ast.walk(tree):
        if not isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        body = node.body
        first = body[0] if body else None
        if (
            isinstance(first, ast.Expr)
            and isinstance(first.value, ast.Constant)
            and isinstance(first.value.value, str)
        ):
            pieces.append((first.lineno, ast.get_docstring(node) or ""))
            end = first.end_lineno or first.lineno
            removed.update(range(first.lineno - 1, end))
    for token in tokens:
        if token.type == tokenize.COMMENT:
            row, col = token.start
            pieces.append((row, token.string.lstrip("#").strip()))
            cut[row - 1] = col
    code_lines = []
    for number, line in enumerate(lines):
        kept = line[: cut[number]].rstrip() if number in cut else line
        if number in removed or (number in cut and not kept):
            continue
        code_lines.append(kept)
    docs = "\n".join(text for _, text in sorted(pieces, key=lambda piece: piece[0]) if text)
    return "\n".join(code_lines) + "\n", docs + "\n"


def _read(path: Path) -> str | None:
    try:
        raw = path.read_bytes()[:MAX_FILE_BYTES]
        encoding, _ = tokenize.detect_encoding(io.BytesIO(raw).readline)
        return raw.decode(encoding)
    except (OSError, SyntaxError, LookupError, UnicodeDecodeError):
        return None


def _tokens(texts: list[str]) -> np.ndarray:
    return np.frombuffer("\n".join(texts).encode("utf-8"), dtype=np.uint8).astype(np.int64)


def _in_subset(path: Path) -> bool:
    """The fixed subset: a rule on the file's own name (and never this machine's build
    settings, which are not source)."""
    return zlib.crc32(path.name.encode()) % SUBSET_MODULUS == 0 and not path.name.startswith(
        "_sysconfigdata"
    )


def _candidates(root: Path) -> list[Path]:
    try:
        return [path for path in sorted(root.glob("*.py")) if _in_subset(path)]
    except OSError:
        return []


def _cache_file(root: Path, max_bytes: int, paths: list[Path]) -> Path | None:
    """Where the corpus cut from ``paths`` under these rules is kept: its key covers this
    module's source, the interpreter, the folder and each file's name, size and mtime."""
    key = hashlib.sha256()
    key.update(Path(__file__).read_bytes())
    key.update(f"{sys.version}\0{root.resolve()}\0{max_bytes}\0".encode())
    for path in paths:
        try:
            stat = path.stat()
        except OSError:
            key.update(f"{path.name}\0missing\0".encode())
            continue
        key.update(f"{path.name}\0{stat.st_size}\0{stat.st_mtime_ns}\0".encode())
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path("~/.cache").expanduser())
    if not base.is_absolute():
        return None  # no home to keep it in: cut every time
    return base / "marin-tiny-moe" / f"corpus-{key.hexdigest()[:32]}.npz"


def _cached(path: Path) -> Corpus | None:
    """The corpus kept at ``path``, or None when there is none or it cannot be read."""
    try:
        with path.open("rb") as file, np.load(file, allow_pickle=False) as kept:
            return Corpus(
                train={s: kept[f"train_{s}"].astype(np.int64) for s in SOURCES},
                eval={s: kept[f"eval_{s}"].astype(np.int64) for s in SOURCES},
                files=tuple(str(name) for name in kept["files"]),
                eval_files=tuple(str(name) for name in kept["eval_files"]),
            )
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
        return None


def _keep(path: Path, corpus: Corpus) -> None:
    """Write the corpus to ``path`` whole or not at all (runs may start side by side)."""
    arrays = {
        f"{split}_{s}": getattr(corpus, split)[s].astype(np.uint8)
        for split in ("train", "eval")
        for s in SOURCES
    }
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        out = tempfile.NamedTemporaryFile(dir=path.parent, suffix=".tmp", delete=False)  # noqa: SIM115
    except OSError:
        return  # a cache that cannot be written is passed by
    try:
        with out:
            np.savez(
                out,
                files=np.array(corpus.files, dtype=str),
                eval_files=np.array(corpus.eval_files, dtype=str),
                **arrays,
            )
        os.replace(out.name, path)
    except OSError:
        Path(out.name).unlink(missing_ok=True)


@lru_cache(maxsize=4)
def load_corpus(root: Path | None = None, max_bytes: int = MAX_SOURCE_BYTES) -> Corpus:
    """The corpus of the standard library at ``root`` (this interpreter's by default), from
    the user's cache when it was cut there before from the same files."""
    root = root or stdlib_root()
    paths = _candidates(root)
    kept_at = _cache_file(root, max_bytes, paths)
    corpus = _cached(kept_at) if kept_at else None
    if corpus is None:
        corpus = _cut(root, paths, max_bytes)
        if kept_at:
            _keep(kept_at, corpus)
    return corpus


def _cut(root: Path, paths: list[Path], max_bytes: int) -> Corpus:
    """The corpus cut from ``paths`` (the subset, in order) until ``max_bytes`` are read."""
    taken: list[str] = []
    held_out: list[str] = []
    parts: dict[str, dict[str, list[str]]] = {s: {"train": [], "eval": []} for s in SOURCES}
    read = 0
    for path in paths:
        if read >= max_bytes:
            break
        name_hash = zlib.crc32(path.name.encode())
        text = _read(path)
        split = split_source(text) if text is not None else None
        if text is None or split is None:
            continue  # missing, unreadable or not Python 3 here: the subset moves on
        read += len(text)
        taken.append(path.name)
        which = "eval" if (name_hash // SUBSET_MODULUS) % EVAL_BUCKETS == 0 else "train"
        if which == "eval":
            held_out.append(path.name)
        for source, part in zip(SOURCES, split, strict=True):
            parts[source][which].append(part)
    train = {s: _tokens(parts[s]["train"]) for s in SOURCES}
    held = {s: _tokens(parts[s]["eval"]) for s in SOURCES}
    for name, arrays in (("training", train), ("eval", held)):
        for source, tokens in arrays.items():
            if len(tokens) < MIN_SOURCE_TOKENS:
                raise CorpusError(
                    f"the standard library at {root} gives {len(tokens)} bytes of {source} "
                    f"for the {name} split (at least {MIN_SOURCE_TOKENS} are needed)"
                )
    return Corpus(train=train, eval=held, files=tuple(taken), eval_files=tuple(held_out))


def sample_batch(
    arrays: dict[str, np.ndarray], mix: dict[str, float], batch: int, seq: int, rng: Any
) -> tuple[np.ndarray, np.ndarray]:
    """``batch`` windows of ``seq + 1`` tokens, each from a source drawn with the mix's
    weights; returns the tokens and each row's source index (into ``SOURCES``)."""
    names = [name for name in SOURCES if mix.get(name, 0) > 0]
    weights = np.array([float(mix[name]) for name in names])
    drawn = rng.choice(len(names), size=batch, p=weights / weights.sum())
    rows = []
    for index in drawn:
        text = arrays[names[index]]
        start = int(rng.integers(0, len(text) - seq - 1))
        rows.append(text[start : start + seq + 1])
    sources = np.array([SOURCES.index(names[index]) for index in drawn])
    return np.stack(rows), sources


def eval_batches(corpus: Corpus, rows: int, seq: int) -> dict[str, np.ndarray]:
    """Fixed held-out windows per source: the same whatever the mix and the seed, so runs
    that differ in either are compared on the same text."""
    rng = np.random.default_rng(10_000)
    out = {}
    for source in SOURCES:
        text = corpus.eval[source]
        starts = rng.integers(0, len(text) - seq - 1, size=rows)
        out[source] = np.stack([text[s : s + seq + 1] for s in starts.tolist()])
    return out
