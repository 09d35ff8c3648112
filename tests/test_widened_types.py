"""``ALTER COLUMN ... TYPE`` that keeps every value, followed in place.

``integer`` to ``bigint`` (what a table whose ids run out gets), a longer ``varchar`` (Django's
``max_length``, Rails' ``limit``), ``varchar`` to ``text``, a ``numeric`` with more digits and
a finer timestamp change no value, so silver and gold take the new type with no new snapshot:
silver's rows are cast to the wider Spark type in one commit, and changes read against the
older Relation cast their text to it. A type change that can change values (fewer digits, a
narrower integer) is snapshotted again. PostgreSQL is the oracle: ``verify`` after every run,
gold's rows compared with chispa.
"""

from __future__ import annotations

import logging

from pyspark.sql import types as T

from pgmedallion.capture.schema_changes import CatalogColumn, widens
from pgmedallion.pipeline import run_stages
from pgmedallion.verify import verify
from tests.migrations import gold_matches_source, migrate_while_streaming, snapshots, sql
from tests.workload import assert_exact, drop_schemas, make_config

SCHEMA = """
CREATE TABLE d (id int PRIMARY KEY, n int NOT NULL, small int2, s varchar(5),
                m numeric(6,2), ts timestamp(0), note text);
CREATE TABLE f (id int PRIMARY KEY, n int NOT NULL, small int2, s varchar(5),
                m numeric(6,2), ts timestamp(0), note text);
ALTER TABLE f REPLICA IDENTITY FULL;
INSERT INTO d SELECT g, g, g, 'v' || g, g + 0.25, '2024-01-01'::timestamp + g * interval '1 s',
                     'n' || g FROM generate_series(1, 30) g;
INSERT INTO f SELECT * FROM d;
CREATE PUBLICATION pub FOR ALL TABLES;
"""

WIDENED = [
    "ALTER COLUMN n TYPE bigint",
    "ALTER COLUMN small TYPE int",
    "ALTER COLUMN s TYPE varchar(40)",
    "ALTER COLUMN m TYPE numeric(14,4)",
    "ALTER COLUMN ts TYPE timestamp(6)",
    "ALTER COLUMN note TYPE varchar(100)",
]


def _widen(conninfo, table: str) -> None:
    """Rows changed on both sides of the migration, the later ones with values only the wider
    types hold."""
    sql(
        conninfo,
        f"UPDATE {table} SET note = 'before', n = n + 1 WHERE id % 4 = 0",
        f"ALTER TABLE {table} " + ", ".join(WIDENED),
        f"UPDATE {table} SET n = 5000000000 + id, small = 70000, s = repeat('w', 40),"
        " m = 1234567890.1234, ts = '2024-06-01 12:00:00.123456' WHERE id % 3 = 0",
        f"INSERT INTO {table} VALUES (1000, 9000000000, 40000, 'long enough', 0.0001,"
        " '2025-01-01 00:00:00.5', 'x')",
        f"DELETE FROM {table} WHERE id = 5",
    )


def _gold_matches_source(spark, cfg, conninfo, table: str) -> None:
    gold_matches_source(spark, cfg, conninfo, table, ["id", "n", "small", "s", "m", "ts"])


def _types(spark, cfg, layer: str, table: str) -> dict[str, T.DataType]:
    df = spark.table(cfg.qualified(layer, f"public_{table}"))
    return {f.name: f.dataType for f in df.schema.fields if f.name in ("n", "small", "m")}


WIDE = {"n": T.LongType(), "small": T.IntegerType(), "m": T.DecimalType(14, 4)}


def test_a_widened_type_is_followed_in_place(spark, db, caplog):
    sql(db, SCHEMA)
    cfg = make_config(db, "widen")
    drop_schemas(spark, cfg)
    run_stages(spark, cfg)
    for table in ("d", "f"):
        _widen(db, table)
    with caplog.at_level(logging.INFO, logger="pgmedallion"):
        run_stages(spark, cfg)
    assert_exact(verify(spark, cfg))
    assert snapshots(spark, cfg) == 1, "followed without a new snapshot"
    said = [r.getMessage() for r in caplog.records if "widened at the source" in r.getMessage()]
    assert len(said) == 2, said
    for table in ("d", "f"):
        assert _types(spark, cfg, "silver", table) == WIDE
        assert _types(spark, cfg, "gold", table) == WIDE
        _gold_matches_source(spark, cfg, db, table)
    # a later run reads the Relations of before the migration again
    sql(db, "UPDATE d SET n = -n WHERE id < 10", "UPDATE f SET s = 'later' WHERE id < 10")
    run_stages(spark, cfg)
    assert_exact(verify(spark, cfg))
    assert snapshots(spark, cfg) == 1
    # a change that can change values is snapshotted again, by itself, in the same run
    sql(db, "ALTER TABLE d ALTER COLUMN m TYPE numeric(14,1)", "UPDATE d SET m = 1 WHERE id = 1")
    run_stages(spark, cfg)
    assert_exact(verify(spark, cfg))
    assert snapshots(spark, cfg) == 2
    _gold_matches_source(spark, cfg, db, "d")


def test_a_type_widened_while_capture_streams(spark, db, caplog):
    """The migration lands while a continuous capture streams, after its look at the catalog:
    the stream stops before the Relation that gives the column its new type, capture looks
    again and records the widening, and the next session lands the Relation. Exact, with no
    new snapshot."""
    sql(db, SCHEMA)
    cfg = make_config(db, "widenlive")
    drop_schemas(spark, cfg)
    run_stages(spark, cfg)
    migrate_while_streaming(spark, cfg, caplog, lambda: _widen(db, "d"))
    run_stages(spark, cfg)
    assert_exact(verify(spark, cfg))
    assert snapshots(spark, cfg) == 1
    assert _types(spark, cfg, "gold", "d") == WIDE
    _gold_matches_source(spark, cfg, db, "d")


def _column(type_oid: int, typmod: int = -1) -> CatalogColumn:
    return CatalogColumn(2, "c", type_oid, typmod, False, False, False, "")


def _numeric(precision: int, scale: int) -> int:
    return ((precision << 16) | (scale & 0x7FF)) + 4


def test_widens_only_what_keeps_every_value():
    int2, int4, int8, text, varchar, numeric, float4, float8, ts = (
        21, 23, 20, 25, 1043, 1700, 700, 701, 1114
    )  # fmt: skip
    kept = [
        (_column(int2), _column(int8)),
        (_column(int4), _column(int8)),
        (_column(varchar, 14), _column(varchar, 44)),
        (_column(varchar, 44), _column(varchar, 14)),  # ALTER fails on a longer value
        (_column(varchar, 14), _column(text)),
        (_column(numeric, _numeric(6, 2)), _column(numeric, _numeric(14, 4))),
        (_column(numeric, _numeric(6, 2)), _column(numeric)),
        (_column(ts, 0), _column(ts, 6)),
        (_column(ts, 3), _column(ts)),
    ]
    changed = [
        (_column(int8), _column(int4)),
        (_column(float4), _column(float8)),  # 1.1 becomes 1.100000023841858
        (_column(int4), _column(text)),
        (_column(numeric, _numeric(6, 2)), _column(numeric, _numeric(6, 1))),
        (_column(numeric, _numeric(6, 2)), _column(numeric, _numeric(7, 4))),  # 4 digits -> 3
        (_column(numeric), _column(numeric, _numeric(38, 10))),
        (_column(ts, 6), _column(ts, 0)),
        (_column(ts), _column(ts, 3)),
    ]
    assert [widens(a, b) for a, b in kept] == [True] * len(kept)
    assert [widens(a, b) for a, b in changed] == [False] * len(changed)
