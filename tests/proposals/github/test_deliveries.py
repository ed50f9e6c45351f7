"""POST /github/webhook/: signatures, storage, dedupe, every real payload, ordering rules."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.utils import timezone

from marin_site.celery import app as celery_app
from proposals.models import Comment, Event, PendingIssue, Proposal, WebhookDelivery
from tests.proposals.github_support import (
    WEBHOOKS,
    comment_delivery,
    fake_github,
    github_on,
    issue_payload,
    issues_delivery,
    post_delivery,
    process_deliveries,
    sign,
)

pytestmark = pytest.mark.django_db
__all__ = ["fake_github", "github_on"]

PAYLOADS = sorted(WEBHOOKS.glob("*/*.json"))
EXPERIMENT_BODY = "## Description\n\nRoute better.\n\n## Hypothesis or Goal\n\nIt helps.\n"


def _event(path: Path) -> str:
    return path.parent.name


@pytest.fixture
def webhook_settings(settings: Any, github_on: Any) -> Any:
    settings.GITHUB_REPOSITORY = ""  # the octokit payloads come from several repositories
    return settings


def test_fixture_payloads_exist() -> None:
    assert len(PAYLOADS) >= 40


@pytest.mark.parametrize("path", PAYLOADS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_real_payload_is_acknowledged_recorded_and_deduplicated(
    webhook_settings: Any, client: Any, recipe: Any, path: Path
) -> None:
    raw = path.read_bytes()
    event = _event(path)
    response = post_delivery(client, event, raw, delivery_id=f"d-{path.name}")
    assert response.status_code == 202
    assert process_deliveries()[0] in {"applied", "ignored"}
    delivery = WebhookDelivery.objects.get(delivery_id=f"d-{path.name}")
    assert delivery.processed_at is not None
    assert delivery.detail
    payload = json.loads(raw)
    is_experiment_issue = event == "issues" and any(
        label["name"] in {"experiment", "experiments", "community-experiment-submission"}
        for label in payload["issue"].get("labels") or []
    )
    proposals, comments, events = (
        Proposal.objects.count(),
        Comment.objects.count(),
        Event.objects.count(),
    )
    if event == "ping":
        assert delivery.outcome == "applied"
    elif not is_experiment_issue:
        assert delivery.outcome == "ignored"
        assert proposals == 0

    again = post_delivery(client, event, raw, delivery_id=f"d-{path.name}")
    assert again.status_code == 202
    assert again.json()["duplicate"] is True
    assert process_deliveries() == []
    assert WebhookDelivery.objects.filter(delivery_id=f"d-{path.name}").count() == 1
    assert (Proposal.objects.count(), Comment.objects.count(), Event.objects.count()) == (
        proposals,
        comments,
        events,
    )


@pytest.mark.parametrize("path", PAYLOADS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_real_payload_with_a_wrong_signature_gets_401(
    webhook_settings: Any, client: Any, path: Path
) -> None:
    raw = path.read_bytes()
    response = post_delivery(client, _event(path), raw, signature=sign(raw, "not-the-secret"))
    assert response.status_code == 401
    assert not WebhookDelivery.objects.exists()


def test_an_unsigned_delivery_gets_401(webhook_settings: Any, client: Any) -> None:
    response = post_delivery(client, "ping", {"zen": "hi"}, signature="")
    assert response.status_code == 401
    assert not WebhookDelivery.objects.exists()


def test_no_secret_configured_refuses_every_delivery(settings: Any, client: Any) -> None:
    settings.GITHUB_WEBHOOK_SECRET = ""
    body = b'{"zen": "hi"}'
    response = post_delivery(client, "ping", body, signature=sign(body, ""))
    assert response.status_code == 401
    assert not WebhookDelivery.objects.exists()


def test_bodies_up_to_25_mb_are_accepted_and_larger_refused_with_413(
    webhook_settings: Any, client: Any
) -> None:
    padding = "x" * (3 * 1024 * 1024)  # over the site-wide 1 MB cap, under GitHub's 25 MB
    body = json.dumps({"zen": padding}).encode()
    assert post_delivery(client, "ping", body).status_code == 202
    huge = b"{" + b" " * (25 * 1024 * 1024) + b"}"
    assert post_delivery(client, "ping", huge).status_code == 413
    assert WebhookDelivery.objects.count() == 1


def test_the_delivery_is_processed_by_the_celery_task_after_commit(
    webhook_settings: Any, client: Any, django_capture_on_commit_callbacks: Any
) -> None:
    eager = celery_app.conf.task_always_eager
    celery_app.conf.task_always_eager = True
    try:
        with django_capture_on_commit_callbacks(execute=True):
            response = post_delivery(client, "ping", {"zen": "hi"}, delivery_id="celery-1")
    finally:
        celery_app.conf.task_always_eager = eager
    assert response.status_code == 202
    delivery = WebhookDelivery.objects.get(delivery_id="celery-1")
    assert (delivery.outcome, delivery.detail) == ("applied", "pong")


@pytest.fixture
def nudges(webhook_settings: Any, settings: Any, monkeypatch: Any) -> list[int]:
    """A shared cache (as with Redis in production); each drain message sent is recorded."""
    from proposals.github import deliveries

    settings.SHARED_CACHE = True
    sent: list[int] = []
    monkeypatch.setattr(
        deliveries.github_deliveries_drain, "apply_async", lambda **kw: sent.append(1)
    )
    return sent


def test_a_burst_of_deliveries_costs_one_nudge_with_a_shared_cache(
    nudges: list[int], client: Any, django_capture_on_commit_callbacks: Any
) -> None:
    from proposals.github import deliveries

    sent = nudges
    with django_capture_on_commit_callbacks(execute=True):
        for n in range(5):
            assert post_delivery(client, "ping", {"zen": f"z{n}"}).status_code == 202
    assert len(sent) == 1

    assert deliveries.github_deliveries_drain() == 5  # what the worker runs: all five, oldest first
    assert not WebhookDelivery.objects.filter(outcome="pending").exists()
    assert len(sent) == 2  # it found work, so it comes back shortly and holds the flag
    with django_capture_on_commit_callbacks(execute=True):
        post_delivery(client, "ping", {"zen": "while-draining"})
    assert len(sent) == 2  # no message: the drain coming back will find it
    assert deliveries.github_deliveries_drain() == 1
    assert len(sent) == 3
    assert deliveries.github_deliveries_drain() == 0  # nothing new: it lets go of the flag
    assert len(sent) == 3
    with django_capture_on_commit_callbacks(execute=True):
        post_delivery(client, "ping", {"zen": "late"})
    assert len(sent) == 4  # the next delivery nudges on its own
    assert deliveries.github_deliveries_drain() == 1


def test_a_delivery_stored_while_the_drain_lets_go_is_not_left_behind(
    nudges: list[int], client: Any, monkeypatch: Any, django_capture_on_commit_callbacks: Any
) -> None:
    """The race the last look closes: stored (its nudge refused) just before the flag goes."""
    from django.core.cache import cache

    from proposals.github import deliveries

    real_drain_pending = deliveries._drain_pending
    passes: list[int] = []

    def drain_pending(batch: int) -> int:
        done = real_drain_pending(batch)
        passes.append(done)
        if len(passes) == 1:  # between the empty pass and letting go of the flag
            assert cache.get(deliveries.DRAIN_NUDGED)
            with django_capture_on_commit_callbacks(execute=True):
                post_delivery(client, "ping", {"zen": "just-in-time"})
        return done

    monkeypatch.setattr(deliveries, "_drain_pending", drain_pending)
    cache.set(deliveries.DRAIN_NUDGED, 1)
    assert deliveries.deliveries_drain() == (1, False)
    assert passes == [0, 1]
    assert not WebhookDelivery.objects.filter(outcome="pending").exists()


def test_a_process_that_just_saw_the_flag_held_does_not_ask_again(
    nudges: list[int], client: Any, monkeypatch: Any, django_capture_on_commit_callbacks: Any
) -> None:
    """The nudge memo skips Redis, and the drain's last look still finds what it skipped."""
    from django.core.cache import cache

    from proposals.github import deliveries

    monkeypatch.setattr(deliveries, "DRAIN_NUDGE_MEMO_SECONDS", 30.0)  # no race with the clock
    sent = nudges
    cache.set(deliveries.DRAIN_NUDGED, 1)  # a drain holds the flag
    adds: list[str] = []
    real_add = cache.add

    def add(key: str, *args: Any, **kwargs: Any) -> bool:
        adds.append(key)
        return real_add(key, *args, **kwargs)

    monkeypatch.setattr(cache, "add", add)
    with django_capture_on_commit_callbacks(execute=True):
        post_delivery(client, "ping", {"zen": "first"})  # asks, finds it held
        post_delivery(client, "ping", {"zen": "second"})  # does not ask again
    assert (adds, sent) == ([deliveries.DRAIN_NUDGED], [])
    assert deliveries.deliveries_drain() == (2, True)

    waits: list[float] = []

    def sleep_while_a_delivery_arrives(seconds: float) -> None:
        # The drain let go of the flag; this process saw it held a moment ago, so its next
        # delivery does not ask and is not nudged: only the drain's last look can find it.
        with django_capture_on_commit_callbacks(execute=True):
            post_delivery(client, "ping", {"zen": "during-the-wait"})
        waits.append(seconds)

    cache.set(deliveries.DRAIN_NUDGED, 1)
    with django_capture_on_commit_callbacks(execute=True):
        post_delivery(client, "ping", {"zen": "third"})  # seen held again, just now
    assert deliveries.deliveries_drain() == (1, True)
    monkeypatch.setattr(deliveries.time, "sleep", sleep_while_a_delivery_arrives)
    assert deliveries.deliveries_drain() == (1, False)
    assert (sent, waits) == ([], [30.0])  # it waited out the memo, then looked
    assert not WebhookDelivery.objects.filter(outcome="pending").exists()


def test_without_a_shared_cache_every_delivery_nudges(
    webhook_settings: Any,
    settings: Any,
    client: Any,
    monkeypatch: Any,
    django_capture_on_commit_callbacks: Any,
) -> None:
    from proposals.github import deliveries

    settings.SHARED_CACHE = False
    sent: list[int] = []
    monkeypatch.setattr(
        deliveries.github_deliveries_drain, "apply_async", lambda **kw: sent.append(1)
    )
    with django_capture_on_commit_callbacks(execute=True):
        for n in range(3):
            post_delivery(client, "ping", {"zen": f"z{n}"})
    assert len(sent) == 3


def test_a_failed_nudge_leaves_the_broker_alone_for_a_while_then_tries_again(
    webhook_settings: Any,
    settings: Any,
    client: Any,
    monkeypatch: Any,
    django_capture_on_commit_callbacks: Any,
) -> None:
    """A publish to a broker that is down takes seconds (its connection timeouts): only one
    acknowledgement a process pays that per NUDGE_RETRY_SECONDS, and the flag is let go."""
    import time

    from django.core.cache import cache

    from proposals.github import deliveries

    settings.SHARED_CACHE = True
    cache.clear()
    monkeypatch.setattr(deliveries, "NUDGE_RETRY_SECONDS", 0.3)
    calls: list[int] = []

    def broker_down(**kwargs: Any) -> None:
        calls.append(1)
        raise ConnectionError("broker down")

    monkeypatch.setattr(deliveries.github_deliveries_drain, "apply_async", broker_down)
    with django_capture_on_commit_callbacks(execute=True):
        assert post_delivery(client, "ping", {"zen": "a"}).status_code == 202
        assert post_delivery(client, "ping", {"zen": "b"}).status_code == 202
    assert len(calls) == 1  # the second did not wait for the broker again
    assert cache.get(deliveries.DRAIN_NUDGED) is None  # other processes may still nudge
    time.sleep(0.35)
    with django_capture_on_commit_callbacks(execute=True):
        assert post_delivery(client, "ping", {"zen": "c"}).status_code == 202
    assert len(calls) == 2  # once the wait is over, the next delivery tries again
    assert WebhookDelivery.objects.filter(outcome="pending").count() == 3


def _opened_experiment_issue(client: Any, *, number: int) -> dict[str, Any]:
    """An experiment issue opened on GitHub and processed: a proposal linked to ``number``."""
    issue = issue_payload(number=number, title="Routing", body=EXPERIMENT_BODY)
    post_delivery(client, "issues", issues_delivery("opened", issue))
    process_deliveries()
    return issue


def test_an_older_edit_never_overwrites_a_newer_one(
    github_on: Any, client: Any, recipe: Any
) -> None:
    issue = _opened_experiment_issue(client, number=7)
    newer = dict(issue, body=EXPERIMENT_BODY.replace("It helps.", "It helps a lot."))
    newer["updated_at"] = "2026-01-03T00:00:00Z"
    older = dict(issue, body=EXPERIMENT_BODY.replace("It helps.", "It helps a bit."))
    older["updated_at"] = "2026-01-02T00:00:00Z"
    post_delivery(client, "issues", issues_delivery("edited", newer))
    post_delivery(client, "issues", issues_delivery("edited", older))
    assert process_deliveries() == ["applied", "ignored"]
    proposal = Proposal.objects.get(github_issue_number=7)
    assert proposal.hypothesis == "It helps a lot."
    assert "older edit" in WebhookDelivery.objects.get(action="edited", outcome="ignored").detail


def test_the_same_comment_under_two_delivery_ids_is_one_comment(
    github_on: Any, client: Any, recipe: Any
) -> None:
    post_delivery(
        client,
        "issues",
        issues_delivery("opened", issue_payload(number=8, title="R", body=EXPERIMENT_BODY)),
    )
    delivery = comment_delivery("created", number=8, comment_id=555, body="Nice", login="ann")
    post_delivery(client, "issue_comment", delivery, delivery_id="first")
    post_delivery(client, "issue_comment", delivery, delivery_id="second")
    assert process_deliveries() == ["applied", "applied", "ignored"]
    assert Comment.objects.filter(github_comment_id=555).count() == 1


def test_comment_edits_apply_in_order_and_deletes_remove(
    github_on: Any, client: Any, recipe: Any
) -> None:
    post_delivery(
        client,
        "issues",
        issues_delivery("opened", issue_payload(number=9, title="R", body=EXPERIMENT_BODY)),
    )
    post_delivery(
        client,
        "issue_comment",
        comment_delivery("created", number=9, comment_id=77, body="v1", login="ann"),
    )
    for body, when in (("v3", "2026-01-03T00:00:00Z"), ("v2", "2026-01-02T00:00:00Z")):
        post_delivery(
            client,
            "issue_comment",
            comment_delivery(
                "edited", number=9, comment_id=77, body=body, login="ann", updated_at=when
            ),
        )
    process_deliveries()
    assert Comment.objects.get(github_comment_id=77).body == "v3"
    post_delivery(
        client,
        "issue_comment",
        comment_delivery("deleted", number=9, comment_id=77, body="v3", login="ann"),
    )
    process_deliveries()
    assert not Comment.objects.filter(github_comment_id=77).exists()
    proposal = Proposal.objects.get(github_issue_number=9)
    noted = [
        (e.verb, e.door, e.message)
        for e in proposal.events.filter(verb__in=["commented", "comment_edited", "comment_deleted"])
    ]
    assert noted == [
        ("commented", "github", "v1"),
        ("comment_edited", "github", "v3"),
        ("comment_deleted", "github", ""),
    ]


def test_comments_on_pull_requests_are_not_proposal_comments(
    github_on: Any, client: Any, recipe: Any
) -> None:
    post_delivery(
        client,
        "issues",
        issues_delivery("opened", issue_payload(number=10, title="R", body=EXPERIMENT_BODY)),
    )
    post_delivery(
        client,
        "issue_comment",
        comment_delivery(
            "created", number=10, comment_id=88, body="/approve", login="maxine", pull_request=True
        ),
    )
    assert process_deliveries()[-1] == "ignored"
    assert not Comment.objects.filter(github_comment_id=88).exists()
    assert "pull request" in WebhookDelivery.objects.get(event="issue_comment").detail


def test_closing_the_issue_is_not_an_outcome(github_on: Any, client: Any, recipe: Any) -> None:
    issue = issue_payload(number=11, title="R", body=EXPERIMENT_BODY)
    post_delivery(client, "issues", issues_delivery("opened", issue))
    post_delivery(client, "issues", issues_delivery("closed", dict(issue, state="closed")))
    assert process_deliveries() == ["applied", "applied"]
    proposal = Proposal.objects.get(github_issue_number=11)
    assert proposal.outcome == ""
    assert proposal.state == "draft"
    assert proposal.events.filter(verb="issue_closed").exists()


def test_deliveries_from_another_repository_are_ignored(
    github_on: Any, client: Any, recipe: Any
) -> None:
    issue = issue_payload(number=12, title="R", body=EXPERIMENT_BODY, repository="evil/fork")
    post_delivery(client, "issues", issues_delivery("opened", issue))
    assert process_deliveries() == ["ignored"]
    assert not Proposal.objects.exists()


def test_the_sites_own_new_issue_coming_back_is_not_a_second_proposal(
    github_on: Any, client: Any, settings: Any, contributor: Any, recipe: Any
) -> None:
    from proposals import services
    from tests.factories import ProposalFactory
    from tests.proposals.github_support import drain

    settings.GITHUB_BOT_LOGIN = ""  # even without knowing the bot's login
    proposal = ProposalFactory.create(author=contributor, recipe=recipe)
    services.proposal_transition(proposal_id=proposal.pk, action="submit", actor=contributor)
    drain()
    created = github_on.issue(1)
    echo = issue_payload(number=2, title=created["title"], body=created["body"], login="bot")
    post_delivery(client, "issues", issues_delivery("opened", echo))
    assert process_deliveries() == ["ignored"]
    assert Proposal.objects.count() == 1


def test_withdrawing_a_draft_opens_no_issue(github_on: Any, contributor: Any, recipe: Any) -> None:
    from proposals import services
    from proposals.models import GitHubOutbox
    from tests.factories import ProposalFactory

    proposal = ProposalFactory.create(author=contributor, recipe=recipe)
    services.proposal_transition(proposal_id=proposal.pk, action="withdraw", actor=contributor)
    assert not GitHubOutbox.objects.exists()


ISSUE_PAYLOADS = [p for p in PAYLOADS if p.parent.name in {"issues", "issue_comment"}]


@pytest.mark.parametrize("path", ISSUE_PAYLOADS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_real_payloads_about_a_linked_issue_have_their_effect(
    webhook_settings: Any, client: Any, contributor: Any, recipe: Any, path: Path
) -> None:
    from tests.factories import ProposalFactory

    payload = json.loads(path.read_bytes())
    issue = payload["issue"]
    proposal = ProposalFactory.create(
        author=contributor, recipe=recipe, github_issue_number=issue["number"]
    )
    post_delivery(client, _event(path), payload)
    outcome = process_deliveries()[0]
    delivery = WebhookDelivery.objects.get()
    action = payload["action"]
    if issue.get("pull_request"):
        assert outcome == "ignored"
    elif _event(path) == "issue_comment" and action in {"created", "edited"}:
        assert outcome == "applied"
        stored = Comment.objects.get(github_comment_id=payload["comment"]["id"])
        assert stored.proposal == proposal
        assert stored.body == payload["comment"]["body"]
        assert stored.author_label == f"@{payload['comment']['user']['login']} on GitHub"
    elif action in {"closed", "reopened"}:
        assert outcome == "applied"
        assert proposal.events.filter(verb=f"issue_{action}").exists()
        proposal.refresh_from_db()
        assert proposal.outcome == ""
    elif action in {"deleted", "transferred"} and _event(path) == "issues":
        assert outcome == "applied"
        proposal.refresh_from_db()
        assert proposal.github_issue_number is None
    else:
        assert outcome == "ignored", delivery.detail
    assert delivery.detail


OPENED = [p for p in PAYLOADS if p.parent.name == "issues" and p.name.startswith("opened")]


@pytest.mark.parametrize("path", OPENED, ids=lambda p: p.name)
def test_real_opened_payloads_labelled_experiment_become_proposals(
    webhook_settings: Any, client: Any, recipe: Any, path: Path
) -> None:
    payload = json.loads(path.read_bytes())
    payload["issue"]["labels"] = [*payload["issue"]["labels"], {"name": "experiment"}]
    post_delivery(client, "issues", payload)
    assert process_deliveries() == ["applied"]
    proposal = Proposal.objects.get(github_issue_number=payload["issue"]["number"])
    assert proposal.title == payload["issue"]["title"]
    assert proposal.state == "draft"
    assert proposal.author.username == payload["issue"]["user"]["login"]


@pytest.mark.skipif(
    connection.vendor != "postgresql", reason="the PostgreSQL statement (test_db.py: fallback)"
)
def test_acknowledging_a_delivery_is_one_statement(
    webhook_settings: Any, client: Any, django_assert_num_queries: Any
) -> None:
    with django_assert_num_queries(1) as captured:  # INSERT ... ON CONFLICT DO NOTHING
        assert post_delivery(client, "ping", {"zen": "hi"}).status_code == 202
    assert "ON CONFLICT" in captured.captured_queries[0]["sql"]
    response = post_delivery(client, "ping", {"zen": "hi"}, delivery_id="twice")
    with django_assert_num_queries(1):  # a repeat is the same statement, inserting nothing
        again = post_delivery(client, "ping", {"zen": "hi"}, delivery_id="twice")
    assert (response.json()["duplicate"], again.json()["duplicate"]) == (False, True)


def test_the_body_is_stored_as_signed_and_its_signature_still_checks(
    webhook_settings: Any, client: Any
) -> None:
    payload = json.loads((WEBHOOKS / "issues" / "opened.json").read_bytes())
    payload["issue"]["title"] = "Caf\u00e9 \u2615 routing"
    body = json.dumps(payload, indent=1, ensure_ascii=False).encode()  # raw UTF-8, not escapes
    assert post_delivery(client, "issues", body, delivery_id="as-signed").status_code == 202
    stored = WebhookDelivery.objects.get(delivery_id="as-signed")
    assert stored.body.encode() == body  # byte for byte: indentation, key order, escapes
    assert sign(stored.body.encode()) == sign(body)
    assert json.loads(stored.body) == payload
    assert (stored.event, stored.action, stored.outcome) == ("issues", "opened", "pending")


def test_a_nul_character_in_a_payload_is_stored_as_a_replacement_character(
    webhook_settings: Any, client: Any
) -> None:
    body = b'{"action": "created", "zen": "a\\u0000b"}'
    assert post_delivery(client, "ping", body, delivery_id="nul").status_code == 202
    assert json.loads(WebhookDelivery.objects.get(delivery_id="nul").body)["zen"] == "a\ufffdb"


@pytest.mark.parametrize(
    "body",
    [b'{"zen": "\\ud800"}', b'{"zen": "\xff"}', b"[1, 2]", b"{nope"],
    ids=["lone-surrogate", "not-utf8", "not-an-object", "not-json"],
)
def test_a_body_that_cannot_be_stored_as_json_gets_400(
    webhook_settings: Any, client: Any, body: bytes
) -> None:
    response = post_delivery(client, "ping", body)
    assert response.status_code == 400
    assert "detail" in response.json()
    assert not WebhookDelivery.objects.exists()


def test_the_drain_works_in_batches_oldest_first_and_a_failure_stays_its_own(
    webhook_settings: Any, client: Any, monkeypatch: Any
) -> None:
    from proposals.github import deliveries

    recent = timezone.now().strftime("%Y-%m-%dT%H:%M:%SZ")  # new issues, not old ones mirrored
    for n in range(7):
        issue = issue_payload(number=900 + n, title=f"t{n}", body="b", updated_at=recent)
        post_delivery(client, "issues", issues_delivery("edited", issue), delivery_id=f"b-{n}")
        post_delivery(client, "ping", {"zen": f"z{n}"}, delivery_id=f"p-{n}")  # no savepoint
    seen: list[int] = []
    real_dispatch = deliveries._dispatch

    def dispatch(event: str, action: str, payload: dict[str, Any]) -> Any:
        seen.append(payload["issue"]["number"])
        if payload["issue"]["number"] == 903:
            User.objects.create(username="half-done")  # a write, rolled back with its delivery
            raise RuntimeError("boom")
        return real_dispatch(event, action, payload)

    monkeypatch.setattr(deliveries, "_dispatch", dispatch)
    assert deliveries.deliveries_drain(batch=3) == (14, False)
    assert seen == [900 + n for n in range(7)]
    outcomes = dict(WebhookDelivery.objects.values_list("delivery_id", "outcome"))
    assert outcomes.pop("b-3") == "failed"
    assert {outcomes.pop(f"p-{n}") for n in range(7)} == {"applied"}
    # Experiment issues before any recipe exists: kept for later (PendingIssue), not refused.
    assert set(outcomes.values()) == {"applied"}
    assert WebhookDelivery.objects.get(delivery_id="b-3").detail == "RuntimeError: boom"
    assert not User.objects.filter(username="half-done").exists()
    assert sorted(PendingIssue.objects.values_list("number", flat=True)) == [
        900 + n for n in range(7) if n != 3
    ]
    assert deliveries.deliveries_drain() == (0, False)  # processed once


def _drain_queries(count: int, client: Any) -> list[str]:
    """The statements of a drain of ``count`` deliveries about issues linked to no proposal."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from proposals.github import deliveries

    for n in range(count):
        number = 5000 + n
        if n % 2:
            body = comment_delivery("created", number=number, comment_id=n, body="hi", login="a")
            post_delivery(client, "issue_comment", body, delivery_id=f"c-{n}")
        else:
            issue = issue_payload(number=number, title="t", body="b", labels=["bug"])
            post_delivery(client, "issues", issues_delivery("opened", issue), delivery_id=f"i-{n}")
    with CaptureQueriesContext(connection) as captured:
        assert deliveries.deliveries_drain(batch=50) == (count, False)
    assert set(WebhookDelivery.objects.values_list("outcome", flat=True)) == {"ignored"}
    return [query["sql"] for query in captured.captured_queries]


def test_unlinked_deliveries_cost_one_lookup_a_chunk_not_queries_each(
    webhook_settings: Any, client: Any
) -> None:
    from proposals.github.deliveries import DRAIN_CHUNK

    few = _drain_queries(DRAIN_CHUNK, client)
    WebhookDelivery.objects.all().delete()
    many = _drain_queries(4 * DRAIN_CHUNK, client)
    lookups = [sql for sql in many if "github_issue_number" in sql]
    assert len(lookups) == 4  # one per chunk of DRAIN_CHUNK
    assert len(many) == len(few) + 3  # 30 more deliveries: only their 3 chunks' lookups more


def test_a_comment_on_a_linked_issue_among_unlinked_ones_is_stored(
    webhook_settings: Any, client: Any, recipe: Any
) -> None:
    _opened_experiment_issue(client, number=77)
    for n in range(12):  # the linked issue's comment lands in the middle of the second chunk
        number = 77 if n == 5 else 6000 + n
        body = comment_delivery("created", number=number, comment_id=700 + n, body="c", login="b")
        post_delivery(client, "issue_comment", body, delivery_id=f"m-{n}")
    assert process_deliveries() == ["ignored"] * 5 + ["applied"] + ["ignored"] * 6
    assert list(
        Comment.objects.filter(github_comment_id__gte=700).values_list("body", flat=True)
    ) == ["c"]


def test_the_reconciler_drains_deliveries_a_lost_nudge_left_behind(
    webhook_settings: Any, client: Any, monkeypatch: Any
) -> None:
    from datetime import timedelta

    from django.utils import timezone

    from proposals import tasks
    from proposals.github import deliveries

    sent: list[int] = []
    monkeypatch.setattr(
        deliveries.github_deliveries_drain, "apply_async", lambda **kw: sent.append(1)
    )
    post_delivery(client, "ping", {"zen": "fresh"})
    tasks.github_outbox_reconcile()
    assert sent == []  # a minute's grace: its own nudge is still on the way
    WebhookDelivery.objects.update(received_at=timezone.now() - timedelta(minutes=2))
    tasks.github_outbox_reconcile()
    assert sent == [1]


READ_FIELDS = [
    ("issue",),
    ("issue", "number"),
    ("issue", "title"),
    ("issue", "body"),
    ("issue", "user"),
    ("issue", "user", "login"),
    ("issue", "labels"),
    ("issue", "updated_at"),
    ("comment",),
    ("comment", "id"),
    ("comment", "body"),
    ("comment", "user"),
    ("repository",),
    ("sender",),
    ("sender", "login"),
]
WRONG_VALUES: list[Any] = [None, 7, "x", [], {}, [1, 2]]


@pytest.mark.parametrize(
    "name",
    ["issues/opened.json", "issues/edited.with-organization.json", "issue_comment/created.json"],
)
def test_a_field_of_the_wrong_type_is_ignored_with_its_name_never_a_crash(
    webhook_settings: Any, client: Any, recipe: Any, name: str
) -> None:
    path = next(p for p in PAYLOADS if f"{p.parent.name}/{p.name}" == name)
    original = json.loads(path.read_bytes())
    if "labels" in original.get("issue", {}):
        original["issue"]["labels"].append({"name": "experiment"})  # so it would be taken in
    sent = 0
    for field_path in READ_FIELDS:
        if field_path[0] not in original:
            continue
        for wrong in WRONG_VALUES:
            payload = json.loads(json.dumps(original))
            target = payload
            for key in field_path[:-1]:
                target = target[key]
            target[field_path[-1]] = wrong
            assert post_delivery(client, _event(path), payload).status_code == 202
            sent += 1
    outcomes = process_deliveries()
    assert len(outcomes) == sent > 20
    failed = WebhookDelivery.objects.filter(outcome="failed").values_list("detail", flat=True)
    assert list(failed) == []
    details = set(WebhookDelivery.objects.values_list("detail", flat=True))
    assert any(d.startswith("malformed") and "issue.number" in d for d in details)


def test_a_payload_with_a_number_for_a_login_names_it(webhook_settings: Any, client: Any) -> None:
    payload = issue_payload(number=3, title="t", body="## Description\nd")
    payload["user"]["login"] = 12345
    post_delivery(client, "issues", issues_delivery("opened", payload, sender="octocat"))
    assert process_deliveries() == ["ignored"]
    detail = WebhookDelivery.objects.get().detail
    assert detail.startswith("malformed issues payload: issue.user.login:")


@pytest.mark.skipif(connection.vendor != "postgresql", reason="column compression is PostgreSQL's")
def test_bodies_are_compressed_with_lz4_where_postgresql_has_it() -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT 'lz4' = ANY(enumvals) FROM pg_settings WHERE name = 'default_toast_compression'"
        )
        has_lz4 = cursor.fetchone()[0]
        cursor.execute(
            "SELECT attcompression FROM pg_attribute WHERE attrelid = "
            "'proposals_webhookdelivery'::regclass AND attname = 'body'"
        )
        compression = cursor.fetchone()[0]
    assert compression == ("l" if has_lz4 else "")
