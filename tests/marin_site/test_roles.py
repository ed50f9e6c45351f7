"""One check of each role for both apps, and one permission name per action."""

from __future__ import annotations

from typing import Any

import pytest
import rules
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AnonymousUser, Group
from django.core.cache import cache

from marin_site.roles import is_maintainer, role_names, roles_forget
from proposals import permissions as perms
from runs import permissions as run_perms
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db

MAINTAINER_PERMISSIONS = (
    perms.APPROVE,
    perms.REJECT,
    perms.CANCEL,
    perms.HOLD,
    perms.RECORD_OUTCOME,
    perms.MANAGE_GITHUB_SYNC,
    run_perms.RERUN_RUN,
    run_perms.RETRY_RUN,
    run_perms.IMPORT_METRICS,
    run_perms.MANAGE_RECIPES,
)


def _people() -> dict[str, Any]:
    inactive = UserFactory.create(username="gone", roles=["maintainer"])
    inactive.is_active = False
    inactive.save()
    return {
        "anonymous": AnonymousUser(),
        "contributor": UserFactory.create(username="carl", roles=["contributor"]),
        "reviewer": UserFactory.create(username="rev", roles=["reviewer"]),
        "maintainer": UserFactory.create(username="mai", roles=["maintainer"]),
        "superuser": UserFactory.create(username="root", is_superuser=True),
        "inactive maintainer": inactive,
    }


def test_both_apps_ask_the_one_maintainer_check() -> None:
    for name, user in _people().items():
        expected = name in {"maintainer", "superuser"}
        assert is_maintainer(user) is expected, name
        for permission in MAINTAINER_PERMISSIONS:
            assert user.has_perm(permission, None) is expected, (name, permission)


def test_rerun_has_one_permission_name() -> None:
    assert rules.perm_exists(run_perms.RERUN_RUN)
    assert not rules.perm_exists("proposals.rerun_proposal")


def test_roles_are_read_once_per_user_object_until_forgotten() -> None:
    user = UserFactory.create(username="newbie", roles=["contributor"])
    assert not is_maintainer(user)
    user.groups.add(Group.objects.get_or_create(name="maintainer")[0])
    assert "maintainer" not in role_names(user)  # read once
    roles_forget(user)
    assert is_maintainer(user)


@pytest.fixture
def kept_roles(settings: Any) -> None:
    """Roles kept in the cache, as with the shared cache in production."""
    settings.FRAGMENT_CACHE_SECONDS = 600
    cache.clear()


def _fresh(user: Any) -> Any:
    """The user as the next request loads it (no roles read on the object yet)."""
    return get_user_model().objects.get(pk=user.pk)


@pytest.mark.usefixtures("kept_roles")
def test_kept_roles_are_read_without_a_query_and_follow_every_change_of_groups(
    django_capture_on_commit_callbacks: Any, django_assert_num_queries: Any
) -> None:
    user = UserFactory.create(username="newbie", roles=["contributor"])
    maintainers = Group.objects.get_or_create(name="maintainer")[0]

    def committed(change: Any) -> None:
        with django_capture_on_commit_callbacks(execute=True):
            change()

    assert not is_maintainer(_fresh(user))
    fresh = _fresh(user)
    with django_assert_num_queries(0):
        assert not is_maintainer(fresh)  # kept
    changes = [
        (lambda: user.groups.add(maintainers), True),
        (lambda: maintainers.user_set.remove(user), False),
        (lambda: maintainers.user_set.add(user), True),
        (maintainers.user_set.clear, False),
        (lambda: user.groups.set([maintainers]), True),
        (user.groups.clear, False),
    ]
    for change, expected in changes:
        committed(change)
        assert is_maintainer(_fresh(user)) is expected
        assert is_maintainer(_fresh(user)) is expected  # and kept so

    committed(lambda: user.groups.add(maintainers))
    assert is_maintainer(_fresh(user))
    maintainers.name = "former-maintainer"
    committed(maintainers.save)
    assert not is_maintainer(_fresh(user))
    maintainers.name = "maintainer"
    committed(maintainers.save)
    assert is_maintainer(_fresh(user))
    committed(maintainers.delete)
    assert not is_maintainer(_fresh(user))


@pytest.mark.usefixtures("kept_roles")
def test_being_active_or_a_superuser_is_never_kept() -> None:
    user = UserFactory.create(username="boss", roles=["maintainer"])
    assert is_maintainer(_fresh(user))
    get_user_model().objects.filter(pk=user.pk).update(is_active=False)
    assert not is_maintainer(_fresh(user))
    get_user_model().objects.filter(pk=user.pk).update(is_active=True, is_superuser=True)
    user.groups.clear()  # not committed: the kept groups still say maintainer
    assert is_maintainer(_fresh(user))  # a superuser all the same


@pytest.mark.usefixtures("kept_roles")
def test_a_forgotten_user_reads_its_roles_before_the_change_commits() -> None:
    user = UserFactory.create(username="granted", roles=["contributor"])
    assert not is_maintainer(user)
    user.groups.add(Group.objects.get_or_create(name="maintainer")[0])
    roles_forget(user)  # as the GitHub role sync does, inside its transaction
    assert is_maintainer(user)
