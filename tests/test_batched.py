"""The batched paths of silver and gold (``silver.batch``, ``gold.batch``): many small tables of
one run packed into a few Spark jobs, by the same rules the per-table paths apply.

End to end: tables as people write them (REPLICA IDENTITY DEFAULT with a primary key, a
key-less table with duplicates under FULL, floating-point values with NaN and -0.0 and arrays
of them, a text key that changes) take the batched path: gold's first (full) builds and both
stages' increments (silver runs the table with a float array alone: that type has no plain
cast); ``verify`` is exact after every run. ``test_gold_rules`` holds the packed and the
per-table application of gold's rules equal to a plain reference on random diffs.

``[lakehouse] small_table_rows`` is 12 here, so two tables count as large: their first builds go
the per-table path, and their increments are batched when a run brings few diffs (gold's rows
of ``accounts`` found file by file by its primary key, and its old rows deleted by deletion
vector; those of the key-less ``lines``, whose diffs hold a NULL, read narrowed by every
integer column), per table when it brings more. Silver batches both too: ``accounts``'
earlier rows found by the retracted ids, ``lines`` (REPLICA IDENTITY FULL) needs none.
"""

from __future__ import annotations

import logging
import re
from dataclasses import replace

import psycopg

from pgmedallion.pipeline import run_stages
from pgmedallion.verify import verify
from tests.workload import assert_exact, drop_schemas, make_config

SCHEMA = r"""
CREATE TABLE accounts (id bigint PRIMARY KEY, owner text NOT NULL, balance numeric(12,2));
CREATE TABLE readings (id int PRIMARY KEY, x float8, xs float8[], at timestamptz);
CREATE TABLE labels (code text PRIMARY KEY, label text);
CREATE TABLE lines (sku text, qty int);
ALTER TABLE lines REPLICA IDENTITY FULL;
INSERT INTO accounts SELECT g, 'owner ' || g, g * 1.5 FROM generate_series(1, 50) g;
INSERT INTO readings VALUES (1, 'NaN', '{NaN,1}', '2026-01-01 00:00+00'),
    (2, '-0', '{-0,0}', NULL), (3, 'Infinity', NULL, '2026-02-01 12:00+05');
INSERT INTO labels VALUES ('a', 'alpha'), ('b', 'beta'), ('c', 'gamma');
INSERT INTO lines VALUES ('x', 1), ('x', 1), ('y', 2), (NULL, NULL);
INSERT INTO lines SELECT 'w', g FROM generate_series(1, 20) g;
CREATE PUBLICATION pub FOR ALL TABLES;
"""

CHANGES = [
    r"""
    UPDATE accounts SET balance = balance + 1 WHERE id % 5 = 0;
    DELETE FROM accounts WHERE id IN (3, 4);
    INSERT INTO accounts VALUES (100, 'new', NULL);
    UPDATE readings SET x = 'NaN', xs = '{-0}' WHERE id = 2;
    UPDATE readings SET at = NULL WHERE id = 1;
    UPDATE labels SET code = 'z' WHERE code = 'a';
    DELETE FROM lines WHERE ctid = (SELECT min(ctid) FROM lines WHERE sku = 'x');
    INSERT INTO lines VALUES ('y', 2);
    """,
    r"""
    UPDATE accounts SET id = 200 WHERE id = 100;
    UPDATE accounts SET owner = 'again' WHERE id = 5;
    DELETE FROM readings WHERE id = 1;
    UPDATE labels SET label = NULL;
    UPDATE lines SET qty = 3 WHERE sku IS NULL;
    """,
]


def _batched(caplog) -> list[tuple[str, int, int]]:
    """``(stage, batched, per table)`` from the runs' log lines."""
    found = []
    for record in caplog.records:
        m = re.search(r"(\d+) tables batched, (\d+) per table", record.getMessage())
        if m:
            found.append((record.name.split(".")[1], int(m[1]), int(m[2])))
    return found


def test_incremental_runs_of_small_tables_are_batched_and_exact(spark, db, caplog):
    with psycopg.connect(**db, autocommit=True) as conn:
        conn.execute(SCHEMA)
    cfg = make_config(db, "batched")
    cfg = replace(cfg, lakehouse=replace(cfg.lakehouse, small_table_rows=12, driver_rows=12))
    drop_schemas(spark, cfg)
    for step, changes in enumerate(["", *CHANGES]):
        with psycopg.connect(**db, autocommit=True) as conn:
            if changes:
                conn.execute(changes)
            counts = {
                f"public.{t}": conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
                for t in ("accounts", "readings", "labels", "lines")
            }
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="pgmedallion.silver.batch"):
            with caplog.at_level(logging.INFO, logger="pgmedallion.gold.batch"):
                with caplog.at_level(logging.INFO, logger="pgmedallion.silver.build"):
                    run_stages(spark, cfg)
        # The first run: the small tables' full builds batched, silver's snapshots table by
        # table. Then increments, every table batched (readings' float8[] too: the driver casts
        # every type).
        # accounts' first increment (23 diffs) is more than a large table's gold batch takes.
        # Its first build (50 rows, past driver_rows) goes in pieces of 3 keys, in the driver.
        gold = [(3, 1), (3, 1), (4, 0)][step]
        pieces = "`batched_gold`.`public_accounts`: built in 17 pieces"
        assert (pieces in caplog.text) == (step == 0), caplog.text
        expected = [("gold", *gold)] + ([("silver", 4, 0)] if step else [])
        assert sorted(_batched(caplog)) == expected, caplog.text
        too_large = (
            "`batched_gold`.`public_accounts`: built alone (more than 12 diffs into 50 rows)"
        )
        assert (too_large in caplog.text) == (step == 1), caplog.text
        # bronze's window is read by delta-rs when small: its query must not fail (a DataFusion
        # that took octet_length for strings only sent every window to Spark, unnoticed)
        assert "window read through Spark (delta-rs:" not in caplog.text, caplog.text
        assert_exact(verify(spark, cfg), counts)
        if step == 2:
            # accounts' second increment is small enough: its MERGE deleted the old rows by
            # deletion vector and appended the new ones, a commit Spark then read (verify)
            newest = spark.sql("DESCRIBE HISTORY `batched_gold`.`public_accounts`").first()
            assert (newest["operation"], newest["engineInfo"]) == ("MERGE", "pgmedallion")
