"""Planning: which window of bronze a silver run reads, written down before anything else.

A run ``R`` reads the frontier window ``[F_prev, F)`` (``F``: bronze's committed frontier) and
the batch window ``(b_prev, b]`` (``b``: bronze's last batch). The plan goes to ``_plans``
first, and a rerun after a crash redoes the planned run with the same windows, which read the
same immutable bronze rows. The batch window's control records (``schema``, ``rewind``,
``error``, and one ``copy`` row per table with COPY records) are read here in one pass.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from pgmedallion.bronze.engines import DeltaRsBronze, delta_rs_unusable
from pgmedallion.bronze.spark_table import SparkBronze, bronze_dir
from pgmedallion.bronze.store import Bronze
from pgmedallion.core import delta_rs
from pgmedallion.core.config import Config
from pgmedallion.core.errors import PipelineError
from pgmedallion.core.parallel import side_by_side
from pgmedallion.silver.contract import Names
from pgmedallion.silver.errors import ErrorRecord
from pgmedallion.silver.write import append

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Plan:
    """One run's windows: wal ``lsn in [f_from, f_to)``, bronze batches ``(b_from, b_to]``."""

    run: int
    f_from: int
    f_to: int
    b_from: int
    b_to: int
    redo: bool = False
    """The run planned before a crash, done again: bronze may hold more after its window."""
    source_time: datetime | None = None
    """The source's clock for ``f_to`` (bronze's progress record; None where unknown)."""


def plan_run(spark: SparkSession, cfg: Config) -> Plan | None:
    """The next run's plan (the planned one again after a crash), or None when nothing is new.
    A new plan is not written yet: :func:`write_plan` writes it before the run writes
    anything else."""
    n, source = Names(cfg), cfg.source.name
    bronze = session_bronze(spark, cfg, n, fresh=True)  # (read when first asked)
    # silver's last run, its newest plan and bronze's end side by side where each is a Spark
    # job (silver's own tables: only this run writes them; the end is not used when a planned
    # run is redone). A plan newer than the last completed run is the one a crash interrupted.
    last, planned, end = side_by_side(
        lambda: delta_rs.bookkeeping_latest(
            spark, n.schema, "_progress", _PROGRESS, {"source": source}, by="run"
        ),
        lambda: delta_rs.bookkeeping_latest(
            spark, n.schema, "_plans", _PLANNED, {"source": source}, by="run"
        ),
        bronze.window_end,
        threads=delta_rs.bookkeeping_through_spark(spark, n.schema),
    )
    last_run, f_prev, b_prev = (
        (last["run"], last["frontier"], last["bronze_batch"]) if last else (-1, 0, -1)
    )
    run = last_run + 1
    if planned is not None and planned["run"] == run:
        log.info("silver run %d: redoing the planned run", run)
        return Plan(
            run,
            planned["frontier_from"],
            planned["frontier"],
            planned["batch_from"],
            planned["batch_to"],
            redo=True,
            source_time=planned["source_time"],
        )
    # one read for both ends (``end``): a capture committing meanwhile (``run --continuous``)
    # must not give a batch window that ends past the batch holding the frontier read
    frontier = f_prev if end.frontier is None else max(end.frontier, f_prev)
    batch = b_prev if end.batch is None else max(end.batch, b_prev)
    if frontier == f_prev and batch == b_prev:
        return None
    at = end.source_time if end.frontier == frontier else None
    return Plan(run, f_prev, frontier, b_prev, batch, source_time=at)


_PROGRESS = ["run", "frontier", "bronze_batch"]
_PLANNED = ["run", "frontier_from", "frontier", "batch_from", "batch_to", "source_time"]


def write_plan(spark: SparkSession, cfg: Config, plan: Plan) -> None:
    """``plan``'s row in ``_plans`` (a redone plan has it already): before the run writes
    anything else, so that a crash after any of its writes redoes the same windows."""
    if plan.redo:
        return
    ddl = (
        "source string, run long, frontier_from long, frontier long, batch_from long, "
        "batch_to long, source_time timestamp"
    )
    source = cfg.source.name
    rows = [(source, plan.run, plan.f_from, plan.f_to, plan.b_from, plan.b_to, plan.source_time)]
    append(spark, Names(cfg), "_plans", rows, ddl, source, plan.run, stamp="planned_at")


def session_bronze(spark: SparkSession, cfg: Config, n: Names, *, fresh: bool = False) -> Bronze:
    """Bronze as the session's catalog has it: read by delta-rs where it is a local directory
    (its control records in milliseconds; one reader per process, so each data file is read
    once however many runs a long-lived process makes), else through Spark.

    Through Spark, a read of the control records is a job (1-2 s in a cold process), and a run
    asks three questions of them (its window's end, its control records, the catalogs it
    follows): the records read first after the run's plan asked ``fresh`` answer the run's
    later questions about its window, which they hold. A question whose answer must be
    current (a resync request: its batch id, what capture did meanwhile) asks ``fresh``."""
    path = bronze_dir(spark, cfg)
    if delta_rs.usable(path) and delta_rs_unusable(path) is None:
        key = (path, n.bronze, cfg.source.name)
        if key in _READERS:
            return _READERS[key].reopen()
        _READERS[key] = DeltaRsBronze(path, n.bronze, cfg.source.name)
        return _READERS[key]
    key = (delta_rs.application(spark), n.bronze, cfg.source.name)
    reader = _SPARK_READERS.get(key)
    if reader is None:
        reader = _SPARK_READERS[key] = SparkBronze(spark, n.bronze, cfg.source.name)
    elif fresh:
        reader.refresh()
    return reader


_READERS: dict[tuple[str, str, str], DeltaRsBronze] = {}
_SPARK_READERS: dict[tuple[str, str, str], SparkBronze] = {}


def last_frontier(spark: SparkSession, n: Names, source: str) -> int:
    """The frontier of the source's last completed run (0: none yet)."""
    last = delta_rs.bookkeeping_max(spark, n.schema, "_progress", "frontier", {"source": source})
    return int(last or 0)


def control_errors(control: list[dict], oids: list[int]) -> list[ErrorRecord]:
    """Bronze's error records, each for its table (or, for none, every table in ``oids``)."""
    errors = []
    for r in control:
        if r["kind"] != "error":
            continue
        e = json.loads(r["payload"]) if r["payload"] else {}
        targets = [r["table_oid"]] if r["table_oid"] is not None else oids
        code = e.get("code", PipelineError.__name__)
        for oid in targets:
            # the payload's "lsn" is the same position, as text
            errors.append(ErrorRecord(oid, r["lsn"], code, e.get("message", "")))
    return errors
