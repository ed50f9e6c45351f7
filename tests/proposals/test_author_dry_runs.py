"""The author's own dry run, on a pool that allows it (``Pool.author_dry_runs``): the
permission (``proposals.permissions.DRY_RUN``, the ``dry_run`` action every door asks), the
proposal page's button and form, the API, and the pool's setting through its doors."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User

from marin_site.errors import ActionForbidden, TransitionNotAllowed
from proposals import services
from proposals.actions import allowed_action_names_forget
from proposals.models import Proposal, State
from runs.models import DryRun, Recipe
from runs.pools.models import Pool
from tests.factories import ProposalFactory, UserFactory
from tests.runs.pools.pool_helpers import make_pool

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _fresh_answers() -> None:
    allowed_action_names_forget()


def on_pool(recipe: Recipe, owner: User, **fields: Any) -> Pool:
    pool = make_pool(owner, name="lab", labels=[], **fields)
    Recipe.objects.filter(pk=recipe.pk).update(executor=pool.executor)
    return pool


def submitted(author: User, recipe: Recipe, state: str = State.SUBMITTED) -> Proposal:
    return ProposalFactory.create(author=author, recipe=recipe, state=state)


def test_the_author_starts_a_dry_run_only_on_a_pool_that_allows_it(
    contributor: User, recipe: Recipe, maintainer: User, django_capture_on_commit_callbacks: Any
) -> None:
    pool = on_pool(recipe, maintainer)
    proposal = submitted(contributor, recipe)
    with pytest.raises(ActionForbidden, match="start a dry run of this proposal"):
        services.proposal_dry_run(proposal_id=proposal.pk, actor=contributor)
    Pool.objects.filter(pk=pool.pk).update(author_dry_runs=True)
    with django_capture_on_commit_callbacks(execute=False):
        dry_run = services.proposal_dry_run(proposal_id=proposal.pk, actor=contributor)
    assert (dry_run.subject, dry_run.requested_by) == (f"proposal-{proposal.pk}", contributor)
    # Another contributor, though the pool allows authors: not theirs.
    other = UserFactory.create(username="olga", roles=["contributor"])
    with pytest.raises(ActionForbidden):
        services.proposal_dry_run(proposal_id=proposal.pk, actor=other)
    # Not before the proposal is submitted, even the author's own.
    draft = submitted(contributor, recipe, State.DRAFT)
    with pytest.raises(TransitionNotAllowed):
        services.proposal_dry_run(proposal_id=draft.pk, actor=contributor)


@pytest.mark.parametrize(
    "change",
    [
        {"retired": True},
        {"recipes": ["another-recipe"]},
        {"elsewhere": True},
        {"by_default": True, "executors": ["local"]},
    ],
    ids=["retired", "not-its-recipe", "recipe-not-on-the-pool", "pool-not-in-its-executors"],
)
def test_a_pool_that_is_retired_or_does_not_run_the_recipe_allows_no_author_dry_run(
    contributor: User,
    recipe: Recipe,
    maintainer: User,
    change: dict[str, Any],
    settings: Any,
) -> None:
    from django.utils import timezone

    pool = on_pool(recipe, maintainer, author_dry_runs=True)
    if change.get("by_default"):  # the recipe names no executor: the site's default, the pool
        settings.RUNS_DEFAULT_EXECUTOR = pool.executor
        Recipe.objects.filter(pk=recipe.pk).update(executor="")
    if executors := change.get("executors"):  # ...which its launch.executors leaves out
        Recipe.objects.filter(pk=recipe.pk).update(launch={**recipe.launch, "executors": executors})
    if change.get("retired"):
        Pool.objects.filter(pk=pool.pk).update(retired_at=timezone.now())
    if recipes := change.get("recipes"):
        Pool.objects.filter(pk=pool.pk).update(recipes=recipes)
    if change.get("elsewhere"):
        Recipe.objects.filter(pk=recipe.pk).update(executor="local")
    proposal = submitted(contributor, recipe)
    with pytest.raises(ActionForbidden):
        services.proposal_dry_run(proposal_id=proposal.pk, actor=contributor)
    assert not DryRun.objects.exists()


def test_the_author_s_page_offers_the_button_and_its_form_starts_the_dry_run(
    client: Any,
    contributor: User,
    recipe: Recipe,
    maintainer: User,
    django_capture_on_commit_callbacks: Any,
) -> None:
    pool = on_pool(recipe, maintainer)
    proposal = submitted(contributor, recipe)
    client.force_login(contributor)
    page = client.get(f"/proposals/{proposal.pk}/").content.decode()
    assert "Start a dry run" not in page
    assert client.post(f"/proposals/{proposal.pk}/dry-run/").status_code == 403
    Pool.objects.filter(pk=pool.pk).update(author_dry_runs=True)
    Proposal.objects.filter(pk=proposal.pk).update(title="Top-2 routing, again")  # a new version
    page = client.get(f"/proposals/{proposal.pk}/").content.decode()
    assert f'action="/proposals/{proposal.pk}/dry-run/"' in page
    assert "Start a dry run" in page
    with django_capture_on_commit_callbacks(execute=False):
        answer = client.post(f"/proposals/{proposal.pk}/dry-run/")
    assert answer.status_code == 302
    dry_run = DryRun.objects.get(subject=f"proposal-{proposal.pk}")
    assert dry_run.requested_by == contributor
    assert "Dry runs" in client.get(f"/proposals/{proposal.pk}/").content.decode()


def test_the_api_lets_the_author_start_one_where_the_pool_allows_it(
    api_as: Any,
    contributor: User,
    recipe: Recipe,
    maintainer: User,
    django_capture_on_commit_callbacks: Any,
) -> None:
    pool = on_pool(recipe, maintainer)
    proposal = submitted(contributor, recipe)
    api = api_as(contributor)
    assert "dry_run" not in api.get(f"/api/v1/proposals/{proposal.pk}/").json()["allowed_actions"]
    refused = api.post(f"/api/v1/proposals/{proposal.pk}/dry-runs/")
    assert refused.status_code == 403
    assert "start a dry run" in refused.json()["detail"]
    Pool.objects.filter(pk=pool.pk).update(author_dry_runs=True)
    assert "dry_run" in api.get(f"/api/v1/proposals/{proposal.pk}/").json()["allowed_actions"]
    with django_capture_on_commit_callbacks(execute=False):
        started = api.post(f"/api/v1/proposals/{proposal.pk}/dry-runs/")
    assert started.status_code == 201
    assert [row["state"] for row in started.json()["dry_runs"]] == ["queued"]
    listed = api.get("/api/v1/proposals/").json()["results"]
    assert "dry_run" in next(p for p in listed if p["id"] == proposal.pk)["allowed_actions"]


def test_a_pool_s_setting_is_kept_from_the_api_and_the_form(
    api_as: Any, client: Any, maintainer: User
) -> None:
    made = api_as(maintainer).post(
        "/api/v1/pools/", {"name": "lab", "author_dry_runs": True}, format="json"
    )
    assert made.status_code == 201, made.json()
    assert made.json()["author_dry_runs"] is True
    assert Pool.objects.get(name="lab").author_dry_runs is True
    refused = api_as(maintainer).post(
        "/api/v1/pools/", {"name": "lab2", "author_dry_runs": "perhaps"}, format="json"
    )
    assert refused.status_code == 400
    assert "author_dry_runs" in refused.json()
    client.force_login(maintainer)
    answer = client.post(
        "/pools/new/", {"name": "lab3", "max_concurrent_runs": 2, "author_dry_runs": "on"}
    )
    assert answer.status_code == 302
    assert Pool.objects.get(name="lab3").author_dry_runs is True
    page = client.get("/pools/lab3/").content.decode()
    assert "authors may start their proposals" in page


def test_a_pool_s_setting_changes_the_kept_page_without_touching_the_proposal(
    client: Any,
    contributor: User,
    recipe: Recipe,
    maintainer: User,
    settings: Any,
    django_capture_on_commit_callbacks: Any,
) -> None:
    """The page keeps what its reader may do per version of the proposal: a write of the
    pool its recipe goes to (its setting, its recipe list, its retirement) makes it fresh."""
    from django.core.cache import cache
    from django.utils import timezone

    settings.FRAGMENT_CACHE_SECONDS = 600
    cache.clear()
    pool = on_pool(recipe, maintainer)
    proposal = submitted(contributor, recipe)
    version = Proposal.objects.filter(pk=proposal.pk).values_list("updated_at").get()
    client.force_login(contributor)

    def button() -> bool:
        allowed_action_names_forget()
        return "Start a dry run" in client.get(f"/proposals/{proposal.pk}/").content.decode()

    def saved(**fields: Any) -> None:
        found = Pool.objects.get(pk=pool.pk)
        for name, value in fields.items():
            setattr(found, name, value)
        with django_capture_on_commit_callbacks(execute=True):
            found.save()

    assert not button()
    assert not button()  # now kept
    saved(author_dry_runs=True)
    assert button()
    saved(recipes=["another-recipe"])
    assert not button()
    saved(recipes=[recipe.name])
    assert button()
    saved(retired_at=timezone.now())
    assert not button()
    saved(retired_at=None)
    assert button()
    saved(author_dry_runs=False)
    assert not button()
    # The proposal itself was never written.
    assert Proposal.objects.filter(pk=proposal.pk).values_list("updated_at").get() == version


def test_the_default_executor_s_pool_makes_fresh_the_proposals_of_recipes_naming_none(
    client: Any,
    contributor: User,
    recipe: Recipe,
    maintainer: User,
    settings: Any,
    django_capture_on_commit_callbacks: Any,
) -> None:
    from django.core.cache import cache

    settings.FRAGMENT_CACHE_SECONDS = 600
    cache.clear()
    pool = make_pool(maintainer, name="lab", labels=[])
    Recipe.objects.filter(pk=recipe.pk).update(executor="")
    settings.RUNS_DEFAULT_EXECUTOR = pool.executor
    proposal = submitted(contributor, recipe)
    client.force_login(contributor)
    assert "Start a dry run" not in client.get(f"/proposals/{proposal.pk}/").content.decode()
    pool.author_dry_runs = True
    with django_capture_on_commit_callbacks(execute=True):
        pool.save()
    allowed_action_names_forget()
    assert "Start a dry run" in client.get(f"/proposals/{proposal.pk}/").content.decode()
