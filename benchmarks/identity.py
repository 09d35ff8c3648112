"""identity: silver resolving 10k key-only changes (REPLICA IDENTITY DEFAULT) against a small and
a ten times larger table.

Setup (untimed), once per size
    A silver table ``accounts`` (id BIGINT key, name, balance DECIMAL(12,2), updated_at
    TIMESTAMP) holding a snapshot of ``--small`` (default 1M) or ``--large`` (10M) rows, as
    silver writes it (Delta, column mapping by name, one run).

What is compared
    The wall time of :func:`pgmedallion.silver.identity.resolve_previous_images` for one run of
    ``--changes`` (default 10k) changes as silver's decoder gives them under REPLICA IDENTITY
    DEFAULT: half updates (a key-only RETRACT and a FILL whose ``name`` arrived as unchanged
    TOAST), a quarter key-only deletes, a quarter inserts, on keys drawn from the whole table
    (``--pattern uniform``) or from its newest 1% (``--pattern recent``), until every resolved
    row is counted. The resolution must follow the changes, not the table: the large run
    should take at most 1.5x the small one. "pgmedallion" is the large run, the peer ("same on
    N rows") the small one, so the last ratio (small / large) has the goal >= 0.67.
"""

from __future__ import annotations

import argparse

from pyspark.sql import functions as F

from benchmarks.common import Result, Stopwatch, say, small_vs_large
from pgmedallion.silver.changes import FILL, PLAIN, RETRACT
from pgmedallion.silver.identity import COLUMNS, KIND, ORDINAL, resolve_previous_images

NAME = "identity"
DESCRIPTION = "silver resolving 10k key-only changes against a 1M-row vs. a 10M-row table"
NAMES = ["id", "name", "balance", "updated_at"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--small", type=int, default=1_000_000, help="rows (%(default)s)")
    parser.add_argument("--large", type=int, default=10_000_000, help="rows (%(default)s)")
    parser.add_argument("--changes", type=int, default=10_000, help="changes (%(default)s)")
    parser.add_argument("--pattern", choices=("uniform", "recent"), default="uniform")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per size, best kept")
    parser.add_argument("--seed", type=int, default=7)


def _table(rows: int) -> str:
    return f"`bench_identity`.`accounts_{rows}`"


def _row(ids, version: int = 0, keep: tuple[str, ...] = ()):
    return ids.select(
        F.col("id").cast("bigint").alias("id"),
        F.concat(F.lit("customer "), F.col("id").cast("string")).alias("name"),
        ((F.col("id") * 7 + version) % 100000 / 100).cast("decimal(12,2)").alias("balance"),
        F.timestamp_seconds(F.lit(1_700_000_000) + F.col("id") % 86400 + version).alias(
            "updated_at"
        ),
        *keep,
    )


def prepare(spark, rows: int) -> None:
    spark.sql("CREATE SCHEMA IF NOT EXISTS `bench_identity`")
    spark.sql(f"DROP TABLE IF EXISTS {_table(rows)}")
    snapshot = _row(spark.range(rows)).select(
        "*",
        F.lit(0).cast("bigint").alias("_lsn"),
        F.lit(1).cast("bigint").alias("_diff"),
        F.lit(1).cast("bigint").alias("_run"),
    )
    with Stopwatch() as w:
        snapshot.write.format("delta").option("delta.columnMapping.mode", "name").saveAsTable(
            _table(rows)
        )
    say(f"{rows} rows: silver table written in {w.seconds:.1f} s (untimed)")


def changes(spark, rows: int, run: int, args: argparse.Namespace):
    """The typed rows of one run's changes, as silver's cast hands them to the resolution."""
    n = args.changes
    updates, deletes = n // 2, n // 4
    low = 0 if args.pattern == "uniform" else rows - rows // 100
    picked = (
        spark.range(low, rows)
        .orderBy(F.rand(args.seed + run))
        .limit(updates + deletes)
        .withColumn("n", F.monotonically_increasing_id())
    )
    lsn = F.lit(run * 10**9) + F.col("n")

    def typed(df, diff, kind, columns, version=0, key_only=False):
        row = _row(df.withColumn("_pgm_lsn", lsn), version, keep=("_pgm_lsn",))
        if key_only:
            row = row.select(
                "id",
                *(F.lit(None).cast(t).alias(c) for c, t in row.dtypes[1:4]),
                "_pgm_lsn",
            )
        return row.select(
            *NAMES,
            "_pgm_lsn",
            F.lit(diff).cast("bigint").alias("_pgm_diff"),
            F.lit(1).cast("bigint").alias(ORDINAL),
            F.lit(kind).cast("int").alias(KIND),
            F.array(*(F.lit(c) for c in columns)).cast("array<int>").alias(COLUMNS),
        )

    withn = picked.select("id", "n")
    upd = withn.where(F.col("n") % 3 != 0).limit(updates)
    dele = withn.where(F.col("n") % 3 == 0).limit(deletes)
    new = spark.range(rows + run * n, rows + run * n + (n - updates - deletes)).withColumn(
        "n", F.col("id")
    )
    parts = [
        typed(upd, -1, RETRACT, (0,), key_only=True),
        typed(upd, 1, FILL, (1,), version=run).withColumn("name", F.lit(None).cast("string")),
        typed(dele, -1, RETRACT, (0,), key_only=True),
        typed(new, 1, PLAIN, ()),
    ]
    out = parts[0]
    for p in parts[1:]:
        out = out.unionByName(p)
    return out.localCheckpoint()


def measure(spark, rows: int, run: int, args: argparse.Namespace) -> float:
    typed = changes(spark, rows, run, args)
    prior = spark.table(_table(rows))
    with Stopwatch() as w:
        images = resolve_previous_images(typed, NAMES, (0,), prior, None)
        resolved = images.rows.count()
    for df in images.cached:
        df.unpersist()
    if images.errors:
        raise RuntimeError(f"{len(images.errors)} changes did not resolve: {images.errors[:3]}")
    say(f"{rows} rows, run {run}: {resolved} rows resolved in {w.seconds:.1f} s")
    return w.seconds


def run(args: argparse.Namespace) -> Result:
    spark = args.env.spark
    prepare(spark, args.small)
    prepare(spark, args.large)
    return small_vs_large(NAME, args, lambda rows, run: measure(spark, rows, run, args))
