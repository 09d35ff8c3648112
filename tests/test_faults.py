"""Faults through the whole pipeline, each ending in its documented outcome.

Transient faults (README "Guarantees": connection refused, walsender terminated, server
restart) are retried and end recovered and exact. Definite ones end in an error for the tables
they concern, kept in silver's ``_errors``, while every other table stays exact: a table
dropped (``TableDropped``), retyped (``SchemaIncompatible``) or truncated (``TableTruncated``);
the slot or the publication gone (``SlotMissing``, ``PublicationDropped``: no table can go on,
the run fails and nothing is recreated behind the user's back).

The tests that stop or restart PostgreSQL use a server of their own, so the session server the
other tests share is never disturbed. The capture-level behaviour has its own tests
(``tests/test_capture_stream.py``); these go on through silver, gold and verify with the
type-rich workload of ``tests/workload.py``.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import replace

import psycopg
import pytest
from psycopg import sql
from pyspark.sql import functions as F

from pgmedallion.capture.errors import (
    PublicationDropped,
    SlotCompacted,
    SlotInvalidated,
    SlotMissing,
    TransientError,
)
from pgmedallion.capture.run import RetryPolicy, StreamLimits
from pgmedallion.core.config import TablePolicy
from pgmedallion.gold.build import run_gold
from pgmedallion.gold.quality import GoldQualityError
from pgmedallion.localpg import LocalPostgres
from pgmedallion.pipeline import ALL_TABLES, request_resync, run_capture, run_stages
from pgmedallion.verify import verify
from tests.conftest import STATE
from tests.workload import Workload, assert_exact, drop_schemas, make_config

PATIENT = RetryPolicy(attempts=12, initial_delay_s=0.3, max_delay_s=2.0)
QUICK = StreamLimits(
    commit_interval_s=0.5, idle_commit_interval_s=1.0, publication_check_interval_s=0.5
)
SMALL = ("public.events", "public.ledger")


@pytest.fixture(scope="module")
def own_pg():
    """A PostgreSQL 18 server of this module's own: these tests stop and restart it."""
    server = LocalPostgres(STATE / "pg18-faults").start()
    yield server
    server.stop()


@pytest.fixture
def own_db(own_pg, request):
    name = "f_" + "".join(c if c.isalnum() else "_" for c in request.node.name.lower())[:55]
    admin = own_pg.conninfo()
    with psycopg.connect(**admin, autocommit=True) as conn:
        for (slot,) in conn.execute(
            "SELECT slot_name FROM pg_replication_slots WHERE database = %s", (name,)
        ).fetchall():
            conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return own_pg.conninfo(dbname=name)


def landed(spark, conninfo: dict, seed: int, name: str, rows: int = 40):
    """The two small workload tables, created, and a first run of every stage over them."""
    wl = Workload(conninfo, seed, tables=SMALL, initial_rows=rows)
    wl.create()
    cfg = make_config(conninfo, name)
    drop_schemas(spark, cfg)
    run_stages(spark, cfg)
    return wl, cfg


def errors(spark, cfg) -> set[tuple]:
    rows = spark.table(cfg.qualified("silver", "_errors")).collect()
    return {(r["table_name"], r["code"]) for r in rows}


def recovered_in_place(spark, cfg, wl: Workload, lost: str) -> None:
    """``pgmedallion resync --all`` after the slot was lost: a new slot, every table snapshotted
    again under the same names, the gap recorded, and every table exact at the next runs."""
    request_resync(spark, cfg, [ALL_TABLES])
    run_stages(spark, cfg)
    wl.burst(transactions=5)
    run_stages(spark, cfg)
    assert_exact(verify(spark, cfg), wl.counts())
    gaps = spark.table(cfg.qualified("bronze", "bronze")).where(
        "kind = 'resync' AND table_oid IS NULL"
    )
    assert [lost in r["payload"].decode() for r in gaps.collect()] == [True]


def execute(conninfo: dict, *statements: str, params=None):
    with psycopg.connect(**conninfo, autocommit=True) as conn:
        out = None
        for s in statements:
            out = conn.execute(s, params)
        return out.fetchall() if out is not None and out.description else None


class Continuous:
    """A continuous capture in a thread (``stop()`` ends it cleanly and returns its result)."""

    def __init__(self, spark, cfg) -> None:
        self.stop_event = threading.Event()
        self.result = self.error = None

        def run() -> None:
            try:
                self.result = run_capture(
                    spark,
                    cfg,
                    continuous=True,
                    stop=self.stop_event,
                    handle_signals=False,
                    retry=PATIENT,
                    limits=QUICK,
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


def streaming_pid(conninfo: dict, slot: str) -> int | None:
    rows = execute(
        conninfo,
        "SELECT s.active_pid FROM pg_replication_slots s JOIN pg_stat_replication r"
        " ON r.pid = s.active_pid WHERE s.slot_name = %s AND r.state = 'streaming'",
        params=(slot,),
    )
    return rows[0][0] if rows else None


def wait_for(predicate, what: str, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def bronze_frontier(spark, cfg) -> int:
    bronze = spark.table(cfg.qualified("bronze", "bronze"))
    return bronze.where("kind = 'progress'").agg(F.max("lsn")).first()[0] or 0


def wait_landed(spark, cfg, conninfo: dict) -> None:
    """Until bronze's frontier passes the source's current WAL position."""
    ((lsn,),) = execute(conninfo, "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")
    wait_for(lambda: bronze_frontier(spark, cfg) > lsn, "the burst to land in bronze")


@pytest.mark.slow
def test_definite_errors_stay_with_their_tables(spark, db):
    """A dropped, a retyped and a truncated table each get their error; the rest stay exact.
    The dropped table leaves silver and gold."""
    wl = Workload(db, 31, initial_rows=60)
    wl.create()
    victims = ('public."LineItems"', "public.ledger", "public.events")
    cfg = make_config(
        db,
        "faultdef",
        # on_schema_change = "error": the retype stays an error of its table (by default the
        # table would be snapshotted again, see test_schema_changes)
        **{
            t.replace('"', ""): TablePolicy(on_error="quarantine", on_schema_change="error")
            for t in victims
        },
    )
    drop_schemas(spark, cfg)
    run_stages(spark, cfg)
    wl.burst(transactions=10)
    gold_before = {
        t: spark.table(cfg.qualified("gold", t)).count()
        for t in ("public_lineitems", "public_ledger", "public_events")
    }
    execute(
        db,
        'DROP TABLE "LineItems"',
        # a type modifier alone: numeric(12,2) -> numeric(14,2) changes the Spark type (another
        # type OID, e.g. float8, is the easy case, covered in test_silver_changes)
        "ALTER TABLE ledger ALTER COLUMN amount TYPE numeric(14,2)",
        "UPDATE ledger SET memo = 'after the retype' WHERE id IN (SELECT id FROM ledger LIMIT 3)",
        "TRUNCATE events",
        "INSERT INTO events VALUES (9, 9, 9, 'after the truncate', NULL, '{}')",
    )
    wl.tables = ("public.accounts",)  # from here on the workload writes accounts only
    wl.inserts = [wl._insert_account]
    for session in wl.sessions:
        for keys in (session.items, session.events, session.ledger):
            keys.clear()
    wl.burst(transactions=10)  # the untouched table keeps changing
    run_stages(spark, cfg)
    found = errors(spark, cfg)
    assert {
        ("LineItems", "TableDropped"),
        ("ledger", "SchemaIncompatible"),
        ("events", "TableTruncated"),
    } <= found, found
    assert {table for table, _ in found} == {"LineItems", "ledger", "events"}, found
    result = verify(spark, cfg)
    assert_exact(result, tables={"public.accounts"})
    checks = {t.table: t for t in result.tables}
    accounts = checks["public.accounts"]
    assert accounts.source_rows == wl.counts()["public.accounts"] == accounts.gold_rows
    # Quarantine: each victim's gold holds its state just before its first error; the dropped
    # table left silver and gold (its TableDropped record stays in _errors, above)
    for table in ("public.ledger", "public.events"):
        assert checks[table].gold_exact is True, result.report()
    assert "public.LineItems" not in checks
    gold = cfg.qualified("gold", "x").rsplit(".", 1)[0]
    assert "public_lineitems" not in {
        r["tableName"] for r in spark.sql(f"SHOW TABLES IN {gold}").collect()
    }
    del gold_before["public_lineitems"]
    gold_after = {t: spark.table(cfg.qualified("gold", t)).count() for t in gold_before}
    assert gold_after["public_events"] > 0  # not emptied by the truncate
    # Under the default policy (fail) the run names the table and does not update it.
    failing = replace(cfg, tables={})
    with pytest.raises(GoldQualityError, match="public.events"):
        run_gold(spark, failing)


@pytest.mark.slow
def test_walsender_terminated_and_server_restarted_mid_stream(spark, own_pg, own_db, caplog):
    caplog.set_level(logging.WARNING)
    wl, cfg = landed(spark, own_db, 32, "faultrestart", rows=80)
    capture = Continuous(spark, cfg)
    try:
        wait_for(lambda: streaming_pid(own_db, cfg.source.slot), "the stream to start")
        wl.burst(transactions=10)
        wait_landed(spark, cfg, own_db)
        execute(
            own_db,
            "SELECT pg_terminate_backend(%s)",
            params=(streaming_pid(own_db, cfg.source.slot),),
        )
        wl.burst(transactions=10, large_rows=2000)
        wait_landed(spark, cfg, own_db)
        own_pg.restart()
        wl.burst(transactions=10)
        wait_landed(spark, cfg, own_db)
    finally:
        result = capture.stop()
    assert result.retries >= 2
    run_stages(spark, cfg, retry=PATIENT)
    assert_exact(verify(spark, cfg), wl.counts())
    retries = [r.getMessage() for r in caplog.records if " retry " in r.getMessage()]
    assert len(retries) >= 2
    assert not any(own_db["password"] in r.getMessage() for r in caplog.records)


@pytest.mark.slow
def test_connection_refused_at_start_is_retried_then_exact(spark, own_pg, own_db, caplog):
    caplog.set_level(logging.WARNING)
    wl = Workload(own_db, 33, tables=SMALL, initial_rows=80)
    wl.create()
    cfg = make_config(own_db, "faultrefused")
    drop_schemas(spark, cfg)
    own_pg.stop()
    try:
        # Nobody listens: a transient error, retried, then given up without the password.
        with pytest.raises(TransientError) as failed:
            run_stages(spark, cfg, retry=RetryPolicy(attempts=2, initial_delay_s=0.1))
        assert own_db["password"] not in str(failed.value)
        done: dict = {}

        def run() -> None:
            try:
                done["result"] = run_stages(spark, cfg, retry=PATIENT)
            except BaseException as exc:
                done["error"] = exc

        thread = threading.Thread(target=run)
        thread.start()
        wait_for(
            lambda: sum(" retry " in r.getMessage() for r in caplog.records) >= 3,
            "the first refused attempts",
        )
    finally:
        own_pg.start()
    thread.join(timeout=600)
    assert "error" not in done, done.get("error")
    assert done["result"].capture.retries >= 1
    wl.burst(transactions=10)
    assert_exact(verify(spark, cfg), wl.counts())
    assert not any(own_db["password"] in r.getMessage() for r in caplog.records)


@pytest.mark.slow
def test_slot_dropped_while_running_is_definite_and_not_recreated(spark, own_db):
    wl, cfg = landed(spark, own_db, 34, "faultslot")
    assert_exact(verify(spark, cfg), wl.counts())
    capture = Continuous(spark, cfg)
    try:
        wait_for(lambda: streaming_pid(own_db, cfg.source.slot), "the stream to start")
        wl.burst(transactions=5)

        def dropped() -> bool:
            pid = streaming_pid(own_db, cfg.source.slot)
            try:
                if pid:
                    execute(own_db, "SELECT pg_terminate_backend(%s)", params=(pid,))
                execute(own_db, "SELECT pg_drop_replication_slot(%s)", params=(cfg.source.slot,))
                return True
            except psycopg.errors.ObjectInUse:
                return False  # the capture reconnected first: again

        wait_for(dropped, "the slot to be dropped")
        wait_for(lambda: not capture.thread.is_alive(), "capture to stop on the missing slot")
    finally:
        capture.stop_event.set()
    with pytest.raises(SlotMissing):
        capture.stop()
    with pytest.raises(SlotMissing, match="changes since are lost"):
        run_stages(spark, cfg)
    assert not execute(
        own_db, "SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", params=(cfg.source.slot,)
    )
    run_stages(spark, cfg, ("silver", "gold"))
    # A source-wide error is every table's: silver gives each table its own error row.
    assert {("events", "SlotMissing"), ("ledger", "SlotMissing")} <= errors(spark, cfg)
    recovered_in_place(spark, cfg, wl, "SlotMissing")


@pytest.mark.slow
def test_publication_dropped_is_definite(spark, own_db):
    wl, cfg = landed(spark, own_db, 35, "faultpub")
    wl.burst(transactions=5)
    execute(own_db, "DROP PUBLICATION pub")
    wl.burst(transactions=5)
    with pytest.raises(PublicationDropped):
        run_stages(spark, cfg)
    run_stages(spark, cfg, ("silver", "gold"))
    assert {("events", "PublicationDropped"), ("ledger", "PublicationDropped")} <= errors(
        spark, cfg
    )
    with pytest.raises(PublicationDropped):  # stays an error, recorded once
        run_stages(spark, cfg)
    run_stages(spark, cfg, ("silver", "gold"))
    rows = spark.table(cfg.qualified("silver", "_errors")).collect()
    dropped = [r["table_name"] for r in rows if r["code"] == "PublicationDropped"]
    assert sorted(dropped) == ["events", "ledger"]  # once per table


def slot_status(conninfo: dict, slot: str) -> str | None:
    rows = execute(
        conninfo, "SELECT wal_status FROM pg_replication_slots WHERE slot_name = %s", params=(slot,)
    )
    return rows[0][0] if rows else None


@pytest.mark.slow
def test_slot_invalidated_for_removed_wal_is_definite(spark, own_db):
    """``max_slot_wal_keep_size`` lets PostgreSQL remove WAL the slot still needs: the slot is
    invalidated (``wal_status = 'lost'``), and the changes it held are gone."""
    wl, cfg = landed(spark, own_db, 36, "faultlost")
    wl.burst(transactions=5)  # held by the slot, never read
    execute(own_db, "CREATE TABLE filler (x text)")  # not published
    try:
        execute(
            own_db, "ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'", "SELECT pg_reload_conf()"
        )

        def lost() -> bool:
            execute(
                own_db,
                "INSERT INTO filler SELECT repeat('x', 1000) FROM generate_series(1, 3000)",
                "SELECT pg_switch_wal()",
                "CHECKPOINT",
            )
            return slot_status(own_db, cfg.source.slot) == "lost"

        wait_for(lost, "the slot to be invalidated", timeout_s=120)
    finally:
        execute(own_db, "ALTER SYSTEM RESET max_slot_wal_keep_size", "SELECT pg_reload_conf()")
    with pytest.raises(SlotInvalidated, match="invalidated"):
        run_stages(spark, cfg)
    run_stages(spark, cfg, ("silver", "gold"))
    assert {("events", "SlotInvalidated"), ("ledger", "SlotInvalidated")} <= errors(spark, cfg)
    assert slot_status(own_db, cfg.source.slot) == "lost"  # kept for the user to inspect
    recovered_in_place(spark, cfg, wl, "SlotInvalidated")
    assert slot_status(own_db, cfg.source.slot) != "lost"  # a new slot in its place


@pytest.mark.slow
def test_slot_advanced_past_bronze_is_definite(spark, own_db):
    """Another client advances the slot beyond what bronze holds: the changes in between were
    never landed and can no longer be read (``SlotCompacted``)."""
    wl, cfg = landed(spark, own_db, 37, "faultadvance")
    wl.burst(transactions=5)
    execute(
        own_db,
        "SELECT pg_replication_slot_advance(%s, pg_current_wal_lsn())",
        params=(cfg.source.slot,),
    )
    with pytest.raises(SlotCompacted, match="past the resume point"):
        run_stages(spark, cfg)
    run_stages(spark, cfg, ("silver", "gold"))
    assert {("events", "SlotCompacted"), ("ledger", "SlotCompacted")} <= errors(spark, cfg)
    recovered_in_place(spark, cfg, wl, "SlotCompacted")
