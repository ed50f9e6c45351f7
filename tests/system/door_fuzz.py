"""The fuzzer of every door, shared by tests/system/test_door_fuzz.py (seeded, bounded, in
CI) and bench/fuzz.py (longer, counts by door and status).

Doors: every web form (found by walking the URL configuration to the pages that render
forms, and reading each form's fields from the page), every API operation of the schema
with a request body (its properties from the schema), MLflow's routes, the runner's and the
agents' doors (their bodies are documented as free objects: their fields are listed here),
GitHub's webhook (signed), and the uploads (a tracker file streamed, the run page's file).

Each request runs inside a savepoint rolled back afterwards, so every one meets the same
world, and the row counts of every table of the apps are compared before and after: a
refused request (4xx) must have stored nothing. A 5xx is always a failure. A 400 must name
the field it refuses.
"""

from __future__ import annotations

import json
import random
import re
import resource
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from html.parser import HTMLParser
from typing import Any
from urllib.parse import quote, urlencode

from django.apps import apps
from django.db import connection, transaction
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver

# ------------------------------------------------------------------ input classes

DEEP = "[" * 3000 + "]" * 3000
# Raw JSON fragments: what a hostile client can put where a value goes, surrogates and
# numbers JSON cannot hold included (they reach the server as these exact bytes).
JSON_CLASSES: dict[str, str] = {
    "deep nesting": DEEP,
    "deep object": '{"a":' * 2000 + "1" + "}" * 2000,
    "integer of 5000 digits": "9" * 5000,
    "integer past 64 bits": str(10**30),
    "lone surrogate": '"\\ud800"',
    "low surrogate in text": '"ok \\udfff ok"',
    "nul": '"a\\u0000b"',
    "1e400": "1e400",
    "-1e400": "-1e400",
    "float for an id": "1.5",
    "float that is whole": "1.0",
    "true": "true",
    "false": "false",
    "null": "null",
    "control characters only": '"\\u0001\\u0002\\u001f"',
    "zero-width only": '"\\u200b\\u200d\\ufeff"',
    "spaces only": '"   "',
    "empty string": '""',
    "digits as text": '"1"',
    "negative": "-1",
    "huge text": '"' + "x" * 300_000 + '"',
    "list": '[1, "a", null]',
    "object": '{"a": {"b": [1]}}',
    "unicode edges": '"\\ud83d\\ude00 caf\\u00e9 \\u202e\\ufdfd \\uffff \\u0301"',
    "object with a nul key": '{"a\\u0000": 1}',
}
# Where a class must be refused by the field it lands in (by the field's kind), and so the
# answer must name the field. Kinds come from the schema or the form's input.
REFUSED_BY_KIND: dict[str, set[str]] = {
    "integer": {
        "1e400",
        "-1e400",
        "float for an id",
        "float that is whole",
        "true",
        "false",
        "digits as text",
        "integer past 64 bits",
        "lone surrogate",
        "nul",
    },
    "number": {"1e400", "-1e400", "true", "false", "integer past 64 bits", "nul"},
    "string": {"lone surrogate", "low surrogate in text", "nul", "1e400", "-1e400", "true"},
    "title": {"control characters only", "zero-width only"},
}
# Text for a web form's field (the form only sends text); None marks the bytes below.
FORM_CLASSES: dict[str, str | None] = {
    "empty": "",
    "spaces": "   ",
    "nul": "a\x00b",
    "control characters only": "\x01\x02\x1f",
    "zero-width only": "\u200b\u200d\ufeff",
    "huge text": "x" * 300_000,
    "1e400": "1e400",
    "float for an id": "1.5",
    "negative": "-1",
    "integer of 5000 digits": "9" * 5000,
    "deep JSON": DEEP,
    "JSON with a lone surrogate": '{"a": "\\ud800"}',
    "JSON with 1e400": '{"a": 1e400}',
    "JSON integer of 5000 digits": "[" + "9" * 5000 + "]",
    "unicode edges": "\U0001f600 caf\u00e9 \u202e\ufdfd \uffff e\u0301",
    "true": "true",
    "not UTF-8": None,
}
NOT_UTF8 = b"caf\xe9 \xed\xa0\x80 \xff"
# A button's value or a file input is not text the form reads: taking junk there is no harm.
IGNORED_KINDS = {"button", "submit", "file", "checkbox", "radio"}


# ------------------------------------------------------------------ the tally


@dataclass
class Tally:
    requests: Counter[tuple[str, int]] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)

    def record(self, door: str, status: int) -> None:
        self.requests[(door, status)] += 1

    def fail(self, message: str) -> None:
        if len(self.failures) < 200:
            self.failures.append(message)

    def by_door(self) -> dict[str, dict[str, int]]:
        table: dict[str, dict[str, int]] = {}
        for (door, status), count in sorted(self.requests.items()):
            table.setdefault(door, {})[str(status)] = count
        return table

    @property
    def total(self) -> int:
        return sum(self.requests.values())


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def rss_mb() -> float:
    """This process's resident memory now (Linux), 0 elsewhere."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


# ------------------------------------------------------------------ rows


def _count_query() -> str:
    tables = sorted(
        {
            model._meta.db_table
            for app in ("proposals", "runs", "auth", "authtoken")
            for model in apps.get_app_config(app).get_models()
            if not model._meta.proxy and model._meta.managed
        }
    )
    # table names from the models' own meta, not from input
    counts = ", ".join(f'(SELECT count(*) FROM "{table}")' for table in tables)  # noqa: S608
    return f"SELECT {counts}"


class Rows:
    def __init__(self) -> None:
        self.query = _count_query()

    def counts(self) -> tuple[int, ...]:
        with connection.cursor() as cursor:
            cursor.execute(self.query)
            return tuple(cursor.fetchone())


class _Rollback(Exception):
    pass


# ------------------------------------------------------------------ one request


@dataclass
class Fuzzer:
    world: dict[str, Any]
    rng: random.Random
    tally: Tally = field(default_factory=Tally)
    rows: Rows = field(default_factory=Rows)

    def send(
        self,
        door: str,
        request: Callable[[], Any],
        *,
        what: str,
        name: str = "",
        must_refuse: bool = False,
        names_ok: Callable[[str], bool] | None = None,
    ) -> Any:
        """Send one request in a savepoint rolled back after; check the answer."""
        response: Any = None
        try:
            with transaction.atomic():
                before = self.rows.counts()
                response = request()
                after = self.rows.counts()
                raise _Rollback
        except _Rollback:
            pass
        if getattr(response, "streaming", False):
            _close_files(response)
        status = response.status_code
        self.tally.record(door, status)
        if status >= 500:
            self.tally.fail(f"{door} {what}: {status}")
            return response
        if 400 <= status < 500 and before != after:
            self.tally.fail(f"{door} {what}: refused ({status}) but rows changed")
        # a web form taken redirects (the site's habit); one answered 200 was shown again
        taken = status < 400 if not door.startswith("web form") else 300 <= status < 400
        if must_refuse and taken and status != 304:
            self.tally.fail(f"{door} {what}: taken ({status}), the policy refuses it")
        if status == 400 and must_refuse and name:
            text = _text(response)
            if not (names_ok(text) if names_ok else _names(text, name)):
                self.tally.fail(f"{door} {what}: 400 does not name '{name}': {text[:200]}")
        return response


def _close_files(response: Any) -> None:
    """Close what a streamed answer holds open, without ``response.close()``: that sends
    ``request_finished``, whose receivers would close the test's database connection."""
    for closer in getattr(response, "_resource_closers", []):
        closer()


def call(
    client: Any,
    method: str,
    url: str,
    body: Any = None,
    content_type: str = "application/json",
    headers: dict[str, str] | None = None,
) -> Callable[[], Any]:
    """One request, ready to send: ``FORM`` posts a dict as the test client encodes forms."""
    extra: Any = headers or {}

    def send() -> Any:
        if method == "GET":
            return client.get(url, **extra)
        if method == "FORM":
            return client.post(url, body, **extra)
        return client.generic(method, url, body, content_type, **extra)

    return send


def _text(response: Any) -> str:
    content = b"".join(response) if getattr(response, "streaming", False) else response.content
    return content.decode("utf-8", "replace")


def _says_utf8(text: str) -> bool:
    return "UTF-8" in text


def _names_or_null(name: str) -> Callable[[str], bool]:
    """A form's 400 names the field, or says a NUL is refused (Django's words)."""

    def check(text: str) -> bool:
        return _names(text, name) or "null" in text.lower()

    return check


def _names(text: str, name: str) -> bool:
    lowered = text.lower()
    return any(
        form.lower() in lowered
        for form in (name, name.replace("_", " "), name.rsplit(".", maxsplit=1)[-1])
    )


def with_raw(body: dict[str, Any], key: str, raw: str) -> bytes:
    marker = f"__hostile_{uuid.uuid4().hex}__"
    text = json.dumps({**body, key: marker})
    return text.replace(json.dumps(marker), raw).encode("utf-8", "surrogatepass")


# ------------------------------------------------------------------ web forms


@dataclass
class Form:
    page: str
    action: str
    fields: dict[str, str]
    kinds: dict[str, str]  # input type, or "textarea", "select"
    multipart: bool


class _FormReader(HTMLParser):
    def __init__(self, page: str) -> None:
        super().__init__()
        self.page = page
        self.forms: list[Form] = []
        self.current: Form | None = None
        self.textarea: str | None = None
        self.select: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "form" and a.get("method", "get").lower() == "post":
            action = a.get("action") or self.page
            multipart = a.get("enctype", "") == "multipart/form-data"
            self.current = Form(self.page, action, {}, {}, multipart)
        elif self.current is None:
            return
        elif tag == "input" and a.get("name"):
            kind = a.get("type", "text").lower()
            if kind in {"submit", "button", "image", "reset"} and a["name"] != "action":
                return
            if kind in {"checkbox", "radio"} and "checked" not in a:
                self.current.kinds.setdefault(a["name"], kind)
                return
            self.current.fields[a["name"]] = a.get("value", "on" if kind == "checkbox" else "")
            self.current.kinds[a["name"]] = kind
        elif tag == "button" and a.get("name"):
            self.current.fields.setdefault(a["name"], a.get("value", ""))
            self.current.kinds.setdefault(a["name"], "button")
        elif tag == "textarea" and a.get("name"):
            self.textarea = a["name"]
            self.current.fields[a["name"]] = ""
            self.current.kinds[a["name"]] = "textarea"
        elif tag == "select" and a.get("name"):
            self.select = a["name"]
            self.current.kinds[a["name"]] = "select"
        elif tag == "option" and self.select:
            value = a.get("value", "")
            if "selected" in a or (self.select not in self.current.fields and value):
                self.current.fields[self.select] = value

    def handle_data(self, data: str) -> None:
        if self.current is not None and self.textarea:
            self.current.fields[self.textarea] += data

    def handle_endtag(self, tag: str) -> None:
        if tag == "textarea":
            self.textarea = None
        elif tag == "select":
            self.select = None
        elif tag == "form" and self.current is not None:
            self.forms.append(self.current)
            self.current = None


def url_pages(world: dict[str, Any]) -> list[str]:
    """Every page of the URL configuration a form may be on: each pattern's parameters filled
    with the world's ids and names (``world["params"]``: name -> candidates)."""
    pages: list[str] = []

    def walk(patterns: list[Any], prefix: str) -> None:
        for pattern in patterns:
            route = prefix + str(pattern.pattern)
            if isinstance(pattern, URLResolver):
                if route.startswith(("api/", "mlflow", "admin/", "github/", "__")):
                    continue  # their own doors below; the admin is Django's
                walk(pattern.url_patterns, route)
            elif isinstance(pattern, URLPattern):
                pages.extend(_fill(route, world["params"]))

    walk(get_resolver().url_patterns, "")
    return sorted(set(pages))


def _fill(route: str, params: dict[str, list[str]]) -> list[str]:
    if route.startswith("^") or "(?P" in route:
        return []
    names = re.findall(r"<(?:\w+:)?(\w+)>", route)
    options: list[str] = ["/" + route]
    for name in names:
        values = params.get(name)
        if not values:
            return []
        options = [
            re.sub(rf"<(?:\w+:)?{name}>", quote(str(value)), option, count=1)
            for option in options
            for value in values
        ]
    return options


def discover_forms(client: Client, pages: list[str]) -> list[Form]:
    forms: dict[tuple[str, tuple[str, ...]], Form] = {}
    for page in pages:
        response = client.get(page)
        if getattr(response, "streaming", False):  # a file (the agent's program)
            _close_files(response)
            continue
        if response.status_code != 200 or "html" not in response.get("Content-Type", ""):
            continue
        reader = _FormReader(page)
        reader.feed(response.content.decode("utf-8", "replace"))
        for form in reader.forms:
            if form.action.startswith(("http:", "https:", "/accounts/logout")):
                continue
            forms.setdefault((form.action, tuple(sorted(form.fields))), form)
    return list(forms.values())


def fuzz_form(fuzzer: Fuzzer, client: Client, form: Form, per_field: int) -> None:
    names = [n for n in form.fields if n not in {"csrfmiddlewaretoken", "action"}]
    names += [n for n in form.kinds if n not in form.fields and n not in names]
    for name in names:
        for cls in fuzzer.rng.sample(sorted(FORM_CLASSES), min(per_field, len(FORM_CLASSES))):
            value = FORM_CLASSES[cls]
            door = "web form"
            what = f"{form.action} {name}={cls}"
            reads_text = form.kinds.get(name) not in IGNORED_KINDS
            must = (reads_text and cls in {"nul", "not UTF-8"}) or (
                cls in {"control characters only", "zero-width only"} and name in {"title", "name"}
            )
            if value is None:
                body = urlencode({**form.fields, name: "x"}).replace(
                    f"{quote(name)}=x",
                    f"{quote(name)}=" + quote(NOT_UTF8.decode("latin-1"), encoding="latin-1"),
                )

                fuzzer.send(
                    door,
                    call(client, "POST", form.action, body, "application/x-www-form-urlencoded"),
                    what=what,
                    name=name,
                    must_refuse=reads_text,
                    names_ok=_says_utf8,
                )
                continue
            data = {**form.fields, name: value}
            fuzzer.send(
                door,
                call(client, "FORM", form.action, data),
                what=what,
                name=name,
                must_refuse=must,
                names_ok=_names_or_null(name),
            )


# ------------------------------------------------------------------ the API


def api_operations(schema: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(path, method, the JSON schema of its body) of every operation taking a body."""
    for path, item in schema.get("paths", {}).items():
        for method, operation in item.items():
            if method not in {"post", "put", "patch"}:
                continue
            body = operation.get("requestBody", {}).get("content", {})
            media = body.get("application/json", {}).get("schema", {})
            yield path, method, _resolve(schema, media)


def _resolve(schema: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    ref = node.get("$ref")
    if ref:
        name = ref.rsplit("/", 1)[-1]
        return dict(schema["components"]["schemas"].get(name, {}))
    return node


def _kind(prop: dict[str, Any], name: str) -> str:
    kind = prop.get("type", "")
    if name in {"title", "name"}:
        return "title"
    if kind == "integer":
        return "integer"
    if kind == "number":
        return "number"
    if kind == "string" and "enum" not in prop and prop.get("format") not in {"uri", "date-time"}:
        return "string"
    return ""


def _plausible(name: str, prop: dict[str, Any], ids: dict[str, int]) -> Any:
    kind = prop.get("type")
    if "enum" in prop:
        return next((v for v in prop["enum"] if v), None)
    if kind == "integer":
        return ids.get(name, 1)
    if kind == "number":
        return 1.0
    if kind == "boolean":
        return False
    if kind == "array":
        return []
    if kind == "object":
        return {}
    if prop.get("format") == "uri":
        return "https://example.org/x"
    return "fuzz"


def fuzz_api(
    fuzzer: Fuzzer, client: Client, schema: dict[str, Any], token: str, per_field: int
) -> None:
    auth = {"HTTP_AUTHORIZATION": f"Token {token}"}
    ids: dict[str, int] = fuzzer.world["ids"]
    for path, method, body_schema in api_operations(schema):
        url = _api_path(path, fuzzer.world)
        if url is None:
            continue
        props = {
            name: _resolve(schema, prop)
            for name, prop in body_schema.get("properties", {}).items()
            if not prop.get("readOnly")
        }
        base = {
            name: _plausible(name, prop, ids)
            for name, prop in props.items()
            if name in body_schema.get("required", [])
        }
        door = f"api {method.upper()} {re.sub(r'{[^}]+}', '{}', path)}"
        targets = sorted(props) or ["unknown_field"]
        for name in targets:
            kind = _kind(props.get(name, {}), name)
            refused = REFUSED_BY_KIND.get(kind, set())
            if kind == "title":
                refused = refused | REFUSED_BY_KIND["string"]
            classes = fuzzer.rng.sample(sorted(JSON_CLASSES), min(per_field, len(JSON_CLASSES)))
            for cls in classes:
                raw = with_raw(base, name, JSON_CLASSES[cls])

                fuzzer.send(
                    door,
                    call(client, method.upper(), url, raw, headers=auth),
                    what=f"{name}={cls}",
                    name=name,
                    must_refuse=cls in refused,
                )


def _api_path(path: str, world: dict[str, Any]) -> str | None:
    ids: dict[str, Any] = world["ids"]
    out = path
    for param in re.findall(r"{(\w+)}", path):
        head = path.rsplit("/api/v1/", maxsplit=1)[-1].split("/", maxsplit=1)[0]
        value = ids.get(param) if param not in {"id", "pk"} else ids.get(head)
        if value is None:
            value = ids.get(head, 1) if param in {"id", "pk"} else None
        if value is None:
            return None
        out = out.replace("{" + param + "}", quote(str(value)))
    return out


# ------------------------------------------------------------------ hand-read doors

# The runner's and agents' bodies are free objects in the schema: their fields, here.
RUNNER_DOORS: dict[str, dict[str, Any]] = {
    "metrics/": {"points": [{"key": "loss", "step": 1, "value": 1.0}]},
    "heartbeat/": {},
    "status/": {"state": "finished", "message": "ok"},
    "report/": {"config": {"lr": 0.1}, "summary": {"loss": 1.0}, "artifacts": []},
    "config/": {"config": {"lr": 0.1}},
    "artifacts/": {"kind": "link", "uri": "https://example.org/x", "name": "x", "step": 1},
}
RUNNER_FIELDS = {
    "metrics/": ["points"],
    "status/": ["state", "failure_kind", "message"],
    "report/": ["config", "summary", "artifacts"],
    "config/": ["config"],
    "artifacts/": ["kind", "uri", "name", "step"],
    "heartbeat/": ["progress"],
}
METRIC_ITEM_FIELDS = ["key", "step", "time"]  # the value's own rule belongs to the metrics


def fuzz_runner(fuzzer: Fuzzer, client: Client, per_field: int) -> None:
    run_id, token = fuzzer.world["run"], fuzzer.world["run_token"]
    auth = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
    for door_path, base in RUNNER_DOORS.items():
        url = f"/api/v1/runs/{run_id}/{door_path}"
        for name in RUNNER_FIELDS[door_path]:
            for cls in fuzzer.rng.sample(sorted(JSON_CLASSES), per_field):
                raw = with_raw(base, name, JSON_CLASSES[cls])
                fuzzer.send(
                    f"runner {door_path}",
                    call(client, "POST", url, raw, headers=auth),
                    what=f"{name}={cls}",
                )
        if door_path == "metrics/":
            for name in METRIC_ITEM_FIELDS:
                for cls in fuzzer.rng.sample(sorted(JSON_CLASSES), per_field):
                    point = with_raw(
                        {"key": "loss", "step": 1, "value": 1.0}, name, JSON_CLASSES[cls]
                    )
                    raw = b'{"points": [' + point + b"]}"
                    fuzzer.send(
                        "runner metrics/",
                        call(client, "POST", url, raw, headers=auth),
                        what=f"points[0].{name}={cls}",
                    )


AGENT_DOORS: dict[str, tuple[dict[str, Any], list[str]]] = {
    "register/": (
        {"name": "host-b", "labels": ["gpu:a5000"], "version": "1.0"},
        ["name", "labels", "version"],
    ),
    "poll/": ({"wait": 0}, ["wait"]),
    "renew/": ({"log_tail": "ok"}, ["log_tail"]),
    "report/": (
        {"outcome": "exited", "exit_code": 0, "message": "ok"},
        ["outcome", "exit_code", "signal", "oom_kills", "cgroup", "message", "log_tail"],
    ),
}


def fuzz_agent(fuzzer: Fuzzer, client: Client, per_field: int) -> None:
    world = fuzzer.world
    for door_path, (base, names) in AGENT_DOORS.items():
        if door_path == "register/":
            url, bearer = "/api/v1/agent/register/", world["registration_token"]
        elif door_path == "poll/":
            url, bearer = "/api/v1/agent/poll/", world["agent_credential"]
        else:
            url = f"/api/v1/agent/leases/{world['lease']}/{door_path}"
            bearer = world["agent_credential"]
        auth = {"HTTP_AUTHORIZATION": f"Bearer {bearer}"}
        for name in names:
            for cls in fuzzer.rng.sample(sorted(JSON_CLASSES), per_field):
                raw = with_raw(base, name, JSON_CLASSES[cls])
                must = name in {"name"} and cls in (
                    REFUSED_BY_KIND["string"] | REFUSED_BY_KIND["title"]
                )
                fuzzer.send(
                    f"agent {door_path}",
                    call(client, "POST", url, raw, headers=auth),
                    what=f"{name}={cls}",
                    name=name,
                    must_refuse=must,
                )


MLFLOW_DOORS: dict[str, tuple[str, dict[str, Any], list[str]]] = {
    "experiments/create": ("POST", {"name": "fuzz"}, ["name"]),
    "experiments/search": ("POST", {"max_results": 10}, ["max_results", "filter", "page_token"]),
    "runs/create": (
        "POST",
        {"experiment_id": "{plan}"},
        ["experiment_id", "start_time", "tags", "run_name"],
    ),
    "runs/update": (
        "POST",
        {"run_id": "{run}", "status": "RUNNING"},
        ["run_id", "status", "end_time", "run_name"],
    ),
    "runs/search": (
        "POST",
        {"experiment_ids": ["{plan}"]},
        ["experiment_ids", "filter", "max_results", "order_by"],
    ),
    "runs/log-batch": (
        "POST",
        {"run_id": "{run}", "params": [], "tags": []},
        ["run_id", "params", "tags"],
    ),
    "runs/log-parameter": (
        "POST",
        {"run_id": "{run}", "key": "lr", "value": "0.1"},
        ["run_id", "key", "value"],
    ),
    "runs/set-tag": (
        "POST",
        {"run_id": "{run}", "key": "t", "value": "v"},
        ["run_id", "key", "value"],
    ),
    "runs/delete-tag": ("POST", {"run_id": "{run}", "key": "t"}, ["run_id", "key"]),
    "runs/delete": ("POST", {"run_id": "{run}"}, ["run_id"]),
}
MLFLOW_GETS = {
    "experiments/get": ["experiment_id"],
    "experiments/get-by-name": ["experiment_name"],
    "runs/get": ["run_id"],
    "metrics/get-history": ["run_id", "metric_key", "max_results", "page_token"],
}
GET_TEXT = {
    "nul": "a\x00b",
    "lone surrogate (escaped)": "%ED%A0%80",
    "huge": "9" * 5000,
    "empty": "",
}


def fuzz_mlflow(fuzzer: Fuzzer, client: Client, per_field: int) -> None:
    world = fuzzer.world
    auth = {"HTTP_AUTHORIZATION": f"Bearer {world['run_token']}"}
    for route, (_method, template, names) in MLFLOW_DOORS.items():
        base = json.loads(
            json.dumps(template)
            .replace('"{run}"', json.dumps(str(world["run"])))
            .replace('"{plan}"', json.dumps(str(world["plan"])))
        )
        url = f"/mlflow/api/2.0/mlflow/{route}"
        for name in names:
            for cls in fuzzer.rng.sample(sorted(JSON_CLASSES), per_field):
                raw = with_raw(base, name, JSON_CLASSES[cls])
                must = (
                    route in {"runs/log-parameter", "runs/set-tag"}
                    and name == "value"
                    and cls in {"nul", "lone surrogate", "low surrogate in text"}
                )
                fuzzer.send(
                    f"mlflow {route}",
                    call(client, "POST", url, raw, headers=auth),
                    what=f"{name}={cls}",
                    name=name,
                    must_refuse=must,
                )
    for route, names in MLFLOW_GETS.items():
        url = f"/mlflow/api/2.0/mlflow/{route}"
        for name in names:
            for cls, text in GET_TEXT.items():
                query = f"run_id={world['run']}&{name}=" + (text if "%" in text else quote(text))
                fuzzer.send(
                    f"mlflow {route}",
                    call(client, "GET", f"{url}?{query}", headers=auth),
                    what=f"{name}={cls}",
                )


def fuzz_webhook(
    fuzzer: Fuzzer, client: Client, sign: Callable[[bytes], str], per_field: int
) -> None:
    """Signed deliveries whose payload carries the hostile classes where GitHub puts text
    and ids: stored and answered 2xx, or refused 4xx; never a 5xx."""
    base = {
        "action": "created",
        "issue": {"number": 1, "title": "t", "body": "b", "user": {"login": "x", "id": 1}},
        "comment": {"id": 1, "body": "/approve", "user": {"login": "x", "id": 1}},
        "repository": {"full_name": "marin-community/marin"},
        "sender": {"login": "x", "id": 1},
    }
    for name in ("action", "issue", "comment", "sender", "repository"):
        for cls in fuzzer.rng.sample(sorted(JSON_CLASSES), per_field):
            raw = with_raw(base, name, JSON_CLASSES[cls])
            headers = {
                "HTTP_X_GITHUB_EVENT": "issue_comment",
                "HTTP_X_GITHUB_DELIVERY": str(uuid.uuid4()),
                "HTTP_X_HUB_SIGNATURE_256": sign(raw),
            }
            fuzzer.send(
                "github webhook",
                call(client, "POST", "/github/webhook/", raw, headers=headers),
                what=f"{name}={cls}",
            )


UPLOAD_LINES: dict[str, bytes] = {
    "deep": DEEP.encode(),
    "nul": b'{"step": 1, "loss": "a\\u0000b"}',
    "surrogate": b'{"step": 1, "key\\ud800": 1.0}',
    "huge integer": b'{"step": ' + b"9" * 5000 + b"}",
    "1e400": b'{"step": 1, "loss": 1e400}',
    "not UTF-8": b'{"step": 1, "loss": "' + NOT_UTF8 + b'"}',
    "not JSON": b"{{{",
    "empty": b"",
    "huge line": b'{"step": 1, "x": "' + b"x" * 2_000_000 + b'"}',
}


def fuzz_uploads(fuzzer: Fuzzer, client: Client, admin: Client) -> None:
    world = fuzzer.world
    auth = {"HTTP_AUTHORIZATION": f"Bearer {world['run_token']}"}
    url = f"/api/v1/runs/{world['run']}/tracker-metrics/"
    for cls, line in UPLOAD_LINES.items():
        body = b'{"step": 0, "loss": 2.0}\n' + line + b"\n"
        fuzzer.send(
            "upload tracker-metrics (stream)",
            call(client, "POST", url + "?strict=1", body, "application/x-ndjson", auth),
            what=cls,
        )
        payload = json.dumps({"jsonl": body.decode("utf-8", "surrogateescape")}, ensure_ascii=True)
        fuzzer.send(
            "upload tracker-metrics (json)",
            call(client, "POST", url, payload, headers=auth),
            what=cls,
        )
        from django.core.files.uploadedfile import SimpleUploadedFile

        fuzzer.send(
            "upload run page",
            call(
                admin,
                "FORM",
                f"/runs/{world['run']}/import/",
                {"file": SimpleUploadedFile("tracker_metrics.jsonl", body), "strict": "on"},
            ),
            what=cls,
        )
