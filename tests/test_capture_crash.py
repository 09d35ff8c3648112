"""SIGKILL the capture during the snapshot and during streaming, rerun, and check bronze.

The capture runs in a process group of its own (``tests/capture_child.py``: one Python process
without Spark, as a local capture runs) with its own state directory; the whole group is
killed with SIGKILL, as a machine crash would, at a random moment or by a failpoint at a
chosen one (mid-COPY, or with every range's file written but not committed). This test
process reads the child's bronze table by path. After every kill, and in samples taken while
the child runs, the slot's ``confirmed_flush_lsn`` must not be ahead of bronze's frontier
(the confirmed position is read first, then the frontier, which only grows). After a final
run to completion, bronze replayed (snapshot rows, then each commit LSN's messages from one run
that reached its Commit) must equal the source table: nothing missing, nothing twice.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psycopg
import pytest
from pyspark.sql import functions as F

from pgmedallion.core.failpoints import ENV as FAILPOINTS_ENV
from tests.capture_child import complete_transactions, replay

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
ROWS = 50_000


class Child:
    """One capture process, in its own process group."""

    def __init__(self, spec: Path, log: Path, failpoints: str = "") -> None:
        env = dict(os.environ, PYTHONPATH=str(REPO))
        if failpoints:
            env[FAILPOINTS_ENV] = failpoints
        self.log = log.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.capture_child", str(spec)],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=self.log,
            start_new_session=True,
        )

    def kill(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self.log.close()

    def finish(self, timeout_s: float = 600) -> dict:
        out, _ = self.proc.communicate(timeout=timeout_s)
        self.log.close()
        assert self.proc.returncode == 0, f"capture child failed, see {self.log.name}"
        return json.loads(out.decode().strip().splitlines()[-1])

    def alive(self) -> bool:
        return self.proc.poll() is None


class Source:
    def __init__(self, conninfo: dict, tmp: Path) -> None:
        self.conninfo = conninfo
        self.slot = "crash_" + conninfo["dbname"]
        self.state = tmp / "child-spark"
        self.bronze_path = self.state / "warehouse" / "crash.db" / "bronze"
        self.tmp = tmp
        with psycopg.connect(**conninfo, autocommit=True) as conn:
            conn.execute("CREATE TABLE items (id int PRIMARY KEY, v text)")
            conn.execute(
                "INSERT INTO items SELECT g, 'item ' || g FROM generate_series(1, %s) g", (ROWS,)
            )
            conn.execute("CREATE PUBLICATION pub FOR TABLE items")

    def spec(self, continuous: bool = False, **limits) -> Path:
        path = self.tmp / "spec.json"
        path.write_text(
            json.dumps(
                {
                    "conninfo": self.conninfo,
                    "state_dir": str(self.state),
                    "source": "crash",
                    "publication": "pub",
                    "slot": self.slot,
                    "bronze": "crash.bronze",
                    "workers": 2,
                    "continuous": continuous,
                    "limits": limits,
                }
            )
        )
        return path

    def query(self, statement: str, params=()):
        with psycopg.connect(**self.conninfo, autocommit=True) as conn:
            return conn.execute(statement, params).fetchall()

    def execute(self, statement: str, params=()) -> None:
        with psycopg.connect(**self.conninfo, autocommit=True) as conn:
            conn.execute(statement, params)

    def walsender(self) -> int | None:
        """The pid streaming the slot (not one still creating it, which also holds it)."""
        rows = self.query(
            "SELECT s.active_pid FROM pg_replication_slots s"
            " JOIN pg_stat_replication r ON r.pid = s.active_pid"
            " WHERE s.slot_name = %s AND r.state = 'streaming'",
            (self.slot,),
        )
        return rows[0][0] if rows else None

    def confirmed(self) -> int | None:
        rows = self.query(
            "SELECT confirmed_flush_lsn - '0/0'::pg_lsn FROM pg_replication_slots"
            " WHERE slot_name = %s",
            (self.slot,),
        )
        return int(rows[0][0]) if rows and rows[0][0] is not None else None

    def rows(self) -> dict[str, tuple]:
        return {r[0]: tuple(r) for r in self.query("SELECT id::text, v FROM items")}

    def delta_versions(self) -> int:
        return len(list((self.bronze_path / "_delta_log").glob("*.json")))


def frontier(spark, src: Source) -> int | None:
    if not (src.bronze_path / "_delta_log").exists():
        return None
    bronze = spark.read.format("delta").load(str(src.bronze_path))
    return bronze.where("kind = 'progress'").agg(F.max("lsn")).first()[0]


def check_slot_not_ahead(spark, src: Source) -> tuple[int | None, int | None]:
    confirmed = src.confirmed()  # first: the frontier read after it can only be higher
    bronze = frontier(spark, src)
    if bronze is not None and confirmed is not None:
        assert confirmed <= bronze, f"slot at {confirmed:X} ahead of bronze {bronze:X}"
    return confirmed, bronze


def bronze_rows(spark, src: Source) -> list[dict]:
    bronze = spark.read.format("delta").load(str(src.bronze_path))
    columns = ["kind", "table_schema", "table_name", "lsn", "ordinal", "run_id", "batch_id"]
    return [r.asDict() for r in bronze.select(*columns, "payload").collect()]


class Writer:
    """Random inserts, updates and deletes on ``items`` in a thread, one transaction each."""

    def __init__(self, conninfo: dict, seed: int) -> None:
        self.stop_event = threading.Event()
        self.transactions = 0
        self.rng = random.Random(seed)
        self.next_id = 1_000_000 + seed * 100_000
        self.thread = threading.Thread(target=self._run, args=(conninfo,), daemon=True)
        self.thread.start()

    def _run(self, conninfo: dict) -> None:
        with psycopg.connect(**conninfo, autocommit=True) as conn:
            while not self.stop_event.is_set():
                with conn.transaction():
                    start = self.next_id
                    self.next_id += 10
                    conn.execute(
                        "INSERT INTO items SELECT g, 'w' || g FROM generate_series(%s, %s) g",
                        (start, start + 9),
                    )
                    low = self.rng.randint(1, ROWS - 100)
                    conn.execute(
                        "UPDATE items SET v = v || '+' WHERE id BETWEEN %s AND %s",
                        (low, low + 9),
                    )
                    low = self.rng.randint(1, ROWS - 100)
                    conn.execute("DELETE FROM items WHERE id BETWEEN %s AND %s", (low, low + 1))
                self.transactions += 1
                time.sleep(0.05)

    def stop(self) -> int:
        self.stop_event.set()
        self.thread.join()
        return self.transactions


class Sampler:
    """Checks confirmed_flush_lsn <= bronze frontier over and over while a child runs."""

    def __init__(self, spark, src: Source) -> None:
        self.samples = 0
        self.failure: BaseException | None = None
        self.stop_event = threading.Event()

        def run() -> None:
            while not self.stop_event.wait(0.5):
                try:
                    confirmed, bronze = check_slot_not_ahead(spark, src)
                except AssertionError as exc:
                    self.failure = exc
                    return
                except Exception:  # the Delta log mid-write: try again
                    continue
                if bronze is not None:
                    self.samples += 1

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def stop(self) -> int:
        self.stop_event.set()
        self.thread.join()
        if self.failure is not None:
            raise self.failure
        return self.samples


def wait_for(predicate, what: str, child: Child, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert child.alive(), f"capture finished before {what}; see {child.log.name}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def verify(spark, src: Source) -> dict:
    rows = bronze_rows(spark, src)
    assert replay(rows, "public", "items") == src.rows()
    reads = {}
    for r in rows:
        if r["kind"] == "wal":
            reads.setdefault(r["lsn"], set()).add(r["run_id"])
    complete = complete_transactions(rows)
    return {
        "transactions": len(complete),
        "read_more_than_once": sum(len(runs) > 1 for runs in reads.values()),
    }


def test_sigkill_during_the_snapshot_then_rerun(spark, db, tmp_path):
    src = Source(db, tmp_path)
    spec = src.spec(batch_messages=3000)
    writer = Writer(db, seed=1)
    kills = 0
    try:
        # Mid-COPY (the second chunk read), then with both ranges' files written and not yet
        # committed: the snapshot must not be in bronze after either.
        for point in ("snapshot.copy_chunk=2", "snapshot.before_commit"):
            child = Child(spec, tmp_path / "child.log", failpoints=point)
            assert child.proc.wait(timeout=600) == -signal.SIGKILL, f"{point} was not reached"
            child.log.close()
            kills += 1
            check_slot_not_ahead(spark, src)
            if (src.bronze_path / "_delta_log").exists():
                bronze = spark.read.format("delta").load(str(src.bronze_path))
                assert bronze.where("kind = 'rewind'").count() == 0, f"{point}: snapshot landed"
        # And at a random moment once the snapshot has started (it may have committed by then).
        child = Child(spec, tmp_path / "child.log")
        wait_for(
            lambda: src.query(
                "SELECT 1 FROM pg_replication_slots WHERE slot_name LIKE 'pgm_snap_%%'"
            ),
            "the snapshot to start",
            child,
        )
        time.sleep(random.Random(0).uniform(0, 0.3))
        child.kill()
        kills += 1
        check_slot_not_ahead(spark, src)
    finally:
        writes = writer.stop()
    final = Child(spec, tmp_path / "child.log").finish()
    stats = verify(spark, src)
    assert src.confirmed() == frontier(spark, src)
    rewinds = spark.read.format("delta").load(str(src.bronze_path)).where("kind = 'rewind'")
    assert rewinds.count() == 1  # one complete snapshot, by the last run or the random kill's
    print(f"\nsnapshot kills: {kills}, writer transactions: {writes}, {stats}, {final}")


def test_sigkill_during_streaming_then_rerun(spark, db, tmp_path):
    src = Source(db, tmp_path)
    spec = src.spec(batch_messages=3000)
    Child(spec, tmp_path / "child.log").finish()  # snapshot + empty stream
    writer = Writer(db, seed=2)
    while writer.transactions < 600:  # a backlog of about 15k messages
        time.sleep(0.1)
    sampler = Sampler(spark, src)
    kills = 0
    try:
        for trial in range(2):
            versions = src.delta_versions()
            child = Child(spec, tmp_path / "child.log")
            wait_for(lambda v=versions: src.delta_versions() > v, "a stream batch", child)
            time.sleep(random.Random(trial).uniform(0, 1.5))
            child.kill()
            kills += 1
            check_slot_not_ahead(spark, src)
    finally:
        writes = writer.stop()
    final = Child(spec, tmp_path / "child.log").finish()
    samples = sampler.stop()
    assert final["snapshotted"] == {}
    stats = verify(spark, src)
    assert src.confirmed() == frontier(spark, src) == final["frontier"]
    assert samples > 0
    print(f"\nstream kills: {kills}, writer transactions: {writes}, samples: {samples}, {stats}")


def test_sigterm_ends_a_continuous_capture_with_its_batch_committed_and_acked(spark, db, tmp_path):
    src = Source(db, tmp_path)
    # No timed commits: the only stream batch is the one the signal makes.
    spec = src.spec(continuous=True, commit_interval_s=3600, idle_commit_interval_s=3600)
    child = Child(spec, tmp_path / "child.log")
    wait_for(lambda: src.walsender() is not None, "the stream to start", child)
    assert frontier(spark, src) is None
    ((before,),) = src.query("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")
    src.execute("INSERT INTO items VALUES (%s, 'late')", (ROWS + 1,))
    # The walsender has decoded past the insert's first record (an idle server's write
    # position can lie past its last record, so the position after the insert may never be).
    sent = "SELECT sent_lsn - '0/0'::pg_lsn FROM pg_stat_replication WHERE pid = %s"
    pid = src.walsender()
    wait_for(lambda: (src.query(sent, (pid,)) or [(0,)])[0][0] >= before, "the send", child)
    child.proc.send_signal(signal.SIGTERM)  # the driver only, as a service manager would
    result = child.finish()
    bronze = frontier(spark, src)
    assert bronze is not None and result["frontier"] == bronze
    assert src.confirmed() == bronze
    assert not src.query(
        "SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s", (src.slot,)
    )[0][0]  # the walsender was let go
