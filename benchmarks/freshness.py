"""Freshness: how long a committed row takes to be visible in gold under ``run --continuous``.

Setup (untimed): ``pgbench -i`` (scale ``--scale``; ``pgbench_history``, key-less and
insert-only, gets REPLICA IDENTITY FULL as ``doctor`` asks) and a marker table ``fresh_markers (id
bigint primary key, committed_at timestamptz)`` in the benchmark database, one publication of
both, a fresh lakehouse under ``<state dir>/freshness``, and a second slot (``test_decoding``)
for the peer.

What runs, side by side for ``--minutes``
    ``pgmedallion run --continuous``  a child process from a configuration file, started cold
                    before the load begins (its start and first application are reported),
                    with ``--engine``'s ``[lakehouse] engine`` (``spark``: every table read and
                    committed through Spark, as on Databricks);
    ``pg_recvlogical``  on the peer slot, printing each change as text to a pipe that this
                    process reads line by line (the time a marker's INSERT arrives is its peer
                    latency: what the replication stream itself costs);
    ``pgbench``     ``-R --rate`` transactions per second (``-c 2``, TPC-B-like: three
                    updates and an insert each) for the whole duration;
    markers         one row a second, each in its own transaction, its commit time taken when
                    ``COMMIT`` returns;
    a poller        reading the gold marker table with delta-rs every ``--poll`` seconds: the
                    first time a marker's id is there is when it became visible in gold;
    a sampler       the memory of the pipeline's process tree (driver, JVM, Python workers)
                    every 5 s: the sum of their proportional set sizes (a page shared by a
                    forked worker and its parent counts once; summed RSS counted the JVM's
                    pages twice for a moment whenever a child started).

After the load the benchmark waits for the last marker in gold, sends SIGINT (the pipeline
applies capture's last batch and exits 0), checks gold's ``pgbench_accounts`` balance sum
against PostgreSQL's, and reports commit-to-gold latency (p50, p95, max) next to the peer's
commit-to-receive latency for the same markers, the pipeline's applications (count, seconds
each), and the memory curve (first and last ten minutes' peaks, for the soak).

Goals (issue 29): p50 <= 5 s, p95 <= 15 s at 200 transactions per second; memory flat (the last
ten minutes' peak within 10% of the first ten's). The summary's ratio is the peer's p50 over
ours (both latencies, lower is better).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from psycopg import sql

from benchmarks.common import (
    MB,
    BenchEnv,
    Result,
    Timing,
    add_engine_argument,
    drop_slot,
    say,
    write_pipeline_config,
)
from benchmarks.load import _overrides_config
from benchmarks.process import proportional_kib, tree

NAME = "freshness"
DESCRIPTION = "commit-to-gold latency of `run --continuous` under pgbench vs. pg_recvlogical"
GOAL_P50_S = 5.0
GOAL_P95_S = 15.0

PUBLICATION = "bench_fresh_pub"
SLOT = "bench_fresh_slot"
PEER_SLOT = "bench_fresh_peer"
SOURCE = "bench_fresh"
SCHEMAS = {
    "bronze": "bench_fresh_bronze",
    "silver": "bench_fresh_silver",
    "gold": "bench_fresh_gold",
}
PASSWORD_ENV = "BENCH_FRESH_PGPASSWORD"
MARKERS = "fresh_markers"
TABLES = ("pgbench_accounts", "pgbench_branches", "pgbench_tellers", "pgbench_history", MARKERS)
APPLIED = re.compile(r"gold at \S+ \(silver run \d+, ([\d.]+) s\)")
PEER_INSERT = re.compile(r"table public\.fresh_markers: INSERT: id\[bigint\]:(\d+)")
MEMORY_EVERY_S = 5.0


class LatencyResult(Result):
    """A :class:`Result` whose timings are latencies (p50 commit to visible): lower is better,
    and the summary says so instead of printing rates."""

    def summary_line(self) -> str:
        return (
            f"{self.name}: {self.ours.label} p50 {self.ours.seconds:.2f} s commit to gold, "
            f"{self.peer.label} p50 {self.peer.seconds:.3f} s commit to received "
            f"(goal: p50 <= {GOAL_P50_S:g} s, p95 <= {GOAL_P95_S:g} s)"
        )

    def to_record(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "metric": "latency_p50_s",
            "ours": {"label": self.ours.label, "p50_s": self.ours.seconds},
            "peer": {"label": self.peer.label, "p50_s": self.peer.seconds},
            "goal": None,
            "params": self.params,
            "details": self.details,
        }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--minutes", type=float, default=5.0, help="load duration (default 5)")
    parser.add_argument("--rate", type=int, default=200, help="pgbench transactions per second")
    parser.add_argument("--scale", type=int, default=1, help="pgbench scale (100k rows each)")
    parser.add_argument("--poll", type=float, default=0.2, help="gold poll interval, seconds")
    add_engine_argument(parser)


def run(args: argparse.Namespace) -> Result:
    env: BenchEnv = args.env
    root = env.state_dir / "freshness"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    prepare(env, args.scale)
    config = write_pipeline_config(
        env,
        root / "pgmedallion.toml",
        root / "lakehouse",
        source=SOURCE,
        publication=PUBLICATION,
        slot=SLOT,
        password_env=PASSWORD_ENV,
        writer=NAME,
        engine=args.engine,
    )
    say(f"pgmedallion's engine: {args.engine}")
    gold_markers = root / "lakehouse" / "warehouse" / f"{SCHEMAS['gold']}.db" / f"public_{MARKERS}"
    environ = {k: v for k, v in os.environ.items() if not _overrides_config(k)}
    environ[PASSWORD_ENV] = env.conninfo["password"]
    log = (root / "pipeline.log").open("wb")
    started = time.monotonic()
    pipeline = subprocess.Popen(
        [sys.executable, "-m", "pgmedallion.cli", "--config", str(config), "run", "--continuous"],
        cwd=root,
        env=environ,
        stdout=subprocess.PIPE,
        stderr=log,
        start_new_session=True,
    )
    applications: list[float] = []
    lines: list[str] = []

    def read_pipeline() -> None:
        for raw in pipeline.stdout:
            line = raw.decode(errors="replace").rstrip()
            lines.append(line)
            m = APPLIED.search(line)
            if m:
                applications.append(float(m[1]))

    threading.Thread(target=read_pipeline, daemon=True).start()
    seen: dict[int, float] = {}
    stop = threading.Event()
    try:
        ready = wait_for(lambda: visible_ids(gold_markers) is not None, pipeline, 900)
        say(f"pipeline started cold and applied the first snapshot in {ready - started:.1f} s")
        applications.clear()
        peer, received = start_peer(env)
        memory: list[tuple[float, float]] = []
        threads = [
            threading.Thread(target=poll_gold, args=(gold_markers, seen, stop, args.poll)),
            threading.Thread(target=sample_memory, args=(pipeline.pid, memory, stop)),
        ]
        for t in threads:
            t.daemon = True
            t.start()
        load_s = args.minutes * 60
        bench = subprocess.Popen(
            [str(env.client("pgbench")), "-n", "-c", "2", "-j", "1", "-R", str(args.rate)]
            + ["-T", str(int(load_s))],
            env=env.client_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        committed = write_markers(env, load_s)
        out = bench.communicate(timeout=600)[0].decode(errors="replace")
        tps = re.search(r"tps = ([\d.]+)", out)
        # One more marker, committed after pgbench exited: its LSN is above every pgbench
        # transaction's, so gold holding it holds them all (the last timed marker may commit
        # before pgbench's last transactions; a pipeline fast enough to show it at once then
        # stops short of them, and the balances below would differ by what it never saw).
        last = max(committed) + 1
        with env.connect() as conn:
            conn.execute(f"INSERT INTO {MARKERS} VALUES (%s, clock_timestamp())", (last,))
        wait_for(lambda: last in seen, pipeline, 600)
        stop.set()
        stopping = time.monotonic()
        pipeline.send_signal(signal.SIGINT)  # Ctrl-C, as a person stops it
        code = pipeline.wait(timeout=600)
        stop_s = time.monotonic() - stopping
        peer.terminate()
        peer.wait(timeout=60)
    finally:
        stop.set()
        if pipeline.poll() is None:
            os.killpg(pipeline.pid, signal.SIGKILL)
            pipeline.wait()
        log.close()
        with env.connect() as conn:
            for slot in (SLOT, PEER_SLOT):
                drop_slot(conn, slot)
    if code != 0:
        raise RuntimeError(f"run --continuous exited {code}; see {root / 'pipeline.log'}")
    check_balances(env, root)
    ours = [seen[i] - at for i, at in committed.items()]
    peers = [received[i] - at for i, at in committed.items() if i in received]
    return report(args, ours, peers, applications, memory, tps, stop_s, ready - started)


def prepare(env: BenchEnv, scale: int) -> None:
    subprocess.run(
        [str(env.client("pgbench")), "-i", "-q", "-s", str(scale)],
        env=env.client_env(),
        check=True,
        capture_output=True,
    )
    with env.connect() as conn:
        for slot in (SLOT, PEER_SLOT):
            drop_slot(conn, slot)
        # pgbench_history has no key and only takes inserts: FULL costs nothing, and doctor
        # asks for it (an update or delete could not be captured otherwise)
        conn.execute("ALTER TABLE pgbench_history REPLICA IDENTITY FULL")
        conn.execute(f"DROP TABLE IF EXISTS {MARKERS}")
        conn.execute(f"CREATE TABLE {MARKERS} (id bigint PRIMARY KEY, committed_at timestamptz)")
        conn.execute(sql.SQL("DROP PUBLICATION IF EXISTS {}").format(sql.Identifier(PUBLICATION)))
        conn.execute(
            sql.SQL("CREATE PUBLICATION {} FOR TABLE {}").format(
                sql.Identifier(PUBLICATION),
                sql.SQL(", ").join(sql.Identifier("public", t) for t in TABLES),
            )
        )
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'test_decoding')", (PEER_SLOT,))


def wait_for(done, pipeline: subprocess.Popen, timeout_s: float) -> float:
    """Poll ``done()`` until true (the time it was); fail if the pipeline exits first."""
    deadline = time.monotonic() + timeout_s
    while not done():
        if pipeline.poll() is not None:
            raise RuntimeError(f"run --continuous exited {pipeline.returncode} early")
        if time.monotonic() > deadline:
            raise TimeoutError(f"not done in {timeout_s:.0f} s")
        time.sleep(0.1)
    return time.monotonic()


def visible_ids(path: Path) -> set[int] | None:
    """The marker ids in gold (None: not built yet)."""
    if not (path / "_delta_log").is_dir():
        return None
    from pgmedallion.core.delta_rs import read_arrow

    try:  # gold has column mapping and deletion vectors: read through delta-rs' QueryBuilder
        table = read_arrow(str(path), ["id"])
    except Exception:  # a commit under way, or not yet a readable table
        return None
    return set(table.column("id").to_pylist())


def poll_gold(path: Path, seen: dict[int, float], stop: threading.Event, every: float) -> None:
    while not stop.is_set():
        ids = visible_ids(path) or set()
        now = time.monotonic()
        for i in ids - seen.keys():
            seen[i] = now
        stop.wait(every)


def start_peer(env: BenchEnv) -> tuple[subprocess.Popen, dict[int, float]]:
    """``pg_recvlogical`` on the peer slot, to a pipe read line by line: id -> arrival time."""
    received: dict[int, float] = {}
    peer = subprocess.Popen(
        [str(env.client("pg_recvlogical")), "--dbname", env.dbname, "--slot", PEER_SLOT]
        + ["--start", "-f", "-", "-F", "0"],
        env=env.client_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )

    def read() -> None:
        for raw in peer.stdout:
            m = PEER_INSERT.search(raw.decode(errors="replace"))
            if m:
                received.setdefault(int(m[1]), time.monotonic())

    threading.Thread(target=read, daemon=True).start()
    return peer, received


def write_markers(env: BenchEnv, seconds: float) -> dict[int, float]:
    """One marker a second for ``seconds``: id -> the time its COMMIT returned."""
    committed: dict[int, float] = {}
    with env.connect() as conn:  # autocommit: each INSERT is its own transaction
        start = time.monotonic()
        i = 0
        while time.monotonic() - start < seconds:
            i += 1
            conn.execute(f"INSERT INTO {MARKERS} VALUES (%s, clock_timestamp())", (i,))
            committed[i] = time.monotonic()
            time.sleep(max(0.0, start + i - time.monotonic()))
    return committed


def sample_memory(root: int, memory: list[tuple[float, float]], stop: threading.Event) -> None:
    start = time.monotonic()
    while not stop.is_set():
        kib = sum(proportional_kib(pid) or 0 for pid in tree(root))
        memory.append((time.monotonic() - start, kib * 1024 / MB))
        stop.wait(MEMORY_EVERY_S)


def check_balances(env: BenchEnv, root: Path) -> None:
    from pgmedallion.core.delta_rs import read_arrow

    path = root / "lakehouse" / "warehouse" / f"{SCHEMAS['gold']}.db" / "public_pgbench_accounts"
    table = read_arrow(str(path), ["abalance"])
    gold = sum(v for v in table.column("abalance").to_pylist() if v is not None)
    with env.connect() as conn:
        source = conn.execute("SELECT coalesce(sum(abalance), 0) FROM pgbench_accounts").fetchone()
    if int(source[0]) != gold or table.num_rows == 0:
        raise AssertionError(f"gold's balances sum to {gold}, PostgreSQL's to {source[0]}")
    say(f"gold's pgbench_accounts: {table.num_rows} rows, balances sum {gold} as in PostgreSQL")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def report(
    args: argparse.Namespace,
    ours: list[float],
    peers: list[float],
    applications: list[float],
    memory: list[tuple[float, float]],
    tps: re.Match | None,
    stop_s: float,
    start_s: float,
) -> Result:
    figures: dict[str, Any] = {}
    for label, values in (("gold", ours), ("pg_recvlogical", peers)):
        p50, p95, worst = percentile(values, 0.5), percentile(values, 0.95), max(values)
        figures[label] = {"p50": p50, "p95": p95, "max": worst, "markers": len(values)}
        say(
            f"{label}: commit to visible p50 {p50:.2f} s, p95 {p95:.2f} s, max {worst:.2f} s "
            f"({len(values)} markers)"
        )
    if applications:
        say(
            f"applications: {len(applications)}, median {statistics.median(applications):.1f} s, "
            f"max {max(applications):.1f} s"
        )
    tenth = 600.0
    first = [mb for t, mb in memory if t <= tenth]
    last = [mb for t, mb in memory if t >= memory[-1][0] - tenth] if memory else []
    peak_first, peak_last = max(first, default=0.0), max(last, default=0.0)
    say(
        f"pipeline tree PSS: peak {max((mb for _, mb in memory), default=0):.0f} MB; first ten "
        f"minutes' peak {peak_first:.0f} MB, last ten minutes' {peak_last:.0f} MB"
    )
    say(f"SIGINT to exit: {stop_s:.1f} s; pgbench: {tps[1] if tps else '?'} tps")
    gold = figures["gold"]
    say(
        f"goals: p50 <= {GOAL_P50_S:g} s: {'met' if gold['p50'] <= GOAL_P50_S else 'not met'}; "
        f"p95 <= {GOAL_P95_S:g} s: {'met' if gold['p95'] <= GOAL_P95_S else 'not met'}"
    )
    return LatencyResult(
        name=NAME,
        work={},
        ours=Timing("pgmedallion", gold["p50"]),
        peer=Timing("pg_recvlogical", figures["pg_recvlogical"]["p50"]),
        goal=None,
        params={
            "minutes": args.minutes,
            "rate": args.rate,
            "scale": args.scale,
            "poll": args.poll,
            "engine": args.engine,
        },
        details={
            "latency": figures,
            "applications": applications,
            "memory_mb": memory,
            "peak_first_10min_mb": peak_first,
            "peak_last_10min_mb": peak_last,
            "stop_s": stop_s,
            "start_s": start_s,
            "pgbench_tps": float(tps[1]) if tps else None,
        },
    )
