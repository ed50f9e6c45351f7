"""Database helpers shared by the apps."""

from __future__ import annotations

from typing import Any

import psycopg
from django.db import connection


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
