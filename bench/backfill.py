#!/usr/bin/env python
"""``manage.py github_backfill`` against a large fake repository.

    .venv/bin/python bench/backfill.py                      # 2,000 issues, 30,000 comments
    .venv/bin/python bench/backfill.py --issues 200 --comments 3000 --record

Steps: a fresh PostgreSQL database (default ``h_backfill_bench``), migrated, the recipes
loaded; the fake GitHub (proposals/github/fake.py) in this process, seeded with ``--issues``
experiment issues spread over the three experiment labels (some under two, a tenth closed,
a tracker's sub-issues), 100 pull requests carrying the label, 200 issues that are not
experiments, and ``--comments`` comments on the experiment issues. GitHub sync is on (a
token and the repository are set), its primary rate limit off. Then the command runs twice
in a child process:

- the first run: requests sent, wall time, writes to GitHub, the child's peak RSS;
- a rerun with nothing new: requests, wall time, what it changed (nothing, it must say).

Targets (issue #27): at most 2,200 requests, under 5 minutes, 0 writes, a rerun under one
minute, an RSS under 300 MB. ``--record`` writes the figures to bench/RESULTS.md under
"## backfill (bench/backfill.py)".
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from proposals.github.fake import FakeGitHub  # noqa: E402  (after the path)

VENV = ROOT / ".venv" / "bin"
SECTION = "## backfill (bench/backfill.py)"
REPO = "marin-community/marin"
LABELS = ("experiment", "experiments", "community-experiment-submission")
BODY = (
    "## Description\n\nRun {n}: swap the router for variant {n}.\n\n"
    "## Hypothesis or Goal\n\nVariant {n} lowers the Paloma macro loss.\n\n"
    "## Results\n\n| run | loss |\n|---|---|\n| {n} | 3.{n:03d} |\n"
)


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def stamp(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def seed(fake: FakeGitHub, issues: int, comments: int) -> None:
    start = datetime(2024, 3, 1, tzinfo=UTC)
    numbers = []
    tracker = None
    for n in range(issues):
        labels = [LABELS[0] if n % 10 < 6 else LABELS[1] if n % 10 < 9 else LABELS[2]]
        if n % 25 == 0:
            labels.append(LABELS[1] if labels[0] != LABELS[1] else LABELS[0])
        created = start + timedelta(hours=6 * n)
        issue = fake.add_issue(
            title=f"Experiment {n}",
            body=BODY.format(n=n),
            login=f"researcher{n % 150}",
            labels=[*labels, "moe"] if n % 3 == 0 else labels,
            created_at=stamp(created),
            closed_at=stamp(created + timedelta(days=20)) if n % 10 == 0 else None,
            parent=tracker if n % 7 == 0 and tracker else None,
        )
        tracker = tracker or issue["number"]
        numbers.append(issue["number"])
        if n % 20 == 0:
            fake.add_issue(title=f"PR {n}", body="a pull request", labels=labels, pull_request=True)
        if n % 10 == 0:
            fake.add_issue(title=f"Question {n}", body="not an experiment", labels=["question"])
    for c in range(comments):
        number = numbers[c % len(numbers)]
        fake.add_comment(
            number=number,
            body=f"Comment {c}: the loss at step {c * 10} is 3.{c % 1000:03d}.",
            login=f"commenter{c % 200}",
            created_at=stamp(start + timedelta(minutes=c)),
        )


def environment(args: argparse.Namespace, fake: FakeGitHub) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "DATABASE_URL": args.database,
            "DEBUG": "0",
            "SECRET_KEY": "bench-" + "x" * 40,
            "GITHUB_API_URL": fake.url,
            "GITHUB_TOKEN": "bench-token",
            "GITHUB_REPOSITORY": REPO,  # sync on: the imported proposals must stay quiet
            "GITHUB_MAINTAINERS": "",
            "GITHUB_REVIEWERS": "",
            "LOG_LEVEL": "WARNING",
        }
    )
    return env


def prepare(env: dict[str, str], database: str) -> None:
    name = database.rsplit("/", 1)[1]
    for command in (["dropdb", "--if-exists"], ["createdb"]):
        subprocess.run([*command, "-h", "127.0.0.1", "-U", "postgres", name], env=env, check=True)
    for step in (["migrate", "--noinput", "-v", "0"], ["load_recipes"]):
        subprocess.run(
            [str(VENV / "python"), "manage.py", *step],
            cwd=ROOT,
            env=env,
            check=True,
            stdout=subprocess.DEVNULL,
        )


def run(env: dict[str, str]) -> tuple[float, float, str]:
    """One run of the command in a child: wall seconds, its peak RSS (MB), its summary."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        started = time.monotonic()
        child = subprocess.Popen(
            [str(VENV / "python"), "manage.py", "github_backfill", REPO, "--no-progress"],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=err,
        )
        _, status, usage = os.wait4(child.pid, 0)  # this child's own peak RSS
        child.returncode = os.waitstatus_to_exitcode(status)
        wall = time.monotonic() - started
        out.seek(0)
        err.seek(0)
        if child.returncode:
            raise RuntimeError(f"github_backfill failed: {err.read()[-2000:]}")
        lines = out.read().strip().splitlines()
    return wall, usage.ru_maxrss / 1024, lines[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--issues", type=int, default=2000)
    parser.add_argument("--comments", type=int, default=30000)
    parser.add_argument("--database", default="postgres://postgres@127.0.0.1:5432/h_backfill_bench")
    parser.add_argument("--record", action="store_true")
    args = parser.parse_args()
    fake = FakeGitHub(repository=REPO).start()
    env = environment(args, fake)
    log("database: fresh, migrated, recipes loaded")
    prepare(env, args.database)
    log(f"seeding {args.issues} issues, {args.comments} comments")
    seed(fake, args.issues, args.comments)
    fake.state.requests.clear()
    log("first run")
    wall, rss, summary = run(env)
    requests, writes = len(fake.state.requests), len(fake.writes())
    log(summary)
    fake.state.requests.clear()
    log("rerun, nothing new")
    wall2, rss2, summary2 = run(env)
    requests2, writes2 = len(fake.state.requests), len(fake.writes())
    log(summary2)
    created = int(re.search(r"created: (\d+)", summary)[1])  # type: ignore[index]
    comments = int(re.search(r"comments created: (\d+)", summary)[1])  # type: ignore[index]
    changed = re.search(r"created: (\d+), updated: (\d+)", summary2)
    figures = [
        f"- {args.issues} experiment issues ({created} imported), {args.comments} comments "
        f"({comments} mirrored), {(args.issues + 19) // 20} pull requests and "
        f"{(args.issues + 9) // 10} other issues beside them",
        f"- first run: {requests} requests (target <= 2,200), {wall:.1f} s wall "
        f"(target < 300 s), {writes} writes to GitHub (target 0), peak RSS {rss:.0f} MB "
        "(target < 300 MB)",
        f"- rerun, nothing new: {requests2} requests, {wall2:.1f} s wall (target < 60 s), "
        f"{writes2} writes, peak RSS {rss2:.0f} MB, changed: "
        f"{'created ' + changed[1] + ', updated ' + changed[2] if changed else summary2}",
    ]
    print("\n".join(figures))
    fake.stop()
    if args.record:
        day = datetime.now(UTC).strftime("%Y-%m-%d")
        text = (ROOT / "bench" / "RESULTS.md").read_text()
        block = (
            f"\n{SECTION}\n\n{day}, `.venv/bin/python bench/backfill.py` (PostgreSQL, the fake GitHub in the bench's process, a 2-core machine shared with other jobs):\n\n"
            + "\n".join(figures)
            + "\n"
        )
        if SECTION in text:
            head, _, tail = text.partition(SECTION)
            rest = tail.split("\n## ", 1)
            text = head.rstrip("\n") + "\n" + block + ("\n## " + rest[1] if len(rest) > 1 else "")
        else:
            text = text.rstrip("\n") + "\n" + block
        (ROOT / "bench" / "RESULTS.md").write_text(text)


if __name__ == "__main__":
    main()
