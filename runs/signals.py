"""What ``runs`` tells the rest of the site, without knowing who listens.

``proposals`` (which owns the GitHub sync) connects to these; ``runs`` never imports it.
Both are sent after the transaction that caused them commits.

- ``run_state_changed``: kwargs ``run_id``, ``plan_id``, ``from_state``, ``to_state``.
- ``plan_finished``: kwargs ``plan_id`` and ``summary`` (the dict stored on the plan's
  launch: per-run final metrics, the comparison with the baseline, a suggested verdict and a
  ready markdown table). Posting it as a GitHub result comment is the listener's job.
"""

from __future__ import annotations

from django.dispatch import Signal

run_state_changed = Signal()
plan_finished = Signal()
