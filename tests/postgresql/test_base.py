"""The tests' PostgreSQL backend empties the database as Django's flush does, by DELETE."""

from __future__ import annotations

import os

import pytest
from django.apps import apps
from django.core.management.color import no_style
from django.db import connection

from tests.factories import CommentFactory, ReviewFactory
from tests.postgresql.base import DatabaseOperations

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        connection.vendor != "postgresql", reason="the backend is PostgreSQL's (SQLite deletes)"
    ),
]


def _rows() -> dict[str, int]:
    return {
        model._meta.label: model._base_manager.count()
        for model in apps.get_models()
        if model._meta.managed and not model._meta.proxy
    }


def test_the_flush_empties_every_table_whatever_refers_to_what() -> None:
    # A review and a comment refer to a proposal, which refers to its author and its recipe:
    # DELETE in any order holds because the keys are checked at the commit.
    CommentFactory.create(proposal=ReviewFactory.create().proposal)
    assert sum(_rows().values()) > 4
    ops = DatabaseOperations(connection)
    tables = connection.introspection.django_table_names(only_existing=True)

    kept = {"contenttypes.ContentType", "auth.Permission"}  # what post-migrate writes back
    before = _rows()

    ops.execute_sql_flush(ops.sql_flush(no_style(), tables))

    after = _rows()
    assert {label: n for label, n in after.items() if n and label not in kept} == {}
    assert {label: after[label] for label in kept} == {label: before[label] for label in kept}
    assert before["auth.Permission"] > 0


def test_restarting_sequences_or_cascading_is_djangos_truncate() -> None:
    ops = DatabaseOperations(connection)
    tables = ["auth_user"]
    assert ops.sql_flush(no_style(), tables)[0].startswith("SET CONSTRAINTS ALL DEFERRED;")
    for kwargs in ({"reset_sequences": True}, {"allow_cascade": True}):
        assert ops.sql_flush(no_style(), tables, **kwargs)[0].startswith("TRUNCATE")


def test_bin_test_s_runs_use_it() -> None:
    # bin/test names each run's database; the settings then choose this backend.
    assert os.environ.get("TEST_DATABASE_NAME"), "run through bin/test"
    assert isinstance(connection.ops, DatabaseOperations)
