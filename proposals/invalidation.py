"""What a write of a row of proposals/ (or one its pages show) makes stale.

The table of ``marin_site.invalidation``, for this app: registered from ``ProposalsConfig.ready``.
A proposal's fragments (its card, its API row, its page's sections) carry its version
(``("proposal", pk)``); the list's count and pages carry ``LIST_VERSION``; a reader's own parts
carry their follows and their roles.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.contrib.auth import get_user_model
from django.db.models import Q
from django.db.models.signals import m2m_changed, post_save, pre_delete, pre_save

from marin_site.fragments import Dependency
from marin_site.invalidation import Rule
from marin_site.roles import ROLES_VERSION
from proposals.models import Proposal
from proposals.selectors import LIST_VERSION
from runs.models import RunEvent

PROPOSAL = "proposal"


def _the_proposal(instance: Any, **kwargs: Any) -> Iterable[Dependency]:
    """The proposal a row belongs to (a review, comment, amendment, event)."""
    return [(PROPOSAL, instance.proposal_id)]


def _proposal_and_list(instance: Proposal, **kwargs: Any) -> Iterable[Dependency]:
    """A proposal's own fragments, and the list's (what a filter finds, and how many)."""
    return [(PROPOSAL, instance.pk), LIST_VERSION]


def _part_and_list(instance: Any, **kwargs: Any) -> Iterable[Dependency]:
    return [(PROPOSAL, instance.proposal_id), LIST_VERSION]


def _proposals_with_label(label_id: int) -> list[int]:
    through = Proposal.labels.through.objects
    return list(through.filter(label_id=label_id).values_list("proposal_id", flat=True))


def _labelling(
    instance: Any, *, action: str, reverse: bool, pk_set: Any, **kwargs: Any
) -> Iterable[Dependency]:
    """proposal.labels.add/remove/set/clear, or the same from a label's side."""
    if not reverse:
        return [(PROPOSAL, instance.pk), LIST_VERSION] if action.startswith("post_") else []
    if action == "pre_clear":  # label.proposals.clear(): the proposals it had
        return [(PROPOSAL, pk) for pk in _proposals_with_label(instance.pk)] + [LIST_VERSION]
    if action.startswith("post_") and pk_set:  # label.proposals.add/remove
        return [(PROPOSAL, pk) for pk in pk_set] + [LIST_VERSION]
    return []


def _labelled(instance: Any, **kwargs: Any) -> Iterable[Dependency]:
    """A renamed or deleted label changes every card that shows it."""
    return [(PROPOSAL, pk) for pk in _proposals_with_label(instance.pk)] + [LIST_VERSION]


def _follower(instance: Any, **kwargs: Any) -> Iterable[Dependency]:
    """What a proposal page keeps for its reader says whether they follow it."""
    return [("reader-follows", instance.user_id)]


def _recipe_shown(instance: Any, **kwargs: Any) -> Iterable[Dependency]:
    """A proposal shows its recipe's name and a plan preview computed from the recipe; the
    list filters by its name."""
    proposals = Proposal.objects.filter(recipe_id=instance.pk).values_list("pk", flat=True)
    return [(PROPOSAL, pk) for pk in proposals] + [LIST_VERSION]


def _pool_shown(instance: Any, **kwargs: Any) -> Iterable[Dependency]:
    """Whether a proposal's author may start its dry run reads the pool its recipe goes to
    (``runs.selectors.recipe_author_dry_runs_allowed``: the pool's ``author_dry_runs``, its
    recipe list, whether it is retired), and its page keeps what its reader may do per
    version of the proposal: a pool written (or renamed: its stored name too) makes the
    proposals of the recipes naming it, or of every recipe naming none when it is the
    site's default executor, fresh."""
    from django.conf import settings

    from runs.pools.models import Pool
    from runs.validators import POOL_PREFIX

    names = {instance.name}
    if instance.pk is not None:
        names |= set(Pool.objects.filter(pk=instance.pk).values_list("name", flat=True))
    executors = {POOL_PREFIX + name for name in names}
    query = Q(recipe__executor__in=executors)
    if settings.RUNS_DEFAULT_EXECUTOR in executors:
        query |= Q(recipe__executor="")
    proposals = Proposal.objects.filter(query).values_list("pk", flat=True)
    return [(PROPOSAL, pk) for pk in proposals]


def _renamed(instance: Any, *, update_fields: Any = None, **kwargs: Any) -> Iterable[Dependency]:
    """A username is shown on the proposals the user wrote, reviewed, commented and acted on;
    a rename (rare) makes them all fresh, and the list (it filters by author)."""
    user_model = type(instance)
    name = user_model.USERNAME_FIELD
    if instance.pk is None or (update_fields is not None and name not in update_fields):
        return []  # a new user, or a save of other fields (the last login)
    before = user_model.objects.filter(pk=instance.pk).values_list(name, flat=True).first()
    if before is None or before == getattr(instance, name):
        return []
    touched = Proposal.objects.filter(
        Q(author=instance.pk)
        | Q(reviews__reviewer=instance.pk)
        | Q(comments__author=instance.pk)
        | Q(events__actor=instance.pk)
        | Q(amendments__author=instance.pk)
    ).values_list("pk", flat=True)
    plans = RunEvent.objects.filter(actor=instance.pk).values_list("run__plan_id", flat=True)
    of_runs = Proposal.objects.filter(plan_id__in=plans).values_list("pk", flat=True)
    return [(PROPOSAL, pk) for pk in {*touched, *of_runs}] + [LIST_VERSION]


def _group_members(group_id: int) -> list[int]:
    through = get_user_model().groups.through.objects
    return list(through.filter(group_id=group_id).values_list("user_id", flat=True))


def _memberships(
    instance: Any, *, action: str, reverse: bool, pk_set: Any, **kwargs: Any
) -> Iterable[Dependency]:
    """Who is in which group, changed from either side: those users' kept roles are stale."""
    if not reverse:  # user.groups.add/remove/set/clear
        return [(ROLES_VERSION, instance.pk)] if action.startswith("post_") else []
    if action == "pre_clear":  # group.user_set.clear(): the users it had
        return [(ROLES_VERSION, pk) for pk in _group_members(instance.pk)]
    if action.startswith("post_") and pk_set:  # group.user_set.add/remove
        return [(ROLES_VERSION, pk) for pk in pk_set]
    return []


def _group_of(instance: Any, **kwargs: Any) -> Iterable[Dependency]:
    """A renamed or deleted group changes the roles of everyone in it."""
    return [(ROLES_VERSION, pk) for pk in _group_members(instance.pk)]


def _user_through() -> str:
    return get_user_model().groups.through._meta.label


RULES = (
    Rule(
        "proposals.Proposal",
        "every page of a proposal, its card, the list",
        versions=_proposal_and_list,
    ),
    Rule("proposals.Review", "the proposal's reviews, its card's score", versions=_part_and_list),
    Rule("proposals.Comment", "the proposal's discussion", versions=_part_and_list),
    Rule("proposals.Amendment", "the proposal's amendments", versions=_part_and_list),
    Rule("proposals.Event", "the proposal's timeline", versions=_part_and_list),
    Rule(
        "proposals.Label",
        "the labels on cards and pages",
        versions=_labelled,
        signals=(post_save, pre_delete),
    ),
    Rule(
        "proposals.Proposal_labels",
        "a proposal's labels",
        versions=_labelling,
        signals=(m2m_changed,),
    ),
    Rule("proposals.Follow", "the reader's follow box", page=False, versions=_follower),
    Rule(
        "runs.Recipe",
        "a proposal's recipe and the plan preview made from it",
        page=False,
        versions=_recipe_shown,
        signals=(post_save,),
    ),
    Rule(
        "runs.Pool",
        "who may start a proposal's dry run (its author, on a pool that allows it)",
        page=False,
        versions=_pool_shown,
        signals=(pre_save, pre_delete),
    ),
    Rule(
        get_user_model()._meta.label,
        "usernames on proposals and timelines",
        page=False,
        versions=_renamed,
        signals=(pre_save,),
    ),
    Rule(
        _user_through(),
        "a reader's roles (their header, their controls)",
        page=False,
        versions=_memberships,
        signals=(m2m_changed,),
    ),
    Rule(
        "auth.Group",
        "the roles of the group's members",
        page=False,
        versions=_group_of,
        signals=(post_save, pre_delete),
    ),
)
