"""stream: land a replication backlog of >= 1M pgoutput messages in bronze vs. ``pg_recvlogical``.

Setup
    A fresh table ``bench_stream`` and a publication of only that table. Two ``pgoutput`` slots
    are created one after the other *before* the workload, so both hold the same backlog:
    ``--txns`` transactions (half inserting, half updating ``--rows / --txns`` rows each), run
    server-side by one ``DO`` block that commits after each. One million row changes in 10,000
    transactions is 1.02 million messages (Begin, 100 changes, Commit each). The end LSN is
    ``pg_current_wal_lsn()`` after the workload.

What is compared
    The peer is ``pg_recvlogical --start --endpos <end LSN> -o proto_version=1 -o
    publication_names=<pub> -f /dev/null`` on its slot: the server's walsender decoding and
    sending, received by a C client that throws the bytes away. Ours is
    :func:`capture.run.land_stream` on the other slot into a fresh bronze table: the same
    walsender work, received and stamped in Python, buffered into Arrow and committed to Delta
    every 200,000 messages, each commit followed by an acknowledgement. ``land_stream`` reads
    up to ``pg_current_wal_lsn()`` at its own start, which is at or past the end LSN; nothing
    publishes in between, so it reads the same messages. Rates are messages and pgoutput
    payload megabytes (``sum(length(payload))`` of the landed messages, XLogData headers not
    counted) over wall time, the same amounts for both sides.

Before the measurement an untimed warm-up lands a 100-row backlog on a third slot, so the JVM's
first Delta commit is not counted. Every slot is dropped at the end, so no WAL stays retained.
"""

from __future__ import annotations

import argparse
import subprocess
import uuid

from psycopg import sql
from pyspark.sql import functions as F

from benchmarks.common import MB, BenchEnv, Result, Stopwatch, Timing, recvlogical_command, say
from pgmedallion.bronze.spark_table import ensure_bronze_table
from pgmedallion.capture.pgoutput import format_lsn, parse_lsn
from pgmedallion.capture.run import CaptureTarget, bronze_of, land_stream

NAME = "stream"
DESCRIPTION = "pgoutput backlog into bronze vs. pg_recvlogical to /dev/null"
GOAL = 0.8

TABLE = "bench_stream"
PUBLICATION = "bench_stream_pub"
SLOT_OURS = "bench_stream_ours"
SLOT_PEER = "bench_stream_peer"
SLOT_WARMUP = "bench_stream_warmup"
SLOTS = (SLOT_OURS, SLOT_PEER, SLOT_WARMUP)
WARMUP_ROWS = 100


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--rows", type=int, default=1_000_000, help="row changes in the backlog (%(default)s)"
    )
    parser.add_argument(
        "--txns", type=int, default=10_000, help="transactions they are spread over (%(default)s)"
    )


def run(args: argparse.Namespace) -> Result:
    env: BenchEnv = args.env
    plan = workload_plan(args.rows, args.txns)
    with env.connect() as conn:
        drop_slots(conn)
        prepare(conn)
    try:
        started = env.start_spark()
        if started > 1:
            say(f"spark session started in {started:.1f} s (untimed)")
        warm = warm_up_ours(env)
        say(f"warm-up: land_stream of a {WARMUP_ROWS}-row backlog in {warm:.2f} s (untimed)")
        with env.connect() as conn:
            for slot in (SLOT_OURS, SLOT_PEER):
                create_slot(conn, slot)
            with Stopwatch() as watch:
                run_workload(conn, plan)
            end_lsn = parse_lsn(conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0])
        say(
            f"backlog: {plan['txns']} transactions, {plan['row_changes']} row changes, "
            f"end LSN {format_lsn(end_lsn)}, written in {watch.seconds:.1f} s"
        )
        peer = Timing("pg_recvlogical", recvlogical(env, SLOT_PEER, end_lsn))
        say(f"peer pg_recvlogical: {peer.seconds:.2f} s")
        ours, messages, payload_bytes, batches = land_ours(env, SLOT_OURS, "stream")
        say(f"ours land_stream: {ours.seconds:.2f} s, {messages} messages, {batches} commits")
    finally:
        with env.connect() as conn:
            drop_slots(conn)
    if messages < plan["min_messages"]:
        raise RuntimeError(f"land_stream read {messages} messages, expected {plan['min_messages']}")
    return Result(
        name=NAME,
        work={"msg/s": messages, "MB/s": payload_bytes / MB},
        ours=ours,
        peer=peer,
        goal=GOAL,
        params={"rows": args.rows, "txns": args.txns},
        details={
            "messages": messages,
            "payload_bytes": payload_bytes,
            "bronze_commits": batches,
            "end_lsn": format_lsn(end_lsn),
            "workload_s": round(watch.seconds, 2),
            "ours_warmup_s": round(warm, 2),
        },
    )


def workload_plan(rows: int, txns: int) -> dict[str, int]:
    """Half the transactions insert, half update; each touches ``rows // txns`` rows."""
    if txns < 2 or rows < txns:
        raise ValueError("need --txns >= 2 and --rows >= --txns")
    per = rows // txns
    inserts = txns // 2
    updates = txns - inserts
    return {
        "per_txn": per,
        "inserts": inserts,
        "updates": updates,
        "txns": txns,
        "row_changes": per * txns,
        # Begin + changes + Commit per transaction; Relation messages come on top.
        "min_messages": txns * (per + 2),
    }


def prepare(conn) -> None:
    table, pub = sql.Identifier(TABLE), sql.Identifier(PUBLICATION)
    conn.execute(sql.SQL("DROP PUBLICATION IF EXISTS {}").format(pub))
    conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(table))
    conn.execute(
        sql.SQL(
            "CREATE TABLE {} (id bigint PRIMARY KEY, a int, b int, at timestamptz, note text)"
        ).format(table)
    )
    conn.execute(sql.SQL("CREATE PUBLICATION {} FOR TABLE {}").format(pub, table))


def create_slot(conn, slot: str) -> None:
    conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))


def drop_slots(conn) -> None:
    conn.execute(
        "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots"
        " WHERE slot_name = ANY(%s) AND active_pid IS NOT NULL",
        (list(SLOTS),),
    )
    for (slot,) in conn.execute(
        "SELECT slot_name FROM pg_replication_slots WHERE slot_name = ANY(%s)", (list(SLOTS),)
    ).fetchall():
        conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))


def run_workload(conn, plan: dict[str, int]) -> None:
    """The backlog, server-side: one DO block committing after every transaction."""
    conn.execute(
        sql.SQL(
            "DO $bench$ BEGIN"
            " FOR i IN 0..{inserts} - 1 LOOP"
            "  INSERT INTO {table} SELECT g, (g % 1000)::int, 0, now(), repeat(md5(g::text), 2)"
            "  FROM generate_series(i::int8 * {per} + 1, (i + 1)::int8 * {per}) g;"
            "  COMMIT;"
            " END LOOP;"
            " FOR i IN 0..{updates} - 1 LOOP"
            "  UPDATE {table} SET b = b + 1, at = now()"
            "  WHERE id BETWEEN (i % {inserts})::int8 * {per} + 1"
            "  AND (i % {inserts} + 1)::int8 * {per};"
            "  COMMIT;"
            " END LOOP;"
            " END $bench$"
        ).format(
            table=sql.Identifier(TABLE),
            per=sql.Literal(plan["per_txn"]),
            inserts=sql.Literal(plan["inserts"]),
            updates=sql.Literal(plan["updates"]),
        )
    )


def warm_up_ours(env: BenchEnv) -> float:
    """Land a tiny backlog on a slot of its own, untimed, before the measured slots exist."""
    with env.connect() as conn:
        create_slot(conn, SLOT_WARMUP)
        conn.execute(
            sql.SQL(
                "INSERT INTO {} SELECT -g, 0, 0, now(), 'warm-up' FROM generate_series(1, {}) g"
            ).format(sql.Identifier(TABLE), sql.Literal(WARMUP_ROWS))
        )
    seconds = land_ours(env, SLOT_WARMUP, "stream_warmup")[0].seconds
    with env.connect() as conn:
        conn.execute("SELECT pg_drop_replication_slot(%s)", (SLOT_WARMUP,))
    return seconds


def land_ours(env: BenchEnv, slot: str, bronze: str) -> tuple[Timing, int, int, int]:
    """Time ``land_stream`` of ``slot`` into a fresh bronze table.

    Returns the timing, messages, pgoutput payload bytes landed and Delta commits made.
    """
    spark = env.spark
    target = CaptureTarget(
        env.conninfo,
        source="bench_stream",
        publication=PUBLICATION,
        slot=slot,
        bronze=env.bronze_table(bronze),
    )
    ensure_bronze_table(spark, target.bronze)
    with Stopwatch() as watch:
        result = land_stream(bronze_of(spark, target), target, run_id=uuid.uuid4().hex)
    messages, batches = _counts(result)
    say(
        f"  bronze commits ({result.writer}): {result.commit_s:.2f} s in all, the reader waited "
        f"{result.wait_s:.2f} s for them"
    )
    landed = (
        spark.table(target.bronze)
        .where("kind = 'wal'")
        .agg(F.count("*").alias("n"), F.sum(F.length("payload")).alias("bytes"))
        .first()
    )
    if landed["n"] != messages:
        raise RuntimeError(f"land_stream reported {messages} messages, bronze holds {landed['n']}")
    return Timing("pgmedallion", watch.seconds), messages, landed["bytes"] or 0, batches


def _counts(landed) -> tuple[int, int]:
    """(messages, commits) from ``land_stream``'s result: a ``StreamResult``, or the older
    ``(messages, frontier, batches)`` tuple (the API is being reworked while this is written)."""
    if isinstance(landed, tuple):
        return landed[0], landed[2]
    return landed.messages, landed.batches


def recvlogical(env: BenchEnv, slot: str, end_lsn: int) -> float:
    """Time ``pg_recvlogical`` reading ``slot`` up to ``end_lsn`` into /dev/null."""
    command = recvlogical_command(env, slot, end_lsn, PUBLICATION)
    with Stopwatch() as watch:
        proc = subprocess.run(command, env=env.client_env(), capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"pg_recvlogical failed ({proc.returncode}): {proc.stderr.strip()}")
    with env.connect() as conn:
        flushed = conn.execute(
            "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
            (slot,),
        ).fetchone()[0]
    if parse_lsn(flushed) < end_lsn:
        raise RuntimeError(
            f"pg_recvlogical stopped at {flushed}, before the end LSN {format_lsn(end_lsn)}"
        )
    return watch.seconds
