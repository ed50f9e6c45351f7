"""Pool pages: public to read, a form for maintainers, tokens shown once to the owner, agents
revoked from the page; and the agent program and run client served as single files."""

from __future__ import annotations

import ast
import sys
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from runs.models import Run, RunState
from runs.pools import leases
from runs.pools.models import Agent, Pool, RegistrationToken
from tests.runs.pools.pool_helpers import ONE_RUN, make_agent, make_pool, offered_plan

pytestmark = pytest.mark.django_db


@pytest.fixture
def owner() -> User:
    return User.objects.create_user("olga", password="pw-olga-123")


def signed_in(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_the_pool_list_is_public_and_counts_its_runs(
    recipe: Any, owner: User, django_assert_max_num_queries: Any
) -> None:
    pool = make_pool(owner)
    offered_plan(recipe, pool)
    make_pool(owner, name="tpu", labels=["tpu:v5e-8"])

    with django_assert_max_num_queries(4):
        response = Client().get("/pools/")

    assert response.status_code == 200
    text = response.content.decode()
    assert "pool:gpu" in text and "pool:tpu" in text and "tpu:v5e-8" in text
    assert "/agent/marin-site-agent.py" in text


def test_the_pool_page_lists_agents_with_their_current_run(recipe: Any, owner: User) -> None:
    pool = make_pool(owner)
    offered_plan(recipe, pool, ONE_RUN)
    agent, credential = make_agent(pool, "gpu-box-7")
    lease = leases.lease_acquire(agent=agent)
    assert lease is not None

    response = Client().get(f"/pools/{pool.name}/")

    text = response.content.decode()
    assert response.status_code == 200
    assert "gpu-box-7" in text and f"run #{lease.run_id}" in text and "1.0" in text
    assert credential not in text
    assert "Registration tokens" not in text  # only the owner and maintainers see tokens
    assert "python3 marin-site-agent.py register --url" in text


def test_the_owner_gets_a_token_shown_once(owner: User) -> None:
    pool = make_pool(owner)
    client = signed_in(owner)

    response = client.post(f"/pools/{pool.name}/tokens/", {"note": "lab", "days": "3"})

    assert response.status_code == 201
    row = RegistrationToken.objects.get(pool=pool)
    text = response.content.decode()
    token = text.split('<code id="new-token">')[1].split("<")[0]
    assert token.startswith("mreg_") and row.prefix == token[:12]
    assert token not in client.get(f"/pools/{pool.name}/").content.decode()


def test_a_stranger_cannot_make_tokens_or_revoke_agents(owner: User) -> None:
    pool = make_pool(owner)
    agent, _ = make_agent(pool)
    stranger = signed_in(User.objects.create_user("mallory"))

    assert stranger.post(f"/pools/{pool.name}/tokens/", {}).status_code == 403
    assert stranger.post(f"/pools/{pool.name}/agents/{agent.pk}/revoke/").status_code == 403
    assert RegistrationToken.objects.filter(pool=pool).count() == 1  # make_agent's own
    assert Agent.objects.get(pk=agent.pk).revoked_at is None


def test_the_owner_revokes_an_agent_from_the_page(recipe: Any, owner: User) -> None:
    pool = make_pool(owner)
    offered_plan(recipe, pool, ONE_RUN)
    agent, _ = make_agent(pool)
    assert leases.lease_acquire(agent=agent) is not None

    response = signed_in(owner).post(f"/pools/{pool.name}/agents/{agent.pk}/revoke/")

    assert response.status_code == 302
    assert Agent.objects.get(pk=agent.pk).revoked_at is not None
    assert Run.objects.get().state == RunState.QUEUED


def test_a_maintainer_creates_a_pool_with_the_form(maintainer: Any, owner: User) -> None:
    client = signed_in(maintainer)

    refused = client.post(
        "/pools/new/", {"name": "lab", "max_concurrent_runs": 2, "recipes": "nope"}
    )
    created = client.post(
        "/pools/new/",
        {"name": "lab", "labels": "gpu:a5000, cuda:12", "max_concurrent_runs": 2, "owner": "olga"},
    )

    assert refused.status_code == 400 and "no recipe is named" in refused.content.decode()
    assert created.status_code == 302
    pool = Pool.objects.get(name="lab")
    assert (pool.owner, pool.labels, pool.max_concurrent_runs) == (
        owner,
        ["gpu:a5000", "cuda:12"],
        2,
    )


def test_a_contributor_cannot_open_the_pool_form(contributor: Any) -> None:
    assert signed_in(contributor).get("/pools/new/").status_code == 403


@pytest.mark.parametrize("name", ["marin-site-agent.py", "marin_run_client.py"])
def test_the_agent_and_the_client_are_served_as_standard_library_files(name: str) -> None:
    response = Client().get(f"/agent/{name}")

    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/x-python")
    source = response.getvalue().decode()
    imported = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            imported.add(node.module.split(".")[0])
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}, imported


def test_every_page_links_the_agent_program() -> None:
    text = Client().get("/").content.decode()

    assert 'href="/agent/marin-site-agent.py"' in text
    assert 'href="/pools/"' in text


def test_a_run_page_shows_its_attempts_on_agents_and_its_pinned_code(
    recipe: Any, owner: User
) -> None:
    from tests.runs.pools.pool_helpers import expire

    pool = make_pool(owner)
    offered_plan(recipe, pool, ONE_RUN, git_ref="feedface" * 5)
    first, _ = make_agent(pool, "box-one")
    second, _ = make_agent(pool, "box-two")
    lease = leases.lease_acquire(agent=first)
    assert lease is not None
    expire(lease)
    leases.leases_expire_stale()
    assert leases.lease_acquire(agent=second) is not None

    text = Client().get(f"/runs/{lease.run_id}/").content.decode()

    assert "Attempts on agents" in text
    assert "box-one" in text and "box-two" in text and "lost" in text
    assert "feedfacefeedfac" in text
    assert "attempt 2 of 3" in text
