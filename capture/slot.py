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
- the server is the one whose LSNs we recorded: same system id and timeline.

::

    ensure_slot ──> slot_state ──> check_resume_point ──> release_slot ──> START_REPLICATION
    (create if         (plugin,        (resume >= confirmed   (terminate a stale
     missing)          invalidated)     flush, else compacted)  active_pid)
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import psycopg
from psycopg import sql

from pgmedallion.capture.errors import (
    SlotCompacted,
    SlotInUse,
    SlotInvalidated,
    SlotMissing,
    SlotPluginMismatch,
    TimelineChanged,
    server_errors,
)
from pgmedallion.capture.pgoutput import format_lsn, parse_lsn

PLUGIN = "pgoutput"

RELEASE_POLL_INTERVAL_S = 0.05


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


@dataclass(frozen=True)
class SystemIdentity:
    system_id: str
    timeline: int
    wal_position: int
    database: str


def ensure_slot(repl_conn: psycopg.Connection, slot: str) -> SlotState:
    """The state of ``slot``, created first (``pgoutput``, no exported snapshot) if missing."""
    try:
        state = slot_state(repl_conn, slot)
    except SlotMissing:
        with server_errors():
            try:
                repl_conn.execute(
                    sql.SQL("CREATE_REPLICATION_SLOT {} LOGICAL {} NOEXPORT_SNAPSHOT").format(
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
            f"point {format_lsn(resume_lsn)}: changes in between are gone"
        )


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


def check_system(found: SystemIdentity, recorded: SystemIdentity) -> None:
    """Raise :class:`TimelineChanged` unless LSNs of ``recorded`` still mean the same WAL."""
    if (found.system_id, found.timeline) != (recorded.system_id, recorded.timeline):
        raise TimelineChanged(
            f"server is system {found.system_id} on timeline {found.timeline}; recorded "
            f"positions belong to system {recorded.system_id} timeline {recorded.timeline}"
        )


def _scalar(conn: psycopg.Connection, query: sql.Composable):
    with server_errors():
        row = conn.execute(query).fetchone()
    return None if row is None else row[0]


def _lsn(text: str | None) -> int | None:
    return None if text is None else parse_lsn(text)
