"""What ``runs`` tells the rest of the site, without knowing who listens.

``proposals`` (which owns the GitHub sync) connects to these; ``runs`` never imports it.

- ``run_state_changed``: kwargs ``run_id``, ``plan_id``, ``from_state``, ``to_state``. Runs
  killed in bulk by a plan's cancel are not announced one by one: the canceller knows.
- ``plan_finished``: kwargs ``plan_id`` and ``summary`` (the dict stored on the plan's
  launch: per-run final metrics, the comparison with the baseline, a suggested verdict and a
  ready markdown table). Posting it as a GitHub result comment is the listener's job.
- ``reconcile_pass``: sent (no kwargs) at the start of every pass of the reconciler, outside
  any transaction. A caller that hands plans to ``runs`` to launch or cancel checks that each
  hand-off happened and makes good one that did not.
- ``plan_owners``: kwarg ``plan_id``; each receiver returns the ids of the users who answer
  for the plan (the author of the approved proposal it came from), who may claim its queued
  runs to execute by hand (``runs.permissions.CLAIM_RUN``). Asked, not announced.
- ``plan_pages``: kwarg ``plan_id``; each receiver returns ``(label, url)`` of the page that
  shows the plan (its proposal's page) or None. A run's page links back to it. Asked.
- ``plan_named``: kwarg ``name``; each receiver returns the id of the plan a person means by
  that name (the proposal's number, ``#14`` or ``14``, or its slug) or None. MLflow's door
  takes these as experiment names beside ``plan-<id>``. Asked.
- ``alert_changed``: kwargs ``alert_id``, ``run_id``, ``plan_id`` and ``opened`` (True when
  the alert opened, False when it closed): an alert on a run's metrics (``runs.alerts``).
- ``dry_run_finished``: kwargs ``dry_run_id`` and ``subject`` (what it was asked for, e.g.
  ``proposal-12``): a dry run ended; sent after it is stored.
- ``intervention_recorded``: kwargs ``intervention_id`` and ``campaign_id``: a maintainer
  recorded a change to a campaign (``runs.campaigns``).

The first two, ``alert_changed`` and ``intervention_recorded`` are sent after the transaction that caused them commits.
"""

from __future__ import annotations

from django.dispatch import Signal

run_state_changed = Signal()
plan_finished = Signal()
reconcile_pass = Signal()
plan_owners = Signal()
plan_pages = Signal()
plan_named = Signal()
alert_changed = Signal()
intervention_recorded = Signal()
dry_run_finished = Signal()
