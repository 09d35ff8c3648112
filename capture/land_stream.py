"""The slot's stream landed in bronze in batches; each batch's frontier acknowledged after its
commit, never before."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import psycopg

from pgmedallion.bronze.store import Bronze
from pgmedallion.bronze.table import (
    BronzeState,
    SealedBatch,
    WalBuffer,
    json_payload,
)
from pgmedallion.capture.connection import connect, connect_replication
from pgmedallion.capture.errors import (
    PipelineError,
    SlotCompacted,
)
from pgmedallion.capture.options import (
    DELTA_RS_BATCH_BYTES,
    DELTA_RS_BATCH_MESSAGES,
    STREAM_BATCH_BYTES,
    STREAM_BATCH_MESSAGES,
    CaptureOptions,
    CaptureTarget,
    StreamLimits,
    StreamResult,
)
from pgmedallion.capture.pgoutput import MSG_RELATION, Relation, decode, format_lsn
from pgmedallion.capture.published import StreamPolicies, published
from pgmedallion.capture.replication import (
    PG_EPOCH_US,
    Keepalive,
    ReplicationStream,
    start_replication,
)
from pgmedallion.capture.slot import (
    SlotState,
    SystemIdentity,
    check_resume_point,
    continues_recorded,
    current_wal_lsn,
    identify_system,
    release_slot,
    require_wal_past,
    starts_afresh,
)
from pgmedallion.capture.snapshot import (
    PublishedTable,
    publication_tables,
)
from pgmedallion.core.failpoints import failpoint

log = logging.getLogger(__name__)


def land_stream(
    bronze: Bronze,
    target: CaptureTarget,
    options: CaptureOptions | None = None,
    *,
    run_id: str,
    new_tables: Callable[[list[PublishedTable]], bool] | None = None,
    result: StreamResult | None = None,
    state: BronzeState | None = None,
    unchecked: Callable[[Relation], bool] | None = None,
) -> StreamResult:
    """Stream the slot into bronze from bronze's frontier.

    Triggered (default): until caught up with the WAL position seen at the start. Continuous
    (``options.continuous``): until ``options.stop`` is set, ``options.max_seconds`` pass, or
    (checked every ``limits.publication_check_interval_s``) ``new_tables`` says the publication
    gained tables that need a snapshot first. ``result`` is updated as batches commit, so a
    caller still knows what landed when an error ends the stream. ``state`` is bronze's state if
    the caller has just read it (nothing was written since). ``unchecked``: a Relation message
    for which it says True is not landed: the stream ends before it (its transaction is not
    acknowledged, so the next session sends it again) with ``new_tables`` set, for the caller
    to look at the catalog first.
    """
    options = options or CaptureOptions()
    result = result if result is not None else StreamResult()
    max_seconds = options.max_seconds
    end_at = None if max_seconds is None else time.monotonic() + max_seconds
    continuous = options.continuous
    conn = connect(target.conninfo)
    try:
        repl = connect_replication(target.conninfo)
        try:
            system = identify_system(repl)
            if state is None:
                state = bronze.state()
            slot = release_slot(repl, target.slot)
            resume, new_server = _resume_point(
                repl, conn, bronze, state, slot, system, set(options.tables or ())
            )
            # PostgreSQL 18 skips a dropped publication silently: check it by name first.
            tables = publication_tables(conn, target.publication)
            policies = stream_policies(conn, target, tables, state)
            stop_at = None if continuous else current_wal_lsn(conn)
            log.info(
                "streaming slot %s from %s %s",
                target.slot,
                format_lsn(resume),
                "continuously" if continuous else f"to {format_lsn(stop_at)}",
            )
            stream = start_replication(repl, target.slot, target.publication, resume)
            # (a gap's record took a batch id)
            next_batch = bronze.refresh().next_batch_id() if new_server else state.next_batch_id
            writer = _BatchWriter(bronze, stream, run_id, system, resume, result, next_batch)
            # a new timeline or server (or the end of a gap): the first batch records it, even
            # with nothing of ours new
            writer.must_commit = new_server
            try:
                loop = _Loop(stop_at, options.stop or threading.Event(), end_at, options.limits)
                _stream_loop(stream, writer, conn, target, loop, new_tables, policies, unchecked)
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


def stream_policies(
    conn: psycopg.Connection,
    target: CaptureTarget,
    tables: list[PublishedTable],
    state: BronzeState,
) -> StreamPolicies | None:
    """The rewriter of ``target``'s column policies (None: no table has one). A table is
    known by OID under the name its snapshot recorded as well as its name now, so renaming a
    table does not take its policies off."""
    if not target.pii:
        return None
    names = {t.oid: f"{t.schema}.{t.name}" for t in tables}
    recorded = {oid: f"{schema}.{name}" for oid, (_, schema, name) in state.snapshots.items()}
    by_oid = {}
    for oid in set(names) | set(recorded):
        for name in (recorded.get(oid), names.get(oid)):
            if name in target.pii:
                by_oid[oid] = target.pii[name]
                break
    lists = {
        oid: shape.columns for oid, shape in published(conn, target.publication, by_oid).items()
    }
    return StreamPolicies(target.pii, by_oid, target.hash_key, lists)


@dataclass(frozen=True)
class _Loop:
    """When the stream loop commits and when it ends."""

    stop_at: int | None
    """Triggered: the WAL position to catch up with; None: continuous."""
    stop: threading.Event
    end_at: float | None
    limits: StreamLimits


def _stream_loop(
    stream: ReplicationStream,
    writer: _BatchWriter,
    conn: psycopg.Connection,
    target: CaptureTarget,
    loop: _Loop,
    new_tables: Callable[[list[PublishedTable]], bool] | None,
    policies: StreamPolicies | None,
    unchecked: Callable[[Relation], bool] | None = None,
) -> None:
    stop_at, stop, end_at, limits = loop.stop_at, loop.stop, loop.end_at, loop.limits
    continuous = stop_at is None
    next_check = time.monotonic() + limits.publication_check_interval_s
    small = writer.committer.name == "delta-rs"
    max_messages = limits.batch_messages or (
        DELTA_RS_BATCH_MESSAGES if small else STREAM_BATCH_MESSAGES
    )
    max_bytes = limits.batch_bytes or (DELTA_RS_BATCH_BYTES if small else STREAM_BATCH_BYTES)
    halted = False
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
            if policies is not None:
                payload = policies(payload)
            if (
                unchecked is not None
                and payload[0] == MSG_RELATION[0]
                and unchecked(decode(payload))
            ):
                halted = writer.result.new_tables = True
                break
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
        stopping = halted or stop.is_set() or caught_up or (end_at is not None and now >= end_at)
        if continuous and not stopping and now >= next_check:
            next_check = now + limits.publication_check_interval_s
            published = publication_tables(conn, target.publication)
            if new_tables is not None and new_tables(published):
                log.info(
                    "publication %s: new or reshaped tables: snapshotting them", target.publication
                )
                writer.result.new_tables = stopping = True
        idle_due = now - writer.last_commit >= limits.idle_commit_interval_s
        moved = stream.position - writer.sealed
        worth = continuous or moved >= limits.idle_commit_bytes
        if len(buffer) or writer.must_commit or (moved > 0 and ((stopping and worth) or idle_due)):
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
        self.identity = {"system_id": system.system_id, "timeline": system.timeline}
        self.must_commit = False
        """Whether the next batch is committed even if empty (its progress record says what
        bronze must know: a new server, the end of a gap)."""
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
        buffer.others.add("progress", frontier, payload=self._progress_payload())
        sealed = buffer.seal(self.batch_id)
        del buffer
        self.buffer = WalBuffer(self.source, self.run_id)
        self.wait()
        self._pending = (self._pool.submit(self._write, sealed), frontier, ack)
        self.sealed = frontier
        self.must_commit = False
        self.batch_id += 1
        self.last_commit = time.monotonic()

    def _progress_payload(self) -> bytes:
        """The progress record's payload: the server the LSNs belong to, and the source's clock
        for the frontier (``source_time_us``, Unix microseconds) once the stream has one."""
        payload = dict(self.identity)
        if self.stream.position_time:
            payload["source_time_us"] = self.stream.position_time + PG_EPOCH_US
        return json_payload(payload)

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


def _resume_point(
    repl: psycopg.Connection,
    conn: psycopg.Connection,
    bronze: Bronze,
    state: BronzeState,
    slot: SlotState,
    system: SystemIdentity,
    wanted: Collection[str],
) -> tuple[int, bool]:
    """Where the stream starts, and whether its first batch must record the server (a new
    timeline, or the end of a gap).

    Bronze's frontier, on the server bronze recorded (or a later timeline of it, see
    :func:`_check_recorded_system`; a server that does not continue bronze's WAL was adopted
    before the snapshots, or is refused: ``capture.run._adopt_server``), through a slot that
    still holds the changes from there, else :class:`SlotCompacted`. A new bronze starts at the
    slot's ``confirmed_flush_lsn``. Where the slot moved past the frontier, the stream starts
    where the slot does instead, once no table needs the changes in between (``pgmedallion
    resync --all``: every table snapshotted again at or after that point,
    :func:`starts_afresh`) and the server's WAL is past it; the gap is then recorded in bronze
    (``Bronze.record_gap``)."""
    frontier = state.frontier
    if frontier is None:
        return slot.confirmed_flush_lsn or 0, False
    moved = _check_recorded_system(repl, state, system)
    try:
        check_resume_point(slot, frontier)
        return frontier, moved
    except SlotCompacted as exc:
        lost = exc
    resume = max(frontier, slot.confirmed_flush_lsn or 0)
    snapshots = {oid: lsn for oid, (lsn, _, _) in state.snapshots.items()}
    pending = awaited(state, wanted)
    if not starts_afresh(snapshots, pending, bronze.dropped_tables(), resume):
        raise lost
    require_wal_past(conn, resume, lost)
    if resume in {to for _, to, _ in bronze.gaps()}:  # recorded where the slot was made
        log.info("the stream goes on from the new slot's start %s", format_lsn(resume))
        return resume, True
    bronze.record_gap(frontier, resume, f"{lost.code}: {lost}")
    log.warning(
        "%s; every table is snapshotted again at or after %s, so the stream goes on from there"
        " (changes from %s on were not read: recorded as a gap)",
        lost,
        format_lsn(resume),
        format_lsn(frontier),
    )
    return resume, True


def _check_recorded_system(
    repl: psycopg.Connection, state: BronzeState, system: SystemIdentity
) -> bool:
    """Whether the server continues what bronze recorded on a new timeline (a promoted
    standby); :class:`TimelineChanged` if it does not continue it at all."""
    moved = continues_recorded(repl, state.system_identity, state.frontier, system)
    if moved:
        log.warning(
            "server %s is on timeline %d (bronze read timeline %d up to %s, before the switch"
            " point): a promoted standby; capture continues there",
            system.system_id,
            system.timeline,
            int(state.system_identity["timeline"]),
            format_lsn(state.frontier or 0),
        )
    return moved


def awaited(state: BronzeState, wanted: Collection[str] = ()) -> set[int]:
    """The captured tables waiting for a new snapshot that capture takes (``wanted``: the
    tables a run is limited to, ``schema.table``; empty: all): :func:`starts_afresh`'s
    ``pending``. One a run leaves out would keep its old rows under the changes after a gap."""
    return {
        oid
        for oid in state.resync
        if oid in state.snapshots and (not wanted or ".".join(state.snapshots[oid][1:]) in wanted)
    }
