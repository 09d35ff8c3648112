"""What the tests of migrations followed in place share: SQL at the source, the count of
snapshots bronze holds, gold compared with the source row by row (chispa), and a migration
made while a continuous capture streams."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

import psycopg
from chispa import assert_df_equality

from pgmedallion.pipeline import run_stages


def sql(conninfo, *statements: str) -> None:
    """Each statement in its own transaction (autocommit)."""
    with psycopg.connect(**conninfo, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)


def snapshots(spark, cfg) -> int:
    """How many snapshots bronze holds (batches with copy rows)."""
    bronze = spark.table(cfg.qualified("bronze", "bronze"))
    return bronze.where("kind = 'copy'").select("batch_id").distinct().count()


def gold_matches_source(spark, cfg, conninfo, table: str, columns: Sequence[str]) -> None:
    """Gold's ``public_<table>`` equals ``public.<table>`` at the source on ``columns``."""
    gold = spark.table(cfg.qualified("gold", f"public_{table}")).select(*columns)
    with psycopg.connect(**conninfo) as conn:
        rows = conn.execute(f"SELECT {', '.join(columns)} FROM {table}").fetchall()
    assert_df_equality(
        gold,
        spark.createDataFrame(rows, gold.schema),
        ignore_row_order=True,
        ignore_nullable=True,
    )


def migrate_while_streaming(spark, cfg, caplog, migrate: Callable[[], None]) -> None:
    """``migrate`` once a continuous capture streams, after its look at the catalog: the
    stream must stop before the Relation that shows the migration (capture looks at the
    catalog again) and a next session must start; then capture is stopped."""
    stop = threading.Event()
    failures: list[BaseException] = []

    def capture() -> None:
        try:
            run_stages(spark, cfg, ("capture",), continuous=True, stop=stop, handle_signals=False)
        except BaseException as exc:  # reported below
            failures.append(exc)

    def seen(text: str) -> int:
        return sum(text in r.getMessage() for r in caplog.records)

    thread = threading.Thread(target=capture, name="capture")
    with caplog.at_level(logging.INFO, logger="pgmedallion"):
        thread.start()
        try:
            deadline = time.monotonic() + 120
            while not seen("streaming slot"):
                assert time.monotonic() < deadline and not failures, failures
                time.sleep(0.2)
            migrate()
            while seen("as capture last compared") < 1 or seen("streaming slot") < 2:
                assert time.monotonic() < deadline and not failures, failures
                time.sleep(0.2)
            time.sleep(3)  # the next session lands the rows
        finally:
            stop.set()
            thread.join(timeout=120)
    assert not failures, failures
