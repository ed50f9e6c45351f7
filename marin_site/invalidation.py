"""What a write makes stale: the one table of the site's caches, connected in one place.

Two caches keep what pages show (docs/architecture.md, "fragment" and "generation"):

- the page cache (``pagecache``) keeps whole public pages for readers who are not signed in,
  all of them stale at once when its *generation* is bumped;
- fragments (``fragments``) keep parts of pages, each stale when a *version* it carries (a
  proposal's, the list's, a reader's roles) is replaced.

Each app lists, in its own ``invalidation.py``, one ``Rule`` per model whose rows a page shows:
whether a write of it bumps the page generation, and which fragment versions it replaces
(``versions``: a function of the row written, and of the signal's arguments for the rare
rows that need them). ``register`` adds an app's rules (from its ``AppConfig.ready``) and
connects a receiver per rule; nothing else in the code bumps a version or the generation for
a row written through the ORM. ``tests/marin_site/test_invalidation.py`` renders the pages
and fails when a table a page reads has no rule (or a stated reason to need none).

**Bulk writes send no signal.** ``QuerySet.update()``, ``bulk_create()``, ``bulk_update()`` and
raw SQL skip ``post_save``: after one, in the same transaction, call
``rows_changed(Model, rows)`` with the rows (or their ids) written, which applies the model's
rule as a save would. Skip it only where the written fields are shown nowhere (a heartbeat),
and say so beside the write.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from django.apps import apps
from django.db import models
from django.db.models.signals import ModelSignal, post_delete, post_save

from marin_site import fragments, pagecache

Dependency = fragments.Dependency  # ("proposal", 12)
Versions = Callable[..., Iterable[Dependency]]

SAVE_AND_DELETE: tuple[ModelSignal, ...] = (post_save, post_delete)


@dataclass(frozen=True)
class Rule:
    """What a write of ``model`` (``"app_label.Model"``) makes stale, and why a page cares."""

    model: str
    why: str
    page: bool = True  # the page cache's generation: every cached public page
    versions: Versions | None = None  # fn(instance, signal=..., **kwargs) -> dependencies
    signals: tuple[ModelSignal, ...] = field(default=SAVE_AND_DELETE)

    def apply(self, *instances: Any, **kwargs: Any) -> None:
        """Make stale what these rows show, once the current transaction commits."""
        if self.page:
            pagecache.generation_bump()
        if self.versions is None:
            return
        by_kind: dict[str, set[int]] = {}
        for instance in instances:
            for kind, pk in self.versions(instance, **kwargs):
                if pk is not None:
                    by_kind.setdefault(kind, set()).add(int(pk))
        for kind, pks in by_kind.items():
            fragments.versions_bump(kind, pks)


_RULES: dict[str, list[Rule]] = {}


def register(app: str, *rules: Rule) -> None:
    """Add an app's rules and connect one receiver per rule and signal (from its ready()).
    A model may have a rule in each app whose pages show it (a recipe: its own pages, and
    the proposals made from it), at most one per app."""
    for rule in rules:
        model = apps.get_model(rule.model)
        uid = f"invalidate:{app}:{rule.model}"
        if any(uid == f"invalidate:{app}:{other.model}" for other in _RULES.get(app, [])):
            raise ValueError(f"{app} has two rules for {rule.model}: make them one")
        _RULES.setdefault(app, []).append(rule)
        for signal in rule.signals:
            signal.connect(_receiver(rule), sender=model, weak=False, dispatch_uid=uid)


def _receiver(rule: Rule) -> Callable[..., None]:
    def on_write(sender: Any, instance: Any, signal: ModelSignal, **kwargs: Any) -> None:
        rule.apply(instance, signal=signal, **kwargs)

    return on_write


def rules() -> dict[str, list[Rule]]:
    """Every app's rules: the table the docs print and the tests read."""
    return {app: list(found) for app, found in _RULES.items()}


def rules_for(model: type[models.Model]) -> list[Rule]:
    label = model._meta.label
    return [rule for found in _RULES.values() for rule in found if rule.model == label]


def rows_changed(model: type[models.Model], rows: Iterable[Any]) -> None:
    """A bulk write of ``rows`` (instances, or ids) went past the signals: apply the model's
    rule to each, as a save would have. Instances are fetched for the ids given."""
    found = rules_for(model)
    rows = list(rows)
    if not found or not rows:
        return
    ids = [row for row in rows if not isinstance(row, models.Model)]
    instances = [row for row in rows if isinstance(row, models.Model)]
    if ids and any(rule.versions is not None for rule in found):  # only a rule reading them
        instances += list(model._default_manager.filter(pk__in=ids))
    for rule in found:
        rule.apply(*instances, signal=post_save)
