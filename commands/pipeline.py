"""One pipeline run: capture -> bronze, bronze -> silver, silver -> gold, then the marts (when
the configuration names a marts folder), in that order.

Each stage is an idempotent Spark job over Delta tables and can run on its own (the Databricks
job runs them as three tasks); ``run_stages`` runs a selection in order. A stage that raises
stops the ones after it; what it committed stays committed and the next run goes on from there.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pgmedallion.core import engine
from pgmedallion.core.config import Config, on_databricks
from pgmedallion.core.errors import PipelineError
from pgmedallion.core.naming import qualified, quote

if TYPE_CHECKING:  # `run --stage capture` runs where PySpark is not installed
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

STAGES = ("capture", "silver", "gold", "marts")


@dataclass
class RunResult:
    capture: Any = None
    silver: Any = None
    gold: Any = None
    marts: Any = None
    """The marts' ``marts.runner.PipelineRun`` (its ``quality``: the expectation results)."""
    stages: list[str] = field(default_factory=list)
    resynced: list[str] = field(default_factory=list)
    """The tables a ``resync`` asked to snapshot again (``run``)."""
    current: bool = False
    """Capture landed nothing and silver and gold held everything before: they did not run
    (``pgmedallion.current``; where the tables are local, no Spark was started)."""


def ensure_schemas(spark: SparkSession, cfg: Config) -> None:
    """The layers' schemas, and bronze in the catalog (a capture without Spark creates it
    where the catalog would, and this registers it)."""
    from pgmedallion.bronze.spark_table import ensure_bronze_table

    for layer in ("bronze", "silver", "gold"):
        schema = getattr(cfg.lakehouse, f"{layer}_schema")
        parts = [p for p in (cfg.lakehouse.catalog, schema) if p]
        spark.sql("CREATE SCHEMA IF NOT EXISTS " + qualified(parts))
    ensure_bronze_table(
        spark, cfg.qualified("bronze", "bronze"), cfg.local_table_path("bronze", "bronze")
    )
    register_created(spark, cfg)


def unregistered_tables(cfg: Config) -> bool:
    """Whether a run made tables before Spark started that the catalog does not know yet."""
    from pgmedallion.core import delta_rs

    for layer in ("silver", "gold"):
        path = cfg.local_table_path(layer, "x")
        if path is not None and delta_rs.waiting_for_catalog(str(Path(path).parent)):
            return True
    return False


def register_created(spark: SparkSession, cfg: Config) -> None:
    """Silver's and gold's tables that a run made before Spark started (delta-rs, where the
    catalog keeps its managed tables: ``core.delta_rs.create_unregistered``) put in the
    catalog, and gold's ``_lag`` view over ``_frontier`` made, as a run with Spark would
    have."""
    from pgmedallion.core import delta_rs
    from pgmedallion.gold.reports import ensure_lag_view

    for layer in ("silver", "gold"):
        made = delta_rs.register_created(
            spark, cfg.schema(layer), lambda name, layer=layer: cfg.qualified(layer, name)
        )
        if layer == "gold" and made:
            ensure_lag_view(spark, cfg, delta_rs.table_names(spark, cfg.schema("gold")))


def open_lakehouse(cfg: Config) -> SparkSession:
    """The session for commands that read the lakehouse (status, sql, verify): a bronze table
    that a capture without Spark created is put in the catalog first."""
    from pgmedallion.core.spark import get_spark

    spark = get_spark(cfg.state_dir)
    path = cfg.local_table_path("bronze", "bronze")
    if path is not None and (Path(path) / "_delta_log").is_dir():
        ensure_schemas(spark, cfg)
    return spark


def run_capture(spark: SparkSession | None, cfg: Config, *, continuous: bool = False, **kwargs):
    """Capture into bronze; ``spark`` None: without Spark (see :func:`capture_needs_spark`).
    ``kwargs``: the other fields of :class:`pgmedallion.capture.options.CaptureOptions`."""
    from pgmedallion.capture.run import CaptureOptions, bronze_of, capture_once, capture_target

    target = capture_target(cfg)
    options = CaptureOptions(
        tables=list(cfg.source.tables) or None, continuous=continuous, **kwargs
    )
    return capture_once(bronze_of(spark, target), target, options)


class SparkStarter:
    """The local Spark session, started in a background thread: a run's capture does not need
    it (bronze is written by delta-rs), so silver finds it ready instead of waiting for the
    JVM after capture. Calling it waits for the session (and raises what starting raised)."""

    def __init__(self, state_dir, background: bool = True) -> None:
        from concurrent.futures import Future, ThreadPoolExecutor

        from pgmedallion.core.spark import get_spark

        self._state_dir = state_dir
        self.background = background
        self._session: Future | None = None
        if background:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="spark-start")
            self._session = self._pool.submit(get_spark, state_dir)
            self._pool.shutdown(wait=False)
        self._get_spark = get_spark

    def __call__(self) -> SparkSession:
        if self._session is None:
            return self._get_spark(self._state_dir)
        return self._session.result()


def _needs_spark(cfg: Config, resync: Sequence[str]) -> bool:
    """Whether a run will surely start Spark (so it starts while capture runs): a resync
    (tables rebuilt), a lakehouse that is not local, ``engine = "spark"``. Otherwise the run
    may do without it (:class:`pgmedallion.core.session.LazySession`), a first run too:
    delta-rs creates the tables, and the catalog learns of them when Spark next starts
    (:func:`register_created`)."""
    local = cfg.local_table_path("silver", "_progress") is not None and not engine.spark_only()
    return bool(resync) or not local


def _lazy(cfg: Config, start: Callable[[], SparkSession]):
    """A :class:`~pgmedallion.core.session.LazySession` of ``start`` for a local lakehouse."""
    from pgmedallion.core.session import LazySession

    if engine.spark_only() or cfg.local_table_path("silver", "x") is None:
        return None
    schemas = {
        cfg.schema(layer): str(Path(cfg.local_table_path(layer, "x")).parent)
        for layer in ("bronze", "silver", "gold")
    }
    return LazySession(start, schemas)


def run(
    cfg: Config,
    stages: tuple[str, ...] = STAGES,
    *,
    resync: Sequence[str] = (),
    show: Callable[[str], AbstractContextManager] | None = None,
    **capture_kwargs,
) -> RunResult:
    """A run as ``pgmedallion run`` makes it: the session, the resync requests, then the
    stages in order (:func:`run_stages`).

    The session: none for a capture that writes bronze with delta-rs (a local one); started in
    the background meanwhile when a later stage surely needs it (a first run, a resync:
    :class:`SparkStarter`), else only when silver or gold asks for it (they take their paths
    without Spark where they can: :class:`pgmedallion.core.session.LazySession`); none for the
    marts alone (they run in a JVM of their own); else the lakehouse's, first. ``resync``:
    tables to snapshot again (:func:`request_resync`, before capture; raises
    :class:`NotCaptured`, having changed nothing, for a table not captured)."""
    from pgmedallion.capture.run import capture_needs_spark
    from pgmedallion.current import bronze_batch, lakehouse_current

    if resync and "capture" not in stages:
        raise NotCaptured("--resync needs the capture stage")
    engine.use(cfg.lakehouse)
    spark: SparkSession | None = None
    later: Callable[[], SparkSession] | None = None
    quiet = False
    if "capture" in stages and not capture_needs_spark(cfg):
        # Silver and gold current before capture: Spark waits to see whether capture lands
        # anything (a run with nothing new then starts no JVM at all).
        before = bronze_batch(cfg)
        quiet = not resync and stages != ("capture",) and lakehouse_current(cfg, before)
        if stages != ("capture",) and not quiet:
            later = SparkStarter(cfg.state_dir, background=_needs_spark(cfg, resync))
    elif stages != ("marts",):
        spark = open_lakehouse(cfg)
        # Spark reads and writes every table: the same question, through Spark, once capture
        # shows it landed nothing (asked before, it would cost every run its reads).
        quiet = not resync and "capture" in stages and stages != ("capture",)
    resynced = request_resync(spark, cfg, list(resync)) if resync else []
    session = spark or later or (lambda: open_lakehouse(cfg))
    if quiet:
        result = run_stages(session, cfg, ("capture",), show=show, **capture_kwargs)
        if spark is None:
            current = bronze_batch(cfg) == before
        else:
            landed = result.capture.batches or result.capture.snapshotted
            current = not landed and lakehouse_current(
                cfg, spark=spark, bronze=result.capture.bronze
            )
        if current:
            log.info("nothing new since the last run: silver and gold are current")
            result.current = True
            return result
        rest = tuple(s for s in stages if s != "capture")
        more = run_stages(session, cfg, rest, show=show, recapture=True, **capture_kwargs)
        if more.capture is not None:
            result.capture = result.capture.then(more.capture)
        result.silver, result.gold, result.marts = more.silver, more.gold, more.marts
        result.stages += more.stages
        return result
    result = run_stages(session, cfg, stages, show=show, **capture_kwargs)
    result.resynced = resynced
    return result


def run_stages(
    spark: SparkSession | Callable[[], SparkSession],
    cfg: Config,
    stages: tuple[str, ...] = STAGES,
    *,
    show: Callable[[str], AbstractContextManager] | None = None,
    recapture: bool | None = None,
    **capture_kwargs,
) -> RunResult:
    """Run ``stages`` in order; ``show(stage)``: a context around each stage (a progress
    display). ``spark``: the session, or a callable returning it (a :class:`SparkStarter`):
    then capture runs without Spark where it can, and the session is asked for only after.

    When silver asks for tables to be snapshotted again (a change in the stream it cannot
    follow, ``SilverResult.resync``), capture and silver run once more before gold, so the run
    ends with those tables exact; ``recapture`` (default: whether ``stages`` has capture) says
    whether this run may capture.

    ``marts`` runs only when ``[lakehouse] marts`` names a folder (otherwise nothing of it is
    imported or started), and not on Databricks, where the bundle's pipeline runs them. Locally
    it first ends this process's Spark JVM (Derby admits one JVM per metastore, and the
    pipeline runs in a JVM of its own): a session passed in is unusable after it, and
    ``pgmedallion.core.spark.get_spark`` starts a new one."""
    engine.use(cfg.lakehouse)
    result = RunResult()
    session: SparkSession | None = None if callable(spark) else spark
    ready = False

    def lakehouse() -> SparkSession:
        nonlocal session, ready
        if session is None:
            session = spark()
        if not ready:
            ensure_schemas(session, cfg)
            ready = True
        return session

    if session is not None:
        lakehouse()
    # silver and gold take their paths without Spark where they can: started when asked
    lazy = _lazy(cfg, lakehouse) if session is None else None

    def layers() -> SparkSession:
        return lakehouse() if lazy is None or session is not None else lazy

    if recapture is None:
        recapture = "capture" in stages

    def capture() -> Any:
        from pgmedallion.capture.run import capture_needs_spark

        needs = session is not None or capture_needs_spark(cfg)
        return run_capture(lakehouse() if needs else None, cfg, **capture_kwargs)

    for stage in STAGES:
        if stage not in stages:
            continue
        if stage == "marts" and (not cfg.lakehouse.marts or on_databricks()):
            if cfg.lakehouse.marts:
                log.info("on Databricks the marts run as the bundle's pipeline, not here")
            continue
        with show(stage) if show is not None else nullcontext(), _naming(stage):
            if stage == "capture":
                result.capture = capture()
            elif stage == "silver":
                from pgmedallion.silver.build import run_silver

                result.silver = run_silver(layers(), cfg)
                if result.silver.resync and recapture:
                    tables = ", ".join(result.silver.resync)
                    log.info("capturing again: silver asked for a new snapshot of %s", tables)
                    again = capture()
                    result.capture = again if result.capture is None else result.capture.then(again)
                    result.silver = result.silver.then(run_silver(layers(), cfg))
            elif stage == "gold":
                from pgmedallion.gold.build import run_gold

                result.gold = run_gold(layers(), cfg)
                from pgmedallion.maintain import maintain, touched

                maintain(layers(), cfg, tables=touched(result.gold), gold=result.gold)
            else:
                from pgmedallion.marts.runner import run_marts, stop_local_spark

                if session is None and isinstance(spark, SparkStarter) and spark.background:
                    session = spark()  # started in the background: end it too
                if session is None and unregistered_tables(cfg):
                    lakehouse()  # the marts read gold by name: put in the catalog first
                stop_local_spark()
                session, ready = None, False
                result.marts = run_marts(cfg)
        result.stages.append(stage)
    return result


@contextmanager
def _naming(stage: str) -> Iterator[None]:
    """A :class:`PipelineError` leaving ``stage`` names it (the first stage to see it)."""
    try:
        yield
    except PipelineError as exc:
        if exc.stage is None:
            exc.stage = stage
        raise


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
    from pyspark.sql import functions as F

    from pgmedallion.silver.contract import DIFF, LSN, METADATA

    diffs = spark.table(cfg.qualified("silver", silver_table))
    if before_lsn is not None:
        diffs = diffs.where(F.col(LSN) < before_lsn)
    data = [c for c in diffs.columns if c not in METADATA]
    cols = [F.col(quote(c)) for c in data]
    summed = diffs.groupBy(*cols).agg(F.sum(DIFF).alias("_n")).where(F.col("_n") > 0)
    return summed.withColumn("_i", F.explode(F.sequence(F.lit(1), F.col("_n")))).select(*cols)


class NotCaptured(PipelineError, ValueError):
    """``resync`` named a table this source does not capture (nothing was changed)."""

    stage = "resync"


ALL_TABLES = "*"
"""``resync``'s name for every captured table (``pgmedallion resync --all``)."""


def request_resync(spark: SparkSession | None, cfg: Config, names: list[str]) -> list[str]:
    """Ask the next capture to snapshot ``names`` (``schema.table``, or a table name that is
    unique among the captured tables; :data:`ALL_TABLES`: every table captured and not
    dropped) again; their silver and gold tables are rebuilt from that snapshot on, and no
    other table is touched. Every table snapshotted again is also the way back from a lost
    replication slot: the next capture then makes a new one (``capture.slot.starts_afresh``).
    Returns the qualified names. Raises :class:`NotCaptured`, having written nothing, when a
    name is not a captured table. ``spark`` None: bronze is read and written without Spark (as
    capture does)."""
    from pgmedallion.capture.run import bronze_of, capture_target

    if spark is not None:
        ensure_schemas(spark, cfg)
    bronze = bronze_of(spark, capture_target(cfg))
    state = bronze.state()
    captured = {f"{schema}.{name}": oid for oid, (_, schema, name) in state.snapshots.items()}
    if ALL_TABLES in names:  # by OID: a name may have held two tables (dropped, made again)
        dropped = bronze.dropped_tables()
        records = [
            (oid, schema, name)
            for oid, (_, schema, name) in state.snapshots.items()
            if oid not in dropped
        ]
        if not records:
            raise NotCaptured(f"source {cfg.source.name!r} captures no table yet")
        bronze.request_resync(records, state.frontier or 0)
        chosen = sorted({f"{schema}.{name}" for _, schema, name in records})
        log.info("resync requested for every table: %s", ", ".join(chosen))
        return chosen
    by_name: dict[str, list[str]] = {}
    for full in captured:
        by_name.setdefault(full.split(".", 1)[1], []).append(full)
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
    bronze.request_resync(records, state.frontier or 0)
    log.info("resync requested for %s", ", ".join(chosen))
    return chosen
