"""Landing capture output in bronze: the snapshot as one commit, the stream in batches.

::

    capture_once ── retry transient errors with backoff ── record definite errors, raise
       │
       ├─ slot: must exist once bronze holds anything (else SlotMissing), created otherwise
       ├─ tables captured before that no longer exist ──> TableDropped error records
       ├─ published tables without a complete snapshot, or whose resync was requested
       │   (``pgmedallion resync``) since their last one ──> land_snapshot (one commit)
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
``pg_stat_progress_copy`` for rows copied so far (``capture.progress``).

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
written as ``error`` records (see ``bronze.table``) and raised.

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

import functools
import logging
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import psycopg
import pyarrow as pa
from psycopg import sql

from bronze.store import Bronze, open_bronze
from bronze.table import (
    BronzeState,
    RecordBuffer,
    SealedBatch,
    WalBuffer,
    error_payload,
    json_payload,
)
from capture.connection import connect, connect_replication
from capture.errors import (
    DefiniteError,
    PipelineError,
    PublicationDropped,
    SlotCompacted,
    SlotInvalidated,
    SlotMissing,
    TableDropped,
    TimelineChanged,
    TransientError,
    server_errors,
)
from capture.pgoutput import format_lsn
from capture.progress import (
    CopyProgressMonitor,
    ProgressCallback,
    TableProgress,
    copy_application_name,
    estimate_rows,
    table_sizes,
)
from capture.replication import Keepalive, ReplicationStream, start_replication
from capture.slot import (
    SystemIdentity,
    check_resume_point,
    check_system,
    current_wal_lsn,
    ensure_slot,
    identify_system,
    release_slot,
    slot_state,
)
from capture.snapshot import (
    PublishedTable,
    TableSchema,
    copy_range_chunks,
    estimate_table_block_counts,
    exported_snapshot,
    leaf_partitions,
    lock_for_snapshot,
    publication_tables,
    publishes_stored_generated,
    table_schema_at_snapshot,
    use_snapshot,
    worker_ctid_ranges,
)
from core.failpoints import failpoint

if TYPE_CHECKING:  # a capture without Spark never imports it
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

COPY_CHUNK_BYTES = 1 << 20
"""Raw COPY bytes per bronze ``copy`` record (a record holds whole rows, so it can be larger)."""
ARROW_BATCH_BYTES = 16 << 20
STREAM_BATCH_MESSAGES = 500_000
STREAM_BATCH_BYTES = 48 << 20
"""Payload bytes per stream batch committed through Spark. Two batches live at once (one
committing, one filling): through a 1M-row transaction the capture's peak RSS was 530 MB at
64 MiB, 385 MB at 48 MiB and 334 MB at 32 MiB; a Spark commit costs about the same at any of
these sizes, so smaller batches slow the stream (1M messages: 3 commits, ratio 0.22; 5 commits
at 32 MiB, 0.17)."""
DELTA_RS_BATCH_MESSAGES = 100_000
DELTA_RS_BATCH_BYTES = 8 << 20
"""The same through delta-rs, whose commit costs tens of milliseconds: small batches cost the
stream little and keep the capture's memory low (see benchmarks/RESULTS.md, session 12)."""

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


@dataclass(frozen=True)
class CaptureTarget:
    conninfo: Mapping[str, Any]
    source: str
    publication: str
    slot: str
    bronze: str
    """The bronze table's qualified name."""
    bronze_path: str | None = None
    """Its local directory, when known without Spark (see :func:`bronze.store.open_bronze`)."""


def bronze_of(spark: SparkSession | Bronze | None, target: CaptureTarget) -> Bronze:
    """``target``'s bronze: given, or opened with ``spark`` (None: without Spark, by delta-rs)."""
    if isinstance(spark, Bronze):
        return spark
    return open_bronze(target.bronze, target.source, path=target.bronze_path, spark=spark)


@dataclass(frozen=True)
class StreamLimits:
    """When the stream commits a batch."""

    batch_messages: int | None = None
    """Messages per batch; None: the writer's (``STREAM_BATCH_*`` for Spark, ``DELTA_RS_*``)."""
    batch_bytes: int | None = None
    """Payload bytes per batch; None: the writer's."""
    commit_interval_s: float = 10.0
    """Continuous mode: commit what arrived at least this often."""
    idle_commit_interval_s: float = 60.0
    """Continuous mode: commit a frontier moved only by keepalives at least this often."""
    publication_check_interval_s: float = 10.0
    """Continuous mode: look for a dropped publication or newly published tables."""


@dataclass(frozen=True)
class RetryPolicy:
    """Transient errors: ``attempts`` tries in a row without progress, exponential backoff."""

    attempts: int = 5
    initial_delay_s: float = 1.0
    max_delay_s: float = 60.0

    def delay_s(self, failures: int) -> float:
        """The wait after the ``failures``-th failure in a row (1, 2, 4, ... seconds, capped)."""
        return min(self.max_delay_s, self.initial_delay_s * 2 ** max(0, failures - 1))


@dataclass(frozen=True)
class CaptureResult:
    snapshotted: dict[str, int]
    """``schema.table`` -> rows landed, for the tables snapshotted by this run."""
    snapshot_lsn: int | None
    messages: int
    frontier: int
    batches: int
    table_errors: dict[str, str] = field(default_factory=dict)
    """``schema.table`` -> the definite error recorded for it by this run (e.g. dropped)."""
    retries: int = 0


@dataclass(frozen=True)
class SnapshotLanded:
    """What :func:`land_snapshot` landed; unpacks as ``snapshot_lsn, counts``."""

    snapshot_lsn: int
    counts: dict[str, int]
    dropped: dict[str, str] = field(default_factory=dict)
    """``schema.table`` -> message, for the tables skipped because they were dropped."""

    def __iter__(self) -> Iterator[Any]:
        return iter((self.snapshot_lsn, self.counts))


@dataclass
class StreamResult:
    messages: int = 0
    frontier: int | None = None
    batches: int = 0
    new_tables: bool = False
    """Continuous mode ended the stream because new tables were published."""
    commit_s: float = 0.0
    """Seconds spent in bronze commits (in the background, while reading went on)."""
    wait_s: float = 0.0
    """Seconds the reader waited for a commit (its slack: commit_s - wait_s overlapped)."""
    writer: str = ""
    """Which writer committed the batches: ``delta-rs`` or ``spark`` (see bronze/writer.py)."""


@dataclass
class _Totals:
    snapshotted: dict[str, int] = field(default_factory=dict)
    snapshot_lsn: int | None = None
    stream: StreamResult = field(default_factory=StreamResult)
    table_errors: dict[str, str] = field(default_factory=dict)
    retries: int = 0


# ---------------------------------------------------------------------------------------------
# Snapshot


def _copy_task_rows(
    ids: Iterator[pa.RecordBatch],
    tasks: Sequence[Mapping[str, Any]],
    conninfo: Mapping[str, Any],
    snapshot_name: str,
    source: str,
    run_id: str,
    snapshot_lsn: int,
    batch_id: int,
) -> Iterator[pa.RecordBatch]:
    """Spark task body: COPY each assigned ctid range into bronze ``copy`` records, a chunk of
    raw COPY TEXT lines each (``ordinal``: the range's row count up to and including it)."""
    for id_batch in ids:
        for task in (tasks[i] for i in id_batch.column("id").to_pylist()):
            buffer = RecordBuffer(source, run_id)
            session = dict(conninfo)
            session["application_name"] = copy_application_name(run_id, task["oid"], task["part"])
            chunks = copy_range_chunks(
                session,
                snapshot_name,
                (task["schema"], task["name"]),
                task["columns"],
                (task["start"], task["end"]),
                COPY_CHUNK_BYTES,
            )
            rows = 0
            for count, chunk in chunks:
                failpoint("snapshot.copy_chunk")
                rows += count
                buffer.add(
                    "copy",
                    snapshot_lsn,
                    table_oid=task["oid"],
                    table_schema=task["schema"],
                    table_name=task["name"],
                    ordinal=rows,
                    part=task["part"],
                    payload=chunk,
                )
                if buffer.payload_bytes >= ARROW_BATCH_BYTES:
                    yield from buffer.to_arrow(batch_id).to_batches()
                    buffer.clear()
            if len(buffer):
                yield from buffer.to_arrow(batch_id).to_batches()


def land_snapshot(
    spark: SparkSession | Bronze | None,
    target: CaptureTarget,
    tables: Sequence[int | PublishedTable],
    *,
    workers: int,
    run_id: str,
    progress: ProgressCallback | None = None,
) -> SnapshotLanded:
    """Snapshot ``tables`` (OIDs or published tables) at one exported snapshot, as one commit.

    A table dropped before the snapshot is skipped and gets an ``error`` record. ``spark``:
    see :func:`bronze_of`.
    """
    bronze = bronze_of(spark, target)
    wanted = [
        t if isinstance(t, PublishedTable) else PublishedTable(int(t), "", "") for t in tables
    ]
    temp_slot = f"pgm_snap_{uuid.uuid4().hex[:16]}"
    dropped: dict[PublishedTable, TableDropped] = {}
    with exported_snapshot(target.conninfo, temp_slot) as point:
        conn = connect(target.conninfo)
        try:
            use_snapshot(conn, point.snapshot_name)
            stored_generated = publishes_stored_generated(conn, target.publication)
            schemas = []
            for table in wanted:
                try:
                    schema = table_schema_at_snapshot(
                        conn, table.oid, stored_generated=stored_generated
                    )
                    lock_for_snapshot(conn, table.oid, (schema.schema, schema.name))
                except TableDropped as exc:
                    dropped[table] = exc
                    continue
                schemas.append(schema)
            oids = [schema.oid for schema in schemas]
            blocks = estimate_table_block_counts(conn, oids)
            estimates = {oid: estimate_rows(size) for oid, size in table_sizes(conn, oids).items()}
            version = conn.info.server_version
            names = {schema.oid: f"{schema.schema}.{schema.name}" for schema in schemas}
            if schemas:
                batch_id = bronze.next_batch_id()
                monitor = (
                    CopyProgressMonitor(
                        target.conninfo,
                        run_id,
                        names,
                        estimates,
                        progress,
                        server_version=version,
                    )
                    if progress is not None
                    else nullcontext()
                )
                with monitor:
                    _write_snapshot(
                        bronze, target, schemas, blocks, version, point, workers, run_id, batch_id
                    )
            failpoint("snapshot.after_commit")
            with server_errors():
                conn.execute("COMMIT")  # the table locks go only now that the commit is in
        finally:
            conn.close()
    table_errors = {}
    for table, exc in dropped.items():
        if record_error(bronze, exc, lsn=point.snapshot_lsn, run_id=run_id, table=table):
            table_errors[_table_name(table)] = str(exc)
    counts = bronze.landed_counts(batch_id) if schemas else {}
    for name in names.values():
        counts.setdefault(name, 0)
    if progress is not None and names:
        progress(
            [
                TableProgress(names[oid], counts[names[oid]], estimates.get(oid), done=True)
                for oid in names
            ]
        )
    return SnapshotLanded(point.snapshot_lsn, counts, table_errors)


def _write_snapshot(
    bronze: Bronze,
    target: CaptureTarget,
    schemas: list[TableSchema],
    blocks: dict[int, int],
    version: int,
    point,
    workers: int,
    run_id: str,
    batch_id: int,
) -> None:
    tasks = []
    for schema in schemas:
        for part, (start, end) in enumerate(
            worker_ctid_ranges(blocks[schema.oid], workers, version)
        ):
            tasks.append(
                {
                    "oid": schema.oid,
                    "schema": schema.schema,
                    "name": schema.name,
                    "columns": [c.name for c in schema.columns if not c.generated],
                    "part": part,
                    "start": start,
                    "end": end,
                }
            )
    meta = RecordBuffer(target.source, run_id)
    for schema in schemas:
        _add_snapshot_records(meta, schema, point.snapshot_lsn)
    copy_rows = functools.partial(
        _copy_task_rows,
        tasks=tasks,
        conninfo=dict(target.conninfo),
        snapshot_name=point.snapshot_name,
        source=target.source,
        run_id=run_id,
        snapshot_lsn=point.snapshot_lsn,
        batch_id=batch_id,
    )
    bronze.write_snapshot(len(tasks), copy_rows, meta.to_arrow(batch_id), batch_id, workers)


def _add_snapshot_records(buffer: RecordBuffer, schema: TableSchema, snapshot_lsn: int) -> None:
    ident = dict(table_oid=schema.oid, table_schema=schema.schema, table_name=schema.name)
    buffer.add("schema", snapshot_lsn, payload=json_payload(schema), **ident)
    buffer.add("rewind", snapshot_lsn, **ident)


# ---------------------------------------------------------------------------------------------
# Stream


def land_stream(
    spark: SparkSession | Bronze | None,
    target: CaptureTarget,
    *,
    run_id: str,
    continuous: bool = False,
    stop: threading.Event | None = None,
    max_seconds: float | None = None,
    limits: StreamLimits = StreamLimits(),
    new_tables: Callable[[list[PublishedTable]], bool] | None = None,
    result: StreamResult | None = None,
    state: BronzeState | None = None,
) -> StreamResult:
    """Stream the slot into bronze from bronze's frontier.

    Triggered (default): until caught up with the WAL position seen at the start. Continuous:
    until ``stop`` is set, ``max_seconds`` pass, or (checked every
    ``limits.publication_check_interval_s``) ``new_tables`` says the publication gained tables
    that need a snapshot first. ``result`` is updated as batches commit, so a caller still
    knows what landed when an error ends the stream. ``state`` is bronze's state if the caller
    has just read it (nothing was written since). ``spark``: see :func:`bronze_of`.
    """
    bronze = bronze_of(spark, target)
    stop = stop or threading.Event()
    result = result if result is not None else StreamResult()
    end_at = None if max_seconds is None else time.monotonic() + max_seconds
    conn = connect(target.conninfo)
    try:
        repl = connect_replication(target.conninfo)
        try:
            system = identify_system(repl)
            if state is None:
                state = bronze.state()
            _check_recorded_system(state, system)
            slot = release_slot(repl, target.slot)
            frontier = state.frontier
            resume = frontier if frontier is not None else slot.confirmed_flush_lsn or 0
            check_resume_point(slot, resume)
            # PostgreSQL 18 skips a dropped publication silently: check it by name first.
            publication_tables(conn, target.publication)
            stop_at = None if continuous else current_wal_lsn(conn)
            log.info(
                "streaming slot %s from %s %s",
                target.slot,
                format_lsn(resume),
                "continuously" if continuous else f"to {format_lsn(stop_at)}",
            )
            stream = start_replication(repl, target.slot, target.publication, resume)
            writer = _BatchWriter(
                bronze, stream, run_id, system, resume, result, state.next_batch_id
            )
            try:
                _stream_loop(
                    stream, writer, conn, target, stop_at, stop, end_at, limits, new_tables
                )
            except PipelineError:
                writer.salvage()
                raise
            finally:
                writer.close()
            stream.close()
            return result
        finally:
            repl.close()
    finally:
        conn.close()


def _stream_loop(
    stream: ReplicationStream,
    writer: _BatchWriter,
    conn: psycopg.Connection,
    target: CaptureTarget,
    stop_at: int | None,
    stop: threading.Event,
    end_at: float | None,
    limits: StreamLimits,
    new_tables: Callable[[list[PublishedTable]], bool] | None,
) -> None:
    continuous = stop_at is None
    next_check = time.monotonic() + limits.publication_check_interval_s
    small = writer.committer.name == "delta-rs"
    max_messages = limits.batch_messages or (
        DELTA_RS_BATCH_MESSAGES if small else STREAM_BATCH_MESSAGES
    )
    max_bytes = limits.batch_bytes or (DELTA_RS_BATCH_BYTES if small else STREAM_BATCH_BYTES)
    while True:
        deadline = time.monotonic() + limits.commit_interval_s if continuous else None
        if end_at is not None:
            deadline = end_at if deadline is None else min(deadline, end_at)
        buffer = writer.buffer
        add, data, messages = buffer.add_wal, buffer.data, buffer.messages
        for event in stream.read_until(stop_at, deadline=deadline):
            if event.__class__ is Keepalive:
                writer.poll()
                if stop.is_set():
                    break
                continue
            commit_lsn, end_lsn, xid, ordinal, _, payload = event
            add(commit_lsn, end_lsn, xid, ordinal, payload)
            messages += 1
            if messages >= max_messages or len(data) >= max_bytes:
                writer.commit()
                buffer = writer.buffer
                add, data, messages = buffer.add_wal, buffer.data, buffer.messages
            if not messages & 1023:
                writer.poll()
                if stop.is_set():
                    break
        now = time.monotonic()
        caught_up = stop_at is not None and stream.position >= stop_at and not stream.in_transaction
        stopping = stop.is_set() or caught_up or (end_at is not None and now >= end_at)
        if continuous and not stopping and now >= next_check:
            next_check = now + limits.publication_check_interval_s
            published = publication_tables(conn, target.publication)
            if new_tables is not None and new_tables(published):
                log.info("new tables in publication %s: snapshotting them", target.publication)
                writer.result.new_tables = stopping = True
        idle_due = now - writer.last_commit >= limits.idle_commit_interval_s
        if len(buffer) or (stream.position > writer.sealed and (stopping or idle_due)):
            writer.commit()
        writer.poll()
        if stopping:
            writer.wait()
            return


class _BatchWriter:
    """Commits the buffered stream as numbered bronze batches, then acknowledges the slot.

    Commits run in a background thread, one at a time and in batch order, while the reader
    fills the next batch (the reader never waits for Delta unless a second batch is full before
    the first is committed). The reader's thread acknowledges a batch's frontier once its
    commit is in (``poll``/``wait``): the replication connection is only used by that thread.
    Memory: at most two batches, the one being committed and the one being filled.
    """

    def __init__(
        self,
        bronze: Bronze,
        stream: ReplicationStream,
        run_id: str,
        system: SystemIdentity,
        resume: int,
        result: StreamResult,
        batch_id: int,
    ) -> None:
        self.source = bronze.source
        self.stream = stream
        self.run_id = run_id
        self.buffer = WalBuffer(self.source, run_id)
        self.batch_id = batch_id
        self.identity = json_payload({"system_id": system.system_id, "timeline": system.timeline})
        self.committed = resume
        """The frontier of the last batch committed (and acknowledged, unless salvaged)."""
        self.sealed = resume
        """The frontier of the last batch handed to the committer."""
        self.last_commit = time.monotonic()
        self.result = result
        self.committer = bronze.writer()
        result.writer = self.committer.name
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bronze-commit")
        self._pending: tuple[Future, int, bool] | None = None
        result.frontier = resume if result.frontier is None else max(result.frontier, resume)

    def commit(self, ack: bool = True) -> None:
        """Seal the buffer as the next batch and start committing it (after the previous one)."""
        frontier = max(self.sealed, self.stream.position)
        buffer = self.buffer
        self.result.messages += buffer.messages
        buffer.others.add("progress", frontier, payload=self.identity)
        sealed = buffer.seal(self.batch_id)
        del buffer
        self.buffer = WalBuffer(self.source, self.run_id)
        self.wait()
        self._pending = (self._pool.submit(self._write, sealed), frontier, ack)
        self.sealed = frontier
        self.batch_id += 1
        self.last_commit = time.monotonic()

    def _write(self, sealed: SealedBatch) -> None:
        failpoint("bronze.before_commit")
        started = time.monotonic()
        self.committer.write(sealed)
        self.result.commit_s += time.monotonic() - started

    def poll(self) -> None:
        """Acknowledge the batch in flight if its commit has finished (raise its error)."""
        if self._pending is not None and self._pending[0].done():
            self.wait()

    def wait(self) -> None:
        """Wait for the batch in flight, then acknowledge its frontier (raise its error)."""
        if self._pending is None:
            return
        future, frontier, ack = self._pending
        self._pending = None
        started = time.monotonic()
        future.result()
        self.result.wait_s += time.monotonic() - started
        self.committed = max(self.committed, frontier)
        self.result.frontier = max(self.result.frontier or 0, frontier)
        self.result.batches += 1
        failpoint("bronze.after_commit")  # committed, not yet acknowledged
        if ack:
            self.stream.ack(frontier)

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    def salvage(self) -> None:
        """After a capture error: keep what was read (no ack; the next run acknowledges it)."""
        try:
            self.wait()
        except Exception as exc:  # the error being raised says more than this one
            log.warning("the batch being committed failed too: %s", exc)
        if not len(self.buffer) and self.stream.position <= self.sealed:
            return
        try:
            self.commit(ack=False)
            self.wait()
        except Exception as exc:  # the error being raised says more than this one
            log.warning("could not commit the last %d records: %s", len(self.buffer), exc)


def _check_recorded_system(state: BronzeState, system: SystemIdentity) -> None:
    recorded = state.system_identity
    if recorded is None:
        return
    check_system(
        system,
        SystemIdentity(str(recorded["system_id"]), int(recorded["timeline"]), 0, system.database),
    )


# ---------------------------------------------------------------------------------------------
# Errors


def record_error(
    bronze: Bronze,
    error: PipelineError,
    *,
    lsn: int,
    run_id: str,
    table: PublishedTable | None = None,
) -> bool:
    """Write ``error`` as one ``error`` record in a batch of its own, unless already recorded.

    A table's error is recorded once per table; a source-wide one once per LSN. Returns
    whether a record was written.
    """
    code = type(error).__name__
    oid = None if table is None else table.oid
    for known_code, known_oid, known_lsn in bronze.recorded_errors():
        if known_code == code and known_oid == oid and (oid is not None or known_lsn == lsn):
            return False
    buffer = RecordBuffer(bronze.source, run_id)
    buffer.add(
        "error",
        lsn,
        table_oid=oid,
        table_schema=None if table is None else table.schema or None,
        table_name=None if table is None else table.name or None,
        payload=error_payload(code, str(error), format_lsn(lsn)),
    )
    batch_id = bronze.next_batch_id()
    bronze.append(buffer.to_arrow(batch_id), batch_id)
    where = "" if table is None else f" for {_table_name(table)}"
    log.error("recorded %s%s at %s: %s", code, where, format_lsn(lsn), error)
    return True


def _table_name(table: PublishedTable) -> str:
    return f"{table.schema}.{table.name}" if table.name else f"oid {table.oid}"


def _error_lsn(bronze: Bronze) -> int:
    """Where a source-wide error stops capture: bronze's frontier, else its last snapshot."""
    frontier = bronze.frontier()
    if frontier is not None:
        return frontier
    return max(bronze.snapshotted_tables().values(), default=0)


def _repartitioned(bronze: Bronze, leaves: dict[int, tuple[int, ...]]) -> list[int]:
    """The partitioned tables whose leaf partitions are not those of their newest snapshot."""
    snapshot = bronze.snapshot_partitions(sorted(leaves))
    return sorted(oid for oid, now in leaves.items() if oid in snapshot and snapshot[oid] != now)


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


# ---------------------------------------------------------------------------------------------
# One run


@contextmanager
def stop_on_signals(stop: threading.Event) -> Iterator[None]:
    """In the main thread, let SIGINT/SIGTERM set ``stop``; a second one acts as usual."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous: dict[int, Any] = {}

    def handler(signum: int, _frame: Any) -> None:
        log.warning(
            "%s: committing the current batch, then stopping (again to abort)",
            signal.Signals(signum).name,
        )
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
    spark: SparkSession | Bronze | None,
    target: CaptureTarget,
    *,
    workers: int = 2,
    tables: list[str] | None = None,
    continuous: bool = False,
    progress: ProgressCallback | None = None,
    stop: threading.Event | None = None,
    max_seconds: float | None = None,
    retry: RetryPolicy = RetryPolicy(),
    limits: StreamLimits = StreamLimits(),
    handle_signals: bool = True,
) -> CaptureResult:
    """One capture run: provision the slot, snapshot new tables, stream.

    Triggered by default (stream until caught up with the WAL position seen at the start);
    ``continuous`` streams until ``stop`` is set, ``max_seconds`` pass or a signal arrives,
    snapshotting tables published meanwhile. ``progress`` receives per-table snapshot
    progress. Transient errors are retried per ``retry``; definite ones are recorded in bronze
    and raised. A table dropped before its snapshot is recorded and reported in
    ``table_errors`` without stopping the others. ``spark``: see :func:`bronze_of`; None
    captures without Spark where bronze is a local directory.
    """
    bronze = bronze_of(spark, target)
    stop = stop or threading.Event()
    end_at = None if max_seconds is None else time.monotonic() + max_seconds
    totals = _Totals()
    expected: dict[int, PublishedTable] = {}
    failures = 0
    with stop_on_signals(stop) if handle_signals else nullcontext():
        while True:
            run_id = uuid.uuid4().hex
            landed_before = (totals.stream.frontier, totals.stream.batches, len(totals.snapshotted))
            try:
                again = _attempt(
                    bronze,
                    target,
                    run_id=run_id,
                    workers=workers,
                    tables=tables,
                    continuous=continuous,
                    progress=progress,
                    stop=stop,
                    end_at=end_at,
                    limits=limits,
                    totals=totals,
                    expected=expected,
                )
            except DefiniteError as exc:
                if isinstance(exc, RECORDED_ERRORS):
                    record_error(bronze, exc, lsn=_error_lsn(bronze), run_id=run_id)
                raise
            except TransientError as exc:
                landed = (totals.stream.frontier, totals.stream.batches, len(totals.snapshotted))
                failures = 1 if landed != landed_before else failures + 1
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
    )


def _attempt(
    bronze: Bronze,
    target: CaptureTarget,
    *,
    run_id: str,
    workers: int,
    tables: list[str] | None,
    continuous: bool,
    progress: ProgressCallback | None,
    stop: threading.Event,
    end_at: float | None,
    limits: StreamLimits,
    totals: _Totals,
    expected: dict[int, PublishedTable],
) -> bool:
    """One attempt: slot, dropped tables, snapshot, stream. True: new tables, go again."""
    state: BronzeState | None = bronze.state()
    frontier = state.frontier
    captured = {oid: (schema, name) for oid, (_, schema, name) in state.snapshots.items()}
    resync = state.resync
    repl = connect_replication(target.conninfo)
    try:
        if frontier is not None or captured:
            # Bronze relies on this slot: a new one would start after changes we never read.
            try:
                slot_state(repl, target.slot)
            except SlotMissing as exc:
                held = "snapshots" if frontier is None else f"changes up to {format_lsn(frontier)}"
                raise SlotMissing(
                    f"{exc}, but bronze holds {held} read through it: changes since are lost; "
                    "start this source over (a new source name or bronze table)"
                ) from None
        ensure_slot(repl, target.slot)
    finally:
        repl.close()
    known = {oid: PublishedTable(oid, *name) for oid, name in captured.items()}
    known.update(expected)
    conn = connect(target.conninfo)
    try:
        published = publication_tables(conn, target.publication)
        gone = _dropped_tables(conn, sorted(known))
        noticed_at = current_wal_lsn(conn) if gone else 0
        leaves = leaf_partitions(conn, [t.oid for t in published if t.oid in captured])
    finally:
        conn.close()
    moved = _repartitioned(bronze, leaves)
    if moved:
        # attached or detached partitions changed these tables' rows without a change message:
        # snapshot them again (a durable request, so a crash before the snapshot still does it)
        bronze.request_resync([(oid, *captured[oid]) for oid in moved], frontier or 0)
        resync = resync | set(moved)
        state = None
    for oid in gone:
        table = known[oid]
        error = TableDropped(f"table {_table_name(table)} (oid {oid}) was dropped")
        if record_error(bronze, error, lsn=noticed_at, run_id=run_id, table=table):
            totals.table_errors[_table_name(table)] = str(error)
        expected.pop(oid, None)
        state = None  # an error record may have taken the next batch id
    wanted = set(tables or ())

    def is_wanted(table: PublishedTable) -> bool:
        return not wanted or f"{table.schema}.{table.name}" in wanted

    published = [t for t in published if is_wanted(t)]
    pending = [t for t in published if t.oid not in captured or t.oid in resync]
    if pending and not stop.is_set():
        expected.update((t.oid, t) for t in pending)
        landed = land_snapshot(
            bronze, target, pending, workers=workers, run_id=run_id, progress=progress
        )
        totals.snapshotted.update(landed.counts)
        totals.snapshot_lsn = landed.snapshot_lsn
        totals.table_errors.update(landed.dropped)
        for table in pending:
            expected.pop(table.oid, None)
        state = None  # the snapshot added a batch
    if stop.is_set():
        return False
    watched = {t.oid for t in published}

    def new_tables(current: list[PublishedTable]) -> bool:
        return any(t.oid not in watched and is_wanted(t) for t in current)

    remaining = None if end_at is None else max(0.0, end_at - time.monotonic())
    stream = land_stream(
        bronze,
        target,
        run_id=run_id,
        continuous=continuous,
        stop=stop,
        max_seconds=remaining,
        limits=limits,
        new_tables=new_tables,
        result=totals.stream,
        state=state,
    )
    again = stream.new_tables
    stream.new_tables = False
    return again
