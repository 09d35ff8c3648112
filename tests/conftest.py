"""Shared fixtures: one real PostgreSQL per server version and one Spark session per test run."""

from __future__ import annotations

import os
import time
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from pgmedallion.localpg import LocalPostgres

PG15_BIN = Path("/usr/lib/postgresql/15/bin")
STATE = Path(
    os.environ.get("PGMEDALLION_TEST_STATE", Path(__file__).parent.parent / ".pgmedallion" / "test")
)
if os.environ.get("PYTEST_XDIST_WORKER"):  # pytest -n: each worker its own servers and Spark
    STATE = STATE / os.environ["PYTEST_XDIST_WORKER"]

# Spark's JVM in tests (and in the child processes they start) skips the optimizing JIT: on
# the suite's small tables compiling cost more CPU than it saved (see core/spark.py).
os.environ.setdefault("PGMEDALLION_SPARK_JAVA_OPTIONS", "-XX:TieredStopAtLevel=1")

ARCHIVE_ENV = "PGMEDALLION_SPARK_CLASS_ARCHIVE"
WRITE_ARCHIVE = """
import sys
from pgmedallion.core.spark import get_spark
get_spark(sys.argv[1]).range(1).count()
"""


def _class_archive() -> None:
    """Before any worker starts: the JVM class archive the suite's Spark processes start from
    (``core.spark.class_archive_options``), written once by a child process that exits as a
    ``pgmedallion`` process does. A cold Spark process of the suite takes 10 s with it and 17 s
    without (a start, a Delta table created, written and read; C1 only). A pytest worker ends
    without running exit handlers, so it must never be the process that claims the archive:
    where the archive cannot be written, the suite runs without one."""
    if os.environ.get(ARCHIVE_ENV) == "0":
        return
    import subprocess
    import sys
    import tempfile

    from pgmedallion.core.spark import (
        check_java,
        class_archive,
        jvm_flags,
        session_jars,
        spark_settings,
    )

    try:
        with tempfile.TemporaryDirectory() as tmp:
            jars = session_jars(spark_settings(Path(tmp)))
            archive = class_archive(jars, jvm_flags(), check_java())
            if archive is not None and not archive.is_file():
                subprocess.run(
                    [sys.executable, "-c", WRITE_ARCHIVE, tmp],
                    capture_output=True,
                    timeout=900,
                )
    except Exception:  # noqa: BLE001 - no Java, no jars: the tests that need them say so
        archive = None
    if archive is None or not archive.is_file():
        os.environ[ARCHIVE_ENV] = "0"


def pytest_configure(config):
    if not os.environ.get("PYTEST_XDIST_WORKER"):  # the controller (or the only process)
        _class_archive()


SERVERS = ["pg18"] + (["pg15"] if (PG15_BIN / "postgres").exists() else [])


_STARTED: dict[str, LocalPostgres] = {}


def _server(name: str) -> LocalPostgres:
    if name not in _STARTED:
        bin_dir = PG15_BIN if name == "pg15" else None
        _STARTED[name] = LocalPostgres(STATE / name, bin_dir=bin_dir).start()
    return _STARTED[name]


@pytest.fixture(scope="session", autouse=True)
def _stop_servers():
    """The servers the run started are stopped when it ends (nothing outlives the run)."""
    yield
    for server in _STARTED.values():
        server.stop()


@pytest.fixture(scope="session")
def pg() -> LocalPostgres:
    """The embedded PostgreSQL 18 server (wal_level=logical)."""
    return _server("pg18")


@pytest.fixture(scope="session", params=SERVERS)
def any_pg(request) -> LocalPostgres:
    """Every server version available here: capture tests run against each."""
    return _server(request.param)


@pytest.fixture
def db(pg: LocalPostgres, request):
    """A fresh database on the embedded server, named after the test; yields its conninfo."""
    yield from _fresh_db(pg, request)


@pytest.fixture
def any_db(any_pg: LocalPostgres, request):
    yield from _fresh_db(any_pg, request)


def _fresh_db(server: LocalPostgres, request):
    name = "t_" + "".join(c if c.isalnum() else "_" for c in request.node.name.lower())[:55]
    _drop_db(server, name)
    with psycopg.connect(**server.conninfo(), autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    yield server.conninfo(dbname=name)
    _drop_db(server, name)


def _drop_db(server: LocalPostgres, name: str) -> None:
    """Drop a test database and its slots (slot names are cluster-wide, so they must go too).

    A walsender that a test left streaming is terminated first; it releases its slot only
    once it has exited, so the drop waits for that (a drop right after the terminate raced it:
    ``replication slot ... is active for PID``)."""
    with psycopg.connect(**server.conninfo(), autocommit=True) as conn:
        deadline = time.monotonic() + 30
        while True:
            conn.execute(
                "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots "
                "WHERE database = %s AND active_pid IS NOT NULL",
                (name,),
            )
            slots = conn.execute(
                "SELECT slot_name FROM pg_replication_slots WHERE database = %s", (name,)
            ).fetchall()
            try:
                for (slot,) in slots:
                    conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
                break
            except psycopg.errors.ObjectInUse:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


@pytest.fixture(scope="session")
def spark():
    """The one SparkSession of the test run (local, Delta, Hive catalog under the test state)."""
    from pgmedallion.core.spark import get_spark

    session = get_spark(STATE / "spark")
    yield session
    session.stop()


# The tests that run whole pipelines take minutes each and the rest seconds. Under ``-n 2``
# the run ends when the later worker does, so the long ones go first (largest first, as
# measured) and the short ones fill in behind them.
LONGEST_FIRST = (
    "test_pipeline_crash.py",  # slow: the crash trials, about 7 minutes
    "test_driver_bound.py",  # 25,000 wide rows through Spark's writers
    "test_standalone_cluster.py",  # slow: a master, two workers and their executors
    "test_replica_identity.py",
    "test_partitions.py",
    "test_differential.py",
    "test_resync.py",
    "test_benchmarks.py",
    "test_verify.py",
    "test_generated.py",
    "test_gold_quality.py",
    "test_silver.py",
    "test_gold.py",
    "test_faults.py",
    "test_capture_crash.py",
    "test_demo.py",
    "test_bad_input.py",
)


def _weight(item) -> int:
    name = item.path.name
    if name in LONGEST_FIRST:
        return LONGEST_FIRST.index(name)
    if "spark" in getattr(item, "fixturenames", ()):
        return len(LONGEST_FIRST)
    return len(LONGEST_FIRST) + 1


def pytest_collection_modifyitems(config, items):
    items.sort(key=_weight)  # stable: the order within a file is kept


DEADLINE_ENV = "PGMEDALLION_TEST_DEADLINE"
"""A time (seconds since the epoch) after which no test starts: CI's passes beyond the README's
test command share what is left of its 90 minutes. A test not started is reported as skipped,
with the reason; every test that started runs to its end."""


def pytest_runtest_setup(item):
    deadline = os.environ.get(DEADLINE_ENV)
    if deadline and time.time() > float(deadline):
        pytest.skip("not started: CI's time budget for this pass is spent")


@pytest.fixture(autouse=True)
def _engine_setting():
    """Every test starts from the engine setting of the run (``PGMEDALLION_LAKEHOUSE_ENGINE``,
    which CI sets to run the end-to-end trials on each engine); the entry points apply a
    configuration's own (``pgmedallion.core.engine.use``)."""
    from pgmedallion.core import engine
    from pgmedallion.core.config import LakehouseConfig

    setting = os.environ.get("PGMEDALLION_LAKEHOUSE_ENGINE", "auto")
    engine.use(LakehouseConfig(engine=setting))
    yield
    engine.use(LakehouseConfig(engine=setting))
