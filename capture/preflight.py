"""What every doctor check shares: its result, the role, the facts about a table."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from pgmedallion.capture.errors import PipelineError, server_errors


@dataclass(frozen=True)
class CheckResult:
    name: str
    ok: bool
    message: str
    remediation_sql: str | None = None
    warning: bool = False
    """Passed, but says something the user should act on (the run goes ahead)."""


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


def current_role(conn: psycopg.Connection) -> Role:
    with server_errors():
        row = conn.execute(
            "SELECT rolname, rolsuper, rolreplication, rolbypassrls"
            " FROM pg_roles WHERE rolname = current_user"
        ).fetchone()
    return Role(*row)


def setting(conn: psycopg.Connection, name: str) -> str:
    with server_errors():
        (value,) = conn.execute(
            sql.SQL("SELECT current_setting({})").format(sql.Literal(name))
        ).fetchone()
    return value


def guarded(name: str, check: Callable[..., Any], *args: Any) -> list[CheckResult]:
    """Run one check; an error inside it becomes its failed result, not the end of the report."""
    try:
        result = check(*args)
    except (PipelineError, psycopg.Error) as exc:
        message = server_message(exc) if isinstance(exc, psycopg.Error) else str(exc)
        return [CheckResult(name, False, f"check could not run: {message}")]
    return result if isinstance(result, list) else [result]


def server_message(exc: psycopg.Error) -> str:
    return " ".join((exc.diag.message_primary or str(exc)).split())
