"""The snapshot's chunked COPY reader (asyncpg) against a real server: the same bytes as
psycopg's row-at-a-time reader, whatever the session defaults; the conninfo it can and cannot
translate; and what happens when the consumer leaves early or the server says no."""

from __future__ import annotations

import time

import psycopg
import pytest
from psycopg import sql

from pgmedallion.capture import copy_stream
from pgmedallion.capture.connection import connect
from pgmedallion.capture.errors import TransientError
from pgmedallion.capture.snapshot import (
    copy_range,
    copy_range_chunks,
    estimate_table_block_counts,
    exported_snapshot,
    publication_tables,
    table_schema_at_snapshot,
    use_snapshot,
    worker_ctid_ranges,
)
from tests.test_capture_snapshot import ORDER_ITEMS, PUBLICATION, create_tables, slot_for


def test_conninfo_translation():
    params = copy_stream.asyncpg_params(
        {
            "host": "127.0.0.1",
            "port": "5433",
            "dbname": "shop",
            "user": "capture",
            "password": "s3cret",
            "sslmode": "require",
            "application_name": "pgm-copy",
            "options": "-c search_path=app -c statement_timeout=0",
        }
    )
    assert params is not None
    assert (params["host"], params["port"], params["database"], params["user"]) == (
        "127.0.0.1",
        5433,
        "shop",
        "capture",
    )
    assert params["ssl"] == "require" and params["timeout"] == 30.0
    settings = params["server_settings"]
    assert settings["search_path"] == "app" and settings["application_name"] == "pgm-copy"
    # The capture's own settings win over the caller's options, as in capture.connection.
    assert settings["TimeZone"] == "UTC" and settings["DateStyle"] == "ISO,MDY"
    assert copy_stream.asyncpg_params({"host": "h", "sslmode": "disable"})["ssl"] is False
    # Keys asyncpg cannot honour the same way send the read through psycopg instead.
    for odd in (
        {"host": "a,b"},
        {"host": "h", "sslrootcert": "/etc/ca.pem"},
        {"host": "h", "service": "prod"},
        {"host": "h", "options": "--geqo=off -x"},
        {"host": "h", "sslmode": "bogus"},
    ):
        assert copy_stream.asyncpg_params(odd) is None, odd


def _awkward_session_defaults(conninfo) -> None:
    """Defaults that would change how values print if the reader did not pin its own."""
    with psycopg.connect(**conninfo, autocommit=True) as conn:
        for setting, value in (
            ("DateStyle", "SQL, DMY"),
            ("TimeZone", "Asia/Kathmandu"),
            ("extra_float_digits", "0"),
            ("bytea_output", "escape"),
            ("IntervalStyle", "sql_standard"),
        ):
            conn.execute(
                sql.SQL("ALTER DATABASE {} SET {} = {}").format(
                    sql.Identifier(conninfo["dbname"]), sql.Identifier(setting), sql.Literal(value)
                )
            )


def test_chunks_are_psycopgs_rows_byte_for_byte(any_db):
    conn = connect(any_db)
    create_tables(conn)
    conn.execute("CREATE TABLE public.kinds (t timestamptz, d date, f float8, b bytea, i interval)")
    conn.execute(
        "INSERT INTO public.kinds SELECT '2024-02-29 23:59:59.123456+05:45'::timestamptz + g * "
        "interval '1 day', 'infinity', 1.0 / 3 + g, '\\x00ff5c0a'::bytea, '1 mon 2 days'"
        " FROM generate_series(1, 500) g"
    )
    conn.execute(
        sql.SQL("ALTER PUBLICATION {} ADD TABLE public.kinds").format(sql.Identifier(PUBLICATION))
    )
    _awkward_session_defaults(any_db)
    tables = publication_tables(conn, PUBLICATION)
    assert copy_stream.asyncpg_params(any_db) is not None
    with exported_snapshot(any_db, "tmp_" + slot_for(any_db)) as point:
        reader = connect(any_db)
        use_snapshot(reader, point.snapshot_name)
        blocks = estimate_table_block_counts(reader, [t.oid for t in tables])
        for table in tables:
            schema = table_schema_at_snapshot(reader, table.oid)
            columns = [c.name for c in schema.columns]
            name = (schema.schema, schema.name)
            for ctid_range in worker_ctid_ranges(blocks[table.oid], 3, 140000):
                rows = list(copy_range(any_db, point.snapshot_name, name, columns, ctid_range))
                chunks = list(
                    copy_range_chunks(
                        any_db, point.snapshot_name, name, columns, ctid_range, chunk_bytes=4096
                    )
                )
                assert sum(count for count, _ in chunks) == len(rows)
                assert all(chunk.endswith(b"\n") for _, chunk in chunks)
                assert b"".join(chunk for _, chunk in chunks) == b"".join(
                    row + b"\n" for row in rows
                )
                if name == ORDER_ITEMS:
                    assert len(chunks) > 1  # several chunks per range, not one
        reader.close()


def test_kinds_print_in_the_pinned_formats(db):
    conn = connect(db)
    conn.execute("CREATE TABLE kinds (t timestamptz, d date, f float8, b bytea, i interval)")
    conn.execute(
        "INSERT INTO kinds VALUES ('2024-02-29 23:59:59.5+05:45', 'infinity', 0.1,"
        " '\\x00ff'::bytea, '1 mon 2 days')"
    )
    _awkward_session_defaults(db)
    with exported_snapshot(db, "tmp_" + slot_for(db)) as point:
        ((count, chunk),) = list(
            copy_range_chunks(
                db, point.snapshot_name, ("public", "kinds"), ["t", "d", "f", "b", "i"], (0, None)
            )
        )
    assert count == 1
    assert chunk == b"2024-02-29 18:14:59.5+00\tinfinity\t0.1\t\\\\x00ff\t1 mon 2 days\n"


def _sessions(conninfo, application_name: str) -> int:
    with psycopg.connect(**conninfo, autocommit=True) as conn:
        (count,) = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
            (application_name,),
        ).fetchone()
    return count


def test_a_consumer_that_leaves_early_ends_the_session(db):
    conn = connect(db)
    conn.execute(
        "CREATE TABLE big AS SELECT g AS id, repeat('x', 200) AS pad"
        " FROM generate_series(1, 200000) g"
    )
    session = {**db, "application_name": "pgm-copy-early"}
    with exported_snapshot(db, "tmp_" + slot_for(db)) as point:
        chunks = copy_range_chunks(
            session, point.snapshot_name, ("public", "big"), ["id", "pad"], (0, None), 65536
        )
        count, first = next(chunks)
        assert count > 0 and first.startswith(b"1\t")
        chunks.close()
        deadline = time.monotonic() + 10
        while _sessions(db, "pgm-copy-early") and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _sessions(db, "pgm-copy-early") == 0


def test_server_refusals_are_capture_errors_without_the_password(db):
    conn = connect(db)
    conn.execute("CREATE TABLE locked (id int)")
    with exported_snapshot(db, "tmp_" + slot_for(db)) as point:
        holder = connect(db)
        holder.execute("BEGIN")
        holder.execute("LOCK TABLE locked IN ACCESS EXCLUSIVE MODE")
        with pytest.raises(TransientError) as locked:
            list(
                copy_range_chunks(db, point.snapshot_name, ("public", "locked"), ["id"], (0, None))
            )
        assert locked.value.sqlstate == "55P03"
        holder.execute("ROLLBACK")
        wrong = {**db, "password": "not-the-Password-42"}
        with pytest.raises(TransientError) as refused:
            list(
                copy_range_chunks(
                    wrong, point.snapshot_name, ("public", "locked"), ["id"], (0, None)
                )
            )
        assert "cannot connect to" in str(refused.value)
        assert "not-the-Password-42" not in str(refused.value)
        assert db["password"] not in str(refused.value)
