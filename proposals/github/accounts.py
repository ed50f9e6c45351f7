"""GitHub users on the site: the account a GitHub login acts as, and the roles its login
is given by GITHUB_MAINTAINERS / GITHUB_REVIEWERS."""

from __future__ import annotations

import re

from allauth.socialaccount.models import SocialAccount
from django.conf import settings
from django.contrib.auth.models import Group, User

from marin_site.roles import ROLE_MAINTAINER, ROLE_REVIEWER, roles_forget


def github_account(*, login: str, github_id: int | str | None) -> User:
    """The site account of a GitHub user: linked by GitHub id, created on first sight.

    Accounts are never linked by matching usernames (anyone can take a login on GitHub);
    a site user who signs in with GitHub gets the same SocialAccount row, so the two meet.
    Logins in GITHUB_MAINTAINERS / GITHUB_REVIEWERS get those roles.
    """
    uid = str(github_id if github_id is not None else f"login:{login}")
    social = SocialAccount.objects.filter(provider="github", uid=uid).select_related("user").first()
    if social is None:
        base = re.sub(r"[^\w.@+-]", "-", login)[:140] or "github-user"
        username = base
        suffix = 1
        while User.objects.filter(username=username).exists():
            suffix += 1
            username = f"{base}-gh{suffix if suffix > 2 else ''}"
        user = User.objects.create_user(username=username)
        social = SocialAccount.objects.create(
            user=user, provider="github", uid=uid, extra_data={"login": login}
        )
    elif social.extra_data.get("login") != login:
        social.extra_data = {**social.extra_data, "login": login}
        social.save(update_fields=["extra_data"])
    user = social.user
    roles = []
    if login.lower() in {m.lower() for m in settings.GITHUB_MAINTAINERS}:
        roles.append(ROLE_MAINTAINER)
    if login.lower() in {r.lower() for r in settings.GITHUB_REVIEWERS}:
        roles.append(ROLE_REVIEWER)
    for role in roles:
        user.groups.add(Group.objects.get_or_create(name=role)[0])
    if roles:
        roles_forget(user)
    return user
