"""``run --continuous``: capture, silver and gold in one long-lived process (a child of its own,
``tests/pipeline_child.py``'s ``continuous`` step), against a real PostgreSQL and Spark.

The parent writes the workload while the child runs, and compares the child's gold tables (read
by path) with PostgreSQL key by key once the child reports a frontier past the source's WAL
position after the writes: gold follows the source without another run. SIGTERM ends the
child cleanly with gold at capture's frontier; SIGKILL at random moments under load loses and
duplicates nothing once a new continuous process resumes.
"""

from __future__ import annotations

import json
import queue
import random
import signal
import time
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from pgmedallion.localpg import LocalPostgres
from tests.conftest import STATE
from tests.test_faults import streaming_pid, wait_for
from tests.test_pipeline_crash import (
    Child,
    gold_rows,
    lost_and_duplicated,
    source_rows,
)
from tests.workload import Workload

TABLES = ("public.events", "public.ledger", "public.orders")
NAME = "cont"


def differences(spark, conninfo: dict, warehouse: Path) -> dict[str, tuple[int, int]]:
    """Per table: (source rows missing from gold, gold rows beyond the source's copies)."""
    return lost_and_duplicated(source_rows(conninfo), gold_rows(spark, warehouse, NAME))


class Pipeline:
    """A continuous pipeline child; ``applied_past(lsn)`` waits for gold to pass ``lsn``."""

    def __init__(self, db: dict, tmp_path: Path) -> None:
        state = tmp_path / "child-spark"
        self.warehouse = state / "warehouse"
        spec = tmp_path / "spec.json"
        spec.write_text(
            json.dumps(
                {
                    "config": {"conninfo": db, "name": NAME},
                    "state_dir": str(state),
                    "steps": [{"do": "continuous"}],
                }
            )
        )
        self.log = tmp_path / "child.log"
        self.child = Child(spec, self.log)
        assert self.child.next() == {"step": "armed"}, self.died()
        self.applied: list[dict] = []

    def died(self) -> str:
        """The child's exit status and the end of its log (CI keeps no files)."""
        if not self.child.log.closed:
            self.child.log.flush()
        tail = self.log.read_text(errors="replace").splitlines()[-40:]
        return f"child died ({self.child.proc.poll()}); the end of {self.log}:\n" + "\n".join(tail)

    def next_applied(self, timeout_s: float) -> dict:
        line = self.child.next(timeout_s=timeout_s)
        assert line is not None, self.died()
        assert line["step"] == "applied", line
        assert line["error"] is None, line
        self.applied.append(line)
        return line

    def caught_up(self, spark, db: dict, timeout_s: float = 600) -> dict:
        """Wait for applications until gold equals the source (its last line), or fail with
        the differences left at the timeout."""
        deadline = time.monotonic() + timeout_s
        while True:
            line = self.next_applied(max(1.0, deadline - time.monotonic()))
            left = differences(spark, db, self.warehouse)
            if all(v == (0, 0) for v in left.values()):
                return line
            assert time.monotonic() < deadline, left

    def stop(self) -> dict:
        """SIGTERM (the driver only, as a service manager sends it); its last line."""
        self.child.proc.send_signal(signal.SIGTERM)
        while True:
            line = self.child.next(timeout_s=600)
            assert line is not None, self.died()
            if line["step"] == "stopped":
                assert self.child.end() == 0, self.died()
                return line
            self.applied.append(line)


def test_gold_follows_the_source_without_another_run_and_sigterm_stops_cleanly(spark, db, tmp_path):
    wl = Workload(db, 31, tables=TABLES, initial_rows=40)
    wl.create()
    pipeline = Pipeline(db, tmp_path)
    first = pipeline.caught_up(spark, db)  # the snapshot
    for _ in range(2):
        wl.burst(transactions=10)
        line = pipeline.caught_up(spark, db)
        assert line["frontier"] > first["frontier"]
    wl.burst(transactions=10)
    stopped = pipeline.stop()
    assert stopped["capture_error"] is None
    # what capture committed last was applied before the process ended
    assert stopped["frontier"] == stopped["capture"]
    assert len(pipeline.applied) >= 3


@pytest.mark.slow
def test_sigkill_a_continuous_pipeline_under_load_and_resume(spark, db, tmp_path):
    rng = random.Random(7)
    wl = Workload(db, 7, tables=TABLES, initial_rows=40)
    wl.create()
    kills = 0
    for _ in range(3):
        pipeline = Pipeline(db, tmp_path)
        pipeline.next_applied(600)
        deadline = time.monotonic() + rng.uniform(1, 20)
        while time.monotonic() < deadline:
            wl.burst(transactions=5)
        try:  # an application may be under way: the kill lands anywhere in it
            pipeline.child.next(timeout_s=rng.uniform(0, 5))
        except queue.Empty:
            pass
        pipeline.child.kill()
        pipeline.child.end()
        kills += 1
    pipeline = Pipeline(db, tmp_path)
    wl.burst(transactions=10)
    pipeline.caught_up(spark, db)
    assert pipeline.stop()["capture_error"] is None
    assert kills == 3


@pytest.fixture(scope="module")
def own_pg():
    """A PostgreSQL 18 server of this module's own: the fault trial restarts it."""
    server = LocalPostgres(STATE / "pg18-continuous").start()
    yield server
    server.stop()


@pytest.mark.slow
def test_a_dropped_connection_and_a_server_restart_under_a_continuous_pipeline(
    spark, own_pg, tmp_path
):
    """The walsender terminated, then PostgreSQL restarted, while ``run --continuous`` runs:
    capture reconnects by itself (transient errors, retried), silver and gold go on applying,
    gold equals the source after each, and SIGTERM still ends with gold at capture's frontier."""
    with psycopg.connect(**own_pg.conninfo(), autocommit=True) as conn:
        for (slot,) in conn.execute(
            "SELECT slot_name FROM pg_replication_slots WHERE slot_name = %s", (f"slot_{NAME}",)
        ).fetchall():
            conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS cont_faults WITH (FORCE)"))
        conn.execute(sql.SQL("CREATE DATABASE cont_faults"))
    db = own_pg.conninfo(dbname="cont_faults")
    wl = Workload(db, 13, tables=TABLES, initial_rows=40)
    wl.create()
    pipeline = Pipeline(db, tmp_path)
    pipeline.caught_up(spark, db)
    wait_for(lambda: streaming_pid(db, f"slot_{NAME}"), "the stream to start")
    with psycopg.connect(**db, autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(%s)", (streaming_pid(db, f"slot_{NAME}"),))
    wl.burst(transactions=10)
    dropped = pipeline.caught_up(spark, db)
    own_pg.restart()
    wl.burst(transactions=10)
    restarted = pipeline.caught_up(spark, db)
    assert restarted["frontier"] > dropped["frontier"]
    stopped = pipeline.stop()
    assert stopped["capture_error"] is None
    assert stopped["frontier"] == stopped["capture"]
    assert all(v == (0, 0) for v in differences(spark, db, pipeline.warehouse).values())
    assert db["password"] not in pipeline.log.read_text()
