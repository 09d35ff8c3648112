"""``pgmedallion resync``: every definite-error state of a table is recoverable, and nothing else
is touched. PostgreSQL is the oracle."""

from __future__ import annotations

from dataclasses import replace

import psycopg
import pytest
from chispa import assert_df_equality

from pgmedallion.core.config import ColumnPolicy, TablePolicy
from pgmedallion.pipeline import NotCaptured, request_resync, run_stages
from pgmedallion.verify import verify
from tests.workload import assert_exact, drop_schemas, make_config

SCHEMA = """
CREATE TABLE dropped (id int PRIMARY KEY, keep text, gone text);
CREATE TABLE truncated (id int PRIMARY KEY, v text);
CREATE TABLE odd (id int PRIMARY KEY, ratio numeric);
CREATE TABLE bystander (id int PRIMARY KEY, v text);
INSERT INTO dropped SELECT g, 'k' || g, 'g' || g FROM generate_series(1, 50) g;
INSERT INTO truncated SELECT g, 'v' || g FROM generate_series(1, 50) g;
INSERT INTO odd SELECT g, g / 7.0 FROM generate_series(1, 50) g;
INSERT INTO bystander SELECT g, 'b' || g FROM generate_series(1, 50) g;
CREATE PUBLICATION pub FOR ALL TABLES;
"""
TABLES = ("dropped", "truncated", "odd", "bystander")


def _counts(conninfo) -> dict[str, int]:
    with psycopg.connect(**conninfo) as conn:
        return {
            f"public.{t}": conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in TABLES
        }


def _codes(spark, cfg) -> set[tuple[str, str]]:
    errors = spark.table(cfg.qualified("silver", "_errors")).collect()
    return {(r["table_name"], r["code"]) for r in errors}


def _gold(spark, cfg, name: str):
    return spark.table(cfg.qualified("gold", "public_" + name))


def test_resync_recovers_every_definite_error_and_touches_nothing_else(spark, db):
    """A dropped column (``SchemaIncompatible`` under ``on_schema_change = "error"``), a
    truncate under ``error``
    (``TableTruncated``) and a value that does not cast (``CastError``, fixed by a type
    override): one resync brings all three back to exact, the errors stay as history, and the
    bystander's gold table gets no new commit."""
    with psycopg.connect(**db, autocommit=True) as conn:
        conn.execute(SCHEMA)
    # dropped: a migration stops at SchemaIncompatible (``error``) instead of resyncing itself
    stop = TablePolicy(on_schema_change="error")
    cfg = make_config(
        db, "rs", **{"public.odd": TablePolicy(on_error="warn"), "public.dropped": stop}
    )
    drop_schemas(spark, cfg)
    run_stages(spark, cfg)
    with pytest.raises(NotCaptured, match="public.nope"):
        request_resync(spark, cfg, ["public.nope", "dropped"])
    bronze = spark.table(cfg.qualified("bronze", "bronze"))
    assert bronze.where("kind = 'resync'").count() == 0  # nothing was written

    with psycopg.connect(**db, autocommit=True) as conn:
        conn.execute("ALTER TABLE dropped DROP COLUMN gone")
        conn.execute("UPDATE dropped SET keep = 'after drop' WHERE id <= 5")
        conn.execute("TRUNCATE truncated")
        conn.execute("INSERT INTO truncated VALUES (1000, 'after truncate')")
        conn.execute("INSERT INTO odd VALUES (1000, 'NaN'), (1001, 1e30)")  # no decimal holds
        conn.execute("UPDATE bystander SET v = 'still exact' WHERE id = 1")
    try:
        run_stages(spark, cfg)
    except Exception as e:  # dropped and truncated are under the fail policy
        assert type(e).__name__ == "GoldQualityError"
    assert _codes(spark, cfg) == {
        ("dropped", "SchemaIncompatible"),
        ("truncated", "TableTruncated"),
        ("odd", "CastError"),
    }
    bystander = _gold(spark, cfg, "bystander").localCheckpoint()
    snapshots_before = bronze.where("kind = 'copy'").select("batch_id").distinct().count()

    # the fix for odd: read its ratio as double (NaN and 1e30 are doubles)
    override = TablePolicy(on_error="warn", columns={"ratio": ColumnPolicy(type="double")})
    cfg = replace(cfg, tables={"public.odd": override, "public.dropped": stop})
    assert request_resync(spark, cfg, ["dropped", "public.truncated", "odd"]) == [
        "public.dropped",
        "public.odd",
        "public.truncated",
    ]
    run_stages(spark, cfg)  # a resync interrupted before this run finishes here
    assert_exact(verify(spark, cfg), _counts(db))
    assert_df_equality(_gold(spark, cfg, "bystander"), bystander, ignore_row_order=True)
    # one new snapshot, of the three tables only: the bystander was not read again
    copies = bronze.where("kind = 'copy'")
    assert copies.select("batch_id").distinct().count() == snapshots_before + 1
    newest = copies.agg({"batch_id": "max"}).first()[0]
    assert {r[0] for r in copies.where(f"batch_id = {newest}").select("table_name").collect()} == {
        "dropped",
        "truncated",
        "odd",
    }
    odd = _gold(spark, cfg, "odd")
    assert dict(odd.dtypes)["ratio"] == "double"
    # the old errors are history: still in _errors, no longer holding gold
    assert ("dropped", "SchemaIncompatible") in _codes(spark, cfg)
    with psycopg.connect(**db, autocommit=True) as conn:
        conn.execute("UPDATE dropped SET keep = 'later' WHERE id = 6")
        conn.execute("DELETE FROM truncated WHERE id = 1000")
        conn.execute("UPDATE odd SET ratio = ratio * 2 WHERE id <= 3")
    run_stages(spark, cfg)
    assert_exact(verify(spark, cfg), _counts(db))
