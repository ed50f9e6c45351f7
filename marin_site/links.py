"""Links that do not rot: what the site keeps of a W&B run or report, a data-browser path or
a GitHub issue is a canonical id, and the address is made from settings when it is shown.

    wandb:entity/project/run_id          a W&B run        WANDB_BASE_URL/entity/project/runs/run_id
    wandb-report:entity/project/slug     a W&B report     WANDB_BASE_URL/entity/project/reports/slug
    gh:owner/repo#123                    an issue or PR   GITHUB_BASE_URL/owner/repo/issues/123
    data:path/inside/the/browser         a data path      DATA_BROWSER_URL/path/inside/the/browser

``link_canonical(url)`` turns an address (of any host the settings know, or of W&B's and
GitHub's public hosts) into its id, ``link_url(id)`` back into today's address. A host that
moved is a settings change; old addresses written in bodies are rewritten by ``manage.py
links_rewrite`` (``links_rewrite_text``).
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import quote, urlsplit

from django.conf import settings
from django.db.models import Model, Q

_PART = r"[A-Za-z0-9_.\-]+"
WANDB_ID = re.compile(rf"^wandb:(?P<entity>{_PART})/(?P<project>{_PART})/(?P<run>{_PART})$")
WANDB_REPORT_ID = re.compile(
    rf"^wandb-report:(?P<entity>{_PART})/(?P<project>{_PART})/(?P<slug>[A-Za-z0-9_.\-~]+)$"
)
GITHUB_ID = re.compile(rf"^gh:(?P<owner>{_PART})/(?P<repo>{_PART})#(?P<number>[0-9]{{1,10}})$")
DATA_ID = re.compile(r"^data:(?P<path>[^\s]{1,1000})$")

PUBLIC_WANDB_HOSTS = ("wandb.ai", "app.wandb.ai")
PUBLIC_GITHUB_HOSTS = ("github.com", "www.github.com")


def _base(name: str) -> str:
    return str(getattr(settings, name, "") or "").rstrip("/")


def _host(url: str) -> str:
    return urlsplit(url).netloc.lower()


def wandb_run_id(entity: str, project: str, run: str) -> str:
    return f"wandb:{entity}/{project}/{run}"


def link_canonical(url: str) -> str | None:
    """The canonical id of ``url`` (a W&B run or report, a GitHub issue or pull request, a
    data-browser path), or None when it is none of these. An id is returned as it is."""
    text = url.strip()
    if link_url(text) is not None:
        return text
    parts = urlsplit(text)
    if parts.scheme not in {"http", "https"}:
        return None
    host = parts.netloc.lower()
    segments = [s for s in parts.path.split("/") if s]
    if host in PUBLIC_WANDB_HOSTS or host == _host(_base("WANDB_BASE_URL")):
        if len(segments) >= 4 and segments[2] == "runs":
            candidate = wandb_run_id(segments[0], segments[1], segments[3])
            return candidate if WANDB_ID.match(candidate) else None
        if len(segments) >= 4 and segments[2] == "reports":
            candidate = f"wandb-report:{segments[0]}/{segments[1]}/{segments[3]}"
            return candidate if WANDB_REPORT_ID.match(candidate) else None
        return None
    if host in PUBLIC_GITHUB_HOSTS or host == _host(_base("GITHUB_BASE_URL")):
        if len(segments) >= 4 and segments[2] in {"issues", "pull"}:
            candidate = f"gh:{segments[0]}/{segments[1]}#{segments[3]}"
            return candidate if GITHUB_ID.match(candidate) else None
        return None
    browser = _base("DATA_BROWSER_URL")
    if browser and text.startswith(browser + "/"):
        path = text[len(browser) + 1 :]
        return f"data:{path}" if DATA_ID.match(f"data:{path}") else None
    return None


def link_url(link_id: str) -> str | None:
    """Today's address of a canonical id, from the settings; None when it is not an id."""
    if match := WANDB_ID.match(link_id):
        entity, project, run = match.group("entity", "project", "run")
        return f"{_base('WANDB_BASE_URL')}/{entity}/{project}/runs/{run}"
    if match := WANDB_REPORT_ID.match(link_id):
        entity, project, slug = match.group("entity", "project", "slug")
        return f"{_base('WANDB_BASE_URL')}/{entity}/{project}/reports/{slug}"
    if match := GITHUB_ID.match(link_id):
        owner, repo, number = match.group("owner", "repo", "number")
        return f"{_base('GITHUB_BASE_URL')}/{owner}/{repo}/issues/{number}"
    if match := DATA_ID.match(link_id):
        return f"{_base('DATA_BROWSER_URL')}/{quote(match.group('path'), safe='/:?=&%#.-_~')}"
    return None


def link_shown(value: str) -> str:
    """What a page links to for a stored value: an id's address, anything else as it is."""
    return link_url(value) or value


def _host_pattern(host: str) -> re.Pattern[str]:
    return re.compile(rf"(?P<scheme>https?://){re.escape(host)}(?=[/?#:\s\"')\]>]|$)", re.I)


def links_rewrite_text(text: str, *, old_host: str, new_host: str) -> tuple[str, int]:
    """``text`` with every http(s) address on ``old_host`` moved to ``new_host`` (the path
    kept), and how many were moved. Only whole hosts match: ``wandb.ai`` does not match
    ``mywandb.ai`` or ``wandb.ai.example``."""
    pattern = _host_pattern(old_host)
    return pattern.subn(lambda m: m.group("scheme") + new_host, text)


# --- rewriting hosts in what is stored ---------------------------------------------------------

HOST = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9.\-]{0,250})(?::[0-9]{1,5})?$")
_REWRITABLE: dict[str, tuple[type[Model], tuple[str, ...]]] = {}


def rewritable_register(model: type[Model], *fields: str) -> None:
    """Say which fields of ``model`` hold bodies or links that ``links_rewrite`` moves (each
    app, from its ``ready()``). Timelines and signed webhook bodies are never registered:
    they say what was, as it was."""
    _REWRITABLE[model._meta.label] = (model, tuple(fields))


def rewritable() -> list[tuple[type[Model], tuple[str, ...]]]:
    return [_REWRITABLE[label] for label in sorted(_REWRITABLE)]


def _rewrite_value(value: Any, old_host: str, new_host: str) -> tuple[Any, int]:
    if isinstance(value, str):
        return links_rewrite_text(value, old_host=old_host, new_host=new_host)
    if isinstance(value, list):
        moved = 0
        items = []
        for item in value:
            new, count = _rewrite_value(item, old_host, new_host)
            items.append(new)
            moved += count
        return items, moved
    if isinstance(value, dict):
        moved = 0
        mapping = {}
        for key, item in value.items():
            new, count = _rewrite_value(item, old_host, new_host)
            mapping[key] = new
            moved += count
        return mapping, moved
    return value, 0


def host_problem(host: str) -> str | None:
    if not HOST.match(host) or ".." in host:
        return f"'{host[:100]}' is not a host name (such as wandb.ai or github.com:443)"
    return None


def links_rewrite(*, old_host: str, new_host: str, dry_run: bool = False) -> dict[str, list[int]]:
    """Move every http(s) address on ``old_host`` to ``new_host`` in the registered fields.
    Returns, per ``app.Model.field``, [rows changed, addresses moved]. Rows are written with
    ``update()`` (no save signals: a moved link is not an edit to sync to GitHub), each in its
    own transaction, and the caches are told (``rows_changed``); a dry run writes nothing."""
    from django.db import transaction
    from django.db.models import TextField
    from django.db.models.functions import Cast

    from marin_site.invalidation import rows_changed

    for host in (old_host, new_host):
        problem = host_problem(host)
        if problem:
            raise ValueError(problem)
    counts: dict[str, list[int]] = {}
    for model, fields in rewritable():
        for name in fields:
            counts[f"{model._meta.label}.{name}"] = [0, 0]
        needle = f"://{old_host}"
        rows = model._default_manager.annotate(
            **{f"_links_{name}": Cast(name, TextField()) for name in fields}
        )
        query = None
        for name in fields:
            clause = Q(**{f"_links_{name}__icontains": needle})
            query = clause if query is None else query | clause
        for row in rows.filter(query).only("pk", *fields).iterator(chunk_size=500):
            changes: dict[str, Any] = {}
            for name in fields:
                new, moved = _rewrite_value(getattr(row, name), old_host, new_host)
                if moved:
                    changes[name] = new
                    counts[f"{model._meta.label}.{name}"][0] += 1
                    counts[f"{model._meta.label}.{name}"][1] += moved
            if changes and not dry_run:
                with transaction.atomic():
                    model._default_manager.filter(pk=row.pk).update(**changes)
                    rows_changed(model, [row.pk])
    return counts
