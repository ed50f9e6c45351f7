"""The agents' door and the pools' API: what is accepted, and every refusal (401, 403, 409,
413, 400 naming the field), with nothing stored from a refused request."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.utils import timezone
from rest_framework.test import APIClient

from runs import tokens
from runs.models import Run, RunEvent, RunState
from runs.pools import leases, services
from runs.pools.models import Agent, Lease, Pool, RegistrationToken
from tests.runs.pools.pool_helpers import ONE_RUN, expire, make_agent, make_pool, offered_plan

pytestmark = pytest.mark.django_db

REGISTER = "/api/v1/agent/register/"
POLL = "/api/v1/agent/poll/"


def renew_url(lease_id: int) -> str:
    return f"/api/v1/agent/leases/{lease_id}/renew/"


def report_url(lease_id: int) -> str:
    return f"/api/v1/agent/leases/{lease_id}/report/"


def bearer(token: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


@pytest.fixture
def owner() -> User:
    return User.objects.create_user("olga")


@pytest.fixture
def pool(owner: User) -> Pool:
    return make_pool(owner)


def stored() -> tuple[int, int, int, int]:
    return (
        Agent.objects.count(),
        Lease.objects.filter(ended_at__isnull=False).count(),
        RunEvent.objects.count(),
        Run.objects.exclude(state=RunState.QUEUED).count(),
    )


# --- registration ------------------------------------------------------------------------


def test_a_registration_token_turns_into_a_credential_stored_hashed(pool: Pool) -> None:
    _row, token = services.registration_token_create(actor=pool.owner, pool_id=pool.pk)

    response = bearer(token).post(
        REGISTER, {"name": "gpu-box-1", "labels": ["gpu:a5000"], "version": "1.0"}, format="json"
    )

    assert response.status_code == 201, response.json()
    body = response.json()
    agent = Agent.objects.get(pk=body["agent"]["id"])
    assert (agent.name, agent.labels, agent.version, agent.pool) == (
        "gpu-box-1",
        ["gpu:a5000"],
        "1.0",
        pool,
    )
    assert body["credential"].startswith("magent_")
    assert body["credential"] not in agent.credential_hash
    assert agent.credential_hash == tokens.token_hash(body["credential"])
    assert RegistrationToken.objects.get(pool=pool).uses == 1


@pytest.mark.parametrize("state", ["unknown", "expired", "revoked", "retired"])
def test_a_bad_registration_token_is_refused_with_401(pool: Pool, state: str) -> None:
    row, token = services.registration_token_create(actor=pool.owner, pool_id=pool.pk)
    if state == "unknown":
        token = "mreg_" + "x" * 43
    elif state == "expired":
        RegistrationToken.objects.filter(pk=row.pk).update(
            expires_at=timezone.now() - timedelta(seconds=1)
        )
    elif state == "revoked":
        services.registration_token_revoke(actor=pool.owner, token_id=row.pk)
    else:
        Pool.objects.filter(pk=pool.pk).update(retired_at=timezone.now())

    response = bearer(token).post(REGISTER, {"name": "box"}, format="json")

    assert response.status_code == 401
    assert not Agent.objects.exists()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "name"),
        ({"name": ""}, "name"),
        ({"name": "x" * 256}, "name"),
        ({"name": "bad\x1bname"}, "name"),
        ({"name": "box", "labels": "gpu a5000"}, "labels"),
        ({"name": "box", "labels": [1, 2]}, "labels"),
        ({"name": "box", "labels": ["ok"] * 33}, "labels"),
        ({"name": "box", "version": "1.0; rm -rf"}, "version"),
    ],
)
def test_a_malformed_registration_is_refused_naming_the_field(
    pool: Pool, body: dict[str, Any], field: str
) -> None:
    _row, token = services.registration_token_create(actor=pool.owner, pool_id=pool.pk)

    response = bearer(token).post(REGISTER, body, format="json")

    assert response.status_code == 400
    assert list(response.json()) == [field]
    assert not Agent.objects.exists()


# --- polling -----------------------------------------------------------------------------


def test_a_poll_without_work_answers_204(pool: Pool) -> None:
    _agent, credential = make_agent(pool)

    response = bearer(credential).post(POLL, {"wait": 0}, format="json")

    assert response.status_code == 204


def test_a_poll_with_work_answers_the_lease_and_the_job(recipe: Any, pool: Pool) -> None:
    offered_plan(recipe, pool, ONE_RUN)
    agent, credential = make_agent(pool)

    response = bearer(credential).post(POLL, {"wait": 0}, format="json")

    assert response.status_code == 200, response.content
    offer = response.json()
    run = Run.objects.get(pk=offer["run"]["id"])
    assert run.state == RunState.RUNNING
    assert offer["lease"]["id"] == Lease.objects.get(agent=agent).pk
    assert offer["job"]["env"]["RUN_TOKEN"] == tokens.run_token(run=run)
    assert offer["job"]["argv"][0] == "{python}"


@pytest.mark.parametrize("header", ["", "Bearer", "Bearer magent_nope", "Token abc"])
def test_a_poll_with_a_missing_or_unknown_credential_is_refused_with_401(
    recipe: Any, pool: Pool, header: str
) -> None:
    offered_plan(recipe, pool, ONE_RUN)
    client = APIClient()
    if header:
        client.credentials(HTTP_AUTHORIZATION=header)

    response = client.post(POLL, {"wait": 0}, format="json")

    assert response.status_code == 401
    assert response["WWW-Authenticate"] == 'Bearer realm="agent"'
    assert not Lease.objects.exists()


def test_a_revoked_agent_is_refused_and_its_run_requeued(recipe: Any, pool: Pool) -> None:
    offered_plan(recipe, pool, ONE_RUN)
    agent, credential = make_agent(pool)
    lease = bearer(credential).post(POLL, {"wait": 0}, format="json").json()["lease"]
    client = APIClient()
    client.force_authenticate(pool.owner)

    revoked = client.post(f"/api/v1/agents/{agent.pk}/revoke/")

    assert revoked.status_code == 200, revoked.content
    run = Run.objects.get()
    assert (run.state, run.attempt) == (RunState.QUEUED, 2)
    assert bearer(credential).post(POLL, {"wait": 0}, format="json").status_code == 401
    assert bearer(credential).post(renew_url(lease["id"]), {}, format="json").status_code == 401


def test_only_the_owner_or_a_maintainer_revokes_an_agent(pool: Pool) -> None:
    agent, _ = make_agent(pool)
    client = APIClient()
    client.force_authenticate(User.objects.create_user("mallory"))

    response = client.post(f"/api/v1/agents/{agent.pk}/revoke/")

    assert response.status_code == 403
    assert Agent.objects.get(pk=agent.pk).revoked_at is None


@pytest.mark.parametrize("wait", [-1, 61, "10", None, True])
def test_a_poll_with_a_bad_wait_is_refused_naming_it(pool: Pool, wait: Any) -> None:
    _agent, credential = make_agent(pool)

    response = bearer(credential).post(POLL, {"wait": wait}, format="json")

    assert response.status_code == 400
    assert list(response.json()) == ["wait"]


# --- renewing and reporting --------------------------------------------------------------


@pytest.fixture
def leased(recipe: Any, pool: Pool) -> tuple[Lease, str]:
    offered_plan(recipe, pool, ONE_RUN)
    agent, credential = make_agent(pool)
    lease = leases.lease_acquire(agent=agent)
    assert lease is not None
    return lease, credential


def test_a_renewal_answers_whether_to_stop(leased: tuple[Lease, str]) -> None:
    lease, credential = leased

    response = bearer(credential).post(renew_url(lease.pk), {"log_tail": "step 1\n"}, format="json")

    assert response.status_code == 200
    assert response.json()["cancel_requested"] is False
    assert Lease.objects.get(pk=lease.pk).log_tail == "step 1\n"


def test_an_oversize_log_tail_is_refused_with_413_and_not_stored(
    leased: tuple[Lease, str], settings: Any
) -> None:
    lease, credential = leased
    settings.RUNS_AGENT_LOG_TAIL_BYTES = 1000
    before = Lease.objects.get(pk=lease.pk).expires_at

    renewed = bearer(credential).post(renew_url(lease.pk), {"log_tail": "é" * 501}, format="json")
    reported = bearer(credential).post(
        report_url(lease.pk),
        {"outcome": "exited", "exit_code": 0, "log_tail": "x" * 1001},
        format="json",
    )

    assert (renewed.status_code, reported.status_code) == (413, 413)
    row = Lease.objects.get(pk=lease.pk)
    assert (row.log_tail, row.expires_at, row.ended_at) == ("", before, None)
    assert Run.objects.get(pk=lease.run_id).state == RunState.RUNNING


def test_a_renewal_after_the_lease_expired_is_refused_with_409(leased: tuple[Lease, str]) -> None:
    lease, credential = leased
    expire(lease)

    response = bearer(credential).post(renew_url(lease.pk), {}, format="json")

    assert response.status_code == 409
    assert Run.objects.get(pk=lease.run_id).state == RunState.QUEUED


def test_another_agent_s_lease_is_refused_with_403(leased: tuple[Lease, str], pool: Pool) -> None:
    lease, _ = leased
    _other, credential = make_agent(pool, "host-b")

    renewed = bearer(credential).post(renew_url(lease.pk), {}, format="json")
    reported = bearer(credential).post(
        report_url(lease.pk), {"outcome": "exited", "exit_code": 0}, format="json"
    )

    assert (renewed.status_code, reported.status_code) == (403, 403)
    assert Lease.objects.get(pk=lease.pk).ended_at is None


def test_an_unknown_lease_is_404(pool: Pool) -> None:
    _agent, credential = make_agent(pool)

    assert bearer(credential).post(renew_url(999999), {}, format="json").status_code == 404


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "outcome"),
        ({"outcome": "done"}, "outcome"),
        ({"outcome": "exited"}, "exit_code"),
        ({"outcome": "exited", "exit_code": "0"}, "exit_code"),
        ({"outcome": "exited", "exit_code": 999}, "exit_code"),
        ({"outcome": "exited", "signal": 0}, "signal"),
        ({"outcome": "exited", "exit_code": 0, "oom_kills": -1}, "oom_kills"),
        ({"outcome": "exited", "exit_code": 0, "message": ["x"]}, "message"),
        ({"outcome": "exited", "exit_code": 0, "log_tail": 5}, "log_tail"),
        ({"outcome": "exited", "exit_code": 0, "surprise": 1}, "surprise"),
    ],
)
def test_a_malformed_report_is_refused_naming_the_field_and_stores_nothing(
    leased: tuple[Lease, str], body: dict[str, Any], field: str
) -> None:
    lease, credential = leased
    before = stored()

    response = bearer(credential).post(report_url(lease.pk), body, format="json")

    assert response.status_code == 400
    assert field in response.json()
    assert stored() == before


def test_a_report_finishes_the_run(leased: tuple[Lease, str]) -> None:
    lease, credential = leased

    response = bearer(credential).post(
        report_url(lease.pk), {"outcome": "exited", "exit_code": 0}, format="json"
    )

    assert response.status_code == 200
    assert response.json()["state"] == RunState.FINISHED
    again = bearer(credential).post(
        report_url(lease.pk), {"outcome": "exited", "exit_code": 1}, format="json"
    )
    assert again.status_code == 409  # a lease is reported once
    assert Run.objects.get(pk=lease.run_id).events.filter(verb="finished").count() == 1


def test_a_late_report_of_a_lost_lease_is_refused_with_409(leased: tuple[Lease, str]) -> None:
    lease, credential = leased
    expire(lease)
    leases.leases_expire_stale()
    before = stored()

    response = bearer(credential).post(
        report_url(lease.pk), {"outcome": "exited", "exit_code": 0}, format="json"
    )

    assert response.status_code == 409
    assert stored() == before
    assert Run.objects.get(pk=lease.run_id).state == RunState.QUEUED


# --- the job's own token after its lease was lost ------------------------------------------


def test_a_job_of_a_lost_lease_is_told_409_for_anything_it_sends(
    leased: tuple[Lease, str], pool: Pool
) -> None:
    lease, _ = leased
    old_token = tokens.run_token(run=Run.objects.get(pk=lease.run_id))
    expire(lease)
    leases.leases_expire_stale()
    other, _ = make_agent(pool, "host-b")
    assert leases.lease_acquire(agent=other) is not None  # attempt 2 runs elsewhere now
    job = bearer(old_token)
    base = f"/api/v1/runs/{lease.run_id}/"

    metrics = job.post(
        base + "metrics/", {"points": [{"key": "a", "step": 1, "value": 1.0}]}, format="json"
    )
    heartbeat = job.post(base + "heartbeat/", {}, format="json")
    status = job.post(base + "status/", {"state": "finished"}, format="json")

    assert (metrics.status_code, heartbeat.status_code, status.status_code) == (409, 409, 409)
    assert "attempt 1" in status.json()["detail"]
    run = Run.objects.get(pk=lease.run_id)
    assert (run.state, run.attempt) == (RunState.RUNNING, 2)
    assert not run.points.exists()


def test_another_run_s_token_is_refused_with_403(leased: tuple[Lease, str], recipe: Any) -> None:
    lease, _ = leased
    other = Run.objects.exclude(pk=lease.run_id).first() or Run.objects.get(pk=lease.run_id)
    token = tokens.run_token(run=Run.objects.get(pk=lease.run_id))

    response = bearer(token).post(f"/api/v1/runs/{other.pk + 1000}/heartbeat/", {}, format="json")

    assert response.status_code == 403


# --- pools through the API -----------------------------------------------------------------


def test_a_maintainer_creates_a_pool_for_its_owner(maintainer: Any, owner: User) -> None:
    client = APIClient()
    client.force_authenticate(maintainer)

    response = client.post(
        "/api/v1/pools/",
        {
            "name": "lab-tpus",
            "labels": ["tpu:v5e-8"],
            "recipes": ["tiny-moe"],
            "max_concurrent_runs": 2,
            "owner": "olga",
        },
        format="json",
    )

    assert response.status_code == 400  # no recipe named tiny-moe yet
    assert list(response.json()) == ["recipes"]
    response = client.post(
        "/api/v1/pools/",
        {"name": "lab-tpus", "labels": ["tpu:v5e-8"], "owner": "olga"},
        format="json",
    )
    assert response.status_code == 201, response.json()
    assert response.json()["executor"] == "pool:lab-tpus"
    assert Pool.objects.get(name="lab-tpus").owner == owner


def test_a_contributor_cannot_create_a_pool(contributor: Any) -> None:
    client = APIClient()
    client.force_authenticate(contributor)

    response = client.post("/api/v1/pools/", {"name": "mine"}, format="json")

    assert response.status_code == 403
    assert not Pool.objects.exists()


def test_the_owner_gets_a_registration_token_shown_once(pool: Pool) -> None:
    client = APIClient()
    client.force_authenticate(pool.owner)

    response = client.post(f"/api/v1/pools/{pool.name}/tokens/", {"note": "lab"}, format="json")

    assert response.status_code == 201
    token = response.json()["token"]
    row = RegistrationToken.objects.get(pool=pool)
    assert row.token_hash == tokens.token_hash(token)
    assert token not in str(client.get(f"/api/v1/pools/{pool.name}/").json())
    stranger = APIClient()
    stranger.force_authenticate(User.objects.create_user("mallory"))
    refused = stranger.post(f"/api/v1/pools/{pool.name}/tokens/", {}, format="json")
    assert refused.status_code == 403
    assert RegistrationToken.objects.count() == 1


def test_pools_and_their_agents_are_public_to_read(recipe: Any, pool: Pool) -> None:
    offered_plan(recipe, pool, ONE_RUN)
    agent, _ = make_agent(pool)
    lease = leases.lease_acquire(agent=agent)
    assert lease is not None

    listed = APIClient().get("/api/v1/pools/")
    agents = APIClient().get(f"/api/v1/pools/{pool.name}/agents/")

    assert listed.status_code == 200
    assert [p["name"] for p in listed.json()["results"]] == ["gpu"]
    assert agents.json()[0]["current_run"] == lease.run_id
    assert "credential" not in str(agents.json())
