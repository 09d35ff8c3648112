"""``pgmedallion run --continuous``: capture, silver and gold in one long-lived process.

Capture streams without pause in a thread of its own, committing a bronze batch every
``commit_interval_s`` while changes arrive; the main thread keeps one Spark session and applies
what bronze has committed to silver and gold as soon as its previous application ends::

    capture thread   stream ─ batch ─ batch ─ batch ─ batch ─ batch ─ ...   (bronze, acked)
    main thread      [silver, gold: what bronze held] [silver, gold] ...   (one JVM, warm)

Each application is a triggered silver run and gold run (``run_silver``, ``run_gold``), so
every guarantee of triggered runs holds unchanged: exactly once (idempotent commits, a planned
silver run redone after a crash), every gold table at a recorded frontier, readers never see a
half-applied batch (each table's gold commit is atomic). A micro-batch is whatever bronze
committed since the last one: it grows when an application takes longer, and nothing runs when
nothing arrived (bronze's newest Delta version, a directory listing where bronze is local).

Stopping. SIGINT or SIGTERM (or ``stop``) ends the capture after it commits and acknowledges
the batch in hand, lets the application under way finish, and applies what capture committed
last, so that gold is at capture's final frontier when the process exits. A second signal
aborts at once; like a kill, that loses nothing: the next run (continuous or not) resumes from
bronze's and silver's own records.

Errors. A definite error of silver or gold (a quality rule under ``fail``, ...) is reported once
and the pipeline goes on: the next batch brings the next attempt. A capture that gives up
(transient errors past its retries) or meets a definite error stops the pipeline after the
application under way; the process then exits 1. A dropped connection or a server restart is
a transient error: capture reconnects and resumes from bronze's frontier, while silver and gold
(which never connect to the source) go on.

Staying cheap. With nothing to capture, capture still commits the frontier keepalives moved
every ``IDLE_COMMIT_S`` (gold's ``as of`` time follows an idle source), and every
``UPKEEP_EVERY`` applications the tables that grew past their file budget are compacted
(``pgmedallion.maintain``), one table after each application until none is left: silver's
applied diffs consolidated, small files bin-packed, so an application costs what arrived
rather than what the pipeline has seen since it started.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pgmedallion.bronze.spark_table import bronze_dir
from pgmedallion.capture.options import StreamLimits, capture_needs_spark
from pgmedallion.capture.run import stop_on_signals
from pgmedallion.core import engine
from pgmedallion.core.config import Config
from pgmedallion.core.errors import PipelineError
from pgmedallion.gold.build import run_gold
from pgmedallion.gold.quality import GoldQualityError
from pgmedallion.maintain import maintain, touched
from pgmedallion.pipeline import ensure_schemas, open_lakehouse, run_capture
from pgmedallion.silver.build import run_silver

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

STOPPING = "stopping after the batch in hand is committed and applied"


@dataclass
class Application:
    """One application of bronze's new batches to silver and gold."""

    bronze_version: int
    """Bronze's newest Delta version seen before it started."""
    silver_run: int | None
    frontier: int | None
    seconds: float
    error: str | None = None


@dataclass
class ContinuousResult:
    applications: list[Application] = field(default_factory=list)
    capture: Any = None
    """Capture's ``CaptureResult`` once it stopped (None if it failed)."""
    capture_error: BaseException | None = None
    errors: int = 0
    """Applications that ended in a pipeline error (reported, not fatal)."""

    @property
    def frontier(self) -> int | None:
        done = [a for a in self.applications if a.frontier is not None]
        return done[-1].frontier if done else None


class _Capture(threading.Thread):
    """Capture in a thread of its own, until ``stop`` is set; keeps its result or error."""

    def __init__(self, spark: SparkSession | None, cfg: Config, stop: threading.Event, **options):
        super().__init__(name="capture", daemon=True)
        self.spark, self.cfg, self.stop, self.options = spark, cfg, stop, options
        self.result: Any = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.result = run_capture(
                self.spark,
                self.cfg,
                continuous=True,
                stop=self.stop,
                handle_signals=False,
                **self.options,
            )
        except BaseException as exc:  # reported by the main thread
            self.error = exc
        finally:
            self.stop.set()


def bronze_version(spark: SparkSession, cfg: Config, path: str | None) -> int:
    """Bronze's newest Delta version (every capture commit makes one): where bronze is the
    local directory ``path``, the newest commit file's number (a directory listing, no table
    read), else Spark's table history."""
    log_dir = Path(path) / "_delta_log" if path else None
    if log_dir is not None and log_dir.is_dir():
        with os.scandir(log_dir) as entries:
            versions = [
                int(e.name[:-5])
                for e in entries
                if e.name.endswith(".json") and e.name[:-5].isdigit()
            ]
        return max(versions, default=-1)
    table = cfg.qualified("bronze", "bronze")
    return int(spark.sql(f"DESCRIBE HISTORY {table} LIMIT 1").first()["version"])


def _own_session(spark: SparkSession) -> SparkSession:
    """A session of its own for capture's Spark commits: gold sets session settings (its
    commits' metadata and idempotency record) that must not reach bronze's commits."""
    try:
        return spark.newSession()
    except Exception:  # Spark Connect has no newSession; its writes carry their own options
        return spark


def _bronze_here(found: str | None, cfg: Config) -> bool:
    """Whether the session's bronze (at ``found``) is the directory a capture without Spark
    writes (not so when a session started elsewhere is active: then capture commits through
    it)."""
    expected = cfg.local_table_path("bronze", "bronze")
    if found is None or expected is None or not Path(expected).is_dir():
        return False
    return os.path.samefile(found, expected)


def run_continuous(
    cfg: Config,
    *,
    stop: threading.Event | None = None,
    commit_interval_s: float = 1.0,
    poll_s: float = 0.25,
    on_applied: Callable[[Application], None] | None = None,
    **capture_options,
) -> ContinuousResult:
    """Capture, silver and gold in this process until ``stop`` is set or a signal arrives.

    ``commit_interval_s``: how often capture commits what arrived (bronze batches, the unit of
    freshness); ``poll_s``: how often an idle pipeline looks for a new batch. ``on_applied``
    sees every application as it ends (the CLI prints it). ``capture_options``: more
    :class:`pgmedallion.capture.options.CaptureOptions` fields (``progress``, ``retry``)."""
    engine.use(cfg.lakehouse)
    stop = stop or threading.Event()
    result = ContinuousResult()
    limits = capture_options.pop("limits", None)
    if limits is None:  # an idle source's frontier (and gold's as-of time) moves every 15 s
        limits = StreamLimits(idle_commit_interval_s=IDLE_COMMIT_S)
    limits = replace(limits, commit_interval_s=commit_interval_s)
    # Spark first: a SparkContext started in the main thread installs its own SIGINT handler
    # (cancel the jobs, raise KeyboardInterrupt), which must be the one a second signal finds
    spark = open_lakehouse(cfg)
    with stop_on_signals(stop, STOPPING):
        ensure_schemas(spark, cfg)
        bronze_path = bronze_dir(spark, cfg)
        through_spark = capture_needs_spark(cfg) or not _bronze_here(bronze_path, cfg)
        capture = _Capture(
            _own_session(spark) if through_spark else None,
            cfg,
            stop,
            limits=limits,
            **capture_options,
        )
        capture.start()
        try:
            _apply_until_stopped(spark, cfg, capture, bronze_path, poll_s, on_applied, result)
        finally:  # an unexpected error, or a second signal: capture commits what it holds
            stop.set()
            capture.join()
    result.capture, result.capture_error = capture.result, capture.error
    return result


def _apply_until_stopped(
    spark: SparkSession,
    cfg: Config,
    capture: _Capture,
    bronze_dir: str | None,
    poll_s: float,
    on_applied: Callable[[Application], None] | None,
    result: ContinuousResult,
) -> None:
    """Apply bronze's new batches as they land, until capture has stopped and all it committed
    is applied."""
    applied: int | None = None
    first = True
    since_upkeep, grown, compacted = 0, set(), set()
    while True:
        capture_done = not capture.is_alive()
        version = bronze_version(spark, cfg, bronze_dir)
        if first or version != applied:
            first = False
            start = time.monotonic()
            app = Application(version, None, None, 0.0)
            try:
                run_silver(spark, cfg)
                gold = run_gold(spark, cfg)
                grown |= touched(gold)
                app.silver_run, app.frontier = gold.silver_run, gold.frontier
                applied = version
            except GoldQualityError as exc:
                grown |= touched(exc.result)
                app.silver_run, app.frontier = exc.result.silver_run, exc.result.frontier
                app.error = str(exc)
                applied = version
            except PipelineError as exc:
                app.error = str(exc)
                applied = version  # the next batch brings the next attempt
            app.seconds = time.monotonic() - start
            if app.error is not None:
                result.errors += 1
                log.error("continuous: %s", app.error)
            result.applications.append(app)
            if on_applied is not None:
                on_applied(app)
            since_upkeep += 1
            if since_upkeep >= UPKEEP_EVERY and not _upkeep(spark, cfg, grown, compacted):
                since_upkeep, grown, compacted = 0, set(), set()  # the round is over
            continue  # look again at once: more may have landed meanwhile
        if capture_done:
            break  # capture stopped and everything it committed is applied
        capture.join(poll_s)


IDLE_COMMIT_S = 15.0
"""With nothing to capture, capture commits the frontier keepalives moved this often: gold's
``as of`` time then trails an idle source by about this plus an application."""

UPKEEP_EVERY = 20
"""Applications between two rounds of upkeep (``pgmedallion.maintain``)."""

UPKEEP_PER_APPLICATION = 1
"""Compactions after one application: a round of upkeep is spread over as many applications
as it has tables to compact (all at once took about 20 s, an application's p95 twice over)."""


def _upkeep(
    spark: SparkSession, cfg: Config, tables: set[int], compacted: set[tuple[str, str]]
) -> bool:
    """One step of a round of upkeep: at most :data:`UPKEEP_PER_APPLICATION` compactions among
    ``tables`` (the ones applications changed since the last round) and the layers' own tables
    (``pgmedallion.maintain``), each table once per round (``compacted``). Whether it
    compacted any (then the round goes on after the next application). A failed compaction is
    reported and the round goes on with the other tables (the failed one is in ``compacted``:
    not tried again this round); the pipeline goes on (the table is as it was: each compaction
    is one commit). Ending the round there left the silver tables after it uncompacted round
    after round, until their earlier rows were too many for the batched path."""
    tried = len(compacted)
    try:
        step = maintain(
            spark, cfg, tables=tables, limit=UPKEEP_PER_APPLICATION, compacted=compacted
        )
        return bool(step)
    except Exception as exc:
        log.warning("continuous: a compaction failed, the pipeline goes on: %s", exc)
        return len(compacted) > tried  # a failure before any table was tried ends the round
