"""The main replication slot: create it once, check it is still ours and still whole.

The main slot is what makes capture exactly-once across runs: the server keeps every change
after the slot's ``confirmed_flush_lsn`` until we acknowledge it, and we acknowledge only what
bronze has durably committed. So the checks here guard that promise before every run:

- the slot decodes with ``pgoutput`` in our database; a slot with our name and another plugin
  belongs to someone else and is refused, never dropped;
- the slot is not invalidated (its WAL removed, ``wal_status = 'lost'``);
- our resume point is not older than ``confirmed_flush_lsn``: the server would silently start
  later, and the changes in between would be lost (:class:`SlotCompacted`);
- no stale session of ours still streams from it (it is terminated, see :func:`release_slot`);
- the server is the one whose LSNs we recorded: same system id, and the same timeline or a
  later one that branched off the recorded timeline at or after everything bronze holds (a
  standby promoted after a failover, :func:`check_system`).

On PostgreSQL 17 and later the slot is created as a *failover* slot (``[source] failover_slot``,
:func:`wants_failover`): a standby with ``sync_replication_slots = on`` keeps a copy of it, so
capture resumes on the standby once it is promoted.

::

    ensure_slot ──> slot_state ──> check_resume_point ──> release_slot ──> START_REPLICATION
    (create if         (plugin,        (resume >= confirmed   (terminate a stale
     missing)          invalidated)     flush, else compacted)  active_pid)
"""

from __future__ import annotations

import json
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass

import psycopg
from psycopg import sql

from pgmedallion.capture.errors import (
    DefiniteError,
    FailoverUnsupported,
    PipelineError,
    SlotCompacted,
    SlotInUse,
    SlotInvalidated,
    SlotMissing,
    SlotNotSynchronized,
    SlotPluginMismatch,
    SourceBehind,
    TimelineChanged,
    server_errors,
)
from pgmedallion.capture.pgoutput import format_lsn, parse_lsn

PLUGIN = "pgoutput"

RELEASE_POLL_INTERVAL_S = 0.05

FAILOVER_MIN_VERSION = 170000
"""Failover slots (``CREATE_REPLICATION_SLOT ... (FAILOVER true)``, ``sync_replication_slots``)
arrived in PostgreSQL 17."""


@dataclass(frozen=True)
class SlotState:
    name: str
    plugin: str | None
    database: str | None
    confirmed_flush_lsn: int | None
    restart_lsn: int | None
    wal_status: str | None
    active_pid: int | None
    invalidation_reason: str | None
    """Why the server invalidated the slot, or ``None`` while it is usable."""
    failover: bool | None = None
    """The slot is synchronized to standbys (PostgreSQL 17+; ``None`` before)."""


@dataclass(frozen=True)
class SystemIdentity:
    system_id: str
    timeline: int
    wal_position: int
    database: str


@dataclass(frozen=True)
class TimelineSwitch:
    """One line of a timeline history file: ``timeline`` ended at ``end`` (the switch point),
    where the next timeline branched off."""

    timeline: int
    end: int


def wants_failover(setting: str, server_version: int) -> bool:
    """Whether the main slot is created as a failover slot: ``auto`` where the server has them
    (PostgreSQL 17+), ``on`` always (a server without them is a configuration error), ``off``
    never."""
    supported = server_version >= FAILOVER_MIN_VERSION
    if setting == "on" and not supported:
        raise FailoverUnsupported(
            f'[source] failover_slot = "on", but the server is PostgreSQL '
            f"{server_version // 10000}: failover slots need PostgreSQL 17 or later; set "
            'failover_slot = "auto" or "off"'
        )
    return setting != "off" and supported


def ensure_slot(repl_conn: psycopg.Connection, slot: str, failover: bool = False) -> SlotState:
    """The state of ``slot``, created first (``pgoutput``, no exported snapshot, and with
    ``failover`` a failover slot) if missing."""
    try:
        state = slot_state(repl_conn, slot)
    except SlotMissing:
        options = "(SNAPSHOT 'nothing', FAILOVER true)" if failover else "NOEXPORT_SNAPSHOT"
        with server_errors():
            try:
                repl_conn.execute(
                    sql.SQL("CREATE_REPLICATION_SLOT {} LOGICAL {} " + options).format(
                        sql.Identifier(slot), sql.Identifier(PLUGIN)
                    )
                )
            except psycopg.errors.DuplicateObject:
                pass  # created concurrently by another run; the checks below still apply
        state = slot_state(repl_conn, slot)
    database = _scalar(repl_conn, sql.SQL("SELECT current_database()"))
    if state.plugin != PLUGIN or state.database != database:
        raise SlotPluginMismatch(
            f"replication slot {slot!r} exists with plugin {state.plugin!r} in database "
            f"{state.database!r}; capture needs plugin {PLUGIN!r} in {database!r}"
        )
    return state


def slot_state(conn: psycopg.Connection, slot: str) -> SlotState:
    """The slot's row in ``pg_replication_slots``; missing or invalidated slots raise."""
    # to_jsonb reads the columns each server version has (invalidation_reason is 17+).
    row = _scalar(
        conn,
        sql.SQL("SELECT to_jsonb(s)::text FROM pg_replication_slots s WHERE slot_name = {}").format(
            sql.Literal(slot)
        ),
    )
    if row is None:
        raise SlotMissing(f"replication slot {slot!r} does not exist")
    fields = json.loads(row)
    reason = fields.get("invalidation_reason")
    if reason is None and fields.get("wal_status") == "lost":
        reason = "wal_removed"
    state = SlotState(
        name=fields["slot_name"],
        plugin=fields.get("plugin"),
        database=fields.get("database"),
        confirmed_flush_lsn=_lsn(fields.get("confirmed_flush_lsn")),
        restart_lsn=_lsn(fields.get("restart_lsn")),
        wal_status=fields.get("wal_status"),
        active_pid=fields.get("active_pid"),
        invalidation_reason=reason,
        failover=fields.get("failover"),
    )
    if state.invalidation_reason is not None:
        raise SlotInvalidated(
            f"replication slot {slot!r} was invalidated ({state.invalidation_reason})"
        )
    return state


def check_resume_point(state: SlotState, resume_lsn: int) -> None:
    """Raise :class:`SlotCompacted` if the slot no longer holds changes from ``resume_lsn``.

    ``resume_lsn`` is the position bronze has durably reached. A pipeline with none yet starts
    at the slot's ``confirmed_flush_lsn`` instead and does not call this.
    """
    confirmed = state.confirmed_flush_lsn
    if confirmed is not None and resume_lsn < confirmed:
        raise SlotCompacted(
            f"replication slot {state.name!r} is at {format_lsn(confirmed)}, past the resume "
            f"point {format_lsn(resume_lsn)}: changes in between are gone; {START_OVER}"
        )


def starts_afresh(
    snapshots: Mapping[int, int],
    pending: Collection[int],
    dropped: Collection[int],
    since: int | None = None,
) -> bool:
    """Whether bronze needs no change before ``since`` any more: every captured table
    (``snapshots``: OID -> its newest snapshot's LSN) is snapshotted at or after ``since``,
    waits for a new snapshot (``pending``, taken later, at a WAL position past ``since``), or
    was dropped. Changes bronze never read before ``since`` (a slot dropped, invalidated, or
    moved past bronze's frontier) then change nothing: each table's rows before its snapshot
    come from the snapshot. ``since`` None: a point not known yet (a slot still to be made, or
    a server whose WAL is not the one bronze's snapshots were read from): only tables waiting
    for a new snapshot, or dropped, count. The one rule of a lost slot recovered in place
    (``pgmedallion resync --all``)."""
    # a snapshot at L holds every transaction committing below L + 1 (its consistent point)
    return bool(snapshots) and all(
        (since is not None and lsn + 1 >= since) or oid in pending or oid in dropped
        for oid, lsn in snapshots.items()
    )


def require_wal_past(repl_conn: psycopg.Connection, point: int | None, lost: PipelineError) -> None:
    """:class:`SourceBehind` (nothing written) unless the server's WAL position is at or past
    ``point`` (bronze's frontier, or where the stream is to resume): bronze's LSNs never go
    back, so a new slot, a new server or a resume past a gap must start after them."""
    if point is None:
        return
    now = current_wal_lsn(repl_conn)
    if now < point:
        raise SourceBehind(
            f"{lost}; every table is to be snapshotted again, but the server's WAL position"
            f" {format_lsn(now)} is before {format_lsn(point)} (a standby promoted before it"
            " received all bronze read, or another server): nothing was written; run again"
            f" once the server's WAL has passed {format_lsn(point)}"
        )


def drop_invalidated_slot(repl_conn: psycopg.Connection, slot: str) -> None:
    """Drop ``slot`` if the server invalidated it (its WAL is gone, so it can never stream
    again) and it is ours: ``pgoutput`` in this database. Any other slot is left alone."""
    row = _scalar(
        repl_conn,
        sql.SQL(
            "SELECT to_jsonb(s)::text FROM pg_replication_slots s"
            " WHERE slot_name = {} AND database = current_database()"
        ).format(sql.Literal(slot)),
    )
    fields = json.loads(row) if row else {}
    lost = fields.get("invalidation_reason") is not None or fields.get("wal_status") == "lost"
    if not lost or fields.get("plugin") != PLUGIN:
        return
    with server_errors():
        repl_conn.execute(sql.SQL("DROP_REPLICATION_SLOT {}").format(sql.Identifier(slot)))


def release_slot(conn: psycopg.Connection, slot: str, timeout_s: float = 10.0) -> SlotState:
    """Terminate whatever other session streams from ``slot`` and wait until it lets go.

    We are the slot's only reader, so a holder is a stale connection of an earlier run that
    the server has not noticed is dead yet; waiting for ``wal_sender_timeout`` would stall us.
    """
    state = slot_state(conn, slot)
    own_pid = conn.info.backend_pid
    if state.active_pid is None or state.active_pid == own_pid:
        return state
    with server_errors():
        conn.execute(
            sql.SQL("SELECT pg_terminate_backend({})").format(sql.Literal(state.active_pid))
        )
    deadline = time.monotonic() + timeout_s
    while state.active_pid is not None:
        if time.monotonic() > deadline:
            raise SlotInUse(
                f"replication slot {slot!r} is still in use by process {state.active_pid}"
            )
        time.sleep(RELEASE_POLL_INTERVAL_S)
        state = slot_state(conn, slot)
    return state


def current_wal_lsn(conn: psycopg.Connection) -> int:
    """``pg_current_wal_lsn()``: the target a run reads up to."""
    return parse_lsn(_scalar(conn, sql.SQL("SELECT pg_current_wal_lsn()::text")))


def identify_system(repl_conn: psycopg.Connection) -> SystemIdentity:
    """``IDENTIFY_SYSTEM`` on a replication session."""
    with server_errors():
        system_id, timeline, wal_position, database = repl_conn.execute(
            "IDENTIFY_SYSTEM"
        ).fetchone()
    return SystemIdentity(system_id, int(timeline), parse_lsn(wal_position), database)


def timeline_history(repl_conn: psycopg.Connection, timeline: int) -> list[TimelineSwitch]:
    """``TIMELINE_HISTORY``: the timelines ``timeline`` descends from, each with its switch
    point (empty for timeline 1, which has no history file)."""
    if timeline <= 1:
        return []
    with server_errors():
        row = repl_conn.execute(
            sql.SQL("TIMELINE_HISTORY {}").format(sql.SQL(str(int(timeline))))
        ).fetchone()
    content = row[1]
    text = bytes(content).decode() if isinstance(content, bytes | memoryview) else content
    return parse_timeline_history(text)


def parse_timeline_history(text: str) -> list[TimelineSwitch]:
    """The lines of a history file: ``<parent timeline>\\t<switch LSN>\\t<reason>``; blank
    lines and ``#`` comments are skipped."""
    switches = []
    for line in text.splitlines():
        fields = line.split()
        if not fields or fields[0].startswith("#"):
            continue
        switches.append(TimelineSwitch(int(fields[0]), parse_lsn(fields[1])))
    return switches


START_OVER = (
    "`pgmedallion resync --all` snapshots every table again at a new slot, under the same"
    " names (the changes in between are not read, and the gap is recorded)"
)
"""The way back when bronze can no longer continue through the slot: every table snapshotted
again makes the changes bronze never read irrelevant (:func:`starts_afresh`)."""


def missing_slot(
    exc: SlotMissing, held: str, found: SystemIdentity, recorded: Mapping | None
) -> DefiniteError:
    """The error for a slot gone while bronze holds ``held`` read through it.

    On a later timeline of the recorded system (a standby promoted after a failover) the
    standby never had a copy of the slot (not a failover slot, or ``sync_replication_slots``
    off there): :class:`SlotNotSynchronized`, which leaves bronze as it is, since the old
    primary may still run with the slot. Otherwise the slot was dropped: :class:`SlotMissing`.
    """
    if (
        recorded is not None
        and str(recorded["system_id"]) == found.system_id
        and int(recorded["timeline"]) < found.timeline
    ):
        return SlotNotSynchronized(
            f"{exc} on this server, a standby promoted to timeline {found.timeline} (bronze"
            f" read timeline {recorded['timeline']}, {held}): the standby had no copy of the"
            " slot (a failover slot, and sync_replication_slots = on on the standby; see"
            " `pgmedallion doctor`), so the changes since are not readable here. Nothing was"
            " written. If the old primary still runs with the slot, point [source] back at it;"
            f" otherwise {START_OVER}"
        )
    return SlotMissing(
        f"{exc}, but bronze holds {held} read through it: changes since are lost; {START_OVER}"
    )


def continues_recorded(
    repl_conn: psycopg.Connection,
    recorded: Mapping | None,
    frontier: int | None,
    found: SystemIdentity,
) -> bool:
    """:func:`check_system` against bronze's recorded server (``{"system_id", "timeline"}``),
    reading the found timeline's history where it is a later one: True on a later timeline
    that continues bronze's WAL, :class:`TimelineChanged` where the server does not."""
    if recorded is None:
        return False
    then = SystemIdentity(str(recorded["system_id"]), int(recorded["timeline"]), 0, found.database)
    later = found.system_id == then.system_id and found.timeline > then.timeline
    history = timeline_history(repl_conn, found.timeline) if later else []
    return check_system(found, then, frontier, history)


def check_system(
    found: SystemIdentity,
    recorded: SystemIdentity,
    resume: int | None = None,
    history: list[TimelineSwitch] | tuple[TimelineSwitch, ...] = (),
) -> bool:
    """Whether the server's LSNs still mean what bronze recorded; True when they do on a new
    timeline (then record it), :class:`TimelineChanged` when they do not.

    The same system on the same timeline is the same WAL. A later timeline of the same system
    (a standby promoted after a failover) shares the recorded timeline's WAL up to where it
    branched off, the recorded timeline's switch point in ``history`` (the found timeline's
    ``TIMELINE_HISTORY``): bronze, which holds everything before ``resume``, is still exact
    there when ``resume`` is at or before that point. Anything else (another system, an older
    timeline, a timeline that did not branch off ours, or bronze past the switch point: changes
    the new timeline never had) is refused.
    """
    if found.system_id == recorded.system_id and found.timeline == recorded.timeline:
        return False
    where = (
        f"bronze holds positions of system {recorded.system_id} timeline {recorded.timeline}"
        f" but the server is system {found.system_id} on timeline {found.timeline}"
    )
    if found.system_id != recorded.system_id:
        raise TimelineChanged(
            f"{where}, another server: point [source] back at the server bronze was read from,"
            f" or {START_OVER}"
        )
    switch = next((s.end for s in history if s.timeline == recorded.timeline), None)
    if found.timeline < recorded.timeline or switch is None:
        raise TimelineChanged(
            f"{where}, which does not descend from the recorded one: point [source] at the"
            f" primary that continues timeline {recorded.timeline}, or {START_OVER}"
        )
    if resume is not None and resume > switch:
        raise TimelineChanged(
            f"{where}, which branched off at {format_lsn(switch)}, before bronze's position"
            f" {format_lsn(resume)}: changes between the two were read from the old primary and"
            f" are not in the new one's history; {START_OVER}"
        )
    return True


def _scalar(conn: psycopg.Connection, query: sql.Composable):
    with server_errors():
        row = conn.execute(query).fetchone()
    return None if row is None else row[0]


def _lsn(text: str | None) -> int | None:
    return None if text is None else parse_lsn(text)
