"""Binary arrays (runs.metrics.pg_arrays) read back by PostgreSQL exactly as they were packed."""

from __future__ import annotations

import math
import sys
from typing import Any

import psycopg
import pytest
from django.db import connection

from runs.metrics import pg_arrays

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif(
        connection.vendor != "postgresql", reason="binary arrays are PostgreSQL's wire format"
    ),
]


def read_back(cast: str, packed: pg_arrays.PackedArray) -> list[Any]:
    connection.ensure_connection()
    with psycopg.Cursor(connection.connection) as cursor:  # binds on the server
        pg_arrays.register(cursor)
        cursor.execute(f"SELECT %s::{cast}", [packed])
        row = cursor.fetchone()
    assert row is not None
    return list(row[0])


def test_int8_extremes_round_trip() -> None:
    items = [0, 1, -1, 2**62, -(2**63), 2**63 - 1, *range(100)]  # >= 64 items: the cached Struct
    assert read_back("bigint[]", pg_arrays.int8_array(items)) == items


def test_float8_round_trips_bit_for_bit() -> None:
    items = [0.1, -0.0, 1e308, -1e-308, 5e-324, sys.float_info.max, 1 / 3, 3.0]
    back = read_back("double precision[]", pg_arrays.float8_array(items))
    assert [math.copysign(1, x) for x in back] == [math.copysign(1, x) for x in items]
    assert [x.hex() for x in back] == [x.hex() for x in items]


def test_float8_nulls_where_none() -> None:
    items = [None, 1.5, None, 2.0]
    assert read_back("double precision[]", pg_arrays.float8_array(items)) == items


def test_text_round_trips_and_repeats() -> None:
    items = ["train/loss", "eval/loss", "train/loss", "ünïcode/λ", ""]
    assert read_back("text[]", pg_arrays.text_array(items)) == items


def test_empty_arrays() -> None:
    assert read_back("bigint[]", pg_arrays.int8_array([])) == []
    assert read_back("double precision[]", pg_arrays.float8_array([])) == []
    assert read_back("text[]", pg_arrays.text_array([])) == []
