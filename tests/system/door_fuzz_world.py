"""The world the door fuzz tries its doors against (tests/system/test_door_fuzz*.py), and
the fixtures those modules share: one module per group of doors, so xdist runs them side by
side."""

from __future__ import annotations

import json
import os
import random
import sys
from pathlib import Path
from typing import Any

import pytest
from rest_framework.authtoken.models import Token

from proposals.models import Comment, Review
from proposals.services import proposal_transition
from runs import tokens
from runs.alerts.models import AlertKind, AlertRule
from runs.campaigns.models import Campaign
from runs.models import Run, RunState
from runs.pools import leases, services
from runs.services import runs as run_writes
from tests.factories import ProposalFactory
from tests.runs.pools.pool_helpers import ONE_RUN, make_pool, offered_plan
from tests.runs.runs_helpers import launched_plan
from tests.system.door_fuzz import Fuzzer, peak_rss_mb, rss_mb

SEED = int(os.environ.get("DOOR_FUZZ_SEED", "29"))
CLASSES = int(os.environ.get("DOOR_FUZZ_CLASSES", "2"))  # input classes tried per field
WEBHOOK_SECRET = "fuzz-secret"


def seeded() -> random.Random:
    return random.Random(SEED)  # noqa: S311 - a reproducible choice of inputs, not a secret


@pytest.fixture
def world(
    recipe: Any, maintainer: Any, contributor: Any, reviewer: Any, settings: Any
) -> dict[str, Any]:
    return build_world(
        recipe=recipe,
        maintainer=maintainer,
        contributor=contributor,
        reviewer=reviewer,
        settings=settings,
    )


def build_world(
    *, recipe: Any, maintainer: Any, contributor: Any, reviewer: Any, settings: Any
) -> dict[str, Any]:
    """What the doors are tried against: a submitted proposal with a review and a comment,
    a launched plan with a running run and its token, a pool with an agent holding a lease
    and a fresh registration token, a campaign, and a maintainer's API token."""
    settings.GITHUB_WEBHOOK_SECRET = WEBHOOK_SECRET
    rss_before = rss_mb()
    proposal = ProposalFactory.create(author=contributor, recipe=recipe)
    proposal_transition(proposal_id=proposal.pk, action="submit", actor=contributor)
    review = Review.objects.create(
        proposal=proposal, reviewer=reviewer, score=4, recommendation="approve", text="ok"
    )
    comment = Comment.objects.create(proposal=proposal, author=reviewer, body="ok")
    plan = launched_plan(recipe)
    run = Run.objects.filter(plan=plan).order_by("pk").first()
    assert run is not None
    run = run_writes.run_transition(
        run_id=run.pk,
        to_state=RunState.RUNNING,
        door="worker",
        changes={"token_hash": tokens.token_hash(tokens.run_token(run=run))},
    )
    pool = make_pool(maintainer)
    offered_plan(recipe, pool, ONE_RUN)
    _row, registration = services.registration_token_create(actor=maintainer, pool_id=pool.pk)
    agent, credential = services.agent_register(
        token=registration, name="host-a", labels=["gpu:a5000"], version="1.0"
    )
    _row2, registration = services.registration_token_create(actor=maintainer, pool_id=pool.pk)
    lease = leases.lease_acquire(agent=agent)
    assert lease is not None
    campaign = Campaign.objects.create(
        slug="long-run", name="A long run", target_tokens=1e9, target_flops=1e18
    )
    rule = AlertRule.objects.create(recipe=recipe, kind=AlertKind.SPIKE, key="loss")
    token, _ = Token.objects.get_or_create(user=maintainer)
    return {
        "maintainer": maintainer,
        "rss_before_mb": rss_before,
        "token": token.key,
        "run": run.pk,
        "run_token": tokens.run_token(run=run),
        "plan": plan.pk,
        "registration_token": registration,
        "agent_credential": credential,
        "lease": lease.pk,
        "params": {
            "pk": sorted({proposal.pk, run.pk}),
            "plan_id": [plan.pk],
            "name": [recipe.name, pool.name],
            "version": [recipe.version],
            "slug": [campaign.slug],
            "token_id": [_row.pk],
            "agent_id": [agent.pk],
        },
        "ids": {
            "proposals": proposal.pk,
            "proposal": proposal.pk,
            "reviews": review.pk,
            "comments": comment.pk,
            "recipes": recipe.pk,
            "recipe": recipe.pk,
            "runs": run.pk,
            "run": run.pk,
            "plans": plan.pk,
            "plan_id": plan.pk,
            "pools": pool.name,
            "campaigns": campaign.slug,
            "agents": agent.pk,
            "alert-rules": rule.pk,
            "agent_id": agent.pk,
            "lease_id": lease.pk,
        },
    }


def report(fuzzer: Fuzzer, name: str) -> None:
    """Add this part's counts to the report bench/fuzz.py reads (DOOR_FUZZ_REPORT)."""
    path = os.environ.get("DOOR_FUZZ_REPORT")
    if not path:
        return
    out = Path(path)
    data = json.loads(out.read_text()) if out.exists() else {}
    data[name] = {
        "by_door": fuzzer.tally.by_door(),
        "requests": fuzzer.tally.total,
        "failures": fuzzer.tally.failures,
        "peak_rss_mb": peak_rss_mb(),
        "rss_before_mb": fuzzer.world.get("rss_before_mb", 0.0),
    }
    out.write_text(json.dumps(data, indent=1))


def check(fuzzer: Fuzzer, name: str) -> None:
    report(fuzzer, name)
    sys.stdout.write(f"\ndoor fuzz, {name}: {fuzzer.tally.total} requests\n")
    assert fuzzer.tally.total > 0
    assert not fuzzer.tally.failures, "\n".join(fuzzer.tally.failures[:40])
