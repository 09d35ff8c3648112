"""Capture runs against a real PostgreSQL and Spark: continuous mode, retries, error records.

Each test has its own database (slot names follow it) and its own bronze table.
"""

from __future__ import annotations

import json
import logging
import threading
import time

import psycopg
import pytest
from pyspark.sql import functions as F

from pgmedallion.bronze.spark_table import capture_error_from_spark, write_batch
from pgmedallion.bronze.table import ARROW_SCHEMA, RecordBuffer, json_payload
from pgmedallion.capture.connection import connect_replication
from pgmedallion.capture.errors import (
    PublicationDropped,
    SlotInUse,
    SlotMissing,
    TableDropped,
    TimelineChanged,
    TransientError,
)
from pgmedallion.capture.pgoutput import Insert, decode
from pgmedallion.capture.progress import (
    CopyProgressMonitor,
    TableSize,
    copy_application_name,
    estimate_rows,
    parse_copy_application_name,
    table_progress,
)
from pgmedallion.capture.replication import status_interval
from pgmedallion.capture.run import (
    CaptureOptions,
    CaptureTarget,
    RetryPolicy,
    StreamLimits,
    bronze_of,
    capture_once,
    land_snapshot,
)
from pgmedallion.capture.slot import identify_system, slot_state
from pgmedallion.capture.snapshot import PublishedTable
from tests.capture_child import replay

QUICK_RETRY = RetryPolicy(attempts=6, initial_delay_s=0.2, max_delay_s=1.0)
QUICK_LIMITS = StreamLimits(
    commit_interval_s=0.5, idle_commit_interval_s=3600, publication_check_interval_s=0.5
)


def capture(spark, target, **options):
    """One capture run into ``target``'s bronze through ``spark``'s session."""
    return capture_once(bronze_of(spark, target), target, CaptureOptions(**options))


def _target(spark, conninfo, name: str, engine: str = "auto") -> CaptureTarget:
    spark.sql("CREATE SCHEMA IF NOT EXISTS bronze_stream")
    spark.sql(f"DROP TABLE IF EXISTS bronze_stream.{name}")
    return CaptureTarget(
        conninfo,
        source="src",
        publication="pub",
        slot="s_" + conninfo["dbname"],
        bronze=f"bronze_stream.{name}",
        engine=engine,
    )


@pytest.fixture
def source(db):
    """Table ``t`` (published by ``pub``, 200 rows) and ``u`` (not published)."""
    with psycopg.connect(**db, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        conn.execute("CREATE TABLE u (id int)")
        conn.execute("INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 200) g")
        conn.execute("CREATE PUBLICATION pub FOR TABLE t")
    return db


def _sql(conninfo, *statements: str):
    with psycopg.connect(**conninfo, autocommit=True) as conn:
        result = None
        for statement in statements:
            result = conn.execute(statement)
        return result.fetchall() if result is not None and result.description else None


def _source_rows(conninfo) -> dict[str, tuple]:
    rows = _sql(conninfo, "SELECT id::text, v FROM t")
    return {r[0]: tuple(r) for r in rows}


def _bronze(spark, target) -> list:
    return [r.asDict() for r in spark.table(target.bronze).collect()]


def _frontier(spark, target) -> int:
    return spark.table(target.bronze).where("kind = 'progress'").agg(F.max("lsn")).first()[0]


def _confirmed(conninfo, slot: str) -> int:
    with psycopg.connect(**conninfo) as conn:
        return slot_state(conn, slot).confirmed_flush_lsn


def _errors(spark, target) -> list[dict]:
    rows = spark.table(target.bronze).where("kind = 'error'").collect()
    return [dict(r.asDict(), payload=json.loads(bytes(r["payload"]))) for r in rows]


def _wait(predicate, what: str, run=None, timeout_s: float = 300.0, every_s: float = 0.3):
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if run is not None and not run.thread.is_alive():
            run.stop()  # raises the capture's error, if any
            pytest.fail(f"capture ended before {what}")
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(every_s)


def _streaming(conninfo, slot: str) -> int | None:
    """The walsender streaming ``slot`` (a session still creating the slot also holds it)."""
    rows = _sql(
        conninfo,
        "SELECT s.active_pid FROM pg_replication_slots s"
        " JOIN pg_stat_replication r ON r.pid = s.active_pid"
        f" WHERE s.slot_name = '{slot}' AND r.state = 'streaming'",
    )
    return rows[0][0] if rows else None


class Background:
    """capture_once(continuous=True) in a thread; stop() sets the event and joins."""

    def __init__(self, spark, target, **kwargs):
        self.stop_event = threading.Event()
        self.result = None
        self.error = None

        def run():
            try:
                self.result = capture(
                    spark,
                    target,
                    continuous=True,
                    stop=self.stop_event,
                    handle_signals=False,
                    **kwargs,
                )
            except BaseException as exc:  # reported by stop()
                self.error = exc

        self.thread = threading.Thread(target=run, name="capture")
        self.thread.start()

    def stop(self):
        self.stop_event.set()
        self.thread.join(timeout=300)
        assert not self.thread.is_alive(), "capture did not stop"
        if self.error is not None:
            raise self.error
        return self.result


def _wal_inserts(spark, target) -> int:
    rows = spark.table(target.bronze).where("kind = 'wal'").select("payload").collect()
    return sum(isinstance(decode(bytes(r["payload"])), Insert) for r in rows)


def test_continuous_capture_picks_up_commits_and_stops_cleanly(spark, source):
    target = _target(spark, source, "continuous")
    run = Background(spark, target, limits=QUICK_LIMITS, retry=QUICK_RETRY)
    try:
        _wait(lambda: _streaming(source, target.slot), "the stream to start", run)
        _sql(source, "INSERT INTO t SELECT g, 'new' FROM generate_series(1001, 1010) g")
        _sql(source, "UPDATE t SET v = 'changed' WHERE id = 1", "DELETE FROM t WHERE id = 2")
        _wait(lambda: _wal_inserts(spark, target) == 10, "the inserts to land", run)
        # Idle: nothing is published, so no batch is committed while the stream waits.
        batches_idle_start = spark.table(target.bronze).select("batch_id").distinct().count()
        cpu_start = time.process_time()
        time.sleep(3)
        cpu_idle = time.process_time() - cpu_start
        batches_idle_end = spark.table(target.bronze).select("batch_id").distinct().count()
    finally:
        result = run.stop()
    assert batches_idle_end == batches_idle_start
    assert cpu_idle < 1.5, f"idle stream used {cpu_idle:.2f} s of CPU in 3 s: spinning"
    frontier = _frontier(spark, target)
    assert result.frontier == frontier
    assert _confirmed(source, target.slot) == frontier
    assert _streaming(source, target.slot) is None  # the walsender was let go
    assert replay(_bronze(spark, target), "public", "t") == _source_rows(source)


def test_walsender_terminated_and_server_restart_are_retried(spark, source, pg, caplog):
    target = _target(spark, source, "retried")
    caplog.set_level(logging.WARNING, logger="pgmedallion.capture.run")
    patient = RetryPolicy(attempts=10, initial_delay_s=0.2, max_delay_s=2.0)
    run = Background(spark, target, limits=QUICK_LIMITS, retry=patient)
    try:
        _wait(lambda: _streaming(source, target.slot), "the stream to start", run)
        _sql(source, "INSERT INTO t SELECT g, 'a' FROM generate_series(1001, 1005) g")
        _wait(lambda: _wal_inserts(spark, target) == 5, "the first inserts to land", run)
        pid = _streaming(source, target.slot)
        _sql(source, f"SELECT pg_terminate_backend({pid})")
        _sql(source, "INSERT INTO t SELECT g, 'b' FROM generate_series(1006, 1010) g")
        _wait(lambda: _wal_inserts(spark, target) >= 10, "inserts after the walsender died", run)
        pg.restart()
        _sql(source, "INSERT INTO t SELECT g, 'c' FROM generate_series(1011, 1015) g")
        _wait(lambda: _wal_inserts(spark, target) >= 15, "inserts after the restart", run)
    finally:
        result = run.stop()
    assert result.retries >= 2
    retries = [r.getMessage() for r in caplog.records if " retry " in r.getMessage()]
    assert len(retries) >= 2
    assert all(source["password"] not in line for line in retries)
    frontier = _frontier(spark, target)
    assert _confirmed(source, target.slot) == frontier == result.frontier
    assert replay(_bronze(spark, target), "public", "t") == _source_rows(source)


@pytest.mark.parametrize("writer", ["spark", "delta-rs"])
def test_either_writer_lands_the_stream_once(spark, source, writer):
    """Locally the stream commits through delta-rs; on Databricks through Spark. Both land the
    same changes in several batches, each once, and the slot follows bronze."""
    target = _target(spark, source, "writer_" + writer.replace("-", "_"), writer)
    capture(spark, target)
    _sql(
        source,
        "INSERT INTO t SELECT g, 'new ' || g FROM generate_series(1001, 1020) g",
        "UPDATE t SET v = 'changed' WHERE id <= 5",
        "DELETE FROM t WHERE id BETWEEN 6 AND 8",
    )
    batches = spark.table(target.bronze).select("batch_id").distinct().count()
    result = capture(spark, target, limits=StreamLimits(batch_messages=10))
    assert result.messages > 30 and result.batches >= 3
    assert spark.table(target.bronze).select("batch_id").distinct().count() == (
        batches + result.batches
    )
    assert replay(_bronze(spark, target), "public", "t") == _source_rows(source)
    assert _confirmed(source, target.slot) == result.frontier == _frontier(spark, target)


def test_unpublished_writes_move_the_slot_once_they_add_up(spark, source, record_property):
    """WAL the publication does not carry moves nothing for a few kilobytes (a run with
    nothing new lands no batch, so it costs no Spark), and moves the slot to the run's start
    once it adds up to a WAL segment, so the slot never holds it back for long."""
    target = _target(spark, source, "unpublished")
    capture(spark, target)
    before = _frontier(spark, target)
    _sql(source, "INSERT INTO u SELECT g FROM generate_series(1, 5000) g")
    result = capture(spark, target)
    assert result.messages == 0 and result.frontier == _frontier(spark, target) == before
    _sql(source, "INSERT INTO u SELECT g FROM generate_series(1, 400000) g")  # > 16 MiB of WAL
    ((start,),) = _sql(source, "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")
    result = capture(spark, target)
    assert result.messages == 0
    ((confirmed, retained),) = _sql(
        source,
        "SELECT confirmed_flush_lsn - '0/0'::pg_lsn,"
        " pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)"
        f" FROM pg_replication_slots WHERE slot_name = '{target.slot}'",
    )
    assert confirmed >= start
    assert confirmed == result.frontier == _frontier(spark, target)
    record_property("wal_retained_bytes", int(retained))
    print(f"\nWAL retained after a run with only unpublished writes: {int(retained)} bytes")


def test_dropped_publication_is_recorded_once_and_raised(spark, source):
    target = _target(spark, source, "pubdropped")
    capture(spark, target)
    _sql(source, "DROP PUBLICATION pub")
    for _ in range(2):
        with pytest.raises(PublicationDropped):
            capture(spark, target, retry=QUICK_RETRY)
    (error,) = _errors(spark, target)
    assert error["table_oid"] is None and error["lsn"] == _frontier(spark, target)
    assert error["payload"]["code"] == "PublicationDropped"
    assert "pub" in error["payload"]["message"]


def test_dropped_slot_with_a_bronze_frontier_is_recorded_not_recreated(spark, source):
    target = _target(spark, source, "slotdropped")
    capture(spark, target)
    _sql(source, f"SELECT pg_drop_replication_slot('{target.slot}')")
    with pytest.raises(SlotMissing, match="changes since are lost"):
        capture(spark, target)
    (error,) = _errors(spark, target)
    assert error["payload"]["code"] == "SlotMissing" and error["table_oid"] is None
    assert not _sql(source, f"SELECT 1 FROM pg_replication_slots WHERE slot_name = '{target.slot}'")


def test_changed_timeline_is_recorded(spark, source):
    target = _target(spark, source, "timeline")
    capture(spark, target)
    system = identify_system(connect_replication(source))
    buffer = RecordBuffer(target.source, "forged")
    identity = {"system_id": system.system_id, "timeline": system.timeline + 1}
    buffer.add("progress", _frontier(spark, target), payload=json_payload(identity))
    batch = spark.table(target.bronze).agg(F.max("batch_id")).first()[0] + 1
    write_batch(spark.createDataFrame(buffer.to_arrow(batch)), target.bronze, "src", batch)
    with pytest.raises(TimelineChanged):
        capture(spark, target)
    (error,) = _errors(spark, target)
    assert error["payload"]["code"] == "TimelineChanged"


def test_dropped_tables_are_recorded_and_the_others_go_on(spark, source):
    target = _target(spark, source, "tabledropped")
    _sql(source, "CREATE TABLE g (id int PRIMARY KEY)", "ALTER PUBLICATION pub ADD TABLE g")
    first = capture(spark, target)
    assert set(first.snapshotted) == {"public.t", "public.g"}
    ((g_oid,),) = _sql(source, "SELECT 'g'::regclass::oid::int8")
    _sql(source, "DROP TABLE g", "INSERT INTO t VALUES (5000, 'after')")
    second = capture(spark, target)
    assert list(second.table_errors) == ["public.g"]
    (error,) = _errors(spark, target)
    assert (error["table_oid"], error["table_schema"], error["table_name"]) == (
        g_oid,
        "public",
        "g",
    )
    assert error["payload"]["code"] == "TableDropped"
    assert capture(spark, target).table_errors == {}  # recorded once
    assert replay(_bronze(spark, target), "public", "t") == _source_rows(source)

    # Dropped between the publication listing and the snapshot: skipped, the others land.
    _sql(source, "CREATE TABLE h (id int)", "CREATE TABLE k (id int)")
    _sql(source, "INSERT INTO k VALUES (1), (2)")
    ((h_oid, k_oid),) = _sql(source, "SELECT 'h'::regclass::oid::int8, 'k'::regclass::oid::int8")
    _sql(source, "DROP TABLE h")
    landed = land_snapshot(
        bronze_of(spark, target),
        target,
        [PublishedTable(h_oid, "public", "h"), PublishedTable(k_oid, "public", "k")],
        workers=2,
        run_id="dropped-h",
    )
    assert landed.counts == {"public.k": 2}
    assert list(landed.dropped) == ["public.h"]
    codes = {(e["table_name"], e["payload"]["code"]) for e in _errors(spark, target)}
    assert codes == {("g", "TableDropped"), ("h", "TableDropped")}


def test_snapshot_progress_reports_each_table(spark, source):
    target = _target(spark, source, "progress")
    _sql(source, "CREATE TABLE w (id int, pad text)", "ALTER PUBLICATION pub ADD TABLE w")
    _sql(source, "INSERT INTO w SELECT g, repeat('x', 20) FROM generate_series(1, 20000) g")
    updates = []
    result = capture(spark, target, progress=updates.extend)
    tables = {u.table for u in updates}
    assert tables == {"public.t", "public.w"}
    final = {u.table: u for u in updates if u.done}
    assert {t: u.rows_staged for t, u in final.items()} == result.snapshotted
    estimate = final["public.w"].rows_estimated
    assert 10_000 <= estimate <= 40_000, estimate
    staged = [u.rows_staged for u in updates if u.table == "public.w" and not u.done]
    assert staged == sorted(staged)  # counts only grow


def test_copy_progress_monitor_sees_a_running_copy(db):
    tag = "feedfacecafe0001"
    seen = []
    monitor = CopyProgressMonitor(
        db, tag, {1: "public.slow"}, {1: 400}, seen.extend, server_version=180000
    )
    done = threading.Event()

    def slow_copy():
        info = dict(db, application_name=copy_application_name(tag, 1, 0))
        with psycopg.connect(**info) as conn, conn.cursor() as cur:
            query = "COPY (SELECT g, pg_sleep(0.005) FROM generate_series(1, 400) g) TO STDOUT"
            with cur.copy(query) as copy:
                for _ in copy:
                    pass
        done.set()

    thread = threading.Thread(target=slow_copy)
    thread.start()
    with psycopg.connect(**db, autocommit=True) as conn:
        # The first poll can catch the COPY before its first row (tuples_processed 0).
        while not done.is_set() and monitor.seen.get((1, 0), 0) == 0:
            monitor.poll(conn)
            time.sleep(0.05)
    thread.join()
    assert monitor.seen and 0 < monitor.seen[(1, 0)] <= 400
    monitor.report()
    assert seen[-1].table == "public.slow" and seen[-1].rows_staged == monitor.seen[(1, 0)]


def test_capture_cli_runs_doctor_first_and_reports_definite_errors(
    spark, source, tmp_path, monkeypatch, capsys
):
    from pgmedallion.cli import main

    monkeypatch.chdir(tmp_path)
    env = {
        "PGMEDALLION_SOURCE_NAME": "cli",
        "PGMEDALLION_SOURCE_HOST": source["host"],
        "PGMEDALLION_SOURCE_PORT": source["port"],
        "PGMEDALLION_SOURCE_DBNAME": source["dbname"],
        "PGMEDALLION_SOURCE_USER": source["user"],
        "PGMEDALLION_SOURCE_PUBLICATION": "missing_pub",
        "PGMEDALLION_SOURCE_SLOT": "s_" + source["dbname"],
        "PGMEDALLION_SOURCE_CREATE_PUBLICATION": "false",
        "PGMEDALLION_SOURCE_TABLES": "public.t",
        "PGMEDALLION_LAKEHOUSE_BRONZE_SCHEMA": "bronze_cli",
        "PGPASSWORD": source["password"],
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    spark.sql("DROP TABLE IF EXISTS bronze_cli.bronze")

    assert main(["capture"]) == 1
    err = capsys.readouterr().err
    assert "CREATE PUBLICATION" in err and "missing_pub" in err

    monkeypatch.setenv("PGMEDALLION_SOURCE_PUBLICATION", "pub")
    assert main(["capture", "--retries", "2"]) == 0
    assert "snapshot public.t: 200 rows" in capsys.readouterr().out

    _sql(source, f"SELECT pg_drop_replication_slot('s_{source['dbname']}')")
    # doctor: a missing slot is fine (capture creates it); capture refuses to, bronze has data.
    assert main(["capture"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("capture failed: SlotMissing: ")
    assert source["password"] not in "\n".join(err)


def test_pure_parts():
    assert status_interval(60) == 1.0 and status_interval(2) == 0.5 and status_interval(0) == 1.0
    policy = RetryPolicy(attempts=5, initial_delay_s=1, max_delay_s=5)
    assert [policy.delay_s(n) for n in range(1, 6)] == [1, 2, 4, 5, 5]
    name = copy_application_name("0123456789abcdef0123", 16384, 3)
    assert len(name) < 64
    assert parse_copy_application_name(name, "0123456789abcdef0123") == (16384, 3)
    assert parse_copy_application_name(name, "another run") is None
    assert parse_copy_application_name("psql", "x") is None
    analyzed = TableSize(1, reltuples=1000, relpages=10, blocks=20, row_width=8)
    assert estimate_rows(analyzed) == 2000
    fresh = TableSize(1, reltuples=-1, relpages=0, blocks=10, row_width=4)
    assert estimate_rows(fresh) == 10 * ((8192 - 24) // (32 + 4))
    assert estimate_rows(TableSize(1, -1, 0, 0, 4)) == 0
    progress = table_progress({1: "a.b", 2: "a.c"}, {1: 10}, {(1, 0): 3, (1, 1): 4, (9, 0): 1})
    assert [(p.table, p.rows_staged, p.rows_estimated) for p in progress] == [
        ("a.b", 7, 10),
        ("a.c", 0, None),
    ]
    assert table_progress({1: "a.b"}, {}, None)[0].rows_staged is None
    trace = (
        "PythonException: An exception was thrown from the Python worker.\n"
        "psycopg.errors.LockNotAvailable: could not obtain lock\n"
        "pgmedallion.capture.errors.SlotInUse: replication slot 's' is active\n"
    )
    error = capture_error_from_spark(RuntimeError(trace))
    assert isinstance(error, SlotInUse) and isinstance(error, TransientError)
    assert str(error) == "replication slot 's' is active"
    assert capture_error_from_spark(RuntimeError("pgmedallion.capture.errors.Nope: x")) is None
    dropped = capture_error_from_spark(RuntimeError("pgmedallion.capture.errors.TableDropped: t"))
    assert isinstance(dropped, TableDropped)
    assert len(ARROW_SCHEMA) == 14
