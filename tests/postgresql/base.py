"""The tests' PostgreSQL backend: Django's, but a transactional test's database is emptied by
DELETE where Django empties it by TRUNCATE.

A TRUNCATE of the site's 60 tables gives each table, index and TOAST table new files, and
costs 0.4 to 1 s on this machine whether the tables hold rows or not; after a test most are
empty, and a DELETE of each, in one statement with the foreign keys checked at the commit
(Django declares them deferrable), costs 15 to 20 ms (bench/flush.py, side by side; figures in bench/RESULTS.md).
The suite runs several hundred transactional tests, so this is minutes of a run.

Chosen by the settings when bin/test names the run's test database (``TEST_DATABASE_NAME``);
never used by the site itself. A flush that asks more than emptying (restarting the
sequences, or cascading into tables it does not name) is Django's own.
"""

from __future__ import annotations

from typing import Any

from django.db.backends.postgresql import base, operations

# What every flush's post-migrate signal would write back the same: not deleted.
KEPT = frozenset({"django_content_type", "auth_permission"})


class DatabaseOperations(operations.DatabaseOperations):
    def sql_flush(
        self,
        style: Any,
        tables: Any,
        *,
        reset_sequences: bool = False,
        allow_cascade: bool = False,
    ) -> list[str]:
        if not tables or reset_sequences or allow_cascade:
            return super().sql_flush(
                style, tables, reset_sequences=reset_sequences, allow_cascade=allow_cascade
            )
        # The content types and permissions are kept: the flush's post-migrate signal writes
        # them again as they were (half of a flush's time went to that), and no test writes them.
        # The names are the models' own tables, quoted: nothing from a user reaches this SQL.
        deletes = " ".join(
            f"DELETE FROM {self.quote_name(table)};"  # noqa: S608
            for table in tables
            if table not in KEPT
        )
        return [f"SET CONSTRAINTS ALL DEFERRED; {deletes}"]


class DatabaseWrapper(base.DatabaseWrapper):
    ops_class = DatabaseOperations
