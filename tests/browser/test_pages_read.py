"""Every page of the demo, read as a reader would: Chromium at 1280 and 390 px.

``seed_demo`` fills the site (proposals in every state, finished plans with telemetry, the
campaign, the pool, the recipes); a maintainer signed in sees the most of each page (its
forms included). On every page, at both widths:

- nothing runs off the side: the page does not scroll sideways, and a table, a chart or a
  block of code either fits or sits in a scrolling box that fits (a scrolling container is
  fine, a cut column is not);
- every chart that drew has titles for both axes;
- no raw enumeration code (``did_not_work``, ``changes_requested``...) and no "None" in the
  visible text (code, config keys and form controls aside);
- no form posts to an API route (``/api/``, ``/mlflow/``).

And the units of one declared percent (MFU) and one declared fraction (the drop fraction)
agree between the tables, the charts (axis title and ticks) and the ranges (seed spreads,
the campaign's interquartile ranges); the charts' script writes a value as the tables do.
Screenshots go to var/artifacts/pages/ (ignored by git), not into the repository.
"""

from __future__ import annotations

import re
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from playwright.sync_api import Page

from marin_site.doors import Door
from marin_site.events import Verb
from proposals.models import Outcome, Proposal, State
from runs.alerts.models import AlertKind
from runs.campaigns.models import Campaign
from runs.metrics.display import number_text
from runs.models import FailureKind, Run, RunOrigin, RunState
from runs.services import dispatch
from tests.browser.conftest import BrowserSession, artifact_path, sign_in

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

WIDTHS = (1280, 390)
DEMO_PASSWORD = "marin-demo"

# Codes a reader should never see: every enumeration value that is not already words.
RAW_CODES = sorted(
    {
        value
        for choices in (State, Outcome, Verb, Door, AlertKind, FailureKind, RunOrigin)
        for value in choices.values
        if "_" in value
    }
)

OVERFLOW = """() => {
  const vw = document.documentElement.clientWidth;
  const problems = [];
  const root = document.scrollingElement;
  if (root.scrollWidth > vw + 1) problems.push(`the page scrolls sideways: ${root.scrollWidth} > ${vw}`);
  const name = (el) => `${el.tagName.toLowerCase()}${el.id ? "#" + el.id : ""}${el.className && typeof el.className === "string" ? "." + el.className.trim().split(/\\s+/).join(".") : ""}`;
  const scrolls = (el) => ["auto", "scroll"].includes(getComputedStyle(el).overflowX);
  const clips = (el) => ["hidden", "clip"].includes(getComputedStyle(el).overflowX);
  for (const el of document.querySelectorAll("table, figure.chart, .chart-plot canvas, pre")) {
    if (!el.getClientRects().length || !el.checkVisibility()) continue;
    let box = scrolls(el) ? el : null;
    for (let p = el.parentElement; !box && p && p !== document.body; p = p.parentElement) {
      if (scrolls(p)) box = p;
      else if (clips(p) && el.getBoundingClientRect().right > p.getBoundingClientRect().right + 1)
        problems.push(`${name(el)} is cut by ${name(p)}`);
    }
    const r = (box || el).getBoundingClientRect();
    if (r.right > vw + 1 || r.left < -1) problems.push(`${name(box || el)} runs off the page: ${Math.round(r.left)}..${Math.round(r.right)} of ${vw}`);
  }
  return problems;
}"""

VISIBLE_TEXT = """() => {
  const skip = new Set(["CODE", "PRE", "KBD", "SAMP", "TEXTAREA", "SELECT", "OPTION", "SCRIPT", "STYLE", "TEMPLATE", "NOSCRIPT"]);
  const out = [];
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    let el = node.parentElement;
    let hidden = !el || !el.checkVisibility();
    for (let p = el; !hidden && p; p = p.parentElement) if (skip.has(p.tagName)) hidden = true;
    if (!hidden && node.textContent.trim()) out.push(node.textContent.trim());
  }
  return out.join("\\n");
}"""

CHARTS = """() => Array.from(document.querySelectorAll("figure.chart"), (f) => ({
  key: f.dataset.chartKey || f.dataset.chartKind || f.id,
  drawn: f.dataset.drawn === "true",
  empty: f.classList.contains("chart-empty"),
  y: (f.querySelector(".axis-title-y") || {}).textContent || "",
  x: (f.querySelector(".axis-title-x") || {}).textContent || "",
  yTicks: f.dataset.yTicks || "",
  xTicks: f.dataset.xTicks || "",
}))"""

CHARTS_SETTLED = """() => Array.from(document.querySelectorAll("figure.chart")).every(
  (f) => f.dataset.drawn === "true" || f.classList.contains("chart-empty") || !f.checkVisibility()
)"""

FORMS = """() => Array.from(document.forms, (f) => [f.method, new URL(f.action, location.href).pathname])"""


def _seed(settings: Any) -> dict[str, Any]:
    """The demo, and the pages it makes: (name, path) in the order a reader meets them."""
    settings.DEBUG = True
    call_command("seed_demo", stdout=StringIO())
    settings.DEBUG = False
    proposals = {p.title: p for p in Proposal.objects.all()}
    by_state: dict[str, Proposal] = {}
    for proposal in Proposal.objects.order_by("pk"):
        key = f"{proposal.state}-{proposal.outcome or 'open'}"
        by_state.setdefault(key, proposal)
    # The approved proposal without results: its runs created (no worker here), so they wait
    # in the queue and a maintainer may claim one.
    waiting = proposals["z-loss at the 8B scale"].plan_id
    assert waiting is not None
    dispatch.plan_expand(plan_id=waiting)
    eight = proposals["Eight experts instead of four"]
    tiny_runs = list(Run.objects.filter(plan=eight.plan).order_by("pk"))
    campaign = Campaign.objects.get(slug="moe-535b-demo")
    live_run = campaign.members.order_by("-order").first().run  # type: ignore[union-attr]
    queued = Run.objects.filter(state=RunState.QUEUED).order_by("pk").first()
    marin_run = Run.objects.filter(
        plan=proposals["Capacity factor 1.25 at 1B"].plan, state=RunState.FINISHED
    ).first()
    assert queued is not None and marin_run is not None
    pages = [
        ("list", "/"),
        *((f"proposal-{key}", f"/proposals/{p.pk}/") for key, p in by_state.items()),
        ("run-finished", f"/runs/{tiny_runs[0].pk}/"),
        ("run-campaign", f"/runs/{live_run.pk}/"),
        ("run-queued", f"/runs/{queued.pk}/"),
        ("compare", f"/runs/compare/?ids={tiny_runs[0].pk},{tiny_runs[1].pk},{marin_run.pk}"),
        ("campaigns", "/campaigns/"),
        ("campaign", f"/campaigns/{campaign.slug}/"),
        ("archive", "/archive/"),
        ("search", "/search/?q=moe"),
        ("pools", "/pools/"),
        ("pool", "/pools/community-gpus/"),
        ("recipes", "/recipes/"),
        ("recipe", "/recipes/tiny-moe/v1/"),
        ("board", "/board/?track=demo-tiny-moe-eval-loss"),
        ("board-speedup", "/board/?track=demo-tiny-moe-speedup"),
    ]
    assert {State.DRAFT, State.SUBMITTED, State.APPROVED, State.REJECTED, State.CANCELED} <= {
        p.state for p in by_state.values()
    }
    return {"pages": pages, "eight": eight, "live_run": live_run, "campaign": campaign}


def _read(page: Page, path: str) -> None:
    response = page.goto(path)
    assert response is not None and response.ok, f"{path} answered {response and response.status}"
    page.wait_for_function(CHARTS_SETTLED, timeout=15_000)


def _problems(page: Page, name: str) -> list[str]:
    found = [f"{name}: {p}" for p in page.evaluate(OVERFLOW)]
    for chart in page.evaluate(CHARTS):
        if chart["drawn"] and not (chart["x"].strip() and chart["y"].strip()):
            found.append(f"{name}: the chart {chart['key']} has no axis titles: {chart}")
    text = page.evaluate(VISIBLE_TEXT)
    for code in RAW_CODES:
        if re.search(rf"(?<![\w/.-]){re.escape(code)}(?![\w/-])", text):
            found.append(f"{name}: the raw code {code!r} is visible")
    if re.search(r"\bNone\b", text):
        line = next(line for line in text.splitlines() if re.search(r"\bNone\b", line))
        found.append(f"{name}: 'None' is visible: {line[:120]!r}")
    for method, action in page.evaluate(FORMS):
        if action.startswith(("/api/", "/mlflow/")):
            found.append(f"{name}: a form ({method}) posts to the API route {action}")
    return found


def test_every_page_reads_at_a_laptops_and_a_phones_width(
    browser_session: BrowserSession, settings: Any
) -> None:
    seeded = _seed(settings)
    page = browser_session.new_page()
    sign_in(page, "max", DEMO_PASSWORD)
    problems: list[str] = []
    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": 900})
        for name, path in seeded["pages"]:
            _read(page, path)
            page.screenshot(path=artifact_path(f"pages/{name}-{width}.png"), full_page=True)
            problems += _problems(page, f"{name} at {width}px")
    assert not problems, "\n".join(problems)


def _chart(page: Page, key: str) -> dict[str, Any]:
    charts = {c["key"]: c for c in page.evaluate(CHARTS)}
    assert key in charts and charts[key]["drawn"], f"no chart of {key}: {list(charts)}"
    return charts[key]


def _cell(page: Page, selector: str) -> str:
    return page.locator(selector).first.inner_text().strip()


PERCENT = re.compile(r"^\d+(\.\d)?%$")
FRACTION = re.compile(r"^0\.\d{2,4}$")


def test_a_percent_and_a_fraction_read_alike_in_tables_charts_and_ranges(
    browser_session: BrowserSession, settings: Any
) -> None:
    seeded = _seed(settings)
    page = browser_session.new_page()

    # The proposal page: the run table, the seed table's spreads and the charts.
    _read(page, f"/proposals/{seeded['eight'].pk}/")
    headers = page.locator("#runs-table thead th").all_inner_texts()
    assert any(h.replace("\n", " ") == "MFU (%)" for h in headers), headers
    assert any(h.replace("\n", " ") == "Dropped tokens (fraction)" for h in headers), headers
    assert PERCENT.match(_cell(page, '#runs-table td[data-metric-key="throughput/mfu"]'))
    assert FRACTION.match(_cell(page, '#runs-table td[data-metric-key="moe/drop_fraction"]'))
    spread = _cell(page, '#seed-table td[data-metric-key="throughput/mfu"]').split()
    assert PERCENT.match(spread[0]) and spread[1] == "±" and PERCENT.match(spread[2]), spread
    spread = _cell(page, '#seed-table td[data-metric-key="moe/drop_fraction"]').split()
    assert FRACTION.match(spread[0]) and not spread[2].endswith("%"), spread
    # At a laptop's width the seed table shows every column without scrolling.
    wrap = page.evaluate(
        "() => { const w = document.querySelector('#seed-table').parentElement;"
        " return [w.scrollWidth, w.clientWidth]; }"
    )
    assert wrap[0] <= wrap[1], f"the seed table scrolls at 1280 px: {wrap}"
    mfu = _chart(page, "throughput/mfu")
    assert mfu["y"] == "MFU (%)" and mfu["x"] == "Step"
    assert all(t.endswith("%") for t in mfu["yTicks"].split("|")), mfu
    drop = _chart(page, "moe/drop_fraction")
    assert drop["y"] == "Dropped tokens (fraction)"
    assert all(float(t) < 1 and "%" not in t for t in drop["yTicks"].split("|")), drop
    assert "T" not in _chart(page, "train/loss")["xTicks"]  # steps: 50, 100, never "100T"

    # The compare page (runs of two recipes): the same columns, the same units.
    runs = list(Run.objects.filter(plan=seeded["eight"].plan).order_by("pk"))[:2]
    _read(page, f"/runs/compare/?ids={runs[0].pk},{runs[1].pk}")
    headers = [h.replace("\n", " ") for h in page.locator("#runs-table thead th").all_inner_texts()]
    assert "MFU (%)" in headers and "Dropped tokens (fraction)" in headers, headers
    assert PERCENT.match(_cell(page, '#runs-table td[data-metric-key="throughput/mfu"]'))
    assert FRACTION.match(_cell(page, '#runs-table td[data-metric-key="moe/drop_fraction"]'))
    assert _chart(page, "throughput/mfu")["y"] == "MFU (%)"

    # The run page of the campaign's live attempt: its declared metrics and its charts.
    _read(page, f"/runs/{seeded['live_run'].pk}/")
    last = page.locator('table.declared-metrics tr[data-metric-key="throughput/mfu"] td').first
    assert PERCENT.match(last.inner_text().strip())
    last = page.locator('table.declared-metrics tr[data-metric-key="moe/drop_fraction"] td').first
    assert FRACTION.match(last.inner_text().strip())
    assert all(t.endswith("%") for t in _chart(page, "throughput/mfu")["yTicks"].split("|"))

    # The campaign: its charts by tokens seen, and the interventions' ranges.
    _read(page, f"/campaigns/{seeded['campaign'].slug}/")
    mfu = _chart(page, "throughput/mfu")
    assert mfu["y"] == "MFU (%)" and mfu["x"] == "Tokens seen"
    assert all(t.endswith("%") for t in mfu["yTicks"].split("|")), mfu
    assert all(re.fullmatch(r"[\d.]+[kMBT]?", t) for t in mfu["xTicks"].split("|")), mfu
    drop = _chart(page, "moe/drop_fraction")
    assert all("%" not in t for t in drop["yTicks"].split("|")), drop
    effect = page.locator('.effect[data-key="throughput/mfu"]')
    for side in ("before", "after"):
        low, high = effect.locator(f'.effect-range[data-side="{side}"]').inner_text().split("–")
        assert PERCENT.match(low) and PERCENT.match(high), (low, high)
        assert 15 < float(low[:-1]) < 35  # Levanter's percent, never multiplied again
    effect = page.locator('.effect[data-key="moe/drop_fraction"]')
    low, high = effect.locator('.effect-range[data-side="before"]').inner_text().split("–")
    assert FRACTION.match(low) and FRACTION.match(high), (low, high)
    projection = _chart(page, "projection")
    assert projection["x"] == "Training compute (FLOPs)"
    assert not re.search(r"\d{4,}[A-Z]", projection["xTicks"]), projection  # no "100000000T"

    # The charts' script writes a value as the tables do.
    cases = [
        ("percent", 17.42),
        ("percent", 0.02),
        ("fraction", 0.0234),
        ("fraction", 0.0021),
        ("tokens/s", 460681.2),
        ("nats", 3.149),
        ("", 12.5),
    ]
    written = page.evaluate(
        "(cases) => cases.map(([unit, v]) => window.MarinUnits.text(unit, v))", cases
    )
    assert written == [number_text(value, unit) for unit, value in cases]
