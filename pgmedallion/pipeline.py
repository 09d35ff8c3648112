"""One pipeline run: capture -> bronze, bronze -> silver, silver -> gold, in that order.

Each stage is an idempotent Spark job over Delta tables and can run on its own (the Databricks
job runs them as three tasks); ``run_stages`` runs a selection in order. A stage that raises
stops the ones after it; what it committed stays committed and the next run goes on from there.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from pgmedallion.config import Config

log = logging.getLogger(__name__)

STAGES = ("capture", "silver", "gold")


@dataclass
class RunResult:
    capture: Any = None
    silver: Any = None
    gold: Any = None
    stages: list[str] = field(default_factory=list)


def capture_target(cfg: Config):
    from bronze.land import CaptureTarget

    return CaptureTarget(
        cfg.source.conninfo(),
        source=cfg.source.name,
        publication=cfg.source.publication,
        slot=cfg.source.slot,
        bronze=cfg.qualified("bronze", "bronze"),
    )


def ensure_schemas(spark: SparkSession, cfg: Config) -> None:
    for layer in ("bronze", "silver", "gold"):
        schema = getattr(cfg.lakehouse, f"{layer}_schema")
        parts = [p for p in (cfg.lakehouse.catalog, schema) if p]
        spark.sql(
            "CREATE SCHEMA IF NOT EXISTS "
            + ".".join("`" + p.replace("`", "``") + "`" for p in parts)
        )


def run_capture(spark: SparkSession, cfg: Config, *, continuous: bool = False, **kwargs):
    from bronze.land import capture_once

    tables = list(cfg.source.tables) or None
    if continuous:
        kwargs["continuous"] = True
    return capture_once(spark, capture_target(cfg), tables=tables, **kwargs)


def run_stages(
    spark: SparkSession,
    cfg: Config,
    stages: tuple[str, ...] = STAGES,
    *,
    show: Callable[[str], AbstractContextManager] | None = None,
    **capture_kwargs,
) -> RunResult:
    """Run ``stages`` in order; ``show(stage)``: a context around each stage (a progress
    display)."""
    ensure_schemas(spark, cfg)
    result = RunResult()
    for stage in STAGES:
        if stage not in stages:
            continue
        with show(stage) if show is not None else nullcontext():
            if stage == "capture":
                result.capture = run_capture(spark, cfg, **capture_kwargs)
            elif stage == "silver":
                from silver.build import run_silver

                result.silver = run_silver(spark, cfg)
            else:
                from gold.build import run_gold

                result.gold = run_gold(spark, cfg)
        result.stages.append(stage)
    return result


def stage_spinner(console=None) -> Callable[[str], AbstractContextManager]:
    """A ``show`` for :func:`run_stages`: a spinner with the stage and its elapsed time on
    stderr (a terminal only), and one line per finished stage."""
    import time
    from contextlib import contextmanager

    from rich.console import Console

    console = console or Console(stderr=True)

    @contextmanager
    def show(stage: str):
        start = time.monotonic()
        with console.status(f"{stage}…", spinner="dots"):
            yield
        console.print(f"[dim]{stage}: {time.monotonic() - start:.1f} s[/dim]")

    return show


def silver_state(spark: SparkSession, cfg: Config, silver_table: str, before_lsn: int | None):
    """The table as silver holds it just before ``before_lsn`` (None: everything), one row per
    copy, with the source's columns: the multiset sum of the diffs, negative sums kept out."""
    diffs = spark.table(cfg.qualified("silver", silver_table))
    if before_lsn is not None:
        diffs = diffs.where(F.col("_lsn") < before_lsn)
    data = [c for c in diffs.columns if c not in ("_lsn", "_diff", "_run")]
    cols = [F.col("`" + c.replace("`", "``") + "`") for c in data]
    summed = diffs.groupBy(*cols).agg(F.sum("_diff").alias("_n")).where(F.col("_n") > 0)
    return summed.withColumn("_i", F.explode(F.sequence(F.lit(1), F.col("_n")))).select(*cols)


class NotCaptured(ValueError):
    """``resync`` named a table this source does not capture."""


def request_resync(spark: SparkSession, cfg: Config, names: list[str]) -> list[str]:
    """Ask the next capture to snapshot ``names`` (``schema.table``, or a table name that is
    unique among the captured tables) again; their silver and gold tables are rebuilt from that
    snapshot on, and no other table is touched. Returns the qualified names. Raises
    :class:`NotCaptured`, having written nothing, when a name is not a captured table."""
    from bronze.table import bronze_state, ensure_bronze_table
    from bronze.table import request_resync as request

    ensure_schemas(spark, cfg)
    bronze = cfg.qualified("bronze", "bronze")
    ensure_bronze_table(spark, bronze)
    state = bronze_state(spark, bronze, cfg.source.name)
    captured = {f"{schema}.{name}": oid for oid, (_, schema, name) in state.snapshots.items()}
    by_name: dict[str, list[str]] = {}
    for qualified in captured:
        by_name.setdefault(qualified.split(".", 1)[1], []).append(qualified)
    chosen, unknown = [], []
    for name in names:
        if name in captured:
            chosen.append(name)
        elif len(by_name.get(name, [])) == 1:
            chosen.append(by_name[name][0])
        else:
            unknown.append(name)
    if unknown:
        known = ", ".join(sorted(captured)) or "none yet"
        raise NotCaptured(
            f"not captured by source {cfg.source.name!r}: {', '.join(unknown)} "
            f"(captured tables: {known})"
        )
    chosen = sorted(set(chosen))
    records = [(captured[q], *q.split(".", 1)) for q in chosen]
    request(spark, bronze, cfg.source.name, records, state.frontier or 0)
    log.info("resync requested for %s", ", ".join(chosen))
    return chosen
