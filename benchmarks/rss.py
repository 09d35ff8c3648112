"""rss: the capture's peak resident memory through one large transaction vs. ``pg_recvlogical``.

Setup (untimed)
    A fresh table ``bench_rss`` (the row shape of the stream benchmark: id bigint primary key,
    two ints, timestamptz, a 64-character text) and a publication of only that table. Two
    ``pgoutput`` slots, one for the peer and one for ours, are created first. Then the capture
    child (below) starts and lands the snapshot of the still empty table, so the measured
    run has no rows to copy and only streams. Then ONE transaction inserts ``--rows`` rows
    (default 1,000,000) server-side; both slots hold exactly that transaction (Begin, one Insert
    per row, Commit, and a Relation message). Its end LSN is ``pg_current_wal_lsn()`` after the
    commit.

What is compared
    Ours is the real capture, ``capture.run.capture_once`` with the production stream limits,
    as a local ``pgmedallion run --stage capture`` runs it: in a Python process of its own
    (``python -m benchmarks.rss SPEC``) without Spark, bronze (under ``--state-dir``/
    ``rss-capture``) read and written by delta-rs. Our figure is that process's ``VmHWM``
    (peak resident set) from ``/proc/self/status`` at the end of the run: it covers the whole
    life of the process (Python and its libraries, creating bronze, landing the empty
    snapshot, then reading, buffering and committing the transaction), and nothing else runs
    for it (no JVM, no worker processes). ``setup_peak_rss_kib`` is the peak before the
    transaction, so the difference is what streaming it added. (Through session 12 the child
    ran a local Spark session: the JVM was a separate process, not counted.)

    The peer is ``pg_recvlogical --start --no-loop --endpos <end LSN> -o proto_version=1 -o
    publication_names=<pub> -f /dev/null`` on its own slot (the stream benchmark's command):
    it receives the same transaction from the walsender and throws the bytes away. Its figure
    is its ``VmHWM``, polled from ``/proc/<pid>/status`` every 5 ms until it exits (the mark
    only grows, so the last reading is its peak, short of anything its last milliseconds add).
    ``os.wait4``'s ``ru_maxrss`` is not used for the figure: Linux carries the launching
    process's own peak RSS into it across ``exec`` (this benchmark's Python, tens to hundreds
    of MB), so it is only an upper bound, recorded as ``peer_wait4_maxrss_kib``. The benchmark
    checks that the peer's slot's ``confirmed_flush_lsn`` reached the end LSN.

    The ratio is our peak over the peer's (lower is better), and the goal is our peak below
    256 MB (issue 17). Megabytes are 10^6 bytes here as in every benchmark. Memory does not
    depend on the machine's load the way throughput does, but it does depend on the row width
    (the stream commits a batch at ``DELTA_RS_BATCH_MESSAGES`` messages or
    ``DELTA_RS_BATCH_BYTES`` of payload, whichever comes first, and holds at most two).

The benchmark checks that bronze received every Insert of the transaction (counted by the
child after it has read its peak). Both slots are dropped at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from psycopg import sql

from benchmarks.common import (
    MB,
    BenchEnv,
    MemoryResult,
    Peak,
    Stopwatch,
    format_mb,
    peak_rss_kib,
    recvlogical_command,
    say,
)
from pgmedallion.capture.pgoutput import format_lsn, parse_lsn

NAME = "rss"
DESCRIPTION = "capture peak RSS through one large transaction vs. pg_recvlogical to /dev/null"
GOAL_MB = 256

TABLE = "bench_rss"
PUBLICATION = "bench_rss_pub"
SLOT_OURS = "bench_rss_ours"
SLOT_PEER = "bench_rss_peer"
SLOTS = (SLOT_OURS, SLOT_PEER)
BRONZE = "bench_rss_bronze.bronze"
CHILD_MARK = "bench-rss-child "
REPO = Path(__file__).resolve().parent.parent
CHILD_TIMEOUT_S = 3600
POLL_S = 0.005


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--rows", type=int, default=1_000_000, help="rows inserted by the one transaction"
    )


def run(args: argparse.Namespace) -> MemoryResult:
    env: BenchEnv = args.env
    if args.rows < 1:
        raise ValueError("need --rows >= 1")
    child_state = env.state_dir / "rss-capture"
    shutil.rmtree(child_state, ignore_errors=True)  # a fresh bronze table and metastore
    child_state.mkdir(parents=True)
    with env.connect() as conn:
        drop_slots(conn)
        prepare(conn)
        for slot in (SLOT_PEER, SLOT_OURS):
            conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    spec = child_state / "spec.json"
    info = {k: v for k, v in env.conninfo.items() if k != "password"}  # PGPASSWORD instead
    spec.write_text(
        json.dumps(
            {
                "conninfo": info,
                "state_dir": str(child_state),
                "source": "bench_rss",
                "publication": PUBLICATION,
                "slot": SLOT_OURS,
                "bronze": BRONZE,
            }
        )
    )
    log = child_state / "child.log"
    measured: dict[str, Any] = {}

    def transaction_and_peer() -> None:
        """Between the child's setup and its measured run: the transaction, then the peer."""
        with env.connect() as conn, Stopwatch() as watch:
            insert_rows(conn, args.rows)
            end_lsn = parse_lsn(conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0])
        measured["end_lsn"] = end_lsn
        measured["workload_s"] = watch.seconds
        say(
            f"one transaction: {args.rows} rows inserted in {watch.seconds:.1f} s, "
            f"end LSN {format_lsn(end_lsn)}"
        )
        peer_kib, wait4_kib, peer_s = recvlogical_peak(env, SLOT_PEER, end_lsn)
        measured.update(peer_kib=peer_kib, peer_wait4_kib=wait4_kib, peer_s=peer_s)
        say(
            f"peer pg_recvlogical: peak RSS {_mb(peer_kib)} (VmHWM), {peer_s:.2f} s "
            f"(wait4's ru_maxrss, {_mb(wait4_kib)}, holds the launching process's peak too)"
        )

    try:
        with log.open("w") as stderr:
            proc = subprocess.Popen(
                [sys.executable, "-m", "benchmarks.rss", str(spec)],
                cwd=REPO,
                env={**env.client_env(), "PYTHONPATH": str(REPO)},
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
                errors="replace",
            )
            say(f"capture child pid {proc.pid} started (its log: {log})")
            ready, done = drive_child(proc, transaction_and_peer, log)
    finally:
        spec.unlink(missing_ok=True)
        with env.connect() as conn:
            drop_slots(conn)

    inserts = done["landed"].get("I", 0)
    if inserts != args.rows:
        raise RuntimeError(f"bronze holds {inserts} Insert messages, expected {args.rows}")
    if done["frontier"] < measured["end_lsn"]:
        raise RuntimeError(
            f"capture stopped at {format_lsn(done['frontier'])}, "
            f"before the end LSN {format_lsn(measured['end_lsn'])}"
        )
    python_kib = done["python_peak_rss_kib"]
    if done["pyspark_imported"]:
        raise RuntimeError("the capture child imported pyspark: it must run without Spark")
    say(
        f"ours capture_once: {done['messages']} messages in {done['batches']} bronze commits, "
        f"{done['capture_s']:.2f} s; peak RSS of its process {_mb(python_kib)} "
        f"({_mb(ready['python_peak_rss_kib'])} before the transaction)"
    )
    return MemoryResult(
        name=NAME,
        ours=Peak("pgmedallion", python_kib),
        peer=Peak("pg_recvlogical", measured["peer_kib"]),
        goal_mb=GOAL_MB,
        params={"rows": args.rows},
        details={
            "ours_is": "VmHWM of the capture's process (child, no Spark), whole life",
            "peer_is": f"VmHWM of pg_recvlogical, polled from /proc every {POLL_S} s",
            "peer_wait4_maxrss_kib": measured["peer_wait4_kib"],
            "setup_peak_rss_kib": ready["python_peak_rss_kib"],
            "pyspark_imported": done["pyspark_imported"],
            "messages": done["messages"],
            "landed_by_kind": done["landed"],
            "bronze_commits": done["batches"],
            "end_lsn": format_lsn(measured["end_lsn"]),
            "frontier": format_lsn(done["frontier"]),
            "workload_s": round(measured["workload_s"], 2),
            "ours_capture_s": round(done["capture_s"], 2),
            "peer_s": round(measured["peer_s"], 2),
        },
    )


def _mb(kib: int) -> str:
    return format_mb(kib * 1024 / MB)


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


def insert_rows(conn, rows: int) -> None:
    """The one transaction, server-side (one autocommit statement)."""
    conn.execute(
        sql.SQL(
            "INSERT INTO {} SELECT g, (g % 1000)::int, 0, now(), repeat(md5(g::text), 2)"
            " FROM generate_series(1, {}::int8) g"
        ).format(sql.Identifier(TABLE), sql.Literal(rows))
    )


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


def recvlogical_peak(env: BenchEnv, slot: str, end_lsn: int) -> tuple[int, int, float]:
    """Run ``pg_recvlogical`` on ``slot`` up to ``end_lsn``.

    Returns its peak RSS in KiB (``VmHWM`` polled from ``/proc`` every :data:`POLL_S` until it
    exits; the high-water mark only grows, so the last reading is its peak but for whatever it
    added in its last few milliseconds), ``ru_maxrss`` from ``os.wait4`` (an upper bound only:
    Linux keeps the launching process's peak RSS there across ``exec``), and its wall time.
    """
    command = recvlogical_command(env, slot, end_lsn, PUBLICATION)
    peak = 0
    with tempfile.TemporaryFile() as err, Stopwatch() as watch:
        proc = subprocess.Popen(
            command, env=env.client_env(), stdin=subprocess.DEVNULL, stdout=err, stderr=err
        )
        while True:
            peak = max(peak, peak_rss_kib(proc.pid) or 0)  # None once it is a zombie
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            time.sleep(POLL_S)
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
        err.seek(0)
        output = err.read().decode(errors="replace").strip()
    if proc.returncode != 0:
        raise RuntimeError(f"pg_recvlogical failed ({proc.returncode}): {output}")
    if peak == 0:
        raise RuntimeError("pg_recvlogical exited before its memory could be read")
    with env.connect() as conn:
        flushed = conn.execute(
            "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
            (slot,),
        ).fetchone()[0]
    if parse_lsn(flushed) < end_lsn:
        raise RuntimeError(
            f"pg_recvlogical stopped at {flushed}, before the end LSN {format_lsn(end_lsn)}"
        )
    return peak, usage.ru_maxrss, watch.seconds


def drive_child(proc: subprocess.Popen, between, log: Path) -> tuple[dict, dict]:
    """Wait for the child's setup, run ``between``, let it capture; its two reports.

    The child's stdout also carries whatever the Spark JVM prints there, so only lines with
    :data:`CHILD_MARK` are read as reports. On any failure the child is told to stop (its
    stdin closes), and killed if it does not exit.
    """
    ready = done = None
    try:
        for line in proc.stdout:
            if not line.startswith(CHILD_MARK):
                continue
            report = json.loads(line[len(CHILD_MARK) :])
            if report["phase"] == "ready":
                ready = report
                between()
                proc.stdin.write("go\n")
                proc.stdin.flush()
            elif report["phase"] == "done":
                done = report
        returncode = proc.wait(timeout=CHILD_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.stdin.close()
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    if returncode != 0 or ready is None or done is None:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-20:])
        raise RuntimeError(f"capture child failed (exit {returncode}), see {log}:\n{tail}")
    return ready, done


# ---------------------------------------------------------------------------------------------
# The capture child: python -m benchmarks.rss SPEC.json


def _report(phase: str, **values: Any) -> None:
    print(CHILD_MARK + json.dumps({"phase": phase, **values}), flush=True)


def child_main(spec_path: str) -> int:
    """Land the (empty) snapshot, report, wait for ``go``, capture the transaction, report."""
    import pyarrow.compute as pc
    from deltalake import DeltaTable

    from pgmedallion.capture.run import (
        CaptureOptions,
        CaptureTarget,
        RetryPolicy,
        bronze_of,
        capture_once,
    )

    spec = json.loads(Path(spec_path).read_text())
    schema, table = spec["bronze"].split(".")
    target = CaptureTarget(
        spec["conninfo"],
        source=spec["source"],
        publication=spec["publication"],
        slot=spec["slot"],
        bronze=spec["bronze"],
        bronze_path=str(Path(spec["state_dir"]) / "warehouse" / f"{schema}.db" / table),
    )
    options = CaptureOptions(retry=RetryPolicy(attempts=3, initial_delay_s=0.2))
    bronze = bronze_of(None, target)  # no Spark, as a local capture runs
    setup = capture_once(bronze, target, options)
    _report("ready", snapshotted=setup.snapshotted, python_peak_rss_kib=peak_rss_kib())
    if sys.stdin.readline().strip() != "go":
        return 1
    with Stopwatch() as watch:
        result = capture_once(bronze, target, options)
    python_kib = peak_rss_kib()  # before the check below, which is not the capture's work
    wal = DeltaTable(target.bronze_path).to_pyarrow_table(
        columns=["payload"], filters=[("kind", "=", "wal")]
    )
    first = pc.binary_slice(wal.column("payload"), 0, 1).cast("string").value_counts()
    _report(
        "done",
        messages=result.messages,
        batches=result.batches,
        frontier=result.frontier,
        capture_s=watch.seconds,
        python_peak_rss_kib=python_kib,
        pyspark_imported="pyspark" in sys.modules,
        landed={v["values"]: v["counts"] for v in first.to_pylist()},
    )
    return 0


if __name__ == "__main__":
    sys.exit(child_main(sys.argv[1]))
