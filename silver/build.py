"""The silver run: new bronze rows in, typed consolidated diffs per table and errors out.

One run ``R`` reads a window of bronze and appends to the tables of the contract in
``silver/__init__.py``::

    plan R:  frontier window [F_prev, F)   F = bronze's committed frontier
             batch window    (b_prev, b]   b = bronze's last batch
    wal      lsn in [F_prev, F), batch <= b; per commit LSN the messages of one capture run
             that reached the Commit (a re-read may renumber ordinals, so never mix reads)
    copy / schema / rewind / error records     batch in (b_prev, b]
             │
             ├─ Relation messages ──> per-table column layouts (kept in ``_relations``)
             ├─ Insert/Update/Delete ──> (values, lsn, ±1)       [Python workers, Arrow]
             ├─ COPY rows ──> (values, 0, +1)                       [Arrow kernels]
             ├─ casts ──> typed rows; values that do not cast ──> ``_errors``  [Arrow kernels]
             ├─ rewinds: changes with lsn <= snapshot LSN again at 0 with the diff negated
             ├─ TRUNCATE: an error, or (policy ``delete``) every row retracted at its LSN
             └─ consolidate: sum diffs per (row, lsn), drop zeros ──> ``<silver_table>``

Exactly once. The plan (both windows) is written to ``_plans`` before anything else, and a
rerun after a crash redoes the planned run with the same windows, which read the same
immutable bronze rows. Every append carries ``txnAppId = pgmedallion-silver-<source>`` and
``txnVersion = R``, so Delta skips the tables the crashed attempt had already committed. The
``_progress`` row is the run's last write.

One pass per table. A table's rows are decoded and cast by the Arrow kernels (in Spark's Python
workers) in the job that appends them, which also counts (an observed metric) the rows that do not
settle (the *unsettled* rows): decode errors, values that do not cast or that a declared rule
adjusts. Usually there are none. Otherwise those (unsettled) rows are cast again, with their error
messages and adjustments, and appended in a second commit of the run (``txnAppId =
pgmedallion-silver-<source>-late``) with their rewinds: the two commits hold different (row, LSN)
pairs (see :func:`table_run`).

The steps live in their own modules: :mod:`silver.plan` (windows), :mod:`silver.catalog`
(tables, Relations, layouts), :mod:`pgmedallion.silver.decode`, :mod:`pgmedallion.silver.cast_rows`,
:mod:`pgmedallion.silver.rewind` and :mod:`pgmedallion.silver.write`; this module runs them.
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from pgmedallion.bronze.spark_table import bronze_dir
from pgmedallion.capture.pgoutput import MSG_COMMIT, decode, format_lsn
from pgmedallion.capture.replication import PG_EPOCH_US
from pgmedallion.core import deletion_vectors, delta_rs, engine
from pgmedallion.core.config import Config
from pgmedallion.core.naming import quote
from pgmedallion.core.parallel import concurrently, side_by_side
from pgmedallion.core.spark import drop_table, reshape_columns
from pgmedallion.core.sparkapi import F, T
from pgmedallion.silver import batch, catalog
from pgmedallion.silver.cast_rows import (
    ROW_DIFF,
    ROW_LSN,
    cast_diffs,
    cast_in_one_pass,
    data_columns,
)
from pgmedallion.silver.catalog import load_tables
from pgmedallion.silver.contract import Names, SilverResult, TableInfo, ensure_silver_tables
from pgmedallion.silver.decode import TableDiffs, message_type, table_diffs, wal_window
from pgmedallion.silver.errors import ErrorRecord, SchemaIncompatible, TableTruncated
from pgmedallion.silver.first_load import first_snapshot
from pgmedallion.silver.identity import resolve_previous_images
from pgmedallion.silver.pgtypes import arrow_type, pg_type_of, spark_type
from pgmedallion.silver.plan import (
    Plan,
    control_errors,
    last_frontier,
    plan_run,
    session_bronze,
    write_plan,
)
from pgmedallion.silver.rewind import (
    consolidated,
    distinct_snapshot,
    snapshot_floor,
    truncated,
    with_rewinds,
)
from pgmedallion.silver.window import Decoded, Window, read_once, relids, with_mtype
from pgmedallion.silver.write import (
    append_diffs,
    create_diff_table,
    rename_by_rewrite,
    restate_added,
    widen_columns,
    write_adjustments,
    write_commits,
    write_errors,
    write_progress,
    write_relations,
    written,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["SilverResult", "run_silver", "table_run"]

log = logging.getLogger(__name__)


@dataclass
class _Run:
    """What one run knows of its window, built up step by step."""

    plan: Plan
    tables: dict[int, TableInfo]
    errors: list[ErrorRecord] = field(default_factory=list)
    new_snapshots: dict[int, int] = field(default_factory=dict)
    copied: set[int] = field(default_factory=set)
    window_relations: list[tuple[int, int, bytes]] = field(default_factory=list)
    earlier_relations: list[tuple[int, int, bytes]] = field(default_factory=list)
    """The Relations earlier runs kept (``_relations``)."""
    dropped_before: set[int] = field(default_factory=set)
    """The tables earlier runs found dropped."""
    truncate_at: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    changed: set[int] = field(default_factory=set)
    identity_keys: dict[int, tuple[int, ...]] = field(default_factory=dict)
    mixed_identities: dict[int, list[tuple[int, ...]]] = field(default_factory=dict)
    """Tables whose key-only changes of this run carry two identities (the source's primary
    key or replica identity changed between them), and those identities' key positions: their
    earlier rows are looked up under each."""
    change_rows: dict[int, int] = field(default_factory=dict)
    retired: set[int] = field(default_factory=set)
    """Tables the source dropped (their last changes may still arrive after the record)."""
    tables_before: dict[int, TableInfo] = field(default_factory=dict)
    """``tables`` as the run read them (``_tables`` is written only when they changed)."""
    gone: dict[int, TableInfo] = field(default_factory=dict)
    """The tables this run took out of silver (dropped at the source): their errors' names."""
    layout_errors: list[ErrorRecord] = field(default_factory=list)
    """The window's Relations silver cannot follow (``SchemaIncompatible``, per Relation)."""
    reshaped: set[int] = field(default_factory=set)
    """Tables whose silver table (or gold's rules) this run changed without appending to it:
    earlier rows that took an added column's value (:func:`_restate_added`), columns renamed
    (a swap: rewritten) or dropped (:func:`_reshape_followed`), widened
    (:func:`_widen_followed`), a new primary key (gold builds by it)."""
    followed: dict[int, catalog.Followed] = field(default_factory=dict)
    """OID -> what of the source's schema changes this run follows (drops, renames, widened
    types, NOT NULL, the key, reading by position: ``catalog.followed_columns``)."""


def run_silver(spark: SparkSession, cfg: Config) -> SilverResult:
    """Silver brought up to whatever bronze committed: one run over everything since the last
    one; after a crash, the interrupted run (its planned window) first, then one over the rest,
    so that a call that returns leaves silver at bronze's frontier."""
    engine.use(cfg.lakehouse)
    ensure_silver_tables(spark, cfg)
    result, redone = _run_once(spark, cfg)
    while redone:
        more, redone = _run_once(spark, cfg)
        if more.run is None or more.run <= (result.run or 0):
            break  # nothing after it (or the same run again: never loop on it)
        result = result.then(more)
    return result


def _run_once(spark: SparkSession, cfg: Config) -> tuple[SilverResult, bool]:
    """One silver run (the planned one again after a crash); whether it was such a redo."""
    n, source = Names(cfg), cfg.source.name
    plan = plan_run(spark, cfg)
    if plan is None:
        return SilverResult(None, last_frontier(spark, n, source), {}, 0), False
    log.info(
        "silver run %d: wal [%s, %s), bronze batches (%d, %d]",
        plan.run,
        format_lsn(plan.f_from),
        format_lsn(plan.f_to),
        plan.b_from,
        plan.b_to,
    )
    # the plan is written side by side with the reads the run starts with (each through Spark
    # mostly waits: a Delta snapshot, a job), and before any other write of the run
    threads = delta_rs.bookkeeping_through_spark(spark, n.schema)
    tables, dropped, relations, _ = side_by_side(
        lambda: load_tables(spark, cfg),
        lambda: catalog.dropped_before(spark, n, source),
        lambda: catalog.earlier_relations(spark, n, source, plan.run),
        lambda: write_plan(spark, cfg, plan),
        threads=threads,
    )
    r = _Run(plan, tables)
    r.dropped_before, r.earlier_relations = dropped, relations
    r.tables_before = copy.deepcopy(r.tables)
    known_before = set(r.tables)
    taken = {t.silver_table for t in r.tables.values()}
    _read_control(spark, n, r, cfg, taken)
    wal = _read_wal(spark, cfg, n, r, known_before)
    layouts, copy_widths = _read_relations(spark, cfg, n, r, wal, taken)
    wal_diffs = wal.decoded(layouts, spark)
    _read_changes(r, wal_diffs)
    _truncates(r, cfg)

    def diffs_of(oid: int) -> TableDiffs:
        rows = _bronze(spark, n, source)  # (a Spark session from here on)
        batches = r.tables[oid].snapshot_batches() if oid in r.copied else []
        copy_rows = (
            rows.where(F.col("batch_id").isin(batches) if batches else F.lit(False))
            .where(F.col("kind") == "copy")
            .select("table_oid", "lsn", "payload")
        )
        return table_diffs(oid, wal_diffs.good(), copy_rows, copy_widths[oid])

    work, rows, adjusted = _run_tables(spark, cfg, n, r, diffs_of, wal_diffs, copy_widths)
    resync = _request_resync(spark, cfg, n, r)
    commits = _commits(wal) if cfg.keeps_history() else []
    _write_run(spark, n, source, r, work, adjusted, commits)
    wal.unpersist()
    wal_diffs.unpersist()
    log.info(
        "silver run %d done: frontier %s, %d errors",
        plan.run,
        format_lsn(plan.f_to),
        len(r.errors),
    )
    return SilverResult(plan.run, plan.f_to, rows, len(r.errors), resync), plan.redo


def _request_resync(spark: SparkSession, cfg: Config, n: Names, r: _Run) -> tuple[str, ...]:
    """Ask capture to snapshot again the tables whose stream this run could not follow
    (:func:`catalog.unfollowed`), unless a request is pending already; before ``_progress``, so
    a crash in between asks again when the run is redone. Returns their names."""
    wanted = catalog.unfollowed(r.tables, r.layout_errors, cfg)
    if not wanted:
        return ()
    bronze = session_bronze(spark, cfg, n, fresh=True)  # capture may have taken it since
    state = bronze.state()
    new = {
        oid: why
        for oid, (why, lsn) in wanted.items()
        if oid not in state.resync  # asked for already, not taken yet
        and not (oid in state.snapshots and state.snapshots[oid][0] > lsn)  # taken since
    }
    for oid, why in sorted(new.items()):
        name = r.tables[oid].qualified_name
        log.warning("silver: %s: %s: asking capture to snapshot it again", name, why)
    if new:
        tables = [(oid, r.tables[oid].schema, r.tables[oid].name) for oid in sorted(new)]
        bronze.request_resync(tables, state.frontier or 0, reasons=new)
    return tuple(sorted(r.tables[oid].qualified_name for oid in wanted))


def _read_control(spark: SparkSession, n: Names, r: _Run, cfg: Config, taken: set[str]) -> None:
    """The batch window's control records into the run: tables' columns, snapshots, errors;
    the tables the source dropped (``TableDropped``) leave silver."""
    control = session_bronze(spark, cfg, n).control_window(r.plan.b_from, r.plan.b_to)
    r.errors += control_errors(control, list(r.tables))
    dropped = catalog.dropped_tables(control) | r.dropped_before
    r.retired = dropped
    r.gone = catalog.retire(r.tables, dropped, taken)
    left = [info.silver_table for info in r.gone.values()]
    control = [c for c in control if c["table_oid"] not in dropped]
    left += catalog.apply_schemas(r.tables, control, cfg, taken)
    r.new_snapshots = catalog.apply_rewinds(r.tables, control, r.plan.run)
    # The copy rows of a snapshot come with its rewind: in the same batch, or (a snapshot read
    # in key ranges) in the batches its rewind names (TableInfo.snapshot_batches). Ranges of a
    # snapshot still under way are read by no run until its rewind comes.
    r.copied = {
        c["table_oid"] for c in control if c["kind"] == "copy" and c["table_oid"] in r.new_snapshots
    } | {oid for oid in r.new_snapshots if r.tables[oid].snapshot_ranges}
    for name in left:
        # dropped at the source, or renamed (its new snapshot is rebuilt under the new name):
        # a crash before this run's _progress row drops nothing more on the run again
        log.info("silver: dropping %s (%s)", name, "table dropped at the source or renamed")
        drop_table(spark, n.schema, name, n.table(name))


def _bronze(spark: SparkSession, n: Names, source: str) -> DataFrame:
    """The source's rows of bronze, as Spark scans them."""
    return spark.table(n.bronze).where(F.col("source") == source)


def _read_wal(
    spark: SparkSession, cfg: Config, n: Names, r: _Run, known_before: set[int]
) -> Window:
    """The wal window: one read per transaction. A table silver held before and snapshots again
    now is rebuilt from its snapshot on (see :func:`table_run`): its changes above the snapshot
    LSN that earlier runs read (a stream ahead of the snapshot) are read again.

    Where bronze is a local directory and the window holds at most ``[lakehouse]
    small_table_rows`` wal rows (a continuous application's, a small increment's), delta-rs
    reads them into the driver (:mod:`silver.window`): a Spark scan pays for bronze's snapshot
    first, which a capture committing every second keeps moving (0.6 s a run warm, 6 s in a
    cold process, against 0.3 s and 0.5 s; measured on a continuous pipeline's bronze), and
    the run may then need no Spark at all."""
    p = r.plan
    rebuilt = {
        oid: lsn
        for oid, lsn in r.new_snapshots.items()
        if oid in known_before or r.tables[oid].snapshot_ranges  # (ranges: see capture.ranges)
    }
    reread_from = min([lsn + 1 for lsn in rebuilt.values()] + [p.f_from])

    def in_spark(bronze: DataFrame) -> DataFrame:
        wal = wal_window(bronze, reread_from, p.f_to, p.b_to)
        if reread_from < p.f_from:
            wal = wal.where((F.col("lsn") >= p.f_from) | F.col("relid").isin(list(rebuilt)))
        return wal

    small = _small_window(spark, cfg, n, reread_from, p.f_to, p.b_to)
    if small is None:
        return Window(None, lambda: in_spark(_bronze(spark, n, cfg.source.name)))
    rows, schema = small
    spark_rows = lambda: in_spark(delta_rs.frame(spark, rows, delta_rs.spark_types(schema)))  # noqa: E731
    chosen = read_once(rows)
    if chosen.num_rows < rows.num_rows:
        log.info(
            "silver: %d wal rows of other reads of the window's transactions left out",
            rows.num_rows - chosen.num_rows,
        )
    if reread_from < p.f_from:
        earlier = pc.less(chosen.column("lsn"), p.f_from)
        rebuilt_rows = pc.is_in(relids(chosen.column("payload")), pa.array(list(rebuilt)))
        chosen = chosen.filter(pc.or_(pc.invert(earlier), pc.fill_null(rebuilt_rows, False)))
    return Window(chosen, spark_rows)


def _small_window(
    spark: SparkSession, cfg: Config, n: Names, f_from: int, f_to: int, b_to: int
) -> tuple[pa.Table, pa.Schema] | None:
    """Bronze's wal rows of ``[f_from, f_to)`` in batches up to ``b_to`` read by delta-rs (with
    ``mtype``) and bronze's columns, if bronze is local and the driver holds them (at most
    ``[lakehouse] driver_rows`` rows and :data:`_SMALL_WINDOW_BYTES`; None: Spark scans
    bronze)."""
    path = bronze_dir(spark, cfg)
    if not delta_rs.usable(path):
        return None
    literal = "'" + cfg.source.name.replace("'", "''") + "'"
    where = (
        f"source = {literal} AND kind = 'wal' AND lsn >= {int(f_from)} AND lsn < {int(f_to)}"
        f" AND batch_id <= {int(b_to)}"
    )
    try:
        if delta_rs.count(path, where) > engine.current().driver_rows:
            return None
        # bytes as half their hex: DataFusion's octet_length takes strings only (binary: an error)
        sql = f"SELECT sum(octet_length(encode(payload, 'hex'))) / 2 AS b FROM t WHERE {where}"
        (size,) = delta_rs.query(path, sql).to_pylist()
        if (size["b"] or 0) > _SMALL_WINDOW_BYTES:
            return None
        schema = delta_rs.arrow_schema(path)
        return with_mtype(delta_rs.read_arrow(path, schema.names, where)), schema
    except Exception as exc:  # e.g. a reader feature delta-rs lacks: Spark scans bronze
        log.info("silver: bronze's window read through Spark (delta-rs: %s)", exc)
        return None


_SMALL_WINDOW_BYTES = 256 * 1024 * 1024
"""The most wal payload bytes :func:`_small_window` holds in the driver."""


def _read_relations(
    spark: SparkSession, cfg: Config, n: Names, r: _Run, wal: Window, taken: set[str]
) -> tuple[catalog.Layouts, dict[int, tuple[int, int]]]:
    """The window's Relations and truncates; tables seen only in the stream; the layouts."""
    r.window_relations, truncates = catalog.window_messages(
        wal.messages((catalog.RELATION_TYPE, catalog.TRUNCATE_TYPE))
    )
    relations = catalog.known_relations(r.earlier_relations, r.window_relations)
    catalog.add_stream_tables(r.tables, relations, cfg, taken, r.window_relations, r.retired)
    bronze = session_bronze(spark, cfg, n)
    upto = r.plan.b_to  # the window's records: a redo after a crash decides the same
    followed = bronze.followed_catalogs(sorted(r.tables), upto)
    recorded = catalog.recorded_columns(followed, r.tables)
    snapshots = bronze.snapshot_schemas(sorted(followed), upto) if followed else {}
    r.followed = catalog.followed_columns(followed, snapshots, r.tables, cfg, r.copied)
    layouts, copy_widths, errors = catalog.plan_layouts(
        r.tables, relations, cfg, r.plan.f_from, recorded, r.followed, r.new_snapshots
    )
    for oid, f in sorted(r.followed.items()):
        if f.problem:  # a new snapshot makes it exact (see _request_resync)
            errors.append(ErrorRecord(oid, r.plan.f_to, SchemaIncompatible.__name__, f.problem))
        elif f.primary_key is not None:
            r.reshaped.add(oid)  # gold builds it by the new key, rows changed or not
    errors += _filled_beyond_copy(r, copy_widths)
    r.errors += errors
    r.layout_errors = errors
    r.truncate_at = catalog.truncates_by_table(truncates, r.tables)
    return layouts, copy_widths


def _filled_beyond_copy(r: _Run, copy_widths: dict[int, tuple[int, int]]) -> list[ErrorRecord]:
    """A ``SchemaIncompatible`` error (so a new snapshot, see :func:`_request_resync`) for each
    table whose snapshot this run reads while a Relation of the run adds a column with a value
    for the rows already there: the snapshot's COPY rows predate the column and would read
    NULL in it. Rare (the column added while the table was first read); the new snapshot
    holds the column."""
    out = []
    for oid in sorted(r.copied & set(r.tables)):
        info = r.tables[oid]
        copy_width, _ = copy_widths[oid]
        added = [c["name"] for c in info.columns[copy_width:] if c.get("missing") is not None]
        if added:
            message = (
                f"column(s) {', '.join(added)} added with a value for existing rows while the"
                " table's snapshot was read"
            )
            out.append(ErrorRecord(oid, r.plan.f_to, SchemaIncompatible.__name__, message))
    return out


def _read_changes(r: _Run, wal_diffs: Decoded) -> None:
    """One read of the decoded changes per run: the tables they touch, which of those have
    decode errors, and which need their previous images (REPLICA IDENTITY DEFAULT / USING
    INDEX), with their identity's key positions (the first, if the identity changed)."""
    with_errors = []
    for c in wal_diffs.summary():
        r.changed.add(c["table_oid"])
        r.change_rows[c["table_oid"]] = c["rows"]
        if c["errors"]:
            with_errors.append(c["table_oid"])
        if c["identities"]:
            r.identity_keys[c["table_oid"]] = min(tuple(keys) for keys in c["identities"])
            if len({tuple(keys) for keys in c["identities"]}) > 1:
                r.mixed_identities[c["table_oid"]] = sorted({tuple(k) for k in c["identities"]})
    if with_errors:
        r.errors += [
            ErrorRecord(e["table_oid"], e["lsn"], e["code"], e["message"], raw=e["raw"])
            for e in wal_diffs.errors(with_errors)
        ]


def _truncates(r: _Run, cfg: Config) -> None:
    """A ``TableTruncated`` error per truncate of a table whose policy says ``error``."""
    for oid, info in sorted(r.tables.items()):
        if cfg.policy(info.qualified_name).truncate == "error":
            for lsn, _ in r.truncate_at.get(oid, []):
                message = f"{info.qualified_name} was truncated"
                r.errors.append(ErrorRecord(oid, lsn, TableTruncated.__name__, message))


def _run_tables(
    spark: SparkSession,
    cfg: Config,
    n: Names,
    r: _Run,
    diffs_of,
    wal_diffs: Decoded,
    copy_widths: dict[int, tuple[int, int]],
) -> tuple[list[int], dict[str, int], list[tuple]]:
    """Only the tables this run has something for: a table with no rows, snapshot or truncate
    in the window costs nothing. Small tables with changes only go through the batched path
    (:mod:`silver.batch`: a few Spark jobs for all of them); the others run concurrently (each
    its own Spark jobs and Delta commits). Returns the tables run, rows appended per table and
    ``(table_oid, column, code, count, first_lsn, sample)`` adjustments; their errors go to
    ``r.errors``."""
    work = sorted(
        oid
        for oid in r.tables
        if oid in r.changed or oid in r.copied or oid in r.new_snapshots or oid in r.truncate_at
    )
    filled = _added_with_values(r)
    existing = catalog.silver_tables(spark, n) if work or filled or r.followed else set()
    _reshape_followed(spark, n, r, existing)
    _widen_followed(spark, n, r, existing)
    _restate_added(spark, n, r, filled, existing)
    schema_dir = delta_rs.schema_dir(spark, n.schema) if work else None
    paths = {oid: delta_rs.table_dir(schema_dir, r.tables[oid].silver_table) for oid in work}
    rows: dict[str, int] = {}
    adjusted: list[tuple] = []
    rest = _run_batched(spark, cfg, n, r, work, existing, paths, wal_diffs, rows, adjusted)
    rest = _run_first_snapshots(
        spark, cfg, n, r, rest, existing, paths, copy_widths, rows, adjusted
    )

    def one_table(oid: int) -> tuple[int, list[ErrorRecord], list[tuple]]:
        info = r.tables[oid]
        deletes = cfg.policy(info.qualified_name).truncate == "delete"
        return table_run(
            spark,
            cfg,
            n,
            info,
            diffs_of(oid),
            r.plan.run,
            new_snapshot=oid in r.new_snapshots,
            snapshot_only=oid in r.new_snapshots and oid not in r.changed,
            truncates=r.truncate_at.get(oid, []) if deletes else [],
            identity_keys=r.identity_keys.get(oid),
            identities=r.mixed_identities.get(oid),
            exists=info.silver_table.lower() in existing,
            path=paths[oid],
        )

    for oid, (count, cast_errors, table_adjusted) in zip(
        rest, concurrently(one_table, rest, engine.current().workers), strict=True
    ):
        rows[r.tables[oid].qualified_name] = count
        r.errors.extend(cast_errors)
        adjusted += [(oid, *a) for a in table_adjusted]
    return work, rows, adjusted


def _added_with_values(r: _Run) -> dict[int, list[str]]:
    """OID -> the columns this run adds to the table that the source added with a value for
    the rows already there (a column entry's ``missing``), for tables silver holds and does
    not rebuild from a new snapshot in this run."""
    out = {}
    for oid, info in sorted(r.tables.items()):
        before = r.tables_before.get(oid)
        if before is None or oid in r.new_snapshots:
            continue
        known = {c["name"] for c in before.columns}
        names = [
            c["name"]
            for c in info.columns
            if c["name"] not in known and c.get("missing") is not None
        ]
        if names:
            out[oid] = names
    return out


def _reshape_followed(spark: SparkSession, n: Names, r: _Run, existing: set[str]) -> None:
    """Rename and drop in the silver tables the columns the source renamed and dropped
    (``r.followed``): Delta's column mapping does both without rewriting a file. Before this
    run's rows are appended, which have the new names; a redo after a crash finds each done
    (a rename is made only while the old name is there and the new one is not)."""
    for oid, f in sorted(r.followed.items()):
        info = r.tables[oid]
        if f.problem or not (f.renamed or f.dropped) or info.silver_table.lower() not in existing:
            continue
        target = n.table(info.silver_table)
        before = r.tables_before.get(oid, info)
        if set(f.renamed.values()) & ({c["name"] for c in before.columns} - f.dropped):
            # a swap or a rotation of names: one rewrite, not a rename per commit
            order = [c["name"] for c in before.columns if c["name"] in f.renamed]
            why = rename_by_rewrite(spark, target, order, f.renamed)
            if why:
                error = ErrorRecord(oid, r.plan.f_to, SchemaIncompatible.__name__, why)
                r.layout_errors.append(error)
                r.errors.append(error)
                continue
            log.info(
                "silver: %s: columns renamed at the source (%s): renamed here too",
                info.qualified_name,
                ", ".join(f"{a} -> {b}" for a, b in sorted(f.renamed.items())),
            )
            r.reshaped.add(oid)
            continue
        path = delta_rs.table_dir(delta_rs.schema_dir(spark, n.schema), info.silver_table)
        done = None
        if delta_rs.usable(path):  # no Spark for a local table: a metadata commit of ours
            done = deletion_vectors.alter_columns(path, (), f.renamed, sorted(f.dropped))
        if done is not None:
            renamed, gone = done.renamed, done.dropped
        else:
            renamed, gone = reshape_columns(spark, target, f.renamed, sorted(f.dropped))
        for old in renamed:
            log.info(
                "silver: %s: column %s renamed to %s at the source: renamed here too",
                info.qualified_name,
                old,
                f.renamed[old],
            )
        if gone:
            log.info(
                "silver: %s: column(s) %s dropped at the source: dropped here too",
                info.qualified_name,
                ", ".join(gone),
            )
        if renamed or gone:
            r.reshaped.add(oid)


def _widen_followed(spark: SparkSession, n: Names, r: _Run, existing: set[str]) -> None:
    """Widen the silver columns whose type the source widened (``r.followed``, the entries
    of ``r.tables`` have the new types) where the Spark type changes (``integer`` to
    ``bigint``; ``varchar(10)`` to ``text`` stays a string): before this run's rows are
    appended, which have the new type."""
    for oid, f in sorted(r.followed.items()):
        info = r.tables[oid]
        if f.problem or not f.retyped or info.silver_table.lower() not in existing:
            continue
        types = {
            c["name"]: spark_type(pg_type_of(c)) for c in info.columns if c["name"] in f.retyped
        }
        widened = widen_columns(spark, n.table(info.silver_table), types)
        if widened:
            log.info(
                "silver: %s: column(s) %s widened at the source: silver's rows take the wider type",
                info.qualified_name,
                ", ".join(widened),
            )
            r.reshaped.add(oid)


def _restate_added(
    spark: SparkSession, n: Names, r: _Run, filled: dict[int, list[str]], existing: set[str]
) -> None:
    """The rows earlier runs wrote take the value of each column in ``filled`` (see
    ``silver.write.restate_added``), before this run's rows are appended or read back as
    previous images; a value that does not cast asks for a new snapshot instead."""
    for oid, names in filled.items():
        info = r.tables[oid]
        if info.silver_table.lower() not in existing:
            continue
        log.info(
            "silver: %s: column(s) %s added with a value for existing rows: the rows silver"
            " holds take it",
            info.qualified_name,
            ", ".join(names),
        )
        path = delta_rs.table_dir(delta_rs.schema_dir(spark, n.schema), info.silver_table)
        why = restate_added(spark, n.table(info.silver_table), info, names, r.plan.run, path)
        r.reshaped.add(oid)
        if why:
            error = ErrorRecord(oid, r.plan.f_to, SchemaIncompatible.__name__, why)
            r.layout_errors.append(error)
            r.errors.append(error)


def _run_batched(
    spark: SparkSession,
    cfg: Config,
    n: Names,
    r: _Run,
    work: list[int],
    existing: set[str],
    paths: dict[int, str | None],
    wal_diffs: Decoded,
    rows: dict[str, int],
    adjusted: list[tuple],
) -> list[int]:
    """The tables of ``work`` that :mod:`silver.batch` takes, run there (their rows counted in
    ``rows``, their errors in ``r.errors``, their adjustments in ``adjusted``); returns the
    others, in order."""
    only_changes = [
        oid
        for oid in work
        if oid in r.changed
        and oid not in r.copied
        and oid not in r.new_snapshots
        and oid not in r.truncate_at
        and r.tables[oid].silver_table.lower() in existing
    ]

    _add_columns(r, only_changes, paths)

    def takes(oid: int) -> bool:
        info, changes = r.tables[oid], r.change_rows.get(oid, 0)
        if oid in r.mixed_identities:
            return False  # its earlier rows are looked up whole (silver.identity)
        return batch.qualifies(info, paths[oid], changes, r.identity_keys.get(oid))

    chosen = [
        oid
        for oid, ok in zip(
            only_changes, concurrently(takes, only_changes, engine.current().workers), strict=True
        )
        if ok
    ]
    if not chosen:
        return work
    candidates = [
        batch.Candidate(
            r.tables[oid],
            lambda oid=oid: wal_diffs.good().where(F.col("table_oid") == oid),
            wal_diffs.rows_of(oid),
            paths[oid],
            r.identity_keys.get(oid),
        )
        for oid in chosen
    ]
    run = r.plan.run
    outcomes, _ = batch.run_batched(spark, candidates, run, cfg.source.name)
    for oid, outcome in outcomes.items():
        info = r.tables[oid]
        rows[info.qualified_name] = written(spark, n.table(info.silver_table), run, [outcome.rows])
        r.errors.extend(outcome.errors)
        adjusted += [(oid, *a) for a in outcome.adjusted]
    return [oid for oid in work if oid not in outcomes]


def _add_columns(r: _Run, oids: list[int], paths: dict[int, str | None]) -> None:
    """The columns the source added (NULL in the rows silver holds) added to the local silver
    tables of ``oids`` by a metadata commit (``core.deletion_vectors.alter_columns``), so their
    changes can take the driver's path; where that cannot, the per-table path's append adds
    them (Spark's schema evolution). Before anything of the run is appended; a redo finds
    them added."""
    for oid in oids:
        path, info = paths.get(oid), r.tables[oid]
        if not delta_rs.usable(path):
            continue
        have = {f.name.lower() for f in delta_rs.open_table(path).schema().fields}
        new = [c for c in info.columns if c["name"].lower() not in have]
        if not new:
            continue
        types = [(c["name"], delta_rs.delta_type(arrow_type(pg_type_of(c)))) for c in new]
        done = deletion_vectors.alter_columns(path, types)
        if done is not None and done.added:
            log.info("silver: %s: column(s) %s added", info.qualified_name, ", ".join(done.added))


def _run_first_snapshots(
    spark: SparkSession,
    cfg: Config,
    n: Names,
    r: _Run,
    work: list[int],
    existing: set[str],
    paths: dict[int, str | None],
    copy_widths: dict[int, tuple[int, int]],
    rows: dict[str, int],
    adjusted: list[tuple],
) -> list[int]:
    """The tables of ``work`` whose first snapshot :mod:`silver.first_load` takes (one at a
    time: each holds its rows in the driver), their rows counted in ``rows``, their errors in
    ``r.errors`` and adjustments in ``adjusted``; returns the others, in order."""
    bronze = bronze_dir(spark, cfg) if work else None
    literal = "'" + cfg.source.name.replace("'", "''") + "'"
    rest = []
    for oid in work:
        info = r.tables[oid]
        copy_width, width = copy_widths.get(oid, (0, -1))
        # A snapshot's copy records share its rewind's batch: a new snapshot without any in
        # the window is of an empty table, and takes this path too.
        if not (
            oid in r.new_snapshots
            and oid not in r.changed
            and oid not in r.truncate_at
            and copy_width == width
            and info.silver_table.lower() not in existing
        ):
            rest.append(oid)
            continue
        batches = info.snapshot_batches() or [-1]  # (an empty table's snapshot: no rows)
        where = (
            f"source = {literal} AND kind = 'copy' AND table_oid = {int(oid)}"
            f" AND batch_id IN ({', '.join(str(int(b)) for b in batches)})"
        )
        target = n.table(info.silver_table)
        try:
            done = first_snapshot(
                spark,
                info,
                bronze,
                where,
                target,
                paths[oid],
                width,
                cfg.source.name,
                r.plan.run,
                n.schema,
            )
        except Exception as exc:  # e.g. a value Arrow cannot hold: Spark can
            log.warning("%s: snapshot read by Spark (%s)", info.qualified_name, exc)
            done = None
        if done is None:
            rest.append(oid)
        else:
            rows[info.qualified_name] = done.rows
            r.errors.extend(done.errors)
            adjusted += [(oid, *a) for a in done.adjusted]
    return rest


def _commits(wal: Window) -> list[tuple[int, datetime]]:
    """The window's transactions (one read of each): commit LSN and commit time (UTC)."""
    out = []
    for m in wal.messages((message_type(MSG_COMMIT),)):
        at = decode(m["payload"]).commit_time + PG_EPOCH_US
        out.append((int(m["lsn"]), datetime.fromtimestamp(at / 1e6, UTC)))
    return out


def _write_run(
    spark: SparkSession,
    n: Names,
    source: str,
    r: _Run,
    work: list[int],
    adjusted: list[tuple],
    commits: list[tuple[int, datetime]],
) -> None:
    """The run's errors, adjustments, commits, Relations and tables (side by side where each
    is a Spark job: separate tables, each commit idempotent), then its ``_progress`` row."""
    run = r.plan.run
    writes = []
    if r.errors:
        writes.append(lambda: write_errors(spark, n, source, run, {**r.gone, **r.tables}, r.errors))
    if adjusted:
        writes.append(lambda: write_adjustments(spark, n, source, run, r.tables, adjusted))
    if commits:
        writes.append(lambda: write_commits(spark, n, source, run, commits))
    new = [(lsn, o, p) for lsn, o, p in r.window_relations if lsn >= r.plan.f_from]  # not re-read
    if new:
        relations = [(decode(p).relid, lsn, o, p) for lsn, o, p in new]
        writes.append(lambda: write_relations(spark, n, source, run, relations))
    writes.append(lambda: catalog.write_tables(spark, n, source, r.tables, r.tables_before))
    side_by_side(*writes, threads=delta_rs.bookkeeping_through_spark(spark, n.schema))
    # The tables whose silver state or errors this run changed: gold leaves the others alone.
    touched = set(work) | r.reshaped | {e.table_oid for e in r.errors if e.table_oid is not None}
    if r.plan.redo:
        # the crashed attempt may have reshaped a table (restated, renamed, dropped a column,
        # written _tables) that this attempt then finds done: gold looks at every table
        touched |= set(r.tables)
    touched = sorted(touched | {a[0] for a in adjusted})
    write_progress(spark, n, source, run, r.plan.f_to, r.plan.b_to, touched, r.plan.source_time)


def table_run(
    spark: SparkSession,
    cfg: Config,
    n: Names,
    info: TableInfo,
    diffs: TableDiffs,
    run: int,
    *,
    new_snapshot: bool,
    truncates: list[tuple[int, int]],
    snapshot_only: bool = False,
    identity_keys: tuple[int, ...] | None = None,
    identities: list[tuple[int, ...]] | None = None,
    exists: bool | None = None,
    path: str | None = None,
) -> tuple[int, list[ErrorRecord], list[tuple]]:
    """Cast, rewind, truncate, consolidate and append one table's diffs of this run
    (``snapshot_only``: its diffs are the rows of a new snapshot and nothing else).

    Usually in one pass: the rows the plain cast settles are rewound, consolidated and written,
    and that write counts the unsettled rows it left out. When there are some (values the plain
    cast does not settle, decode errors, records for the Python decoder), they are cast in full
    and written in a second append of the same run (its own Delta transaction id, so a repeated
    run skips each append it already made), with its rewinds. The two appends hold different
    (row, LSN) pairs: whether the plain cast settles a row depends only on its values' text,
    which is the same in a change and in the snapshot's COPY row (rows the Python decoder
    reads, with octal or hex escapes PostgreSQL's COPY never writes, are the exception: sums
    stay right, but such a row and a change of it at the same LSN can then be two rows). A
    table with truncates to apply, or with a type that has no plain cast, or with changes that
    need their previous images (``identity_keys``: the key positions of its REPLICA IDENTITY
    DEFAULT or USING INDEX, see :mod:`silver.identity`), is cast whole before anything is
    written.
    """
    target = n.table(info.silver_table)
    if exists is None:
        exists = catalog.table_exists(spark, target)
    if new_snapshot and exists:
        # Snapshotted again (a resync, or a table first read through the stream): the table is
        # rebuilt from this snapshot and the changes after it, with the columns and policies
        # of now. A crash before the run's _progress row redoes the same rebuild.
        drop_table(spark, n.schema, info.silver_table, target)
        exists = False
    resolving = identity_keys is not None
    names = [c["name"] for c in info.columns]
    distinct = snapshot_only and not truncates and distinct_snapshot(info.primary_key, names)
    one = None if truncates or resolving else cast_in_one_pass(info, diffs)
    if one is None:
        return _table_run_whole(
            spark,
            cfg,
            target,
            info,
            diffs,
            run,
            truncates,
            identity_keys,
            exists,
            path,
            identities,
            distinct,
        )
    data = data_columns(info)
    settled = consolidated(_rewound(info, one.rows, one.wal_rows), data, run, distinct=distinct)
    if not exists:
        create_diff_table(spark, target, settled.schema, info.primary_key)
    counts = [append_diffs(settled, target, cfg.source.name, run, new=not exists)]
    unsettled = one.finish(observed=counts[0] is not None)
    if unsettled is None:
        return written(spark, target, run, counts), [], []
    rows = consolidated(
        _rewound(info, unsettled.rows, unsettled.rows), data, run, distinct=distinct
    )
    counts.append(append_diffs(rows, target, cfg.source.name, run, unsettled=True, new=not exists))
    unsettled.unpersist()
    return written(spark, target, run, counts), unsettled.errors, unsettled.adjusted


def _rewound(info: TableInfo, rows: DataFrame, changes: DataFrame) -> DataFrame:
    return with_rewinds(rows, changes, data_columns(info), ROW_LSN, ROW_DIFF, _floor(info))


def _floor(info: TableInfo):
    """:func:`snapshot_floor` of the table's snapshot, its key column as silver names it now (a
    rename followed since the snapshot keeps the key's range)."""
    ranges = info.snapshot_ranges
    if ranges and ranges["key"] not in {c["name"] for c in info.columns}:
        if len(info.primary_key) != 1:
            # the key column went (a migration after every range: one between two attempts
            # starts the snapshot over), so the changes read without it are past every range
            return info.newest_snapshot_lsn
        ranges = {**ranges, "key": info.primary_key[0]}
    return snapshot_floor(info.snapshot_lsn, ranges)


def _table_run_whole(
    spark: SparkSession,
    cfg: Config,
    target: str,
    info: TableInfo,
    diffs: TableDiffs,
    run: int,
    truncates: list[tuple[int, int]],
    identity_keys: tuple[int, ...] | None,
    exists: bool,
    path: str | None,
    identities: list[tuple[int, ...]] | None = None,
    distinct: bool = False,
) -> tuple[int, list[ErrorRecord], list[tuple]]:
    """:func:`table_run` for a table cast whole before anything is written (``distinct``: its
    rows are a snapshot's, no two equal)."""
    resolving = identity_keys is not None
    cast = cast_diffs(info, diffs, changes=resolving)
    ok, errors = cast.rows, cast.errors
    if resolving:
        images = resolve_previous_images(
            ok,
            [c["name"] for c in info.columns],
            identity_keys,
            _prior(spark, target, path, ok.schema, [c["name"] for c in info.columns], run)
            if exists
            else None,
            _floor(info),
            truncates,
            identities,
        )
        ok = images.rows
        cast.cached += images.cached
        errors = errors + [
            ErrorRecord(info.oid, lsn, code, msg) for lsn, code, msg in images.errors
        ]
    data = data_columns(info)
    earlier = spark.table(target) if exists and truncates else None
    rewound = truncated(_rewound(info, ok, ok), data, truncates, earlier)
    out = consolidated(rewound, data, run, distinct=distinct)
    if not exists:
        create_diff_table(spark, target, out.schema, info.primary_key)
    appended = append_diffs(out, target, cfg.source.name, run, new=not exists)
    count = written(spark, target, run, [appended])
    cast.unpersist()
    return count, errors, cast.adjusted


def _prior(
    spark: SparkSession,
    target: str,
    path: str | None,
    typed: T.StructType,
    names: list[str],
    run: int,
) -> DataFrame:
    """The table's rows of the runs before ``run``: for a small local table, its columns
    ``names`` (typed as in ``typed``, the run's cast rows) and ``_diff`` read through delta-rs
    into Spark's memory; else a Spark scan."""
    if delta_rs.small(path, [*names, "_diff"]):
        fields = [typed[n] for n in names] + [T.StructField("_diff", T.LongType())]
        return delta_rs.read(spark, path, T.StructType(fields), f"_run < {int(run)}")
    earlier = spark.table(target).where(F.col("_run") < run)
    # A column added since those runs (followed, see capture.schema_changes) is NULL in them.
    have = set(earlier.columns)
    return earlier.select(
        *[
            F.col(quote(n)) if n in have else F.lit(None).cast(typed[n].dataType).alias(n)
            for n in names
        ],
        F.col("_diff"),
    )
