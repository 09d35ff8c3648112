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

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from capture.connection import connect, connect_replication
from capture.errors import PipelineError, SlotMissing, server_errors
from capture.slot import PLUGIN, identify_system, slot_state
from capture.snapshot import TID_RANGE_SCAN_MIN_VERSION, publishes_stored_generated

RESTART_NOTE = "-- then restart PostgreSQL: this setting only changes at server start"

WAL_SENDERS_NEEDED = 1
"""The stream's walsender; the snapshot leader's session is one more while a snapshot runs."""

PUBLISH_ACTIONS = ("insert", "update", "delete", "truncate")


@dataclass(frozen=True)
class CheckResult:
    name: str
    ok: bool
    message: str
    remediation_sql: str | None = None


@dataclass(frozen=True)
class Role:
    name: str
    superuser: bool
    replication: bool
    bypassrls: bool


@dataclass(frozen=True)
class TableFacts:
    """What doctor learns about one table from the catalog: ownership, identity, access."""

    schema: str
    name: str
    owned: bool
    """The current role owns the table (or is a member of its owner)."""
    replica_identity: str
    """``pg_class.relreplident``: ``d`` default, ``n`` nothing, ``f`` full, ``i`` index."""
    has_primary_key: bool
    can_select: bool
    schema_usage: bool
    row_security_active: bool
    """Row-level security filters what the current role reads from this table."""
    identity_index: str | None = None
    """A unique index that can be the replica identity (not partial, not deferrable, no
    expressions, NOT NULL columns only), if there is one."""
    stored_generated: bool = False
    virtual_generated: bool = False
    """The table has stored / virtual (PostgreSQL 18) generated columns."""

    @property
    def identifier(self) -> sql.Identifier:
        return sql.Identifier(self.schema, self.name)

    @property
    def qualified_name(self) -> str:
        return f"{self.schema}.{self.name}"


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
        results = _guarded("server", check_server_version, conn)
        results += _guarded("wal_level", check_wal_level, conn)
        results += _guarded("replication slots", check_free_slots, conn, slot)
        results += _guarded("wal senders", check_free_wal_senders, conn)
        try:
            role = current_role(conn)
        except PipelineError as exc:
            results.append(CheckResult("role", False, f"check could not run: {exc}"))
            role = Role(str(conninfo.get("user", "")), False, False, False)
        results += _guarded("replication privilege", check_replication_privilege, conn, role)
        results += _guarded("replication session", check_replication_session, conninfo)
        found: list[TableFacts] = []

        def resolve() -> list[CheckResult]:
            found[:], result = resolve_tables(conn, publication, tables)
            return [result]

        results += _guarded("tables", resolve)
        advice: list[IdentityAdvice] = []
        try:
            advice = identity_advice_for(conn, publication, found)
        except PipelineError:
            pass  # the replica identity check reports it
        # Publishing a table whose identity cannot carry updates makes PostgreSQL reject the
        # application's UPDATEs and DELETEs on it: such tables join after their fix.
        unsafe = {(a.table.schema, a.table.name) for a in advice if a.table.replica_identity != "f"}
        held_back = [t for t in found if (t.schema, t.name) in unsafe]
        results += _guarded(
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
            published = set(_published_tables(conn, publication))
        except PipelineError:
            pass
        held_back = [t for t in held_back if (t.schema, t.name) not in published]
        results += _guarded("select privilege", check_select_privilege, conn, role, found)
        results += _guarded(
            "replica identity",
            check_replica_identity,
            conn,
            found,
            advice,
            held_back,
            publication,
        )
        results += _guarded("row-level security", check_row_security, conn, role, found)
        results += _guarded("slot", check_slot, conn, slot)
    return results


def all_ok(results: Sequence[CheckResult]) -> bool:
    return all(result.ok for result in results)


def format_report(results: Sequence[CheckResult]) -> str:
    """One line per check (``✓``/``✗ name: message``), remediation SQL indented below it."""
    lines = []
    for result in results:
        lines.append(f"{'✓' if result.ok else '✗'} {result.name}: {result.message}")
        if result.remediation_sql:
            lines.extend(f"    {line}" for line in result.remediation_sql.splitlines())
    failed = sum(not result.ok for result in results)
    lines.append("all checks passed" if failed == 0 else f"{failed} check(s) failed")
    return "\n".join(lines)


def current_role(conn: psycopg.Connection) -> Role:
    with server_errors():
        row = conn.execute(
            "SELECT rolname, rolsuper, rolreplication, rolbypassrls"
            " FROM pg_roles WHERE rolname = current_user"
        ).fetchone()
    return Role(*row)


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
    return wal_level_result(_setting(conn, "wal_level"), conn)


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


def parse_table(name: str) -> tuple[str, str]:
    """``schema.table`` split at the first dot; a bare name is in ``public``."""
    schema, dot, table = name.partition(".")
    return (schema, table) if dot else ("public", name)


def resolve_tables(
    conn: psycopg.Connection, publication: str, tables: Sequence[str]
) -> tuple[list[TableFacts], CheckResult]:
    """The configured tables (or, if none, the published ones) that exist, and a check of that."""
    if tables:
        wanted = [parse_table(name) for name in tables]
    else:
        wanted = _published_tables(conn, publication)
        if not wanted:
            return [], CheckResult(
                "tables",
                False,
                f"no tables configured and publication {publication!r} publishes none",
            )
    found = table_info(conn, wanted)
    missing = [f"{schema}.{name}" for schema, name in wanted if (schema, name) not in found]
    infos = [found[key] for key in wanted if key in found]
    if missing:
        return infos, CheckResult(
            "tables", False, f"tables not found (or not tables): {', '.join(missing)}"
        )
    return infos, CheckResult("tables", True, f"{len(infos)} table(s) to capture")


def table_info(
    conn: psycopg.Connection, tables: Sequence[tuple[str, str]]
) -> dict[tuple[str, str], TableFacts]:
    """What the checks need to know about each existing ordinary or partitioned table."""
    if not tables:
        return {}
    keys = sql.SQL(", ").join(
        sql.SQL("({}, {})").format(sql.Literal(schema), sql.Literal(name))
        for schema, name in tables
    )
    with server_errors():
        rows = conn.execute(
            sql.SQL(
                "SELECT n.nspname, c.relname, pg_has_role(c.relowner, 'USAGE'),"
                " c.relreplident::text,"
                " EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND i.indisprimary),"
                " has_table_privilege(c.oid, 'SELECT'), has_schema_privilege(n.oid, 'USAGE'),"
                " row_security_active(c.oid),"
                " (SELECT ic.relname FROM pg_index i JOIN pg_class ic ON ic.oid = i.indexrelid"
                "  WHERE i.indrelid = c.oid AND i.indisunique AND i.indimmediate"
                "  AND i.indisvalid AND i.indpred IS NULL AND i.indexprs IS NULL"
                "  AND NOT EXISTS (SELECT 1 FROM pg_attribute a"
                "   WHERE a.attrelid = c.oid AND a.attnum = ANY(i.indkey) AND NOT a.attnotnull)"
                "  ORDER BY i.indisprimary DESC, ic.relname LIMIT 1),"
                " EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attnum > 0"
                "  AND NOT a.attisdropped AND a.attgenerated = 's'),"
                " EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attnum > 0"
                "  AND NOT a.attisdropped AND a.attgenerated = 'v')"
                " FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
                " WHERE c.relkind IN ('r', 'p') AND (n.nspname, c.relname) IN ({})"
            ).format(keys)
        ).fetchall()
    return {(row[0], row[1]): TableFacts(*row) for row in rows}


def check_publication(
    conn: psycopg.Connection,
    publication: str,
    tables: Sequence[TableFacts],
    role: Role,
    create: bool,
    held_back: Sequence[TableFacts] = (),
) -> list[CheckResult]:
    """The publication exists, publishes every change kind and covers ``tables``.

    With ``create`` it is created or extended when the role may: superusers, or owners of every
    table (and of the publication, to extend it). Anything else gets the SQL to run.
    ``held_back``: tables to capture that join only after their replica identity is fixed (see
    :func:`check_replica_identity`); the publication is created for the others, if any.
    """
    name = sql.Identifier(publication)
    row = _publication(conn, publication)
    if row is None:
        if not tables and not held_back:
            return [
                CheckResult(
                    "publication",
                    False,
                    f"publication {publication!r} does not exist and there are no tables to "
                    "create it for",
                )
            ]
        statement = (
            sql.SQL("CREATE PUBLICATION {} FOR TABLE {};").format(
                name, sql.SQL(", ").join(table.identifier for table in tables)
            )
            if tables
            else sql.SQL("CREATE PUBLICATION {};").format(name)
        )
        allowed = role.superuser or (all(t.owned for t in tables) and _can_create_in_db(conn))
        return [
            _provision(
                conn,
                statement,
                create and allowed,
                f"created publication {publication!r}",
                f"publication {publication!r} does not exist",
            )
        ]
    all_tables, owner_is_us, actions = row
    results = []
    unpublished = [a for a, on in zip(PUBLISH_ACTIONS, actions, strict=True) if not on]
    if unpublished:
        results.append(
            CheckResult(
                "publication",
                False,
                f"publication {publication!r} does not publish {', '.join(unpublished)}",
                sql.SQL("ALTER PUBLICATION {} SET (publish = {});")
                .format(name, sql.Literal(", ".join(PUBLISH_ACTIONS)))
                .as_string(conn),
            )
        )
    published = set(_published_tables(conn, publication))
    missing = [t for t in tables if (t.schema, t.name) not in published]
    if all_tables or not missing:
        results.append(
            CheckResult("publication", True, f"publication {publication!r} covers the tables")
        )
        return results
    statement = sql.SQL("ALTER PUBLICATION {} ADD TABLE {};").format(
        name, sql.SQL(", ").join(table.identifier for table in missing)
    )
    allowed = role.superuser or (owner_is_us and all(t.owned for t in missing))
    missing_names = ", ".join(t.qualified_name for t in missing)
    results.append(
        _provision(
            conn,
            statement,
            create and allowed,
            f"added {missing_names} to publication {publication!r}",
            f"publication {publication!r} does not publish {missing_names}",
        )
    )
    return results


def check_select_privilege(
    conn: psycopg.Connection, role: Role, tables: Sequence[TableFacts]
) -> CheckResult:
    denied = [t for t in tables if not t.can_select]
    no_usage = sorted({t.schema for t in tables if not t.schema_usage})
    if not denied and not no_usage:
        return CheckResult("select privilege", True, f"role {role.name!r} can read every table")
    grantee = sql.Identifier(role.name)
    statements = [
        sql.SQL("GRANT USAGE ON SCHEMA {} TO {};").format(sql.Identifier(schema), grantee)
        for schema in no_usage
    ]
    if denied:
        statements.append(
            sql.SQL("GRANT SELECT ON {} TO {};").format(
                sql.SQL(", ").join(t.identifier for t in denied), grantee
            )
        )
    problems = [f"no SELECT on {t.qualified_name}" for t in denied]
    problems += [f"no USAGE on schema {schema}" for schema in no_usage]
    return CheckResult(
        "select privilege",
        False,
        f"role {role.name!r} cannot read: {'; '.join(problems)}",
        "\n".join(statement.as_string(conn) for statement in statements),
    )


@dataclass(frozen=True)
class IdentityAdvice:
    """Why a table's replica identity does not work for capture, and what to run about it."""

    table: TableFacts
    reason: str
    statements: tuple[str, ...]
    """SQL that is safe to run against production (comments where none is), in order."""

    @property
    def fixable(self) -> bool:
        return any(not line.startswith("--") for line in self.statements)


def identity_advice(
    conn: psycopg.Connection | None,
    table: TableFacts,
    *,
    server_version: int,
    publication: str,
    publishes_generated: bool,
) -> IdentityAdvice | None:
    """None when ``table``'s replica identity lets capture read its updates and deletes and
    lets the application write them; otherwise the cheapest safe change, cheapest first:

    - NOTHING on a table with a primary key: back to DEFAULT (the key identifies a row);
    - no key: ``USING INDEX`` a unique index on NOT NULL columns, if the table has one;
    - else FULL, which makes every UPDATE and DELETE write the whole old row to the WAL.

    PostgreSQL 18 rejects UPDATE and DELETE when the identity includes a generated column the
    publication does not publish; FULL includes every column. So FULL is never advised for a
    table with a virtual generated column (those are never published), nor for one with a stored
    generated column unless the publication publishes them: then the advice publishes them
    first (``publish_generated_columns = stored``, which capture reads as ordinary columns). A
    FULL table already broken that way goes back to its key.
    """

    def q(statement: sql.Composable) -> str:
        return statement.as_string(conn)

    ident = table.identifier
    has_key = table.has_primary_key
    generated_trap = server_version >= 180000 and (
        table.virtual_generated or (table.stored_generated and not publishes_generated)
    )
    if table.replica_identity == "i" or (table.replica_identity == "d" and has_key):
        return None
    if table.replica_identity == "f" and not generated_trap:
        return None
    if table.replica_identity == "f":
        reason = "FULL includes generated columns the publication does not publish"
    elif table.replica_identity == "n":
        reason = "NOTHING" + ("" if has_key else ", no primary key")
    else:
        reason = "DEFAULT, no primary key"
    if has_key:
        fix = q(sql.SQL("ALTER TABLE {} REPLICA IDENTITY DEFAULT;").format(ident))
        return IdentityAdvice(table, reason, (fix,))
    if table.identity_index:
        index = sql.Identifier(table.identity_index)
        fix = q(sql.SQL("ALTER TABLE {} REPLICA IDENTITY USING INDEX {};").format(ident, index))
        return IdentityAdvice(table, reason, (fix,))
    if server_version >= 180000 and table.virtual_generated:
        return IdentityAdvice(
            table,
            reason + ", virtual generated columns",
            (
                f"-- {table.qualified_name}: add a primary key, or a unique index on NOT NULL "
                "columns and REPLICA IDENTITY USING INDEX; FULL would include its virtual "
                "generated columns and PostgreSQL 18 would reject its UPDATEs and DELETEs",
            ),
        )
    cost = (
        f"-- {table.qualified_name} has no primary key or usable unique index: with FULL every "
        "UPDATE and DELETE writes the whole old row to the WAL (a primary key avoids that)"
    )
    full = q(sql.SQL("ALTER TABLE {} REPLICA IDENTITY FULL;").format(ident))
    if generated_trap:
        publish = q(
            sql.SQL("ALTER PUBLICATION {} SET (publish_generated_columns = stored);").format(
                sql.Identifier(publication)
            )
        )
        return IdentityAdvice(
            table,
            reason + ", stored generated columns",
            (
                f"-- {table.qualified_name}: publish stored generated columns first, or "
                "PostgreSQL 18 rejects its UPDATEs under FULL",
                publish,
                cost,
                full,
            ),
        )
    return IdentityAdvice(table, reason, (cost, full))


def identity_advice_for(
    conn: psycopg.Connection, publication: str, tables: Sequence[TableFacts]
) -> list[IdentityAdvice]:
    version = conn.info.server_version
    publishes = publishes_stored_generated(conn, publication) if tables else False
    advice = (
        identity_advice(
            conn,
            t,
            server_version=version,
            publication=publication,
            publishes_generated=publishes,
        )
        for t in tables
    )
    return [a for a in advice if a is not None]


def check_replica_identity(
    conn: psycopg.Connection | None,
    tables: Sequence[TableFacts],
    advice: Sequence[IdentityAdvice] | None = None,
    add_to_publication: Sequence[TableFacts] = (),
    publication: str = "",
) -> CheckResult:
    """Every table's identity lets capture read its changes exactly (see
    :func:`identity_advice`): FULL, an index, or DEFAULT with a primary key.

    ``add_to_publication``: tables the publication check left out because publishing them
    before their identity is fixed would make PostgreSQL reject their UPDATEs; the remediation
    adds them after the fix.
    """
    if advice is None:
        advice = [
            a
            for a in (
                identity_advice(
                    conn, t, server_version=0, publication=publication, publishes_generated=False
                )
                for t in tables
            )
            if a is not None
        ]
    if not advice:
        return CheckResult("replica identity", True, "every table has a usable replica identity")
    reasons = [f"{a.table.qualified_name} ({a.reason})" for a in advice]
    lines = [line for a in advice for line in a.statements]
    later = [t for t in add_to_publication if any(a.table == t and a.fixable for a in advice)]
    if later:
        lines.append(
            sql.SQL("ALTER PUBLICATION {} ADD TABLE {};")
            .format(sql.Identifier(publication), sql.SQL(", ").join(t.identifier for t in later))
            .as_string(conn)
        )
    return CheckResult(
        "replica identity",
        False,
        f"updates and deletes cannot be captured for: {', '.join(reasons)}",
        "\n".join(lines),
    )


def check_row_security(
    conn: psycopg.Connection, role: Role, tables: Sequence[TableFacts]
) -> CheckResult:
    hidden = [t for t in tables if t.row_security_active]
    if not hidden:
        return CheckResult("row-level security", True, "no row-level security hides rows")
    return CheckResult(
        "row-level security",
        False,
        f"row-level security applies to role {role.name!r} on "
        f"{', '.join(t.qualified_name for t in hidden)}: the snapshot would miss rows",
        sql.SQL("ALTER ROLE {} BYPASSRLS;").format(sql.Identifier(role.name)).as_string(conn),
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


def _provision(
    conn: psycopg.Connection, statement: sql.Composed, run: bool, done: str, problem: str
) -> CheckResult:
    """Run ``statement`` if allowed to; otherwise, or if it fails, report it as the fix."""
    text = statement.as_string(conn)
    if not run:
        return CheckResult("publication", False, problem, text)
    try:
        conn.execute(statement)
    except psycopg.Error as exc:
        return CheckResult("publication", False, f"{problem}; {_primary(exc)}", text)
    return CheckResult("publication", True, done)


def _publication(conn: psycopg.Connection, publication: str) -> tuple | None:
    with server_errors():
        return conn.execute(
            sql.SQL(
                "SELECT puballtables, pg_has_role(pubowner, 'USAGE'),"
                " ARRAY[pubinsert, pubupdate, pubdelete, pubtruncate]"
                " FROM pg_publication WHERE pubname = {}"
            ).format(sql.Literal(publication))
        ).fetchone()


def _published_tables(conn: psycopg.Connection, publication: str) -> list[tuple[str, str]]:
    with server_errors():
        rows = conn.execute(
            sql.SQL(
                "SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = {}"
                " ORDER BY schemaname, tablename"
            ).format(sql.Literal(publication))
        ).fetchall()
    return [(schema, name) for schema, name in rows]


def _can_create_in_db(conn: psycopg.Connection) -> bool:
    with server_errors():
        (allowed,) = conn.execute(
            "SELECT has_database_privilege(current_database(), 'CREATE')"
        ).fetchone()
    return allowed


def _setting(conn: psycopg.Connection, name: str) -> str:
    with server_errors():
        (value,) = conn.execute(
            sql.SQL("SELECT current_setting({})").format(sql.Literal(name))
        ).fetchone()
    return value


def _guarded(name: str, check: Callable[..., Any], *args: Any) -> list[CheckResult]:
    """Run one check; an error inside it becomes its failed result, not the end of the report."""
    try:
        result = check(*args)
    except (PipelineError, psycopg.Error) as exc:
        message = _primary(exc) if isinstance(exc, psycopg.Error) else str(exc)
        return [CheckResult(name, False, f"check could not run: {message}")]
    return result if isinstance(result, list) else [result]


def _primary(exc: psycopg.Error) -> str:
    return " ".join((exc.diag.message_primary or str(exc)).split())
