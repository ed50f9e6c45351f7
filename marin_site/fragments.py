"""Cached fragments of pages, for every reader, signed in or not.

The page cache (``pagecache.py``) keeps whole responses, so it can only serve anonymous
readers, and one write makes every page stale. Reviewers and maintainers are signed in: their
pages differ from everyone else's only in a few places (the header with their name, the CSRF
token, their controls, their own review). The rest of a page (a proposal card, a proposal's
description, reviews, timeline; an API row) is the same for everybody and is kept here.

A fragment is stored under its own name, with the *versions* of the rows it shows. A version
is a token per object (``("proposal", 12)``, ``("plan", 3)``), replaced by
``versions_bump`` after any transaction that changed what the object's fragments show
commits. A fragment is used only when every version stored with it is the current one, so
one write makes only that object's fragments stale. The order makes this safe: a page reads
the versions before it reads the rows it renders from, and a writer commits before it
replaces the version; a fragment rendered from rows older than a write is therefore stored
under a version older than that write's, and never matches again. A fragment shared by
every reader holds nothing about the reader. What is a reader's own (their page header, their
controls and forms on a proposal's page, their roles) is kept in fragments named after them,
keyed by all they show; no CSRF token is ever kept: ``{% fragment NAME csrf %}`` keeps a mark
that each response replaces with its own token.

A version that is not in the cache (first use, expiry, eviction) is created with
``cache.add`` as a new token, so a fragment never matches a version that went missing. ``FRAGMENT_CACHE_SECONDS`` bounds how long a
fragment may live if a write slipped past the bump (a bulk ``UPDATE`` sends no signal);
it is 0 (off) without a shared cache, as a per-process cache cannot see the worker's writes.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.db import transaction
from django.http import HttpRequest
from django.urls import reverse

VERSION_PREFIX = "fragment:version:"
FRAGMENT_PREFIX = "fragment:html:"

# A version may expire: the next reader creates a new one, which no stored fragment carries.
VERSION_SECONDS = 7 * 24 * 3600

Dependency = tuple[str, int]  # ("proposal", 12): an object whose version a fragment carries

_tokens = itertools.count()


def version_key(kind: str, pk: int) -> str:
    return f"{VERSION_PREFIX}{kind}:{pk}"


def _new_token() -> str:
    """A value no version of any object held before: time, process and a counter."""
    return f"{time.time_ns():x}.{os.getpid():x}.{next(_tokens):x}"


def versions_bump(kind: str, pks: Iterable[int | None]) -> None:
    """Make the fragments of these objects stale, once the current transaction commits."""
    keys = {version_key(kind, int(pk)) for pk in pks if pk is not None}
    if keys:
        transaction.on_commit(lambda: _bump(keys))


def _bump(keys: set[str]) -> None:
    token = _new_token()
    cache.set_many(dict.fromkeys(keys, token), timeout=VERSION_SECONDS)


def version_current(kind: str, pk: int) -> str:
    """The current version of one object (created when missing), for a cache of this process
    that must see a change made by any other: keep the value with the version it was read
    under, and read again once the version is another."""
    key = version_key(kind, pk)
    token = cache.get(key)
    if token is None:
        cache.add(key, _new_token(), timeout=VERSION_SECONDS)
        token = cache.get(key)
    return str(token or "")


def enabled() -> bool:
    return bool(settings.FRAGMENT_CACHE_SECONDS)


class Fragments:
    """The fragments one response may use, read from the cache in one round trip.

    ``wanted`` maps each fragment's name to the objects it shows. ``get`` answers a fragment
    whose stored versions are all current; ``put`` keeps a freshly rendered one, and ``save``
    writes them back in one round trip (call it once the response is rendered)."""

    def __init__(
        self,
        wanted: Mapping[str, Sequence[Dependency]],
        scope: str = "",
        shared: Mapping[str, Sequence[Dependency]] | None = None,
    ) -> None:
        """``scope`` prefixes the names of ``wanted`` (a page's sections); ``shared`` names
        fragments outside the scope (kept for other pages too), read in the same trip."""
        self._prefix = f"{FRAGMENT_PREFIX}{scope}:" if scope else FRAGMENT_PREFIX
        self._keys: dict[str, str] = {}
        self._stamps: dict[str, tuple[str, ...]] = {}
        self._found: dict[str, Any] = {}
        self._stored: dict[str, Any] = {}
        self._new: dict[str, tuple[tuple[str, ...] | None, Any]] = {}
        self.extend(wanted, shared)

    def extend(
        self,
        wanted: Mapping[str, Sequence[Dependency]],
        shared: Mapping[str, Sequence[Dependency]] | None = None,
    ) -> None:
        """Read (more) fragments and the versions they carry, in one round trip."""
        if not enabled() or not (wanted or shared):
            return
        self._keys |= {name: self._prefix + name for name in wanted}
        self._keys |= {name: FRAGMENT_PREFIX + name for name in shared or {}}
        wanted = {**wanted, **(shared or {})}
        version_keys = {version_key(kind, pk) for deps in wanted.values() for kind, pk in deps}
        fragment_keys = [self._keys[name] for name in wanted]
        found = cache.get_many([*version_keys, *fragment_keys])
        missing = version_keys - found.keys()
        if missing:
            for key in missing:
                cache.add(key, _new_token(), timeout=VERSION_SECONDS)
            found |= cache.get_many(list(missing))
        for name, deps in wanted.items():
            stamp = tuple(found.get(version_key(kind, pk)) or "" for kind, pk in deps)
            if "" in stamp:  # the cache refused the version: keep nothing under it
                continue
            self._stamps[name] = stamp
            stored = self._stored[name] = found.get(self._keys[name])
            if stored is not None and stored[0] == stamp:
                self._found[name] = stored[1]

    def refine(self, name: str, *values: object) -> None:
        """Also key a fragment by values read from the rows (after the versions): for a
        change that reaches the database without a signal (a queryset ``update()``, a
        ``bulk_create`` of timeline rows)."""
        stamp = self._stamps.get(name)
        if stamp is None:
            return
        stamp = self._stamps[name] = (*stamp, *(str(v) for v in values))
        stored = self._stored.get(name)
        if stored is not None and stored[0] == stamp:
            self._found[name] = stored[1]
        else:
            self._found.pop(name, None)

    def get(self, name: str) -> Any:
        """The fragment from the cache if current, or as ``put`` in this response; else None."""
        found = self._found.get(name)
        return found if found is not None else self.pending(name)

    def put(self, name: str, value: Any) -> None:
        """Keep a freshly rendered fragment for this response (``pending``), and for the
        cache when its versions were read."""
        self._new[name] = (self._stamps.get(name), value)

    def pending(self, name: str) -> Any:
        """A fragment ``put`` in this response and not saved yet."""
        entry = self._new.get(name)
        return entry[1] if entry is not None else None

    def get_or_render(self, name: str, render: Callable[[], Any]) -> Any:
        value = self.get(name)
        if value is None:
            value = render()
            self.put(name, value)
        return value

    def save(self) -> None:
        kept = {self._keys[n]: e for n, e in self._new.items() if e[0] is not None}
        if kept:
            cache.set_many(kept, timeout=settings.FRAGMENT_CACHE_SECONDS)
        self._new = {}

    @property
    def hits(self) -> int:
        return len(self._found)


def pk_url(view_name: str, request: HttpRequest | None = None) -> Callable[[int], str]:
    """``pk -> URL`` of a view whose one argument is ``pk``, reversing once, not per row."""
    marker = 2_147_483_647
    path = reverse(view_name, kwargs={"pk": marker})
    full = request.build_absolute_uri(path) if request is not None else path
    head, _, tail = full.rpartition(str(marker))
    return lambda pk: f"{head}{pk}{tail}"
