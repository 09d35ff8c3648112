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
                               failover: a standby that keeps a copy of the slot (17+)
                          ──> [CheckResult] ──> format_report / all_ok

Every check is a small function of a connection (or of plain values, where the server's
setting cannot be changed in a test), and one failing check never hides the others: a check
that errors is itself reported as failed. The only writes are the ones the caller opts into
with ``create_publication``; a slot that is not ours is reported, never dropped. Messages never
carry the password: connection failures are redacted by :mod:`capture.connection`, and the
rest are catalog facts and server error texts, which never contain credentials.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from pgmedallion.capture.connection import connect, connect_replication
from pgmedallion.capture.errors import (
    FailoverUnsupported,
    PipelineError,
    SlotInvalidated,
    SlotMissing,
    server_errors,
)
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
from pgmedallion.capture.slot import PLUGIN, identify_system, slot_state, wants_failover
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
    failover_slot: str = "auto",
) -> list[CheckResult]:
    """Every preflight check against the server ``conninfo`` names, in report order.

    ``tables`` are ``schema.table`` names (split at the first dot); empty means every table the
    publication publishes. With ``create_publication`` a missing publication is created, or an
    existing one extended, when the role may do so; otherwise the SQL is reported.
    ``failover_slot``: ``[source] failover_slot`` (``auto`` | ``on`` | ``off``).
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
        results += guarded("slot", check_slot, conn, slot, failover_slot)
        results += guarded("failover", check_failover, conn, failover_slot)
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


def check_slot(conn: psycopg.Connection, slot: str, failover_slot: str = "off") -> CheckResult:
    """Ours (``pgoutput`` in this database), or absent; anything else is someone else's. Ours
    but not a failover slot where ``failover_slot`` wants one: a warning with the command that
    makes it one (it is never dropped)."""
    try:
        state = slot_state(conn, slot)
    except SlotMissing:
        return CheckResult("slot", True, f"replication slot {slot!r} is absent: will be created")
    except SlotInvalidated as exc:
        # the run says whether bronze needed it (then its error names the way back); a check
        # that failed here would also hold back that way back, `resync --all`
        return CheckResult(
            "slot",
            True,
            f"{exc}: it cannot stream again; if bronze read through it, `pgmedallion resync"
            " --all` snapshots every table again at a new slot (the invalidated one is dropped)",
            warning=True,
        )
    with server_errors():
        (database,) = conn.execute("SELECT current_database()").fetchone()
    if state.plugin != PLUGIN or state.database != database:
        return CheckResult(
            "slot",
            False,
            f"replication slot {slot!r} exists with plugin {state.plugin!r} in database "
            f"{state.database!r}, not {PLUGIN!r} in {database!r}: configure another slot name",
        )
    try:
        failover = wants_failover(failover_slot, conn.info.server_version)
    except FailoverUnsupported:
        failover = False  # the failover check reports it
    if failover and state.failover is False:
        return CheckResult(
            "slot",
            True,
            f"replication slot {slot!r} exists with {PLUGIN}, but is not a failover slot: no"
            " standby keeps a copy of it, so capture cannot go on after a failover",
            alter_slot_advice(conn, slot, database),
            warning=True,
        )
    kind = " (a failover slot)" if state.failover else ""
    return CheckResult("slot", True, f"replication slot {slot!r} exists with {PLUGIN}{kind}")


def alter_slot_advice(conn: psycopg.Connection, slot: str, database: str) -> str:
    """How to make an existing slot a failover slot. PostgreSQL has no SQL function for it (17,
    18): ``ALTER_REPLICATION_SLOT`` is a replication command, sent on a replication connection,
    and it fails while a session streams from the slot."""
    command = sql.SQL("ALTER_REPLICATION_SLOT {} (FAILOVER true)").format(sql.Identifier(slot))
    target = make_conninfo(dbname=database, replication="database")
    return (
        "-- a replication command, not SQL: run it while capture is not running, e.g. with psql\n"
        "-- (with your usual host, user and password)\n"
        f"psql {shlex.quote(target)} -c {shlex.quote(command.as_string(conn))}"
    )


def check_failover(conn: psycopg.Connection, failover_slot: str) -> CheckResult:
    """What a standby needs for the slot to survive a failover, as far as the primary shows it:
    a physical slot of a standby, named in ``synchronized_standby_slots``."""
    version = conn.info.server_version
    try:
        wanted = wants_failover(failover_slot, version)
    except FailoverUnsupported as exc:
        return CheckResult("failover", False, str(exc))
    if not wanted:
        why = (
            "[source] failover_slot = off"
            if failover_slot == "off"
            else f"PostgreSQL {version // 10000} has no failover slots (17+)"
        )
        return CheckResult(
            "failover", True, f"{why}: the slot lives on this server only (information)"
        )
    with server_errors():
        recovery, named, database = conn.execute(
            "SELECT pg_is_in_recovery(), current_setting('synchronized_standby_slots'),"
            " current_database()"
        ).fetchone()
        physical = dict(
            conn.execute(
                "SELECT slot_name, active FROM pg_replication_slots WHERE slot_type = 'physical'"
                " ORDER BY slot_name"
            ).fetchall()
        )
    if recovery:
        return CheckResult(
            "failover",
            True,
            "this server is a standby: failover slots are set up on its primary (information)",
        )
    names = [n.strip() for n in named.split(",") if n.strip()]
    return failover_result(names, physical, database, conn)


def failover_result(
    named: list[str],
    physical: Mapping[str, bool],
    database: str,
    context: psycopg.Connection | None = None,
) -> CheckResult:
    """The verdict on a primary: ``named`` is ``synchronized_standby_slots``, ``physical`` its
    physical slots (name -> in use by a standby now)."""
    unknown = [n for n in named if n not in physical]
    if unknown:
        fix = _standby_slots_sql([n for n in named if n in physical], context)
        return CheckResult(
            "failover",
            False,
            f"synchronized_standby_slots names {', '.join(unknown)}, not a physical slot on this"
            " server: logical replication (capture) waits for it and never goes on",
            fix,
        )
    if not physical:
        return CheckResult(
            "failover",
            True,
            "no standby with a physical slot: the slot lives on this server only, a failover"
            " loses it (information; to keep a copy on a standby:)",
            _standby_advice(None, database, context),
        )
    if not named:
        return CheckResult(
            "failover",
            True,
            f"physical slot(s) {', '.join(physical)} but synchronized_standby_slots is empty:"
            " capture may read changes a standby has not received, and after a failover bronze"
            " is then ahead of the new primary",
            _standby_slots_sql(list(physical), context)
            + "\n"
            + _standby_advice(next(iter(physical)), database, context),
            warning=True,
        )
    idle = [n for n in named if not physical[n]]
    if idle:
        return CheckResult(
            "failover",
            True,
            f"synchronized_standby_slots = {', '.join(named)}, but no standby streams from"
            f" {', '.join(idle)} now: capture waits until it does",
            _standby_advice(idle[0], database, context),
            warning=True,
        )
    return CheckResult(
        "failover",
        True,
        f"synchronized_standby_slots = {', '.join(named)}: capture reads only what those"
        " standbys have; each needs the settings below to keep a copy of the slot",
        _standby_advice(named[0], database, context),
    )


def _standby_slots_sql(names: list[str], context: psycopg.Connection | None) -> str:
    if names:
        statement = sql.SQL("ALTER SYSTEM SET synchronized_standby_slots = {};").format(
            sql.Literal(", ".join(names))
        )
    else:
        statement = sql.SQL("ALTER SYSTEM RESET synchronized_standby_slots;")
    return f"{statement.as_string(context)}\nSELECT pg_reload_conf();"


def _standby_advice(slot: str | None, database: str, context: psycopg.Connection | None) -> str:
    """The settings on both sides, ``slot`` being the standby's physical slot (None: none yet)."""
    name = slot or "standby1"
    lines = []
    if slot is None:
        lines += [
            "-- on this server (the primary):",
            sql.SQL("SELECT pg_create_physical_replication_slot({});")
            .format(sql.Literal(name))
            .as_string(context),
            _standby_slots_sql([name], context),
        ]
    setting = sql.SQL("ALTER SYSTEM SET primary_slot_name = {};").format(sql.Literal(name))
    lines += [
        "-- on the standby (all reload without a restart):",
        "ALTER SYSTEM SET sync_replication_slots = on;",
        "ALTER SYSTEM SET hot_standby_feedback = on;",
        setting.as_string(context),
        f"-- and primary_conninfo must name the database: add dbname={database} to it",
        "SELECT pg_reload_conf();",
    ]
    return "\n".join(lines)


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
