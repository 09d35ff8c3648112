"""Landing capture output in bronze: the snapshot as one commit, the stream in batches.

::

    capture_once ── retry transient errors with backoff ── record definite errors, raise
       │
       ├─ slot: must exist once bronze holds anything (else SlotMissing), created otherwise
       ├─ tables captured before that no longer exist ──> TableDropped error records
       ├─ published tables without a complete snapshot, or whose resync was requested
       │   (``pgmedallion resync``) since their last one ──> land_snapshot (one commit; a
       │   large keyed table in key ranges, a commit per wave, resumed where it stopped)
       └─ land_stream from bronze's frontier (or the slot's confirmed_flush_lsn)
            read ─> buffer ─> commit batch (with its progress record) ─> ack(frontier)
            triggered: until pg_current_wal_lsn() seen at the start; continuous: until stopped

Snapshot. The leader holds the exported snapshot's transaction open while one task per ctid
range imports the snapshot and streams its COPY rows straight into Arrow batches: a thread of
the capture process each where delta-rs writes bronze (each writes its Parquet file, read and
encoded mostly outside the GIL), one Spark task each where Spark does (``bronze.store``). The copy
rows, one ``schema`` record and one ``rewind`` record per table are a single Delta commit: a
table's snapshot is in bronze whole or not at all, and a crash before the commit simply means
the next run snapshots again at a new LSN (rewinds make any snapshot LSN correct). The leader
holds ``ACCESS SHARE`` on every table until the commit, as ``pg_dump`` does, so a table
present at the snapshot is copied whole; one already dropped is skipped with an ``error``
record, and the other tables go on. While the tasks run, a thread of the leader polls
``pg_stat_progress_copy`` for rows copied so far (``pgmedallion.capture.progress``).

Stream. The main slot exists before any snapshot is taken, so the stream always starts at or
before every snapshot LSN, which is what rewinds need. A batch is committed when it holds
enough messages or bytes, when the target is reached, on a stop request, and in continuous mode
every ``commit_interval_s`` while messages arrive (every ``idle_commit_interval_s`` when only
keepalives moved the frontier). Its ``progress`` record carries the frontier F (every
transaction committing below F is in bronze), and only after the commit is F acknowledged to
the slot. A batch may end inside a transaction (bounded memory for any transaction size): its
frontier is then the end of the last complete transaction, and silver reads only transactions
below the frontier, taking each commit LSN's messages from one run that reached its Commit.

Stopping and retrying. ``stop`` (a ``threading.Event``), ``max_seconds`` and, in the main
thread, SIGINT/SIGTERM end a run cleanly: the batch in hand is committed and acknowledged
first (a second signal aborts). Transient errors (connection refused or lost, walsender
terminated, server restart, slot in use) are retried with exponential backoff and one log line
each; every attempt resumes from bronze's frontier with a new ``run_id``. Definite errors are
written as ``error`` records (see ``pgmedallion.bronze.table``) and raised.

Why a capture job and not a Python streaming source
----------------------------------------------------
The preferred shape was a ``pyspark.sql.datasource`` streaming source feeding a streaming table
in the declarative pipeline, with Spark's checkpoint holding the offsets and ``commit(end)``
advancing the slot. What we measured with pyspark 4.2 and open-source Spark Declarative
Pipelines (see ``../shared/DESIGN.md``) rules it out for now:

- Python sources do not support ``Trigger.AvailableNow``: a triggered pipeline update is one
  micro-batch up to ``latestOffset``, and Spark calls ``commit(end)`` for it only at the start of
  the *next* update. The slot would be acknowledged one run late, so it would retain every
  change since the previous run for a whole schedule interval, and "writes only to an
  unpublished table" would reach the slot by the end of the next run, not this one.
- ``latestOffset`` must name the batch's end before anything is read. For the replication
  stream that means either reading ahead in the driver and holding the messages (unbounded
  memory for a large transaction) or handing a walsender connection to one partition, where a
  retried task re-reads from a slot that only one session may hold.
- ``spark-pipelines`` 4.2 exits 1 after "Run is COMPLETED" when Python source workers send
  observed metrics (``UNKNOWN_RESPONSE``, SPARK-59135, fixed upstream but not in a release
  that Delta supports); a local runner has to accept that response and judge the run by its
  events instead of its exit status.

A job with idempotent Delta commits keeps exactly-once without any of that: every batch is one
commit with ``txnAppId``/``txnVersion``, the slot is acknowledged right after the commit that
covers it, and the resume point is bronze's own frontier. Observed here: at the end of a
triggered run ``confirmed_flush_lsn`` equals bronze's frontier and is at or past the WAL
position seen at the run's start, even when only unpublished tables were written (then
``pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)`` was 56 bytes right after the run, in
``tests/test_capture_stream.py``); a Python source would hold everything since the previous
run instead. Killing the capture with SIGKILL mid-snapshot or mid-stream and rerunning loses
and duplicates nothing (``tests/test_capture_crash.py``). The snapshot ranges still run as
parallel Spark tasks, and bronze stays a plain Delta table that the declarative pipeline
reads as a streaming source.
"""

from __future__ import annotations

import json
import logging
import signal
import threading
import time
import uuid
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from typing import Any

import psycopg
from psycopg import sql

from pgmedallion.bronze.store import Bronze
from pgmedallion.bronze.table import (
    BronzeState,
)
from pgmedallion.capture.connection import connect, connect_replication
from pgmedallion.capture.error_records import error_lsn, record_error, table_name
from pgmedallion.capture.errors import (
    ColumnsAmbiguous,
    DefiniteError,
    PolicyNotApplicable,
    PublicationDropped,
    SlotCompacted,
    SlotInvalidated,
    SlotMissing,
    SnapshotWaiting,
    TableDropped,
    TimelineChanged,
    TransientError,
    server_errors,
)
from pgmedallion.capture.land_snapshot import land_snapshot
from pgmedallion.capture.land_stream import awaited, land_stream
from pgmedallion.capture.options import (
    CaptureOptions,
    CaptureResult,
    CaptureTarget,
    RetryPolicy,
    StreamLimits,
    StreamResult,
    bronze_of,
    capture_needs_spark,
    capture_target,
)
from pgmedallion.capture.pgoutput import Relation, format_lsn
from pgmedallion.capture.published import Published, Shape
from pgmedallion.capture.published import published as published_shapes
from pgmedallion.capture.schema_changes import (
    ERROR,
    RESYNC,
    Catalog,
    by_position,
    catalog_of,
    changes,
)
from pgmedallion.capture.slot import (
    START_OVER,
    SlotState,
    continues_recorded,
    current_wal_lsn,
    drop_invalidated_slot,
    ensure_slot,
    identify_system,
    missing_slot,
    require_wal_past,
    slot_state,
    starts_afresh,
    wants_failover,
)
from pgmedallion.capture.snapshot import (
    PublishedTable,
    leaf_partitions,
    publication_tables,
)

log = logging.getLogger(__name__)

__all__ = [
    "CaptureOptions",
    "CaptureResult",
    "CaptureTarget",
    "RetryPolicy",
    "StreamLimits",
    "bronze_of",
    "capture_needs_spark",
    "capture_once",
    "capture_target",
    "land_snapshot",
    "land_stream",
]


RECORDED_ERRORS = (
    PublicationDropped,
    SlotMissing,
    SlotInvalidated,
    SlotCompacted,
    TimelineChanged,
    TableDropped,
)
"""Definite errors that are facts about the source's data, kept in bronze as error records.
(A slot with another plugin is a configuration problem: raised, never recorded.)"""


@dataclass
class _Totals:
    """What the attempts of one run landed so far."""

    snapshotted: dict[str, int] = field(default_factory=dict)
    snapshot_lsn: int | None = None
    stream: StreamResult = field(default_factory=StreamResult)
    table_errors: dict[str, str] = field(default_factory=dict)
    retries: int = 0
    deferred: list[str] = field(default_factory=list)


@dataclass
class _Run:
    """One capture run, across its attempts."""

    options: CaptureOptions
    """With ``stop`` set to the run's event."""
    end_at: float | None
    totals: _Totals = field(default_factory=_Totals)
    expected: dict[int, PublishedTable] = field(default_factory=dict)
    """Tables being snapshotted: an attempt that fails on one still knows it was wanted."""
    halted_on: set[tuple[int, tuple[str, ...], str]] = field(default_factory=set)
    """``(table OID, column names, baseline)`` of the Relations a stream stopped before (each
    once per baseline catalog)."""
    reordered: dict[int, tuple[str, ...]] = field(default_factory=dict)
    """Table OID -> the column names of a Relation the stream stopped before because they came
    in another order than the catalog's (renamed since): the next look checks the catalog
    shows that order (:func:`_renamed_back`)."""
    ranges_at_start: int | None = None
    """Key ranges in bronze when the current attempt began (``Bronze.ranges_landed``)."""

    @property
    def stop(self) -> threading.Event:
        assert self.options.stop is not None
        return self.options.stop


def _record_followed(
    bronze: Bronze,
    target: CaptureTarget,
    survey: _Survey,
    state: BronzeState,
    moved: Mapping[int, str],
    also: Mapping[int, str] | None = None,
) -> bool:
    """Record each schema change capture follows without a new snapshot (``changes``'
    ``followed``) since the table's baseline (its newest record, or its snapshot's catalog:
    :func:`_baselines`), with the catalog as capture sees it now, at bronze's frontier: silver
    follows that record, and ``status`` says what was followed and when. A value for existing
    rows the catalog no longer holds (a rewrite since cleared it) is carried over from the
    baseline. ``also``: tables whose catalog is recorded whatever changed, and why (see
    :func:`_renamed_back`). Returns whether it recorded any."""
    wanted = sorted(oid for oid in survey.catalogs if oid in state.snapshots and oid not in moved)
    if not wanted:
        return False
    recorded = bronze.snapshot_schemas(wanted)
    baselines = _baselines(bronze, recorded)
    new = []
    for oid, record in recorded.items():
        lsn, schema, name = state.snapshots[oid]
        if target.on_schema_change(f"{schema}.{name}") == RESYNC:
            continue  # every change resyncs the table (its reason is recorded with it)
        then = baselines[oid]
        if then is None:
            continue
        now = survey.catalogs[oid].keeping_missing(then)
        found = changes(then, now, Catalog.from_record(record.get("catalog"))).followed
        if not found and also and oid in also:
            found = [also[oid]]
        for change in found:
            log.info("%s.%s: %s: followed", schema, name, change)
            new.append((oid, schema, name, change, lsn, now.to_record()))
    if new:
        bronze.record_followed(new, state.frontier or 0)
    return bool(new)


def _changed_since_snapshot(
    bronze: Bronze, target: CaptureTarget, survey: _Survey, captured: dict[int, tuple[str, str]]
) -> dict[int, str]:
    """The captured tables that must be snapshotted again, and why: their leaf partitions
    (attached or detached without a change message), their shape (``capture.published``: the
    publication's column list or row filter, a column policy, the hash key) or their columns
    (``capture.schema_changes``, as the table's ``on_schema_change`` policy decides) are not
    those their newest snapshot recorded."""
    wanted = sorted(
        oid
        for oid in captured
        if oid in survey.shapes or oid in survey.leaves or oid in survey.catalogs
    )
    moved = {}
    recorded = bronze.snapshot_schemas(wanted)
    baselines = _baselines(bronze, recorded)
    for oid, record in recorded.items():
        if oid in survey.leaves and tuple(record.get("partitions", ())) != survey.leaves[oid]:
            moved[oid] = "partitions attached or detached"
            continue
        why = []
        if oid in survey.shapes:
            why.append(_reshaped(target, captured[oid], survey.shapes[oid], record))
        if oid in survey.catalogs:
            why.append(
                _migrated(target, captured[oid], survey.catalogs[oid], baselines[oid], record)
            )
        if any(why):
            moved[oid] = "; ".join(w for w in why if w)
    for table in survey.published:
        renamed = _renamed(target, captured.get(table.oid), table)
        if renamed:
            moved[table.oid] = "; ".join(w for w in (moved.get(table.oid), renamed) if w)
    return moved


def attnum_order(catalog: Catalog, names: Collection[str]) -> list[str]:
    """The live columns of ``catalog`` among ``names``, in attnum order (a Relation's)."""
    wanted = set(names)
    return [
        c.name
        for c in sorted(catalog.columns, key=lambda c: c.attnum)
        if not c.dropped and c.name in wanted
    ]


def catalog_names(catalog: Catalog) -> list[str]:
    return [c.name for c in catalog.columns if not c.dropped]


def _ambiguous_under_error(
    bronze: Bronze, target: CaptureTarget, survey: _Survey, captured: dict[int, tuple[str, str]]
) -> dict[int, str]:
    """The tables under ``on_schema_change = "error"`` whose columns were renamed since the
    catalog capture compared so that their names no longer tell them apart in the stream
    (``Changes.ambiguous``), and which: each becomes a ``ColumnsAmbiguous`` error, which holds
    its table, since read by their names its Relations would put values in the wrong
    columns."""
    wanted = sorted(
        oid
        for oid in survey.catalogs
        if oid in captured and target.on_schema_change(".".join(captured[oid])) == ERROR
    )
    if not wanted:
        return {}
    recorded = bronze.snapshot_schemas(wanted)
    baselines = _baselines(bronze, recorded)
    out = {}
    for oid, record in recorded.items():
        then = baselines.get(oid)
        if then is None:
            continue
        found = changes(then, survey.catalogs[oid], Catalog.from_record(record.get("catalog")))
        if found.ambiguous:
            out[oid] = "; ".join(found.ambiguous)
    return out


def _read_by_position(
    bronze: Bronze, recorded: Mapping[int, dict], baselines: Mapping[int, Catalog]
) -> set[int]:
    """The tables silver reads every Relation of by position, not by names: a catalog
    recorded since the snapshot, and no column added or dropped since (see
    ``silver.catalog._by_position``; not a partitioned table)."""
    snapshots = bronze.state().snapshots
    followed = bronze.followed_catalogs(list(recorded))
    out = set()
    for oid, record in recorded.items():
        snapshot = Catalog.from_record(record.get("catalog"))
        now = baselines.get(oid)
        lsn, _ = followed.get(oid, (None, None))
        if snapshot is None or now is None or oid not in snapshots or snapshots[oid][0] != lsn:
            continue
        if by_position(snapshot, now):
            out.add(oid)
    return out


def _renamed_back(
    bronze: Bronze,
    target: CaptureTarget,
    survey: _Survey,
    captured: dict[int, tuple[str, str]],
    run: _Run,
) -> tuple[dict[int, str], dict[int, str]]:
    """What to do for the tables whose stream brought a Relation naming their columns in
    another order than the catalog capture compared (:func:`_unchecked_columns`), when the
    catalog now does not show that order either: a Relation from before renames capture has
    recorded, or columns renamed, rows written and renamed again before capture looked (a
    swap and a swap back). Names cannot tell which column such a Relation meant; positions
    can while no column was added or dropped since the snapshot (``by_position``), so the
    catalog is recorded and silver reads the table by position (``follow``: values stay with
    their column) or checks every Relation's order against its columns (``error``: another
    order is ``SchemaIncompatible``). The second mapping: tables to record, and why. The
    first: tables snapshotted again, and why: the other tables, under every policy (read by
    its names, such a Relation would put values in the wrong columns without a word)."""
    resync, record = {}, {}
    wanted = sorted(oid for oid in run.reordered if oid in survey.catalogs and oid in captured)
    if not wanted:
        return resync, record
    recorded = bronze.snapshot_schemas(wanted)
    positional = _read_by_position(bronze, recorded, _baselines(bronze, recorded))
    for oid in wanted:
        names, catalog = run.reordered[oid], survey.catalogs[oid]
        if attnum_order(catalog, names) == [n for n in names if n in set(catalog_names(catalog))]:
            continue  # the catalog shows the Relation's order: recorded as followed now
        snapshot = Catalog.from_record((recorded.get(oid) or {}).get("catalog"))
        policy = target.on_schema_change(".".join(captured[oid]))
        if policy != RESYNC and snapshot is not None and by_position(snapshot, catalog):
            if oid not in positional:
                record[oid] = "a Relation named the columns in another order: read by position"
            continue
        resync[oid] = (
            "columns renamed while the stream ran and renamed again before capture looked"
            " (their order in a Relation message is not the catalog's)"
        )
    return resync, record


def _renamed(target: CaptureTarget, then: tuple[str, str] | None, now: PublishedTable) -> str:
    """Why a table renamed (or moved to another schema) since its snapshot is snapshotted
    again: silver and gold then take its new name ("": not renamed, or its policy is
    ``error``, under which its tables keep the old name)."""
    if then is None or then == (now.schema, now.name):
        return ""
    old, new = ".".join(then), f"{now.schema}.{now.name}"
    if old in target.pii and new not in target.pii:
        # its snapshot under the new name would not find the column policies: fail closed
        raise PolicyNotApplicable(
            f'table {old} was renamed to {new}; its column policies ([tables."{old}"]) '
            f'must be named [tables."{new}"] before it is captured again'
        )
    if target.on_schema_change(old) == ERROR:
        return ""
    return f"table renamed from {old} to {new}"


def _migrated(
    target: CaptureTarget,
    table: tuple[str, str],
    catalog: Catalog,
    then: Catalog | None,
    record: Mapping,
) -> str:
    """Why a schema change since ``then`` (the catalog of ``table``'s snapshot, or as capture
    last recorded following a change since it) needs a new snapshot under its
    ``on_schema_change`` policy ("": none does; see ``capture.schema_changes``)."""
    if then is None:  # a snapshot taken before snapshots recorded the catalog
        return ""
    snapshot = Catalog.from_record(record.get("catalog"))
    found = changes(then, catalog, snapshot)
    return found.resync_reason(target.on_schema_change(".".join(table)))


def _baselines(bronze: Bronze, recorded: Mapping[int, dict]) -> dict[int, Catalog | None]:
    """The catalog each table's columns are compared with, by OID (``recorded``: its newest
    snapshot's record): as capture saw it when it last followed a change since that snapshot,
    else the snapshot's own. A column added after the snapshot is in the former, so renaming
    or retyping it later is a change (the snapshot's catalog never knew the column: there it
    looks like an addition). None: a snapshot taken before snapshots recorded the catalog."""
    snapshots = bronze.state().snapshots
    followed = bronze.followed_catalogs(list(recorded))
    out = {}
    for oid, record in recorded.items():
        snapshot_lsn, catalog = followed.get(oid, (None, None))
        current = oid in snapshots and snapshots[oid][0] == snapshot_lsn
        out[oid] = Catalog.from_record(catalog if current else record.get("catalog"))
    return out


def _reshaped(
    target: CaptureTarget, table: tuple[str, str], publication: Published, record: dict
) -> str:
    """What of ``table``'s (schema, name) shape changed since its snapshot's ``record``, by its
    publication entry and ``target``'s column policies now ("": nothing)."""
    now = Shape.of(publication, target.pii.get(".".join(table), {}), target.hash_key)
    changes = now.changes(Shape.from_record(record.get("shape")))
    return " and ".join(changes) + " changed" if changes else ""


def _dropped_tables(conn: psycopg.Connection, oids: Sequence[int]) -> list[int]:
    """The OIDs among ``oids`` that no longer exist (pg_relation_size reads the catalog now)."""
    if not oids:
        return []
    with server_errors():
        rows = conn.execute(
            sql.SQL(
                "SELECT oid::int8 FROM unnest(ARRAY[{}]::oid[]) AS t(oid)"
                " WHERE pg_relation_size(oid) IS NULL"
            ).format(sql.SQL(", ").join(sql.Literal(int(oid)) for oid in oids))
        ).fetchall()
    return [oid for (oid,) in rows]


@contextmanager
def stop_on_signals(
    stop: threading.Event, doing: str = "committing the current batch, then stopping"
) -> Iterator[None]:
    """In the main thread, let SIGINT/SIGTERM set ``stop`` (logging ``doing``); a second one
    acts as usual."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous: dict[int, Any] = {}

    def handler(signum: int, _frame: Any) -> None:
        log.warning("%s: %s (again to abort)", signal.Signals(signum).name, doing)
        stop.set()
        signal.signal(signum, previous[signum])

    for signum in (signal.SIGINT, signal.SIGTERM):
        previous[signum] = signal.signal(signum, handler)
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)


def capture_once(
    bronze: Bronze, target: CaptureTarget, options: CaptureOptions | None = None
) -> CaptureResult:
    """One capture run: provision the slot, snapshot new tables, stream.

    Triggered by default (stream until caught up with the WAL position seen at the start);
    ``options.continuous`` streams until ``stop`` is set, ``max_seconds`` pass or a signal
    arrives, snapshotting tables published meanwhile. Transient errors are retried per
    ``options.retry``; definite ones are recorded in bronze and raised. A table dropped before
    its snapshot is recorded and reported in ``table_errors`` without stopping the others.
    ``bronze``: :func:`bronze_of` opens it (with Spark, or without it by delta-rs).
    """
    options = options or CaptureOptions()
    stop = options.stop or threading.Event()
    end_at = None if options.max_seconds is None else time.monotonic() + options.max_seconds
    run = _Run(replace(options, stop=stop), end_at)
    totals, retry = run.totals, options.retry
    failures = 0
    with stop_on_signals(stop) if options.handle_signals else nullcontext():
        while True:
            run_id = uuid.uuid4().hex
            landed_before = (totals.stream.frontier, totals.stream.batches, len(totals.snapshotted))
            try:
                again = _attempt(bronze, target, run, run_id)
            except DefiniteError as exc:
                if isinstance(exc, RECORDED_ERRORS):
                    record_error(bronze, exc, lsn=error_lsn(bronze), run_id=run_id)
                raise
            except TransientError as exc:
                landed = (totals.stream.frontier, totals.stream.batches, len(totals.snapshotted))
                progressed = landed != landed_before or _landed_waves(bronze, run)
                failures = 1 if progressed else failures + 1
                delay = retry.delay_s(failures)
                out_of_time = end_at is not None and time.monotonic() + delay > end_at
                if failures >= retry.attempts or stop.is_set() or out_of_time:
                    log.error("capture %s: giving up after %d attempt(s)", target.source, failures)
                    raise
                totals.retries += 1
                log.warning(
                    "capture %s: %s; retry %d of %d in %.1f s",
                    target.source,
                    exc,
                    failures,
                    retry.attempts - 1,
                    delay,
                )
                if stop.wait(delay):
                    raise
                continue
            failures = 0
            if not again or stop.is_set():
                break
    stream = totals.stream
    return CaptureResult(
        snapshotted=totals.snapshotted,
        snapshot_lsn=totals.snapshot_lsn,
        messages=stream.messages,
        frontier=stream.frontier or 0,
        batches=stream.batches,
        table_errors=totals.table_errors,
        retries=totals.retries,
        deferred=sorted(set(totals.deferred)),
        bronze=bronze,
    )


def _landed_waves(bronze: Bronze, run: _Run) -> bool:
    """Whether the failed attempt landed key ranges (``capture.ranges``): it got further, so
    the count of failed attempts starts again."""
    if run.ranges_at_start is None:
        return False
    try:
        return bronze.refresh().ranges_landed() > run.ranges_at_start
    except Exception as exc:  # bronze unreadable now: the attempt's own error is the news
        log.debug("capture: bronze's ranges not read: %s", exc)
        return False


def _attempt(bronze: Bronze, target: CaptureTarget, run: _Run, run_id: str) -> bool:
    """One attempt: slot, dropped tables, snapshot, stream. True: new tables, go again."""
    options, totals, stop = run.options, run.totals, run.stop
    state: BronzeState | None = bronze.refresh().state()
    run.ranges_at_start = bronze.ranges_landed()  # (the records state() just read)
    captured = {oid: (schema, name) for oid, (_, schema, name) in state.snapshots.items()}
    if _provide_slot(bronze, target, state, awaited(state, run.options.tables or ())):
        state = bronze.refresh().state()  # a gap, or a new server, took a batch id
    survey = _survey(target, captured, run.expected)
    resync = state.resync
    renamed_back, positional = _renamed_back(bronze, target, survey, captured, run)
    moved = {  # a request already pending is not made again (each would be a bronze batch)
        oid: why
        for oid, why in {
            **renamed_back,
            **_changed_since_snapshot(bronze, target, survey, captured),
        }.items()
        if oid not in state.resync
    }
    if moved:
        # these tables' rows changed without change messages: snapshot them again (a durable
        # request, so a crash before the snapshot still does it)
        for oid, why in sorted(moved.items()):
            log.info("%s: %s: snapshotting it again", ".".join(captured[oid]), why)
        bronze.request_resync(
            [(oid, *captured[oid]) for oid in moved], state.frontier or 0, reasons=moved
        )
        resync = resync | set(moved)
    published = {t.oid: t for t in survey.published}
    held = False
    for oid, why in _ambiguous_under_error(bronze, target, survey, captured).items():
        if oid not in published:
            continue
        table = published[oid]
        error = ColumnsAmbiguous(
            f'table {table_name(table)}: {why}; under on_schema_change = "error" nothing is'
            f" followed: `pgmedallion resync {table_name(table)}` snapshots it again"
        )
        since = state.snapshots[oid][0]
        lsn = max(state.frontier or 0, since)  # the misread Relations come after it
        if record_error(bronze, error, lsn=lsn, run_id=run_id, table=table, since=since):
            totals.table_errors[table_name(table)] = str(error)
            held = True
    followed = _record_followed(bronze, target, survey, state, moved, positional)
    run.reordered.clear()  # (only once both are durable: a retried attempt looks again)
    for table in survey.gone:
        error = TableDropped(f"table {table_name(table)} (oid {table.oid}) was dropped")
        if record_error(bronze, error, lsn=survey.noticed_at, run_id=run_id, table=table):
            totals.table_errors[table_name(table)] = str(error)
        run.expected.pop(table.oid, None)
    if moved or survey.gone or followed or held:
        state = None  # a resync request, an error or a schema change record took a batch id
    wanted = set(options.tables or ())

    def is_wanted(table: PublishedTable) -> bool:
        return not wanted or f"{table.schema}.{table.name}" in wanted

    published = [t for t in survey.published if is_wanted(t)]
    pending = [t for t in published if t.oid not in captured or t.oid in resync]
    deferred: set[int] = set()
    snapshotted = False
    if pending and not stop.is_set():
        try:
            _snapshot(bronze, target, run, run_id, pending)
            state = None  # the snapshot added a batch
            snapshotted = True
        except SnapshotWaiting as exc:
            names = ", ".join(table_name(t) for t in pending)
            for t in pending:
                run.expected.pop(t.oid, None)
            run.totals.deferred.extend(table_name(t) for t in pending)
            if any(t.oid in captured for t in pending):
                # a table snapshotted again waits for it before its changes are read on (they
                # may not follow its old columns): the others' changes wait with them; a
                # continuous capture tries again (and waits again) in its next attempt
                log.warning("capture: snapshot of %s: %s; nothing more is captured now", names, exc)
                return options.continuous and not stop.is_set()
            log.warning("capture: snapshot of %s: %s; the other tables go on", names, exc)
            deferred = {t.oid for t in pending}
    if stop.is_set():
        return False
    watched = {t.oid for t in published} - deferred  # continuous: a deferred one is tried again
    if snapshotted or (state is not None and state.frontier is None):
        # the stream's frontier lands after a snapshot even if nothing of ours came since:
        # silver's frontier then passes the snapshot in this run
        limits = replace(options.limits, idle_commit_bytes=0)
        options = replace(options, limits=limits)

    def new_tables(current: list[PublishedTable]) -> bool:
        """Continuous mode, now and then: tables to snapshot first (new, reshaped, or asked
        for since this attempt began: by silver, or by ``pgmedallion resync``)."""
        if any(t.oid not in watched and is_wanted(t) for t in current):
            return True
        asked = bronze.refresh().state().resync
        if any(t.oid in asked and is_wanted(t) for t in current):
            return True
        return _reshaped_meanwhile(bronze, target, _captured(bronze))

    remaining = None if run.end_at is None else max(0.0, run.end_at - time.monotonic())
    stream = land_stream(
        bronze,
        target,
        replace(options, max_seconds=remaining),
        run_id=run_id,
        new_tables=new_tables,
        result=totals.stream,
        state=state,
        unchecked=_unchecked_columns(bronze, target, run, watched, survey.shapes),
    )
    again = stream.new_tables
    stream.new_tables = False
    if not again and not stop.is_set() and _reshaped_meanwhile(bronze, target, _captured(bronze)):
        again = True  # the next attempt snapshots them before silver reads this stream
    return again


def _unchecked_columns(
    bronze: Bronze, target: CaptureTarget, run: _Run, watched: set[int], shapes: Mapping
) -> Callable[[Relation], bool]:
    """Whether the stream must stop before a Relation message that names a column the catalog
    capture compared (the baseline of :func:`_baselines`, current as this attempt streams) did
    not have, gives one another type, or lacks one it had and publishes. The DDL then came
    after this attempt's look at the catalog, and what silver does with it (NULL or the default
    in the rows from before a new column, a rename, a drop, a widening) is recorded only by a
    look: the next attempt looks again before the message lands (the next session sends it
    again). Once per table and columns."""
    recorded = bronze.snapshot_schemas(sorted(watched))
    baselines = {
        oid: catalog for oid, catalog in _baselines(bronze, recorded).items() if catalog is not None
    }
    fingerprints = {
        oid: json.dumps(catalog.to_record(), sort_keys=True) for oid, catalog in baselines.items()
    }

    def published_names(oid: int, relation: Relation) -> tuple[set[str], set[str]]:
        """The baseline's live columns, and those of them the stream must carry."""
        catalog = baselines[oid]
        shape = shapes.get(oid)
        listed = None if shape is None or shape.columns is None else set(shape.columns)
        rules = target.pii.get(f"{relation.namespace}.{relation.name}", {})
        live = {c.name for c in catalog.columns if not c.dropped}
        sent = {
            c.name
            for c in catalog.columns
            if not c.dropped
            and rules.get(c.name) != "exclude"
            and (c.name in listed if listed is not None else not c.generated)
        }
        return live, sent

    def unchecked(relation: Relation) -> bool:
        if relation.relid not in baselines:
            return False
        live, sent = published_names(relation.relid, relation)
        names = {c.name for c in relation.columns}
        typed = {
            c.name: (c.type_oid, c.typmod)
            for c in baselines[relation.relid].columns
            if not c.dropped
        }
        rules = target.pii.get(f"{relation.namespace}.{relation.name}", {})
        retyped = {  # (a column with a policy lands rewritten: a hashed one as text)
            c.name
            for c in relation.columns
            if c.name in live
            and c.name not in rules
            and typed[c.name] != (c.type_oid, c.type_modifier)
        }
        # the same names in another order: renamed (a swap) since capture's look
        listed = [c.name for c in relation.columns if c.name in live]
        order = attnum_order(baselines[relation.relid], names)
        reordered = {a for a, b in zip(listed, order, strict=False) if a != b}
        moved = tuple(sorted((names - live) | (sent - names) | retyped | reordered))
        # once per baseline: a later migration that moves the same names (a column dropped,
        # then one added under its name) is looked at again
        seen = (relation.relid, moved, fingerprints[relation.relid])
        if not moved or seen in run.halted_on:
            return False
        run.halted_on.add(seen)
        if reordered:
            run.reordered[relation.relid] = tuple(c.name for c in relation.columns)
        log.info(
            "%s.%s: column(s) %s not as capture last compared the catalog: looking at it"
            " before the stream goes on",
            relation.namespace,
            relation.name,
            ", ".join(moved),
        )
        return True

    return unchecked


def _captured(bronze: Bronze) -> dict[int, tuple[str, str]]:
    """OID -> (schema, name) as each captured table's newest snapshot recorded them."""
    return {oid: (schema, name) for oid, (_, schema, name) in bronze.state().snapshots.items()}


def _reshaped_meanwhile(
    bronze: Bronze, target: CaptureTarget, captured: dict[int, tuple[str, str]]
) -> bool:
    """Whether a captured table's shape changed while the stream ran (an ``ALTER
    PUBLICATION`` then sits in what was just landed), or its catalog needs a new snapshot or a
    record of a followed change. Tables are named as their snapshot recorded them, as
    :func:`_changed_since_snapshot` names them."""
    conn = connect(target.conninfo)
    try:
        shapes = published_shapes(conn, target.publication, list(captured))
        catalogs = _landed_catalogs(conn, target, captured, sorted(captured), shapes)
    finally:
        conn.close()
    recorded = bronze.snapshot_schemas(sorted(set(shapes) | set(catalogs)))
    baselines = _baselines(bronze, {oid: recorded[oid] for oid in catalogs if oid in recorded})
    return any(
        _reshaped(target, captured[oid], shapes[oid], recorded[oid])
        for oid in shapes
        if oid in recorded
    ) or any(
        _migrated(target, captured[oid], catalogs[oid], baselines[oid], recorded[oid])
        or (oid in shapes and _unrecorded(catalogs[oid], baselines[oid], recorded[oid]))
        for oid in catalogs
        if oid in recorded
    )


def _unrecorded(catalog: Catalog, then: Catalog | None, record: Mapping) -> bool:
    """Whether the catalog holds a change capture follows (``changes``' ``followed``) that no
    record has yet: the next attempt records it before its stream (silver and gold follow the
    record; a ``DROP NOT NULL`` or a rename with no row changed shows in no Relation)."""
    if then is None:
        return False
    return bool(changes(then, catalog, Catalog.from_record(record.get("catalog"))).followed)


def _provide_slot(
    bronze: Bronze, target: CaptureTarget, state: BronzeState, pending: set[int]
) -> bool:
    """The main slot, created if bronze holds nothing yet (a failover slot where
    ``[source] failover_slot`` wants one); bronze relies on it otherwise. A slot lost (dropped,
    invalidated) while bronze holds something is created again only once no table needs the
    changes it held (every table ``pending`` a snapshot this run takes:
    :func:`pgmedallion.capture.slot.starts_afresh`, ``pgmedallion resync --all``); else the
    loss is a definite error that names that way back. The same for a server that does not
    continue bronze's WAL (:func:`_adopt_server`). Returns whether it wrote to bronze."""
    repl = connect_replication(target.conninfo)
    try:
        failover = wants_failover(target.failover_slot, repl.info.server_version)
        lost = None
        if state.frontier is not None or state.snapshots:
            try:
                slot_state(repl, target.slot)
            except (SlotMissing, SlotInvalidated) as exc:
                _recreate_lost_slot(repl, bronze, target, state, pending, exc)
                lost = exc
        slot = ensure_slot(repl, target.slot, failover)
        if lost is not None:
            # what bronze never read: after its frontier (or, before any stream, its newest
            # snapshot) and before the new slot
            since = state.frontier
            if since is None:
                since = max(lsn for lsn, _, _ in state.snapshots.values()) + 1
            bronze.record_gap(since, slot.confirmed_flush_lsn or since, f"{lost.code}: {lost}")
        adopted = _adopt_server(repl, bronze, state, pending, slot)
        if failover and slot.failover is False:
            log.warning(
                "replication slot %s is not a failover slot: a standby does not keep it, so"
                " capture cannot go on after a failover (`pgmedallion doctor` says how to make"
                " it one)",
                target.slot,
            )
        return lost is not None or adopted
    finally:
        repl.close()


def _adopt_server(
    repl: psycopg.Connection,
    bronze: Bronze,
    state: BronzeState,
    pending: set[int],
    slot: SlotState,
) -> bool:
    """A server that does not continue bronze's WAL (another system, a timeline that branched
    off before bronze's frontier: :class:`TimelineChanged`) is taken as the source when every
    table waits for a snapshot this run takes from it (``resync --all``) and its WAL is past
    bronze's frontier: its identity is recorded before the snapshots (a progress record at the
    frontier, so a run stopped after them still knows it), with the gap. Else the error is
    raised before anything is read. Returns whether it was adopted."""
    frontier = state.frontier
    if frontier is None or state.system_identity is None:
        return False
    system = identify_system(repl)
    try:
        continues_recorded(repl, state.system_identity, frontier, system)
        return False
    except TimelineChanged as exc:
        lost = exc
    snapshots = {oid: lsn for oid, (lsn, _, _) in state.snapshots.items()}
    if not starts_afresh(snapshots, pending, bronze.dropped_tables()):
        _name_blockers(bronze, state, pending)
        raise lost
    require_wal_past(repl, frontier, lost)
    identity = {"system_id": system.system_id, "timeline": system.timeline}
    bronze.record_server(frontier, identity)
    resume = max(frontier, slot.confirmed_flush_lsn or 0)
    if resume not in {to for _, to, _ in bronze.gaps()}:
        bronze.record_gap(frontier, resume, f"{lost.code}: {lost}")
    log.warning(
        "%s; every table is snapshotted again from this server, so capture goes on with it"
        " (recorded as a gap)",
        lost,
    )
    return True


def _name_blockers(bronze: Bronze, state: BronzeState, pending: set[int]) -> None:
    """Where some tables wait for a new snapshot but not all, say which ones keep the way back
    closed (a table captured before and left out of ``[source] tables`` is not snapshotted by
    this run, so ``resync --all`` does not reach it)."""
    dropped = bronze.dropped_tables()
    left = sorted(
        f"{schema}.{name}"
        for oid, (_, schema, name) in state.snapshots.items()
        if oid not in pending and oid not in dropped
    )
    if pending and left:
        log.warning(
            "not every table is to be snapshotted again by this run, so the slot is not made"
            " anew: %s (add it back to [source] tables, or run `pgmedallion resync --all`)",
            ", ".join(left),
        )


def _recreate_lost_slot(
    repl: psycopg.Connection,
    bronze: Bronze,
    target: CaptureTarget,
    state: BronzeState,
    pending: set[int],
    lost: SlotMissing | SlotInvalidated,
) -> None:
    """Make way for a new slot where the one bronze read through is gone: only when every
    table is to be snapshotted again (at the new slot, so after everything it missed) and the
    server's WAL is past bronze's frontier (a new slot's LSNs go on from bronze's). Otherwise
    raise the loss, naming the way back."""
    frontier = state.frontier
    snapshots = {oid: lsn for oid, (lsn, _, _) in state.snapshots.items()}
    if not starts_afresh(snapshots, pending, bronze.dropped_tables()):
        _name_blockers(bronze, state, pending)
        held = "snapshots" if frontier is None else f"changes up to {format_lsn(frontier)}"
        if isinstance(lost, SlotInvalidated):
            raise SlotInvalidated(
                f"{lost}, but bronze holds {held} read through it: changes since are lost;"
                f" {START_OVER}"
            ) from None
        raise missing_slot(lost, held, identify_system(repl), state.system_identity) from None
    require_wal_past(repl, frontier, lost)
    if isinstance(lost, SlotInvalidated):
        drop_invalidated_slot(repl, target.slot)
    log.warning(
        "%s: every table is snapshotted again, so a new slot %s takes its place (changes after"
        " bronze's frontier %s and before the new snapshots are not read; the gap is recorded)",
        lost,
        target.slot,
        "none" if frontier is None else format_lsn(frontier),
    )


@dataclass(frozen=True)
class _Survey:
    """The source as an attempt finds it."""

    published: list[PublishedTable]
    gone: list[PublishedTable]
    """Tables captured (or being snapshotted) that no longer exist."""
    noticed_at: int
    """The WAL position where ``gone`` was noticed (0: nothing gone)."""
    leaves: dict[int, tuple[int, ...]]
    """Leaf partitions of the captured partitioned tables."""
    shapes: dict[int, Published]
    """How the publication publishes the captured tables (column list, row filter)."""
    catalogs: dict[int, Catalog]
    """The captured tables' catalog fingerprints now (``capture.schema_changes``)."""


def _landed_catalogs(
    conn: psycopg.Connection,
    target: CaptureTarget,
    captured: Mapping[int, tuple[str, str]],
    oids: Sequence[int],
    shapes: Mapping[int, Published],
    names_now: Mapping[int, tuple[str, str]] | None = None,
) -> dict[int, Catalog]:
    """The catalog fingerprints of ``oids`` now, as bronze may hold them: a withheld column's
    missing value forgotten (``Catalog.landed``; the snapshot's record is shaped the same
    way)."""
    out = {}
    for oid, catalog in catalog_of(conn, oids).items():
        shape = shapes.get(oid)
        names = [captured.get(oid), (names_now or {}).get(oid)]  # its policies under either
        policied = {c for n in names if n for c in target.pii.get(".".join(n), {})}
        out[oid] = catalog.landed(shape.columns if shape else None, policied)
    return out


def _survey(
    target: CaptureTarget,
    captured: dict[int, tuple[str, str]],
    expected: dict[int, PublishedTable],
) -> _Survey:
    known = {oid: PublishedTable(oid, *name) for oid, name in captured.items()}
    known.update(expected)
    conn = connect(target.conninfo)
    try:
        published = publication_tables(conn, target.publication)
        gone = _dropped_tables(conn, sorted(known))
        noticed_at = current_wal_lsn(conn) if gone else 0
        leaves = leaf_partitions(conn, [t.oid for t in published if t.oid in captured])
        shapes = published_shapes(conn, target.publication, [t.oid for t in published])
        catalogs = _landed_catalogs(
            conn,
            target,
            captured,
            [t.oid for t in published if t.oid in captured],
            shapes,
            {t.oid: (t.schema, t.name) for t in published},
        )
    finally:
        conn.close()
    gone_tables = [known[oid] for oid in gone]
    return _Survey(published, gone_tables, noticed_at, leaves, shapes, catalogs)


def _snapshot(
    bronze: Bronze, target: CaptureTarget, run: _Run, run_id: str, pending: list[PublishedTable]
) -> None:
    """Snapshot ``pending``; ``run.expected`` names them until the snapshot is in."""
    run.expected.update((t.oid, t) for t in pending)
    landed = land_snapshot(
        bronze,
        target,
        pending,
        workers=run.options.workers,
        run_id=run_id,
        progress=run.options.progress,
    )
    run.totals.snapshotted.update(landed.counts)
    run.totals.snapshot_lsn = landed.snapshot_lsn
    run.totals.table_errors.update(landed.dropped)
    for table in pending:
        run.expected.pop(table.oid, None)
