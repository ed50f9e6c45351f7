"""Marin's old experiment issues brought in as imported proposals (``manage.py github_backfill``).

Three phases, each checkpointed in ``GitHubBackfill`` so an interrupted run continues where
it stopped:

1. ``issues``: the issues of each experiment label in turn (GitHub's ``labels=`` means all
   of the labels given, so one label at a time), every state, oldest first, 100 a page.
   Pull requests are skipped. Each issue becomes (or updates) a proposal in the state
   ``imported``, in its own transaction: fields read from the body as for webhooks, the
   author's account by GitHub id, labels, dates, the parent issue.
2. ``comments``: the repository's whole comment list, 100 a page (``since`` the last
   finished run): each comment on a linked issue is mirrored, edits update it.
3. ``reconcile``: an imported issue whose comment count on GitHub differs from its mirror
   lists its own comments once, so deleted comments go.

Nothing is ever sent to GitHub but GET requests (``proposals/github/rest.py``); an imported
proposal queues no outbox row (``outbox.enqueue.quiet``) until a maintainer adopts it.
What cannot be imported (a body that does not parse, a deleted author, a comment over the
size cap, an issue transferred away) is reported with its place and skipped.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from allauth.socialaccount.models import SocialAccount
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Count, Q
from django.utils import timezone

from marin_site.doors import Door
from marin_site.events import Verb
from marin_site.invalidation import rows_changed
from proposals.github.accounts import github_account, github_login, github_roles_sync
from proposals.github.body import EXPERIMENT_LABELS, issue_fields
from proposals.github.issues import (
    LABEL_OK,
    _issue_recipe,
    _safe_data,
    _when,
    applied,
    ignored,
    issue_labels,
    model_data,
)
from proposals.github.outbox.render import is_own_text
from proposals.github.rest import GitHubUnavailable, RestReader
from proposals.models import (
    MAX_MARKDOWN,
    Comment,
    Event,
    GitHubBackfill,
    Label,
    Proposal,
    State,
)
from runs.models import Recipe

DEFAULT_LABELS = ("experiment", "experiments", "community-experiment-submission")
PER_PAGE = 100
BODY_MAX = 256 * 1024  # an issue body longer than this is refused, not cut
SINCE_MARGIN = timedelta(minutes=5)  # clocks differ: the next run looks a little further back
ISSUE_NUMBER = re.compile(r"/issues/(\d+)$")
DELETED_LOGINS = frozenset({"ghost"})  # GitHub shows deleted accounts as @ghost
PHASES = ("issues", "comments", "reconcile", "done")
ACTOR_LABEL = "github_backfill"


def imported_event_record(*, proposal: Proposal, issue_number: int, parent: int | None) -> None:
    """The timeline's first row of an imported issue: where it came from, and that nothing
    is written to GitHub until a maintainer adopts it."""
    Event.build(
        proposal=proposal,
        actor=None,
        actor_label=ACTOR_LABEL,
        verb=Verb.IMPORTED,
        door=Door.SYSTEM,
        to_state=State.IMPORTED,
        message=f"Imported from GitHub issue #{issue_number}"
        + (f", a sub-issue of #{parent}" if parent else "")
        + "; nothing is written to GitHub until a maintainer adopts it.",
    ).save(force_insert=True)


class BackfillStopped(Exception):
    """The run stopped before the end (``--limit``, or GitHub kept failing): its
    checkpoint is stored and the next run continues from it."""


@dataclass
class BackfillReport:
    counts: Counter[str] = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)
    finished: bool = False

    def problem(self, place: str, message: str) -> None:
        self.counts["problems"] += 1
        if len(self.problems) < 1000:
            self.problems.append(f"{place}: {message}")

    def summary(self) -> str:
        order = (
            "issues_seen",
            "created",
            "updated",
            "unchanged",
            "pull_requests",
            "skipped",
            "comments_created",
            "comments_updated",
            "comments_unchanged",
            "comments_deleted",
            "comments_skipped",
            "issues_reconciled",
            "requests",
            "problems",
        )
        parts = [f"{key.replace('_', ' ')}: {self.counts.get(key, 0)}" for key in order]
        return ("finished" if self.finished else "stopped (resumable)") + "; " + ", ".join(parts)


@dataclass
class Progress:
    """What the command shows: a bar per phase (tqdm in the command; nothing in tests)."""

    start: Callable[[str, int | None], None] = lambda phase, total: None
    advance: Callable[[int], None] = lambda n: None
    total: Callable[[int], None] = lambda total: None


class Backfill:
    """One run of the backfill of ``repository`` (``owner/name``)."""

    def __init__(
        self,
        *,
        reader: RestReader | None,
        repository: str,
        labels: Iterable[str] = DEFAULT_LABELS,
        since: datetime | None = None,
        dry_run: bool = False,
        limit: int | None = None,
        progress: Progress | None = None,
    ) -> None:
        self.reader = reader
        self.repository = repository
        self.prefix = f"/repos/{repository}"
        self.labels = [label.strip() for label in labels if label.strip()]
        self.since = since
        self.dry_run = dry_run
        self.limit = limit
        self.progress = progress or Progress()
        self.report = BackfillReport()
        self.accounts: dict[tuple[str, int | None], User] = {}
        self.seen: set[int] = set()
        self.recipe: Recipe | None = None
        self.full_listing = False
        self.label_rows: dict[str, Label] = {}

    @property
    def api(self) -> RestReader:
        assert self.reader is not None, "a webhook's mirror reads no list"
        return self.reader

    # The run.

    def run(self) -> BackfillReport:
        self.recipe = _issue_recipe()
        if self.recipe is None:
            raise ValidationError("The site has no active recipe yet: load the recipes first.")
        # Roles by GitHub id are resolved once, here, not in the middle of the paced reads.
        github_roles_sync()
        state = self._checkpoint()
        try:
            if state.phase == "issues":
                # Every issue listed in this process: those missing afterwards are asked about.
                self.full_listing = (state.label_index, state.page) == (0, 1) and not self.since
                self._issues(state)
                self._advance(state, "comments")
            if state.phase == "comments":
                self._comments(state)
                self._advance(state, "reconcile")
            if state.phase == "reconcile":
                if self.full_listing:
                    self._missing()
                self._reconcile()
                self._advance(state, "done")
        except (BackfillStopped, GitHubUnavailable) as exc:
            if isinstance(exc, GitHubUnavailable):
                self.report.problem("GitHub", str(exc))
            self.report.counts["requests"] = self.api.requests_sent
            return self.report
        if not self.dry_run:
            state.finished_at = timezone.now()
            assert state.started_at is not None
            state.since = state.started_at - SINCE_MARGIN
            state.counts = dict(self.report.counts)
            state.save()
        self.report.finished = True
        self.report.counts["requests"] = self.api.requests_sent
        return self.report

    def _checkpoint(self) -> GitHubBackfill:
        """The stored checkpoint: continued when the last run stopped part-way with the same
        labels; else a new run from the start, ``since`` the last finished one."""
        state = GitHubBackfill.objects.filter(repository=self.repository).first()
        if state is None:
            state = GitHubBackfill(repository=self.repository)
        resuming = (
            state.pk is not None
            and state.finished_at is None
            and state.phase != "done"
            and state.labels == self.labels
        )
        if not resuming:
            state.labels = self.labels
            state.phase, state.label_index, state.page = "issues", 0, 1
            state.started_at, state.finished_at = timezone.now(), None
        if not self.dry_run:
            state.save()
        return state

    def _advance(self, state: GitHubBackfill, phase: str) -> None:
        state.phase, state.label_index, state.page = phase, 0, 1
        self._save(state)

    def _save(self, state: GitHubBackfill) -> None:
        if not self.dry_run:
            state.save(update_fields=["phase", "label_index", "page"])

    def _comments_since(self, state: GitHubBackfill) -> datetime | None:
        return self.since or state.since

    # Phase 1: issues.

    def _issues(self, state: GitHubBackfill) -> None:
        while state.label_index < len(self.labels):
            label = self.labels[state.label_index]
            params: dict[str, Any] = {
                "labels": label,
                "state": "all",
                "sort": "created",
                "direction": "asc",
                "per_page": PER_PAGE,
            }
            if self.since:
                params["since"] = _utc_text(self.since)
            self.progress.start(f"issues labelled {label}", None)
            for page in self.api.pages(f"{self.prefix}/issues", params, start=state.page):
                if page.last_number:
                    self.progress.total(page.last_number * PER_PAGE)
                for issue in page.items:
                    self._issue(issue)
                    self.progress.advance(1)
                state.page = page.number + 1
                self._save(state)
                self._check_limit()
            state.label_index, state.page = state.label_index + 1, 1
            self._save(state)

    def _check_limit(self) -> None:
        if self.limit is not None and self.report.counts["issues_seen"] >= self.limit:
            raise BackfillStopped(f"--limit {self.limit} reached")

    def _issue(self, issue: Any) -> None:
        counts = self.report.counts
        number = issue.get("number") if isinstance(issue, dict) else None
        if not isinstance(number, int):
            self.report.problem("an issue without a number", "skipped")
            counts["skipped"] += 1
            return
        if issue.get("pull_request"):
            counts["pull_requests"] += 1
            return
        if number in self.seen:  # listed again under a second experiment label
            return
        self.seen.add(number)
        counts["issues_seen"] += 1
        place = f"issue #{number}"
        problem = _issue_problem(issue)
        if problem:
            self.report.problem(place, problem + "; skipped")
            counts["skipped"] += 1
            return
        if self.dry_run:
            exists = Proposal.objects.filter(github_issue_number=number).exists()
            counts["updated" if exists else "created"] += 1
            return
        try:
            with transaction.atomic():
                outcome = self._issue_apply(issue, place)
        except ValidationError as exc:
            self.report.problem(place, "; ".join(exc.messages) + "; skipped")
            counts["skipped"] += 1
            return
        counts[outcome] += 1

    def _labels(self, names: list[str]) -> list[Label]:
        """The site's labels of these names, created on first sight, kept for the run."""
        for name in set(names) - set(self.label_rows):
            self.label_rows[name] = Label.objects.get_or_create(name=name)[0]
        return [self.label_rows[name] for name in sorted(set(names))]

    def _account(self, user_data: dict[str, Any]) -> User:
        login = github_login(user_data)
        key = (login, user_data.get("id") if isinstance(user_data.get("id"), int) else None)
        account = self.accounts.get(key)
        if account is None:
            if len(self.accounts) > 5000:
                self.accounts.clear()
            account = self.accounts[key] = github_account(login=login, github_id=key[1])
        return account

    def issue_mirror(self, issue: dict[str, Any]) -> str:
        """One issue as a webhook carried it, into its imported proposal (in the caller's
        transaction): "created", "updated", "unchanged", or why it was not."""
        self.recipe = self.recipe or _issue_recipe()
        if self.recipe is None:
            return "refused: the site has no active recipe yet"
        problem = _issue_problem(issue)
        if problem:
            return f"refused: {problem}"
        return self._issue_apply(issue, f"issue #{issue['number']}")

    def comments_mirror(
        self, proposal_id: int, number: int, comments: list[dict[str, Any]]
    ) -> None:
        """Comments a webhook carried onto a proposal's mirror (no command is run)."""
        self._comments_apply({number: proposal_id}, [(number, c) for c in comments])

    def _issue_apply(self, issue: dict[str, Any], place: str) -> str:
        number = issue["number"]
        names = issue_labels(issue)
        mirror = {
            "author_login": github_login(issue.get("user")),
            "author_id": (issue.get("user") or {}).get("id"),
            "labels": names[:50],
            "comments": issue.get("comments") if isinstance(issue.get("comments"), int) else 0,
            "state": issue.get("state") or "",
            "html_url": str(issue.get("html_url") or "")[:500],
        }
        parent = _parent_number(issue)
        closed_at = _when(issue.get("closed_at"))
        updated_at = _when(issue.get("updated_at"))
        proposal = Proposal.objects.select_for_update().filter(github_issue_number=number).first()
        if proposal is not None and proposal.state != State.IMPORTED:
            # A proposal the site already follows: only the facts of the issue are noted.
            changed = (proposal.github_parent_number, proposal.github_closed_at) != (
                parent,
                closed_at,
            ) or any(proposal.github_mirror.get(k) != v for k, v in mirror.items())
            if not changed:
                return "unchanged"
            Proposal.objects.filter(pk=proposal.pk).update(
                github_parent_number=parent,
                github_created_at=_when(issue.get("created_at")),
                github_closed_at=closed_at,
                github_mirror={**proposal.github_mirror, **mirror},
            )
            rows_changed(Proposal, [proposal.pk])
            return "updated"
        if (
            proposal is not None
            and proposal.github_updated_at == updated_at
            and all(proposal.github_mirror.get(k) == v for k, v in mirror.items())
        ):
            return "unchanged"
        fields = issue_fields(title=str(issue.get("title") or "Untitled"), body=issue.get("body"))
        sections = _safe_data(fields.data)
        named = str(sections.get("recipe") or "")
        recipe = _issue_recipe(named) if named else None
        data, problems = model_data(sections)
        for message in problems:
            self.report.problem(place, f"{message} (not imported)")
        ours: list[str] = []
        refused: list[str] = []
        for name in names:
            lowered = name.lower()
            (ours if LABEL_OK.match(lowered) else refused).append(lowered)
        for name in refused:
            self.report.problem(place, f"label '{name[:60]}' is not a label name the site keeps")
        user_data = issue.get("user") or {}
        author = self._account(user_data)
        values = {k: v for k, v in data.items() if k in _IMPORTED_FIELDS}
        created = proposal is None
        if proposal is None:
            proposal = Proposal(author=author, state=State.IMPORTED)
        proposal.recipe = recipe or self.recipe  # type: ignore[assignment]
        for key, value in values.items():
            setattr(proposal, key, value)
        proposal.github_issue_number = number
        proposal.github_issue_node_id = str(issue.get("node_id") or "")[:100]
        proposal.github_updated_at = updated_at
        proposal.github_sections = sections
        proposal.github_parent_number = parent
        proposal.github_created_at = _when(issue.get("created_at"))
        proposal.github_closed_at = closed_at
        kept = {k: v for k, v in proposal.github_mirror.items() if k != "gone"}
        proposal.github_mirror = {**kept, **mirror}
        _clean_dropping(proposal, values, self.report, place)
        proposal.save()
        proposal.labels.set(self._labels(ours[:20]))
        if proposal.github_created_at:
            # The issue's date, not today's (auto_now_add); the save above, in this same
            # transaction, already made the proposal's pages stale.
            Proposal.objects.filter(pk=proposal.pk).update(created_at=proposal.github_created_at)
        if created:
            imported_event_record(proposal=proposal, issue_number=number, parent=parent)
        return "created" if created else "updated"

    # Phase 2: the repository's comments.

    def _comments(self, state: GitHubBackfill) -> None:
        params: dict[str, Any] = {"sort": "created", "direction": "asc", "per_page": PER_PAGE}
        since = self._comments_since(state)
        if since:
            params["since"] = _utc_text(since)
        self.progress.start("comments", None)
        for page in self.api.pages(f"{self.prefix}/issues/comments", params, start=state.page):
            if page.last_number:
                self.progress.total(page.last_number * PER_PAGE)
            self._comment_page(page.items)
            self.progress.advance(len(page.items))
            state.page = page.number + 1
            self._save(state)

    def _comment_page(self, items: list[Any]) -> None:
        """One page of the repository's comments, in one transaction and a few statements
        whatever the number of issues it spans."""
        counts = self.report.counts
        numbered: list[tuple[int, dict[str, Any]]] = []
        for comment in items:
            if not isinstance(comment, dict):
                continue
            match = ISSUE_NUMBER.search(str(comment.get("issue_url") or ""))
            if match:
                numbered.append((int(match.group(1)), comment))
        linked = {
            number: pk
            for number, pk in Proposal.objects.filter(
                github_issue_number__in={number for number, _ in numbered}
            ).values_list("github_issue_number", "pk")
            if number is not None
        }
        ours = [(number, c) for number, c in numbered if number in linked]
        counts["comments_not_ours"] += len(numbered) - len(ours)
        if self.dry_run:
            counts["comments_created"] += len(ours)
            return
        with transaction.atomic():
            self._comments_apply(linked, ours)

    def _accounts_prefetch(self, users: list[dict[str, Any]]) -> None:
        """The accounts of a page's authors that exist already, in one query."""
        wanted = {
            str(u["id"]): github_login(u)
            for u in users
            if isinstance(u.get("id"), int) and (github_login(u), u["id"]) not in self.accounts
        }
        if not wanted:
            return
        for social in SocialAccount.objects.filter(
            provider="github", uid__in=list(wanted)
        ).select_related("user"):
            login = wanted[social.uid]
            if social.extra_data.get("login") == login:  # a renamed login goes the long way
                self.accounts[(login, int(social.uid))] = social.user

    def _comments_apply(
        self, linked: dict[int, int], comments: list[tuple[int, dict[str, Any]]]
    ) -> set[int]:
        """Mirror ``comments`` (issue number, comment) onto the proposals ``linked`` names;
        the ids of those GitHub has (stored or refused), so the reconcile can tell which
        mirrored ones were deleted."""
        counts = self.report.counts
        ids = [c["id"] for _, c in comments if isinstance(c.get("id"), int)]
        existing = {
            row[0]: row[1:]
            for row in Comment.objects.filter(github_comment_id__in=ids).values_list(
                "github_comment_id", "pk", "github_updated_at", "body"
            )
        }
        self._accounts_prefetch([c["user"] for _, c in comments if isinstance(c.get("user"), dict)])
        refused: dict[int, list[int]] = {}
        touched: list[Any] = []  # rows written past the signals: their pages go stale
        fresh: list[tuple[Comment, datetime | None]] = []
        present: set[int] = set()
        for number, comment in comments:
            comment_id = comment.get("id")
            if not isinstance(comment_id, int):
                continue
            present.add(comment_id)
            refusal = _comment_refusal(comment)
            if refusal is not None:
                if refusal:  # the site's own comments are skipped without a word
                    self.report.problem(f"comment {comment_id} on issue #{number}", refusal)
                counts["comments_skipped"] += 1
                refused.setdefault(linked[number], []).append(comment_id)
                continue
            body, user_data = comment["body"].replace("\x00", ""), comment["user"]
            updated_at = _when(comment.get("updated_at"))
            if comment_id in existing:
                pk, stored_at, stored_body = existing[comment_id]
                if stored_body == body and stored_at == updated_at:
                    counts["comments_unchanged"] += 1
                    continue
                Comment.objects.filter(pk=pk).update(body=body, github_updated_at=updated_at)
                touched.append(pk)
                counts["comments_updated"] += 1
                continue
            login = github_login(user_data)
            row = Comment(
                proposal_id=linked[number],
                author=self._account(user_data),
                author_label=f"@{login} on GitHub"[:100],
                body=body,
                github_comment_id=comment_id,
                github_updated_at=updated_at,
            )
            fresh.append((row, _when(comment.get("created_at"))))
        if fresh:
            rows = Comment.objects.bulk_create([row for row, _ in fresh])
            for row, (_, created_at) in zip(rows, fresh, strict=True):
                row.created_at = created_at or row.created_at
            Comment.objects.bulk_update(rows, ["created_at"])  # auto_now_add set it to now
            touched += rows
            counts["comments_created"] += len(rows)
        if touched:
            rows_changed(Comment, touched)
        for proposal_id, refused_ids in refused.items():
            proposal = Proposal.objects.select_for_update().get(pk=proposal_id)
            known = set(proposal.github_mirror.get("refused_comments") or [])
            if not set(refused_ids) <= known:
                mirror = {
                    **proposal.github_mirror,
                    "refused_comments": sorted(known | set(refused_ids)),
                }
                Proposal.objects.filter(pk=proposal_id).update(github_mirror=mirror)
        return present

    # Phase 3: deleted comments.

    def _reconcile(self) -> None:
        """An imported issue whose mirror does not add up to GitHub's comment count lists
        its own comments: what GitHub no longer has goes."""
        rows = (
            Proposal.objects.filter(state=State.IMPORTED, github_issue_number__isnull=False)
            .annotate(
                mirrored=Count("comments", filter=Q(comments__github_comment_id__isnull=False))
            )
            .values_list("pk", "github_issue_number", "github_mirror", "mirrored")
            .order_by("pk")
        )
        wanted = [
            (pk, number)
            for pk, number, mirror, mirrored in rows.iterator(chunk_size=2000)
            if number is not None
            and mirror.get("comments") is not None
            and mirrored + len(mirror.get("refused_comments") or []) != mirror["comments"]
        ]
        self.progress.start("issues whose comments changed", len(wanted))
        for pk, number in wanted:
            self._reconcile_issue(pk, number)
            self.progress.advance(1)

    def _missing(self) -> None:
        """Imported issues the lists no longer hold: transferred away, deleted, or their
        experiment label taken off. Each is asked about once and reported; its mirror stays."""
        rows = (
            Proposal.objects.filter(state=State.IMPORTED, github_issue_number__isnull=False)
            .exclude(github_issue_number__in=self.seen)
            .exclude(github_mirror__has_key="gone")
            .values_list("pk", "github_issue_number", "github_mirror")
        )
        for pk, number, mirror in list(rows):
            answer = self.api.get(f"{self.prefix}/issues/{number}")
            what = {
                301: "was transferred away",
                404: "is gone",
                410: "was deleted",
            }.get(answer.status, "no longer carries an experiment label")
            self.report.problem(f"issue #{number}", f"{what}; its mirror is kept")
            if not self.dry_run:
                Proposal.objects.filter(pk=pk).update(
                    github_mirror={**mirror, "gone": what, "comments": None}
                )

    def _reconcile_issue(self, proposal_id: int, number: int) -> None:
        counts = self.report.counts
        path = f"{self.prefix}/issues/{number}/comments"
        first = self.api.get(path, {"per_page": PER_PAGE})
        if first.status in {301, 404, 410}:
            what = {301: "was transferred away", 404: "is gone", 410: "was deleted"}
            self.report.problem(f"issue #{number}", f"{what[first.status]}; its mirror is kept")
            return
        present: set[int] = set()
        if self.dry_run:
            counts["issues_reconciled"] += 1
            return
        for page in self.api.pages(path, {"per_page": PER_PAGE}):
            with transaction.atomic():
                present |= self._comments_apply(
                    {number: proposal_id}, [(number, c) for c in page.items if isinstance(c, dict)]
                )
        with transaction.atomic():
            gone = Comment.objects.filter(
                proposal_id=proposal_id, github_comment_id__isnull=False
            ).exclude(github_comment_id__in=present)
            counts["comments_deleted"] += gone.delete()[0]
            proposal = Proposal.objects.select_for_update().get(pk=proposal_id)
            mirror = {
                **proposal.github_mirror,
                "comments": len(present),
                "refused_comments": sorted(
                    set(proposal.github_mirror.get("refused_comments") or []) & present
                ),
            }
            Proposal.objects.filter(pk=proposal_id).update(github_mirror=mirror)
        counts["issues_reconciled"] += 1


# What an imported issue may set on its proposal (its plan is never built: it is history).
_IMPORTED_FIELDS = frozenset(
    {
        "title",
        "summary",
        "description",
        "hypothesis",
        "success_metric",
        "success_direction",
        "success_threshold",
        "baseline",
        "ablation_spec",
        "branch",
        "wandb_url",
        "data_browser_url",
        "results",
        "submitter_name",
        "submitter_affiliation",
        "submitter_link",
        "experiment_json_url",
    }
)


def _utc_text(value: datetime) -> str:
    return value.astimezone(timezone.get_fixed_timezone(0)).strftime("%Y-%m-%dT%H:%M:%SZ")


def _parent_number(issue: dict[str, Any]) -> int | None:
    """The parent issue of a sub-issue, from ``parent_issue_url`` (or a ``parent`` object)."""
    parent = issue.get("parent")
    if isinstance(parent, dict) and isinstance(parent.get("number"), int):
        return int(parent["number"])
    match = ISSUE_NUMBER.search(str(issue.get("parent_issue_url") or ""))
    return int(match.group(1)) if match else None


def _comment_refusal(comment: dict[str, Any]) -> str | None:
    """Why a comment is not mirrored ("" for the site's own), or None when it is."""
    body = comment.get("body")
    if not isinstance(body, str):
        return "its body is not text; skipped"
    if is_own_text(body):
        return ""
    if len(body) > MAX_MARKDOWN:
        return f"{len(body)} characters, over the cap of {MAX_MARKDOWN}; skipped"
    user_data = comment.get("user")
    if not isinstance(user_data, dict) or user_data.get("login") in DELETED_LOGINS:
        return "its author's account was deleted; skipped"
    return None


def _issue_problem(issue: dict[str, Any]) -> str:
    """Why an issue cannot be imported, in words; empty when it can."""
    body = issue.get("body")
    if body is not None and not isinstance(body, str):
        return "its body is not text (it does not parse)"
    if isinstance(body, str) and len(body) > BODY_MAX:
        return f"its body is {len(body)} characters, over the cap of {BODY_MAX}"
    if not isinstance(issue.get("title"), str) or not issue["title"].strip():
        return "it has no title"
    if _when(issue.get("created_at")) is None:
        return "its created_at is not a date"
    user = issue.get("user")
    if not isinstance(user, dict) or user.get("login") in DELETED_LOGINS:
        return "its author's account was deleted"
    if not EXPERIMENT_LABELS & {n.lower() for n in issue_labels(issue)}:
        return "it carries no experiment label"
    return ""


def _clean_dropping(
    proposal: Proposal, values: dict[str, Any], report: BackfillReport, place: str
) -> None:
    """Validate the proposal's fields; a field the model refuses is reported and left
    empty, so one odd section never costs the issue."""
    for _attempt in range(3):
        try:
            proposal.full_clean(exclude=["author", "plan", "recipe"], validate_unique=False)
            return
        except ValidationError as exc:
            for key, messages in exc.message_dict.items():
                if key not in values:
                    raise
                report.problem(place, f"{key}: {'; '.join(messages)} (not imported)")
                default = Proposal._meta.get_field(key).get_default()  # type: ignore[union-attr]
                setattr(proposal, key, default)
    proposal.full_clean(exclude=["author", "plan", "recipe"], validate_unique=False)


# Webhooks on old issues (proposals/github/deliveries.py): the mirror, and nothing else.


def imported_issue_apply(issue: dict[str, Any]) -> tuple[str, str]:
    """An old issue's event (edited, labelled, closed, reopened...) updates its imported
    proposal's mirror, quietly: no draft, no outbox row (``outbox.enqueue.quiet``)."""
    with transaction.atomic():
        done = Backfill(reader=None, repository="").issue_mirror(issue)
    if done.startswith("refused") or done == "unchanged":
        return ignored(f"the old issue's mirror: {done}")
    return applied(f"the old issue's mirror: {done} (nothing written to GitHub)")


def imported_comment_apply(
    action: str, proposal: Proposal, comment: dict[str, Any]
) -> tuple[str, str]:
    """A comment on an imported issue, mirrored (a deleted one goes); no command is run."""
    if not isinstance(comment.get("id"), int):
        return ignored("no comment id")
    if action == "deleted":
        gone = Comment.objects.filter(proposal=proposal, github_comment_id=comment["id"]).delete()
        return applied(f"mirrored comment removed ({gone[0]})")
    with transaction.atomic():
        Backfill(reader=None, repository="").comments_mirror(
            proposal.pk, proposal.github_issue_number or 0, [comment]
        )
    return applied("comment mirrored on the imported issue (its commands are not run)")
