"""The door: ``/mlflow/api/2.0/mlflow/<endpoint>`` (and ``ajax-api``), as MLflow's tracking
server answers it. Each handler reads its fields, names its caller and calls one service;
every refusal, a missing endpoint included, is MLflow's error shape, never an HTML page."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import orjson
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from marin_site.errors import DomainError
from marin_site.input import InputRefused, document_problem, parse_json
from runs.mlflow import protocol, selectors, services
from runs.mlflow.errors import BAD_REQUEST, INTERNAL_ERROR, MlflowError, error_response, invalid
from runs.mlflow.services import Caller

logger = logging.getLogger(__name__)

Handler = Callable[[HttpRequest, dict[str, Any], Caller], dict[str, Any]]


def _caller(request: HttpRequest) -> Caller:
    header = request.META.get("HTTP_AUTHORIZATION", "")
    if not header:
        return Caller()
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise MlflowError(
            "UNAUTHENTICATED",
            "Send 'Authorization: Bearer <token>' (MLFLOW_TRACKING_TOKEN): a run's token or "
            "a maintainer's API token.",
        )
    return services.caller_from_token(token.strip())


def _body(request: HttpRequest) -> dict[str, Any]:
    data = _query(request) if request.method == "GET" else _json(request)
    # NaN and infinities are MLflow's metric values (their path is the metrics' own rule):
    # everything else of the input policy holds here, naming the parameter.
    problem = document_problem(data, finite=False)
    if problem:
        where, _, what = problem.partition(": ")
        raise invalid(f"Invalid value for parameter '{where}' supplied: {what}.")
    return data


def _query(request: HttpRequest) -> dict[str, Any]:
    data: dict[str, Any] = {}
    for key in request.GET:
        values = request.GET.getlist(key)
        data[key] = values if len(values) > 1 else values[0]
    return data


def _json(request: HttpRequest) -> dict[str, Any]:
    length = int(request.META.get("CONTENT_LENGTH") or 0)
    if length > protocol.MAX_BATCH_LOG_REQUEST_SIZE:
        raise invalid(
            f"Batched logging API requests must be at most {protocol.MAX_BATCH_LOG_REQUEST_SIZE} "
            f"bytes, got a request of size {length}."
        )
    raw = request.body
    if not raw.strip():
        return {}
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        # orjson refuses some JSON that the policy's parser reads far enough to say where the
        # problem is (a lone surrogate escape in a value): the walk above then names it.
        try:
            data = parse_json(
                raw, field="the request body", max_bytes=len(raw), finite=False, walk=False
            )
        except InputRefused as refused:
            raise MlflowError(BAD_REQUEST, f"The request body is refused: {refused}.") from None
    if not isinstance(data, dict):
        raise MlflowError(BAD_REQUEST, "The request body must be a JSON object.")
    return data


def _max_results(data: dict[str, Any], default: int, limit: int) -> int:
    value = protocol.field_int64(data, "max_results")
    if value is None:
        return default
    if not 0 < value <= limit:
        raise invalid(
            f"Invalid value {value} for parameter 'max_results' supplied: it must be at most "
            f"{limit} and positive."
        )
    return value


# --- handlers ------------------------------------------------------------------------------


def experiments_get(request: HttpRequest, data: dict[str, Any], caller: Caller) -> dict[str, Any]:
    asked = protocol.field_string(data, "experiment_id", required=True)
    plan_id = protocol.experiment_id_parse(asked)
    return {"experiment": selectors.experiment_get(plan_id=plan_id, asked=asked)}


def experiments_get_by_name(
    request: HttpRequest, data: dict[str, Any], caller: Caller
) -> dict[str, Any]:
    name = protocol.field_string(data, "experiment_name", required=True, limit=500)
    return {"experiment": selectors.experiment_get_by_name(name=name)}


def experiments_create(
    request: HttpRequest, data: dict[str, Any], caller: Caller
) -> dict[str, Any]:
    name = protocol.field_string(data, "name", required=True, limit=500)
    return {"experiment_id": services.experiment_create(caller=caller, name=name)}


def experiments_search(
    request: HttpRequest, data: dict[str, Any], caller: Caller
) -> dict[str, Any]:
    return selectors.experiments_search(
        filter_text=protocol.field_string(data, "filter", limit=1000),
        max_results=_max_results(data, 1000, protocol.MAX_RESULTS_SEARCH),
        page_token=protocol.field_string(data, "page_token", limit=200),
    )


def runs_create(request: HttpRequest, data: dict[str, Any], caller: Caller) -> dict[str, Any]:
    tags = [
        protocol.tag_parse(t, f"tags[{i}]") for i, t in enumerate(protocol.field_list(data, "tags"))
    ]
    if len(tags) > protocol.MAX_PARAMS_TAGS_PER_BATCH:
        raise invalid(f"A run is created with at most {protocol.MAX_PARAMS_TAGS_PER_BATCH} tags.")
    protocol.field_int64(data, "start_time")
    user_id = protocol.field_string(data, "user_id", limit=255)
    if user_id:
        tags.append(("mlflow.user", user_id))
    run = services.run_create(
        caller=caller,
        experiment_id=data.get("experiment_id"),
        tags=tags,
        run_name=protocol.field_string(data, "run_name", limit=250),
    )
    return {"run": run}


def runs_get(request: HttpRequest, data: dict[str, Any], caller: Caller) -> dict[str, Any]:
    return {"run": selectors.run_get(run_id=protocol.run_id_parse(data))}


def runs_update(request: HttpRequest, data: dict[str, Any], caller: Caller) -> dict[str, Any]:
    info = services.run_update(
        caller=caller,
        run_id=protocol.run_id_parse(data),
        status=protocol.field_string(data, "status", limit=20),
        end_time=protocol.field_int64(data, "end_time"),
        run_name=protocol.field_string(data, "run_name", limit=250),
    )
    return {"run_info": info}


def runs_delete(request: HttpRequest, data: dict[str, Any], caller: Caller) -> dict[str, Any]:
    services.run_delete(caller=caller, run_id=protocol.run_id_parse(data))
    return {}


def runs_search(request: HttpRequest, data: dict[str, Any], caller: Caller) -> dict[str, Any]:
    return selectors.runs_search(
        experiment_ids=protocol.field_list(data, "experiment_ids"),
        filter_text=protocol.field_string(data, "filter", limit=2000),
        max_results=_max_results(data, 1000, protocol.MAX_RESULTS_SEARCH),
        page_token=protocol.field_string(data, "page_token", limit=200),
        view_type=protocol.field_string(data, "run_view_type", limit=20),
    )


def runs_log_batch(request: HttpRequest, data: dict[str, Any], caller: Caller) -> dict[str, Any]:
    metrics = protocol.field_list(data, "metrics")
    params = protocol.field_list(data, "params")
    tags = protocol.field_list(data, "tags")
    protocol.batch_limits(metrics, params, tags)
    run_id = protocol.run_id_parse(data)
    services.log_batch(
        caller=caller,
        run_id=run_id,
        metric_items=[protocol.metric_parse(m, f"metrics[{i}]") for i, m in enumerate(metrics)],
        params=[protocol.param_parse(p, f"params[{i}]") for i, p in enumerate(params)],
        tags=[protocol.tag_parse(t, f"tags[{i}]") for i, t in enumerate(tags)],
    )
    return {}


def runs_log_metric(request: HttpRequest, data: dict[str, Any], caller: Caller) -> dict[str, Any]:
    metric = protocol.metric_parse(data, "")
    services.log_batch(
        caller=caller,
        run_id=protocol.run_id_parse(data),
        metric_items=[metric],
        params=[],
        tags=[],
    )
    return {}


def runs_log_parameter(
    request: HttpRequest, data: dict[str, Any], caller: Caller
) -> dict[str, Any]:
    param = protocol.param_parse(data, "")
    services.log_batch(
        caller=caller, run_id=protocol.run_id_parse(data), metric_items=[], params=[param], tags=[]
    )
    return {}


def runs_set_tag(request: HttpRequest, data: dict[str, Any], caller: Caller) -> dict[str, Any]:
    tag = protocol.tag_parse(data, "")
    services.log_batch(
        caller=caller, run_id=protocol.run_id_parse(data), metric_items=[], params=[], tags=[tag]
    )
    return {}


def runs_delete_tag(request: HttpRequest, data: dict[str, Any], caller: Caller) -> dict[str, Any]:
    key = protocol.entity_name(data.get("key"), "key", "Tag")
    services.tag_delete(caller=caller, run_id=protocol.run_id_parse(data), key=key)
    return {}


def metrics_get_history(
    request: HttpRequest, data: dict[str, Any], caller: Caller
) -> dict[str, Any]:
    return selectors.metric_history(
        run_id=protocol.run_id_parse(data),
        key=protocol.field_string(data, "metric_key", required=True, limit=250),
        max_results=_max_results(data, protocol.MAX_RESULTS_HISTORY, protocol.MAX_RESULTS_HISTORY),
        page_token=protocol.field_string(data, "page_token", limit=200),
    )


ROUTES: dict[str, tuple[str, Handler]] = {
    "experiments/get": ("GET", experiments_get),
    "experiments/get-by-name": ("GET", experiments_get_by_name),
    "experiments/create": ("POST", experiments_create),
    "experiments/search": ("POST", experiments_search),
    "runs/create": ("POST", runs_create),
    "runs/get": ("GET", runs_get),
    "runs/update": ("POST", runs_update),
    "runs/delete": ("POST", runs_delete),
    "runs/search": ("POST", runs_search),
    "runs/log-batch": ("POST", runs_log_batch),
    "runs/log-metric": ("POST", runs_log_metric),
    "runs/log-parameter": ("POST", runs_log_parameter),
    "runs/set-tag": ("POST", runs_set_tag),
    "runs/delete-tag": ("POST", runs_delete_tag),
    "metrics/get-history": ("GET", metrics_get_history),
}
# The UI's variant asks experiments/search by GET with query parameters.
GET_ALSO = {"experiments/search"}


@csrf_exempt
def elsewhere(request: HttpRequest, path: str) -> HttpResponse:
    """Anything under the prefix that is not MLflow's REST API (its UI, artifacts)."""
    return error_response(selectors.endpoint_unknown(path))


@csrf_exempt
def endpoint(request: HttpRequest, path: str) -> HttpResponse:
    """Every call under the prefix: routed, answered as JSON, refused in MLflow's shape."""
    path = path.strip("/")
    route = ROUTES.get(path)
    try:
        if route is None:
            raise selectors.endpoint_unknown(path)
        method, handler = route
        allowed = {method, "GET"} if path in GET_ALSO else {method}
        if request.method not in allowed:
            return error_response(
                MlflowError(BAD_REQUEST, f"{path} answers {method}, not {request.method}."),
                status=405,
            )
        caller = _caller(request)
        data = _body(request)
        answer = handler(request, data, caller)
    except MlflowError as exc:
        return error_response(exc)
    except ValidationError as exc:
        return error_response(invalid("; ".join(exc.messages)[:2000]))
    except DomainError as exc:
        return error_response(invalid(exc.message))
    except Exception:
        logger.exception("the MLflow door failed on %s", path)
        return error_response(MlflowError(INTERNAL_ERROR, "marin-site failed to answer this call."))
    return JsonResponse(answer)
