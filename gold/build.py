"""The gold run: silver's diffs applied to each table's current state, exactly once.

``run_gold(spark, cfg)`` takes silver's latest completed run R (the largest ``run`` in
``_progress`` for the source) and its frontier F, and brings every snapshotted table of
``_tables`` to its state at F (see ``gold/__init__.py`` for the tables it writes).

Per table, the plan depends on what gold already holds, read from the gold table's own Delta
history (the newest commit whose ``userMetadata`` carries gold's JSON tag):

``full``         nothing applied yet, the columns changed, silver was rebuilt, or the table's
                 frontier moves in a way an increment cannot express (a definite error found
                 below what was applied, or a held table released): the state is recomputed
                 from every silver row with ``_run <= R`` and written with one overwrite.
``incremental``  only silver rows with ``_run`` in (the silver run applied, R] are read (silver is
                 append-only, so file statistics on ``_run`` skip the older files); the keys
                 they touch get their old state from gold (and quarantine), the new state is
                 old + changes, and one keyed MERGE writes it (see ``gold.state``). The reads of
                 gold for old rows and the MERGE carry a range predicate on the touched keys, so
                 Delta's min/max statistics skip the files that cannot hold them (a full build
                 writes keyed tables range-partitioned and sorted by key, so files hold key
                 ranges), and a bitmap of the touched keys' hashes (``key_filter``), so that
                 of the rows those files hold only the touched keys' (and ~12% others) reach
                 the joins: the MERGE's rewrite joins gold as the inner side of the source's
                 outer join, which Spark shuffles and sorts, and without the bitmap that was
                 every row of every touched file. The touched keys are broadcast elsewhere;
                 deletion vectors keep the rewrite proportional to the changed rows. What stays
                 proportional to the table is scanning the files whose key range the changes
                 fall in: changes spread uniformly over the key space touch every file.
``unchanged``    gold already holds silver run R at this frontier: nothing is written. Likewise a
                 table no silver run wrote anything for (diffs, errors, adjustments: the
                 ``tables`` of ``_progress``) since the silver run ``_frontier`` last reported
                 for it is not read at all: its gold table already holds its state at F, and
                 only its ``_frontier`` row moves to F. A run touches only the tables that
                 changed, and builds them concurrently (each in its own Spark session: the
                 idempotent-commit settings below are session settings).

Exactly once. The gold commit is what makes a run applied: its ``userMetadata`` records the
silver run, the frontier and the quarantine table's version, and it is made with Delta's
idempotent-write settings (``txnAppId = pgmedallion-gold-<source>-<table>``, ``txnVersion =
R``), which Delta 4.4 honours for MERGE as for writes. The quarantine table is written first
and read back *as of the version the gold commit names*, so a crash between the two commits
re-reads the old quarantine. ``_frontier`` and ``_quality`` are reports written after every
table; a crash before them loses a report, never state, and the next run rediscovers from the
gold commits what was applied. (A table's ``_frontier`` row at silver run R says its gold table
holds its state at R: either its gold commit is R's, or no silver run since that commit wrote
anything for it. A lost report only makes the next run look at more tables.) A run in which
nothing changed, not even a frontier, writes no reports.

Key-less tables take the same incremental path with the whole row as the key (a "key" is a
distinct row value; its copies are its multiplicity); only a table whose columns cannot be
compared (a map) is recomputed in full every run, at the cost of reading all its silver rows.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from queue import Queue
from typing import TYPE_CHECKING

from pgmedallion.core import delta_rs, engine
from pgmedallion.core.config import Config
from pgmedallion.core.failpoints import failpoint
from pgmedallion.core.parallel import concurrently, side_by_side
from pgmedallion.core.session import real
from pgmedallion.core.spark import drop_table
from pgmedallion.gold.batch import build_batched
from pgmedallion.gold.history import (
    ErrorSummary,
    Reported,
    SilverProgress,
    errors_of,
    latest_progress,
    read_adjustments,
    read_errors,
    read_reported,
    read_tables,
)
from pgmedallion.gold.history_table import history_name, keep_history
from pgmedallion.gold.plan import Table, TableOutcome
from pgmedallion.gold.pruning import untouched
from pgmedallion.gold.quality import GoldQualityError
from pgmedallion.gold.reports import ensure_lag_view, ensure_report_tables, write_reports
from pgmedallion.gold.table import build_table, untouched_outcome
from pgmedallion.gold.table_io import gold_table_names, layer_schema, plain_name
from pgmedallion.silver.contract import TableInfo

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)


@dataclass
class GoldResult:
    source: str
    silver_run: int | None
    frontier: int | None
    tables: list[TableOutcome] = field(default_factory=list)

    def reported(self) -> dict[tuple[int, str], Reported]:
        """``_frontier`` as this run left it (one row per outcome, as ``write_reports`` writes
        it), by ``(table_oid, gold_table)``: what ``read_reported`` would read now."""
        return {
            (o.table.oid, o.gold_table): Reported(o.silver_run, o.frontier, o.rows)
            for o in self.tables
        }

    def table(self, name: str) -> TableOutcome:
        """The outcome for a silver table name or a ``schema.table`` source name."""
        for t in self.tables:
            if name in (t.table.silver_table, t.table.qualified_name):
                return t
        raise KeyError(name)


@dataclass
class _Inputs:
    """What a run reads before building any table: silver's run, its frontier, its tables,
    their errors and adjusted values, and what gold last reported."""

    silver_run: int
    frontier: int
    tables: list[TableInfo]
    errors: dict[tuple, ErrorSummary]
    adjusted: dict[int, ErrorSummary]
    reported: dict[tuple[int, str], Reported]
    silver_runs: list[tuple[int, set[int] | None]]
    existing: set[str]
    progress: SilverProgress

    def report_of(self, cfg: Config, info: TableInfo) -> Reported | None:
        return self.reported.get((info.oid, plain_name(cfg, "gold", info.silver_table)))

    def exists(self, info: TableInfo) -> bool:
        return info.silver_table.lower() in self.existing


def _read_inputs(spark: SparkSession, cfg: Config) -> _Inputs | None:
    # two waves of reads side by side where each is a Spark job (mostly waiting: a Delta
    # snapshot, a job's scheduling): silver's progress and tables, then what depends on them
    # (errors below the frontier, adjusted values of the run) with gold's own
    threads = delta_rs.bookkeeping_through_spark(spark, cfg.schema("silver"))
    progress, tables = side_by_side(
        lambda: latest_progress(spark, cfg),
        lambda: read_tables(spark, cfg),
        threads=threads,
    )
    if progress is None:
        return None
    silver_run, frontier = progress.run, progress.frontier
    ensure_report_tables(spark, cfg)
    since = {t.oid: t.snapshot_run for t in tables if t.snapshot_run is not None}
    snapshots = {t.oid: t.snapshot_lsn for t in tables if t.snapshot_lsn is not None}
    reported, existing, errors, adjusted = side_by_side(
        lambda: read_reported(spark, cfg),
        lambda: gold_table_names(spark, cfg),
        lambda: read_errors(spark, cfg, frontier, since, snapshots),
        lambda: read_adjustments(spark, cfg, silver_run, since),
        threads=threads,
    )
    ensure_lag_view(spark, cfg, existing)
    silver_runs = progress.touched(min(r.silver_run for r in reported.values())) if reported else []
    return _Inputs(
        silver_run,
        frontier,
        tables,
        errors,
        adjusted,
        reported,
        silver_runs,
        existing,
        progress,
    )


def _sessions(spark: SparkSession, count: int) -> list[SparkSession]:
    """``count`` sessions of ``spark``'s context, each with its own settings; just ``spark``
    where one is enough or new sessions cannot be made (Spark Connect): then the tables are
    built one after another."""
    if count >= 1:
        spark = real(spark)  # the per-table path is Spark's: started now if it was not
    if count <= 1:
        return [spark]
    try:
        return [spark.newSession() for _ in range(count)]
    except Exception:  # Spark Connect has no newSession
        return [spark]


def _build_tables(
    spark: SparkSession, cfg: Config, inputs: _Inputs, work: list[tuple[TableInfo, ErrorSummary]]
) -> list[TableOutcome]:
    """Build the tables of ``work``: the small local increments together (``gold.batch``), the
    others concurrently, each in a session of its own."""
    schema_dir = delta_rs.schema_dir(spark, layer_schema(cfg, "gold")) if work else None
    silver_dir = delta_rs.schema_dir(spark, layer_schema(cfg, "silver")) if schema_dir else None

    def paths(info: TableInfo) -> dict:
        return {
            "path": delta_rs.table_dir(schema_dir, info.silver_table),
            "silver_path": delta_rs.table_dir(silver_dir, info.silver_table),
        }

    outcomes: dict[int, TableOutcome] = {}
    rest = list(range(len(work)))
    if schema_dir and silver_dir:
        tables = [
            (
                Table(
                    spark,
                    cfg,
                    info,
                    inputs.silver_run,
                    inputs.frontier,
                    summary,
                    inputs.adjusted.get(info.oid) or ErrorSummary(),
                    **paths(info),
                ),
                inputs.exists(info),
            )
            for info, summary in work
        ]
        outcomes, rest = build_batched(spark, tables)
    sessions: Queue = Queue()
    for session in _sessions(spark, min(engine.current().workers, len(rest))):
        sessions.put(session)

    def one_table(i: int) -> TableOutcome:
        info, summary = work[i]
        session = sessions.get()
        try:
            return build_table(
                session,
                cfg,
                info,
                inputs.silver_run,
                inputs.frontier,
                summary,
                adjusted=inputs.adjusted.get(info.oid),
                exists=inputs.exists(info),
                **paths(info),
            )
        finally:
            sessions.put(session)

    for i, outcome in zip(rest, concurrently(one_table, rest, sessions.qsize()), strict=True):
        outcomes[i] = outcome
    return [outcomes[i] for i in range(len(work))]


def _reports_changed(cfg: Config, inputs: _Inputs, built: int, done: list[TableOutcome]) -> bool:
    """Whether the run changed anything, if only a frontier (else it writes no reports)."""
    if built or len(inputs.reported) != len(done):
        return True
    for o in done:
        reported = inputs.report_of(cfg, o.table)
        if (reported.silver_run, reported.frontier) != (o.silver_run, o.frontier):
            return True
    return False


def _drop_orphans(spark: SparkSession, cfg: Config, inputs: _Inputs) -> None:
    """Gold holds the source's live tables under their names of now: the gold tables ``_frontier``
    reports for a table silver no longer has (the source dropped it) or under another name (the
    source renamed it, or a table dropped and created again took the name) are dropped, with
    their quarantine, before anything is built. A table that takes such a name is then built in
    full; nobody reads a dropped table's rows under a live table's name."""
    live = {(t.oid, plain_name(cfg, "gold", t.silver_table)) for t in inputs.tables}
    for oid, name in sorted(set(inputs.reported) - live):
        table = name.rsplit(".", 1)[-1]
        log.info("gold: dropping %s (table oid %d: dropped or renamed at the source)", name, oid)
        for dropped in (table, table + "__quarantine"):
            drop_table(spark, cfg.schema("gold"), dropped, cfg.qualified("gold", dropped))
            inputs.existing.discard(dropped.lower())


def _keep_histories(
    spark: SparkSession, cfg: Config, inputs: _Inputs, built: list[TableInfo]
) -> None:
    """The history tables (``gold.history_table``) of the tables built, and of any table whose
    history is asked for and not there yet, brought to what their gold tables applied: before
    the reports, so a ``_frontier`` row's run is one every history holds (silver's compaction
    goes by it)."""
    wanted = [i for i in inputs.tables if cfg.history(i.qualified_name)]
    if not wanted:
        return
    ids = {i.oid for i in built}
    todo = [i for i in wanted if i.oid in ids or history_name(i).lower() not in inputs.existing]
    if not todo:
        return
    gold_dir = delta_rs.schema_dir(spark, layer_schema(cfg, "gold"))
    silver_dir = delta_rs.schema_dir(spark, layer_schema(cfg, "silver"))
    concurrently(
        lambda info: keep_history(spark, cfg, info, gold_dir, silver_dir),
        todo,
        engine.current().workers,
    )


def run_gold(spark: SparkSession, cfg: Config) -> GoldResult:
    """One gold run over every snapshotted table of the configured source.

    A table no silver run wrote anything for since the silver run gold last applied or
    reported for it (``_progress.tables``) costs nothing: its gold table already holds its
    state at the new frontier, which ``_frontier`` records. The other tables are built
    concurrently, each in its own Spark session (its idempotent-commit settings are session
    settings).

    Raises ``GoldQualityError`` after processing every table when a table under the ``fail``
    policy broke a rule; the result is on the exception (``.result``).
    """
    engine.use(cfg.lakehouse)
    inputs = _read_inputs(spark, cfg)
    if inputs is None:
        return GoldResult(cfg.source.name, None, None)
    _drop_orphans(spark, cfg, inputs)
    outcomes: list[TableOutcome | None] = [None] * len(inputs.tables)
    work: list[tuple[int, TableInfo, ErrorSummary]] = []
    for i, info in enumerate(inputs.tables):
        summary = errors_of(info, inputs.errors)
        reported = inputs.report_of(cfg, info)
        if untouched(info, reported, inputs.silver_run, inputs.silver_runs, inputs.exists(info)):
            adjusted = inputs.adjusted.get(info.oid)
            outcomes[i] = untouched_outcome(
                cfg, info, inputs.silver_run, inputs.frontier, summary, adjusted, reported
            )
        else:
            work.append((i, info, summary))
    built = _build_tables(spark, cfg, inputs, [(info, s) for _, info, s in work])
    for (i, _, _), outcome in zip(work, built, strict=True):
        outcomes[i] = outcome
    _keep_histories(spark, cfg, inputs, [info for _, info, _ in work])
    done = [o for o in outcomes if o is not None]
    failpoint("gold.before_reports")
    if _reports_changed(cfg, inputs, len(work), done):
        write_reports(spark, cfg, inputs.silver_run, done, inputs.progress.as_of)
    result = GoldResult(cfg.source.name, inputs.silver_run, inputs.frontier, done)
    failures = {
        o.table.qualified_name: o.failures for o in done if o.policy == "fail" and o.failures
    }
    if failures:
        raise GoldQualityError(failures, result)
    return result
