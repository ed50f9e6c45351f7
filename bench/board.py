#!/usr/bin/env python
"""The board's writes and its export, on the database ``bench/pages.py`` seeds:

    .venv/bin/python bench/pages.py --pages board ...     # seeds 10,000 runs over 20 tracks
    .venv/bin/python bench/board.py --database-url postgres://postgres@127.0.0.1:5432/marin_bench

A track reading every seeded run (``bench-board-all``: 10,000 finished runs, any origin) is
ranked with ``runs.board.rank.track_rank`` (what a finished run's nudge does), then ranked
again after one more run finished ahead of the others (every rank shifts by one: the
recorded changes are the track's first ``top_n``). Its ``runs.json`` is then streamed
through Django's test client: the time to the first chunk, the whole, the bytes, the chunks
and the process's peak memory before and after (the export never holds the whole board).
Prints one line per figure and a markdown table. The track and its extra run are deleted
at the end.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main(argv: list[str]) -> int:  # noqa: PLR0915 (one straight-line run)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", default="postgres://postgres@127.0.0.1:5432/marin_bench")
    args = parser.parse_args(argv)
    os.environ.update(
        {
            "DJANGO_SETTINGS_MODULE": "marin_site.settings",
            "DATABASE_URL": args.database_url,
            "DEBUG": "0",
            "SECRET_KEY": "bench-board-not-a-secret-" + "x" * 40,
            "ALLOWED_HOSTS": "testserver",
            "LOG_LEVEL": "WARNING",
            "PAGE_CACHE_SECONDS": "0",
        }
    )
    import django

    django.setup()
    from django.test import Client

    from runs.board.models import BoardEntry, BoardRankChange, BoardTrack
    from runs.board.rank import track_rank
    from runs.models import Run

    runs = Run.objects.filter(recipe_name__startswith="bench-board-", state="finished").count()
    if runs < 1000:
        raise SystemExit(f"only {runs} seeded board runs: run bench/pages.py --pages board first")
    BoardTrack.objects.filter(slug="bench-board-all").delete()
    track = BoardTrack.objects.create(
        slug="bench-board-all",
        title="Every seeded run, lowest BPB",
        metric="eval/paloma/c4_en/bpb",
        rule="lowest",
        parameters={},
        position=999,
        active=False,  # never on the pages the other benchmark drives
    )
    figures: list[tuple[str, str]] = []
    started = time.perf_counter()
    first = track_rank(track)
    figures.append(("first ranking", f"{(time.perf_counter() - started) * 1000:,.0f} ms"))
    figures.append(("entries", f"{first.entries:,}"))
    # One run finishes ahead of every other: all ranks shift by one.
    best = BoardEntry.objects.get(track=track, rank=1).run
    metrics = dict(best.final_metrics)
    metrics["eval/paloma/c4_en/bpb"] = metrics["eval/paloma/c4_en/bpb"] - 0.01
    best.pk = None
    best.final_metrics = metrics
    best.imported_from = "bench:board-extra"
    best.sequence = best.sequence + 1  # a rerun of the same entry
    best.save()
    started = time.perf_counter()
    second = track_rank(track)
    figures.append(
        ("ranking after a newcomer", f"{(time.perf_counter() - started) * 1000:,.0f} ms")
    )
    figures.append(("rank changes recorded", f"{second.changes}"))
    # The export, streamed.
    BoardTrack.objects.filter(pk=track.pk).update(active=True)
    client = Client()
    client.get("/board/runs.json?track=nope")  # the URLconf and views imported, not billed
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.perf_counter()
    response = client.get("/board/runs.json?track=bench-board-all")
    chunks = iter(response.streaming_content)  # type: ignore[attr-defined]
    size = len(next(chunks))
    first_chunk = time.perf_counter() - started
    count = 1
    for chunk in chunks:
        size += len(chunk)
        count += 1
    whole = time.perf_counter() - started
    rss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    figures += [
        ("export: first chunk", f"{first_chunk * 1000:,.1f} ms"),
        ("export: whole", f"{whole * 1000:,.0f} ms"),
        ("export: bytes, chunks", f"{size:,} bytes in {count:,} chunks"),
        (
            "peak RSS before, after the export",
            f"{rss_before / 1024:,.0f} MB, {rss_after / 1024:,.0f} MB",
        ),
    ]
    Run.objects.filter(imported_from="bench:board-extra").delete()
    BoardRankChange.objects.filter(track=track).delete()
    track.delete()
    load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    print(f"date: {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC, load average {load}")
    for name, value in figures:
        print(f"{name}: {value}")
    print("\n| figure | value |\n|---|---|")
    for name, value in figures:
        print(f"| {name} | {value} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
