"""Doctor's replica identity and row-security checks, and the advice they print.

Advice is SQL that is safe to run in production: it never changes what a table publishes in a
way that breaks the application's updates (see :func:`identity_advice`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import psycopg
from psycopg import sql

from pgmedallion.capture.preflight import CheckResult, Role, TableFacts
from pgmedallion.capture.snapshot import publishes_stored_generated


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
