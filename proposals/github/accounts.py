"""GitHub users on the site: the account a GitHub user acts as, and the roles that
GITHUB_MAINTAINERS / GITHUB_REVIEWERS give.

Roles are bound to GitHub user ids, never to logins: each configured login is resolved once
to its id through the API (``github_roles_sync``, run by the outbox reconciler and before a
delivery needs it) and stored as a ``GitHubRoleGrant``. A comment from another account that
writes the same login in other letters, or that took a renamed maintainer's old login, has
another id and gets no role. When a login leaves the setting, its id loses the role.
"""

from __future__ import annotations

import logging
import re
from datetime import timedelta
from typing import Any

from allauth.socialaccount.models import SocialAccount
from django.conf import settings
from django.contrib.auth.models import Group, User
from django.db import IntegrityError, transaction
from django.utils import timezone
from github import GithubException

from marin_site.roles import ROLE_MAINTAINER, ROLE_REVIEWER, roles_forget
from proposals.github.client import github_client, sync_enabled
from proposals.models import GitHubRoleGrant

logger = logging.getLogger(__name__)

LOGIN_MAX_CHARS = 50  # GitHub's logins are at most 39; an app's bot adds "[bot]"
RESOLVE_RETRY = timedelta(minutes=10)  # between attempts to resolve a login GitHub refused


def github_login(user_data: Any) -> str:
    """The login of a payload's user object, as text fit for a label; "ghost" without one."""
    raw = user_data.get("login") if isinstance(user_data, dict) else None
    login = re.sub(r"[^A-Za-z0-9._\[\]-]", "", raw) if isinstance(raw, str) else ""
    return login[:LOGIN_MAX_CHARS] or "ghost"


def github_user_id(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and 0 < value < 2**63:
        return value
    if isinstance(value, str) and value.isdecimal() and 0 < int(value) < 2**63:
        return int(value)
    return None


def _configured() -> set[tuple[str, str]]:
    return {(ROLE_MAINTAINER, login.lower()) for login in settings.GITHUB_MAINTAINERS} | {
        (ROLE_REVIEWER, login.lower()) for login in settings.GITHUB_REVIEWERS
    }


def _users_with_github_id(github_id: int) -> list[User]:
    return [
        social.user
        for social in SocialAccount.objects.filter(provider="github", uid=str(github_id))
        .select_related("user")
        .order_by("pk")
    ]


def _grant(role: str, users: list[User]) -> None:
    group = Group.objects.get_or_create(name=role)[0]
    for user in users:
        user.groups.add(group)
        roles_forget(user)


def _revoke(role: str, users: list[User]) -> None:
    group = Group.objects.filter(name=role).first()
    for user in users:
        if group is not None:
            user.groups.remove(group)
        roles_forget(user)


def github_roles_sync(*, force: bool = False) -> dict[str, int]:
    """Make the stored grants match the settings: drop (and revoke) grants whose login left
    the setting, add new logins, resolve unresolved ones through GitHub's API, and give
    each resolved id's linked accounts the role. Safe to run often: GitHub is asked only
    about logins not yet resolved, at most every ``RESOLVE_RETRY`` each."""
    wanted = _configured()
    done = {"revoked": 0, "resolved": 0, "unresolved": 0}
    with transaction.atomic():
        for grant in GitHubRoleGrant.objects.select_for_update().order_by("pk"):
            if (grant.role, grant.login) not in wanted:
                if grant.github_id is not None:
                    _revoke(grant.role, _users_with_github_id(grant.github_id))
                grant.delete()
                done["revoked"] += 1
        known = set(GitHubRoleGrant.objects.values_list("role", "login"))
        GitHubRoleGrant.objects.bulk_create(
            [GitHubRoleGrant(role=role, login=login) for role, login in wanted - known],
            ignore_conflicts=True,
        )
    now = timezone.now()
    due = GitHubRoleGrant.objects.filter(github_id__isnull=True)
    if not force:
        due = due.exclude(checked_at__gt=now - RESOLVE_RETRY)
    client = github_client() if sync_enabled() and due.exists() else None
    for grant in due.order_by("pk"):
        github_id = None
        if client is not None:
            try:
                github_id = github_user_id(client.get_user(grant.login).id)
            except GithubException as exc:
                logger.warning("GitHub could not resolve the login %s: %s", grant.login, exc)
            except OSError as exc:  # GitHub out of reach: try again later
                logger.warning("GitHub out of reach resolving %s: %s", grant.login, exc)
        GitHubRoleGrant.objects.filter(pk=grant.pk).update(github_id=github_id, checked_at=now)
        done["resolved" if github_id else "unresolved"] += 1
    for grant in GitHubRoleGrant.objects.filter(github_id__isnull=False):
        assert grant.github_id is not None
        _grant(grant.role, _users_with_github_id(grant.github_id))
    return done


def _roles_of(github_id: int | None) -> list[str]:
    if github_id is None:
        return []
    if (
        GitHubRoleGrant.objects.filter(github_id__isnull=True)
        .exclude(checked_at__gt=timezone.now() - RESOLVE_RETRY)
        .exists()
        or len(_configured()) != GitHubRoleGrant.objects.count()
    ):
        github_roles_sync()
    return sorted(
        set(GitHubRoleGrant.objects.filter(github_id=github_id).values_list("role", flat=True))
    )


def github_account(*, login: str, github_id: int | str | None) -> User:
    """The site account of a GitHub user: linked by GitHub id, created on first sight.

    Accounts are never linked by matching usernames (anyone can take a login on GitHub);
    a site user who signs in with GitHub gets the same SocialAccount row, so the two meet.
    Roles come from the grants bound to the GitHub id (``github_roles_sync``).
    """
    login = github_login({"login": login})
    user_id = github_user_id(github_id)
    uid = str(user_id) if user_id is not None else f"login:{login.lower()}"
    social = SocialAccount.objects.filter(provider="github", uid=uid).select_related("user").first()
    if social is None:
        social = _social_account_create(uid=uid, login=login)
    elif social.extra_data.get("login") != login:
        social.extra_data = {**social.extra_data, "login": login}
        social.save(update_fields=["extra_data"])
    user = social.user
    roles = _roles_of(user_id)
    if roles:
        _grant_each(roles, user)
    return user


def _grant_each(roles: list[str], user: User) -> None:
    for role in roles:
        user.groups.add(Group.objects.get_or_create(name=role)[0])
    roles_forget(user)


def _social_account_create(*, uid: str, login: str) -> SocialAccount:
    """A new account for a GitHub user; two workers creating the same one meet at the
    unique (provider, uid) row, and the second uses the first's."""
    base = re.sub(r"[^\w.@+-]", "-", login)[:140] or "github-user"
    for attempt in range(1, 50):
        username = base if attempt == 1 else f"{base}-gh{attempt}"
        if User.objects.filter(username=username).exists():
            continue
        try:
            with transaction.atomic():
                user = User.objects.create_user(username=username)
                return SocialAccount.objects.create(
                    user=user, provider="github", uid=uid, extra_data={"login": login}
                )
        except IntegrityError:
            existing = SocialAccount.objects.filter(provider="github", uid=uid).first()
            if existing is not None:
                return existing
    raise RuntimeError(f"no free username for the GitHub login {login!r}")
