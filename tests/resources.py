"""What one run of the suite holds on a shared machine, so that two suites never meet:
its own PostgreSQL test database and its own Redis databases (for the broker tests).

``bin/test`` calls ``python -m tests.resources claim`` before pytest and ``release`` after;
pytest's workers (pytest-xdist) each take one Redis database of the run's range
(``worker_redis_url``), as pytest-django gives each its own test database (``_gw0``...).

    claim     checks that the database answers (at once, naming the variable to fix when it
              does not), picks a test database name no other run uses, claims a free range
              of Redis databases, and prints them as shell ``export`` lines
    release   drops this run's test databases left behind (a run killed halfway) and frees
              its Redis range
"""

from __future__ import annotations

import os
import re
import socket
import sys
import time
import uuid
from typing import Any
from urllib.parse import urlsplit, urlunsplit

REDIS_DATABASES = 16  # Redis' default
WORKERS_MAX = 4  # Redis databases a run may use: one per pytest process of its passes
LOCK_SECONDS = 3 * 3600  # a run killed without release frees its range after this
LOCK_KEY = "marin-site:test-run:redis-db:{}"


def worker_index() -> int:
    """This process's pytest-xdist worker number (``gw1`` -> 1), 0 without xdist."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    match = re.fullmatch(r"gw(\d+)", worker)
    return int(match.group(1)) if match else 0


def worker_redis_url(url: str) -> str:
    """The Redis database of this worker: the run's first database, minus the worker number."""
    parts = urlsplit(url)
    base = int(parts.path.strip("/") or "0")
    index = worker_index()
    if index >= WORKERS_MAX or base - index < 0:
        raise RuntimeError(
            f"worker gw{index} has no Redis database of its own below {url}: "
            f"run at most {WORKERS_MAX} workers, with TEST_REDIS_URL at database "
            f"{WORKERS_MAX - 1} or above"
        )
    return urlunsplit(parts._replace(path=f"/{base - index}"))


def _database_check(url: str) -> str:
    """Why the database of ``url`` cannot be reached, or "" when it answers."""
    import psycopg

    try:
        psycopg.connect(_libpq(url), connect_timeout=3).close()
    except psycopg.Error as exc:
        return str(exc).strip().splitlines()[0]
    return ""


def _libpq(url: str) -> str:
    return url.replace("postgres://", "postgresql://", 1)


def _holder_gone(value: bytes | None) -> bool:
    """Whether a lock's holder (``host:pid:...``, the bin/test that claimed it) is a process
    of this machine that no longer runs: a run killed before its release."""
    if value is None:
        return True
    host, _, rest = value.decode(errors="replace").partition(":")
    pid = rest.partition(":")[0]
    if host != socket.gethostname() or not pid.isdecimal():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _take(client: Any, key: str, run_id: str) -> bool:
    """Hold ``key``: free, or held by a run of this machine that is gone (compare and set)."""
    import redis

    if client.set(key, run_id, nx=True, ex=LOCK_SECONDS):
        return True
    with client.pipeline() as pipe:
        try:
            pipe.watch(key)
            if not _holder_gone(pipe.get(key)):
                return False
            pipe.multi()
            pipe.set(key, run_id, ex=LOCK_SECONDS)
            pipe.execute()
        except redis.WatchError:  # another run took it meanwhile
            return False
    return True


def _redis_claim(url: str, run_id: str) -> str:
    """The first range of ``WORKERS_MAX`` Redis databases no other run holds, as a URL of
    its highest database; the lock lives in database 0, names the bin/test that holds it
    (a range whose holder is gone is taken over) and expires if never released."""
    import redis

    parts = urlsplit(url)
    wanted = int(parts.path.strip("/") or str(REDIS_DATABASES - 1))
    client = redis.Redis.from_url(urlunsplit(parts._replace(path="/0")))
    candidates = [wanted] + [
        db for db in range(REDIS_DATABASES - 1, WORKERS_MAX - 1, -WORKERS_MAX) if db != wanted
    ]
    for db in candidates:
        if db - WORKERS_MAX + 1 < 1:  # database 0 holds the locks
            continue
        if _take(client, LOCK_KEY.format(db), run_id):
            return urlunsplit(parts._replace(path=f"/{db}"))
    raise SystemExit(
        "bin/test: every range of Redis databases is held by another run of the suite; "
        "wait for one to end, or set TEST_REDIS_URL to a Redis server of your own."
    )


def claim() -> int:
    # Who holds what: this machine, the bin/test that asked (TEST_RUN_OWNER), a random part.
    owner = os.environ.get("TEST_RUN_OWNER") or str(os.getppid())
    run_id = f"{socket.gethostname()}:{owner}:{uuid.uuid4().hex[:8]}"
    lines = [f"export TEST_RUN_ID={run_id}"]
    url = os.environ.get("DATABASE_URL", "")
    if url.startswith("postgres"):
        problem = _database_check(url)
        if problem:
            print(
                f"bin/test: the database of DATABASE_URL does not answer: {problem}\n"
                "  Start PostgreSQL, or set DATABASE_URL to one that answers "
                "(DATABASE_URL= runs the suite on SQLite).",
                file=sys.stderr,
            )
            return 2
        if not os.environ.get("TEST_DATABASE_NAME"):
            stamp = time.strftime("%Y%m%d%H%M%S")
            lines.append(f"export TEST_DATABASE_NAME=test_marin_{stamp}_{run_id.rsplit(':', 1)[1]}")
    redis_url = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
    lines.append(f"export TEST_REDIS_URL={_redis_claim(redis_url, run_id)}")
    lines.append(f"export TEST_REDIS_RANGE={WORKERS_MAX}")
    print("\n".join(lines))
    return 0


def release() -> int:
    url = os.environ.get("DATABASE_URL", "")
    name = os.environ.get("TEST_DATABASE_NAME", "")
    if url.startswith("postgres") and name.startswith("test_marin_"):
        import psycopg
        from psycopg import sql

        with psycopg.connect(_libpq(url), autocommit=True, connect_timeout=3) as conn:
            rows = conn.execute(
                "SELECT datname FROM pg_database WHERE datname = %s OR datname LIKE %s",
                [name, f"{name}\\_gw%"],
            ).fetchall()
            for (database,) in rows:
                conn.execute(
                    sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                        sql.Identifier(database)
                    )
                )
    redis_url = os.environ.get("TEST_REDIS_URL", "")
    run_id = os.environ.get("TEST_RUN_ID", "")
    if redis_url and run_id:
        import redis

        parts = urlsplit(redis_url)
        client = redis.Redis.from_url(urlunsplit(parts._replace(path="/0")))
        key = LOCK_KEY.format(int(parts.path.strip("/") or "0"))
        if client.get(key) == run_id.encode():
            client.delete(key)
    return 0


if __name__ == "__main__":
    command = sys.argv[1] if len(sys.argv) > 1 else ""
    if command not in {"claim", "release"}:
        print("usage: python -m tests.resources claim|release", file=sys.stderr)
        raise SystemExit(2)
    raise SystemExit(claim() if command == "claim" else release())
