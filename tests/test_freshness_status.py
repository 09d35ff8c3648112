"""Freshness you can see: each frontier carries the source's clock for it (``as of``), from
capture's progress records through silver's ``_progress`` to gold's ``_frontier``; ``status``
shows per table how long ago and how many WAL bytes ago that was, and ``<gold>._lag`` answers
the same in SQL. Against a real PostgreSQL and Spark: PostgreSQL's own clock is the oracle (a
change committed after ``clock_timestamp()`` read T is in gold only if gold is as of T or later).
"""

from __future__ import annotations

import io
import threading
from dataclasses import replace

import psycopg
from chispa import assert_df_equality

from pgmedallion.capture.pgoutput import parse_lsn
from pgmedallion.pipeline import run_stages
from pgmedallion.status import collect_status, format_status, status_report, watch
from tests.conftest import STATE
from tests.workload import drop_schemas, make_config


def _source_clock(conn) -> object:
    """PostgreSQL's clock now, as a naive UTC datetime (how the lakehouse holds timestamps)."""
    (now,) = conn.execute("SELECT clock_timestamp() AT TIME ZONE 'UTC'").fetchone()
    return now


def test_gold_frontiers_carry_the_source_clock_and_status_shows_the_lag(spark, db):
    with psycopg.connect(**db, autocommit=True) as conn:
        conn.execute("CREATE TABLE accounts (id int PRIMARY KEY, balance numeric)")
        conn.execute("CREATE TABLE notes (id int PRIMARY KEY, body text)")
        conn.execute("INSERT INTO accounts SELECT g, g FROM generate_series(1, 20) g")
        conn.execute("CREATE PUBLICATION pub FOR TABLE accounts, notes")
    cfg = make_config(db, "fresh")
    cfg = replace(cfg, lakehouse=replace(cfg.lakehouse, state_dir=str(STATE / "spark")))
    drop_schemas(spark, cfg)
    run_stages(spark, cfg)
    frontier = spark.table(cfg.qualified("gold", "_frontier"))
    first = {r["table_name"]: r["source_time"] for r in frontier.collect()}
    assert set(first) == {"accounts", "notes"} and all(first.values()), first

    with psycopg.connect(**db, autocommit=True) as conn:
        before = _source_clock(conn)
        conn.execute("UPDATE accounts SET balance = balance + 1 WHERE id <= 5")
        committed = _source_clock(conn)
    run_stages(spark, cfg)
    rows = spark.table(cfg.qualified("gold", "_frontier")).collect()
    for r in rows:
        # the update is in gold, so gold is as of its commit or later; no later than now
        assert before <= r["source_time"], (r, before)
        assert r["source_time"] >= first[r["table_name"]]
    with psycopg.connect(**db, autocommit=True) as conn:
        after = _source_clock(conn)
    assert all(r["source_time"] <= after for r in rows), (rows, after)
    assert committed <= after
    # silver's run recorded the same clock for its frontier
    (progress,) = (
        spark.table(cfg.qualified("silver", "_progress"))
        .orderBy("run", ascending=False)
        .limit(1)
        .collect()
    )
    assert {r["source_time"] for r in rows} == {progress["source_time"]}

    # the view for alerting: one row per gold table, its clock and lags
    lag = spark.table(cfg.qualified("gold", "_lag"))
    assert_df_equality(
        lag.select("table_name", "frontier", "as_of"),
        spark.table(cfg.qualified("gold", "_frontier")).selectExpr(
            "table_name", "frontier", "source_time AS as_of"
        ),
        ignore_row_order=True,
        ignore_nullable=True,
    )
    for r in lag.collect():
        assert r["lag_seconds"] >= 0 and r["applied_lag_seconds"] >= 0, r

    # status, read by delta-rs from the configured state directory (no Spark), and through
    # the running session's catalog: the same per-table clock and the WAL bytes behind
    report = collect_status(cfg, lambda: None)
    assert report.ok, format_status(report)
    by_name = {t.name: t for t in report.tables}
    assert set(by_name) == {"public.accounts", "public.notes"}
    for t in by_name.values():
        assert t.as_of == progress["source_time"] and t.frontier == progress["frontier"]
        assert report.wal is not None and report.wal >= t.frontier
    text, ok = status_report(spark, cfg)
    assert ok, text
    line = next(x for x in text.splitlines() if x.startswith("public.accounts"))
    assert progress["source_time"].strftime("%Y-%m-%d %H:%M:%S") in line, text
    assert "bronze frontier: " in text and ", as of " in text, text
    frontier_line = next(x for x in text.splitlines() if x.startswith("silver frontier"))
    assert parse_lsn(frontier_line.split()[2]) == progress["frontier"]

    # --watch: the report again, in frames, until stopped
    out = io.StringIO()
    assert watch(cfg, lambda: None, 0.05, threading.Event(), out, frames=3)
    assert out.getvalue().count("pgmedallion status, every 0.05 s") == 3
    assert out.getvalue().count("public.notes") == 3
