"""Alerts on a run's metrics: spike, sustained drop, NaN and silence; each opens once and
closes once, on the run's timeline, through the real metrics door."""

from __future__ import annotations

import json
import math
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone
from rest_framework.test import APIClient

from runs import tokens
from runs.alerts import rules, services
from runs.alerts.models import Alert, AlertKind, AlertRule, AlertWatch
from runs.metrics.declarations import declarations_forget
from runs.models import MetricPoint, Run, RunEvent, RunState
from runs.services import runs as run_writes
from tests.runs.runs_helpers import eager_tasks, launched_plan  # noqa: F401

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("eager_tasks")]


@pytest.fixture(autouse=True)
def _fresh_rules() -> None:
    rules.rules_forget()
    services.alerts_forget()


@pytest.fixture
def running(recipe: Any) -> tuple[Run, str]:
    run = Run.objects.filter(plan=launched_plan(recipe)).order_by("pk").first()
    assert run is not None
    run = run_writes.run_transition(
        run_id=run.pk,
        to_state=RunState.RUNNING,
        door="worker",
        changes={"token_hash": tokens.token_hash(tokens.run_token(run=run))},
    )
    return run, tokens.run_token(run=run)


def send(api: APIClient, run: Run, token: str, points: list[tuple[str, int, Any]]) -> Any:
    body = json.dumps(
        {"points": [{"key": k, "step": s, "value": v} for k, s, v in points]}, allow_nan=True
    )
    return api.post(
        f"/api/v1/runs/{run.pk}/metrics/",
        data=body,
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {token}",
    )


def loss_at(step: int) -> float:
    """A calm loss: 3.0 with a small wobble (robust deviation about 0.02)."""
    return 3.0 + 0.02 * math.sin(step)


def feed(api: APIClient, run: Run, token: str, values: dict[int, float], size: int = 25) -> None:
    steps = sorted(values)
    for start in range(0, len(steps), size):
        chunk = steps[start : start + size]
        response = send(api, run, token, [("train/loss", s, values[s]) for s in chunk])
        assert response.status_code == 200, response.content


def events(run: Run, verb: str) -> list[str]:
    return list(RunEvent.objects.filter(run=run, verb=verb).values_list("message", flat=True))


def test_spike_opens_once_and_closes_once_with_values_hovering_at_the_threshold(
    api: APIClient, running: tuple[Run, str]
) -> None:
    run, token = running
    values = {s: loss_at(s) for s in range(100)}
    feed(api, run, token, values)
    assert not Alert.objects.exists()

    # The threshold (k = 6 robust deviations above the median) is near 3.13: a spike, then
    # 15 points alternating just above and just below it, then calm again. (Longer, and the
    # robust window takes the new level for the normal one: it is a spike detector.)
    spike = {100: 3.6}
    hover = {s: 3.15 if s % 2 else 3.11 for s in range(101, 116)}
    calm = {s: loss_at(s) for s in range(116, 200)}
    feed(api, run, token, {**spike, **hover, **calm}, size=7)

    alert = Alert.objects.get()
    assert (alert.kind, alert.key, alert.opened_step) == (AlertKind.SPIKE, "train/loss", 100)
    assert alert.opened_value == pytest.approx(3.6)
    assert alert.closed_at is not None
    assert alert.closed_step == 120  # the fifth calm point in a row
    assert len(events(run, "alert_opened")) == 1
    assert len(events(run, "alert_closed")) == 1
    # The values as the tables write a loss (four places).
    assert "spiked to 3.6000 at step 100" in events(run, "alert_opened")[0]

    # Resending the same batches changes nothing: no second alert, no new timeline rows.
    feed(api, run, token, {**spike, **hover, **calm}, size=7)
    assert Alert.objects.count() == 1
    assert RunEvent.objects.filter(run=run, verb__startswith="alert_").count() == 2


@pytest.mark.django_db(transaction=True)
def test_outside_a_transaction_calm_batches_fold_without_a_lock_and_a_spike_still_opens_once(
    api: APIClient, running: tuple[Run, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """As the door runs in production (no transaction open), on PostgreSQL: batches that open
    and close nothing are folded and written without a lock, into the watches as this process
    last wrote them (read again only when it has no such copy); the batch that opens the
    alert and the one that closes it go through the locked transaction, once each."""
    run, token = running
    reads: list[bool] = []
    real = services._watches_locked

    def counted(run_id: int, keys: set[str], *, lock: bool = True) -> Any:
        reads.append(lock)
        return real(run_id, keys, lock=lock)

    monkeypatch.setattr(services, "_watches_locked", counted)
    feed(api, run, token, {s: loss_at(s) for s in range(100)})
    spike = {100: 3.6}
    hover = {s: 3.15 if s % 2 else 3.11 for s in range(101, 116)}
    calm = {s: loss_at(s) for s in range(116, 200)}
    feed(api, run, token, {**spike, **hover, **calm}, size=7)
    alert = Alert.objects.get()
    assert (alert.opened_step, alert.closed_step) == (100, 120)
    assert len(events(run, "alert_opened")) == len(events(run, "alert_closed")) == 1
    if connection.vendor == "postgresql":
        # read without a lock: the first batch (no watches yet), the second (whose write
        # leaves this process its copy), the spike and the close (their alert drops the
        # copy) and the batch after each of those; the other 13 fold into the copy, written
        # by the statement that stores their points, with no read
        assert reads.count(False) == 6
        # under the lock: the first batch (its watches made, and read again), the spike, its close
        assert reads.count(True) == 2 + 1 + 1
    else:  # elsewhere (SQLite) every batch takes the locked form
        assert (reads.count(False), reads.count(True)) == (0, 4 + 15 + 1)
    watch = AlertWatch.objects.get(run=run, kind=AlertKind.SPIKE, key="train/loss")
    state = services.state_unpacked(watch.state)
    assert state["last"] == 199 and state["window"][-1] == loss_at(199)


@pytest.mark.django_db(transaction=True)
def test_a_watch_written_between_the_lock_free_read_and_write_is_folded_under_the_lock(
    api: APIClient, running: tuple[Run, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another writer changes the watches after this batch read them: the lock-free write
    does not hold, and the locked transaction folds the batch from the state as it is."""
    run, token = running
    feed(api, run, token, {s: loss_at(s) for s in range(100)}, size=50)
    services.alerts_forget()  # this process has no copy: the batch reads the watches
    real = services._watches_locked
    locked: list[bool] = []

    def racing(run_id: int, keys: set[str], *, lock: bool = True) -> Any:
        found = real(run_id, keys, lock=lock)
        if not lock:  # another process writes every watch of the run just after this read
            AlertWatch.objects.filter(run_id=run_id).update(updated_at=timezone.now())
        else:
            locked.append(True)
        return found

    monkeypatch.setattr(services, "_watches_locked", racing)
    batch = [("train/loss", s, loss_at(s)) for s in range(100, 200)]
    assert send(api, run, token, batch).status_code == 200
    assert locked == [True]
    watch = AlertWatch.objects.get(run=run, kind=AlertKind.SPIKE, key="train/loss")
    state = services.state_unpacked(watch.state)
    assert state["last"] == 199
    assert state["window"] == [loss_at(s) for s in range(150, 200)]
    assert not Alert.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_watch_written_by_another_process_after_this_ones_copy_is_folded_under_the_lock(
    api: APIClient, running: tuple[Run, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """This process folds into its copy of the watches; another process wrote them since
    (their row versions moved): the write does not hold, and the batch is folded again from
    the rows as they are, so nothing is folded twice or lost."""
    run, token = running
    feed(api, run, token, {s: loss_at(s) for s in range(100)}, size=50)
    assert run.pk in services._known  # the second batch's write left a copy
    # Another process's batch: steps 100-149 folded into the rows, not into this copy.
    AlertWatch.objects.filter(run=run, kind=AlertKind.SPIKE, key="train/loss").update(
        state={
            "last": 149,
            "window": [loss_at(s) for s in range(100, 150)],
            "open": False,
            "calm": 0,
        }
    )
    real = services._watches_locked
    locked: list[bool] = []

    def counted(run_id: int, keys: set[str], *, lock: bool = True) -> Any:
        locked.append(lock)
        return real(run_id, keys, lock=lock)

    monkeypatch.setattr(services, "_watches_locked", counted)
    batch = [("train/loss", s, loss_at(s)) for s in range(100, 200)]
    assert send(api, run, token, batch).status_code == 200
    if connection.vendor == "postgresql":
        # no read before the fold (the copy); the write did not hold; one read, as they are
        assert locked == [False]
    watch = AlertWatch.objects.get(run=run, kind=AlertKind.SPIKE, key="train/loss")
    state = services.state_unpacked(watch.state)
    assert state["last"] == 199
    assert state["window"] == [loss_at(s) for s in range(150, 200)]
    assert not Alert.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_nan_alert_opened_elsewhere_closes_when_this_process_folds_from_its_copy(
    api: APIClient, running: tuple[Run, str]
) -> None:
    """The copy holds the rules' watches, not the NaN ones: a NaN alert opened after it was
    taken (by a refused batch, in any process) is still closed by the next finite values."""
    run, token = running
    feed(api, run, token, {s: loss_at(s) for s in range(100)}, size=50)
    assert run.pk in services._known
    assert services.alerts_not_finite(run=run, first_steps={"train/loss": 100}) == 1
    assert run.pk in services._known
    assert send(api, run, token, [("train/loss", 101, loss_at(101))]).status_code == 200
    alert = Alert.objects.get(kind=AlertKind.NAN)
    assert (alert.opened_step, alert.closed_step) == (100, 101)
    spike = AlertWatch.objects.get(run=run, kind=AlertKind.SPIKE, key="train/loss")
    assert spike.state["last"] == 101  # folded once, by the copy's write
    assert send(api, run, token, [("train/loss", 102, loss_at(102))]).status_code == 200
    assert Alert.objects.get(kind=AlertKind.NAN).closed_step == 101


def test_a_watch_stores_its_windows_packed_and_reads_them_back_exactly(
    api: APIClient, running: tuple[Run, str]
) -> None:
    """The windows are stored as base64 of their float64 bytes, and read back to the bit; a
    state stored before, with the windows as JSON numbers, is read and folded as it is."""
    run, token = running
    values = {s: loss_at(s) + s * 1e-17 for s in range(60)}
    feed(api, run, token, values, size=30)
    watch = AlertWatch.objects.get(run=run, kind=AlertKind.SPIKE, key="train/loss")
    assert isinstance(watch.state["window"], str)
    assert services.state_unpacked(watch.state)["window"] == [values[s] for s in range(10, 60)]
    # A state as it was stored before the windows were packed.
    watch.state = {"last": 59, "window": [values[s] for s in range(10, 60)], "open": False}
    watch.save()
    services.alerts_forget()
    feed(api, run, token, {60: 3.6})  # a spike against the unpacked window
    assert Alert.objects.get().opened_step == 60
    watch.refresh_from_db()
    assert services.state_unpacked(watch.state)["window"] == [
        *(values[s] for s in range(11, 60)),
        3.6,
    ]


@pytest.mark.django_db(transaction=True)
def test_a_calm_batch_writes_its_watches_in_the_statement_that_stores_its_points(
    api: APIClient, running: tuple[Run, str]
) -> None:
    """With this process's copy of the watches, a batch that opens and closes nothing is
    folded before it is stored and its watches written by the same statement as its
    points; a batch that meets stored points (resent, overlapping) goes the other way, and
    its new points are still folded once."""
    from django.test.utils import CaptureQueriesContext

    run, token = running
    feed(api, run, token, {s: loss_at(s) for s in range(100)}, size=50)
    with CaptureQueriesContext(connection) as queries:
        batch = [("train/loss", s, loss_at(s)) for s in range(100, 150)]
        assert send(api, run, token, batch).status_code == 200
    touching = [q["sql"] for q in queries.captured_queries if "runs_alertwatch" in q["sql"]]
    if connection.vendor == "postgresql":
        assert len(touching) == 1 and "runs_metricpoint" in touching[0]
    watch = AlertWatch.objects.get(run=run, kind=AlertKind.SPIKE, key="train/loss")
    assert services.state_unpacked(watch.state)["last"] == 149
    # Overlapping: steps 140-169, of which 140-149 are stored already.
    overlap = [("train/loss", s, loss_at(s)) for s in range(140, 170)]
    assert send(api, run, token, overlap).status_code == 200
    watch.refresh_from_db()
    state = services.state_unpacked(watch.state)
    assert state["last"] == 169
    assert state["window"] == [loss_at(s) for s in range(120, 170)]
    assert not Alert.objects.exists()


def test_calm_noise_opens_nothing(api: APIClient, running: tuple[Run, str]) -> None:
    run, token = running
    feed(api, run, token, {s: loss_at(s) for s in range(400)}, size=100)
    assert not Alert.objects.exists()
    watch = AlertWatch.objects.get(run=run, kind=AlertKind.SPIKE, key="train/loss")
    state = services.state_unpacked(watch.state)
    assert state["last"] == 399
    assert len(state["window"]) == 50  # rolling state: no history kept beyond the window


def test_sustained_throughput_drop_opens_and_recovery_closes(
    api: APIClient, running: tuple[Run, str]
) -> None:
    run, token = running
    key = "throughput/tokens_per_second"
    steady = [(key, s, 1000.0 + (s % 7)) for s in range(300)]
    dropped = [(key, s, 700.0 + (s % 7)) for s in range(300, 360)]
    back = [(key, s, 1000.0 + (s % 7)) for s in range(360, 420)]
    for chunk in (steady, dropped, back):
        assert send(api, run, token, chunk).status_code == 200
    alert = Alert.objects.get(kind=AlertKind.DROP)
    assert alert.opened_step is not None and 300 < alert.opened_step < 320
    assert alert.closed_step is not None and 360 < alert.closed_step < 390
    assert "dropped to a median of" in alert.message


def test_a_drop_message_writes_values_in_the_declared_unit(
    api: APIClient, recipe: Any, running: tuple[Run, str]
) -> None:
    """MFU logged as a fraction and shown in percent: the alert says 14.0%, as the pages do,
    not the stored 0.14; a key nobody declared keeps the value as logged."""
    run, token = running
    recipe.metrics = [
        {
            "key": "throughput/mfu",
            "unit": "percent",
            "logged_as": "fraction",
            "direction": "higher",
            "display": "MFU",
        },
        {"key": "train/loss", "unit": "nats", "direction": "lower"},
    ]
    recipe.save(update_fields=["metrics"])
    declarations_forget()
    rules.rules_forget()
    key = "throughput/mfu"
    steady = [(key, s, 0.20) for s in range(300)]
    dropped = [(key, s, 0.14) for s in range(300, 360)]
    for chunk in (steady, dropped):
        assert send(api, run, token, chunk).status_code == 200
    alert = Alert.objects.get(kind=AlertKind.DROP, key=key)
    assert "dropped to a median of 14.0% over its last" in alert.message
    assert "from 20.0% before" in alert.message
    assert "0.14" not in alert.message


def test_a_refused_nan_opens_an_alert_and_finite_values_close_it(
    api: APIClient, running: tuple[Run, str]
) -> None:
    """The intended pair (issue #29): a NaN is refused (never stored, named in the answer by
    key and first step) and opens the key's NaN alert at that same step; the batch's other
    points are stored."""
    run, token = running
    response = send(api, run, token, [("train/loss", 10, 2.5), ("train/loss", 11, math.nan)])
    assert response.status_code == 200
    answer = response.json()
    assert answer["stored"] == 1 and answer["alerts_opened"] == 1
    [refused] = answer["refused"]
    assert (refused["key"], refused["step"]) == ("train/loss", 11)
    assert "not finite" in refused["reason"]
    assert not MetricPoint.objects.filter(run=run, step=11).exists()
    alert = Alert.objects.get(kind=AlertKind.NAN)
    assert (alert.key, alert.opened_step, alert.closed_at) == ("train/loss", 11, None)
    assert events(run, "alert_opened") == [
        "[nan] train/loss was not finite (NaN or infinite) at step 11"
    ]

    # Sent again: still one alert; nothing usable, so a 400 naming it.
    again = send(api, run, token, [("train/loss", 12, math.inf)])
    assert again.status_code == 400 and again.json()["alerts_opened"] == 0
    assert Alert.objects.count() == 1

    assert send(api, run, token, [("train/loss", 9, 2.6)]).status_code == 200
    assert Alert.objects.get().closed_at is None  # an earlier step does not close it
    assert send(api, run, token, [("train/loss", 13, 2.4)]).status_code == 200
    alert.refresh_from_db()
    assert alert.closed_step == 13
    assert len(events(run, "alert_closed")) == 1


def test_silence_opens_after_the_rules_seconds_and_closes_when_heard_again(
    running: tuple[Run, str],
) -> None:
    run, _ = running
    Run.objects.filter(pk=run.pk).update(heartbeat_at=timezone.now() - timedelta(seconds=60))
    assert services.alerts_silence_check() == {"opened": 0, "closed": 0}  # default: 120 s
    Run.objects.filter(pk=run.pk).update(heartbeat_at=timezone.now() - timedelta(seconds=200))
    assert services.alerts_silence_check()["opened"] == 1
    assert services.alerts_silence_check()["opened"] == 0  # opens once
    message = Alert.objects.get(kind=AlertKind.SILENCE).message
    assert message.startswith("No heartbeat for 2")
    # What a reader can do about it, and what happens by itself.
    assert "A maintainer can cancel it on its run page" in message
    assert f"after {run.heartbeat_timeout_seconds} s without a heartbeat it is marked crashed" in (
        message
    )
    Run.objects.filter(pk=run.pk).update(heartbeat_at=timezone.now())
    assert services.alerts_silence_check() == {"opened": 0, "closed": 1}
    assert services.alerts_silence_check() == {"opened": 0, "closed": 0}


@pytest.mark.parametrize(
    ("executor", "external_id", "who"),
    [
        ("external", "external-1", "It runs outside the site, where it was claimed"),
        ("pool:lab", "", "An agent of pool:lab runs it"),
        ("ray", "raysubmit_1", "Its job on ray may have stopped: its log is on the run's page"),
        ("", "", "No job of this site runs it"),
    ],
)
def test_a_silence_alert_says_who_runs_the_run(
    running: tuple[Run, str], executor: str, external_id: str, who: str
) -> None:
    run, _ = running
    Run.objects.filter(pk=run.pk).update(
        executor=executor,
        external_id=external_id,
        heartbeat_at=timezone.now() - timedelta(seconds=200),
    )
    assert services.alerts_silence_check()["opened"] == 1
    assert who in Alert.objects.get(kind=AlertKind.SILENCE).message


def test_a_runs_alerts_close_when_it_ends(
    running: tuple[Run, str], django_capture_on_commit_callbacks: Any
) -> None:
    run, _ = running
    services.alerts_not_finite(run=run, first_steps={"train/loss": 5})
    with django_capture_on_commit_callbacks(execute=True):
        run_writes.run_transition(run_id=run.pk, to_state=RunState.FAILED, door="worker")
    alert = Alert.objects.get()
    assert alert.close_message == "the run ended (failed)"


def test_an_attempt_that_goes_back_to_the_queue_closes_its_alerts(
    running: tuple[Run, str], django_capture_on_commit_callbacks: Any
) -> None:
    """A lost lease (the agent killed) or a preemption requeues the run as its next attempt:
    what was wrong with the attempt is over, so its alerts close, saying so."""
    run, _ = running
    Run.objects.filter(pk=run.pk).update(heartbeat_at=timezone.now() - timedelta(seconds=200))
    assert services.alerts_silence_check()["opened"] == 1
    with django_capture_on_commit_callbacks(execute=True):
        run_writes.run_transition(run_id=run.pk, to_state=RunState.PREEMPTED, door="agent")
    assert Alert.objects.get().closed_at is None  # preempted: not yet back in the queue
    with django_capture_on_commit_callbacks(execute=True):
        run_writes.run_transition(run_id=run.pk, to_state=RunState.QUEUED, door="worker")
    alert = Alert.objects.get()
    assert alert.closed_at is not None
    assert alert.close_message == "the attempt ended; the run is back in the queue (attempt 2)"


def test_a_rule_edited_elsewhere_holds_at_the_next_batch_with_a_shared_cache(
    running: tuple[Run, str],
    maintainer: Any,
    settings: Any,
    django_capture_on_commit_callbacks: Any,
) -> None:
    """Each process keeps a run's rules under the rules' version in the shared cache: an
    edit made by another process (whose own copy is all this one can not forget) holds at
    this process's next batch, not after a timeout."""
    settings.SHARED_CACHE = True  # the version lives in the cache (Redis in production)
    run, _ = running
    assert any(r.kind == "nan" for r in rules.rules_for_run(run_id=run.pk))
    kept = dict(rules._by_run)
    with django_capture_on_commit_callbacks(execute=True):  # the version is replaced
        services.alert_rule_save(
            actor=maintainer, recipe=run.plan.recipe, kind="nan", key="*", enabled=False
        )
    rules._by_run.update(kept)  # this process's copy, as if the edit was made in another
    assert not any(r.kind == "nan" for r in rules.rules_for_run(run_id=run.pk))


def test_a_stored_rule_overrides_the_default_and_can_switch_it_off(
    api: APIClient, running: tuple[Run, str], maintainer: Any
) -> None:
    run, token = running
    services.alert_rule_save(
        actor=maintainer, recipe=run.plan.recipe, kind="nan", key="*", enabled=False
    )
    response = send(api, run, token, [("train/loss", 11, math.nan)])
    assert response.status_code == 400
    assert list(Alert.objects.values_list("kind", "key", "message")) == []
    rule = services.alert_rule_save(
        actor=maintainer, recipe=run.plan.recipe, kind="spike", key="train/loss", params={"k": 50}
    )
    assert rule.params == {"k": 50}  # only what was given; the rest stays default
    found = {r.key: r for r in rules.rules_for_run(run_id=run.pk) if r.kind == "spike"}
    assert found["train/loss"].params["k"] == 50
    assert found["train/loss"].params["window"] == 50
    assert AlertRule.objects.count() == 2


def test_rules_api_refuses_non_maintainers_and_names_the_bad_field(
    api_as: Any, api: APIClient, maintainer: Any, contributor: Any, recipe: Any
) -> None:
    good = {"recipe": recipe.pk, "kind": "spike", "key": "train/loss", "params": {"k": 8}}
    assert api.post("/api/v1/alert-rules/", good, format="json").status_code in {401, 403}
    assert api_as(contributor).post("/api/v1/alert-rules/", good, format="json").status_code == 403
    client = api_as(maintainer)
    for body, field in [
        ({**good, "params": {"k": "high"}}, "params.k"),
        ({**good, "params": {"k": 1e9}}, "params.k"),
        ({**good, "params": {"window": 3}}, "params.window"),
        ({**good, "params": {"k": 4, "k_close": 5}}, "params.k_close"),
        ({**good, "params": {"kk": 1}}, "params"),
        ({**good, "params": [1, 2]}, "params"),
        ({**good, "kind": "sparkle"}, "kind"),
        ({**good, "key": ""}, "key"),
        ({**good, "key": "bad key\n"}, "key"),
        ({"kind": "silence", "params": {"seconds": 1}}, "recipe"),
        ({"recipe": recipe.pk, "kind": "silence", "params": {"seconds": 1}}, "params.seconds"),
        ({**good, "recipe": 10**12}, "recipe"),
    ]:
        response = client.post("/api/v1/alert-rules/", body, format="json")
        assert response.status_code == 400, (body, response.content)
        assert field in response.json(), (body, response.json())
    assert not AlertRule.objects.exists()
    response = client.post("/api/v1/alert-rules/", good, format="json")
    assert response.status_code == 201, response.content
    rule_id = response.json()["id"]
    assert client.patch(
        f"/api/v1/alert-rules/{rule_id}/", {"params": {"k": 0}}, format="json"
    ).json() == {"params.k": ["must be from 1 to 1000"]}
    assert (
        client.patch(
            f"/api/v1/alert-rules/{rule_id}/", {"enabled": False}, format="json"
        ).status_code
        == 200
    )
    assert AlertRule.objects.get().enabled is False
    assert api_as(contributor).delete(f"/api/v1/alert-rules/{rule_id}/").status_code == 403
    assert api.get("/api/v1/alert-rules/").status_code == 200  # reading is public


def test_the_run_page_and_the_api_show_its_alerts(client: Any, running: tuple[Run, str]) -> None:
    run, _ = running
    services.alerts_not_finite(run=run, first_steps={"train/loss": 7})
    page = client.get(f"/runs/{run.pk}/").content.decode()
    assert 'id="alerts-heading"' in page
    assert "train/loss was not finite (NaN or infinite) at step 7" in page
    assert "alert opened" in page  # on its timeline
    listed = client.get(f"/api/v1/alerts/?run={run.pk}").json()["results"]
    assert [(a["kind"], a["is_open"], a["opened_step"]) for a in listed] == [("nan", True, 7)]
