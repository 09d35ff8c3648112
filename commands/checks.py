"""Configuration checks that need the source's catalog: run with ``doctor``, before a run writes.

Column policies (``[tables."s.t".columns]``) name columns and types; whether the table has such
a column, and whether its values can take the type, is known only from PostgreSQL's catalog.
Whether a type override fits is judged by silver's type mapping, which is made of Spark types:
``doctor`` runs without PySpark too, and then checks that every policy names a column (what
keeps a misspelt ``pii`` policy from leaking a column) and leaves the types to silver, which
checks them again before it writes anything.
"""

from __future__ import annotations

from pgmedallion.capture.connection import connect
from pgmedallion.capture.errors import PipelineError
from pgmedallion.capture.preflight import CheckResult
from pgmedallion.capture.snapshot import table_schema_at_snapshot
from pgmedallion.core.config import Config, ConfigError


def check_column_policies(cfg: Config) -> CheckResult:
    """Every configured column policy names an existing column and a type it can take."""
    wanted = {t: p for t, p in cfg.tables.items() if p.columns}
    if not wanted:
        return CheckResult("column policies", True, "no column overrides")
    try:
        conn = connect(cfg.source.conninfo())
    except PipelineError as exc:
        return CheckResult("column policies", False, f"check could not run: {exc}")
    problems = []
    if any(c.pii == "hash" for p in wanted.values() for c in p.columns.values()):
        try:
            cfg.source.hash_key()
        except ConfigError as exc:
            problems.append(str(exc))
    with conn:
        for table, policy in sorted(wanted.items()):
            schema, _, name = table.partition(".")
            row = conn.execute(
                "SELECT c.oid::int8 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
                " WHERE n.nspname = %s AND c.relname = %s",
                (schema, name),
            ).fetchone()
            if row is None:
                problems.append(f'[tables."{table}"]: no such table')
                continue
            schema = table_schema_at_snapshot(conn, row[0])
            columns = {c.name: c for c in schema.columns}
            problems += _policy_problems(table, policy, columns)
            problems += _pii_problems(conn, cfg.source.publication, table, policy, schema)
    if problems:
        return CheckResult("column policies", False, "; ".join(problems))
    return CheckResult("column policies", True, "every column override fits its column")


def _pii_problems(conn, publication: str, table: str, policy, schema) -> list[str]:
    """A pii policy that capture could not apply: ``exclude`` on a primary key column (under
    REPLICA IDENTITY DEFAULT its changes would lose their key), or a table the publication does
    not publish under this name (a partitioned table published through its leaves: the
    stream and the snapshot would name the leaves, which no policy names)."""
    pii = policy.pii()
    if not pii:
        return []
    key = f'[tables."{table}".columns]'
    problems = [
        f'{key} {name}: pii = "exclude" on a primary key column under REPLICA IDENTITY '
        'DEFAULT; use pii = "hash"'
        for name, rule in pii.items()
        if rule == "exclude" and schema.replica_identity == "d" and name in schema.primary_key
    ]
    exists = conn.execute(
        "SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = %s),"
        " EXISTS (SELECT 1 FROM pg_publication_tables WHERE pubname = %s"
        "  AND schemaname = %s AND tablename = %s)",
        (publication, publication, schema.schema, schema.name),
    ).fetchone()
    if exists[0] and not exists[1]:
        problems.append(
            f"{key}: publication {publication!r} does not publish {table} itself (a partitioned "
            "table published through its partitions?): its pii policies would apply to "
            "nothing; publish it with publish_via_partition_root = true, or name the "
            "published tables"
        )
    return problems


def _policy_problems(table: str, policy, columns: dict) -> list[str]:
    try:
        from pgmedallion.silver.policies import column_policy_problems
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.split(".")[0] != "pyspark":
            raise
        return [
            f'[tables."{table}".columns] {name}: {table} has no column {name!r}'
            for name in policy.columns
            if name not in columns
        ]
    return column_policy_problems(table, policy, columns)
