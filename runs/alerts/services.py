"""Writes for alerts: evaluating a metrics batch, noting values that were not finite, the
periodic silence check, closing a run's alerts when it ends, and maintainers' rule edits.

``alerts_evaluate`` runs inside every metrics ingest (``runs.metrics.ingest.metrics_ingest``), so it
is built to cost little: the run's rules come from a per-process cache, its rolling state is
small JSON rows with their windows packed, written once a batch (on PostgreSQL without a
lock or a transaction of its own when nothing opens or closes, and without a read when this
process wrote them last), and nothing reads the run's history.
An alert that opens or closes writes a row of the run's timeline in the same transaction and
is announced after commit (``runs.signals.alert_changed``): ``proposals`` posts it to the
linked issue and mails the proposal's followers.
"""

from __future__ import annotations

import base64
import json
import logging
import math
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import numpy as np
import orjson
from django.core.exceptions import ValidationError
from django.db import IntegrityError, connection, transaction
from django.utils import timezone
from psycopg.types.numeric import Int8

from marin_site.db import server_binding_cursor
from marin_site.doors import Door
from marin_site.events import Verb
from marin_site.roles import permission_require
from runs.alerts import detectors, rules
from runs.alerts.models import Alert, AlertKind, AlertRule, AlertWatch
from runs.metrics import pg_arrays
from runs.metrics.declarations import declarations_for_run
from runs.metrics.display import MetricDisplay
from runs.models import TERMINAL_RUN_STATES, Recipe, Run, RunEvent, RunState
from runs.permissions import MANAGE_ALERT_RULES
from runs.signals import alert_changed

logger = logging.getLogger(__name__)


def _announce(alert: Alert, *, plan_id: int, opened: bool) -> None:
    alert_id, run_id = alert.pk, alert.run_id
    transaction.on_commit(
        lambda: alert_changed.send_robust(
            sender=Alert, alert_id=alert_id, run_id=run_id, plan_id=plan_id, opened=opened
        )
    )


def _event(run: Run, verb: Verb, message: str, door: str) -> None:
    RunEvent.objects.create(
        run=run, verb=verb, door=door, actor_label="alerts", message=message[:10_000]
    )


def alert_open(
    *,
    run: Run,
    kind: str,
    key: str,
    step: int | None,
    value: float | None,
    message: str,
    door: str = Door.SYSTEM,
) -> Alert | None:
    """Open an alert unless one of this kind and key is open on the run already."""
    if Alert.objects.filter(run_id=run.pk, kind=kind, key=key, closed_at__isnull=True).exists():
        return None
    try:
        with transaction.atomic():
            alert = Alert.objects.create(
                run_id=run.pk,
                kind=kind,
                key=key,
                message=message[:2_000],
                opened_step=step,
                opened_value=value,
            )
    except IntegrityError:  # another writer opened it meanwhile
        return None
    _event(run, Verb.ALERT_OPENED, f"[{kind}] {message}", door)
    _announce(alert, plan_id=rules.run_facts(run_id=run.pk)[0], opened=True)
    return alert


def alert_close(
    *, run: Run, kind: str, key: str, step: int | None, message: str, door: str = Door.SYSTEM
) -> Alert | None:
    """Close the open alert of this kind and key on the run, if there is one."""
    alert = (
        Alert.objects.select_for_update()
        .filter(run_id=run.pk, kind=kind, key=key, closed_at__isnull=True)
        .first()
    )
    if alert is None:
        return None
    alert.closed_at = timezone.now()
    alert.closed_step = step
    alert.close_message = message[:2_000]
    alert.save(update_fields=["closed_at", "closed_step", "close_message"])
    _event(run, Verb.ALERT_CLOSED, f"[{kind}] {message}", door)
    _announce(alert, plan_id=rules.run_facts(run_id=run.pk)[0], opened=False)
    return alert


def _columns(run: Run, batch: Any) -> dict[str, tuple[list[int], list[float]]]:
    """The batch's points per key, each in step order."""
    by_key: dict[str, list[int]] = {}
    for index, key in enumerate(batch.keys):
        group = by_key.get(key)
        if group is None:
            by_key[key] = [index]
        else:
            group.append(index)
    steps, values = batch.steps, batch.values
    out: dict[str, tuple[list[int], list[float]]] = {}
    for key, group in by_key.items():
        key_steps = [steps[i] for i in group]
        if key_steps != sorted(key_steps):
            group.sort(key=steps.__getitem__)
            key_steps = [steps[i] for i in group]
        out[key] = (key_steps, [values[i] for i in group])
    return out


WATCH_TABLE = AlertWatch._meta.db_table


@dataclass(slots=True)
class _Watch:
    pk: int
    kind: str
    key: str
    state: dict[str, Any]
    version: str = ""  # PostgreSQL's xmin of the row as read: whether it changed since


# A watch's windows of values (``window``, ``recent``, ``base``) are stored packed: the
# values' float64 bytes (little-endian) in base64, one JSON string per window, which
# PostgreSQL stores for about half the CPU of as many JSON numbers (and every value exactly).
# A state written before, with windows as JSON arrays, is read as it is.
PACKED_WINDOWS = ("window", "recent", "base")


def state_packed(state: dict[str, Any]) -> str:
    """A watch's state as the JSON text stored: its windows packed."""
    packed = dict(state)
    for name in PACKED_WINDOWS:
        values = packed.get(name)
        if isinstance(values, list):
            packed[name] = base64.b64encode(np.asarray(values, dtype="<f8").tobytes()).decode()
    return orjson.dumps(packed).decode()


def state_unpacked(stored: Any) -> dict[str, Any]:
    """A watch's state as stored (JSON text, or as the database driver decoded it), with its
    windows as lists of floats."""
    state = orjson.loads(stored) if isinstance(stored, str | bytes) else dict(stored)
    for name in PACKED_WINDOWS:
        value = state.get(name)
        if isinstance(value, str):
            state[name] = np.frombuffer(base64.b64decode(value), dtype="<f8").tolist()
    return state


def _watches_locked(
    run_id: int, keys: set[str], *, lock: bool = True
) -> dict[tuple[str, str], _Watch]:
    """The run's watches of these keys and its NaN watches, locked (unless ``lock`` is
    False), in one plain query (the ORM's would cost more CPU than the rest of an
    evaluation). On PostgreSQL each comes with its row version (``xmin``)."""
    params: list[int | str]
    if not keys:
        where, params = "kind = %s", [run_id, str(AlertKind.NAN)]
    else:
        marks = ", ".join(["%s"] * len(keys))
        where = f"(key IN ({marks}) OR kind = %s)"
        params = [run_id, *sorted(keys), str(AlertKind.NAN)]
    postgresql = connection.vendor == "postgresql"
    locking = " ORDER BY id FOR UPDATE" if postgresql and lock else ""
    version = "xmin::text" if postgresql else "''"
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT id, kind, key, state, {version} FROM {WATCH_TABLE} "  # noqa: S608
            f"WHERE run_id = %s AND {where}{locking}",
            params,
        )
        rows = cursor.fetchall()
    out = {}
    for pk, kind, key, stored, row_version in rows:
        out[(kind, key)] = _Watch(pk, kind, key, state_unpacked(stored), row_version)
    return out


def _watches_write(watches: list[_Watch]) -> None:
    texts = [state_packed(w.state) for w in watches]
    if connection.vendor == "postgresql":
        # Binary arrays bound by the server, as the metrics ingest sends its points.
        with server_binding_cursor() as cursor:
            pg_arrays.register(cursor.cursor)
            cursor.execute(
                f"UPDATE {WATCH_TABLE} AS w SET state = v.state::jsonb, updated_at = now() "  # noqa: S608
                "FROM unnest(%s::bigint[], %s::text[]) AS v(id, state) WHERE w.id = v.id",
                [pg_arrays.int8_array([w.pk for w in watches]), pg_arrays.text_array(texts)],
            )
        return
    with connection.cursor() as cursor:
        now = timezone.now()
        cursor.executemany(
            f"UPDATE {WATCH_TABLE} SET state = %s, updated_at = %s WHERE id = %s",  # noqa: S608
            [(text, now, w.pk) for text, w in zip(texts, watches, strict=True)],
        )


def _formatter(run_id: int, key: str) -> detectors.Formatter:
    """Writes a stored value of ``key`` as the pages do, in its declared unit (``12.0%``);
    the declarations are read only when a message is written."""

    def fmt(value: float | None) -> str:
        declaration = declarations_for_run(run_id=run_id).get(key)
        if declaration is None:
            return detectors.plain(value)
        return MetricDisplay.of(key, declaration).text(value)

    return fmt


def _watched(run: Run) -> dict[tuple[str, str], rules.Rule]:
    """The run's rules on metric keys, by (kind, key)."""
    return {
        (rule.kind, rule.key): rule
        for rule in rules.rules_for_run(run_id=run.pk)
        if rule.kind in rules.KEYED_KINDS
    }


def alerts_evaluate(
    *, run: Run, batch: Any, columns: dict[str, tuple[list[int], list[float]]] | None = None
) -> list[detectors.Change]:
    """Fold a stored batch (``runs.metrics.parse.PointBatch``) into the run's rolling alert state;
    open and close alerts as the detectors say. Returns the changes (for tests and bench).
    ``columns``: the batch's steps and values per key in step order, when the caller has
    them (the ingest does: ``runs.metrics.ingest.key_columns``).

    The usual batch opens and closes nothing: on PostgreSQL, outside a transaction, it folds
    into the watches as this process last wrote them (or as read without a lock, when it has
    no copy) and writes them back in one statement that holds only if no other writer
    changed them meanwhile (``_alerts_fold_unlocked``: one round trip, or two, where a
    locked transaction takes five). Anything else, or a write that lost a race, goes through
    the locked transaction, which reads the watches again (points at or below a watch's last
    step are skipped, so a watch already advanced is not folded twice).

    When nothing opens or closes, the write commits without waiting for the disk
    (``synchronous_commit = off``): a crash may lose the last fraction of a second of
    rolling state, which only means those points are not folded; a transaction that opens
    or closes an alert commits as any other."""
    watched = _watched(run)
    batch_keys = set(batch.keys)
    wanted = {pair for pair in watched if pair[1] in batch_keys}
    if columns is None:
        columns = _columns(run, batch)
    if (
        connection.vendor == "postgresql"
        and connection.get_autocommit()
        and not connection.in_atomic_block
        and _alerts_fold_unlocked(
            run=run, watched=watched, wanted=wanted, batch_keys=batch_keys, columns=columns
        )
    ):
        return []
    with transaction.atomic():
        watches = _watches_locked(run.pk, {key for _, key in wanted})
        nan_watches = _nan_watches(watches, batch_keys)
        if not wanted and not nan_watches:
            return []
        missing = [pair for pair in wanted if pair not in watches]
        if missing:
            AlertWatch.objects.bulk_create(
                [AlertWatch(run_id=run.pk, kind=kind, key=key, state={}) for kind, key in missing],
                ignore_conflicts=True,
            )
            for pair, w in _watches_locked(run.pk, {key for _, key in missing}).items():
                watches.setdefault(pair, w)
        changed, changes = _alerts_fold(
            run=run,
            watched=watched,
            wanted=wanted,
            watches=watches,
            nan_watches=nan_watches,
            columns=columns,
        )
        if changed:
            _watches_write(changed)
        for kind, key, change in changes:
            if change.opened:
                alert_open(
                    run=run,
                    kind=kind,
                    key=key,
                    step=change.step,
                    value=change.value,
                    message=change.message,
                )
            else:
                alert_close(run=run, kind=kind, key=key, step=change.step, message=change.message)
        outermost = not connection.savepoint_ids  # SET LOCAL would reach a caller's writes
        if not changes and outermost and connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SET LOCAL synchronous_commit TO OFF")
    return [change for _, _, change in changes]


def _nan_watches(watches: dict[tuple[str, str], _Watch], batch_keys: set[str]) -> dict[str, _Watch]:
    """The open NaN watches of the batch's keys (finite values may close them)."""
    return {
        key: w
        for (kind, key), w in watches.items()
        if kind == AlertKind.NAN and key in batch_keys and w.state.get("open_step") is not None
    }


def _alerts_fold(
    *,
    run: Run,
    watched: dict[tuple[str, str], rules.Rule],
    wanted: set[tuple[str, str]],
    watches: dict[tuple[str, str], _Watch],
    nan_watches: dict[str, _Watch],
    columns: dict[str, tuple[list[int], list[float]]],
) -> tuple[list[_Watch], list[tuple[str, str, detectors.Change]]]:
    """Feed each watched key's new points to its detector: the watches whose state moved,
    and the alerts to open or close."""
    changed: list[_Watch] = []
    changes: list[tuple[str, str, detectors.Change]] = []
    for (kind, key), rule in watched.items():
        if (kind, key) not in wanted:
            continue
        watch = watches[(kind, key)]
        steps, values = columns[key]
        before = watch.state.get("last")
        if kind == AlertKind.SPIKE:
            found = detectors.spike_feed(
                watch.state, rule.params, key, steps, values, fmt=_formatter(run.pk, key)
            )
        else:
            found = detectors.shift_feed(
                watch.state,
                rule.params,
                key,
                steps,
                values,
                falling=kind == AlertKind.DROP,
                fmt=_formatter(run.pk, key),
            )
        if watch.state.get("last") != before:
            changed.append(watch)
        changes.extend((kind, key, change) for change in found)
    for key, watch in nan_watches.items():
        found = detectors.nan_feed(watch.state, key, columns[key][0])
        if found:
            changed.append(watch)
            changes.extend((AlertKind.NAN, key, change) for change in found)
    return changed, changes


# The watches this process last wrote without a lock, per run, with the row versions its
# write left (``_alerts_fold_unlocked``): the next batch of the run folds into them without
# reading them back. A copy is taken out while a batch uses it and put back only after a
# write that held for every row, so a failed or lost write leaves none behind.
_KNOWN_RUNS = 1_000
_known: dict[int, dict[tuple[str, str], _Watch]] = {}

# Written only where each row is still at the version known (``xmin``); the answer: per row
# written its id and new version, then per open NaN watch of the batch's keys (when asked,
# ``probe``) its id and NULL. Its own statement here (``WATCH_WRITE``); a part of the one
# that stores a batch's points in ``runs.metrics.ingest`` (``INGEST_FRESH_WATCHED``).
WATCHES_WRITTEN = f"""written AS (
    UPDATE {WATCH_TABLE} AS w SET state = v.state::jsonb, updated_at = now()
    FROM unnest(%(ids)s::bigint[], %(states)s::text[], %(versions)s::text[])
        AS v(id, state, version){{quiet}}
    WHERE w.id = v.id AND w.xmin = v.version::xid{{guard}}
    RETURNING w.id, w.xmin::text AS version
)"""  # noqa: S608  (the table name is ours; values are parameters)
WATCHES_ANSWER = f"""
SELECT id, version FROM written
UNION ALL
SELECT id, NULL FROM {WATCH_TABLE}
WHERE %(probe)s AND run_id = %(run)s AND kind = %(nan)s AND key = ANY(%(batch_keys)s::text[])
    AND state->>'open_step' IS NOT NULL"""  # noqa: S608
WATCH_WRITE = (
    "WITH "
    + WATCHES_WRITTEN.format(
        # The statement is its own transaction: its commit need not wait for the disk.
        quiet=", (SELECT set_config('synchronous_commit', 'off', true)) AS quiet",
        guard="",
    )
    + WATCHES_ANSWER
)


def _alerts_fold_unlocked(
    *,
    run: Run,
    watched: dict[tuple[str, str], rules.Rule],
    wanted: set[tuple[str, str]],
    batch_keys: set[str],
    columns: dict[str, tuple[list[int], list[float]]],
) -> bool:
    """The lock-free form of ``alerts_evaluate`` (PostgreSQL, no transaction open): fold the
    batch into the watches as this process last wrote them (``_known``), or as read with
    their row versions (``xmin``) when it has none, and write the states back in one
    autocommitted statement, each row only if its version is still the one known. True when
    that settled the batch: every watch existed, nothing opened or closed, and every row was
    written. False leaves the batch to the locked form (rows this one did write have moved
    past the batch's steps, which the locked form then skips).

    Folded from the process's copy, the statement also says whether the batch's keys have an
    open NaN watch (one opened by a refused batch, in any process): finite values may close
    it, which the locked form does."""
    known = _known.pop(run.pk, None)
    if known is not None and wanted and all(pair in known for pair in wanted):
        watches = {pair: known[pair] for pair in wanted}
        nan_watches: dict[str, _Watch] = {}
    else:
        if known is not None:  # not used: kept as it was
            _known[run.pk] = known
        known = None
        watches = _watches_locked(run.pk, {key for _, key in wanted}, lock=False)
        nan_watches = _nan_watches(watches, batch_keys)
        if not wanted and not nan_watches:
            return True
        if any(pair not in watches for pair in wanted):
            return False
    changed, changes = _alerts_fold(
        run=run,
        watched=watched,
        wanted=wanted,
        watches=watches,
        nan_watches=nan_watches,
        columns=columns,
    )
    if changes:
        return False
    if not changed:
        # Nothing new for the watches: read, that settles it; from the copy, the NaN watches
        # were not looked at (the locked form does).
        return known is None
    ahead = AlertsAhead(run.pk, watches, changed, sorted(batch_keys), probe=known is not None)
    with server_binding_cursor() as cursor:
        pg_arrays.register(cursor.cursor)
        cursor.execute(WATCH_WRITE, ahead.params())
        return ahead.settled(cursor.fetchall())


@dataclass(slots=True)
class AlertsAhead:
    """A batch folded into a run's watches, to be written by a statement that returns, per
    row written, its id and new version (``xmin``), and per open NaN watch of the batch's
    keys its id and None (``WATCH_WRITE``; the metrics ingest's ``INGEST_FRESH_WATCHED``)."""

    run_id: int
    watches: dict[tuple[str, str], _Watch]
    changed: list[_Watch]
    keys: list[str]
    probe: bool = True
    rows: list[tuple[int, str | None]] | None = None  # the statement's answer, once written

    def params(self) -> dict[str, Any]:
        return {
            "ids": pg_arrays.int8_array([w.pk for w in self.changed]),
            "states": pg_arrays.text_array([state_packed(w.state) for w in self.changed]),
            "versions": pg_arrays.text_array([w.version for w in self.changed]),
            "probe": self.probe,
            "run": Int8(self.run_id),
            "nan": str(AlertKind.NAN),
            "batch_keys": pg_arrays.text_array(self.keys),
        }

    def settled(self, rows: list[tuple[int, str | None]]) -> bool:
        """Whether the write settled the batch: every row written, no open NaN watch. Then
        this process keeps the watches, at their new versions, for the run's next batch."""
        versions = {pk: version for pk, version in rows if version is not None}
        if len(versions) != len(self.changed) or len(rows) != len(versions):
            return False
        for watch in self.changed:
            watch.version = versions[watch.pk]
        if len(_known) >= _KNOWN_RUNS:
            _known.clear()
        _known[self.run_id] = {
            pair: w for pair, w in self.watches.items() if pair[0] != AlertKind.NAN
        }
        return True


def alerts_fold_ahead(*, run: Run, batch_keys: set[str], columns: Any) -> AlertsAhead | None:
    """A batch about to be stored, folded into this process's copy of its run's watches
    (PostgreSQL, no transaction open), for the statement that stores the points to write
    them too (``runs.metrics.ingest``): one round trip for the points and the alerts. None
    when it cannot be settled so (no copy, a watch missing from it, nothing for the watches,
    or an alert to open or close): the batch is then evaluated after it is stored
    (``alerts_evaluate``), as it would be without this. ``AlertsAhead.settled`` says, from
    the statement's rows, whether the write held; if not, ``alerts_evaluate`` folds what
    is left under its rules (rows written have moved past the batch's steps)."""
    if not (
        connection.vendor == "postgresql"
        and connection.get_autocommit()
        and not connection.in_atomic_block
    ):
        return None
    watched = _watched(run)
    wanted = {pair for pair in watched if pair[1] in batch_keys}
    known = _known.pop(run.pk, None)
    if known is None:
        return None
    if not wanted or any(pair not in known for pair in wanted):
        _known[run.pk] = known  # not used: kept as it was
        return None
    watches = {pair: known[pair] for pair in wanted}
    changed, changes = _alerts_fold(
        run=run, watched=watched, wanted=wanted, watches=watches, nan_watches={}, columns=columns
    )
    if changes or not changed:
        return None  # the copy is dropped: the evaluation after the store reads the rows
    return AlertsAhead(run.pk, watches, changed, sorted(batch_keys))


def alerts_forget() -> None:
    """Drop this process's copies of the watches (tests; they are checked at every write)."""
    _known.clear()


def alerts_not_finite(*, run: Run, first_steps: dict[str, int], door: str = Door.SYSTEM) -> int:
    """Values that were not finite (NaN, infinities: never stored) seen by a door, as the
    first step of each key. Opens one NaN alert per key (when the run's rules keep the NaN
    rule); finite values from a later step close it (``alerts_evaluate``). Returns how many
    alerts opened."""
    active = {rule.key for rule in rules.rules_for_run(run_id=run.pk) if rule.kind == AlertKind.NAN}
    if not active:
        return 0
    opened = 0
    with transaction.atomic():
        for key, step in sorted(first_steps.items()):
            if rules.ALL_KEYS not in active and key not in active:
                continue
            watch, _ = AlertWatch.objects.select_for_update().get_or_create(
                run_id=run.pk, kind=AlertKind.NAN, key=key, defaults={"state": {}}
            )
            if watch.state.get("open_step") is not None:
                continue
            alert = alert_open(
                run=run,
                kind=AlertKind.NAN,
                key=key,
                step=step,
                value=None,
                message=f"{key} was not finite (NaN or infinite) at step {step}",
                door=door,
            )
            if alert is not None:
                watch.state = {"open_step": step}
                watch.save(update_fields=["state", "updated_at"])
                opened += 1
    return opened


def silence_message(*, run: Run, quiet: timedelta, allowed: Any, last: Any) -> str:
    """A silence alert in words a reader can act on: how long the run has been quiet, who
    runs it (so who can look), what to do, and what happens next by itself."""
    said = (
        f"No heartbeat for {int(quiet.total_seconds())} s (the rule allows {allowed} s); "
        f"last heard at {last:%Y-%m-%d %H:%M:%S} UTC."
    )
    if run.executor == "external":
        who = (
            "It runs outside the site, where it was claimed: whoever runs it should check "
            "that its process is alive and reports with its token."
        )
    elif run.executor.startswith("pool:"):
        who = (
            f"An agent of {run.executor} runs it: check the agent's machine, or its lease "
            "lapses and the run goes back to the queue."
        )
    elif run.external_id:
        who = f"Its job on {run.executor} may have stopped: its log is on the run's page."
    else:
        who = "No job of this site runs it: whatever reports for it has gone quiet."
    return (
        f"{said} {who} A maintainer can cancel it on its run page; after "
        f"{run.heartbeat_timeout_seconds} s without a heartbeat it is marked crashed and "
        "this alert closes."
    )


def alerts_silence_check() -> dict[str, int]:
    """The periodic pass (Celery beat): open a silence alert on each running run whose
    heartbeat has been quiet longer than its rule allows, close those that hear it again."""
    now = timezone.now()
    opened = closed = 0
    for run in Run.objects.filter(state=RunState.RUNNING).only(
        "pk",
        "plan_id",
        "recipe_name",
        "recipe_version",
        "heartbeat_at",
        "started_at",
        "executor",
        "external_id",
        "heartbeat_timeout_seconds",
    ):
        rule = next(
            (r for r in rules.rules_for_run(run_id=run.pk) if r.kind == AlertKind.SILENCE),
            None,
        )
        last = run.heartbeat_at or run.started_at
        if rule is None or last is None:
            continue
        quiet = now - last
        with transaction.atomic():
            if quiet > timedelta(seconds=rule.params["seconds"]):
                opened += (
                    alert_open(
                        run=run,
                        kind=AlertKind.SILENCE,
                        key="",
                        step=None,
                        value=None,
                        message=silence_message(
                            run=run, quiet=quiet, allowed=rule.params["seconds"], last=last
                        ),
                        door=Door.WORKER,
                    )
                    is not None
                )
            else:
                closed += (
                    alert_close(
                        run=run,
                        kind=AlertKind.SILENCE,
                        key="",
                        step=None,
                        message=f"heartbeat heard again at {last:%Y-%m-%d %H:%M:%S} UTC",
                        door=Door.WORKER,
                    )
                    is not None
                )
    # Runs that ended while quiet: their alerts are closed by alerts_close_ended; a lost
    # signal is made good here.
    for run_id, state in (
        Alert.objects.filter(closed_at__isnull=True, run__state__in=TERMINAL_RUN_STATES)
        .values_list("run_id", "run__state")
        .distinct()
    ):
        closed += alerts_close_ended(run_id=run_id, state=state)
    return {"opened": opened, "closed": closed}


def alerts_close_ended(*, run_id: int, state: str) -> int:
    """A run ended: its open alerts close with it (they cannot close from its metrics)."""
    run = Run.objects.filter(pk=run_id).first()
    if run is None:
        return 0
    closed = 0
    with transaction.atomic():
        for kind, key in Alert.objects.filter(run_id=run_id, closed_at__isnull=True).values_list(
            "kind", "key"
        ):
            closed += (
                alert_close(
                    run=run,
                    kind=kind,
                    key=key,
                    step=None,
                    message=(
                        f"the attempt ended; the run is back in the queue (attempt {run.attempt})"
                        if state == RunState.QUEUED
                        else f"the run ended ({state})"
                    ),
                    door=Door.WORKER,
                )
                is not None
            )
    return closed


# --- rules, edited by maintainers ---------------------------------------------------------


def _rule_check(
    *, kind: str, key: str, params: Any, recipe: Recipe | None, run: Run | None
) -> dict[str, Any]:
    if (recipe is None) == (run is None):
        raise ValidationError({"recipe": ["give a recipe or a run (exactly one)"]})
    checked, problems = rules.params_check(kind=kind, key=key, params=params)
    if problems:
        raise ValidationError({name: [text] for name, text in problems.items()})
    return {name: value for name, value in checked.items() if name in (params or {})}


@transaction.atomic
def alert_rule_save(
    *,
    actor: Any,
    kind: str,
    key: str = "",
    params: Any = None,
    enabled: bool = True,
    recipe: Recipe | None = None,
    run: Run | None = None,
    rule: AlertRule | None = None,
) -> AlertRule:
    """Create or change a rule (maintainers). Only the parameters given are stored; the
    others keep their defaults. Invalid input is refused naming the field."""
    permission_require(actor, MANAGE_ALERT_RULES, None, "edit alert rules")
    params = {} if params is None else params
    stored = _rule_check(kind=kind, key=key, params=params, recipe=recipe, run=run)
    if rule is None:
        rule = AlertRule.objects.filter(
            recipe=recipe, run=run, kind=kind, key=key
        ).first() or AlertRule(recipe=recipe, run=run, kind=kind, key=key)
    elif (rule.kind, rule.key, rule.recipe_id, rule.run_id) != (
        kind,
        key,
        getattr(recipe, "pk", None),
        getattr(run, "pk", None),
    ) and AlertRule.objects.filter(recipe=recipe, run=run, kind=kind, key=key).exclude(
        pk=rule.pk
    ).exists():
        raise ValidationError({"key": ["a rule of this kind and key exists already here"]})
    rule.recipe, rule.run, rule.kind, rule.key = recipe, run, kind, key
    rule.params, rule.enabled = stored, enabled
    rule.save()
    transaction.on_commit(rules.rules_forget)
    return rule


@transaction.atomic
def alert_rule_delete(*, actor: Any, rule: AlertRule) -> None:
    permission_require(actor, MANAGE_ALERT_RULES, None, "edit alert rules")
    rule.delete()
    transaction.on_commit(rules.rules_forget)


def not_finite_steps(body: bytes, *, limit: int = 100_000) -> dict[str, int]:
    """The first step of each key whose value is NaN or infinite in a metrics body that the
    strict parser refused ({} when there is none, or the body is not such a batch)."""
    if len(body) > 8 * 1024 * 1024 or not (b"NaN" in body or b"Infinity" in body):
        return {}
    try:
        data = json.loads(body)
    except ValueError:
        return {}
    points = data.get("points") if isinstance(data, dict) else None
    firsts: dict[str, int] = {}
    for point in points[:limit] if isinstance(points, list) else []:
        if not isinstance(point, dict):
            continue
        key, step, value = point.get("key"), point.get("step"), point.get("value")
        if (
            type(value) is float
            and not math.isfinite(value)
            and type(key) is str
            and rules.good_key(key)
            and type(step) is int
            and 0 <= step < 2**62
        ):
            firsts[key] = min(step, firsts.get(key, step))
    return firsts
