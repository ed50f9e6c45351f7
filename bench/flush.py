#!/usr/bin/env python
"""How long emptying the test database takes between transactional tests: Django's flush on
PostgreSQL (one TRUNCATE of every table) against the tests' backend (tests/postgresql: a
DELETE of every table, foreign keys checked at the commit), side by side.

    .venv/bin/python bench/flush.py                       # 10 rounds
    .venv/bin/python bench/flush.py --rounds 20 --database-url postgres://postgres@127.0.0.1:5432/marin_bench_flush

Creates the database (``marin_bench_flush``) if missing and migrates it; then, each round,
writes one user (as a test would leave a row behind) and runs each backend's flush statements,
taking turns, as Django's ``flush`` command runs them (``execute_sql_flush``). Prints each
round's milliseconds, the medians and their ratio. The figures go in bench/RESULTS.md, "the
test suite".
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from ingest import ensure_database  # noqa: E402

ADMIN_URL = "postgres://postgres@127.0.0.1:5432/postgres"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument(
        "--database-url", default="postgres://postgres@127.0.0.1:5432/marin_bench_flush"
    )
    args = parser.parse_args()
    ensure_database(ADMIN_URL, args.database_url.rsplit("/", 1)[1])
    os.environ["DATABASE_URL"] = args.database_url
    os.environ["CELERY_BROKER_URL"] = "memory://"
    os.environ.setdefault("SECRET_KEY", "bench-only-secret-key-" + "x" * 40)
    os.environ["DJANGO_SETTINGS_MODULE"] = "marin_site.settings"
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.contrib.auth.models import User
    from django.core.management import call_command
    from django.core.management.color import no_style
    from django.db import connection
    from django.db.backends.postgresql.operations import DatabaseOperations as Django

    from tests.postgresql.base import DatabaseOperations as Tests

    call_command("migrate", verbosity=0)
    tables = connection.introspection.django_table_names(only_existing=True)
    statements = {
        "truncate (Django)": Django(connection).sql_flush(no_style(), tables),
        "delete (tests)": Tests(connection).sql_flush(no_style(), tables),
    }
    print(f"{len(tables)} tables; {args.rounds} rounds, taking turns")
    took: dict[str, list[float]] = {name: [] for name in statements}
    for i in range(args.rounds):
        for name, sql in statements.items():
            User.objects.create(username=f"flush-{i}-{len(took[name])}")
            started = time.perf_counter()
            connection.ops.execute_sql_flush(sql)
            took[name].append((time.perf_counter() - started) * 1000)
            if User.objects.exists():
                raise SystemExit(f"{name} left a row behind")
    for name, values in took.items():
        rounds = " ".join(f"{v:.0f}" for v in values)
        print(f"{name}: median {statistics.median(values):.1f} ms  (rounds: {rounds})")
    ratio = statistics.median(took["truncate (Django)"]) / statistics.median(took["delete (tests)"])
    print(f"ratio truncate / delete: {ratio:.1f}")


if __name__ == "__main__":
    main()
