"""The site's roles and the one check of each, shared by both apps' permission rules.

Roles are Django groups: ``reviewer`` and ``maintainer`` (a maintainer is also a reviewer;
a superuser is a maintainer). Any signed-in, active user is a contributor. The predicates
below are django-rules predicates; ``proposals/permissions.py`` and ``runs/permissions.py``
build their named permissions from them, and ``permission_require`` is how a service asks.

A user's group names are read once per user object and, with a shared cache, kept there as
a fragment (``marin_site/fragments.py``) under the user's ``roles`` version, which every
change of their groups replaces once it commits (``proposals/receivers.py``: a membership
added, removed or cleared from either side, a group renamed or deleted). Being active and
being a superuser are read from the user's row on every request, never kept.
"""

from __future__ import annotations

from typing import Any

import rules

from marin_site import fragments
from marin_site.errors import ActionForbidden

ROLE_CONTRIBUTOR = "contributor"
ROLE_REVIEWER = "reviewer"
ROLE_MAINTAINER = "maintainer"
ROLES = (ROLE_CONTRIBUTOR, ROLE_REVIEWER, ROLE_MAINTAINER)
_CACHE = "_marin_roles"
_FRESH = "_marin_roles_fresh"  # groups changed in this transaction: read them, not the cache
ROLES_VERSION = "roles"  # the fragments' version kind of a user's groups


def role_names(user: Any, page: fragments.Fragments | None = None) -> frozenset[str]:
    """The user's role groups, read once per user object; from a page's ``Fragments`` that
    read ``roles_kept(user)`` with its own, if given (no round trip of their own)."""
    if not getattr(user, "is_authenticated", False) or not user.is_active:
        return frozenset()
    cached = getattr(user, _CACHE, None)
    if cached is None:
        cached = frozenset(_group_names(user, page))
        if user.is_superuser:
            cached |= {ROLE_MAINTAINER}
        setattr(user, _CACHE, cached)
    return cached


def roles_kept(user: Any) -> dict[str, list[fragments.Dependency]]:
    """The fragment of the user's kept roles, for a page to read with its own (``shared``)."""
    if not getattr(user, "is_authenticated", False):
        return {}
    return {_kept_name(user): [(ROLES_VERSION, user.pk)]}


def _kept_name(user: Any) -> str:
    return f"user:{user.pk}:groups"


def _group_names(user: Any, page: fragments.Fragments | None) -> list[str]:
    def read() -> list[str]:
        return sorted(user.groups.values_list("name", flat=True))

    if getattr(user, _FRESH, False) or not fragments.enabled():
        return read()
    if page is not None:  # kept by the page's save()
        return list(page.get_or_render(_kept_name(user), read))
    kept = fragments.Fragments({}, shared=roles_kept(user))
    names: list[str] = kept.get_or_render(_kept_name(user), read)
    kept.save()
    return names


def roles_forget(user: Any) -> None:
    """Forget the roles read for this user object (after its groups changed): it reads them
    from the database from now on, as the shared cache learns of the change only at commit."""
    if hasattr(user, _CACHE):
        delattr(user, _CACHE)
    setattr(user, _FRESH, True)


def roles_changed(user_ids: Any) -> None:
    """These users' groups changed: their kept roles are stale once this transaction commits."""
    fragments.versions_bump(ROLES_VERSION, user_ids)


@rules.predicate
def is_contributor(user: Any) -> bool:
    return bool(getattr(user, "is_authenticated", False) and user.is_active)


@rules.predicate
def is_maintainer(user: Any) -> bool:
    return ROLE_MAINTAINER in role_names(user)


@rules.predicate
def is_reviewer(user: Any) -> bool:
    return bool(role_names(user) & {ROLE_REVIEWER, ROLE_MAINTAINER})


def permission_require(actor: Any, permission: str, obj: Any, what: str) -> None:
    """Raise ActionForbidden unless ``actor`` has ``permission`` on ``obj``.

    ``what`` completes "You do not have permission to ...". A missing actor (``None``) is
    asked as an anonymous visitor would be.
    """
    if actor is None:
        from django.contrib.auth.models import AnonymousUser

        actor = AnonymousUser()
    if not actor.has_perm(permission, obj):
        raise ActionForbidden(f"You do not have permission to {what}.")
