"""Upkeep (``pgmedallion.maintain``): silver's applied diffs consolidated, gold's and the
bookkeeping tables' small files compacted, and every table still exact.

The type-rich workload (default replica identity with TOAST and arrays, a key-less multiset
table, primary-key changes, a partitioned table) goes through several runs, then upkeep with a
threshold of one file compacts everything; PostgreSQL is the oracle before and after, and so
for runs after it (previous images resolved from consolidated rows, gold's increments reading
only the runs after the ones it applied). A table held back by gold keeps its diffs above
gold's frontier as they were.
"""

from __future__ import annotations

from dataclasses import replace

import psycopg
import pytest
from chispa import assert_df_equality
from pyspark.sql import functions as F

from pgmedallion.core.config import TablePolicy
from pgmedallion.gold.history import read_reported
from pgmedallion.gold.quality import GoldQualityError
from pgmedallion.maintain import maintain
from pgmedallion.pipeline import run_stages, silver_state
from pgmedallion.silver.catalog import load_tables
from pgmedallion.verify import verify
from tests.workload import Workload, assert_exact, drop_schemas, make_config

TABLES = ("public.accounts", "public.events", "public.ledger", 'public."LineItems"')


def _silver(spark, cfg, table: str):
    return spark.table(cfg.qualified("silver", table))


def test_upkeep_consolidates_applied_diffs_and_keeps_every_table_exact(spark, db):
    wl = Workload(db, 23, tables=TABLES, initial_rows=60)
    wl.create()
    cfg = make_config(db, "upkeep")
    drop_schemas(spark, cfg)
    run_stages(spark, cfg)
    for _ in range(2):
        wl.burst(transactions=30)
        result = run_stages(spark, cfg)
        # what a run's upkeep takes from gold's result instead of reading it again
        assert result.gold.reported() == read_reported(spark, cfg)
        known = load_tables(spark, cfg)
        assert [known[o.table.oid].silver_table for o in result.gold.tables] == [
            o.table.silver_table for o in result.gold.tables
        ]
    assert_exact(verify(spark, cfg), wl.counts())
    before = {t: _silver(spark, cfg, t).count() for t in ("public_accounts", "public_events")}
    states = {
        t: silver_state(spark, cfg, t, None).cache() for t in ("public_accounts", "public_events")
    }
    for df in states.values():
        df.count()

    # a continuous pipeline's round: one table per step, each table once, then an empty step
    compacted: set = set()
    done = []
    while step := maintain(spark, cfg, files=1, limit=1, compacted=compacted):
        assert len(step) == 1, step
        done += step
    assert 2 < len(done) <= len(compacted), (done, compacted)
    assert "silver public_accounts: applied diffs consolidated" in done, done
    # gold's tables: files compacted where there were several (MERGEs add files)
    gold_files = [d for d in done if d.startswith("gold public_")]
    assert all(d.endswith("files compacted") for d in gold_files), done
    assert any(d.startswith("silver _progress") for d in done), done
    if cfg.lakehouse.engine != "spark":  # local tables: compacted without a Spark job
        newest = spark.sql(f"DESCRIBE HISTORY {cfg.qualified('silver', 'public_accounts')}")
        assert newest.first()["engineInfo"].startswith("delta-rs"), newest.first()
        for d in gold_files:
            table = cfg.qualified("gold", d.split()[1])
            newest = spark.sql(f"DESCRIBE HISTORY {table}").first()
            assert (newest["operation"], newest["engineInfo"]) == ("OPTIMIZE", "pgmedallion")
    for table, state in states.items():
        silver = _silver(spark, cfg, table)
        # fewer rows, one per row value with a nonzero sum, summing to the same state
        assert silver.count() < before[table]
        assert (
            silver.groupBy(*[c for c in silver.columns if c not in ("_lsn", "_diff", "_run")])
            .count()
            .where("count > 1")
            .count()
            == 0
        )
        assert_df_equality(
            silver_state(spark, cfg, table, None),
            state,
            ignore_row_order=True,
            ignore_nullable=True,
            allow_nan_equality=True,
        )
    assert_exact(verify(spark, cfg), wl.counts())
    assert maintain(spark, cfg, files=1000) == []  # under the threshold: nothing

    wl.burst(transactions=30)  # a run after it: previous images from consolidated rows
    run_stages(spark, cfg)
    assert_exact(verify(spark, cfg), wl.counts())


def test_upkeep_keeps_the_diffs_gold_holds_back(spark, db):
    """Under the ``fail`` policy a table with a definite error stays at the frontier below it:
    its diffs above that frontier are not consolidated, and once the error is resolved by a
    resync gold catches up exactly."""
    with psycopg.connect(**db, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 30) g")
        conn.execute("CREATE PUBLICATION pub FOR TABLE t")
    cfg = make_config(db, "upheld")
    cfg = replace(cfg, tables={"public.t": TablePolicy(truncate="error", on_error="fail")})
    drop_schemas(spark, cfg)
    run_stages(spark, cfg)
    with psycopg.connect(**db, autocommit=True) as conn:
        conn.execute("UPDATE t SET v = 'a' WHERE id <= 10")
        conn.execute("TRUNCATE t")  # a definite error under truncate = error
        conn.execute("INSERT INTO t SELECT g, 'w' || g FROM generate_series(1, 5) g")
    with pytest.raises(GoldQualityError):
        run_stages(spark, cfg)
    (reported,) = spark.table(cfg.qualified("gold", "_frontier")).collect()
    silver = _silver(spark, cfg, "public_t")
    above = silver.where(F.col("_lsn") >= reported["frontier"]).orderBy("_lsn", "id").collect()
    assert above, "the rows after the truncate are in silver, above gold's frontier"
    maintain(spark, cfg, files=1)
    after = _silver(spark, cfg, "public_t")
    assert (
        after.where(F.col("_lsn") >= reported["frontier"]).orderBy("_lsn", "id").collect() == above
    )
    gold = spark.table(cfg.qualified("gold", "public_t"))
    assert_df_equality(
        gold.select("id", "v"),
        silver_state(spark, cfg, "public_t", reported["frontier"]).select("id", "v"),
        ignore_row_order=True,
        ignore_nullable=True,
    )


def test_optimize_takes_column_mapped_tables_through_spark(spark, tmp_path):
    """Upkeep's ``OPTIMIZE`` runs by delta-rs where the table is local, and through Spark where
    delta-rs cannot write it (gold's and silver's tables are column-mapped): either way the
    small files become one and the rows stay."""
    from pgmedallion.core import delta_rs
    from pgmedallion.maintain import optimize

    spark.sql("CREATE SCHEMA IF NOT EXISTS upkeep_optimize")
    for name, mapping in (("plain", "none"), ("mapped", "name")):
        table = f"upkeep_optimize.{name}"
        spark.sql(f"DROP TABLE IF EXISTS {table}")
        spark.sql(
            f"CREATE TABLE {table} (id bigint, label string) USING delta"
            f" TBLPROPERTIES ('delta.columnMapping.mode' = '{mapping}',"
            " 'delta.minReaderVersion' = '2', 'delta.minWriterVersion' = '5')"
        )
        for i in range(4):
            spark.sql(f"INSERT INTO {table} VALUES ({i}, 'row {i}')")
        path = delta_rs.table_dir(delta_rs.schema_dir(spark, "upkeep_optimize"), name)
        assert len(delta_rs.open_table(path).file_uris()) == 4
        optimize(spark, table, path)
        assert len(delta_rs.open_table(path).file_uris()) == 1, name
        assert_df_equality(
            spark.table(table).orderBy("id"),
            spark.createDataFrame([(i, f"row {i}") for i in range(4)], "id bigint, label string"),
            ignore_nullable=True,
        )
    spark.sql("DROP SCHEMA upkeep_optimize CASCADE")
