"""Preflight for ``pgmedallion doctor``: is this server, role and database ready for capture?

Capture needs a handful of things the server administrator controls, and each one fails late
and obscurely if it is missing (a walsender refusing to start, a snapshot silently missing rows
hidden by row-level security, deletes arriving without an old tuple). So before the first run
we ask the catalog directly and report every problem at once, each with the exact SQL that fixes
it, composed with :mod:`psycopg.sql` so hostile names are quoted correctly::

    run_checks ──> connect ──> server version ─ wal_level ─ free slots ─ free WAL senders
                               role: REPLICATION, SELECT (+ schema USAGE), replication session
                               tables exist ─ publication covers them (created if allowed)
                               replica identity ─ row-level security ─ the main slot
                          ──> [CheckResult] ──> format_report / all_ok

Every check is a small function of a connection (or of plain values, where the server's
setting cannot be changed in a test), and one failing check never hides the others: a check
that errors is itself reported as failed. The only writes are the ones the caller opts into
with ``create_publication``; a slot that is not ours is reported, never dropped. Messages never
carry the password: connection failures are redacted by :mod:`capture.connection`, and the
rest are catalog facts and server error texts, which never contain credentials.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import psycopg
from psycopg import sql

from pgmedallion.capture.connection import connect, connect_replication
from pgmedallion.capture.errors import PipelineError, SlotMissing, server_errors
from pgmedallion.capture.preflight import (
    CheckResult,
    Role,
    TableFacts,
    current_role,
    guarded,
    setting,
)
from pgmedallion.capture.publication import (
    check_publication,
    check_published,
    check_select_privilege,
    published_tables,
    resolve_tables,
)
from pgmedallion.capture.replica_identity import (
    IdentityAdvice,
    check_replica_identity,
    check_row_security,
    identity_advice_for,
)
from pgmedallion.capture.slot import PLUGIN, identify_system, slot_state
from pgmedallion.capture.snapshot import TID_RANGE_SCAN_MIN_VERSION

RESTART_NOTE = "-- then restart PostgreSQL: this setting only changes at server start"

WAL_SENDERS_NEEDED = 1
"""The stream's walsender; the snapshot leader's session is one more while a snapshot runs."""


def run_checks(
    conninfo: Mapping[str, Any],
    *,
    publication: str,
    slot: str,
    tables: Sequence[str],
    create_publication: bool,
) -> list[CheckResult]:
    """Every preflight check against the server ``conninfo`` names, in report order.

    ``tables`` are ``schema.table`` names (split at the first dot); empty means every table the
    publication publishes. With ``create_publication`` a missing publication is created, or an
    existing one extended, when the role may do so; otherwise the SQL is reported.
    """
    try:
        conn = connect(conninfo)
    except PipelineError as exc:
        return [CheckResult("server", False, str(exc))]
    with conn:
        results = guarded("server", check_server_version, conn)
        results += guarded("wal_level", check_wal_level, conn)
        results += guarded("replication slots", check_free_slots, conn, slot)
        results += guarded("wal senders", check_free_wal_senders, conn)
        try:
            role = current_role(conn)
        except PipelineError as exc:
            results.append(CheckResult("role", False, f"check could not run: {exc}"))
            role = Role(str(conninfo.get("user", "")), False, False, False)
        results += guarded("replication privilege", check_replication_privilege, conn, role)
        results += guarded("replication session", check_replication_session, conninfo)
        found: list[TableFacts] = []

        def resolve() -> list[CheckResult]:
            found[:], result = resolve_tables(conn, publication, tables)
            return [result]

        results += guarded("tables", resolve)
        advice: list[IdentityAdvice] = []
        try:
            advice = identity_advice_for(conn, publication, found)
        except PipelineError:
            pass  # the replica identity check reports it
        # Publishing a table whose identity cannot carry updates makes PostgreSQL reject the
        # application's UPDATEs and DELETEs on it: such tables join after their fix.
        unsafe = {(a.table.schema, a.table.name) for a in advice if a.table.replica_identity != "f"}
        held_back = [t for t in found if (t.schema, t.name) in unsafe]
        results += guarded(
            "publication",
            check_publication,
            conn,
            publication,
            [t for t in found if (t.schema, t.name) not in unsafe],
            role,
            create_publication,
            held_back,
        )
        published = set()
        try:
            published = set(published_tables(conn, publication))
        except PipelineError:
            pass
        held_back = [t for t in held_back if (t.schema, t.name) not in published]
        results += guarded("published columns and rows", check_published, conn, publication, found)
        results += guarded("select privilege", check_select_privilege, conn, role, found)
        results += guarded(
            "replica identity",
            check_replica_identity,
            conn,
            found,
            advice,
            held_back,
            publication,
        )
        results += guarded("row-level security", check_row_security, conn, role, found)
        results += guarded("slot", check_slot, conn, slot)
    return results


def all_ok(results: Sequence[CheckResult]) -> bool:
    return all(result.ok for result in results)


def format_report(results: Sequence[CheckResult]) -> str:
    """One line per check (``✓``/``✗ name: message``), remediation SQL indented below it."""
    lines = []
    for result in results:
        mark = ("!" if result.warning else "✓") if result.ok else "✗"
        lines.append(f"{mark} {result.name}: {result.message}")
        if result.remediation_sql:
            lines.extend(f"    {line}" for line in result.remediation_sql.splitlines())
    failed = sum(not result.ok for result in results)
    lines.append("all checks passed" if failed == 0 else f"{failed} check(s) failed")
    return "\n".join(lines)


def check_server_version(conn: psycopg.Connection) -> CheckResult:
    with server_errors():
        (version,) = conn.execute("SHOW server_version").fetchone()
    return server_version_result(conn.info.server_version, version)


def server_version_result(version_num: int, version: str) -> CheckResult:
    """Below 14 capture still works, but each table is snapshotted as one range."""
    if version_num < TID_RANGE_SCAN_MIN_VERSION:
        return CheckResult(
            "server",
            True,
            f"PostgreSQL {version} (warning: before 14 there are no TID range scans, so each "
            "table is snapshotted by one worker)",
        )
    return CheckResult("server", True, f"PostgreSQL {version}")


def check_wal_level(conn: psycopg.Connection) -> CheckResult:
    return wal_level_result(setting(conn, "wal_level"), conn)


def wal_level_result(wal_level: str, context: psycopg.Connection | None = None) -> CheckResult:
    if wal_level == "logical":
        return CheckResult("wal_level", True, "wal_level = logical")
    remediation = sql.SQL("ALTER SYSTEM SET wal_level = {};").format(sql.Literal("logical"))
    return CheckResult(
        "wal_level",
        False,
        f"wal_level = {wal_level}; logical decoding needs logical",
        f"{remediation.as_string(context)}\n{RESTART_NOTE}",
    )


def check_free_slots(conn: psycopg.Connection, slot: str) -> CheckResult:
    with server_errors():
        maximum, used, ours = conn.execute(
            sql.SQL(
                "SELECT current_setting('max_replication_slots')::int,"
                " (SELECT count(*) FROM pg_replication_slots),"
                " EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = {})"
            ).format(sql.Literal(slot))
        ).fetchone()
    # A snapshot holds a temporary slot for its duration, besides the main slot.
    return free_slots_result(maximum, used, needed=1 if ours else 2, context=conn)


def free_slots_result(
    maximum: int, used: int, needed: int, context: psycopg.Connection | None = None
) -> CheckResult:
    return _capacity_result(
        "replication slots", "max_replication_slots", maximum, used, needed, context
    )


def check_free_wal_senders(conn: psycopg.Connection) -> CheckResult:
    with server_errors():
        maximum, active = conn.execute(
            "SELECT current_setting('max_wal_senders')::int,"
            " (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'walsender')"
        ).fetchone()
    return free_wal_senders_result(maximum, active, WAL_SENDERS_NEEDED, context=conn)


def free_wal_senders_result(
    maximum: int, active: int, needed: int, context: psycopg.Connection | None = None
) -> CheckResult:
    return _capacity_result("wal senders", "max_wal_senders", maximum, active, needed, context)


def check_replication_privilege(conn: psycopg.Connection, role: Role) -> CheckResult:
    if role.superuser or role.replication:
        reason = "superuser" if role.superuser else "REPLICATION"
        return CheckResult("replication privilege", True, f"role {role.name!r} has {reason}")
    return CheckResult(
        "replication privilege",
        False,
        f"role {role.name!r} has neither REPLICATION nor superuser, so it cannot stream changes",
        sql.SQL("ALTER ROLE {} REPLICATION;").format(sql.Identifier(role.name)).as_string(conn),
    )


def check_replication_session(conninfo: Mapping[str, Any]) -> CheckResult:
    """Open a ``replication=database`` session: proves pg_hba, the role and a free walsender."""
    with connect_replication(conninfo) as repl_conn:
        system = identify_system(repl_conn)
    return CheckResult(
        "replication session",
        True,
        f"replication session opened (system {system.system_id}, timeline {system.timeline})",
    )


def check_slot(conn: psycopg.Connection, slot: str) -> CheckResult:
    """Ours (``pgoutput`` in this database), or absent; anything else is someone else's."""
    try:
        state = slot_state(conn, slot)
    except SlotMissing:
        return CheckResult("slot", True, f"replication slot {slot!r} is absent: will be created")
    with server_errors():
        (database,) = conn.execute("SELECT current_database()").fetchone()
    if state.plugin != PLUGIN or state.database != database:
        return CheckResult(
            "slot",
            False,
            f"replication slot {slot!r} exists with plugin {state.plugin!r} in database "
            f"{state.database!r}, not {PLUGIN!r} in {database!r}: configure another slot name",
        )
    return CheckResult("slot", True, f"replication slot {slot!r} exists with {PLUGIN}")


def _capacity_result(
    name: str,
    setting: str,
    maximum: int,
    used: int,
    needed: int,
    context: psycopg.Connection | None,
) -> CheckResult:
    free = maximum - used
    message = f"{free} of {setting} = {maximum} free, {needed} needed"
    if free >= needed:
        return CheckResult(name, True, message)
    remediation = sql.SQL("ALTER SYSTEM SET {} = {};").format(
        sql.Identifier(setting), sql.Literal(used + needed)
    )
    return CheckResult(name, False, message, f"{remediation.as_string(context)}\n{RESTART_NOTE}")
