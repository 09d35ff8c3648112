"""silver: decode and cast snapshot rows from bronze vs. Spark's CSV reader on the same rows.

Setup
    A table ``bench_silver`` of ``--rows`` typed rows (bigint, int, numeric(12,2), timestamptz,
    bool, text, text[]) and a publication of it; an untimed capture lands its snapshot in a
    fresh bronze table (one raw COPY TEXT row per source row). The same rows are written once
    as a CSV file with ``COPY ... TO STDOUT (FORMAT csv)``, untimed.

What is compared
    Ours, the result's figure: silver's decode-and-cast stage, from the bronze table's COPY
    records to one Delta table of typed rows. It runs the functions ``run_silver`` runs for a
    table's rows (``table_diffs``: COPY TEXT decoding as Spark SQL expressions, the rows with
    rare escapes marked for the Python decoder; ``cast_in_one_pass``: casts as plain Spark SQL
    expressions in the job that writes the rows, which also counts the rows they leave
    unsettled; ``OnePass.finish``: the full cast with its error messages for those, when there
    are some, and a second append), creates the Delta table as a run does, collects the decode
    and cast errors, and writes the rows.
    The peer: ``spark.read.csv`` with the equivalent explicit schema (arrays as strings: CSV
    has no arrays, so the peer does less), written as one Delta table. Both sides read their
    input from local disk and write Delta in the same session; rates are source rows per
    second. Each side runs ``--repeats`` times (default 3), interleaved; the figure is the
    best run of each (steady-state throughput in a warm JVM: the first run of a new plan pays
    for code generation and JIT compilation), and the first runs' ratio is printed beside it.

    Also timed, in the details and on its own line: one whole silver run over the same bronze
    table into a fresh silver schema (``run_silver``): the stage above plus consolidation (a
    group-by over whole rows), creating the tables, and the Delta commits of the diffs, errors
    and bookkeeping tables, most of it a fixed cost per run.
"""

from __future__ import annotations

import argparse
import shutil
from dataclasses import replace

from psycopg import sql
from pyspark.sql import functions as F

from benchmarks.common import BenchEnv, Result, Stopwatch, Timing, say
from pgmedallion.core.config import Config, LakehouseConfig, SourceConfig

NAME = "silver"
DESCRIPTION = "silver decode + cast of bronze COPY rows vs. Spark's CSV reader"
GOAL = 0.5

TABLE = "bench_silver"
PUBLICATION = "bench_silver_pub"
SLOT = "bench_silver_slot"
CSV_SCHEMA = (
    "id BIGINT, qty INT, price DECIMAL(12,2), at TIMESTAMP, flag BOOLEAN, name STRING, tags STRING"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--rows", type=int, default=1_000_000, help="rows in the table (%(default)s)"
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="timed runs of the stage and of the peer, interleaved; the best of each is the "
        "figure, the first (cold) runs are kept in the details (%(default)s)",
    )


def _config(env: BenchEnv) -> Config:
    info = env.conninfo
    return Config(
        source=SourceConfig(
            name="benchsilver",
            host=info["host"],
            port=int(info["port"]),
            dbname=info["dbname"],
            user=info["user"],
            password=info["password"],
            publication=PUBLICATION,
            slot=SLOT,
        ),
        lakehouse=LakehouseConfig(
            bronze_schema="bench_silver_bronze",
            silver_schema="bench_silver_silver",
            gold_schema="bench_silver_gold",
        ),
    )


def prepare(env: BenchEnv, rows: int) -> None:
    with env.connect() as conn:
        conn.execute(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
            "WHERE slot_name = %s AND NOT active",
            (SLOT,),
        )
        conn.execute(sql.SQL("DROP PUBLICATION IF EXISTS {}").format(sql.Identifier(PUBLICATION)))
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(TABLE)))
        conn.execute(
            sql.SQL(
                "CREATE TABLE {} (id bigint PRIMARY KEY, qty int, price numeric(12,2),"
                " at timestamptz, flag bool, name text, tags text[])"
            ).format(sql.Identifier(TABLE))
        )
        conn.execute(
            sql.SQL(
                "INSERT INTO {} SELECT g, g % 1000, (g % 100000) / 100.0,"
                " timestamptz '2024-01-01' + g * interval '1 second', g % 2 = 0,"
                " 'name ' || md5(g::text), ARRAY['a', 'b ' || (g % 7)]"
                " FROM generate_series(1, {}) g"
            ).format(sql.Identifier(TABLE), sql.Literal(rows))
        )
        conn.execute(
            sql.SQL("CREATE PUBLICATION {} FOR TABLE {}").format(
                sql.Identifier(PUBLICATION), sql.Identifier(TABLE)
            )
        )


def write_csv(env: BenchEnv, path) -> int:
    """The table as CSV (PostgreSQL's own CSV output), returning its size in bytes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with env.connect() as conn, open(path, "wb") as f:
        conn.execute("SET TimeZone = 'UTC'")
        with conn.cursor().copy(
            # Spark's CSV reader reads booleans only as true/false; everything else as is.
            sql.SQL(
                "COPY (SELECT id, qty, price, at, flag::text, name, tags FROM {})"
                " TO STDOUT (FORMAT csv)"
            ).format(sql.Identifier(TABLE))
        ) as copy:
            for chunk in copy:
                f.write(chunk)
    return path.stat().st_size


def run(args: argparse.Namespace) -> Result:
    from pgmedallion.pipeline import ensure_schemas, run_capture
    from pgmedallion.silver.build import run_silver

    env: BenchEnv = args.env
    spark = env.spark
    cfg = _config(env)
    prepare(env, args.rows)
    for layer in ("bronze", "silver", "gold"):
        spark.sql(f"DROP SCHEMA IF EXISTS {getattr(cfg.lakehouse, layer + '_schema')} CASCADE")
    ensure_schemas(spark, cfg)
    capture = run_capture(spark, cfg)
    say(f"bronze: {sum(capture.snapshotted.values())} snapshot rows landed (untimed)")
    csv = env.state_dir / "silver-bench" / "rows.csv"
    size = write_csv(env, csv)
    say(f"CSV: {size / 1e6:.1f} MB at {csv} (untimed)")

    # Warm both paths once on a tiny input so neither pays for first-use class loading.
    spark.read.csv(str(csv), schema=CSV_SCHEMA).limit(1000).collect()

    with Stopwatch() as whole:
        result = run_silver(spark, cfg)
    diff_rows = sum(result.rows.values())
    say(f"silver: run {result.run}, {diff_rows} diff rows, {result.errors} errors")

    stage_runs, peer_runs = [], []
    for _ in range(max(1, args.repeats)):  # interleaved, so load changes hit both alike
        stage_rows, stage_errors, seconds = decode_and_cast(spark, cfg)
        stage_runs.append(seconds)
        peer_rows, seconds = csv_to_delta(spark, csv)
        peer_runs.append(seconds)
    say(
        "runs (s): stage "
        + ", ".join(f"{x:.2f}" for x in stage_runs)
        + "; spark.read.csv "
        + ", ".join(f"{x:.2f}" for x in peer_runs)
    )
    stage_seconds, peer_seconds = min(stage_runs), min(peer_runs)
    cold_ratio = peer_runs[0] / stage_runs[0]
    shutil.rmtree(csv.parent, ignore_errors=True)
    if (
        diff_rows != args.rows
        or peer_rows != args.rows
        or stage_rows != args.rows
        or result.errors
        or stage_errors
    ):
        raise RuntimeError(
            f"row counts differ: silver {diff_rows}, stage {stage_rows}, csv {peer_rows}, "
            f"source {args.rows}, errors {result.errors} (stage {stage_errors})"
        )
    whole_ratio = peer_seconds / whole.seconds
    stage_ratio = peer_seconds / stage_seconds
    say(
        f"decode + cast stage {stage_seconds:.2f} s, ratio {stage_ratio:.2f} (first runs: "
        f"{stage_runs[0]:.2f} s vs {peer_runs[0]:.2f} s, ratio {cold_ratio:.2f}); "
        f"whole silver run {whole.seconds:.2f} s, ratio {whole_ratio:.2f}; "
        f"spark.read.csv to Delta {peer_seconds:.2f} s"
    )
    return Result(
        name=NAME,
        work={"rows/s": float(args.rows), "MB/s": size / 1e6},
        ours=Timing("pgmedallion", stage_seconds),
        peer=Timing("spark.read.csv", peer_seconds),
        goal=GOAL,
        params={"rows": args.rows, "repeats": args.repeats},
        details={
            "ours_measures": "decode + cast stage (table_diffs, cast_in_one_pass) to one table",
            "stage_seconds": stage_seconds,
            "stage_ratio": stage_ratio,
            "stage_runs": stage_runs,
            "peer_runs": peer_runs,
            "first_runs_ratio": cold_ratio,
            "whole_run_seconds": whole.seconds,
            "whole_run_ratio": whole_ratio,
            "csv_bytes": size,
            "config": replace(cfg.lakehouse).__dict__,
        },
    )


def csv_to_delta(spark, csv) -> tuple[int, float]:
    """The peer: the CSV file read with its explicit schema into a fresh Delta table, timed.
    Returns (rows written, seconds)."""
    table = "bench_silver_silver.csv_peer"
    spark.sql(f"DROP TABLE IF EXISTS {table}")
    with Stopwatch() as peer:
        (
            spark.read.csv(
                str(csv),
                schema=CSV_SCHEMA,
                mode="FAILFAST",
                timestampFormat="yyyy-MM-dd HH:mm:ssX",
            )
            .write.format("delta")
            .saveAsTable(table)
        )
    return spark.table(table).count(), peer.seconds


def decode_and_cast(spark, cfg: Config) -> tuple[int, int, float]:
    """Silver's decode and cast of the table's snapshot rows into one Delta table, timed.

    Returns (typed rows written, decode and cast errors, seconds). Runs after a silver run,
    which recorded the table's columns in ``_tables``.
    """
    from pgmedallion.core import delta_rs
    from pgmedallion.silver.cast_rows import cast_diffs, cast_in_one_pass, data_columns
    from pgmedallion.silver.catalog import load_tables
    from pgmedallion.silver.contract import DIFF_ARROW
    from pgmedallion.silver.decode import table_diffs
    from pgmedallion.silver.write import create_diff_table as _create_diff_table

    [info] = [t for t in load_tables(spark, cfg).values() if t.name == TABLE]
    width = len(info.columns)
    bronze = cfg.qualified("bronze", "bronze")
    copy_rows = (
        spark.table(bronze)
        .where(
            (F.col("source") == cfg.source.name)
            & (F.col("kind") == "copy")
            & (F.col("table_oid") == info.oid)
        )
        .select("table_oid", "lsn", "payload")
    )
    empty_wal = spark.createDataFrame(
        [], delta_rs.spark_types(DIFF_ARROW)
    )  # a snapshot-only run decodes no changes
    target = "bench_silver_silver.stage_typed"
    spark.sql(f"DROP TABLE IF EXISTS {target}")
    data = data_columns(info)
    with Stopwatch() as stage:
        diffs = table_diffs(info.oid, empty_wal, copy_rows, (width, width))
        one = cast_in_one_pass(info, diffs)
        if one is None:  # as run_silver: a type with no plain cast takes the whole cast first
            cast = cast_diffs(info, diffs)
            _create_diff_table(spark, target, cast.rows.select(*data).schema)
            cast.rows.select(*data).writeTo(target).append()
            errors = cast.errors
            cast.unpersist()
        else:
            _create_diff_table(spark, target, one.rows.select(*data).schema)
            one.rows.select(*data).writeTo(target).append()
            late = one.finish()
            errors = late.errors if late is not None else []
            if late is not None:
                late.rows.select(*data).writeTo(target).append()
                late.unpersist()
    rows = spark.table(target).count()
    return rows, len(errors), stage.seconds
