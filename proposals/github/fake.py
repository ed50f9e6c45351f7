"""A small, real HTTP server speaking the part of GitHub's REST API that the sync uses.

GitHub cannot be reached from the test machines, and patching PyGithub would test nothing,
so tests (and the demo, through ``manage.py fake_github``) point ``GITHUB_API_URL`` here.
It serves: the repository, the authenticated user, issues (create, get, edit, list, with
``since``, ``sort``, pull requests among them as GitHub lists them, and a sub-issue's
``parent_issue_url``), issue comments (create, get, edit, list, delete; the repository-wide
list with ``since``), issue labels (add, remove, list), with GitHub's rate-limit headers,
``Link`` pagination (``next`` and ``last``) and ``url`` fields pointing back at itself. An
issue transferred away answers 301.

A primary rate limit can be switched on (``FakeGitHub.rate_limit``): a window of N requests
that resets after some seconds, announced in the headers, and a request sent past it is
answered 403 and counted in ``limit_violations``.

It can be told to fail (``FakeGitHub.fail``): ``5xx``, ``timeout`` (answers too late),
``secondary`` (403 secondary rate limit with Retry-After), ``429`` (with Retry-After),
``primary`` (403 with x-ratelimit-remaining 0) and ``lost`` (the write happens, the answer
never arrives).
"""

from __future__ import annotations

import itertools
import json
import re
import threading
import time
import zlib
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlparse

FAILURE_KINDS = ("5xx", "timeout", "secondary", "429", "primary", "lost")
WRITE_METHODS = frozenset({"POST", "PATCH", "PUT", "DELETE"})


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class FailureRule:
    kind: str
    remaining: int | None  # None: until recover()
    methods: frozenset[str] | None = None
    retry_after: int = 1


@dataclass
class FakeState:
    owner: str
    name: str
    bot_login: str
    token: str
    issues: dict[int, dict[str, Any]] = field(default_factory=dict)
    users: dict[str, int] = field(default_factory=dict)  # lowercased login -> id
    comments: dict[int, dict[str, Any]] = field(default_factory=dict)
    requests: list[tuple[str, str]] = field(default_factory=list)
    rules: list[FailureRule] = field(default_factory=list)
    rate_remaining: int = 5000
    rate_limit: int | None = None  # None: the headers say 5000 left, and nothing is enforced
    rate_window: float = 60.0
    rate_reset: float = 0.0
    limit_violations: int = 0
    moved: dict[int, str] = field(default_factory=dict)  # number -> where it went
    ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1000))


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that gave up (a timeout, a lost answer) is expected here, not an error."""


class FakeGitHub:
    """Start with ``FakeGitHub().start()``; ``.url`` is the API base for PyGithub."""

    def __init__(
        self,
        *,
        repository: str = "marin-community/marin",
        bot_login: str = "marin-site-bot",
        token: str = "",
        host: str = "127.0.0.1",
        port: int = 0,
        timeout_sleep: float = 2.0,
    ) -> None:
        owner, name = repository.split("/", 1)
        self.state = FakeState(owner=owner, name=name, bot_login=bot_login, token=token)
        self.lock = threading.RLock()
        self.timeout_sleep = timeout_sleep
        handler = type("BoundHandler", (_Handler,), {"fake": self})
        self.server = _Server((host, port), handler)
        self.thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}"

    @property
    def repository(self) -> str:
        return f"{self.state.owner}/{self.state.name}"

    def start(self) -> FakeGitHub:
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    # Failure injection.
    def fail(
        self,
        kind: str,
        *,
        times: int | None = None,
        methods: set[str] | None = None,
        retry_after: int = 1,
    ) -> None:
        if kind not in FAILURE_KINDS:
            raise ValueError(f"unknown failure {kind!r}; known: {', '.join(FAILURE_KINDS)}")
        with self.lock:
            self.state.rules.append(
                FailureRule(kind, times, frozenset(methods) if methods else None, retry_after)
            )

    def recover(self) -> None:
        with self.lock:
            self.state.rules.clear()

    def rate_limit(self, *, limit: int | None, window: float = 60.0) -> None:
        """Enforce a primary rate limit of ``limit`` requests per ``window`` seconds (None:
        off again)."""
        with self.lock:
            self.state.rate_limit = limit
            self.state.rate_window = window
            self.state.rate_reset = 0.0
            self.state.rate_remaining = limit if limit is not None else 5000

    def reads(self) -> list[tuple[str, str]]:
        with self.lock:
            return [r for r in self.state.requests if r[0] == "GET"]

    # Reads for tests.
    def issue(self, number: int) -> dict[str, Any]:
        with self.lock:
            return dict(self.state.issues[number])

    def issue_comments(self, number: int) -> list[dict[str, Any]]:
        with self.lock:
            return [dict(c) for c in self.state.comments.values() if c["_issue"] == number]

    def label_names(self, number: int) -> list[str]:
        with self.lock:
            return sorted(label["name"] for label in self.state.issues[number]["labels"])

    def writes(self) -> list[tuple[str, str]]:
        with self.lock:
            return [r for r in self.state.requests if r[0] in WRITE_METHODS]

    # Seeding (an issue someone opened on GitHub).
    def add_issue(
        self,
        *,
        title: str,
        body: Any,
        login: str | None = "octocat",
        labels: list[str] | None = None,
        created_at: str | None = None,
        closed_at: str | None = None,
        parent: int | None = None,
        pull_request: bool = False,
    ) -> dict[str, Any]:
        """An issue (or a pull request, which GitHub lists among issues) opened on GitHub;
        ``login=None`` is an author whose account is gone (``user: null``)."""
        with self.lock:
            issue = self._create_issue(title, body, labels or [], login)
            if created_at:
                issue["created_at"] = issue["updated_at"] = created_at
            if closed_at:
                issue.update(state="closed", state_reason="completed", closed_at=closed_at)
                issue["updated_at"] = max(issue["updated_at"], closed_at)
            if parent is not None:
                issue["parent_issue_url"] = f"{self._repo_url()}/issues/{parent}"
            if pull_request:
                issue["pull_request"] = {"url": f"{self._repo_url()}/pulls/{issue['number']}"}
            return issue

    def edit_issue_by_hand(self, *, number: int, **changes: Any) -> None:
        """Someone edits the issue on GitHub (title, body, state...)."""
        with self.lock:
            self.state.issues[number].update(changes, updated_at=_now())

    def transfer(self, *, number: int, to: str = "someone/else") -> None:
        """The issue moves to another repository: it leaves the lists, and answers 301."""
        with self.lock:
            self.state.issues[number]["_moved"] = True
            self.state.moved[number] = f"{self.url}/repos/{to}/issues/{number}"

    def edit_comment_by_hand(self, *, comment_id: int, body: str) -> None:
        with self.lock:
            self.state.comments[comment_id].update(body=body, updated_at=_now())

    def delete_comment_by_hand(self, *, comment_id: int) -> None:
        with self.lock:
            comment = self.state.comments.pop(comment_id)
            self.state.issues[comment["_issue"]]["comments"] -= 1

    def add_user(self, *, login: str, user_id: int) -> None:
        """A GitHub account that ``GET /users/{login}`` finds (logins match in any case)."""
        with self.lock:
            self.state.users[login.lower()] = user_id

    def label_by_hand(self, *, number: int, name: str, on: bool = True) -> None:
        """Someone puts a label on the issue (or takes it off) on GitHub itself."""
        with self.lock:
            labels = [x for x in self.state.issues[number]["labels"] if x["name"] != name]
            self.state.issues[number]["labels"] = labels + ([self._label(name)] if on else [])

    def add_comment(
        self,
        *,
        number: int,
        body: str,
        login: str | None = "octocat",
        created_at: str | None = None,
    ) -> dict[str, Any]:
        with self.lock:
            comment = self._create_comment(number, body, login)
            if created_at:
                comment["created_at"] = comment["updated_at"] = created_at
            return comment

    # Internals, called with the lock held.
    def _repo_url(self) -> str:
        return f"{self.url}/repos/{self.state.owner}/{self.state.name}"

    def _user(self, login: str | None) -> dict[str, Any] | None:
        if login is None:
            return None
        return {
            "login": login,
            "id": zlib.crc32(login.encode()) % 10_000_000,
            "node_id": f"U_{login}",
            "type": "Bot" if login == self.state.bot_login or login.endswith("[bot]") else "User",
            "url": f"{self.url}/users/{login}",
            "html_url": f"https://github.com/{login}",
        }

    def _label(self, name: str) -> dict[str, Any]:
        return {
            "id": zlib.crc32(name.encode()) % 10_000_000,
            "node_id": f"LA_{name}",
            "name": name,
            "color": "ededed",
            "default": False,
            "description": None,
            "url": f"{self._repo_url()}/labels/{quote(name, safe='')}",
        }

    def _create_issue(
        self, title: str, body: Any, labels: list[str], login: str | None
    ) -> dict[str, Any]:
        number = len(self.state.issues) + 1
        issue_id = next(self.state.ids)
        url = f"{self._repo_url()}/issues/{number}"
        now = _now()
        issue = {
            "id": issue_id,
            "node_id": f"I_{issue_id}",
            "number": number,
            "title": title,
            "body": body,
            "state": "open",
            "state_reason": None,
            "locked": False,
            "labels": [self._label(name) for name in dict.fromkeys(labels)],
            "user": self._user(login),
            "assignees": [],
            "comments": 0,
            "url": url,
            "repository_url": self._repo_url(),
            "labels_url": f"{url}/labels{{/name}}",
            "comments_url": f"{url}/comments",
            "events_url": f"{url}/events",
            "html_url": f"https://github.com/{self.repository}/issues/{number}",
            "created_at": now,
            "updated_at": now,
            "closed_at": None,
        }
        self.state.issues[number] = issue
        return issue

    def _create_comment(self, number: int, body: str, login: str | None) -> dict[str, Any]:
        comment_id = next(self.state.ids)
        now = _now()
        issue = self.state.issues[number]
        comment = {
            "id": comment_id,
            "node_id": f"IC_{comment_id}",
            "body": body,
            "user": self._user(login),
            "url": f"{self._repo_url()}/issues/comments/{comment_id}",
            "html_url": f"{issue['html_url']}#issuecomment-{comment_id}",
            "issue_url": issue["url"],
            "created_at": now,
            "updated_at": now,
            "author_association": "MEMBER",
            "_issue": number,
        }
        self.state.comments[comment_id] = comment
        issue["comments"] += 1
        return comment

    def _repo(self) -> dict[str, Any]:
        return {
            "id": 1,
            "node_id": "R_1",
            "name": self.state.name,
            "full_name": self.repository,
            "owner": self._user(self.state.owner) or {},
            "private": False,
            "url": self._repo_url(),
            "html_url": f"https://github.com/{self.repository}",
            "issues_url": f"{self._repo_url()}/issues{{/number}}",
            "has_issues": True,
            "default_branch": "main",
        }


def _public(obj: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if not k.startswith("_")}


class _Handler(BaseHTTPRequestHandler):
    fake: FakeGitHub
    protocol_version = "HTTP/1.1"
    server_version = "FakeGitHub/1"

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: tests and the demo do not want a line per request."""

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_PATCH(self) -> None:
        self._handle("PATCH")

    def do_DELETE(self) -> None:
        self._handle("DELETE")

    def _send(self, status: int, body: Any = None, headers: dict[str, str] | None = None) -> None:
        data = b"" if body is None else json.dumps(body).encode()
        self.send_response(status)
        state = self.fake.state
        reset = int(state.rate_reset) if state.rate_limit is not None else int(time.time()) + 3600
        merged = {
            "Content-Type": "application/json; charset=utf-8",
            "Content-Length": str(len(data)),
            "X-RateLimit-Limit": "5000",
            "X-RateLimit-Remaining": str(state.rate_remaining),
            "X-RateLimit-Used": str(5000 - state.rate_remaining),
            "X-RateLimit-Reset": str(reset),
            "X-RateLimit-Resource": "core",
            "X-GitHub-Request-Id": f"FAKE:{next(state.ids)}",
            **(headers or {}),
        }
        for name, value in merged.items():
            self.send_header(name, value)
        self.end_headers()
        if data:
            self.wfile.write(data)

    def _body(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        if not length:
            return {}
        raw = self.rfile.read(length)
        parsed = json.loads(raw or b"{}")
        return parsed if isinstance(parsed, dict) else {"_list": parsed}

    def _failure(self, method: str) -> FailureRule | None:
        for rule in self.fake.state.rules:
            if rule.methods is not None and method not in rule.methods:
                continue
            if rule.kind == "lost" and method not in WRITE_METHODS:
                continue
            if rule.remaining is not None:
                if rule.remaining <= 0:
                    continue
                rule.remaining -= 1
            return rule
        return None

    def _handle(self, method: str) -> None:
        url = urlparse(self.path)
        body = self._body() if method in {"POST", "PATCH", "PUT"} else {}
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        fake = self.fake
        with fake.lock:
            fake.state.requests.append((method, url.path))
            rule = self._failure(method)
            over = self._over_limit()
        if over:
            self._send(403, {"message": "API rate limit exceeded for user."})
            return
        if fake.state.token and self.headers.get("Authorization", "").split(" ")[-1] != (
            fake.state.token
        ):
            self._send(401, {"message": "Bad credentials"})
            return
        if rule is not None and rule.kind != "lost":
            self._fail(rule)
            return
        with fake.lock:
            status, payload, headers = self._route(method, unquote(url.path), query, body)
        if rule is not None:  # "lost": the write happened; drop the answer on the floor
            self.close_connection = True
            self.connection.close()
            return
        self._send(status, payload, headers)

    def _over_limit(self) -> bool:
        """Count the request against the primary limit, if one is on; True when sent past it."""
        state = self.fake.state
        if state.rate_limit is None:
            return False
        now = time.time()
        if now >= state.rate_reset:
            state.rate_reset = now + state.rate_window
            state.rate_remaining = state.rate_limit
        if state.rate_remaining <= 0:
            state.limit_violations += 1
            return True
        state.rate_remaining -= 1
        return False

    def _fail(self, rule: FailureRule) -> None:
        if rule.kind == "timeout":
            time.sleep(self.fake.timeout_sleep)
            self._send(504, {"message": "timed out"})
        elif rule.kind == "5xx":
            self._send(502, {"message": "Server Error"})
        elif rule.kind == "secondary":
            self._send(
                403,
                {
                    "message": "You have exceeded a secondary rate limit. Please wait a few "
                    "minutes before you try again.",
                    "documentation_url": "https://docs.github.com/rest/overview/rate-limits-for-the-rest-api",
                },
                {"Retry-After": str(rule.retry_after)},
            )
        elif rule.kind == "429":
            self._send(
                429,
                {"message": "API rate limit exceeded"},
                {"Retry-After": str(rule.retry_after)},
            )
        else:  # primary
            self.fake.state.rate_remaining = 0
            try:
                self._send(
                    403,
                    {"message": "API rate limit exceeded for user."},
                    {"X-RateLimit-Reset": str(int(time.time()) + rule.retry_after)},
                )
            finally:
                self.fake.state.rate_remaining = 5000

    def _route(
        self, method: str, path: str, query: dict[str, str], body: dict[str, Any]
    ) -> tuple[int, Any, dict[str, str]]:
        fake, state = self.fake, self.fake.state
        if path == "/user" and method == "GET":
            return 200, fake._user(state.bot_login), {}
        match = re.fullmatch(r"/users/([^/]+)", path)
        if match and method == "GET":
            login = match.group(1)
            if login.lower() not in state.users:
                return 404, {"message": "Not Found"}, {}
            return 200, {**(fake._user(login) or {}), "id": state.users[login.lower()]}, {}
        if path == "/rate_limit":
            core = {"limit": 5000, "remaining": state.rate_remaining, "reset": 0, "used": 0}
            return 200, {"resources": {"core": core}, "rate": core}, {}
        prefix = f"/repos/{state.owner}/{state.name}"
        if not path.startswith(prefix):
            return 404, {"message": "Not Found"}, {}
        rest = path[len(prefix) :]
        if rest == "" and method == "GET":
            return 200, fake._repo(), {}
        if rest == "/issues/comments" and method == "GET":
            comments = [
                c for c in state.comments.values() if not state.issues[c["_issue"]].get("_moved")
            ]
            comments = self._since(comments, query)
            return self._page(comments, query, f"{prefix}/issues/comments")
        if rest == "/issues":
            if method == "POST":
                if not body.get("title"):
                    return 422, {"message": "Validation Failed"}, {}
                issue = fake._create_issue(
                    body["title"],
                    body.get("body"),
                    list(body.get("labels") or []),
                    state.bot_login,
                )
                return 201, _public(issue), {"Location": issue["url"]}
            if method == "GET":
                return self._page(self._issue_list(query), query, f"{prefix}/issues")
        match = re.fullmatch(r"/issues/comments/(\d+)", rest)
        if match:
            comment = state.comments.get(int(match.group(1)))
            if comment is None:
                return 404, {"message": "Not Found"}, {}
            if method == "GET":
                return 200, _public(comment), {}
            if method == "PATCH":
                comment["body"] = body.get("body", comment["body"])
                comment["updated_at"] = _now()
                return 200, _public(comment), {}
            if method == "DELETE":
                del state.comments[comment["id"]]
                state.issues[comment["_issue"]]["comments"] -= 1
                return 204, None, {}
        match = re.fullmatch(r"/issues/(\d+)(/comments|/labels(?:/(.+))?)?", rest)
        if match:
            found = state.issues.get(int(match.group(1)))
            if found is None:
                return 404, {"message": "Not Found"}, {}
            if found.get("_moved"):
                where = state.moved[found["number"]]
                return 301, {"message": "Moved Permanently", "url": where}, {"Location": where}
            return self._issue_route(
                method=method,
                issue=found,
                sub=match.group(2) or "",
                label_name=match.group(3),
                body=body,
                query=query,
            )
        return 404, {"message": "Not Found"}, {}

    @staticmethod
    def _since(items: list[dict[str, Any]], query: dict[str, str]) -> list[dict[str, Any]]:
        """GitHub's ``since``: only what was updated at or after it; ``sort``/``direction``."""
        if query.get("since"):
            items = [i for i in items if i["updated_at"] >= query["since"]]
        if query.get("sort") == "updated":
            items = sorted(items, key=lambda i: (i["updated_at"], i["id"]))
        if query.get("direction") == "desc":
            items = items[::-1]
        return items

    def _issue_list(self, query: dict[str, str]) -> list[dict[str, Any]]:
        issues = [i for i in self.fake.state.issues.values() if not i.get("_moved")]
        wanted_state = query.get("state", "open")
        if wanted_state != "all":
            issues = [i for i in issues if i["state"] == wanted_state]
        if query.get("labels"):
            wanted = set(query["labels"].split(","))
            issues = [i for i in issues if wanted <= {label["name"] for label in i["labels"]}]
        if query.get("creator"):
            issues = [i for i in issues if i["user"]["login"] == query["creator"]]
        if query.get("since"):
            issues = [i for i in issues if i["updated_at"] >= query["since"]]
        key = "updated_at" if query.get("sort") == "updated" else "number"
        issues.sort(
            key=lambda i: (i[key], i["number"]), reverse=query.get("direction", "desc") == "desc"
        )
        return issues

    def _issue_route(
        self,
        *,
        method: str,
        issue: dict[str, Any],
        sub: str,
        label_name: str | None,
        body: dict[str, Any],
        query: dict[str, str],
    ) -> tuple[int, Any, dict[str, str]]:
        fake = self.fake
        if sub == "":
            if method == "GET":
                return 200, _public(issue), {}
            if method == "PATCH":
                for key in ("title", "body", "state", "state_reason"):
                    if key in body:
                        issue[key] = body[key]
                if "labels" in body:
                    issue["labels"] = [fake._label(n) for n in dict.fromkeys(body["labels"])]
                issue["updated_at"] = _now()
                return 200, _public(issue), {}
        if sub == "/comments":
            if method == "POST":
                if not body.get("body"):
                    return 422, {"message": "Validation Failed"}, {}
                comment = fake._create_comment(issue["number"], body["body"], fake.state.bot_login)
                return 201, _public(comment), {}
            if method == "GET":
                comments = [
                    c for c in fake.state.comments.values() if c["_issue"] == issue["number"]
                ]
                comments = self._since(comments, query)
                return self._page(comments, query, f"/issues/{issue['number']}/comments")
        if sub.startswith("/labels"):
            names = [label["name"] for label in issue["labels"]]
            if method == "POST" and label_name is None:
                added = body.get("labels") or body.get("_list") or []
                names += [n for n in added if n not in names]
                issue["labels"] = [fake._label(n) for n in names]
                issue["updated_at"] = _now()
                return 200, issue["labels"], {}
            if method == "DELETE" and label_name is not None:
                if label_name not in names:
                    return 404, {"message": "Label does not exist"}, {}
                issue["labels"] = [fake._label(n) for n in names if n != label_name]
                issue["updated_at"] = _now()
                return 200, issue["labels"], {}
            if method == "GET":
                return 200, issue["labels"], {}
        return 404, {"message": "Not Found"}, {}

    def _page(
        self, items: list[dict[str, Any]], query: dict[str, str], path: str
    ) -> tuple[int, Any, dict[str, str]]:
        per_page = max(1, min(100, int(query.get("per_page", "30"))))
        page = max(1, int(query.get("page", "1")))
        chunk = [_public(i) for i in items[(page - 1) * per_page : page * per_page]]
        headers = {}
        if page * per_page < len(items):
            rest = {k: v for k, v in query.items() if k != "page"}
            params = "&".join(f"{k}={quote(str(v))}" for k, v in rest.items())
            base = path if path.startswith("/repos") else f"/repos/{self.fake.repository}{path}"
            last = (len(items) + per_page - 1) // per_page
            link = f"{self.fake.url}{base}?{params}&page={page + 1}"
            headers["Link"] = (
                f'<{link}>; rel="next", <{self.fake.url}{base}?{params}&page={last}>; rel="last"'
            )
        return 200, chunk, headers
