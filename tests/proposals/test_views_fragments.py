"""Pages for signed-in readers from cached fragments (marin_site/fragments.py): the same
sections for everyone, each reader's own header, CSRF token and controls, and every write
seen on the next request."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.contrib.auth.models import AnonymousUser
from django.core.cache import cache
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient, APIRequestFactory

from proposals import services
from proposals.models import Label, Proposal, State
from proposals.selectors import proposal_list
from proposals.serializers import ProposalSerializer
from proposals.services import comment_create, proposal_update, review_submit
from runs.models import RunEvent
from tests.factories import ProposalFactory, ReviewFactory, UserFactory
from tests.runs.runs_helpers import launched_plan

pytestmark = pytest.mark.django_db

CSRF = re.compile(rb'name="csrfmiddlewaretoken" value="([^"]+)"')


@pytest.fixture(autouse=True)
def _fragments_on(settings: Any) -> None:
    settings.FRAGMENT_CACHE_SECONDS = 600
    settings.PAGE_CACHE_SECONDS = 0
    cache.clear()


def signed_in(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def submitted(contributor: Any, recipe: Any) -> Any:
    return ProposalFactory.create(
        author=contributor, recipe=recipe, state=State.SUBMITTED, title="Top-2 routing"
    )


def test_each_reader_gets_their_own_header_token_and_controls_around_shared_sections(
    submitted: Any, contributor: Any, reviewer: Any, maintainer: Any
) -> None:
    url = f"/proposals/{submitted.pk}/"
    readers = {"max": maintainer, "rita": reviewer, "carla": contributor}
    pages = {}
    for _ in range(2):  # the second round comes from the fragments the first one kept
        for name, user in readers.items():
            pages[name] = signed_in(user).get(url).content
    outsider = UserFactory.create(username="olga")
    pages["olga"] = signed_in(outsider).get(url).content

    for name, page in pages.items():
        assert f">{name}</a>".encode() in page  # the header names this reader
        others = {f">{other}</a>".encode() for other in pages if other not in {name, "carla"}}
        assert not any(other in page for other in others)  # and nobody else
        assert b"Top-2 routing" in page
    tokens = {name: set(CSRF.findall(page)) for name, page in pages.items()}
    for name, mine in tokens.items():
        assert mine
        assert not any(mine & theirs for other, theirs in tokens.items() if other != name)

    assert b'class="action-form action-approve"' in pages["max"]
    assert b'class="action-form action-approve"' not in pages["rita"]
    assert b'class="action-form action-approve"' not in pages["carla"]
    assert b"Write a review" in pages["rita"] and b"Write a review" in pages["max"]
    assert b"Write a review" not in pages["carla"]  # never one's own proposal
    assert b"Edit proposal" in pages["carla"] and b"Edit proposal" in pages["max"]
    assert b"Edit proposal" not in pages["rita"] and b"Edit proposal" not in pages["olga"]
    assert b'class="action-form action-withdraw"' in pages["carla"]
    assert b'class="action-form action-withdraw"' not in pages["olga"]
    assert b"Add a comment" in pages["olga"]
    anonymous = Client().get(url).content
    assert b"Sign in to comment" in anonymous and b"Add a comment" not in anonymous
    assert b"Write a review" not in anonymous and b"Sign out" not in anonymous


def test_own_review_fills_the_form_of_its_writer_only(
    submitted: Any, reviewer: Any, maintainer: Any, django_capture_on_commit_callbacks: Any
) -> None:
    url = f"/proposals/{submitted.pk}/"
    signed_in(maintainer).get(url)
    with django_capture_on_commit_callbacks(execute=True):
        ReviewFactory.create(proposal=submitted, reviewer=reviewer, text="Add a third seed.")
    rita = signed_in(reviewer).get(url).content
    max_page = signed_in(maintainer).get(url).content
    assert b"Update your review" in rita and b"Add a third seed.</textarea>" in rita
    assert b"Update your review" not in max_page and b"Write a review" in max_page
    assert b"Add a third seed." in max_page  # the review itself, in the shared section


@pytest.mark.parametrize("who", ["maintainer", "reviewer", "author", "contributor"])
def test_second_request_takes_the_sections_and_the_reader_s_parts_from_the_cache(
    who: str,
    submitted: Any,
    contributor: Any,
    reviewer: Any,
    maintainer: Any,
    django_assert_num_queries: Any,
) -> None:
    """Kept: every section, the reader's roles, header, controls and own review's form; so a
    warm page asks the database for the session, the reader and the proposal's page fields
    alone, whoever reads it (a reader without a role included: no model permissions)."""
    ReviewFactory.create(proposal=submitted, reviewer=reviewer, text="Kept **apart**.")
    user = {
        "maintainer": maintainer,
        "reviewer": reviewer,
        "author": contributor,
        "contributor": UserFactory.create(username="olga"),
    }[who]
    client = signed_in(user)
    url = f"/proposals/{submitted.pk}/"
    cold = client.get(url)
    with django_assert_num_queries(3) as warm:  # the session, the reader, the proposal
        warm_page = client.get(url).content
    assert CSRF.sub(b"", warm_page) == CSRF.sub(b"", cold.content)  # tokens are masked anew
    proposal_sql = next(q["sql"] for q in warm.captured_queries if "proposals_proposal" in q["sql"])
    assert '"description"' not in proposal_sql  # the page fields, not the whole row
    if who == "reviewer":
        assert b"Kept **apart**.</textarea>" in warm_page  # their own review, in their form


def test_a_page_rendered_afresh_reads_the_rest_of_the_row_in_one_query(
    submitted: Any, maintainer: Any
) -> None:
    """The row is read with the page fields first; a section rendered afresh has the rest
    loaded in one query, not one query per field it shows."""
    with CaptureQueriesContext(connection) as cold:
        page = signed_in(maintainer).get(f"/proposals/{submitted.pk}/").content.decode()
    reads = [q["sql"] for q in cold.captured_queries if 'FROM "proposals_proposal"' in q["sql"]]
    assert len(reads) == 2, reads
    assert submitted.summary in page and "description-heading" in page


def test_kept_forms_carry_this_request_s_csrf_token(submitted: Any, maintainer: Any) -> None:
    """The reader's kept parts hold forms (sign out, follow, the actions, review, comment):
    each response puts its own token in all of them, and a form posted from a kept page
    passes the CSRF check."""
    from proposals import follows
    from proposals.templatetags.marin import CSRF_MARK

    client = Client(enforce_csrf_checks=True)
    client.force_login(maintainer)
    url = f"/proposals/{submitted.pk}/"
    first = client.get(url).content.decode()
    kept = client.get(url).content.decode()
    for html in (first, kept):
        assert CSRF_MARK not in html
        assert len(CSRF.findall(html.encode())) >= 5
        assert len(set(CSRF.findall(html.encode()))) == 1  # one token, in every form
    token = CSRF.findall(kept.encode())[0].decode()
    response = client.post(f"/proposals/{submitted.pk}/follow/", {"csrfmiddlewaretoken": token})
    assert response.status_code == 302
    assert follows.is_following(user=maintainer, proposal_id=submitted.pk)
    refused = client.post(f"/proposals/{submitted.pk}/unfollow/", {"csrfmiddlewaretoken": "x"})
    assert refused.status_code == 403  # the check is real


def test_the_kept_header_follows_the_reader_s_roles_and_the_page(
    submitted: Any, contributor: Any, django_capture_on_commit_callbacks: Any
) -> None:
    from django.contrib.auth.models import Group

    client = signed_in(contributor)
    pages = ("/", f"/proposals/{submitted.pk}/")

    def header(url: str) -> str:
        html = client.get(url).content.decode()
        return html[html.index('<header class="site-header">') : html.index("</header>")]

    for _ in range(2):  # rendered, then kept
        for url in pages:
            assert "Review queue" not in header(url) and ">carla</a>" in header(url)
            assert 'aria-current="page">Proposals' in header(url)
    search = header("/search/")  # another view, its own header
    assert 'aria-current="page">Search' in search
    assert 'aria-current="page">Proposals' not in search
    with django_capture_on_commit_callbacks(execute=True):
        contributor.groups.add(Group.objects.get_or_create(name="reviewer")[0])
    for url in pages:
        assert "Review queue" in header(url)


def test_the_kept_details_follow_the_site_s_github_settings(
    submitted: Any, maintainer: Any, settings: Any
) -> None:
    client = signed_in(maintainer)
    url = f"/proposals/{submitted.pk}/"
    settings.GITHUB_TOKEN = ""
    for _ in range(2):
        assert "GitHub sync is off" in client.get(url).content.decode()
    settings.GITHUB_TOKEN, settings.GITHUB_REPOSITORY = "t0ken", "marin-community/marin"
    assert "The GitHub issue is being created." in client.get(url).content.decode()


@pytest.mark.parametrize("write", ["edit", "review", "comment", "label", "label-rename"])
def test_a_write_shows_on_the_next_request_for_everyone(
    write: str,
    submitted: Any,
    contributor: Any,
    reviewer: Any,
    maintainer: Any,
    api: Any,
    django_capture_on_commit_callbacks: Any,
) -> None:
    label = Label.objects.create(name="routing")
    submitted.labels.add(label)
    other = ProposalFactory.create(recipe=submitted.recipe, title="Untouched neighbour")
    readers = [signed_in(maintainer), signed_in(reviewer), signed_in(contributor), Client()]
    url = f"/proposals/{submitted.pk}/"
    for client in readers:  # fill every fragment
        client.get("/")
        client.get(url)
    api.get("/api/v1/proposals/")

    with django_capture_on_commit_callbacks(execute=True):
        if write == "edit":
            proposal_update(
                proposal_id=submitted.pk,
                actor=contributor,
                data={"title": "Top-2 routing, 3 seeds", "summary": "Now with seeds."},
                labels=None,
            )
            expected = "Top-2 routing, 3 seeds"
        elif write == "review":
            review_submit(
                proposal_id=submitted.pk,
                reviewer=reviewer,
                score=4,
                recommendation="approve",
                text="Cheap and clear.",
            )
            expected = "1 review, average 4.0/5"
        elif write == "comment":
            comment_create(proposal_id=submitted.pk, author=maintainer, body="Which seeds?")
            expected = "Which seeds?"
        elif write == "label":
            submitted.labels.add(Label.objects.create(name="capacity-study"))
            expected = "capacity-study"
        else:
            label.name = "router-study"
            label.save()
            expected = "router-study"

    for client in readers:
        listed = client.get("/").content.decode()
        if write != "comment":  # a card shows no comments
            assert expected in listed
        assert "Untouched neighbour" in listed
        page = client.get(url).content.decode()
        assert ("Cheap and clear." if write == "review" else expected) in page
    rows = {row["id"]: row for row in api.get("/api/v1/proposals/").json()["results"]}
    if write == "edit":
        assert rows[submitted.pk]["title"] == expected
    elif write == "review":
        assert rows[submitted.pk]["review_count"] == 1
    elif write in {"label", "label-rename"}:
        assert expected in rows[submitted.pk]["labels"]
    assert rows[other.pk]["title"] == "Untouched neighbour"


def test_a_write_to_one_proposal_keeps_the_others_fragments(
    submitted: Any, contributor: Any, maintainer: Any, django_capture_on_commit_callbacks: Any
) -> None:
    others = ProposalFactory.create_batch(3, recipe=submitted.recipe)
    client = signed_in(maintainer)
    client.get("/")
    with django_capture_on_commit_callbacks(execute=True):
        proposal_update(
            proposal_id=submitted.pk, actor=contributor, data={"summary": "Changed."}, labels=None
        )
    # Only the changed proposal's row is loaded again: a query naming its id alone.
    with CaptureQueriesContext(connection) as queries:
        assert b"Changed." in client.get("/").content
    row_loads = [
        q["sql"] for q in queries.captured_queries if '"proposals_proposal"."title"' in q["sql"]
    ]
    assert len(row_loads) == 1
    assert str(submitted.pk) in row_loads[0]
    assert not any(f"({p.pk})" in row_loads[0] or f", {p.pk}" in row_loads[0] for p in others)


def test_a_run_event_shows_on_the_timeline(recipe: Any, contributor: Any, maintainer: Any) -> None:
    plan = launched_plan(recipe)
    proposal = ProposalFactory.create(
        author=contributor, recipe=recipe, state=State.APPROVED, plan=plan
    )
    url = f"/proposals/{proposal.pk}/"
    client = signed_in(maintainer)
    client.get(url)
    run = plan.runs.first()
    # Written in bulk (no signal), as the queue and the cancel do:
    RunEvent.objects.bulk_create([RunEvent(run=run, verb="preempted-by-test")])
    assert b"preempted-by-test" in client.get(url).content
    assert b"preempted-by-test" in signed_in(contributor).get(url).content


def test_an_issue_number_stored_with_update_shows_in_the_details(
    submitted: Any, maintainer: Any
) -> None:
    url = f"/proposals/{submitted.pk}/"
    client = signed_in(maintainer)
    assert b"GitHub issue</dt>" not in client.get(url).content
    Proposal.objects.filter(pk=submitted.pk).update(github_issue_number=4242)
    assert b"#4242" in client.get(url).content


def test_api_rows_from_the_cache_are_the_serializer_s_own_and_per_reader_actions(
    submitted: Any,
    contributor: Any,
    maintainer: Any,
    api_as: Any,
    django_assert_num_queries: Any,
) -> None:
    ProposalFactory.create(recipe=submitted.recipe, state=State.DRAFT).labels.add(
        Label.objects.create(name="moe")
    )
    anonymous = APIClient()
    anonymous.get("/api/v1/proposals/")  # fills the fragments
    with django_assert_num_queries(0):  # the count, the page's ids and the rows: cached
        rows = anonymous.get("/api/v1/proposals/").json()["results"]

    request = APIRequestFactory().get("/api/v1/proposals/")
    request.user = AnonymousUser()
    expected = ProposalSerializer(
        list(proposal_list()), many=True, context={"request": request}
    ).data
    assert rows == [dict(row) for row in expected]
    assert list(rows[0]) == ProposalSerializer.Meta.fields

    as_max = {r["id"]: r for r in api_as(maintainer).get("/api/v1/proposals/").json()["results"]}
    assert {"approve", "reject", "hold"} <= set(as_max[submitted.pk]["allowed_actions"])
    as_carla = {r["id"]: r for r in api_as(contributor).get("/api/v1/proposals/").json()["results"]}
    assert "approve" not in as_carla[submitted.pk]["allowed_actions"]
    assert "withdraw" in as_carla[submitted.pk]["allowed_actions"]
    assert as_carla[submitted.pk]["title"] == as_max[submitted.pk]["title"]


def test_a_renamed_user_is_renamed_on_every_page(
    submitted: Any, contributor: Any, maintainer: Any, django_capture_on_commit_callbacks: Any
) -> None:
    client = signed_in(maintainer)
    client.get("/")
    client.get(f"/proposals/{submitted.pk}/")
    contributor.username = "carla-renamed"
    with django_capture_on_commit_callbacks(execute=True):
        contributor.save()
    assert b">carla-renamed</a>" in client.get("/").content
    assert b">carla-renamed</a>" in client.get(f"/proposals/{submitted.pk}/").content


@pytest.mark.parametrize("url", ["/", "/api/v1/proposals/"])
def test_the_cached_listing_follows_every_change_to_what_it_finds(
    url: str,
    submitted: Any,
    maintainer: Any,
    contributor: Any,
    recipe: Any,
    django_capture_on_commit_callbacks: Any,
) -> None:
    """The count and a page's ids are kept while no proposal changes; a new proposal, a state
    change, a label, a renamed author or recipe each shows on the next read."""
    client = signed_in(maintainer) if url == "/" else APIClient()

    def found(query: str) -> set[int]:
        response = client.get(url + query)
        assert response.status_code == 200
        if url == "/":
            html = response.content.decode()
            return {int(pk) for pk in re.findall(r'<a href="/proposals/(\d+)/">', html)}
        return {row["id"] for row in response.json()["results"]}

    assert found("") == {submitted.pk}
    assert found("?state=approved") == set()
    with django_capture_on_commit_callbacks(execute=True):  # each write, committed
        newer = ProposalFactory.create(author=contributor, recipe=recipe, title="Newer")
    assert found("") == {submitted.pk, newer.pk}
    with django_capture_on_commit_callbacks(execute=True):
        services.proposal_transition(proposal_id=submitted.pk, action="approve", actor=maintainer)
    assert found("?state=approved") == {submitted.pk}
    assert found("?label=moe") == set()
    with django_capture_on_commit_callbacks(execute=True):
        newer.labels.add(Label.objects.create(name="moe"))
    assert found("?label=moe") == {newer.pk}
    assert found("?author=carla2") == set()
    with django_capture_on_commit_callbacks(execute=True):
        contributor.username = "carla2"
        contributor.save()
    assert found("?author=carla2") == {submitted.pk, newer.pk}
    assert found(f"?recipe={recipe.name}-v2") == set()
    with django_capture_on_commit_callbacks(execute=True):
        recipe.name = f"{recipe.name}-v2"
        recipe.save()
    assert found(f"?recipe={recipe.name}") == {submitted.pk, newer.pk}


def test_the_header_links_are_the_urls_they_name(client: Any) -> None:
    """The page header's links are reversed once per process (``{% path %}``): the same
    addresses ``reverse`` gives."""
    from django.urls import reverse

    html = client.get("/").content.decode()
    for name in ("proposals:archive", "proposals:search", "campaigns:list", "api-docs"):
        assert f'href="{reverse(name)}"' in html
    assert f'href="{reverse("proposals:feed-alerts")}"' in html


def test_a_changed_conclusion_shows_at_once_though_it_is_kept_rendered(
    contributor: Any, maintainer: Any, recipe: Any, django_capture_on_commit_callbacks: Any
) -> None:
    proposal = ProposalFactory.create(author=contributor, recipe=recipe, state=State.APPROVED)
    client = signed_in(maintainer)
    url = f"/proposals/{proposal.pk}/"
    for verdict, text in (("worked", "It **helped**."), ("did_not_work", "It did *not* help.")):
        with django_capture_on_commit_callbacks(execute=True):
            services.proposal_record_outcome(
                proposal_id=proposal.pk,
                actor=maintainer,
                outcome=verdict,
                conclusion=text,
                confidence="exploratory",
            )
        for _ in range(2):  # rendered, then from the fragment cache
            html = client.get(url).content.decode()
            assert (
                text.replace("**helped**", "<strong>helped</strong>").replace(
                    "*not*", "<em>not</em>"
                )
                in html
            )
    assert "<strong>helped</strong>" not in client.get(url).content.decode()  # the old one


def test_the_actions_kept_per_reader_follow_the_proposal_and_the_readers_roles(
    submitted: Any, maintainer: Any, django_capture_on_commit_callbacks: Any
) -> None:
    from django.contrib.auth.models import Group

    url = f"/proposals/{submitted.pk}/"

    def buttons() -> set[str]:
        html = signed_in(maintainer).get(url).content.decode()
        return set(re.findall(r'class="action-form action-([a-z_]+)"', html))

    assert {"approve", "hold"} <= buttons()
    assert {"approve", "hold"} <= buttons()  # kept
    with django_capture_on_commit_callbacks(execute=True):
        services.proposal_hold(proposal_id=submitted.pk, actor=maintainer, hold=True, reason="wait")
    assert "unhold" in buttons() and "hold" not in buttons()
    with django_capture_on_commit_callbacks(execute=True):  # kept roles change at commit
        maintainer.groups.remove(Group.objects.get(name="maintainer"))
        maintainer.groups.add(Group.objects.get_or_create(name="reviewer")[0])
    assert not {"approve", "unhold", "reject"} & buttons()  # a reviewer now
    maintainer.is_superuser = True  # may do all a maintainer may, and more
    maintainer.save()
    assert {"unhold", "reject", "withdraw"} <= buttons()


def test_the_follow_button_kept_per_reader_follows_their_follows(
    submitted: Any, reviewer: Any, django_capture_on_commit_callbacks: Any
) -> None:
    from proposals import follows

    client = signed_in(reviewer)
    url = f"/proposals/{submitted.pk}/"
    for _ in range(2):
        assert ">Follow</button>" in client.get(url).content.decode()
    with django_capture_on_commit_callbacks(execute=True):
        follows.follow_set(user=reviewer, proposal_id=submitted.pk, follow=True)
    for _ in range(2):
        assert ">Unfollow</button>" in client.get(url).content.decode()
    with django_capture_on_commit_callbacks(execute=True):
        follows.follow_set(user=reviewer, proposal_id=submitted.pk, follow=False)
    assert ">Follow</button>" in client.get(url).content.decode()
    with django_capture_on_commit_callbacks(execute=True):
        ReviewFactory.create(proposal=submitted, reviewer=reviewer, text="Kept **apart**.")
    assert "Update your review" in client.get(url).content.decode()
