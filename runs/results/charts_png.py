"""The PNG of a plan's main loss chart, drawn on the server with matplotlib for places that
cannot run JavaScript (the GitHub result comment, a README, a chat message).

The curves come from the same downsampled rollup the interactive charts read
(``runs.series``), never from the points, so a plan of 64 runs with 100,000 steps each costs
a few queries. matplotlib draws through its Agg canvas from a bare ``Figure`` (no pyplot, no
display, no state shared between requests). The image is cached under a version made of the
plan's latest metric change (points counted and the highest step of the key's summaries)
and the runs' states; while a rollup is still catching up with its points the image is drawn
but not cached, so a finished plan never keeps a lagging picture.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Sequence
from dataclasses import dataclass

import orjson
from django.core.cache import cache

from runs.models import MetricSummary, Run
from runs.results.summary import latest_runs
from runs.series import charts

POINTS = 400
LOSS_KEYS = ("eval/loss", "train/loss")
CACHE_SECONDS = 24 * 3600


@dataclass(frozen=True)
class Line:
    label: str
    steps: list[int]
    values: list[float]
    is_baseline: bool = False
    title: str = ""  # the key's axis title, as the pages write it ("Eval loss (nats)")


@dataclass(frozen=True)
class LossChart:
    """What the PNG is drawn from, and the version its cached bytes are filed under."""

    plan_id: int
    key: str
    runs: list[Run]
    version: str
    settled: bool


def loss_chart_find(*, plan_id: int, key: str = "") -> LossChart | None:
    """The plan's runs and the loss key to draw (``key``, else eval/loss, else train/loss,
    else any key with "loss" in it); None when there is nothing to draw. Two queries."""
    runs = latest_runs(plan_id=plan_id)
    sources = {run.cached_from_id or run.pk for run in runs}
    totals: dict[str, list[int]] = {}
    stale: set[str] = set()
    for summary_key, count, step, stale_from in MetricSummary.objects.filter(
        run_id__in=sources
    ).values_list("key", "count", "step", "stale_from"):
        total = totals.setdefault(summary_key, [0, 0])
        total[0] += count
        total[1] = max(total[1], step)
        if stale_from is not None:
            stale.add(summary_key)
    candidates = [key] if key else [*LOSS_KEYS, *sorted(k for k in totals if "loss" in k)]
    chosen = next((k for k in candidates if k in totals), "")
    if not chosen:
        return None
    states = ",".join(f"{run.pk}:{run.state}" for run in runs)
    raw = f"{chosen}|{totals[chosen][0]}|{totals[chosen][1]}|{states}"
    version = hashlib.sha256(raw.encode()).hexdigest()[:20]
    return LossChart(
        plan_id=plan_id, key=chosen, runs=runs, version=version, settled=chosen not in stale
    )


def loss_lines(chart: LossChart, *, points: int = POINTS) -> list[Line]:
    """Each run's curve (the mean of each step range) from the plan's chart series."""
    body = charts.plan_series(plan_id=chart.plan_id, keys=[chart.key], points=points)
    if body is None:
        return []
    data = orjson.loads(body)
    shown = {run.pk for run in chart.runs}  # the newest run of each plan entry
    runs = {run["id"]: run for run in data["runs"]}
    title = (data.get("metrics") or {}).get(chart.key, {}).get("title", chart.key)
    lines = []
    for line in data["series"].get(chart.key, []):
        run = runs.get(line["run"])
        if run is None or run["id"] not in shown or not line["step"]:
            continue
        lines.append(
            Line(
                label=f"#{run['id']} {run['label']}",
                steps=line["step"],
                values=line["value"],
                is_baseline=bool(run["baseline"]),
                title=title,
            )
        )
    return lines


def _plain(text: str) -> str:
    """matplotlib reads ``$...$`` as TeX math: a label is text, never markup."""
    return text.replace("\\", "\\\\").replace("$", r"\$")


def render_png(*, title: str, key: str, lines: Sequence[Line], log_y: bool = False) -> bytes:
    """The chart: ``key``'s lines by step, the y axis titled as the pages title it (its
    declared name and unit, ``runs.metrics.display``)."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(8, 4.5), dpi=100, layout="constrained")
    axes = figure.add_subplot()
    for index, line in enumerate(lines):
        axes.plot(
            line.steps,
            line.values,
            label=_plain(line.label[:60]),
            color="black" if line.is_baseline else f"C{index % 10}",
            linewidth=1.8 if line.is_baseline else 1.2,
        )
    axes.set_title(_plain(title[:120]), fontsize=11)
    axes.set_xlabel("Step")
    axes.set_ylabel(_plain(next((line.title for line in lines if line.title), key)[:80]))
    axes.grid(alpha=0.3)
    if log_y and all(v > 0 for line in lines for v in line.values):
        axes.set_yscale("log")
    if 0 < len(lines) <= 12:
        axes.legend(fontsize=7, loc="upper right", framealpha=0.8)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", metadata={"Software": None})
    return buffer.getvalue()


def loss_chart_png(chart: LossChart, *, log_y: bool = False) -> bytes | None:
    """The chart's PNG from the cache, or drawn and cached; None when no run has points."""
    cache_key = f"runs:loss-png:{chart.plan_id}:{chart.version}:{int(log_y)}"
    cached = cache.get(cache_key) if chart.settled else None
    if isinstance(cached, bytes):
        return cached
    lines = loss_lines(chart)
    if not lines:
        return None
    png = render_png(
        title=f"plan {chart.plan_id}: {chart.key}", key=chart.key, lines=lines, log_y=log_y
    )
    if chart.settled:
        cache.set(cache_key, png, CACHE_SECONDS)
    return png
