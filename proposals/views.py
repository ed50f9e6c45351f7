"""Web doors for proposals: validate the form, call one service, render the page."""

from __future__ import annotations

import hashlib
from typing import Any

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.core.paginator import Paginator
from django.db import transaction
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.http.response import HttpResponseBase
from django.shortcuts import get_object_or_404, redirect, render
from django.template.loader import get_template
from django.utils.cache import patch_cache_control
from django.utils.functional import SimpleLazyObject, cached_property
from django.utils.safestring import SafeString, mark_safe
from django.views.decorators.http import require_POST

from marin_site.doors import Door
from marin_site.errors import DomainError
from marin_site.fragments import Fragments
from marin_site.roles import roles_kept
from proposals import export as proposal_export
from proposals import permissions as perms
from proposals import query_language, selectors, services
from proposals import search as proposal_search
from proposals.actions import ACTIONS, TRANSITIONS, action_permission_require
from proposals.feeds import label_or_none
from proposals.filters import ProposalFilter
from proposals.forms import CommentForm, OutcomeForm, ProposalForm, ReasonForm, ReviewForm
from proposals.markdown import render_markdown
from proposals.models import Proposal, State
from proposals.pages import ProposalPage, site_header, site_header_refine
from runs.campaigns.selectors import CAMPAIGN_LIST_VERSION
from runs.services.plans import plan_build


def _permission_first(request: HttpRequest, proposal: Proposal, name: str) -> HttpResponse | None:
    """The refusal of someone who may not take action ``name`` at all, before the form is
    read (the input policy's order): None when they may."""
    try:
        action_permission_require(proposal=proposal, actor=request.user, name=name)
    except DomainError as exc:
        return refusal(request, exc)
    return None


def refusal(
    request: HttpRequest, error: DomainError | ValidationError, status: int | None = None
) -> HttpResponse:
    """A page that says what was refused and why, with the matching status code."""
    if isinstance(error, ValidationError):
        messages_list = error.messages
        status = status or 400
    else:
        messages_list = [error.message]
        status = status or error.status_code
    return render(
        request,
        "refused.html",
        {"problems": messages_list, "back": request.META.get("HTTP_REFERER", "/")},
        status=status,
    )


def form_problems(form: forms.BaseForm) -> ValidationError:
    """A refused form's problems, each naming its field ("executor: ...")."""
    return ValidationError([f"{field}: {errors[0]}" for field, errors in form.errors.items()])


def proposal_list(request: HttpRequest) -> HttpResponse:
    digest = hashlib.sha256(request.GET.urlencode().encode()).hexdigest()
    # The filter bar shows only the query string; the footer, nothing at all; the listing
    # (how many match, and this page's ids) what the proposals are, as LIST_VERSION says;
    # the active campaigns what the campaigns are.
    filters, listing = f"list-filters:{digest}", f"list-page:{digest}"
    header = site_header(request)
    fragments = Fragments(
        {
            header: [],
            filters: [],
            "site-footer": [],
            listing: [selectors.LIST_VERSION],
            "active-campaigns": [CAMPAIGN_LIST_VERSION],
        },
        shared=roles_kept(request.user),
    )
    site_header_refine(fragments, header, request)
    filterset: Any = SimpleLazyObject(
        lambda: ProposalFilter(request.GET or None, queryset=selectors.proposal_ids())
    )

    def ids() -> Any:
        bound = filterset.is_bound and filterset.is_valid()
        return (filterset.qs if bound else selectors.proposal_ids()).values_list("pk", flat=True)

    listed = selectors.CachedListing(ids, fragments, listing)
    paginator: Paginator[int] = Paginator(listed, 25)  # type: ignore[arg-type]  # a sequence
    page = paginator.get_page(request.GET.get("page"))
    listed.save()
    pks = list(page.object_list)
    fragments.extend({f"proposal-card:{pk}": [("proposal", pk)] for pk in pks})
    query = request.GET.copy()
    query.pop("page", None)
    response = render(
        request,
        "proposals/list.html",
        {
            "filter": SimpleLazyObject(lambda: filterset.form),
            "page": page,
            "cards": proposal_cards(pks, fragments),
            "query": query.urlencode(),
            "State": State,
            "fragments": fragments,
            "site_header": header,
            "filters_fragment": filters,
            "feed_label": label_or_none(request.GET.get("label")),
        },
    )
    fragments.save()
    return response


def proposal_cards(pks: list[int], fragments: Fragments) -> list[SafeString]:
    """The list page's cards of these proposals, in order: the same for every reader, so each
    comes from the fragment cache while its proposal's version is current; the rows of the
    others are loaded (after ``fragments`` read the versions) and rendered."""
    missing = [pk for pk in pks if fragments.get(f"proposal-card:{pk}") is None]
    rows = {p.pk: p for p in selectors.proposal_rows().filter(pk__in=missing)} if missing else {}
    card = get_template("proposals/_card.html")
    cards = []
    for pk in pks:
        name = f"proposal-card:{pk}"
        html = fragments.get(name)
        if html is None:
            if pk not in rows:  # deleted since the page was counted
                continue
            html = str(card.render({"p": rows[pk]}))
            fragments.put(name, html)
        cards.append(mark_safe(html))  # noqa: S308 (rendered by the template engine)
    return cards


def proposal_detail(request: HttpRequest, pk: int) -> HttpResponse:
    try:
        page = ProposalPage(request, pk)
    except Proposal.DoesNotExist as exc:
        raise Http404("No such proposal.") from exc
    response = render(request, "proposals/detail.html", page.context())
    page.fragments.save()
    if page.in_flight():
        # Its numbers change every few seconds: never serve it from the page cache.
        patch_cache_control(response, private=True)
    return response


def _form_page(
    request: HttpRequest,
    form: ProposalForm,
    proposal: Proposal | None,
    preview: dict[str, Any] | None,
) -> HttpResponse:
    return render(
        request,
        "proposals/form.html",
        {"form": form, "proposal": proposal, "preview": preview},
        status=400 if form.is_bound and form.errors else 200,
    )


def _preview(form: ProposalForm) -> dict[str, Any]:
    """Rendered markdown and the plan, for the form's Preview button; nothing is stored."""
    data = form.cleaned_data
    preview: dict[str, Any] = {
        "description": render_markdown(data.get("description") or ""),
        "hypothesis": render_markdown(data.get("hypothesis") or ""),
    }
    try:
        preview["plan"] = plan_build(
            recipe=data["recipe"],
            baseline=data.get("baseline") or {},
            spec_text=data.get("ablation_spec") or "",
            budget_accelerator_hours=data.get("budget_accelerator_hours"),
        )
    except ValidationError as exc:
        for field, errors in exc.message_dict.items():
            form.add_error(field if field in form.fields else None, errors)
    return preview


def _apply_errors(form: ProposalForm, exc: ValidationError) -> None:
    for field, errors in (
        exc.message_dict if hasattr(exc, "error_dict") else {"__all__": exc.messages}
    ).items():
        form.add_error(field if field in form.fields else None, errors)


@login_required
def proposal_create(request: HttpRequest) -> HttpResponse:
    if not request.user.has_perm(perms.ADD):
        return refusal(request, DomainError("You cannot propose experiments."), 403)
    if request.method != "POST":
        return _form_page(request, ProposalForm(), None, None)
    form = ProposalForm(request.POST)
    if not form.is_valid():
        return _form_page(request, form, None, None)
    if "preview" in request.POST:
        return _form_page(request, form, None, _preview(form))
    try:
        proposal = services.proposal_create(
            author=request.user,
            data=form.service_data(),
            labels=form.cleaned_data["labels"],
            submit="submit" in request.POST,
            door=Door.WEB,
        )
    except ValidationError as exc:
        _apply_errors(form, exc)
        return _form_page(request, form, None, None)
    messages.success(
        request,
        "Proposal submitted for review." if proposal.state == State.SUBMITTED else "Draft saved.",
    )
    return redirect(proposal)


@login_required
def proposal_edit(request: HttpRequest, pk: int) -> HttpResponse:
    proposal = get_object_or_404(Proposal, pk=pk)
    if not request.user.has_perm(perms.CHANGE, proposal):
        return refusal(
            request, DomainError("Only the author or a maintainer can edit this proposal."), 403
        )
    if request.method != "POST":
        return _form_page(request, ProposalForm(instance=proposal), proposal, None)
    form = ProposalForm(request.POST, instance=Proposal.objects.get(pk=pk))
    if not form.is_valid():
        return _form_page(request, form, proposal, None)
    if "preview" in request.POST:
        return _form_page(request, form, proposal, _preview(form))
    try:
        with transaction.atomic():
            services.proposal_update(
                proposal_id=pk,
                actor=request.user,
                data=form.service_data(),
                labels=form.cleaned_data["labels"],
                door=Door.WEB,
            )
            if "submit" in request.POST:
                services.proposal_transition(proposal_id=pk, action="submit", actor=request.user)
    except ValidationError as exc:
        _apply_errors(form, exc)
        return _form_page(request, form, proposal, None)
    except DomainError as exc:
        return refusal(request, exc)
    messages.success(request, "Proposal saved.")
    return redirect(proposal)


@require_POST
@login_required
def proposal_transition(request: HttpRequest, pk: int, action: str) -> HttpResponse:
    if action not in TRANSITIONS:
        raise Http404("No such action.")
    proposal = get_object_or_404(Proposal, pk=pk)
    forbidden = _permission_first(request, proposal, action)
    if forbidden:
        return forbidden
    form = ReasonForm(request.POST)
    if not form.is_valid():
        return refusal(request, form_problems(form))
    try:
        services.proposal_transition(
            proposal_id=proposal.pk,
            action=action,
            actor=request.user,
            door=Door.WEB,
            reason=form.cleaned_data["reason"],
            git_ref=form.cleaned_data["git_ref"],
            executor=form.cleaned_data["executor"],
            dry_run_override=form.cleaned_data["dry_run_override"],
        )
    except (DomainError, ValidationError) as exc:
        return refusal(request, exc)
    messages.success(request, f"Done: {ACTIONS[action].label.lower()}.")
    return redirect("proposals:detail", pk=pk)


@require_POST
@login_required
def proposal_dry_run(request: HttpRequest, pk: int) -> HttpResponse:
    """Start the recipe script's dry run (the ``dry_run`` action: a maintainer, or the
    author on a pool that allows it); its state shows under "Dry runs"."""
    proposal = get_object_or_404(Proposal, pk=pk)
    forbidden = _permission_first(request, proposal, "dry_run")
    if forbidden:
        return forbidden
    try:
        dry_run = services.proposal_dry_run(
            proposal_id=proposal.pk, actor=request.user, door=Door.WEB
        )
    except (DomainError, ValidationError) as exc:
        return refusal(request, exc)
    messages.success(request, f"Dry run {dry_run.pk} started.")
    return redirect("proposals:detail", pk=pk)


@require_POST
@login_required
def proposal_hold(request: HttpRequest, pk: int, hold: bool) -> HttpResponse:
    """Hold a proposal (approval waits) or release the hold: a maintainer's flag, not a state."""
    proposal = get_object_or_404(Proposal, pk=pk)
    forbidden = _permission_first(request, proposal, "hold" if hold else "unhold")
    if forbidden:
        return forbidden
    form = ReasonForm(request.POST)
    if not form.is_valid():
        return refusal(request, form_problems(form))
    try:
        services.proposal_hold(
            proposal_id=proposal.pk,
            actor=request.user,
            hold=hold,
            door=Door.WEB,
            reason=form.cleaned_data["reason"],
        )
    except DomainError as exc:
        return refusal(request, exc)
    messages.success(
        request,
        "Put on hold: approval waits until a maintainer releases the hold."
        if hold
        else "Hold released: the proposal can be approved again.",
    )
    return redirect("proposals:detail", pk=pk)


@require_POST
@login_required
def review_submit(request: HttpRequest, pk: int) -> HttpResponse:
    proposal = get_object_or_404(Proposal, pk=pk)
    forbidden = _permission_first(request, proposal, "review")
    if forbidden:
        return forbidden
    form = ReviewForm(request.POST)
    if not form.is_valid():
        return refusal(request, form_problems(form))
    try:
        services.review_submit(
            proposal_id=proposal.pk,
            reviewer=request.user,
            score=form.cleaned_data["score"],
            recommendation=form.cleaned_data["recommendation"],
            text=form.cleaned_data["text"],
            door=Door.WEB,
        )
    except (DomainError, ValidationError) as exc:
        return refusal(request, exc)
    messages.success(request, "Review saved.")
    return redirect(proposal)


@require_POST
@login_required
def comment_create(request: HttpRequest, pk: int) -> HttpResponse:
    proposal = get_object_or_404(Proposal, pk=pk)
    forbidden = _permission_first(request, proposal, "comment")
    if forbidden:
        return forbidden
    form = CommentForm(request.POST)
    if not form.is_valid():
        return refusal(request, form_problems(form))
    try:
        comment = services.comment_create(
            proposal_id=proposal.pk,
            author=request.user,
            body=form.cleaned_data["body"],
            door=Door.WEB,
        )
    except (DomainError, ValidationError) as exc:
        return refusal(request, exc)
    return redirect(f"{proposal.get_absolute_url()}#comment-{comment.pk}")


@require_POST
@login_required
def outcome_record(request: HttpRequest, pk: int) -> HttpResponse:
    proposal = get_object_or_404(Proposal, pk=pk)
    forbidden = _permission_first(request, proposal, "record_outcome")
    if forbidden:
        return forbidden
    form = OutcomeForm(request.POST)
    if not form.is_valid():
        return refusal(request, form_problems(form))
    try:
        services.proposal_record_outcome(
            proposal_id=proposal.pk, actor=request.user, door=Door.WEB, **form.cleaned_data
        )
    except (DomainError, ValidationError) as exc:
        return refusal(request, exc)
    messages.success(request, "Outcome recorded.")
    return redirect(proposal)


@login_required
def review_queue(request: HttpRequest) -> HttpResponse:
    if not request.user.has_perm(perms.VIEW_REVIEW_QUEUE):
        return refusal(
            request, DomainError("The review queue is for reviewers and maintainers."), 403
        )
    page = Paginator(selectors.review_queue(reviewer=request.user), 25).get_page(
        request.GET.get("page")
    )
    return render(request, "proposals/review_queue.html", {"page": page})


# ------------------------------------------------------------ finding what has been tried

EXPORT_FORMATS = ("csv", "json")
# The search page pages through the first 1,000 matches (the export has them all): counting
# stops there, so a query that matches most proposals costs no more than one that matches few.
SEARCH_PAGE_CAP = 1000


class _CappedPaginator(Paginator):
    def __init__(self, result: proposal_search.SearchResult, per_page: int) -> None:
        super().__init__(result.proposals, per_page)
        self.total, self.capped = result.count(cap=SEARCH_PAGE_CAP)

    @cached_property
    def count(self) -> int:
        return self.total


def _query_error(
    request: HttpRequest, error: query_language.QuerySyntaxError, fmt: str
) -> HttpResponse:
    if fmt == "json":
        return JsonResponse(error.as_dict(), status=400)
    if fmt == "csv":
        return HttpResponse(str(error), status=400, content_type="text/plain; charset=utf-8")
    shown = "".join(" " if c.isspace() else c for c in error.query)
    return render(
        request,
        "proposals/search.html",
        {
            **_search_help(),
            "q": error.query,
            "error": error,
            "shown_query": shown,
            "caret": " " * error.position + "^",
        },
        status=400,
    )


def _search_help() -> dict[str, object]:
    return {
        "fields": query_language.FIELDS,
        "columns": proposal_export.COLUMNS,
        "limits": {
            "length": query_language.MAX_QUERY_LENGTH,
            "depth": query_language.MAX_DEPTH,
            "terms": query_language.MAX_TERMS,
            "list": query_language.MAX_LIST,
        },
    }


def search_page(request: HttpRequest) -> HttpResponseBase:
    """``/search/?q=``: the query language over every proposal; ``&format=csv|json`` exports."""
    text = request.GET.get("q", "")
    fmt = request.GET.get("format", "")
    if fmt and fmt not in EXPORT_FORMATS:
        return HttpResponse("format is csv or json", status=400, content_type="text/plain")
    try:
        query = query_language.parse_query(text)
    except query_language.QuerySyntaxError as exc:
        return _query_error(request, exc, fmt)
    result = proposal_search.proposal_search(query=query)
    if fmt:
        return proposal_export.export_response(request, result.proposals, fmt=fmt, query=text)
    page = _CappedPaginator(result, 25).get_page(request.GET.get("page"))
    return render(
        request,
        "proposals/search.html",
        {
            **_search_help(),
            "q": text,
            "understood": query.describe(),
            "ignored": result.ignored,
            "ranked": result.ranked,
            "page": page,
        },
    )


def export_download(request: HttpRequest, fmt: str) -> HttpResponseBase:
    """``/export/proposals.csv?q=`` and ``.json``: every proposal matching ``q``, streamed."""
    if fmt not in EXPORT_FORMATS:
        raise Http404("Export as proposals.csv or proposals.json.")
    text = request.GET.get("q", "")
    try:
        query = query_language.parse_query(text)
    except query_language.QuerySyntaxError as exc:
        return _query_error(request, exc, fmt)
    result = proposal_search.proposal_search(query=query)
    return proposal_export.export_response(request, result.proposals, fmt=fmt, query=text)


def archive_page(request: HttpRequest) -> HttpResponse:
    """``/archive/``: what did not work. Proposals by default, failed runs with ``show=runs``."""
    show = "runs" if request.GET.get("show") == "runs" else "proposals"
    proposals = proposal_search.archive_proposals()
    runs = proposal_search.archive_runs()
    page = Paginator(runs if show == "runs" else proposals, 25).get_page(request.GET.get("page"))
    return render(
        request,
        "proposals/archive.html",
        {
            "show": show,
            "page": page,
            "proposal_count": page.paginator.count if show == "proposals" else proposals.count(),
            "run_count": page.paginator.count if show == "runs" else runs.count(),
        },
    )
