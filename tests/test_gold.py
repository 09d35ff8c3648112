"""Gold built from hand-crafted silver tables: state at the frontier, incremental, exactly once.

Silver is written by ``craft.SilverCrafter`` following the contract in
``silver/__init__.py``; every test has its own silver and gold schemas.
"""

from __future__ import annotations

import re

from chispa import assert_df_equality
from pyspark.sql import types as T

from pgmedallion.core.config import Config, LakehouseConfig, SourceConfig, TablePolicy
from pgmedallion.gold.build import run_gold
from pgmedallion.gold.history import ErrorSummary as NoErrors
from pgmedallion.gold.history import applied_state, read_tables
from pgmedallion.gold.table import build_table
from tests.craft import CraftedTable, SilverCrafter

CUSTOMERS = T.StructType(
    [
        T.StructField("id", T.LongType()),
        T.StructField("Full Name", T.StringType()),
        T.StructField("balance", T.DecimalType(10, 2)),
    ]
)
TAGS = T.StructType([T.StructField("tag", T.StringType()), T.StructField("n", T.IntegerType())])


def make_cfg(spark, request, **policies: str) -> Config:
    """A config whose silver and gold schemas belong to this test alone (dropped first)."""
    tag = re.sub(r"[^a-z0-9]+", "_", request.node.name.lower())[:40]
    lakehouse = LakehouseConfig(silver_schema=f"s_{tag}", gold_schema=f"g_{tag}")
    for schema in (lakehouse.silver_schema, lakehouse.gold_schema):
        spark.sql(f"DROP SCHEMA IF EXISTS `{schema}` CASCADE")
    tables = {name: TablePolicy(on_error=p) for name, p in policies.items()}
    return Config(source=SourceConfig(name="shop"), lakehouse=lakehouse, tables=tables)


def gold_rows(spark, cfg: Config, table: str):
    return spark.table(cfg.qualified("gold", table))


def expect(spark, schema: T.StructType, rows):
    full = T.StructType([*schema.fields, T.StructField("_lsn", T.LongType())])
    return spark.createDataFrame(rows, full)


def assert_gold(spark, cfg, table, schema, rows):
    assert_df_equality(
        gold_rows(spark, cfg, table),
        expect(spark, schema, rows),
        ignore_row_order=True,
        ignore_nullable=True,
    )


def frontier_rows(spark, cfg):
    return {
        r["table_name"]: (r["frontier"], r["silver_run"], r["rows"], r["gold_table"])
        for r in spark.table(cfg.qualified("gold", "_frontier")).collect()
    }


def d(x: str):
    from decimal import Decimal

    return Decimal(x)


def test_keyed_and_keyless_tables_across_three_runs(spark, request):
    cfg = make_cfg(spark, request)
    silver = SilverCrafter(spark, cfg).ensure()
    silver.add_table(CraftedTable("customers", CUSTOMERS, ("id",), ("Full Name",), 16401))
    silver.add_table(CraftedTable("tags", TAGS, (), (), 16402))
    silver.add_table(CraftedTable("pending", TAGS, (), (), 16403, snapshot_lsn=None))

    # Run 1: the snapshot at LSN 0; a key-less row with multiplicity 2, one with a NULL.
    silver.diffs(
        "customers",
        [(1, "Ada", d("10.00"), 0, 1), (2, "Bob", d("20.00"), 0, 1), (3, "Cy", None, 0, 1)],
        run=1,
    )
    silver.diffs("tags", [("red", 1, 0, 2), ("blue", None, 0, 1)], run=1)
    silver.complete_run(1, 100)
    result = run_gold(spark, cfg)
    assert (result.silver_run, result.frontier) == (1, 100)
    assert [t.table.silver_table for t in result.tables] == ["customers", "tags"]
    assert result.table("customers").mode == "full"
    assert_gold(
        spark,
        cfg,
        "customers",
        CUSTOMERS,
        [(1, "Ada", d("10.00"), 0), (2, "Bob", d("20.00"), 0), (3, "Cy", None, 0)],
    )
    assert_gold(spark, cfg, "tags", TAGS, [("red", 1, 0), ("red", 1, 0), ("blue", None, 0)])
    assert not spark.catalog.tableExists(cfg.qualified("gold", "pending"))

    # Run 2: an update, an insert, a delete; the key-less row goes back to multiplicity 1.
    silver.diffs(
        "customers",
        [
            (2, "Bob", d("20.00"), 150, -1),
            (2, "Bob", d("25.50"), 150, 1),
            (4, "Dee", d("1.00"), 160, 1),
            (3, "Cy", None, 170, -1),
        ],
        run=2,
    )
    silver.diffs("tags", [("red", 1, 120, -1), ("blue", None, 130, -1), ("green", 7, 130, 1)], 2)
    silver.complete_run(2, 200)
    result = run_gold(spark, cfg)
    assert {t.mode for t in result.tables} == {"incremental"}
    assert_gold(
        spark,
        cfg,
        "customers",
        CUSTOMERS,
        [(1, "Ada", d("10.00"), 0), (2, "Bob", d("25.50"), 150), (4, "Dee", d("1.00"), 160)],
    )
    assert_gold(spark, cfg, "tags", TAGS, [("red", 1, 120), ("green", 7, 130)])

    # Run 3: a key change (1 -> 10), a delete, a second update; nothing for tags.
    silver.diffs(
        "customers",
        [
            (1, "Ada", d("10.00"), 250, -1),
            (10, "Ada", d("10.00"), 250, 1),
            (4, "Dee", d("1.00"), 260, -1),
            (2, "Bob", d("25.50"), 270, -1),
            (2, "Robert", d("25.50"), 270, 1),
        ],
        run=3,
    )
    silver.complete_run(3, 300)
    result = run_gold(spark, cfg)
    assert_gold(
        spark,
        cfg,
        "customers",
        CUSTOMERS,
        [(10, "Ada", d("10.00"), 250), (2, "Robert", d("25.50"), 270)],
    )
    assert_gold(spark, cfg, "tags", TAGS, [("red", 1, 120), ("green", 7, 130)])
    gold_schema = cfg.lakehouse.gold_schema
    assert frontier_rows(spark, cfg) == {
        "customers": (300, 3, 2, f"{gold_schema}.customers"),
        "tags": (300, 3, 2, f"{gold_schema}.tags"),
    }
    props = spark.sql(f"SHOW TBLPROPERTIES {cfg.qualified('gold', 'customers')}").collect()
    assert {r["key"]: r["value"] for r in props}["delta.columnMapping.mode"] == "name"


def test_late_rewind_adds_rows_at_lsn_zero(spark, request):
    cfg = make_cfg(spark, request)
    silver = SilverCrafter(spark, cfg).ensure()
    silver.add_table(CraftedTable("items", TAGS, ("tag",), (), 7))
    silver.diffs("items", [("a", 1, 0, 1)], run=1)
    silver.complete_run(1, 50)
    run_gold(spark, cfg)
    silver.diffs("items", [("b", 2, 80, 1)], run=2)
    silver.complete_run(2, 90)
    run_gold(spark, cfg)
    # A re-snapshot: time 0 is rewound (a gone, c there), later times stay exact.
    silver.diffs("items", [("a", 1, 0, -1), ("c", 3, 0, 1), ("b", 2, 95, -1)], run=3)
    silver.complete_run(3, 100)
    result = run_gold(spark, cfg)
    assert result.table("items").mode == "incremental"
    assert_gold(spark, cfg, "items", TAGS, [("c", 3, 0)])


def test_a_crash_after_the_gold_commit_does_not_apply_a_run_twice(spark, request):
    cfg = make_cfg(spark, request)
    silver = SilverCrafter(spark, cfg).ensure()
    silver.add_table(CraftedTable("events", TAGS, (), (), 9))
    silver.diffs("events", [("x", 1, 0, 1)], run=1)
    silver.complete_run(1, 10)
    run_gold(spark, cfg)
    silver.diffs("events", [("y", 2, 15, 1)], run=2)
    silver.complete_run(2, 20)
    gold = cfg.qualified("gold", "events")
    before = applied_state(spark, gold)
    assert (before.silver_run, before.frontier) == (1, 10)

    # The crash: run 2's gold commit lands, the reports (_frontier, _quality) never do.
    (info,) = read_tables(spark, cfg)
    outcome = build_table(spark, cfg, info, 2, 20, NoErrors())
    assert outcome.silver_run == 2
    assert frontier_rows(spark, cfg)["events"][:2] == (10, 1)

    # A retry whose bookkeeping is lost (it believes run 1 is applied): Delta's idempotent
    # write (txnAppId/txnVersion) skips the MERGE instead of adding "y" a second time.
    version = applied_state(spark, gold).version
    build_table(spark, cfg, info, 2, 20, NoErrors(), applied_override=before)
    assert applied_state(spark, gold).version == version
    assert_gold(spark, cfg, "events", TAGS, [("x", 1, 0), ("y", 2, 15)])

    # The next real run finds run 2 in gold's own history and writes only the reports.
    result = run_gold(spark, cfg)
    assert result.table("events").mode == "unchanged"
    assert_gold(spark, cfg, "events", TAGS, [("x", 1, 0), ("y", 2, 15)])
    assert frontier_rows(spark, cfg)["events"][:3] == (20, 2, 2)


def test_no_completed_silver_run_means_nothing_to_do(spark, request):
    cfg = make_cfg(spark, request)
    SilverCrafter(spark, cfg).ensure()
    result = run_gold(spark, cfg)
    assert (result.silver_run, result.frontier, result.tables) == (None, None, [])


def test_a_run_whose_changes_cancel_out_still_records_its_gold_commit(spark, request):
    cfg = make_cfg(spark, request)
    silver = SilverCrafter(spark, cfg).ensure()
    silver.add_table(CraftedTable("customers", CUSTOMERS, ("id",), (), 16503))
    silver.diffs("customers", [(1, "Ada", d("10.00"), 0, 1)], 1)
    silver.complete_run(1, 100)
    run_gold(spark, cfg)
    silver.diffs("customers", [(7, "Tmp", None, 120, 1), (7, "Tmp", None, 130, -1)], run=2)
    silver.complete_run(2, 200)
    result = run_gold(spark, cfg)
    assert result.table("customers").mode == "incremental"
    applied = applied_state(spark, cfg.qualified("gold", "customers"))
    assert (applied.silver_run, applied.frontier, applied.rows) == (2, 200, 1)
    assert_gold(spark, cfg, "customers", CUSTOMERS, [(1, "Ada", d("10.00"), 0)])


def test_a_table_no_silver_run_touched_is_neither_read_nor_written(spark, request):
    cfg = make_cfg(spark, request)
    silver = SilverCrafter(spark, cfg).ensure()
    silver.add_table(CraftedTable("customers", CUSTOMERS, ("id",), (), 16503))
    silver.add_table(CraftedTable("tags", TAGS, (), (), 16600))
    silver.diffs("customers", [(1, "Ada", d("10.00"), 0, 1)], 1)
    silver.diffs("tags", [("new", 1, 0, 1)], 1)
    silver.complete_run(1, 100)
    run_gold(spark, cfg)
    tags = cfg.qualified("gold", "tags")
    version = applied_state(spark, tags).version

    silver.diffs("customers", [(1, "Ada", d("10.00"), 150, -1), (2, "Bo", None, 150, 1)], 2)
    silver.complete_run(2, 200)
    result = run_gold(spark, cfg)
    assert (result.table("customers").mode, result.table("tags").mode) == (
        "incremental",
        "unchanged",
    )
    # tags: no new commit, its frontier moved on in the report, its rows as they were
    assert applied_state(spark, tags).version == version
    frontier = frontier_rows(spark, cfg)
    assert frontier["tags"][:3] == (200, 2, 1)
    assert frontier["customers"][:3] == (200, 2, 1)
    assert_gold(spark, cfg, "tags", TAGS, [("new", 1, 0)])
    assert_gold(spark, cfg, "customers", CUSTOMERS, [(2, "Bo", None, 150)])

    # A run that changes nothing at all writes no report either.
    reports = [
        spark.sql(f"DESCRIBE HISTORY {cfg.qualified('gold', t)} LIMIT 1").first()["version"]
        for t in ("_frontier", "_quality")
    ]
    again = run_gold(spark, cfg)
    assert {t.mode for t in again.tables} == {"unchanged"}
    assert [
        spark.sql(f"DESCRIBE HISTORY {cfg.qualified('gold', t)} LIMIT 1").first()["version"]
        for t in ("_frontier", "_quality")
    ] == reports

    # Touched again later: the increment covers every run since its own last commit.
    silver.diffs("tags", [("new", 1, 350, -1), ("old", 2, 350, 1)], 3)
    silver.complete_run(3, 400)
    result = run_gold(spark, cfg)
    assert (result.table("customers").mode, result.table("tags").mode) == (
        "unchanged",
        "incremental",
    )
    assert_gold(spark, cfg, "tags", TAGS, [("old", 2, 350)])
    assert frontier_rows(spark, cfg)["customers"][:3] == (400, 3, 1)


def test_key_filter_passes_every_touched_key_and_few_others(spark):
    """The bitmap that keeps untouched rows out of the MERGE's joins may let some other keys
    through, never stop a touched one: composite keys, NULLs, -0.0 against 0.0, NaN."""
    from types import SimpleNamespace

    from pyspark.sql import functions as F

    from pgmedallion.gold.pruning import key_filter

    schema = "a BIGINT, b DOUBLE"
    special = [(None, 1.0), (1, None), (None, None), (2, 0.0), (3, float("nan"))]
    touched = spark.createDataFrame(special + [(i, i / 7) for i in range(10, 2010)], schema)
    # What gold may hold for those keys: the same values, -0.0 for 0.0 (equal in a join).
    held = spark.createDataFrame(
        [(None, 1.0), (1, None), (None, None), (2, -0.0), (3, float("nan"))]
        + [(i, i / 7) for i in range(10, 2010)],
        schema,
    )
    others = spark.range(100_000, 120_000).select(
        F.col("id").alias("a"), (F.col("id") / 3).alias("b")
    )
    t = SimpleNamespace(key=["a", "b"])
    bare, aliased = key_filter(t, touched, touched.count())
    assert held.filter(bare).count() == held.count()
    assert held.alias("t").filter(aliased).count() == held.count()
    passed = others.filter(bare).count()
    assert 0 < passed < 0.25 * others.count()  # about 12% with 8 bits per key
    assert key_filter(t, touched, 10**9) is None
