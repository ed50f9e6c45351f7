"""The tiny MoE transformer: its gradients are right, it is causal and deterministic, its MoE
drops what it says, its data are the standard library's two sources mixed as asked, and it
really learns."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from django.conf import settings

from runs.recipes.demo import TINY_MOE
from runs.specs.compute import evaluate
from trainers.tiny_moe import data
from trainers.tiny_moe import train as tiny_moe
from trainers.tiny_moe.model import TinyTransformer, flops_per_token, param_count, route

SMALL: dict[str, Any] = {
    "width": 8,
    "head_dim": 4,
    "depth": 2,
    "num_experts": 3,
    "top_k": 2,
    "capacity_factor": 0.7,
    "load_balance_coef": 0.1,
    "vocab_size": 11,
    "seq_len": 6,
}


class Recorder:
    """Stands in for marin_client.client.RunClient: keeps what train() logs."""

    def __init__(self) -> None:
        self.points: list[tuple[int, dict[str, float]]] = []

    def log_many(self, metrics: dict[str, float], step: int) -> None:
        self.points.append((step, dict(metrics)))

    def series(self, key: str) -> list[float]:
        return [metrics[key] for _, metrics in self.points if key in metrics]


def config(**overrides: Any) -> dict[str, Any]:
    return {**tiny_moe.DEFAULTS, **overrides}


def train(cfg: dict[str, Any], tmp_path: Path) -> tuple[dict[str, float], Recorder]:
    recorder = Recorder()
    summary = tiny_moe.train(cfg, recorder, tmp_path)  # type: ignore[arg-type]
    return summary, recorder


def test_recipe_defaults_match_the_trainer() -> None:
    for key, value in TINY_MOE["default_config"].items():
        assert tiny_moe.DEFAULTS[key] == value


def test_recipe_compute_model_counts_the_parameters_the_model_has() -> None:
    for sizes in ({}, {"width": 32, "depth": 1}, {"num_experts": 8, "top_k": 2}):
        cfg = config(**sizes)
        model = TinyTransformer(cfg, np.random.default_rng(0))
        total = sum(p.size for p in model.params.values())
        assert param_count(cfg, active=False) == total
        expert_weights = sum(
            p.size for name, p in model.params.items() if name.startswith(("w_in", "w_out"))
        )
        active = total - expert_weights * (cfg["num_experts"] - cfg["top_k"]) // cfg["num_experts"]
        assert param_count(cfg, active=True) == active
        recipe_cfg = {**TINY_MOE["default_config"], **sizes}
        assert evaluate(TINY_MOE["compute_model"]["total_params"], recipe_cfg) == total
        assert evaluate(TINY_MOE["compute_model"]["active_params"], recipe_cfg) == active


def test_gradients_match_finite_differences() -> None:
    """Every parameter tensor of a two-layer model (all of a small tensor's entries, 40 drawn
    at random of a larger one's), in float64, with tokens dropped at capacity and the
    load-balancing loss in the objective."""
    model = TinyTransformer(SMALL, np.random.default_rng(1), dtype=np.float64)
    noise = np.random.default_rng(5)
    for param in model.params.values():  # away from the init's symmetric gains
        param += noise.normal(0, 0.3, param.shape)  # noqa: PLW2901  (in place)
    tokens = np.random.default_rng(2).integers(0, SMALL["vocab_size"], size=(3, 7))

    def objective() -> float:
        loss, _, stats = model.loss_and_grads(tokens, grads=False)
        return loss + SMALL["load_balance_coef"] * stats.balance_loss

    _, grads, stats = model.loss_and_grads(tokens)
    assert stats.dropped > 0 and stats.balance_loss > 0
    assert set(grads) == set(model.params)
    for name, param in model.params.items():
        indices = list(np.ndindex(param.shape))
        if len(indices) > 40:
            picks = noise.choice(len(indices), size=40, replace=False)
            indices = [indices[i] for i in picks]
        numeric, analytic = [], []
        for index in indices:
            saved = param[index]
            param[index] = saved + 1e-6
            up = objective()
            param[index] = saved - 1e-6
            down = objective()
            param[index] = saved
            numeric.append((up - down) / 2e-6)
            analytic.append(grads[name][index])
        error = np.abs(np.subtract(numeric, analytic)).max() / np.abs(numeric).max()
        assert error < 1e-5, (name, error)


def test_attention_is_causal_even_with_capacity_drops() -> None:
    """Changing a later token changes nothing at earlier positions, in any sequence of the
    batch, though the experts drop tokens."""
    cfg = {**SMALL, "capacity_factor": 0.5, "seq_len": 12}
    model = TinyTransformer(cfg, np.random.default_rng(3), dtype=np.float64)
    tokens = np.random.default_rng(4).integers(0, cfg["vocab_size"], size=(3, 12))
    before = model.logits(tokens)
    changed = tokens.copy()
    changed[1, 7] = (changed[1, 7] + 1) % cfg["vocab_size"]
    after = model.logits(changed)
    assert np.array_equal(before[:, :7], after[:, :7])
    assert not np.allclose(before[1, 7:], after[1, 7:])


def test_routing_keeps_the_first_tokens_up_to_capacity_and_counts_the_rest() -> None:
    probs = np.array(
        [
            [0.7, 0.2, 0.1],
            [0.6, 0.3, 0.1],
            [0.5, 0.1, 0.4],
            [0.8, 0.15, 0.05],
            [0.15, 0.8, 0.05],
        ]
    )
    kept, dropped = route(probs, top_k=1, capacity=2)
    assert [rows.tolist() for rows in kept] == [[0, 1], [4], []]
    assert dropped == 2  # rows 2 and 3 wanted expert 0, already full
    kept, dropped = route(probs, top_k=2, capacity=3)
    assert [rows.tolist() for rows in kept] == [[0, 1, 2], [0, 1, 3], [2]]
    assert dropped == 3  # rows 3 and 4 of expert 0, row 4 of expert 1
    kept, dropped = route(probs, top_k=2, capacity=5)
    assert dropped == 0 and sum(len(rows) for rows in kept) == 10


def test_drop_fraction_is_the_share_of_assignments_over_capacity(tmp_path: Path) -> None:
    tokens = np.random.default_rng(0).integers(0, 256, size=(4, 33))
    cfg = config(width=32, depth=2, seq_len=32, num_experts=4, top_k=1)
    roomy = TinyTransformer({**cfg, "capacity_factor": 4.0}, np.random.default_rng(0))
    tight = TinyTransformer({**cfg, "capacity_factor": 0.5}, np.random.default_rng(0))
    _, _, room = roomy.loss_and_grads(tokens, grads=False)
    _, _, cramped = tight.loss_and_grads(tokens, grads=False)
    assert room.assigned == cramped.assigned == 4 * 32 * 1 * 2  # tokens x top_k x layers
    assert room.dropped == 0
    # Four experts of capacity ceil(0.5 * 128 / 4) = 16 keep at most 64 of 128 per layer.
    assert cramped.dropped >= 2 * 64 and cramped.drop_fraction >= 0.5
    summary, recorder = train(config(width=32, depth=1, steps=4, capacity_factor=0.5), tmp_path)
    assert all(0.5 <= d <= 1 for d in recorder.series("moe/drop_fraction"))
    assert summary["moe/drop_fraction"] == recorder.series("moe/drop_fraction")[-1]


def test_same_config_and_seed_give_identical_losses(tmp_path: Path) -> None:
    cfg = config(width=32, depth=1, steps=12, eval_every=6)
    _, first = train(cfg, tmp_path)
    _, second = train(cfg, tmp_path)
    _, other_seed = train({**cfg, "seed": 1}, tmp_path)
    for key in ("train/loss", "eval/loss", "moe/drop_fraction"):
        assert first.series(key) == second.series(key), key
    assert len(first.series("train/loss")) == 12 and len(first.series("eval/loss")) == 2
    assert first.series("train/loss") != other_seed.series("train/loss")


def test_split_source_separates_code_from_docstrings_and_comments() -> None:
    source = (
        '"""The module says hello."""\n'
        "import os  # for the path\n"
        "\n"
        "# A lonely comment.\n"
        "def f(x):\n"
        '    """Add one.\n\n    Really.\n    """\n'
        "    return x + 1  # the answer\n"
        "s = '# not a comment'\n"
    )
    split = data.split_source(source)
    assert split is not None
    code, docs = split
    assert code == "import os\n\ndef f(x):\n    return x + 1\ns = '# not a comment'\n"
    assert docs.splitlines() == [
        "The module says hello.",
        "for the path",
        "A lonely comment.",
        "Add one.",
        "",
        "Really.",
        "the answer",
    ]
    assert data.split_source("def broken(:\n") is None


def test_the_corpus_is_this_pythons_standard_library_split_into_two_held_out_sources() -> None:
    corpus = data.load_corpus()
    assert corpus.files == tuple(sorted(corpus.files)) and len(corpus.files) >= 10
    assert corpus.eval_files and set(corpus.eval_files) < set(corpus.files)
    for name in corpus.files:  # the fixed subset: a rule on each file's own name
        assert zlib.crc32(name.encode()) % data.SUBSET_MODULUS == 0
    code = bytes(corpus.train["code"].astype(np.uint8)).decode()
    docs = bytes(corpus.train["docs"].astype(np.uint8)).decode()
    assert "def " in code and "return" in code and len(docs) > 20_000
    assert docs[:60] not in code  # the first docstring is in docs, not in code
    held_out = data.split_source(data.stdlib_root().joinpath(corpus.eval_files[0]).read_text())
    assert held_out is not None
    window = held_out[0][200:300]
    assert window in bytes(corpus.eval["code"].astype(np.uint8)).decode()
    assert window not in code  # held out of training


def _module(index: int) -> str:
    doc = f"Module number {index}, which documents itself at some length. " * 12
    body = "".join(f"def f{i}(x):\n    # step {i}\n    return x * {i}\n" for i in range(60))
    return f'"""{doc}"""\n{body}'


@pytest.fixture
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cache folder of the test's own (the trainers the suite starts share the user's)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    data.load_corpus.cache_clear()  # this process's own memo, so each call reads the folder
    return tmp_path / "cache" / "marin-tiny-moe"


def _library(folder: Path, modules: int = 80) -> Path:
    folder.mkdir()
    for index in range(modules):
        (folder / f"mod{index:02d}.py").write_text(_module(index))
    return folder


def _cuts(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Counts the files the corpus is cut from (none when it comes from the cache)."""
    seen: list[str] = []
    split = data.split_source

    def counting(text: str) -> tuple[str, str] | None:
        seen.append(text[:30])
        return split(text)

    monkeypatch.setattr(data, "split_source", counting)
    return seen


def _fresh(root: Path) -> data.Corpus:
    """The corpus as a new trainer process loads it (no memo of this process's)."""
    data.load_corpus.cache_clear()
    return data.load_corpus(root)


def _same(one: data.Corpus, other: data.Corpus) -> bool:
    return (
        one.files == other.files
        and one.eval_files == other.eval_files
        and all(
            np.array_equal(getattr(one, part)[s], getattr(other, part)[s])
            and getattr(other, part)[s].dtype == np.int64
            for part in ("train", "eval")
            for s in data.SOURCES
        )
    )


def test_the_corpus_is_cut_once_and_read_back_the_same(
    tmp_path: Path, own_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _library(tmp_path / "lib")
    cuts = _cuts(monkeypatch)
    first = data.load_corpus(root)
    assert cuts and len(list(own_cache.glob("corpus-*.npz"))) == 1
    cut_then = len(cuts)
    again = _fresh(root)
    assert len(cuts) == cut_then  # from the cache, nothing cut
    assert _same(first, again)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "elsewhere"))
    assert _same(_fresh(root), first)  # what the cache gave is what a cut gives
    assert len(cuts) == 2 * cut_then


def test_a_changed_file_or_a_broken_cache_is_cut_again(
    tmp_path: Path, own_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _library(tmp_path / "lib")
    cuts = _cuts(monkeypatch)
    first = data.load_corpus(root)
    cut_once = len(cuts)
    changed = root / first.files[0]
    changed.write_text(changed.read_text() + "def added(x):\n    return x\n")
    after = _fresh(root)
    assert len(cuts) == 2 * cut_once
    assert len(after.train["code"]) + len(after.eval["code"]) > len(first.train["code"]) + len(
        first.eval["code"]
    )
    kept = sorted(own_cache.glob("corpus-*.npz"), key=lambda path: path.stat().st_mtime_ns)
    assert len(kept) == 2
    kept[-1].write_bytes(b"PK\x03\x04 half a file")
    assert _same(_fresh(root), after)
    assert len(cuts) == 3 * cut_once
    assert _same(_fresh(root), after)  # written whole again
    assert len(cuts) == 3 * cut_once


def test_a_cache_that_cannot_be_written_is_passed_by(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))
    assert len(_fresh(_library(tmp_path / "lib")).files) > 10
    assert blocked.read_text() == ""


def test_a_standard_library_missing_files_gives_the_same_files_less_those(
    tmp_path: Path, own_cache: Path
) -> None:
    full, trimmed = tmp_path / "full", tmp_path / "trimmed"
    for folder in (full, trimmed):
        folder.mkdir()
        for index in range(80):
            (folder / f"mod{index:02d}.py").write_text(_module(index))
        (folder / "zz_py2.py").write_text("print 'old'\n")  # does not parse: skipped
        (folder / "zz_bytes.py").write_bytes(b"\xff\xfe\x00 not text")
    corpus = data.load_corpus(full)
    gone = corpus.files[3]
    (trimmed / gone).unlink()
    smaller = data.load_corpus(trimmed)
    assert smaller.files == tuple(name for name in corpus.files if name != gone)
    assert not {"zz_py2.py", "zz_bytes.py"} & set(corpus.files)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(data.CorpusError, match="bytes of code"):
        data.load_corpus(empty)


def test_data_mix_sets_the_batch_composition() -> None:
    corpus = data.load_corpus()

    def drawn(mix: dict[str, float]) -> np.ndarray:
        rng = np.random.default_rng(0)
        batch, sources = data.sample_batch(corpus.train, mix, 400, 32, rng)
        assert batch.shape == (400, 33)
        for row, source in zip(batch[:20], sources[:20], strict=True):  # each row's own text
            text = corpus.train[data.SOURCES[source]]
            starts = np.nonzero(text[:-33] == row[0])[0]
            assert any(np.array_equal(text[s : s + 33], row) for s in starts)
        return sources

    docs = data.SOURCES.index("docs")
    assert (drawn({"code": 1.0}) != docs).all()
    assert (drawn({"code": 0.0, "docs": 1.0}) == docs).all()
    share = (drawn({"code": 0.2, "docs": 0.8}) == docs).mean()
    assert 0.74 < share < 0.86


def test_knobs_change_the_curves_and_mfu_counts_attention(tmp_path: Path) -> None:
    base = config(steps=30, width=32, depth=1, eval_every=10, capacity_factor=2.0)
    roomy, _ = train(base, tmp_path)
    fast, _ = train({**base, "learning_rate": 0.02}, tmp_path)
    decayed, _ = train({**base, "weight_decay": 0.5}, tmp_path)
    docs_only, _ = train({**base, "data_mix": {"docs": 1.0}}, tmp_path)
    two_of_eight, _ = train({**base, "num_experts": 8, "top_k": 2}, tmp_path)
    finals = [r["train/loss"] for r in (roomy, fast, decayed, docs_only, two_of_eight)]
    assert len(set(finals)) == 5
    assert docs_only["eval/docs/loss"] < roomy["eval/docs/loss"]
    assert roomy["eval/code/loss"] < docs_only["eval/code/loss"]
    assert roomy["eval/loss"] == pytest.approx(
        (roomy["eval/code/loss"] + roomy["eval/docs/loss"]) / 2
    )
    assert roomy["train/loss"] < 0.75 * math.log(256)
    cfg = base
    assert flops_per_token(cfg) == 6 * param_count(cfg, active=True) + 12 * 1 * 64 * 32
    # MFU in percent, as Levanter logs it: model FLOP/s over the peak, times 100.
    stated = (
        roomy["throughput/mfu"] / 100 * cfg["peak_flops"] / roomy["throughput/tokens_per_second"]
    )
    assert stated == pytest.approx(flops_per_token(cfg))


def test_smallest_scale_runs_offline_prints_progress_and_learns(tmp_path: Path) -> None:
    """How long it takes is bench/trainer.py's figure."""
    small = {**TINY_MOE["default_config"], **TINY_MOE["scales"]["small"]}
    (tmp_path / "config.json").write_text(json.dumps(small))
    done = subprocess.run(
        [sys.executable, "-m", "trainers.tiny_moe", "--config", "config.json"],
        cwd=tmp_path,
        env={"PYTHONPATH": str(settings.BASE_DIR), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    progress = [line for line in done.stdout.splitlines() if line.startswith("step ")]
    assert progress[-1].startswith(f"step {small['steps']}/{small['steps']} train/loss ")
    assert "standard-library files" in done.stdout.splitlines()[0]
    line = json.loads((tmp_path / "tracker_metrics.jsonl").read_text().splitlines()[-1])
    assert set(line) == {"config", "summary"}
    assert line["config"]["width"] == TINY_MOE["scales"]["small"]["width"]
    summary = line["summary"]
    assert summary["eval/loss"] < 0.6 * math.log(256)  # far below a uniform guess
    for key in (
        "train/loss",
        "throughput/tokens_per_second",
        "throughput/mfu",
        "moe/drop_fraction",
    ):
        assert key in summary


@pytest.mark.parametrize(
    "bad",
    [
        {"top_k": 5, "num_experts": 4},
        {"data_mix": {"code": 0.0}},
        {"data_mix": {"web": 1.0}},
        {"width": 0},
        {"width": 40},  # not a multiple of the heads' 16
        {"capacity_factor": -1},
        [1, 2],
    ],
)
def test_refused_config_exits_with_2(tmp_path: Path, bad: Any) -> None:
    (tmp_path / "config.json").write_text(json.dumps(bad))
    assert (
        tiny_moe.main(["--config", str(tmp_path / "config.json"), "--output", str(tmp_path)]) == 2
    )
    assert not (tmp_path / "tracker_metrics.jsonl").exists()


def test_the_trainer_imports_numpy_and_the_standard_library_only() -> None:
    """A Ray cluster's Python (RUNS_RAY_PYTHON) needs numpy, not the site's dependencies."""
    check = (
        "import sys, trainers.tiny_moe.train; print(sorted({'yaml', 'django'} & set(sys.modules)))"
    )
    result = subprocess.run(  # noqa: S603  (our own interpreter and code)
        [sys.executable, "-c", check],
        cwd=settings.BASE_DIR,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert result.stdout.strip() == "[]"
