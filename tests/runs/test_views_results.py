"""The proposal page as the report of its runs: run table, charts wiring, live partial,
scaling ladder, compare page, loss PNG, and the weight of the page's JS and CSS."""

from __future__ import annotations

import gzip
import re
from typing import Any

import pytest
from django.contrib.staticfiles import finders
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from proposals.models import State
from runs.metrics import ingest
from runs.metrics.parse import PointBatch
from runs.models import Plan, Run, RunState
from runs.results import summary as results
from runs.series import rollup
from runs.services import runs as run_writes
from tests.factories import ProposalFactory
from tests.runs.runs_helpers import FAST_BASELINE, launched_plan

pytestmark = pytest.mark.django_db

GRID_SPEC = """axes:
  capacity_factor: [1.5, 2.0]
"""
LADDER_SPEC = """axes:
  capacity_factor: [2.0]
scales: [small, medium]
"""
PAGE_WEIGHT_LIMIT = 300 * 1024


def _spec_of(count: int) -> str:
    """A grid of ``count`` runs: the baseline and ``count - 1`` learning rates."""
    rates = ", ".join(f"{0.0001 * (i + 1):.4f}" for i in range(count - 1))
    return f"axes:\n  learning_rate: [{rates}]\n"


def _proposal_for(plan: Plan, contributor: Any) -> Any:
    return ProposalFactory.create(
        author=contributor, recipe=plan.recipe, state=State.APPROVED, plan=plan
    )


def _report(run: Run, key: str, values: list[float], *, every: int = 10, first: int = 0) -> None:
    """Points through the metrics service, and the chart rollup brought up to date (the
    worker's refresh, done here at once)."""
    steps = [first + i * every for i in range(len(values))]
    batch = PointBatch(
        keys=[key] * len(values), steps=steps, values=values, times=[None] * len(values)
    )
    ingest.metrics_ingest(run=Run.objects.get(pk=run.pk), batch=batch)
    rollup.series_refresh(run_id=run.pk)


def _move(run: Run, *states: str) -> None:
    for state in states:
        run_writes.run_transition(run_id=run.pk, to_state=state, door="worker")


def _runs(plan: Plan) -> list[Run]:
    return list(Run.objects.filter(plan=plan).select_related("entry").order_by("entry__index"))


def _finish_all(plan: Plan, losses: list[float]) -> list[Run]:
    runs = _runs(plan)
    for run, loss in zip(runs, losses, strict=True):
        _move(run, RunState.RUNNING)
        _report(run, "train/loss", [loss + 1.0, loss + 0.5, loss])
        _report(run, "eval/loss", [loss + 0.8, loss + 0.1])
        _move(run, RunState.FINISHED)
    return runs


# --- the proposal page ---------------------------------------------------------------------


def test_page_shows_run_table_with_diff_only_config_and_live_flag(
    client: Client, recipe: Any, contributor: Any
) -> None:
    plan = launched_plan(recipe, GRID_SPEC)
    proposal = _proposal_for(plan, contributor)
    baseline, _low, high = _runs(plan)
    _move(high, RunState.RUNNING)
    _report(high, "train/loss", [5.0, 4.0, 3.25], every=4)
    _report(high, "throughput/mfu", [10.0, 20.0, 25.0], every=4)  # percent, as Levanter logs it

    page = client.get(f"/proposals/{proposal.pk}/").content.decode()

    assert 'data-live="true"' in page
    assert f'data-run-id="{high.pk}" data-run-state="running"' in page
    assert f'data-run-id="{baseline.pk}" data-run-state="queued"' in page
    row = page.split(f'id="run-row-{high.pk}"')[1].split("</tr>")[0]
    assert "<code>capacity_factor=2</code>" in row  # as the charts write it, never 2.0
    assert "learning_rate" not in row  # the same as the baseline's: not shown
    assert "3.2500" in row and "25.0%" in row
    assert "8 / 12" in row  # progress: the highest step of the config's steps
    assert 'value="capacity_factor"' in page  # group by a grid axis
    assert 'id="run-sort"' in page and 'data-table-query="sort=state"' in page
    # The page's poll: the run table and the panels that follow the runs (proposals/live.py)
    assert f'data-table-url="/proposals/{proposal.pk}/live/"' in page
    assert f'name="ids" value="{high.pk}" form="compare-form"' in page


def test_page_wires_one_chart_per_key_to_the_series_api(
    client: Client, recipe: Any, contributor: Any
) -> None:
    plan = launched_plan(recipe, GRID_SPEC)
    proposal = _proposal_for(plan, contributor)
    run = _runs(plan)[0]
    _move(run, RunState.RUNNING)
    for key in ("train/loss", "eval/loss", "moe/drop_fraction", "throughput/tokens_per_second"):
        _report(run, key, [1.0, 0.5])

    page = client.get(f"/proposals/{proposal.pk}/").content.decode()

    keys = "train/loss,eval/loss,throughput/tokens_per_second,moe/drop_fraction"
    assert f'data-series-url="/api/v1/plans/{plan.pk}/series/?keys={keys}&amp;points=500"' in page
    assert re.findall(r'data-chart-key="([^"]+)"', page) == keys.split(",")
    assert 'data-drawn="false"' in page
    assert '<script id="results-config" type="application/json">' in page
    assert "/static/uplot/uPlot.iife.min.js" in page
    assert "/static/js/results.js" in page
    assert f'href="/plans/{plan.pk}/loss.png"' in page
    # CSP-friendly: no inline script other than JSON data blocks, no inline handlers.
    inline = re.findall(r"<script(?![^>]*\bsrc=)([^>]*)>", page)
    assert all('type="application/json"' in attrs for attrs in inline)
    assert not re.search(r"\son[a-z]+=\"", page)


def test_a_key_only_in_the_final_summary_gets_no_empty_chart(
    client: Client, recipe: Any, contributor: Any
) -> None:
    """``run_seconds`` arrives once, in the tracker summary, never as points: the table may
    show it, but no chart (or "add a chart" choice) is offered for a line that cannot exist."""
    plan = launched_plan(recipe, GRID_SPEC)
    proposal = _proposal_for(plan, contributor)
    run = _runs(plan)[0]
    _move(run, RunState.RUNNING)
    _report(run, "train/loss", [1.0, 0.5])
    Run.objects.filter(pk=run.pk).update(final_metrics={"run_seconds": 12.5, "eval/loss": 0.7})

    page = client.get(f"/proposals/{proposal.pk}/").content.decode()

    assert re.findall(r'data-chart-key="([^"]+)"', page) == ["train/loss"]
    add_a_chart = page.split('id="chart-add"')[1].split("</select>")[0]
    assert 'value="run_seconds"' not in add_a_chart
    assert 'data-keys="train/loss"' in page  # what the live refresh may add charts for
    assert "keys=train/loss&amp;" in page


def test_page_turns_polling_off_when_every_run_is_terminal(
    client: Client, recipe: Any, contributor: Any
) -> None:
    plan = launched_plan(recipe, GRID_SPEC)
    proposal = _proposal_for(plan, contributor)
    _finish_all(plan, [3.0, 2.9, 3.1])
    # Every run ended, the results not summarised yet: the page waits for them.
    waiting = client.get(f"/proposals/{proposal.pk}/").content.decode()
    assert 'data-live="true"' in waiting
    assert results.plan_check_finished(plan_id=plan.pk)

    page = client.get(f"/proposals/{proposal.pk}/").content.decode()
    partial = client.get(f"/plans/{plan.pk}/runs/").content.decode()
    live = client.get(f"/proposals/{proposal.pk}/live/").content.decode()

    assert 'data-live="false"' in page
    assert 'data-active="false"' in partial
    assert 'data-active="false"' in live
    assert "live: updates" not in page


def test_proposal_without_a_plan_has_no_results_section(client: Client, proposal: Any) -> None:
    page = client.get(f"/proposals/{proposal.pk}/").content.decode()
    assert 'id="results"' not in page
    assert "results.js" not in page


def test_page_queries_do_not_grow_with_the_number_of_runs(
    client: Client, recipe: Any, contributor: Any, django_assert_max_num_queries: Any
) -> None:
    small = launched_plan(recipe, _spec_of(3))
    big = launched_plan(recipe, _spec_of(30), baseline={**FAST_BASELINE, "steps": 13})
    pages = {}
    for plan, count in ((small, 3), (big, 30)):
        runs = _runs(plan)
        assert len(runs) == count
        for run in runs[: count // 2]:
            _move(run, RunState.RUNNING)
            _report(run, "train/loss", [2.0, 1.5])
        pages[count] = _proposal_for(plan, contributor)

    with CaptureQueriesContext(connection) as small_page:
        assert client.get(f"/proposals/{pages[3].pk}/").status_code == 200
    with django_assert_max_num_queries(len(small_page.captured_queries)):
        response = client.get(f"/proposals/{pages[30].pk}/")
    assert response.content.decode().count('data-run-state="') == 30
    with django_assert_max_num_queries(5):
        client.get(f"/plans/{big.pk}/runs/")


# --- the partial the page polls ------------------------------------------------------------


def test_partial_sorts_by_a_metric_and_groups_by_an_axis(client: Client, recipe: Any) -> None:
    plan = launched_plan(recipe, GRID_SPEC)
    baseline, low, high = _finish_all(plan, [3.0, 2.5, 3.5])

    def order(query: str) -> list[int]:
        html = client.get(f"/plans/{plan.pk}/runs/?{query}").content.decode()
        return [int(pk) for pk in re.findall(r'data-run-id="(\d+)"', html)]

    assert order("sort=eval/loss") == [low.pk, baseline.pk, high.pk]
    assert order("sort=-eval/loss") == [high.pk, baseline.pk, low.pk]
    assert order("sort=capacity_factor") == [baseline.pk, low.pk, high.pk]
    assert order("sort=nonsense") == [baseline.pk, low.pk, high.pk]  # plan order
    grouped = client.get(f"/plans/{plan.pk}/runs/?group=capacity_factor").content.decode()
    assert grouped.count('class="group-row"') == 3
    assert "capacity_factor = 1.5" in grouped
    response = client.get(f"/plans/{plan.pk}/runs/")
    assert "no-cache" in response["Cache-Control"]
    assert client.get("/plans/999999/runs/").status_code == 404


def test_partial_links_logs_and_wandb_only_when_the_run_has_them(
    client: Client, recipe: Any, settings: Any
) -> None:
    settings.RAY_ADDRESS = "http://ray-head.internal:8265/"
    plan = launched_plan(recipe, GRID_SPEC)
    run = _runs(plan)[1]
    Run.objects.filter(pk=run.pk).update(
        external_id="4242", executor="ray", wandb_url="https://wandb.ai/marin/run/abc"
    )
    Run.objects.filter(plan=plan).exclude(pk=run.pk).update(wandb_url="javascript:alert(1)")
    html = client.get(f"/plans/{plan.pk}/runs/").content.decode()
    assert f'href="/api/v1/runs/{run.pk}/logs/"' in html
    assert 'href="https://wandb.ai/marin/run/abc"' in html
    assert 'href="http://ray-head.internal:8265/#/jobs/4242"' in html
    assert "javascript:" not in html
    assert html.count(">W&amp;B</a>") == 1
    settings.RAY_ADDRESS = ""  # no cluster known: no link to a dashboard that is not there
    assert "/#/jobs/" not in client.get(f"/plans/{plan.pk}/runs/").content.decode()


# --- scaling ladder ------------------------------------------------------------------------


THREE_SCALE_SPEC = """axes:
  capacity_factor: [2.0]
scales: [small, medium, large]
"""


def _finish_ladder(plan: Plan, losses: dict[tuple[str, bool], float]) -> None:
    for run in _runs(plan):
        _move(run, RunState.RUNNING)
        loss = losses[(run.entry.scale, run.entry.is_baseline)]
        _report(run, "eval/loss", [loss + 1, loss])
        speed = 1000.0 if run.entry.is_baseline else 800.0
        _report(run, "throughput/tokens_per_second", [speed] * 4)
        _move(run, RunState.FINISHED)


def test_ladder_appears_for_a_plan_with_scales(
    client: Client, recipe: Any, contributor: Any
) -> None:
    plan = launched_plan(recipe, THREE_SCALE_SPEC)
    proposal = _proposal_for(plan, contributor)
    flops = {run.entry.scale: run.entry.flops for run in _runs(plan)}
    losses = {}
    for scale, c in flops.items():  # the variant does at C what the baseline does at 2C
        losses[(scale, True)] = 30.0 * c**-0.1
        losses[(scale, False)] = 30.0 * (2 * c) ** -0.1
    _finish_ladder(plan, losses)

    page = client.get(f"/proposals/{proposal.pk}/").content.decode()

    assert 'id="ladder-chart" data-chart-key="ladder"' in page
    assert '<script id="ladder-data" type="application/json">' in page
    ladder_table = page.split('id="ladder-table"')[1].split("</table>")[0]
    assert "<code>capacity_factor=2</code>" in ladder_table  # as the run table writes it
    assert "capacity_factor=2.0" not in ladder_table
    assert "plain power law" in ladder_table
    # The variant's row (the baseline's is 1.0): read the figures, compare to the fit's precision.
    multipliers = [float(m) for m in re.findall(r'data-multiplier="([^"]+)"', ladder_table)]
    speedups = [float(m) for m in re.findall(r'data-effective-speedup="([^"]+)"', ladder_table)]
    assert multipliers[-1] == pytest.approx(2.0, abs=1e-6)
    assert 'data-throughput-ratio="0.8"' in ladder_table
    assert speedups[-1] == pytest.approx(1.6, abs=1e-6)
    assert 'id="ladder-refusals"' not in page


def test_ladder_of_two_scales_states_no_multiplier_and_says_why(
    client: Client, recipe: Any, contributor: Any
) -> None:
    plan = launched_plan(recipe, LADDER_SPEC)
    proposal = _proposal_for(plan, contributor)
    losses = {
        ("small", True): 3.0,
        ("medium", True): 2.6,
        ("small", False): 2.9,
        ("medium", False): 2.5,
    }
    _finish_ladder(plan, losses)

    page = client.get(f"/proposals/{proposal.pk}/").content.decode()

    assert 'data-multiplier=""' in page.split('id="ladder-table"')[1]
    assert not re.search(r'data-multiplier="\d', page)
    refusals = page.split('id="ladder-refusals"')[1].split("</ul>")[0]
    assert "<strong>capacity_factor=2</strong>: no multiplier, because" in refusals
    assert "has 2 scales; a multiplier needs at least 3" in refusals


def test_no_ladder_without_scales(client: Client, recipe: Any, contributor: Any) -> None:
    plan = launched_plan(recipe, GRID_SPEC)
    proposal = _proposal_for(plan, contributor)
    _finish_all(plan, [3.0, 2.9, 3.1])
    assert 'id="ladder"' not in client.get(f"/proposals/{proposal.pk}/").content.decode()


# --- seeds and reused throughput in the run table ----------------------------------------


def test_seed_table_shows_mean_std_and_delta_against_the_noise(
    client: Client, recipe: Any, contributor: Any
) -> None:
    plan = launched_plan(recipe, "axes:\n  capacity_factor: [2.0]\nseeds: [0, 1]\n")
    proposal = _proposal_for(plan, contributor)
    # Two seeds a side: Welch's t has about 1.5 degrees of freedom (t = 12.7), so only a
    # difference of more than 0.14 here is outside the noise.
    losses: dict[tuple[bool, int | None], float] = {
        (True, 0): 3.00,
        (True, 1): 3.02,
        (False, 0): 2.70,
        (False, 1): 2.71,
    }
    for run in _runs(plan):
        _move(run, RunState.RUNNING)
        _report(run, "eval/loss", [losses[(run.entry.is_baseline, run.entry.seed)]])
        _move(run, RunState.FINISHED)

    page = client.get(f"/proposals/{proposal.pk}/").content.decode()

    note = page.split('id="seed-table-note"')[1].split("</p>")[0]
    assert "Δ <code>eval/loss</code> against the baseline" in note
    table = page.split('id="seed-table"')[1].split("</table>")[0]
    assert "Δ Eval loss (nats)</th>" in table
    # only the columns some run has a value of: no column of dashes
    assert "Throughput (tokens/s)" not in table and "Train loss" not in table
    baseline_row, variant_row = table.split('data-variant="')[1:3]
    sd = '<span class="spread-sd"> ± {}</span>'  # the ± part on a line of its own
    assert f'<td class="num" data-metric-key="eval/loss">3.0100{sd.format("0.0141")}</td>' in (
        baseline_row
    )
    assert f'<td class="num" data-metric-key="eval/loss">2.7050{sd.format("0.0071")}</td>' in (
        variant_row
    )
    assert f"−0.3050{sd.format('0.0112')}" in variant_row
    assert "outside the noise" in variant_row
    assert 'id="no-seed-spread"' not in page


def test_one_seed_per_point_says_no_spread_is_known(
    client: Client, recipe: Any, contributor: Any
) -> None:
    plan = launched_plan(recipe, GRID_SPEC)
    proposal = _proposal_for(plan, contributor)
    _finish_all(plan, [3.0, 2.9, 3.1])
    page = client.get(f"/proposals/{proposal.pk}/").content.decode()
    assert 'id="seed-table"' not in page
    assert 'id="no-seed-spread"' in page


def test_run_table_marks_the_throughput_a_cached_run_reuses(client: Client, recipe: Any) -> None:
    first = launched_plan(recipe)
    for run in _runs(first):
        _move(run, RunState.RUNNING)
        _report(run, "throughput/tokens_per_second", [100.0, 900.0, 1000.0, 1100.0, 1000.0, 50.0])
        _move(run, RunState.FINISHED)
    second = launched_plan(recipe)
    partial = client.get(f"/plans/{second.pk}/runs/").content.decode()
    cells = re.findall(
        r'data-metric-key="throughput/tokens_per_second">([^<]*)(<span[^>]*>)?', partial
    )
    assert [value for value, _ in cells] == ["1,000 ", "1,000 "]  # the median, not the last 50
    assert all('class="muted reused"' in span for _, span in cells)
    source = _runs(first)[0].pk
    assert f'title="Measured by run #{source}: this cached run did not run again"' in partial
    own = client.get(f"/plans/{first.pk}/runs/").content.decode()
    assert 'class="muted reused"' not in own


# --- compare -------------------------------------------------------------------------------


def test_compare_overlays_runs_across_plans_and_shows_only_differing_config(
    client: Client, recipe: Any
) -> None:
    first = _finish_all(launched_plan(recipe, GRID_SPEC), [3.0, 2.9, 3.1])
    other = launched_plan(recipe, "axes:\n  weight_decay: [0.1]\n", baseline={"steps": 20})
    second = _finish_all(other, [3.2, 3.3])
    ids = [first[0].pk, first[2].pk, second[1].pk]

    response = client.get(f"/runs/compare/?ids={','.join(map(str, ids))}")
    page = response.content.decode()

    assert response.status_code == 200
    header = page.split('id="config-diff"')[1].split("</thead>")[0]
    assert re.findall(r'data-config-key="([^"]+)"', header) == [
        "capacity_factor",
        "steps",
        "weight_decay",
        "width",
    ]
    assert [int(i) for i in re.findall(r'data-run-id="(\d+)" data-run-state', page)] == ids
    ids_param = ",".join(map(str, ids))
    assert f'data-series-url="/api/v1/runs/series/?ids={ids_param}&amp;keys=' in page
    assert 'data-chart-key="eval/loss"' in page
    assert 'data-live="false"' in page
    partial = client.get(f"/runs/compare/?ids={ids_param}&partial=table&sort=-eval/loss")
    assert [int(i) for i in re.findall(r'data-run-id="(\d+)"', partial.content.decode())] == [
        second[1].pk,
        first[2].pk,
        first[0].pk,
    ]


def test_compare_takes_at_most_100_runs(client: Client, recipe: Any) -> None:
    runs = _runs(launched_plan(recipe, GRID_SPEC))
    asked = [r.pk for r in runs] + list(range(10**6, 10**6 + 150))
    response = client.get("/runs/compare/", {"ids": ",".join(map(str, asked))})
    page = response.content.decode()
    assert response.status_code == 200
    assert 'id="compare-truncated"' in page
    assert "You asked for 153 runs" in page
    assert page.count('data-run-state="') == 3
    value = re.search(r'id="compare-ids" name="ids" value="([^"]*)"', page)
    assert value is not None and len(value.group(1).split(",")) == 100


def test_compare_with_nothing_picked_explains_itself(client: Client) -> None:
    page = client.get("/runs/compare/?ids=abc,-4").content.decode()
    assert "Tick runs" in page
    assert "results.js" not in page


# --- the loss PNG --------------------------------------------------------------------------


def test_loss_png_is_an_image_cached_by_the_latest_metric_change(
    client: Client, recipe: Any
) -> None:
    plan = launched_plan(recipe, GRID_SPEC)
    baseline, *others = _runs(plan)
    for run, loss in zip(others, [2.9, 3.1], strict=True):
        _move(run, RunState.RUNNING)
        _report(run, "eval/loss", [loss + 1, loss])
        _move(run, RunState.FINISHED)
    _move(baseline, RunState.RUNNING)
    _report(baseline, "eval/loss", [4.0, 3.5])

    response = client.get(f"/plans/{plan.pk}/loss.png")
    assert response.status_code == 200
    assert response["Content-Type"] == "image/png"
    assert response.content.startswith(b"\x89PNG\r\n\x1a\n")
    etag = response["ETag"]
    assert client.get(f"/plans/{plan.pk}/loss.png", HTTP_IF_NONE_MATCH=etag).status_code == 304

    _report(baseline, "eval/loss", [3.2], first=20)
    changed = client.get(f"/plans/{plan.pk}/loss.png", HTTP_IF_NONE_MATCH=etag)
    assert changed.status_code == 200
    assert changed["ETag"] != etag
    assert changed.content != response.content
    assert client.get(f"/plans/{plan.pk}/loss.png?key=train/loss").status_code == 404
    assert client.get(f"/plans/{plan.pk}/loss.png?log=1").status_code == 200


def test_loss_png_is_not_cached_while_the_rollup_catches_up(client: Client, recipe: Any) -> None:
    plan = launched_plan(recipe, GRID_SPEC)
    run = _runs(plan)[0]
    _move(run, RunState.RUNNING)
    _report(run, "train/loss", [4.0, 3.5])
    batch = PointBatch(keys=["train/loss"], steps=[30], values=[3.0], times=[None])
    ingest.metrics_ingest(run=Run.objects.get(pk=run.pk), batch=batch)  # not refreshed yet
    response = client.get(f"/plans/{plan.pk}/loss.png")
    assert response.status_code == 200
    assert "ETag" not in response
    assert "no-cache" in response["Cache-Control"]


def test_loss_png_is_404_without_data(client: Client, recipe: Any) -> None:
    plan = launched_plan(recipe, GRID_SPEC)
    assert client.get(f"/plans/{plan.pk}/loss.png").status_code == 404
    assert client.get("/plans/999999/loss.png").status_code == 404


# --- page weight ---------------------------------------------------------------------------


def test_proposal_page_js_and_css_weigh_under_300_kb_gzipped(
    client: Client, recipe: Any, contributor: Any
) -> None:
    plan = launched_plan(recipe, LADDER_SPEC)
    proposal = _proposal_for(plan, contributor)
    page = client.get(f"/proposals/{proposal.pk}/").content.decode()
    urls = re.findall(r'<script[^>]+src="/static/([^"]+)"', page)
    urls += re.findall(r'<link[^>]+rel="stylesheet"[^>]+href="/static/([^"]+)"', page)
    assert {"uplot/uPlot.iife.min.js", "js/results.js", "css/site.css"} <= set(urls)
    total = 0
    for url in set(urls):
        path = finders.find(url)
        assert path, f"{url} is not a static file (has bin/setup run npm ci?)"
        with open(str(path), "rb") as handle:
            total += len(gzip.compress(handle.read(), compresslevel=9))
    assert total < PAGE_WEIGHT_LIMIT, f"{total} bytes gzipped"


# --- columns: the recipe's declared metrics by default, others on demand -----------------


def test_run_table_default_columns_are_the_declared_metrics_others_on_demand(
    client: Client, recipe: Any, contributor: Any
) -> None:
    plan = launched_plan(recipe, GRID_SPEC)
    proposal = _proposal_for(plan, contributor)
    runs = _finish_all(plan, [3.0, 2.5, 3.5])
    Run.objects.filter(pk=runs[0].pk).update(
        final_metrics={**runs[0].final_metrics, "run_seconds": 12.5, "custom/score": 0.5}
    )

    def headers(html: str) -> list[str]:
        head = html.split("<thead>")[1].split("</thead>", maxsplit=1)[0]
        return [
            re.sub(r"<[^>]+>", "", cell).strip() for cell in re.findall(r"<th[^>]*>.*?</th>", head)
        ]

    partial = client.get(f"/plans/{plan.pk}/runs/").content.decode()
    shown = headers(partial)
    assert shown[1:5] == ["Run", "Config (against the baseline)", "State", "Progress"]
    declared = [d["display"] for d in recipe.metrics if d.get("column")]
    assert [h.split(" (")[0] for h in shown[5:]] == declared
    assert "Attempt" not in shown and "Executor" not in shown and "Links" not in shown

    page = client.get(f"/proposals/{proposal.pk}/").content.decode()
    picker = page.split('id="column-picker"')[1].split("</details>")[0]
    offered = re.findall(r'name="columns" value="([^"]+)"', picker)
    assert offered == ["attempt", "executor", "custom/score", "run_seconds"]

    wide = client.get(f"/plans/{plan.pk}/runs/?columns=attempt,run_seconds&columns=nonsense")
    wide_headers = headers(wide.content.decode())
    assert wide_headers[-2:] == ["Run time (s)", "Attempt"]
    assert "nonsense" not in wide.content.decode()
    # Sorting keeps the chosen columns.
    assert 'data-table-query="columns=attempt,run_seconds&amp;sort=eval/loss"' in (
        wide.content.decode()
    )
    chosen = client.get(f"/proposals/{proposal.pk}/?columns=executor").content.decode()
    assert 'value="executor" checked' in chosen and 'data-column="executor"' in chosen


def test_charts_offer_line_style_by_a_second_axis_and_runs_picked_persist(
    client: Client, recipe: Any, contributor: Any
) -> None:
    plan = launched_plan(recipe, GRID_SPEC)
    proposal = _proposal_for(plan, contributor)
    page = client.get(f"/proposals/{proposal.pk}/").content.decode()
    dash = page.split('id="chart-dash"')[1].split("</select>")[0]
    assert '<option value="">nothing (solid)</option>' in dash
    assert '<option value="capacity_factor">capacity_factor</option>' in dash
    form = (
        page.split('id="compare-form"')[0].rsplit("<form", 1)[1]
        + page.split('id="compare-form"')[1].split("</form>")[0]
    )
    assert 'data-pick-store="true"' in form
    assert 'id="compare-picked-count"' in form and 'id="compare-clear"' in form
