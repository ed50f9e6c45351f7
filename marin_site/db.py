"""Database helpers shared by the apps: where PostgreSQL-specific SQL lives, each with its
portable fallback beside it (any other database, SQLite for one machine, takes the fallback).

Elsewhere, by design: the full-text search's PostgreSQL path and its ``icontains`` fallback
are in ``proposals/search.py``; the metrics ingest, the series reads and the steady-state
median keep theirs in ``runs/`` (``runs/metrics/ingest.py``, ``runs/series/``,
``runs/metrics/steady.py``).
"""

from __future__ import annotations

from typing import Any

import psycopg
from django.db import IntegrityError, connection, transaction
from django.db.models import Model


def server_binding_cursor() -> Any:
    """A Django cursor (query logging, error wrapping, execute wrappers) over a psycopg cursor
    that sends its parameters apart from the statement, bound by PostgreSQL.

    Django's own cursor quotes every parameter into the statement text on the client. For
    the hot writes that is the slow way: a webhook body is escaped and then parsed back as a
    literal, and the metrics ingest's binary arrays would be turned back into text. On any
    other database this is Django's own cursor (SQLite binds parameters itself)."""
    if connection.vendor != "postgresql":
        return connection.cursor()
    connection.ensure_connection()
    raw: Any = psycopg.Cursor(connection.connection)  # Django's wrappers take any DB-API cursor
    if connection.queries_logged:
        return connection.make_debug_cursor(raw)
    return connection.make_cursor(raw)


def exclusive_for_transaction(name: str) -> bool:
    """Take the named lock for the rest of the current transaction, without waiting; False
    when another transaction holds it. For work that must run one at a time across worker
    processes (the webhook drain keeps deliveries in the order they arrived).

    PostgreSQL: a transaction-level advisory lock. Elsewhere True: SQLite's transactions
    here begin IMMEDIATE, so writers already take turns for the whole database."""
    if connection.vendor != "postgresql":
        return True
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_xact_lock(hashtext(%s))", [name])
        row = cursor.fetchone()
    return bool(row and row[0])


def row_insert_unless_present(*, model: type[Model], unique: str, values: dict[str, Any]) -> bool:
    """Insert one row of ``model`` unless a row with the same ``unique`` field exists; True
    when inserted. ``values`` maps field names to values; name every field without a
    database default (the fallback would fill in the model's defaults, the statement not).

    On PostgreSQL this is one statement, ``INSERT ... ON CONFLICT DO NOTHING RETURNING``:
    no exception and no savepoint for a duplicate, and the values bound by the server (a
    large text goes as a parameter, not escaped into the statement).
    """
    if connection.vendor != "postgresql":
        return _row_insert_unless_present_portable(model=model, values=values)
    meta = model._meta
    quote = connection.ops.quote_name
    column = {field.name: field.column for field in meta.concrete_fields}
    columns = ", ".join(quote(column[name]) for name in values)
    placeholders = ", ".join(["%s"] * len(values))
    statement = (
        f"INSERT INTO {quote(meta.db_table)} ({columns}) VALUES ({placeholders}) "  # noqa: S608  (names are ours; values are parameters)
        f"ON CONFLICT ({quote(column[unique])}) DO NOTHING RETURNING 1"
    )
    with server_binding_cursor() as cursor:
        cursor.execute(statement, list(values.values()))
        return cursor.fetchone() is not None


def _row_insert_unless_present_portable(*, model: type[Model], values: dict[str, Any]) -> bool:
    """Any database: the ORM's insert in a savepoint; the unique constraint's refusal means
    the row was there."""
    try:
        with transaction.atomic():
            model._default_manager.create(**values)
    except IntegrityError:
        return False
    return True
