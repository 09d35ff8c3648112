"""Silver end to end: a real PostgreSQL through capture and bronze to typed, consolidated diffs."""

from __future__ import annotations

import json
from datetime import date
from decimal import Decimal
from pathlib import Path

import psycopg
import pytest
from chispa import assert_df_equality
from deltalake import DeltaTable
from pyspark.sql import functions as F

from pgmedallion.capture.connection import connect_replication
from pgmedallion.capture.slot import ensure_slot
from pgmedallion.core.config import Config, LakehouseConfig, SourceConfig, TablePolicy
from pgmedallion.core.naming import STATS_COLUMNS, parse_stats_columns
from pgmedallion.pipeline import run_stages, silver_state
from pgmedallion.silver.build import run_silver
from pgmedallion.silver.catalog import load_tables
from pgmedallion.verify import verify

SHOP = """
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
CREATE TABLE items (
    id int PRIMARY KEY, name text NOT NULL, price numeric(10,2), tags text[],
    seen timestamptz, doc jsonb, m mood, big text);
ALTER TABLE items REPLICA IDENTITY FULL;
CREATE TABLE events (k int, v text);
ALTER TABLE events REPLICA IDENTITY FULL;
CREATE TABLE logs (id int PRIMARY KEY, line text);
ALTER TABLE logs REPLICA IDENTITY FULL;
CREATE TABLE "Mixed Case" ("Key" int PRIMARY KEY, "va""lue" text);
ALTER TABLE "Mixed Case" REPLICA IDENTITY FULL;
INSERT INTO items SELECT g, 'item ' || g, g * 1.25, ARRAY['a', NULL, 'b"c'],
    '2024-01-02 03:04:05+02', jsonb_build_object('g', g), 'ok', NULL
    FROM generate_series(1, 200) g;
INSERT INTO events SELECT g % 3, 'dup' FROM generate_series(1, 9) g;
INSERT INTO logs SELECT g, E'tab\\there' FROM generate_series(1, 20) g;
INSERT INTO "Mixed Case" VALUES (1, E'line\\nbreak');
CREATE PUBLICATION pub FOR ALL TABLES;
"""


def make_config(db: dict, name: str, **policies: TablePolicy) -> Config:
    return Config(
        source=SourceConfig(
            name=name,
            host=db["host"],
            port=int(db["port"]),
            dbname=db["dbname"],
            user=db["user"],
            password=db["password"],
            publication="pub",
            slot=f"slot_{name}",
        ),
        lakehouse=LakehouseConfig(
            bronze_schema=f"{name}_bronze",
            silver_schema=f"{name}_silver",
            gold_schema=f"{name}_gold",
        ),
        tables=policies,
    )


def drop_schemas(spark, cfg: Config) -> None:
    for layer in ("bronze", "silver", "gold"):
        spark.sql(f"DROP SCHEMA IF EXISTS `{getattr(cfg.lakehouse, layer + '_schema')}` CASCADE")


@pytest.fixture
def shop(db):
    with psycopg.connect(**db, autocommit=True) as conn:
        conn.execute(SHOP)
    return db


def silver_now(spark, cfg: Config, table: str):
    """The table as silver holds it at its frontier."""
    return silver_state(spark, cfg, _silver_name(spark, cfg, table), None)


def _silver_name(spark, cfg, table):
    return next(t.silver_table for t in load_tables(spark, cfg).values() if t.name == table)


def test_snapshot_and_changes_consolidate_to_the_source(spark, shop):
    cfg = make_config(shop, "sv1", **{"public.logs": TablePolicy(truncate="delete")})
    drop_schemas(spark, cfg)
    run_stages(spark, cfg, ("capture", "silver"))
    with psycopg.connect(**shop, autocommit=True) as conn:
        conn.execute("UPDATE items SET big = repeat('toast', 20000) WHERE id <= 3")
        conn.execute("UPDATE items SET price = price + 1 WHERE id <= 5")  # TOAST unchanged
        conn.execute("DELETE FROM items WHERE id BETWEEN 10 AND 19")
        conn.execute("INSERT INTO items (id, name, tags) VALUES (1000, 'new', '{}')")
        conn.execute("UPDATE items SET id = 2000 WHERE id = 20")  # key change
        with conn.transaction():
            conn.execute("INSERT INTO items (id, name) VALUES (3000, 'gone')")
            conn.execute("DELETE FROM items WHERE id = 3000")
        conn.execute("DELETE FROM events WHERE ctid IN (SELECT ctid FROM events LIMIT 2)")
        conn.execute("INSERT INTO events VALUES (1, 'dup'), (1, 'dup')")
        conn.execute("TRUNCATE logs")
        conn.execute("INSERT INTO logs VALUES (1, 'after truncate')")
        conn.execute("""UPDATE "Mixed Case" SET "va""lue" = 'x' WHERE "Key" = 1""")
    run_stages(spark, cfg, ("capture", "silver"))

    result = verify(spark, cfg, check_gold=False)
    assert result.ok, result.report()
    assert {t.table: t.source_rows for t in result.tables} == {
        "public.items": 191,
        "public.events": 9,
        "public.logs": 1,
        "public.Mixed Case": 1,
    }
    items = silver_now(spark, cfg, "items")
    toasted = items.where("id <= 3").select("id", F.length("big").alias("n")).orderBy("id")
    assert [r["n"] for r in toasted.collect()] == [100_000] * 3
    assert items.where("id = 2000").count() == 1 and items.where("id = 20").count() == 0
    errors = spark.table(cfg.qualified("silver", "_errors")).collect()
    assert errors == []  # truncate of logs is applied as deletes by its policy

    # Consolidation: the insert+delete of 3000 in one transaction left nothing behind.
    diffs = spark.table(cfg.qualified("silver", _silver_name(spark, cfg, "items")))
    assert diffs.where("id = 3000").count() == 0
    assert diffs.where("_diff = 0").count() == 0

    # File statistics of the key, _lsn and _run only: what readers skip files by
    for table, listed in [
        ("items", ["id", "_lsn", "_run"]),
        ("events", ["_lsn", "_run"]),
        ("Mixed Case", ["Key", "_lsn", "_run"]),
    ]:
        name = cfg.qualified("silver", _silver_name(spark, cfg, table))
        detail = spark.sql(f"DESCRIBE DETAIL {name}").first()
        assert parse_stats_columns(detail["properties"][STATS_COLUMNS]) == listed
        where = detail["location"].removeprefix("file:")
        log = Path(where) / "_delta_log"
        fields = json.loads(DeltaTable(where).schema().to_json())["fields"]
        physical = {f["metadata"]["delta.columnMapping.physicalName"]: f["name"] for f in fields}
        adds = [
            json.loads(line)["add"]
            for commit in log.glob("*.json")
            for line in commit.read_text().splitlines()
            if '"add"' in line and json.loads(line).get("add", {}).get("stats")
        ]
        assert adds, table
        for add in adds:
            bounded = json.loads(add["stats"]).get("nullCount", {})
            assert sorted(physical[p] for p in bounded) == sorted(listed), (table, add["path"])


def test_truncate_is_a_definite_error_by_default(spark, shop):
    cfg = make_config(shop, "sv2")
    drop_schemas(spark, cfg)
    run_stages(spark, cfg, ("capture", "silver"))
    with psycopg.connect(**shop, autocommit=True) as conn:
        conn.execute("TRUNCATE events")
        conn.execute("ALTER TABLE logs REPLICA IDENTITY DEFAULT")
        conn.execute("UPDATE logs SET line = 'changed' WHERE id = 1")
    run_stages(spark, cfg, ("capture", "silver"))
    errors = {
        (r["table_name"], r["code"])
        for r in spark.table(cfg.qualified("silver", "_errors")).collect()
    }
    # logs, back to REPLICA IDENTITY DEFAULT, keeps its updates exact through its primary key
    assert errors == {("events", "TableTruncated")}
    # The other tables are unaffected and exact.
    result = verify(spark, cfg, check_gold=False)
    exact = {t.table: t.exact for t in result.tables}
    assert exact["public.items"] and exact["public.Mixed Case"] and exact["public.logs"]


def test_rewind_makes_time_zero_the_state_at_the_slot(spark, shop):
    """Slot created at T, writes, snapshot at S > T: silver at 0 is the table at T, at S the
    table at S, and every later frontier exact."""
    cfg = make_config(shop, "sv3")
    drop_schemas(spark, cfg)
    repl = connect_replication(cfg.source.conninfo())
    try:
        ensure_slot(repl, cfg.source.slot)
    finally:
        repl.close()
    with psycopg.connect(**shop) as conn:
        at_t = sorted(conn.execute("SELECT id, name FROM items").fetchall())
    with psycopg.connect(**shop, autocommit=True) as conn:
        conn.execute("UPDATE items SET name = 'changed before snapshot' WHERE id <= 50")
        conn.execute("DELETE FROM items WHERE id > 150")
        conn.execute("INSERT INTO items (id, name) VALUES (500, 'before snapshot')")
    with psycopg.connect(**shop) as conn:
        at_s = sorted(conn.execute("SELECT id, name FROM items").fetchall())
    run_stages(spark, cfg, ("capture", "silver"))
    name = _silver_name(spark, cfg, "items")

    def state(before):
        rows = silver_state(spark, cfg, name, before).select("id", "name").collect()
        return sorted((r["id"], r["name"]) for r in rows)

    (snapshot_lsn,) = [
        t.snapshot_lsn for t in load_tables(spark, cfg).values() if t.name == "items"
    ]
    assert state(1) == at_t
    assert state(snapshot_lsn + 1) == at_s
    with psycopg.connect(**shop, autocommit=True) as conn:
        conn.execute("UPDATE items SET name = 'after' WHERE id = 500")
    run_stages(spark, cfg, ("capture", "silver"))
    assert verify(spark, cfg, check_gold=False).ok


def test_a_run_with_nothing_new_writes_nothing(spark, shop):
    cfg = make_config(shop, "sv4")
    drop_schemas(spark, cfg)
    run_stages(spark, cfg, ("capture", "silver"))
    again = run_silver(spark, cfg)
    assert again.run is None
    assert spark.table(cfg.qualified("silver", "_progress")).count() == 1

    # A change in one table: only that table's silver table gets a commit, and the run's
    # _progress row lists just it.
    tables = {t.name: t for t in load_tables(spark, cfg).values()}
    versions = {
        name: spark.sql(f"DESCRIBE HISTORY {cfg.qualified('silver', t.silver_table)}").first()[
            "version"
        ]
        for name, t in tables.items()
    }
    with psycopg.connect(**shop, autocommit=True) as conn:
        conn.execute("UPDATE logs SET line = 'changed' WHERE id = 1")
    run_stages(spark, cfg, ("capture", "silver"))
    after = {
        name: spark.sql(f"DESCRIBE HISTORY {cfg.qualified('silver', t.silver_table)}").first()[
            "version"
        ]
        for name, t in tables.items()
    }
    assert {n for n in tables if after[n] != versions[n]} == {"logs"}
    progress = spark.table(cfg.qualified("silver", "_progress")).orderBy("run").collect()
    assert [r["tables"] for r in progress] == [
        sorted(t.oid for t in tables.values()),
        [tables["logs"].oid],
    ]
    assert silver_now(spark, cfg, "logs").where("line = 'changed'").count() == 1


ODD = """
CREATE TABLE odd (id int PRIMARY KEY, d date, n numeric(6,2));
INSERT INTO odd VALUES (1, '2024-01-01', 1.5), (2, 'infinity', 2), (3, '2024-01-03', 'NaN');
CREATE TABLE fine (id int PRIMARY KEY, v text);
INSERT INTO fine VALUES (1, 'a'), (2, 'b');
CREATE PUBLICATION pub FOR ALL TABLES;
"""


def test_snapshot_errors_are_exact_records(spark, db):
    """A value that does not cast and COPY rows with the wrong number of fields give their
    exact error records; the good rows land, and the other table is unaffected."""
    with psycopg.connect(**db, autocommit=True) as conn:
        conn.execute(ODD)
    cfg = make_config(db, "sv5")
    drop_schemas(spark, cfg)
    run_stages(spark, cfg, ("capture",))
    bronze = spark.table(cfg.qualified("bronze", "bronze"))
    record = bronze.where("kind = 'copy' AND table_name = 'odd'").limit(1)
    too_few, too_many = "4\t2024-01-04", "5\t2024-01-05\t1\textra"
    # lines only the Python decoder reads (octal and hex escapes): one good row, one whose
    # date does not cast, and one with too few fields
    octal, hex_date, hex_short = "6\t2024-01-0\\066\t1.25", "7\t\\x41\t1", "\\x38\t1"
    bad_lines = spark.createDataFrame(
        [((line + "\n").encode(),) for line in (too_few, too_many, octal, hex_date, hex_short)],
        "payload binary",
    )
    injected = bad_lines.crossJoin(record.drop("payload")).select(*bronze.columns)
    injected.write.format("delta").mode("append").saveAsTable(cfg.qualified("bronze", "bronze"))
    (copy_lsn,) = {r["lsn"] for r in record.collect()}

    result = run_silver(spark, cfg)
    errors = spark.table(cfg.qualified("silver", "_errors"))
    got = errors.select("table_name", "lsn", "code", "column_name", "raw", "message")
    count = "COPY row has {} fields, expected 3"
    expected = [
        ("odd", 0, "CastError", "n", "NaN", "numeric NaN does not fit DecimalType(6,2)"),
        ("odd", copy_lsn, "ColumnCountMismatch", None, too_many, count.format(4)),
        ("odd", copy_lsn, "MissingColumn", None, too_few, count.format(2)),
        ("odd", 0, "CastError", "d", "A", "invalid date text"),
        ("odd", copy_lsn, "MissingColumn", None, hex_short, count.format(2)),
    ]
    assert_df_equality(
        got,
        spark.createDataFrame(expected, got.schema),
        ignore_row_order=True,
        ignore_nullable=True,
    )
    assert result.errors == 5
    # infinity is clamped by the default policy, and counted
    odd = silver_now(spark, cfg, "odd").select("id", "d", "n").collect()
    assert sorted(tuple(r) for r in odd) == [
        (1, date(2024, 1, 1), Decimal("1.50")),
        (2, date(9999, 12, 31), Decimal("2.00")),
        (6, date(2024, 1, 6), Decimal("1.25")),
    ]
    adjusted = spark.table(cfg.qualified("silver", "_adjustments"))
    assert [tuple(r) for r in adjusted.select("column_name", "code", "count").collect()] == [
        ("d", "Clamped", 1)
    ]
    assert sorted(r["id"] for r in silver_now(spark, cfg, "fine").collect()) == [1, 2]

    # The rows the plain casts left out came in a second append of the run. A crash after both
    # appends, before the run's _progress row: the rerun redoes the run, and Delta skips both
    # appends (and the errors') as done; the rerun still knows the table's errors.
    odd_table = cfg.qualified("silver", _silver_name(spark, cfg, "odd"))
    writes = spark.sql(f"DESCRIBE HISTORY {odd_table}").where("operation = 'WRITE'").count()
    assert writes == 2
    progress = cfg.qualified("silver", "_progress")
    spark.sql(f"DELETE FROM {progress} WHERE run = {result.run}")
    again = run_silver(spark, cfg)
    assert (again.run, again.errors) == (result.run, 5)
    assert spark.sql(f"DESCRIBE HISTORY {odd_table}").where("operation = 'WRITE'").count() == 2
    assert errors.count() == 5
    assert adjusted.count() == 1
    assert sorted(
        tuple(r) for r in silver_now(spark, cfg, "odd").select("id", "d", "n").collect()
    ) == [
        (1, date(2024, 1, 1), Decimal("1.50")),
        (2, date(9999, 12, 31), Decimal("2.00")),
        (6, date(2024, 1, 6), Decimal("1.25")),
    ]
