"""The outbox against the fake GitHub: issues, status comment, labels, outages, lost answers."""

from __future__ import annotations

import threading
import time
from datetime import datetime
from typing import Any

import pytest
from django.utils import timezone

from marin_site.doors import Door
from proposals import services
from proposals.github.body import END, START
from proposals.github.fake import FakeGitHub
from proposals.github.outbox import drain as outbox_drain_module
from proposals.github.outbox.drain import outbox_drain
from proposals.models import Comment, GitHubOutbox, OutboxState, Proposal, State
from tests.concurrency import started
from tests.factories import ProposalFactory, UserFactory
from tests.proposals.github_support import (
    BOT,
    comment_delivery,
    drain,
    fake_github,
    github_on,
    post_delivery,
    process_deliveries,
)

pytestmark = pytest.mark.django_db
__all__ = ["fake_github", "github_on"]


def _number(proposal: Proposal) -> int:
    proposal.refresh_from_db()
    assert proposal.github_issue_number is not None
    return proposal.github_issue_number


def _submitted(author: Any, recipe: Any, **kwargs: Any) -> Proposal:
    proposal = ProposalFactory.create(author=author, recipe=recipe, **kwargs)
    return services.proposal_transition(proposal_id=proposal.pk, action="submit", actor=author)


def test_submitting_on_the_site_opens_an_issue_with_labels_block_and_status(
    github_on: FakeGitHub, contributor: Any, recipe: Any
) -> None:
    proposal = _submitted(contributor, recipe, title="Capacity factor")
    drain()
    number = _number(proposal)
    issue = github_on.issue(number)
    assert issue["title"] == "Capacity factor"
    assert issue["body"].startswith(START)
    assert issue["body"].endswith(END)
    assert "http://site.test/proposals/" in issue["body"]
    assert "### Hypothesis" in issue["body"]
    assert github_on.label_names(number) == ["experiment", "status:submitted"]
    comments = github_on.issue_comments(_number(proposal))
    assert len(comments) == 1
    assert comments[0]["id"] == proposal.github_status_comment_id
    assert "**Status** · state: **Submitted**" in comments[0]["body"]


def test_a_draft_gets_no_issue(github_on: FakeGitHub, contributor: Any, recipe: Any) -> None:
    ProposalFactory.create(author=contributor, recipe=recipe)
    services.proposal_create(
        author=contributor,
        data={"title": "t", "summary": "s", "recipe": recipe},
    )
    assert not GitHubOutbox.objects.exists()
    assert github_on.writes() == []


def test_sync_off_without_a_token_writes_nothing_and_the_page_says_so(
    settings: Any, client: Any, contributor: Any, recipe: Any
) -> None:
    settings.GITHUB_TOKEN = ""
    proposal = _submitted(contributor, recipe)
    services.comment_create(proposal_id=proposal.pk, author=contributor, body="hello")
    assert not GitHubOutbox.objects.exists()
    page = client.get(proposal.get_absolute_url())
    assert page.status_code == 200
    assert "GitHub sync is off" in page.content.decode()


def test_full_conversation_site_submit_then_approve_on_github(
    github_on: FakeGitHub, client: Any, contributor: Any, recipe: Any
) -> None:
    proposal = _submitted(contributor, recipe)
    drain()
    number = _number(proposal)
    status_id = proposal.github_status_comment_id
    UserFactory.create(username="someone")  # a site user named like nobody on GitHub

    github_comment = github_on.add_comment(number=number, body="/approve", login="maxine")
    response = post_delivery(
        client,
        "issue_comment",
        comment_delivery(
            "created",
            number=number,
            comment_id=github_comment["id"],
            body="/approve",
            login="maxine",
        ),
    )
    assert response.status_code == 202
    assert process_deliveries() == ["applied"]
    proposal.refresh_from_db()
    assert proposal.state == State.APPROVED
    assert proposal.events.filter(verb="approved", door=Door.GITHUB).exists()
    drain()

    comments = github_on.issue_comments(number)
    status = next(c for c in comments if c["id"] == status_id)
    assert "**Status** · state: **Approved**" in status["body"]
    assert [c for c in comments if "marin-site:status" in c["body"]] == [status]
    answers = [c for c in comments if c["body"].startswith("@maxine `/approve`: done")]
    assert len(answers) == 1
    assert github_on.label_names(number) == ["experiment", "status:approved"]
    assert "state: **Approved**" in github_on.issue(number)["body"]
    # The maintainer's comment is on the site too, by its GitHub author.
    assert Comment.objects.get(github_comment_id=github_comment["id"]).author_label == (
        "@maxine on GitHub"
    )


def test_site_comment_appears_on_the_issue_with_its_author(
    github_on: FakeGitHub, contributor: Any, reviewer: Any, recipe: Any
) -> None:
    proposal = _submitted(contributor, recipe)
    comment = services.comment_create(
        proposal_id=proposal.pk, author=reviewer, body="Try top-2 routing?"
    )
    drain()
    proposal.refresh_from_db()
    posted = [c for c in github_on.issue_comments(_number(proposal)) if "top-2" in c["body"]]
    assert len(posted) == 1
    assert "rita commented on [marin-site]" in posted[0]["body"]
    comment.refresh_from_db()
    assert comment.github_comment_id == posted[0]["id"]


def test_body_edits_never_touch_text_outside_the_markers(
    github_on: FakeGitHub, contributor: Any, maintainer: Any, recipe: Any
) -> None:
    proposal = _submitted(contributor, recipe)
    drain()
    number = _number(proposal)
    issue = github_on.state.issues[number]
    before, after = "Human preface with `code`\r\n\r\n", "\r\n\r\nHuman footer ✓  "
    issue["body"] = before + issue["body"] + after
    services.proposal_transition(
        proposal_id=proposal.pk, action="reject", actor=maintainer, reason="Not now."
    )
    drain()
    body = github_on.issue(number)["body"]
    assert body.startswith(before)
    assert body.endswith(after)
    assert "state: **Rejected**" in body


def test_outage_fifty_writes_for_five_issues_land_once_and_in_order(
    github_on: FakeGitHub, contributor: Any, recipe: Any
) -> None:
    proposals = [_submitted(contributor, recipe, title=f"p{i}") for i in range(5)]
    drain()
    github_on.fail("5xx")  # every call fails until recover()
    for n in range(10):
        for proposal in proposals:
            services.comment_create(proposal_id=proposal.pk, author=contributor, body=f"note {n}")
    for proposal in proposals:
        outbox_drain(proposal_id=proposal.pk)
    assert GitHubOutbox.objects.filter(state=OutboxState.PENDING).count() == 50
    assert GitHubOutbox.objects.filter(state=OutboxState.PENDING, attempts__gt=0).count() == 5
    github_on.fail("lost", times=3)  # the first writes after recovery lose their answers
    github_on.state.rules.pop(0)  # recover from the 5xx, keep the lost answers
    drain()
    assert not GitHubOutbox.objects.exclude(state=OutboxState.DONE).exists()
    for proposal in proposals:
        proposal.refresh_from_db()
        notes = [
            c["body"].split("\n")[0]
            for c in github_on.issue_comments(_number(proposal))
            if c["body"].startswith("note ")
        ]
        assert notes == [f"note {n}" for n in range(10)]


@pytest.mark.parametrize("kind", ["secondary", "429", "primary"])
def test_rate_limits_reschedule_after_what_github_asked(
    github_on: FakeGitHub, contributor: Any, recipe: Any, kind: str
) -> None:
    proposal = _submitted(contributor, recipe)
    drain()
    github_on.fail(kind, times=1, retry_after=120)
    services.comment_create(proposal_id=proposal.pk, author=contributor, body="hello")
    come_back = outbox_drain(proposal_id=proposal.pk)
    row = GitHubOutbox.objects.get(operation="comment_create")
    assert row.state == OutboxState.PENDING
    assert row.attempts == 1
    assert come_back == row.next_attempt_at
    assert row.next_attempt_at is not None
    waited = (row.next_attempt_at - row.created_at).total_seconds()
    assert 110 <= waited <= 125  # the task reschedules; it never sleeps this long


def test_a_timeout_is_retried_and_the_comment_lands_once(
    github_on: FakeGitHub, contributor: Any, recipe: Any
) -> None:
    proposal = _submitted(contributor, recipe)
    drain()
    github_on.fail("timeout", times=1, methods={"POST"})
    services.comment_create(proposal_id=proposal.pk, author=contributor, body="slow")
    drain()
    proposal.refresh_from_db()
    slow = [c for c in github_on.issue_comments(_number(proposal)) if "slow" in c["body"]]
    assert len(slow) == 1
    assert GitHubOutbox.objects.get(operation="comment_create").attempts == 2


def test_a_create_whose_answer_was_lost_is_found_not_repeated(
    github_on: FakeGitHub, contributor: Any, recipe: Any
) -> None:
    github_on.fail("lost", times=1, methods={"POST"})
    proposal = _submitted(contributor, recipe)
    drain()
    assert len(github_on.state.issues) == 1
    proposal.refresh_from_db()
    assert proposal.github_issue_number == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("backoff_seconds", [60, 0.01], ids=["rate-limited", "due-again"])
def test_two_drains_of_one_proposal_never_send_a_write_twice(
    github_on: FakeGitHub,
    contributor: Any,
    recipe: Any,
    settings: Any,
    monkeypatch: pytest.MonkeyPatch,
    backoff_seconds: float,
) -> None:
    """Drain B reads the next row; before B claims it, drain A claims and sends it, GitHub
    writes the comment but the answer is lost (as with a 502 after the write), and A
    reschedules it. B must then neither send it while it waits for its retry time (a rate
    limit) nor, once it is due, send it as if it had never been tried: it looks for the
    comment's marker first, as any retry does. Every submit queues several drains of one
    proposal, so two at once is the usual case."""
    settings.GITHUB_OUTBOX_BACKOFF_SECONDS = backoff_seconds
    settings.GITHUB_OUTBOX_BACKOFF_MAX_SECONDS = backoff_seconds
    proposal = _submitted(contributor, recipe)
    drain()
    number = _number(proposal)
    comment = services.comment_create(proposal_id=proposal.pk, author=contributor, body="hello")
    github_on.fail("lost", times=1, methods={"POST"})

    b_has_read, a_is_done = threading.Event(), threading.Event()
    next_row = outbox_drain_module._next_row

    def next_row_then_wait(proposal_id: int) -> Any:
        row = next_row(proposal_id)
        if threading.current_thread().name == "drain B" and not b_has_read.is_set():
            b_has_read.set()  # B holds its copy of the row; A goes now
            assert a_is_done.wait(30)
        return row

    monkeypatch.setattr(outbox_drain_module, "_next_row", next_row_then_wait)
    drain_b = started(lambda: outbox_drain(proposal_id=proposal.pk), "drain B")
    assert b_has_read.wait(30)
    drain_a = started(lambda: outbox_drain(proposal_id=proposal.pk), "drain A")
    come_back_a: datetime = drain_a.outcome()
    if backoff_seconds < 1:
        time.sleep(0.1)  # the row is due again before B carries on
    a_is_done.set()
    come_back_b = drain_b.outcome()

    hello = [c for c in github_on.issue_comments(number) if "hello" in c["body"]]
    assert len(hello) == 1  # A's write, whose answer was lost; B did not write it again
    row = GitHubOutbox.objects.get(idempotency_key=f"comment:site:{comment.pk}")
    if backoff_seconds >= 1:
        assert (row.state, row.attempts) == (OutboxState.PENDING, 1)
        assert come_back_b == come_back_a == row.next_attempt_at
        assert row.next_attempt_at is not None
        assert row.next_attempt_at > timezone.now()
        GitHubOutbox.objects.filter(pk=row.pk).update(next_attempt_at=None)  # time passes
        drain()
        assert len([c for c in github_on.issue_comments(number) if "hello" in c["body"]]) == 1
    else:
        assert (row.state, row.attempts) == (OutboxState.DONE, 2)
        assert row.result == {"comment_id": hello[0]["id"]}
    assert Comment.objects.get(pk=comment.pk).github_comment_id == hello[0]["id"]


def test_a_permanent_failure_stays_visible_and_can_be_retried_by_a_maintainer(
    github_on: FakeGitHub, client: Any, contributor: Any, maintainer: Any, recipe: Any
) -> None:
    proposal = _submitted(contributor, recipe)
    drain()
    proposal.refresh_from_db()
    del github_on.state.issues[_number(proposal)]  # gone: 404 is not retried
    services.comment_create(proposal_id=proposal.pk, author=contributor, body="lost?")
    drain()
    row = GitHubOutbox.objects.get(operation="comment_create")
    assert row.state == OutboxState.FAILED
    assert "404" in row.last_error

    client.force_login(contributor)
    assert client.get("/github/outbox/").status_code == 403
    client.force_login(maintainer)
    page = client.get("/github/outbox/")
    assert page.status_code == 200
    assert "404" in page.content.decode()
    assert client.post(f"/github/outbox/{row.pk}/retry/").status_code == 302
    assert client.post(f"/github/outbox/{row.pk + 1000}/retry/").status_code == 404
    row.refresh_from_db()
    assert (row.state, row.attempts) == (OutboxState.PENDING, 0)


def test_the_same_cause_enqueued_twice_is_one_row(
    github_on: FakeGitHub, contributor: Any, recipe: Any
) -> None:
    from proposals.github.outbox.enqueue import outbox_comment_enqueue

    proposal = _submitted(contributor, recipe)
    first = outbox_comment_enqueue(proposal=proposal, key="result:1", body="done")
    second = outbox_comment_enqueue(proposal=proposal, key="result:1", body="done")
    assert first is not None
    assert second is not None
    assert first.pk == second.pk


def test_own_writes_coming_back_do_not_loop(
    github_on: FakeGitHub, client: Any, contributor: Any, recipe: Any
) -> None:
    proposal = _submitted(contributor, recipe)
    drain()
    proposal.refresh_from_db()
    status = github_on.issue_comments(_number(proposal))[0]
    writes = len(github_on.writes())
    post_delivery(
        client,
        "issue_comment",
        comment_delivery(
            "created",
            number=_number(proposal),
            comment_id=status["id"],
            body=status["body"],
            login=BOT,
        ),
    )
    assert process_deliveries() == ["ignored"]
    drain()
    assert len(github_on.writes()) == writes
    assert not Comment.objects.filter(github_comment_id=status["id"]).exists()


def test_a_finished_plan_posts_its_results_and_updates_the_status(
    github_on: FakeGitHub, contributor: Any, maintainer: Any, recipe: Any
) -> None:
    from runs.signals import plan_finished, run_state_changed

    proposal = _submitted(contributor, recipe)
    proposal = services.proposal_transition(
        proposal_id=proposal.pk, action="approve", actor=maintainer
    )
    drain()
    assert proposal.plan_id is not None
    run_state_changed.send(
        sender=None, run_id=1, plan_id=proposal.plan_id, from_state="queued", to_state="running"
    )
    summary = {"markdown": "| run | loss |\n|---|---|\n| 7 | 3.1 |"}
    plan_finished.send(sender=None, plan_id=proposal.plan_id, summary=summary)
    plan_finished.send(sender=None, plan_id=proposal.plan_id, summary=summary)  # announced twice
    drain()
    results = [
        c["body"] for c in github_on.issue_comments(_number(proposal)) if "Results:" in c["body"]
    ]
    assert len(results) == 1
    assert "| 7 | 3.1 |" in results[0]
    assert f"http://site.test/proposals/{proposal.pk}/" in results[0]

    rerun = {"markdown": "| run | loss |\n|---|---|\n| 9 | 3.0 |"}  # finished again after /rerun
    plan_finished.send(sender=None, plan_id=proposal.plan_id, summary=rerun)
    drain()
    results = [
        c["body"] for c in github_on.issue_comments(_number(proposal)) if "Results:" in c["body"]
    ]
    assert len(results) == 2
    assert "| 9 | 3.0 |" in results[1]


def test_the_proposal_page_links_its_issue(
    github_on: FakeGitHub, client: Any, contributor: Any, recipe: Any
) -> None:
    proposal = _submitted(contributor, recipe)
    page = client.get(proposal.get_absolute_url()).content.decode()
    assert "The GitHub issue is being created." in page
    drain()
    number = _number(proposal)
    page = client.get(proposal.get_absolute_url()).content.decode()
    assert f'href="{github_on.url}/marin-community/marin/issues/{number}"' in page


def test_the_outbox_page_reads_in_a_fixed_number_of_queries(
    github_on: FakeGitHub,
    client: Any,
    contributor: Any,
    maintainer: Any,
    recipe: Any,
    django_assert_max_num_queries: Any,
) -> None:
    proposals = [_submitted(contributor, recipe) for _ in range(3)]
    drain()
    github_on.state.issues.clear()  # every later write gets a 404
    for proposal in proposals:
        services.comment_create(proposal_id=proposal.pk, author=contributor, body="x")
    drain()
    assert GitHubOutbox.objects.filter(state=OutboxState.FAILED).count() == 3
    client.force_login(maintainer)
    with django_assert_max_num_queries(8):
        page = client.get("/github/outbox/")
    assert page.content.decode().count("Retry</button>") == 3


def test_the_reconciler_sends_due_writes_whose_nudge_was_lost(
    github_on: FakeGitHub, contributor: Any, recipe: Any
) -> None:
    from marin_site.celery import app as celery_app
    from proposals import tasks
    from proposals.github.outbox.drain import outbox_due_proposals

    proposal = _submitted(contributor, recipe)  # on_commit never ran: the nudge is "lost"
    assert outbox_due_proposals() == [proposal.pk]
    eager = celery_app.conf.task_always_eager
    celery_app.conf.task_always_eager = True
    try:
        assert tasks.github_outbox_reconcile.apply().get() == 1
    finally:
        celery_app.conf.task_always_eager = eager
    assert not GitHubOutbox.objects.exclude(state=OutboxState.DONE).exists()
    assert _number(proposal) == 1
    assert outbox_due_proposals() == []


def test_an_exhausted_rate_limit_holds_later_writes_until_the_reset(
    github_on: FakeGitHub, contributor: Any, recipe: Any
) -> None:
    proposal = _submitted(contributor, recipe)
    drain()
    github_on.state.rate_remaining = 0  # answers still succeed, but say nothing is left
    services.comment_create(proposal_id=proposal.pk, author=contributor, body="first")
    services.comment_create(proposal_id=proposal.pk, author=contributor, body="second")
    come_back = outbox_drain(proposal_id=proposal.pk)
    rows = list(GitHubOutbox.objects.filter(operation="comment_create").order_by("id"))
    assert [row.state for row in rows] == [OutboxState.DONE, OutboxState.PENDING]
    assert come_back is not None
    assert come_back == rows[1].next_attempt_at
    assert (come_back - rows[1].created_at).total_seconds() > 3000  # the fake resets in 1 h
    assert rows[1].attempts == 0


def test_a_recorded_outcome_is_posted_once_per_verdict(
    github_on: FakeGitHub, contributor: Any, maintainer: Any, recipe: Any
) -> None:
    proposal = _submitted(contributor, recipe)
    services.proposal_transition(proposal_id=proposal.pk, action="approve", actor=maintainer)
    drain()

    def record(outcome: str, conclusion: str) -> None:
        services.proposal_record_outcome(
            proposal_id=proposal.pk,
            actor=maintainer,
            outcome=outcome,
            conclusion=conclusion,
            confidence="exploratory",
            without_results_reason="The comment's rules, tested before any run ends.",
        )
        drain()

    def verdicts() -> list[str]:
        return [
            c["body"]
            for c in github_on.issue_comments(_number(proposal))
            if c["body"].startswith("**Outcome:")
        ]

    record("did_not_work", "Eval loss **rose** by 0.02 at both scales.")
    record("did_not_work", "Eval loss **rose** by 0.02 at both scales.")  # the same again
    assert len(verdicts()) == 1
    assert verdicts()[0].startswith("**Outcome: Did not work** (Exploratory)")
    assert "Eval loss **rose** by 0.02" in verdicts()[0]
    assert f"http://site.test/proposals/{proposal.pk}/" in verdicts()[0]

    record("inconclusive", "A third seed disagreed.")
    assert len(verdicts()) == 2
    assert verdicts()[1].startswith("**Outcome: Inconclusive**")
