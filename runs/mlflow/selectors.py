"""MLflow's reads: experiments (plans), runs, searches with simple filters, metric history
(paged), and the answer for an endpoint this door does not have. Everything read is public."""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass
from typing import Any

from runs.mlflow import protocol
from runs.mlflow.errors import ENDPOINT_NOT_FOUND, RESOURCE_DOES_NOT_EXIST, MlflowError, invalid
from runs.models import MetricPoint, MetricSummary, Plan, Run
from runs.signals import plan_named


def _run_readable(run_id: int) -> Run:
    run = Run.objects.filter(pk=run_id).first()
    if run is None:
        raise MlflowError(RESOURCE_DOES_NOT_EXIST, f"Run with id={run_id} not found")
    return run


def experiment_get(*, plan_id: int | None, asked: str) -> dict[str, Any]:
    plan = Plan.objects.filter(pk=plan_id).first() if plan_id is not None else None
    if plan is None:
        raise MlflowError(RESOURCE_DOES_NOT_EXIST, f"No Experiment with id={asked[:80]} exists")
    return protocol.experiment_entity(plan)


EXPERIMENT_NAMES = (
    "plan-<id>, the proposal's number (#14 or 14) or its slug (its title in lower case, "
    "words joined by '-')"
)


def experiment_plan_id(name: str) -> int | None:
    """The plan an experiment name means: ``plan-<id>``, or a name a person sees for it (the
    proposal's number or slug, answered by ``runs.signals.plan_named``); None for no plan."""
    match = re.fullmatch(r"plan-(\d{1,18})", name)
    if match:
        return int(match.group(1))
    if not name or len(name) > 200:
        return None
    for _receiver, answer in plan_named.send_robust(sender=Plan, name=name):
        if isinstance(answer, int):
            return answer
    return None


def experiment_get_by_name(*, name: str) -> dict[str, Any]:
    plan_id = experiment_plan_id(name)
    plan = Plan.objects.filter(pk=plan_id).first() if plan_id is not None else None
    if plan is None:
        raise MlflowError(
            RESOURCE_DOES_NOT_EXIST,
            f"Could not find experiment with name '{name[:200]}': name a plan by "
            f"{EXPERIMENT_NAMES}.",
        )
    return protocol.experiment_entity(plan)


def _page(token: str) -> int:
    if not token:
        return 0
    try:
        if len(token) > 64:
            raise ValueError(token)
        offset = int(base64.urlsafe_b64decode(token.encode()).decode())
    except (ValueError, UnicodeError):
        raise invalid(f"Invalid page token {token[:80]!r}.") from None
    if not 0 <= offset < 2**31:
        raise invalid(f"Invalid page token {token[:80]!r}.")
    return offset


def _next_token(offset: int) -> str:
    return base64.urlsafe_b64encode(str(offset).encode()).decode()


def experiments_search(*, filter_text: str, max_results: int, page_token: str) -> dict[str, Any]:
    plans = Plan.objects.order_by("-pk")
    text = filter_text.strip()
    if text:
        match = re.fullmatch(
            r"(?:attributes\.)?(name|experiment_id)\s*(=|!=|LIKE|ILIKE)\s*'([^']*)'",
            text,
            re.IGNORECASE,
        )
        if match is None:
            raise invalid(
                f"Unsupported experiment filter {text[:200]!r}: marin-site answers "
                "\"name = 'plan-<id>'\", \"name LIKE 'plan-%'\" and \"experiment_id = '<id>'\"."
            )
        field, op, value = match.group(1).lower(), match.group(2).upper(), match.group(3)
        if field == "experiment_id":
            value = f"plan-{value}"
        names = {p: protocol.experiment_name(p) for p in plans.values_list("pk", flat=True)}
        if op in {"LIKE", "ILIKE"}:
            pattern = re.escape(value).replace("%", ".*").replace("_", ".")
            flags = re.IGNORECASE if op == "ILIKE" else 0
            keep = [p for p, n in names.items() if re.fullmatch(pattern, n, flags)]
        elif op == "=":
            keep = [p for p, n in names.items() if n == value]
        else:
            keep = [p for p, n in names.items() if n != value]
        plans = plans.filter(pk__in=keep)
    offset = _page(page_token)
    chunk = list(plans[offset : offset + max_results + 1])
    body: dict[str, Any] = {
        "experiments": [protocol.experiment_entity(p) for p in chunk[:max_results]]
    }
    if len(chunk) > max_results:
        body["next_page_token"] = _next_token(offset + max_results)
    return body


def run_get(*, run_id: int) -> dict[str, Any]:
    run = _run_readable(run_id)
    return protocol.run_entity(run, list(MetricSummary.objects.filter(run_id=run.pk)))


# --- searches and history -----------------------------------------------------------------

_CLAUSE = re.compile(
    r"^\s*(?:(attributes|attribute|attr|run|tags|tag|params|param|metrics|metric)\.)?"
    r"(`[^`]+`|\"[^\"]+\"|[\w./:-]+)\s*(<=|>=|!=|=|<|>|LIKE|ILIKE)\s*"
    r"('(?:[^']*)'|\"(?:[^\"]*)\"|-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)\s*$",
    re.IGNORECASE,
)
_ATTRIBUTES = {"status", "run_name", "run_id", "start_time", "end_time", "user_id"}


@dataclass(frozen=True)
class _Clause:
    kind: str
    key: str
    op: str
    value: str | float


def _parse_filter(text: str) -> list[_Clause]:
    if not text.strip():
        return []
    clauses = []
    for part in re.split(r"\s+AND\s+", text.strip(), flags=re.IGNORECASE):
        match = _CLAUSE.match(part)
        if match is None:
            raise invalid(
                f"Unsupported filter {part[:200]!r}: marin-site answers clauses joined by AND "
                "on attributes.status, attributes.run_name, tags.<key>, params.<key> "
                "(= != LIKE) and metrics.<key> (< <= > >= = !=)."
            )
        prefix, key, op, raw = match.groups()
        kind = {
            "attribute": "attributes",
            "attr": "attributes",
            "run": "attributes",
            "tag": "tags",
            "param": "params",
            "metric": "metrics",
        }.get((prefix or "attributes").lower(), (prefix or "attributes").lower())
        key = key.strip('`"')
        if kind == "attributes" and key not in _ATTRIBUTES:
            raise invalid(f"Unsupported attribute {key[:80]!r} in the filter.")
        value: str | float
        value = raw[1:-1] if raw[0] in "'\"" else float(raw)
        if kind == "metrics" and isinstance(value, str):
            raise invalid(f"metrics.{key} compares with a number, not {raw[:40]}.")
        clauses.append(_Clause(kind, key, op.upper(), value))
    return clauses


def _compare(left: Any, op: str, right: str | float) -> bool:
    if left is None:
        return False
    if op in {"LIKE", "ILIKE"}:
        pattern = re.escape(str(right)).replace("%", ".*").replace("_", ".")
        return bool(re.fullmatch(pattern, str(left), re.IGNORECASE if op == "ILIKE" else 0))
    if isinstance(right, float):
        try:
            left = float(left)
        except (TypeError, ValueError):
            return False
    else:
        left = str(left)
    return {
        "=": left == right,
        "!=": left != right,
        "<": left < right,
        "<=": left <= right,
        ">": left > right,
        ">=": left >= right,
    }[op]


def runs_search(
    *,
    experiment_ids: list[Any],
    filter_text: str,
    max_results: int,
    page_token: str,
    view_type: str,
) -> dict[str, Any]:
    clauses = _parse_filter(filter_text)
    plan_ids = [protocol.experiment_id_parse(e, "experiment_ids") for e in experiment_ids[:100]]
    rows = Run.objects.filter(plan_id__in=[p for p in plan_ids if p is not None]).order_by("-pk")
    if view_type in {"", "ACTIVE_ONLY"}:
        rows = rows.filter(tracker_deleted_at__isnull=True)
    elif view_type == "DELETED_ONLY":
        rows = rows.filter(tracker_deleted_at__isnull=False)
    elif view_type != "ALL":
        raise invalid(f"Invalid value {view_type[:40]!r} for parameter 'run_view_type'.")
    runs = list(rows[:MAX_SCANNED])
    summaries: dict[int, list[MetricSummary]] = {}
    for summary in MetricSummary.objects.filter(run_id__in=[r.pk for r in runs]):
        summaries.setdefault(summary.run_id, []).append(summary)
    entities = [protocol.run_entity(run, summaries.get(run.pk, [])) for run in runs]
    kept = [e for e in entities if all(_matches(e, c) for c in clauses)]
    offset = _page(page_token)
    body: dict[str, Any] = {"runs": kept[offset : offset + max_results]}
    if len(kept) > offset + max_results:
        body["next_page_token"] = _next_token(offset + max_results)
    return body


MAX_SCANNED = 10_000


def _matches(entity: dict[str, Any], clause: _Clause) -> bool:
    if clause.kind == "attributes":
        return _compare(entity["info"].get(clause.key), clause.op, clause.value)
    items = {item["key"]: item["value"] for item in entity["data"][clause.kind]}
    return _compare(items.get(clause.key), clause.op, clause.value)


def metric_history(*, run_id: int, key: str, max_results: int, page_token: str) -> dict[str, Any]:
    _run_readable(run_id)
    after = -1
    if page_token:
        after = _page(page_token) - 1
    points = list(
        MetricPoint.objects.filter(run_id=run_id, key=key, step__gt=after)
        .order_by("step")
        .values_list("step", "value", "time")[: max_results + 1]
    )
    body: dict[str, Any] = {
        "metrics": [
            {"key": key, "value": value, "timestamp": protocol.millis(at), "step": step}
            for step, value, at in points[:max_results]
        ]
    }
    if len(points) > max_results:
        body["next_page_token"] = _next_token(points[max_results - 1][0] + 1)
    return body


def endpoint_unknown(path: str) -> MlflowError:
    return MlflowError(
        ENDPOINT_NOT_FOUND,
        f"marin-site's MLflow door does not implement '{path[:200]}'. It answers the tracking "
        "calls: experiments get, get-by-name, search, create; runs create, get, update, "
        "search, delete, log-batch, log-metric, log-parameter, set-tag, delete-tag; "
        "metrics get-history. Artifacts, models and traces are not kept here.",
    )
