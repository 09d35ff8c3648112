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

import pytest

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
        assert self.child.next() == {"step": "armed"}, f"child died, see {self.log}"
        self.applied: list[dict] = []

    def next_applied(self, timeout_s: float) -> dict:
        line = self.child.next(timeout_s=timeout_s)
        assert line is not None, f"child died, see {self.log}"
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
            assert line is not None, f"child died, see {self.log}"
            if line["step"] == "stopped":
                assert self.child.end() == 0, f"see {self.log}"
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
