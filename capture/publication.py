"""Doctor's checks of the tables to capture: they exist, the role reads them, and the
publication covers them (created or extended only when the caller allows it)."""

from __future__ import annotations

from collections.abc import Sequence

import psycopg
from psycopg import sql

from pgmedallion.capture.errors import server_errors
from pgmedallion.capture.preflight import CheckResult, Role, TableFacts, server_message
from pgmedallion.capture.published import filter_columns, published

PUBLISH_ACTIONS = ("insert", "update", "delete", "truncate")


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
        wanted = published_tables(conn, publication)
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
    published = set(published_tables(conn, publication))
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


def check_published(
    conn: psycopg.Connection, publication: str, tables: Sequence[TableFacts]
) -> list[CheckResult]:
    """What the publication publishes of each table: its column list and row filter (what
    capture lands too), and a warning where the replica identity does not cover them.

    PostgreSQL rejects the application's UPDATE and DELETE on a table whose row filter uses a
    column outside the replica identity, or whose column list leaves out a replica identity
    column: nothing breaks for capture, everything for the application.
    """
    facts = _identity_facts(conn, tables)
    shapes = published(conn, publication, [f[0] for f in facts.values()])
    said, uncovered = [], []
    for key in sorted(facts):
        oid, identity, columns, identity_columns = facts[key]
        shape = shapes.get(oid)
        if shape is None or (shape.columns is None and shape.row_filter is None):
            continue
        name = ".".join(key)
        parts = []
        if shape.columns is not None:
            withheld = [c for c in columns if c not in shape.columns]
            parts.append(
                f"columns {', '.join(shape.columns)}"
                + (f" (withheld: {', '.join(withheld)})" if withheld else "")
            )
            missing = [c for c in identity_columns if c not in shape.columns]
            if missing:
                uncovered.append(
                    f"{name}: the column list leaves out replica identity column(s) "
                    f"{', '.join(missing)}"
                )
        if shape.row_filter is not None:
            parts.append(f"rows where {shape.row_filter}")
            outside = [
                c for c in filter_columns(shape.row_filter, columns) if c not in identity_columns
            ]
            if outside and identity != "f":
                uncovered.append(
                    f"{name}: the row filter uses {', '.join(outside)}, outside the replica "
                    f"identity ({', '.join(identity_columns) or 'none'})"
                )
        said.append(f"{name}: {'; '.join(parts)}")
    results = [
        CheckResult(
            "published columns and rows",
            True,
            "; ".join(said)
            if said
            else "every column and row of every table (no column lists or row filters)",
        )
    ]
    if uncovered:
        results.append(
            CheckResult(
                "published columns and rows",
                True,
                "PostgreSQL rejects UPDATE and DELETE on these tables until their replica "
                "identity covers the publication's column list and row filter: "
                + "; ".join(uncovered),
                "-- filter only on replica identity columns and list every one of them, or\n"
                "-- give the table an identity that covers them (see the replica identity "
                "check's advice)",
                warning=True,
            )
        )
    return results


def _identity_facts(
    conn: psycopg.Connection, tables: Sequence[TableFacts]
) -> dict[tuple[str, str], tuple[int, str, list[str], list[str]]]:
    """(schema, name) -> (oid, replica identity, published-kind columns, identity columns)."""
    if not tables:
        return {}
    keys = sql.SQL(", ").join(
        sql.SQL("({}, {})").format(sql.Literal(t.schema), sql.Literal(t.name)) for t in tables
    )
    with server_errors():
        rows = conn.execute(
            sql.SQL(
                "SELECT n.nspname, c.relname, c.oid::int8, c.relreplident::text,"
                " ARRAY(SELECT a.attname::text FROM pg_attribute a WHERE a.attrelid = c.oid"
                "  AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum),"
                " ARRAY(SELECT a.attname::text FROM pg_index i JOIN pg_attribute a"
                "  ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)"
                "  WHERE i.indrelid = c.oid AND CASE c.relreplident WHEN 'd' THEN i.indisprimary"
                "  WHEN 'i' THEN i.indisreplident ELSE false END ORDER BY a.attnum)"
                " FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
                " WHERE (n.nspname, c.relname) IN ({})"
            ).format(keys)
        ).fetchall()
    out = {}
    for schema, name, oid, identity, columns, identity_columns in rows:
        if identity == "f":
            identity_columns = columns
        out[(schema, name)] = (oid, identity, list(columns), list(identity_columns))
    return out


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
        return CheckResult("publication", False, f"{problem}; {server_message(exc)}", text)
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


def published_tables(conn: psycopg.Connection, publication: str) -> list[tuple[str, str]]:
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
