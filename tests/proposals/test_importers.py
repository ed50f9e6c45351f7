"""The outcome digest importer: Marin's agent-moe-experiments.jsonl onto imported issues,
line by line, through the import framework's service and command."""

from __future__ import annotations

from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from marin_site import importing
from marin_site.events import Verb
from proposals.importers import DIGEST_OUTCOMES, digest_lines_apply
from proposals.models import GitHubOutbox, Outcome, Proposal, State
from tests.factories import ProposalFactory

pytestmark = pytest.mark.django_db

DIGEST = (
    Path(__file__).resolve().parents[1]
    / "fixtures"
    / "marin-reports"
    / "agent-moe-experiments.jsonl"
)


@pytest.fixture
def issues(contributor: Any, recipe: Any) -> dict[int, Proposal]:
    made = {
        number: ProposalFactory.create(
            author=contributor, recipe=recipe, state=State.IMPORTED, github_issue_number=number
        )
        for number in (4802, 5502, 4907)
    }
    made[5381] = ProposalFactory.create(
        author=contributor, recipe=recipe, state=State.IMPORTED, github_issue_number=5381
    )
    return made


def test_every_marin_outcome_word_maps_to_a_site_outcome() -> None:
    assert set(DIGEST_OUTCOMES.values()) == set(Outcome.values)  # all six reachable
    for word in ("Worked", "Promising", "Mixed", "Did not work", "Not evaluated"):
        assert word.lower() in DIGEST_OUTCOMES


def test_the_digest_lands_on_its_imported_issues_line_by_line(
    issues: dict[int, Proposal], maintainer: Any
) -> None:
    report = importing.import_run(kind="outcome-digest", source=str(DIGEST), by=maintainer)
    lines = {line.place: (line.outcome, line.reason) for line in report.lines}
    assert lines["line 1"][0] == "skipped"  # the metadata record
    assert lines["line 2"] == ("matched", "issue #4802: Worked")
    assert lines["line 3"] == ("matched", "issue #5502: Did not work")
    assert lines["line 4"] == ("matched", "issue #4907: Not evaluated")
    assert lines["line 5"] == ("refused", "issue #9999 matches no imported proposal")
    assert lines["line 6"][0] == "refused" and "'Sort of' is not one of" in lines["line 6"][1]
    assert lines["line 7"] == ("refused", "not JSON")  # a truncated last line
    frozen = Proposal.objects.get(github_issue_number=5502)
    assert (frozen.outcome, frozen.state) == (Outcome.DID_NOT_WORK, State.IMPORTED)
    assert frozen.conclusion == "Freezing the router cost about a third of the speed."
    assert "- Wall-clock speedup: 0.59–0.65x" in frozen.results
    assert "- Model-FLOPs speedup: <1x" in frozen.results
    assert frozen.events.get(verb=Verb.OUTCOME_RECORDED).actor == maintainer
    assert "speedup" not in Proposal.objects.get(github_issue_number=4907).results  # "—"
    assert not GitHubOutbox.objects.exists()
    again = importing.import_run(kind="outcome-digest", source=str(DIGEST), by=maintainer)
    assert again.counts[importing.Outcome.MATCHED] == 0
    assert frozen.events.filter(verb=Verb.OUTCOME_RECORDED).count() == 1


def test_a_dry_run_stores_nothing_and_the_command_reports(issues: dict[int, Proposal]) -> None:
    out = StringIO()
    with pytest.raises(CommandError, match="3 refused"):  # something was refused: status 1
        call_command("import_history", "outcome-digest", str(DIGEST), "--dry-run", stdout=out)
    assert "line 2: matched" in out.getvalue()
    assert "line 5: refused: issue #9999 matches no imported proposal" in out.getvalue()
    assert not Proposal.objects.exclude(outcome="").exists()


def test_a_proposal_followed_on_the_site_is_left_alone(contributor: Any, recipe: Any) -> None:
    ProposalFactory.create(
        author=contributor, recipe=recipe, state=State.SUBMITTED, github_issue_number=4802
    )
    report = digest_lines_apply(DIGEST.read_bytes().splitlines()[1:2])
    assert report.lines[0].outcome == "skipped"
    assert Proposal.objects.get().outcome == ""
