"""The driver's path reads the same rules as Spark's: silver's consolidation per (row, LSN) and
gold's row rules give the same answer on either engine, on rows with NULLs, NaN, -0.0 and
duplicates; COPY TEXT lines decode as the reference decoder decodes them."""

from __future__ import annotations

import math
import random

import pyarrow as pa
from chispa import assert_df_equality
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql import functions as F
from pyspark.sql import types as T

from pgmedallion.capture.copy_text import CopyDecodeError, decode_copy_row
from pgmedallion.core.delta_rs import frame
from pgmedallion.gold.on_spark import failed_rules
from pgmedallion.gold.quality import row_rules
from pgmedallion.silver.rewind import consolidated, consolidated_rows
from tests.silver_helpers import copy_values

SCHEMA = T.StructType(
    [
        T.StructField("k", T.LongType()),
        T.StructField("x", T.DoubleType()),
        T.StructField("s", T.StringType()),
        T.StructField("_lsn", T.LongType()),
        T.StructField("_diff", T.LongType()),
    ]
)


def _rows(seed: int, n: int) -> list[tuple]:
    rng = random.Random(seed)
    floats = [0.0, -0.0, math.nan, 1.5, None]
    return [
        (
            rng.choice([1, 2, 3, None]),
            rng.choice(floats),
            rng.choice(["a", "b", None]),
            rng.choice([10, 20]),
            rng.choice([1, -1, 2]),
        )
        for _ in range(n)
    ]


def test_silver_consolidation_is_the_same_in_the_driver_and_in_spark(spark):
    for seed in range(3):
        rows = _rows(seed, 400)
        df = spark.createDataFrame(rows, SCHEMA)
        data = [F.col("k"), F.col("x"), F.col("s")]
        expected = consolidated(df, data, 7)
        arrow = pa.Table.from_pylist(
            [dict(zip(SCHEMA.names, r, strict=True)) for r in rows],
            schema=pa.schema(
                [("k", pa.int64()), ("x", pa.float64()), ("s", pa.string())]
                + [("_lsn", pa.int64()), ("_diff", pa.int64())]
            ),
        )
        mine = consolidated_rows(arrow, ["k", "x", "s"], 7)
        assert mine.num_rows > 0
        actual = frame(spark, mine, expected.schema)  # through Arrow: NaN stays apart from NULL

        # -0.0 and 0.0 are one row: compare them as one value (Spark keeps either's sign)
        def norm(d):
            return d.withColumn("x", F.when(F.col("x") == 0, F.lit(0.0)).otherwise(F.col("x")))

        order = ["k", "x", "s", "_lsn"]
        assert_df_equality(
            norm(actual).orderBy(*order),
            norm(expected).orderBy(*order),
            ignore_nullable=True,
            allow_nan_equality=True,
        )


def test_distinct_rows_consolidate_alike_with_and_without_grouping():
    """A snapshot of a table with a primary key skips the grouping (``distinct``): on rows
    that are distinct (one per key, -0.0 and NaN among them, a diff of 1 each) the result is
    the grouped one, -0.0 written 0.0 both ways."""
    values = [0.0, -0.0, math.nan, 1.5, None]
    arrow = pa.table(
        {
            "k": pa.array(range(50), pa.int64()),
            "x": pa.array([values[i % 5] for i in range(50)], pa.float64()),
            "_lsn": pa.array([0] * 50, pa.int64()),
            "_diff": pa.array([1] * 50, pa.int64()),
        }
    )
    grouped = consolidated_rows(arrow, ["k", "x"], 3).sort_by("k")
    plain = consolidated_rows(arrow, ["k", "x"], 3, distinct=True).sort_by("k")
    assert plain.num_rows == 50
    assert repr(plain.to_pylist()) == repr(grouped.to_pylist())  # NaN == NaN as text
    negative_zero = [math.copysign(1, x) for x in plain.column("x").to_pylist() if x == 0]
    assert negative_zero == [1.0] * 20


def test_a_distinct_snapshot_consolidates_alike_with_and_without_grouping_in_spark(spark):
    """Spark's side of the same rule: a snapshot of a keyed table is not grouped, and the
    rows written are the grouped ones, every -0.0 written 0.0 (as the grouping writes it)."""
    values = [0.0, -0.0, math.nan, 1.5, None]
    rows = [(i, values[i % 5], values[(i + 1) % 5], 0, 1) for i in range(50)]
    schema = T.StructType(
        [
            T.StructField("k", T.LongType()),
            T.StructField("x", T.DoubleType()),
            T.StructField("f", T.FloatType()),
            T.StructField("_lsn", T.LongType()),
            T.StructField("_diff", T.LongType()),
        ]
    )
    df = spark.createDataFrame(rows, schema)
    data = [F.col("k"), F.col("x"), F.col("f")]
    plain = consolidated(df, data, 3, distinct=True)
    assert "Aggregate" not in plain._jdf.queryExecution().optimizedPlan().toString()
    assert_df_equality(
        plain.orderBy("k"),
        consolidated(df, data, 3).orderBy("k"),
        ignore_nullable=True,
        allow_nan_equality=True,
    )
    negative = "sum(if(cast(x AS string) = '-0.0', 1, 0) + if(cast(f AS string) = '-0.0', 1, 0))"
    assert df.select(F.expr(negative)).first()[0] == 20  # what the grouping and the rule undo
    assert plain.select(F.expr(negative)).first()[0] == 0


def test_gold_rules_pass_and_fail_alike_in_the_driver_and_in_spark(spark):
    rng = random.Random(5)
    schema = T.StructType(
        [
            T.StructField("id", T.LongType()),
            T.StructField("name", T.StringType()),
            T.StructField("_multiplicity", T.LongType()),
            T.StructField("_key_rows", T.LongType()),
        ]
    )
    rows = [
        (
            rng.choice([1, 2, None]),
            rng.choice(["a", None]),
            rng.choice([-1, 0, 1, 2]),
            rng.choice([0, 1, 2, None]),
        )
        for _ in range(300)
    ]
    rules = row_rules(["id"], ["name"], "warn")
    df = spark.createDataFrame(
        list(enumerate(rows)),
        "i long, r struct<id long, name string, _multiplicity long, _key_rows long>",
    )
    df = df.select("i", "r.*")
    failed = {r["i"]: set(r["f"]) for r in df.select("i", failed_rules(rules).alias("f")).collect()}
    table = pa.Table.from_pylist(
        [dict(zip(schema.names, r, strict=True)) for r in rows],
        schema=pa.schema(
            [("id", pa.int64()), ("name", pa.string()), ("_multiplicity", pa.int64())]
            + [("_key_rows", pa.int64())]
        ),
    )
    mine = {i: set() for i in range(len(rows))}
    for rule in rules:
        assert rule.check is not None and rule.condition == rule.check.sql()
        for i, ok in enumerate(rule.check.passes(table)):
            if not ok:
                mine[i].add(rule.name)
    assert mine == failed
    assert any(mine.values()) and not all(mine.values())


PIECES = ["a", "é", " ", "x", "\\\\", "\\t", "\\n", "\\r", "\\b", "\\f", "\\v", "\\q"]
PIECES += ["\\101", "\\x41", "\\x4", "\\xg", "\\\\x01ff", "\\7", "\\."]  # escapes COPY reads
FIELD = st.one_of(st.just("\\N"), st.lists(st.sampled_from(PIECES), max_size=6).map("".join))
LINE = st.lists(FIELD, min_size=3, max_size=3).map("\t".join)


@settings(max_examples=300, deadline=None)
@given(lines=st.lists(LINE, max_size=12), cut=st.integers(0, 12))
def test_the_drivers_copy_decoding_is_the_reference_decoders(lines, cut):
    """``silver.copy_arrow.copy_columns`` reads COPY TEXT lines as ``decode_copy_row`` does (the
    rows in any order: a multiset), whatever chunks the payloads cut them into; where the
    reference decoder rejects a line (``\\.``), the per-table path takes the table (None)."""
    chunks = [lines[:cut], lines[cut:]]
    payloads = pa.array(
        [("".join(line + "\n" for line in chunk)).encode() for chunk in chunks if chunk],
        pa.binary(),
    )
    got = copy_values(payloads, 3)
    try:
        expected = [decode_copy_row(line.encode(), 3) for line in lines]
    except CopyDecodeError:
        assert got is None
        return
    assert got is not None
    assert sorted(map(repr, got.to_pylist())) == sorted(map(repr, expected))


def test_the_driver_decodes_bytea_and_leaves_bad_lines_to_the_per_table_path():
    """A bytea value (``\\\\x...`` on the wire), octal and hex escapes decode as the reference
    decoder decodes them; a wrong field count, invalid UTF-8, an escaped delimiter and the
    end-of-data marker go to the per-table path, which writes their error records."""
    good = b"1\t\\\\x0102ff\tx\n2\t\\101\\x42\ty\\tz\n"
    got = copy_values(pa.array([good], pa.binary()), 3)
    assert sorted(map(repr, got.to_pylist())) == sorted(
        map(repr, [["1", "\\x0102ff", "x"], ["2", "AB", "y\tz"]])
    )
    for payload in (b"1\t2\n", b"1\t\xff\tx\n", b"a\\\tb\tc\td\n", b"1\t\\.\tx\n"):
        assert copy_values(pa.array([payload], pa.binary()), 3) is None, payload
