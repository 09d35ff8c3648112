"""Capture into bronze against a real PostgreSQL: snapshot, stream, acknowledgement."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest
from pyspark.sql import functions as F

from pgmedallion.bronze.spark_table import copy_row_counts
from pgmedallion.bronze.table import copy_lines
from pgmedallion.capture.connection import connect_replication
from pgmedallion.capture.copy_text import decode_copy_row
from pgmedallion.capture.pgoutput import Delete, Insert, Update, decode
from pgmedallion.capture.run import CaptureOptions, CaptureTarget, bronze_of, capture_once
from pgmedallion.capture.slot import ensure_slot, slot_state
from tests.capture_child import complete_transactions, replay

HOSTILE_SCHEMA = 'Sales "EU"'
HOSTILE_TABLE = "Order Items; DROP TABLE x"


def capture(spark, target, **options):
    """One capture run into ``target``'s bronze through ``spark``'s session."""
    return capture_once(bronze_of(spark, target), target, CaptureOptions(**options))


@pytest.fixture
def shop(any_db):
    with psycopg.connect(**any_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE customers (id int PRIMARY KEY, name text)")
        conn.execute("CREATE TABLE notes (id int PRIMARY KEY, body text)")
        conn.execute(
            psycopg.sql.SQL("CREATE SCHEMA {}").format(psycopg.sql.Identifier(HOSTILE_SCHEMA))
        )
        conn.execute(
            psycopg.sql.SQL('CREATE TABLE {}.{} ("qté" int, "Note\tTab" text)').format(
                psycopg.sql.Identifier(HOSTILE_SCHEMA), psycopg.sql.Identifier(HOSTILE_TABLE)
            )
        )
        conn.execute(
            psycopg.sql.SQL("ALTER TABLE {}.{} REPLICA IDENTITY FULL").format(
                psycopg.sql.Identifier(HOSTILE_SCHEMA), psycopg.sql.Identifier(HOSTILE_TABLE)
            )
        )
        conn.execute("INSERT INTO customers SELECT g, 'c' || g FROM generate_series(1, 3000) g")
        conn.execute(
            "INSERT INTO notes SELECT g, E'tab\\there\\nnewline' FROM generate_series(1, 50) g"
        )
        conn.execute(
            psycopg.sql.SQL(
                "INSERT INTO {}.{} SELECT g, NULL FROM generate_series(1, 10) g"
            ).format(psycopg.sql.Identifier(HOSTILE_SCHEMA), psycopg.sql.Identifier(HOSTILE_TABLE))
        )
        conn.execute("CREATE PUBLICATION pub FOR ALL TABLES")
    return any_db


def _bronze(spark, name: str) -> str:
    spark.sql("CREATE SCHEMA IF NOT EXISTS bronze_test")
    spark.sql(f"DROP TABLE IF EXISTS bronze_test.{name}")
    return f"bronze_test.{name}"


def test_snapshot_then_stream_lands_everything_once(spark, shop, any_pg):
    target = CaptureTarget(
        shop,
        source="shop",
        publication="pub",
        slot=f"pgm_{any_pg.major}",
        bronze=_bronze(spark, f"b{any_pg.major}"),
    )
    first = capture(spark, target, workers=3)
    assert first.snapshotted == {
        "public.customers": 3000,
        "public.notes": 50,
        f"{HOSTILE_SCHEMA}.{HOSTILE_TABLE}": 10,
    }
    bronze = spark.table(target.bronze)
    kinds = {r["kind"]: r["count"] for r in bronze.groupBy("kind").count().collect()}
    assert kinds["rewind"] == 3 and kinds["schema"] == 3
    copies = copy_row_counts(bronze.where("kind = 'copy'"))
    copied = {r["table_name"]: r["rows"] for r in copies.collect()}
    assert copied == {"customers": 3000, "notes": 50, HOSTILE_TABLE: 10}

    def rows_of(table: str) -> list[tuple]:
        where = F.col("kind") == "copy", F.col("table_name") == table
        records = bronze.where(where[0] & where[1]).orderBy("part", "ordinal").collect()
        return [decode_copy_row(line) for r in records for line in copy_lines(r["payload"])]

    rows = rows_of("notes")
    assert rows[0][1] == "tab\there\nnewline"
    ids = sorted(int(row[0]) for row in rows_of("customers"))
    assert ids == list(range(1, 3001))

    with psycopg.connect(**shop, autocommit=True) as conn:
        conn.execute("INSERT INTO customers VALUES (5000, 'new')")
        conn.execute("UPDATE customers SET name = 'renamed' WHERE id = 1")
        conn.execute("DELETE FROM customers WHERE id = 2")
    second = capture(spark, target)
    assert second.snapshotted == {}  # no table is snapshotted twice
    wal = spark.table(target.bronze).where("kind = 'wal'").orderBy("lsn", "ordinal").collect()
    changes = [decode(r["payload"]) for r in wal]
    assert [type(m) for m in changes if isinstance(m, Insert | Update | Delete)] == [
        Insert,
        Update,
        Delete,
    ]
    frontier = spark.table(target.bronze).where("kind = 'progress'").agg(F.max("lsn")).first()[0]
    assert second.frontier == frontier
    assert max(r["lsn"] for r in wal) < frontier
    with psycopg.connect(**shop) as conn:
        state = slot_state(conn, target.slot)
    assert state.confirmed_flush_lsn == frontier  # acknowledged exactly what bronze holds
    batch_ids = [
        r["batch_id"] for r in spark.table(target.bronze).select("batch_id").distinct().collect()
    ]
    assert sorted(batch_ids) == list(range(len(batch_ids)))


def test_writes_during_the_snapshot_are_counted_exactly_once(spark, any_db, any_pg):
    """Snapshot rows plus the changes above the snapshot LSN rebuild the source exactly."""
    with psycopg.connect(**any_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 20000) g")
        conn.execute("CREATE PUBLICATION pub FOR TABLE t")
    target = CaptureTarget(
        any_db,
        source="concurrent",
        publication="pub",
        slot=f"conc_{any_pg.major}",
        bronze=_bronze(spark, f"concurrent{any_pg.major}"),
    )
    repl = connect_replication(any_db)
    ensure_slot(repl, target.slot)  # the stream starts here, before the writes and snapshot
    repl.close()
    stop, written = threading.Event(), []

    def writer():
        next_id = 100_000
        with psycopg.connect(**any_db, autocommit=True) as conn:
            while not stop.is_set():
                with conn.transaction():
                    conn.execute(
                        "INSERT INTO t SELECT g, 'new' FROM generate_series(%s, %s) g",
                        (next_id, next_id + 9),
                    )
                    conn.execute(
                        "UPDATE t SET v = v || '+' WHERE id IN"
                        " (SELECT id FROM t ORDER BY random() LIMIT 5)"
                    )
                    conn.execute(
                        "DELETE FROM t WHERE id IN (SELECT id FROM t ORDER BY random() LIMIT 2)"
                    )
                next_id += 10
                written.append(next_id)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        while len(written) < 20:
            time.sleep(0.05)
        first = capture(spark, target, workers=3)  # the writer keeps going throughout
    finally:
        stop.set()
        thread.join()
    capture(spark, target)
    rows = [r.asDict() for r in spark.table(target.bronze).collect()]
    commits = complete_transactions(rows)
    assert any(lsn <= first.snapshot_lsn for lsn in commits)  # rewound: in the snapshot
    assert any(lsn > first.snapshot_lsn for lsn in commits)  # applied on top of it
    with psycopg.connect(**any_db) as conn:
        source = {r[0]: tuple(r) for r in conn.execute("SELECT id::text, v FROM t").fetchall()}
    assert replay(rows, "public", "t") == source
