"""``core.by_key.by_key_ranges``: a rule over whole keys of range-partitioned, sorted rows.

Its Python side sees a range's rows in Arrow batches, and a key's rows may straddle two of
them: batches of 3 rows here make that happen on almost every key. The result must be the
rule's over whole keys, as ``by_key`` (hash buckets) gives it, and each output partition must
hold one range of keys in key order (what gold's full build writes as one file each)."""

from __future__ import annotations

import math

import pyarrow as pa
from chispa import assert_df_equality
from pyspark.sql import functions as F

from pgmedallion.core.by_key import by_key, by_key_ranges, range_tags, spark_hash_int
from pgmedallion.core.multiset import consolidate
from pgmedallion.gold import pruning
from pgmedallion.gold.history import ErrorSummary, read_tables
from pgmedallion.gold.reports import ensure_report_tables
from pgmedallion.gold.table import build_table
from tests.craft import CraftedTable, SilverCrafter
from tests.test_gold import CUSTOMERS, assert_gold, d, make_cfg

SCHEMA = "k double, s string, v long, _lsn long, _diff long"
OUT = "k double, s string, _multiplicity long, _lsn long"


def _rows():
    """Keys repeated up to four times (diffs that cancel, or add up), -0.0 beside 0.0, NaN,
    and NULL keys."""
    keys = [float(i // 4) for i in range(40)] + [0.0, -0.0, -0.0, math.nan, math.nan, None, None]
    rows = []
    for i, k in enumerate(keys):
        diff = -1 if i % 4 == 1 else 1
        rows.append((k, "a" if i % 3 else "b", 1, 100 + i, diff))
    return rows


def _consolidated(table: pa.Table) -> pa.Table:
    """The rule under test: consolidation by ``(k, s)``, which needs every row of a key."""
    return consolidate(table, ["k", "s"])


def test_a_rule_sees_whole_keys_across_batches_and_ranges(spark):
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "3")
    try:
        df = spark.createDataFrame(_rows(), SCHEMA).repartition(3)
        rule = lambda t: _consolidated(t).select(["k", "s", "_multiplicity", "_lsn"])  # noqa: E731
        ranged = by_key_ranges(df, ["k"], rule, OUT, 4)
        hashed = by_key(df, ["k"], rule, OUT)
        order = ["k", "s"]
        assert_df_equality(
            ranged.orderBy(*order),
            hashed.orderBy(*order),
            ignore_nullable=True,
            allow_nan_equality=True,
        )
        # one range of keys per partition, each in key order, no key in two partitions
        parts = ranged.rdd.glom().map(lambda rows: [r["k"] for r in rows]).collect()
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    assert len(parts) == 4
    seen = []
    for keys in parts:
        comparable = [(k is not None, math.isnan(k) if k is not None else False, k) for k in keys]
        assert comparable == sorted(comparable, key=_spark_order)
        seen.append({_spark_key(k) for k in keys})
    for i, a in enumerate(seen):
        for b in seen[i + 1 :]:
            assert not a & b
    assert set().union(*seen) == {_spark_key(k) for k, *_ in _rows()}


def _spark_key(k):
    """A key as Spark's equality sees it: -0.0 is 0.0, NaN is NaN."""
    if k is None:
        return None
    return "nan" if math.isnan(k) else k + 0.0


def _spark_order(item):
    """Spark's ascending order of doubles: NULL first, then numbers (-0.0 = 0.0), NaN last."""
    present, nan, k = item
    return (present, nan, 0.0 if (not present or nan) else k + 0.0)


def test_a_full_build_on_spark_writes_one_key_range_per_file(spark, request, monkeypatch):
    """Gold's full build of a keyed table on Spark computes its state in key ranges
    (``gold.pruning.key_ranges_of``) and writes them as they come: a file per range, the
    ranges disjoint, so later runs' key predicates skip files by their statistics."""
    monkeypatch.setattr(pruning, "ROWS_PER_FILE", 10)
    cfg = make_cfg(spark, request)
    silver = SilverCrafter(spark, cfg).ensure()
    silver.add_table(CraftedTable("customers", CUSTOMERS, ("id",), ("Full Name",), 16501))
    rows = [(i, f"n{i}", d("1.00"), 0, 1) for i in range(40)]
    # every third key updated later: its old row retracted, a new one added
    rows += [(i, f"n{i}", d("1.00"), 50, -1) for i in range(0, 40, 3)]
    rows += [(i, f"m{i}", d("2.00"), 50, 1) for i in range(0, 40, 3)]
    silver.diffs("customers", rows, run=1)
    silver.complete_run(1, 100)
    ensure_report_tables(spark, cfg)
    (info,) = read_tables(spark, cfg)
    outcome = build_table(spark, cfg, info, 1, 100, ErrorSummary())
    assert outcome.mode == "full"
    expected = [
        (i, f"m{i}", d("2.00"), 50) if i % 3 == 0 else (i, f"n{i}", d("1.00"), 0) for i in range(40)
    ]
    assert_gold(spark, cfg, "customers", CUSTOMERS, expected)
    files = (
        spark.table(cfg.qualified("gold", "customers"))
        .groupBy(F.input_file_name().alias("file"))
        .agg(F.min("id").alias("low"), F.max("id").alias("high"))
        .orderBy("low")
        .collect()
    )
    assert len(files) == 4  # 40 rows (the diffs sum to 40), 10 a file
    for before, after in zip(files, files[1:], strict=False):
        assert before["high"] < after["low"]


def test_range_tags_send_each_range_to_its_own_partition(spark):
    """The values ``_in_ranges`` hash-partitions by land one per partition, in order: the
    Murmur3 of ``spark_hash_int`` is Spark's own ``hash``."""
    values = list(range(-50, 200)) + [2**31 - 1, -(2**31)]
    df = spark.createDataFrame([(v,) for v in values], "v int")
    theirs = [r[0] for r in df.select(F.hash("v")).collect()]
    assert [spark_hash_int(v) for v in values] == theirs
    for n in (2, 3, 7, 16):
        tags = range_tags(n)
        tagged = spark.createDataFrame([(t,) for t in tags], "v int").repartition(n, "v")
        parts = tagged.rdd.glom().map(lambda rows: [r["v"] for r in rows]).collect()
        assert parts == [[t] for t in tags]
