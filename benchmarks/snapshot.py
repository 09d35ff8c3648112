"""snapshot: land a >= 1 GB table in bronze vs. parallel ``psql COPY`` (or ``spark.read.jdbc``).

What is compared
    Ours is :func:`capture.run.land_snapshot` on a fresh bronze table with ``--workers`` ranges,
    as a local capture runs it (without Spark, bronze written by delta-rs): exported snapshot
    (a temporary slot), one thread per ctid range copying COPY TEXT chunks into a Parquet
    file, one Delta commit of the files, and the per-table row count it reads back from
    bronze. (Through session 12 it ran in a Spark session: one Spark task per range.) The peer
    is the floor of any COPY-based capture: the *same* ctid ranges
    (:func:`capture.snapshot.worker_ctid_ranges`), each ``COPY (SELECT ...) TO STDOUT`` in its
    own concurrent ``psql`` process writing to ``/dev/null``. ``--peer jdbc`` compares with
    what a Spark user would write instead: ``spark.read.jdbc`` partitioned on ``id`` into as
    many partitions as workers, written as a typed Delta table. Both rates are the table's
    ``pg_relation_size`` over wall time.

The table
    ``bench_snapshot_<size>mb`` (id bigint, three ints, timestamptz, numeric, ~200-byte text)
    is generated server-side with ``generate_series`` until ``pg_relation_size`` reaches the
    requested size, then indexed, ``VACUUM ANALYZE``d and marked with a table comment. A later
    run that finds the mark reuses it: building 1 GB takes minutes, reading it seconds.

Before timing either side, one untimed ``psql`` pass reads the table so both sides find it in
the page cache, and one untimed ``land_snapshot`` of a 1 MB table loads what a long-running
process has loaded already; its time is recorded as ``ours_warmup_s``.

The JDBC driver must be on the Spark session's classpath when the session starts. The command
line starts it with the driver for ``--peer jdbc``; when the session at hand lacks it (the
tests' session), the peer runs in a child process with a session of its own
(``python -m benchmarks.snapshot`` reads its job from ``BENCH_JDBC_PEER``) and reports the time
of the read-and-write alone, not its JVM start.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

from psycopg import sql

from benchmarks.common import MB, BenchEnv, Result, Stopwatch, Timing, jdbc_url, say
from pgmedallion.bronze.spark_table import copy_row_counts
from pgmedallion.capture.run import CaptureTarget, bronze_of, land_snapshot
from pgmedallion.capture.snapshot import copy_query, estimate_table_block_counts, worker_ctid_ranges

NAME = "snapshot"
DESCRIPTION = "parallel snapshot into bronze vs. parallel psql COPY to /dev/null (or JDBC)"
GOAL_PSQL = 0.6
GOAL_JDBC = None  # no goal is set against JDBC; the ratio is reported for information

READY_MARK = "pgmedallion benchmark table: complete"
CALIBRATION_ROWS = 1000
WARMUP_MB = 1
CHUNK_ROWS = 500_000
COLUMNS = ("id", "a", "b", "c", "at", "amount", "note")
JDBC_FETCH_SIZE = 10_000
JDBC_PEER_ENV = "BENCH_JDBC_PEER"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--size-mb", type=int, default=1024, help="table size, pg_relation_size (%(default)s)"
    )
    parser.add_argument("--workers", type=int, default=2, help="parallel ranges (%(default)s)")
    parser.add_argument(
        "--peer", choices=("psql", "jdbc"), default="psql", help="what to compare with"
    )


def table_name(size_mb: int) -> str:
    return f"bench_snapshot_{size_mb}mb"


def run(args: argparse.Namespace) -> Result:
    env: BenchEnv = args.env
    name = table_name(args.size_mb)
    with env.connect() as conn:
        table = ensure_table(conn, name, args.size_mb * MB)
        blocks = estimate_table_block_counts(conn, [table["oid"]])[table["oid"]]
        ranges = worker_ctid_ranges(blocks, args.workers, conn.info.server_version)
        queries = [
            copy_query(("public", name), COLUMNS, r).as_string(conn).replace("\n", " ")
            for r in ranges
        ]
    say(
        f"table public.{name}: {table['bytes'] / MB:.1f} MB, {table['rows']} rows, "
        f"{blocks} blocks, ranges {ranges}"
    )
    seconds = psql_copies(env, queries)
    say(f"warm-up: {len(queries)} psql COPY in {seconds:.2f} s (untimed)")
    started = env.start_spark()
    if started > 1:
        say(f"spark session started in {started:.1f} s (untimed)")
    cold = warm_up_ours(env, args.workers)
    say(f"warm-up: land_snapshot of a {WARMUP_MB} MB table in {cold:.2f} s (untimed)")

    if args.peer == "psql":
        peer = Timing("psql COPY", psql_copies(env, queries))
        goal = GOAL_PSQL
    else:
        peer = Timing("spark.read.jdbc", jdbc_peer(env, name, table, args.workers))
        goal = GOAL_JDBC
    say(f"peer {peer.label}: {peer.seconds:.2f} s")

    ours, details = land_ours(env, table, args.workers)
    say(f"ours land_snapshot: {ours.seconds:.2f} s ({details})")
    return Result(
        name=NAME,
        work={"MB/s": table["bytes"] / MB},
        ours=ours,
        peer=peer,
        goal=goal,
        params={"size_mb": args.size_mb, "workers": args.workers, "peer": args.peer},
        details={
            "table": name,
            "rows": table["rows"],
            "blocks": blocks,
            "ours_warmup_s": round(cold, 2),
            **details,
        },
    )


def ensure_table(conn, name: str, size_bytes: int) -> dict[str, int]:
    """The benchmark table of at least ``size_bytes``: reused when complete, else built."""
    ident = sql.Identifier(name)
    if _table_comment(conn, name) != READY_MARK:
        say(f"building public.{name} ({size_bytes / MB:.0f} MB, server-side) ...")
        with Stopwatch() as watch:
            build_table(conn, ident, size_bytes)
        say(f"built in {watch.seconds:.1f} s")
    oid, size, rows, low, high = conn.execute(
        sql.SQL(
            "SELECT {name}::regclass::oid::int8, pg_relation_size({name}::regclass),"
            " count(*), min(id), max(id) FROM {table}"
        ).format(name=sql.Literal(name), table=ident)
    ).fetchone()
    return {"oid": oid, "bytes": size, "rows": rows, "min_id": low, "max_id": high}


def build_table(conn, ident: sql.Identifier, size_bytes: int) -> None:
    conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(ident))
    conn.execute(
        sql.SQL(
            "CREATE TABLE {} (id bigint NOT NULL, a int, b int, c int, at timestamptz,"
            " amount numeric(12,2), note text)"
        ).format(ident)
    )
    rows = CALIBRATION_ROWS
    _insert_rows(conn, ident, 1, rows)
    bytes_per_row = _relation_size(conn, ident) / rows
    while (size := _relation_size(conn, ident)) < size_bytes:
        chunk = min(CHUNK_ROWS, math.ceil((size_bytes - size) / bytes_per_row) + 1)
        _insert_rows(conn, ident, rows + 1, rows + chunk)
        rows += chunk
    conn.execute(sql.SQL("ALTER TABLE {} ADD PRIMARY KEY (id)").format(ident))
    conn.execute(sql.SQL("VACUUM ANALYZE {}").format(ident))
    conn.execute(sql.SQL("COMMENT ON TABLE {} IS {}").format(ident, sql.Literal(READY_MARK)))


def _insert_rows(conn, ident: sql.Identifier, first: int, last: int) -> None:
    conn.execute(
        sql.SQL(
            "INSERT INTO {} SELECT g, (g % 1000)::int, ((g * 7) % 100000)::int, (g % 7)::int,"
            " timestamptz '2024-01-01 00:00:00+00' + g * interval '1 second',"
            " ((g % 10000000) / 100.0)::numeric(12,2),"
            " repeat(md5(g::text), 6) || lpad(g::text, 12, '0')"
            " FROM generate_series({}::int8, {}::int8) g"
        ).format(ident, sql.Literal(first), sql.Literal(last))
    )


def _relation_size(conn, ident: sql.Identifier) -> int:
    return conn.execute(
        sql.SQL("SELECT pg_relation_size({}::regclass)").format(sql.Literal(ident.as_string(conn)))
    ).fetchone()[0]


def _table_comment(conn, name: str) -> str | None:
    return conn.execute(
        "SELECT obj_description(to_regclass(%s), 'pg_class')", (f"public.{name}",)
    ).fetchone()[0]


def psql_copies(env: BenchEnv, queries: list[str]) -> float:
    """Run each COPY in its own concurrent psql process to /dev/null; wall time over all."""
    psql = str(env.client("psql"))
    client_env = env.client_env()
    with Stopwatch() as watch:
        procs = [
            subprocess.Popen(
                [psql, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-c", query],
                env=client_env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
            for query in queries
        ]
        errors = [p.communicate()[1] for p in procs]
    for proc, err in zip(procs, errors, strict=True):
        if proc.returncode != 0:
            raise RuntimeError(f"psql COPY failed ({proc.returncode}): {err.decode().strip()}")
    return watch.seconds


def land_ours(
    env: BenchEnv, table: dict[str, int], workers: int, *, bronze: str = "snapshot"
) -> tuple[Timing, dict]:
    """Time ``land_snapshot`` of the table into a fresh bronze table; check every row landed."""
    path = env.state_dir / "bronze-without-spark" / bronze
    shutil.rmtree(path, ignore_errors=True)
    target = CaptureTarget(
        env.conninfo,
        source="bench",
        publication="",
        slot="",
        bronze=env.bronze_table(bronze),
        bronze_path=str(path),
    )
    with Stopwatch() as watch:
        _, counts = land_snapshot(
            bronze_of(None, target),
            target,
            [table["oid"]],
            workers=workers,
            run_id=uuid.uuid4().hex,
        )
    landed = sum(counts.values())
    if landed != table["rows"]:
        raise RuntimeError(f"land_snapshot landed {landed} rows of {table['rows']}")
    # Spark reads what landed, and counts the same rows.
    with Stopwatch() as count_watch:
        [row] = copy_row_counts(
            env.spark.read.format("delta").load(str(path)).where("kind = 'copy'")
        ).collect()
    if row["rows"] != table["rows"]:
        raise RuntimeError(f"Spark counts {row['rows']} rows in bronze of {table['rows']}")
    return Timing("pgmedallion", watch.seconds), {
        "bronze_count_query_s": round(count_watch.seconds, 2),
    }


def warm_up_ours(env: BenchEnv, workers: int) -> float:
    """Land a small table once, untimed: what a long-running process has loaded already."""
    with env.connect() as conn:
        table = ensure_table(conn, table_name(WARMUP_MB), WARMUP_MB * MB)
    return land_ours(env, table, workers, bronze="snapshot_warmup")[0].seconds


def jdbc_job(env: BenchEnv, name: str, table: dict[str, int], workers: int) -> dict[str, Any]:
    """What the JDBC peer reads and where it writes (no password: that travels separately)."""
    info = {k: v for k, v in env.conninfo.items() if k != "password"}
    return {
        "conninfo": info,
        "table": f"public.{name}",
        "lower": table["min_id"],
        "upper": table["max_id"] + 1,
        "workers": workers,
        "path": str(env.state_dir / "jdbc-delta" / name),
        "rows": table["rows"],
    }


def jdbc_peer(env: BenchEnv, name: str, table: dict[str, int], workers: int) -> float:
    from benchmarks.common import jdbc_driver_loaded

    job = jdbc_job(env, name, table, workers)
    if jdbc_driver_loaded(env.spark):
        return jdbc_to_delta(env.spark, job, env.conninfo["password"])
    say("this Spark session has no PostgreSQL JDBC driver: running the peer in a child process")
    return jdbc_in_child(env, job)


def jdbc_to_delta(spark, job: dict[str, Any], password: str) -> float:
    """``spark.read.jdbc`` partitioned on id, written as a typed Delta table; wall seconds."""
    shutil.rmtree(job["path"], ignore_errors=True)
    with Stopwatch() as watch:
        _jdbc_read(spark, job, password).write.format("delta").mode("overwrite").save(job["path"])
    landed = spark.read.format("delta").load(job["path"]).count()
    if landed != job["rows"]:
        raise RuntimeError(f"spark.read.jdbc landed {landed} rows of {job['rows']}")
    return watch.seconds


def _jdbc_read(spark, job: dict[str, Any], password: str):
    return spark.read.jdbc(
        jdbc_url(job["conninfo"]),
        job["table"],
        column="id",
        lowerBound=job["lower"],
        upperBound=job["upper"],
        numPartitions=job["workers"],
        properties={
            "user": job["conninfo"]["user"],
            "password": password,
            "driver": "org.postgresql.Driver",
            "fetchsize": str(JDBC_FETCH_SIZE),
        },
    )


def jdbc_in_child(env: BenchEnv, job: dict[str, Any]) -> float:
    repo = Path(__file__).resolve().parent.parent
    child_env = {
        **os.environ,
        JDBC_PEER_ENV: json.dumps({**job, "state_dir": str(env.state_dir / "spark-jdbc")}),
        "PGPASSWORD": env.conninfo["password"],
        "PYTHONPATH": os.pathsep.join(filter(None, [str(repo), os.environ.get("PYTHONPATH")])),
    }
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.snapshot"],
        env=child_env,
        cwd=repo,
        capture_output=True,
        text=True,
    )
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"JDBC peer failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return float(json.loads(lines[-1])["seconds"])


def _jdbc_child_main() -> int:
    """The child process of :func:`jdbc_in_child`: its own Spark with the driver."""
    from pgmedallion.core.spark import POSTGRES_JDBC, get_spark

    job = json.loads(os.environ[JDBC_PEER_ENV])
    spark = get_spark(job["state_dir"], packages=(POSTGRES_JDBC,))
    try:
        seconds = jdbc_to_delta(spark, job, os.environ["PGPASSWORD"])
    finally:
        spark.stop()
    print(json.dumps({"seconds": seconds}))
    return 0


if __name__ == "__main__":
    sys.exit(_jdbc_child_main())
