"""One check of each role for both apps, and one permission name per action."""

from __future__ import annotations

from typing import Any

import pytest
import rules
from django.contrib.auth.models import AnonymousUser, Group

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
