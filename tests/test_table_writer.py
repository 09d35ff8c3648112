"""Silver's appends and gold's MERGEs through delta-rs, and through Spark when told so.

Local tables are written by delta-rs (``pgmedallion.core.delta_rs``), everything else by Spark; both
engines must give the same tables. A run over a schema with the types and names people use
(quoted names, NULL keys of a key-less table, numerics, time zones, arrays, JSON, bytes)
ends with ``verify`` exact either way, and the tables' own histories say which engine wrote.
"""

from __future__ import annotations

import psycopg
import pytest
from pyspark.sql import functions as F

from pgmedallion.pipeline import run_stages
from pgmedallion.verify import verify
from tests.workload import assert_exact, drop_schemas, make_config

SCHEMA = r'''
DROP TABLE IF EXISTS "Order Items", loose;
CREATE TABLE "Order Items" (
    "Order ""Id""" bigint PRIMARY KEY,
    amount numeric,
    placed timestamptz,
    tags text[],
    doc jsonb,
    raw bytea
);
CREATE TABLE loose (v text, k int, note text, words text[]);
INSERT INTO "Order Items"
SELECT g, g / 7.0, '2026-01-01 00:00+02'::timestamptz + g * interval '1 hour',
       ARRAY['a' || g, NULL], jsonb_build_object('g', g), decode(md5(g::text), 'hex')
FROM generate_series(1, 200) g;
INSERT INTO loose (k, v, words) VALUES (1, 'one', '{a,b}'), (NULL, 'no key', NULL),
    (NULL, 'no key', NULL), (2, NULL, '{}');
CREATE PUBLICATION pub FOR ALL TABLES;
'''

CHANGES = r'''
UPDATE "Order Items" SET amount = amount * 3, tags = NULL WHERE "Order ""Id""" % 10 = 0;
DELETE FROM "Order Items" WHERE "Order ""Id""" BETWEEN 50 AND 60;
INSERT INTO "Order Items" ("Order ""Id""", amount) VALUES (1000, 12.5), (1001, NULL);
DELETE FROM loose WHERE k IS NULL AND ctid = (SELECT min(ctid) FROM loose WHERE k IS NULL);
INSERT INTO loose (k, v) VALUES (NULL, 'no key');
UPDATE loose SET v = 'two' WHERE k = 2;
'''


def _engines(spark, table: str) -> list[tuple[str, str]]:
    """``(operation, engine)`` of the table's commits, oldest first."""
    rows = (
        spark.sql(f"DESCRIBE HISTORY {table}")
        .orderBy("version")
        .select("operation", F.col("engineInfo"))
        .collect()
    )
    return [(r["operation"], r["engineInfo"] or "") for r in rows]


@pytest.mark.parametrize("engine", ["delta-rs", "spark"])
def test_both_engines_write_the_same_exact_tables(spark, db, engine):
    with psycopg.connect(**db, autocommit=True) as conn:
        conn.execute(SCHEMA)
        conn.execute("ALTER TABLE loose REPLICA IDENTITY FULL")
    setting = "auto" if engine == "delta-rs" else "spark"
    cfg = make_config(db, f"writer_{engine.replace('-', '')}", engine=setting)
    drop_schemas(spark, cfg)
    run_stages(spark, cfg)
    with psycopg.connect(**db, autocommit=True) as conn:
        conn.execute(CHANGES)
    run_stages(spark, cfg)
    assert_exact(verify(spark, cfg), {"public.Order Items": 191, "public.loose": 4})

    for table in ("public_order_items", "public_loose"):
        silver = _engines(spark, cfg.qualified("silver", table))
        gold = _engines(spark, cfg.qualified("gold", table))
        merges = [e for op, e in gold if op == "MERGE"]
        appends = [e for op, e in silver if op in ("WRITE", "APPEND")]
        assert merges and appends, (silver, gold)
        if engine == "delta-rs":
            assert all(e.startswith("delta-rs") for e in merges), gold
            assert appends[-1].startswith("delta-rs"), silver
        else:
            assert not any(e.startswith("delta-rs") for e in merges + appends), (silver, gold)


def test_a_read_through_delta_rs_equals_sparks_read(spark):
    """Column mapping, deletion vectors, time zones, decimals, arrays, and a filter that
    matches nothing (PySpark cannot take an Arrow table of no chunks with a timestamp)."""
    from chispa import assert_df_equality

    from pgmedallion.core import delta_rs

    spark.sql("DROP SCHEMA IF EXISTS writer_read CASCADE")
    spark.sql("CREATE SCHEMA writer_read")
    spark.sql(
        "CREATE TABLE writer_read.t (`id x` BIGINT, at TIMESTAMP, amount DECIMAL(12, 2), "
        "words ARRAY<STRING>, _run BIGINT) USING DELTA TBLPROPERTIES "
        "('delta.columnMapping.mode' = 'name', 'delta.enableDeletionVectors' = 'true')"
    )
    spark.sql(
        "INSERT INTO writer_read.t VALUES (1, TIMESTAMP'2026-01-01 01:00:00', 1.25, "
        "array('a', NULL), 1), (2, NULL, NULL, NULL, 1), (3, TIMESTAMP'2026-06-01 00:00:00', "
        "-3.50, array(), 2)"
    )
    spark.sql("DELETE FROM writer_read.t WHERE `id x` = 2")  # a deletion vector
    table = spark.table("writer_read.t")
    path = delta_rs.schema_dir(spark, "writer_read") + "/t"
    assert delta_rs.small(path, ["id x", "at"])
    schema = table.drop("_run").schema
    for where in (None, "_run = 1", "_run > 5"):
        ours = delta_rs.read(spark, path, schema, where)
        theirs = table.where(where or "true").drop("_run")
        assert_df_equality(ours, theirs, ignore_row_order=True)
    assert delta_rs.read(spark, path, schema, "_run > 5").count() == 0
