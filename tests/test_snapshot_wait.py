"""A snapshot waits for the transactions open on the server to end. The run names the backend
it waits on, gives up after ``[source] snapshot_wait_seconds``, leaves that table to the next
run and finishes the others; the next run snapshots it, exact."""

from __future__ import annotations

import logging
from dataclasses import replace

import psycopg

from pgmedallion.pipeline import run_stages
from pgmedallion.verify import verify
from tests.workload import assert_exact, drop_schemas, make_config


def _count(conn, table: str) -> int:
    return conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]


def test_a_snapshot_names_the_open_transaction_and_the_others_go_on(spark, db, caplog):
    with psycopg.connect(**db, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE a (id int PRIMARY KEY, v int);"
            "INSERT INTO a SELECT g, g FROM generate_series(1, 20) g;"
            "CREATE PUBLICATION pub FOR ALL TABLES;"
        )
    cfg = make_config(db, "sw")
    cfg = replace(cfg, source=replace(cfg.source, snapshot_wait_seconds=8))
    drop_schemas(spark, cfg)
    run_stages(spark, cfg)
    holder = psycopg.connect(**db, application_name="long report")
    try:
        holder.execute("INSERT INTO a VALUES (1000, 0)")  # holds a transaction id, open
        pid = holder.info.backend_pid
        with psycopg.connect(**db, autocommit=True) as conn:
            conn.execute("CREATE TABLE n (id int PRIMARY KEY, w text)")
            conn.execute("INSERT INTO n SELECT g, 'w' || g FROM generate_series(1, 5) g")
            conn.execute("UPDATE a SET v = -1 WHERE id = 1")
        with caplog.at_level(logging.WARNING, logger="pgmedallion"):
            result = run_stages(spark, cfg)
        said = caplog.text
        assert f"pid {pid} (xid " in said and "'long report'" in said, said
        assert "public.n" in said and "left to the next run" in said, said
        assert result.capture.deferred == ["public.n"]
        # the table already captured went on: its update is in gold
        gold_a = spark.table(cfg.qualified("gold", "public_a"))
        assert gold_a.where("id = 1").collect()[0]["v"] == -1
        assert "public_n" not in {
            r["tableName"]
            for r in spark.sql(
                f"SHOW TABLES IN {cfg.qualified('gold', 'x').rsplit('.', 1)[0]}"
            ).collect()
        }
    finally:
        holder.commit()
        holder.close()
    run_stages(spark, cfg)
    with psycopg.connect(**db) as conn:
        counts = {"public.a": _count(conn, "a"), "public.n": _count(conn, "n")}
    assert_exact(verify(spark, cfg), counts)
