"""Read every captured table at one consistent LSN, in parallel ctid ranges.

Consistent point
    Replication timestamps each change with its commit LSN, so the snapshot must be taken at an
    LSN too, and an ordinary transaction has none. Creating a logical slot as the first
    statement of a ``REPEATABLE READ`` transaction (``USE_SNAPSHOT``) puts that transaction at
    the slot's consistent point: it sees exactly the transactions that commit before
    ``consistent_point``, so its view is the table's state at ``snapshot_lsn =
    consistent_point - 1``. The slot is ``TEMPORARY`` and is never read; the main slot cannot
    serve, because after a crash its creating transaction is gone and so is that chance.
    Rewinding the snapshot to the main slot's start happens downstream (see DESIGN.md).

Sharing it
    ``pg_export_snapshot()`` names the view, and any session (another process, a Spark task)
    enters it with ``SET TRANSACTION SNAPSHOT`` (:func:`use_snapshot`). A snapshot can only be
    imported while the exporting transaction is open, so :func:`exported_snapshot` holds it for
    the duration of a ``with`` block: the leader closes the block after every worker imported.

Parallel ranges
    ``ctid`` is ``(block, item)``; ``ctid >= '(a,0)' AND ctid < '(b,0)'`` selects whole blocks
    ``[a, b)`` with a TID Range Scan (PostgreSQL >= 14). The block count comes from
    ``pg_relation_size`` (``relpages`` is 0 before the first ANALYZE), and the last range is
    open-ended so rows on blocks added since the estimate are still read. Below 14 a range
    predicate would scan the whole table once per range, so each table is one range.

::

    leader: replication session                    workers: one session each
    ┌──────────────────────────────────────┐
    │ BEGIN READ ONLY REPEATABLE READ      │
    │ CREATE_REPLICATION_SLOT tmp          │  snapshot_name   ┌────────────────────────────┐
    │   TEMPORARY LOGICAL pgoutput         │  block counts    │ BEGIN REPEATABLE READ      │
    │   USE_SNAPSHOT     -> consistent_pt  ├─────────────────>│ SET TRANSACTION SNAPSHOT   │
    │ SELECT pg_export_snapshot()          │                  │ COPY (SELECT cols FROM t   │
    │            ... held open ...         │                  │   WHERE ctid range) TO     │
    │ COMMIT  (after every worker imported)│                  │   STDOUT  -> raw row bytes │
    └──────────────────────────────────────┘                  └────────────────────────────┘

All SQL is composed with ``psycopg.sql`` (identifiers and literals), so any schema, table or
column name works, quotes and all, and nothing here needs server-side parameters (which a
replication session does not support).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import psycopg
from psycopg import sql

from pgmedallion.capture.connection import connect, connect_replication
from pgmedallion.capture.copy_stream import asyncpg_params, copy_chunks
from pgmedallion.capture.errors import (
    PipelineError,
    PublicationDropped,
    SnapshotWaiting,
    TableDropped,
    TransientError,
    server_errors,
)
from pgmedallion.capture.pgoutput import parse_lsn
from pgmedallion.capture.published import (
    EXCLUDE,
    HASH,
    TEXT_OID,
    Shape,
    check_protected_present,
)
from pgmedallion.capture.schema_changes import TYPE_FACTS_SQL, TYPE_JOINS_SQL, Catalog, catalog_of

log = logging.getLogger(__name__)

TID_RANGE_SCAN_MIN_VERSION = 140000

CtidRange = tuple[int, int | None]
"""Blocks ``[start, end)``; ``end`` is ``None`` for the open-ended last range."""

WHOLE_TABLE: CtidRange = (0, None)


@dataclass(frozen=True)
class SnapshotPoint:
    snapshot_name: str
    consistent_point_lsn: int
    snapshot_lsn: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "snapshot_lsn", self.consistent_point_lsn - 1)


@dataclass(frozen=True)
class Column:
    name: str
    type_oid: int
    typmod: int
    not_null: bool
    type_name: str
    generated: bool
    """A generated column the stream does not carry, so capture leaves it out of the snapshot
    too: a virtual one (never published), or a stored one unless the publication publishes
    them (PostgreSQL 18's ``publish_generated_columns = stored``; older servers never do)."""
    base_type_oid: int = 0
    """For a domain (or a domain over a domain): the underlying base type's oid; else 0."""
    element_type_oid: int = 0
    """For an array (or a domain over one): the element type's oid, itself resolved through
    domains; else 0."""
    category: str = ""
    """``pg_type.typcategory`` of the base type: ``A`` array, ``E`` enum, ``N`` numeric, ..."""
    dims: int = 0
    """``pg_attribute.attndims``: the dimensions the column was declared with (``int[][]``:
    2; 0 for a non-array, and for a domain over an array). PostgreSQL does not enforce it."""
    domain_typmod: int = -1
    """For a domain: the type modifier it declares (a domain over ``numeric(10,2)``), which
    the column's own (``typmod``) and pgoutput's Relation messages leave at -1; else -1."""


@dataclass(frozen=True)
class TableSchema:
    oid: int
    schema: str
    name: str
    columns: tuple[Column, ...]
    primary_key: tuple[str, ...]
    replica_identity: str
    """``pg_class.relreplident``: ``d`` default, ``n`` nothing, ``f`` full, ``i`` index."""
    partitions: tuple[int, ...] = ()
    """A partitioned table (published through its root): its leaf partitions' OIDs. Attaching
    or detaching one changes the table's rows without a change message, so capture snapshots
    the table again when this set changes (:func:`leaf_partitions`)."""
    shape: Shape | None = None
    """What of the table lands (``capture.published``): column list, row filter, policies. The
    columns above are then the landed ones; None: the catalog's, unshaped."""
    catalog: dict | None = None
    """The table's catalog fingerprint at the snapshot (``capture.schema_changes.Catalog``):
    what later checks compare the catalog with, to see migrations the stream cannot show."""


@dataclass(frozen=True)
class PublishedTable:
    oid: int
    schema: str
    name: str


def export_snapshot(repl_conn: psycopg.Connection, temp_slot_name: str) -> SnapshotPoint:
    """Open the exporting transaction on ``repl_conn`` and name its view.

    The transaction stays open; committing it (or closing the session) ends the chance for
    anyone to import the snapshot and drops the temporary slot. Creating the slot waits until
    every transaction open on the server (with a transaction id) has ended.
    """
    with server_errors():
        repl_conn.execute("BEGIN READ ONLY ISOLATION LEVEL REPEATABLE READ")
        row = repl_conn.execute(
            sql.SQL("CREATE_REPLICATION_SLOT {} TEMPORARY LOGICAL pgoutput USE_SNAPSHOT").format(
                sql.Identifier(temp_slot_name)
            )
        ).fetchone()
        (snapshot_name,) = repl_conn.execute("SELECT pg_export_snapshot()").fetchone()
    return SnapshotPoint(snapshot_name, parse_lsn(row[1]))


WAIT_REPORT_S = 5.0
"""How long a snapshot waits on open transactions before it names them (then every minute)."""


@dataclass(frozen=True)
class OpenTransaction:
    pid: int
    xid: str
    open_s: float
    state: str
    application: str

    def __str__(self) -> str:
        app = f", application {self.application!r}" if self.application else ""
        return f"pid {self.pid} (xid {self.xid}, open {self.open_s:.0f} s, {self.state}{app})"


def open_transactions(conn: psycopg.Connection, exclude: Sequence[int]) -> list[OpenTransaction]:
    """The transactions open on the server that hold a transaction id, oldest first (what a new
    snapshot's slot waits for); prepared transactions are listed with pid 0."""
    with server_errors():
        rows = conn.execute(
            "SELECT pid, backend_xid::text, extract(epoch FROM now() - xact_start)::float8,"
            " coalesce(state, ''), coalesce(application_name, '')"
            " FROM pg_stat_activity WHERE backend_xid IS NOT NULL AND pid <> ALL(%s)"
            " UNION ALL SELECT 0, transaction::text,"
            " extract(epoch FROM now() - prepared)::float8, 'prepared ' || quote_literal(gid), ''"
            " FROM pg_prepared_xacts ORDER BY 3 DESC",
            (list(exclude),),
        ).fetchall()
    return [OpenTransaction(int(p), x, float(s or 0), st, app) for p, x, s, st, app in rows]


@contextmanager
def _watched(conninfo: Mapping[str, Any], repl_conn: psycopg.Connection, wait_s: float | None):
    """While the ``with`` block creates the snapshot's slot: name the transactions it waits on
    (after :data:`WAIT_REPORT_S`, then every minute) and, after ``wait_s``, cancel it with
    :class:`SnapshotWaiting`."""
    done = threading.Event()
    gave_up = threading.Event()
    waiting_pid = repl_conn.info.backend_pid

    def watch() -> None:
        started = time.monotonic()
        next_report = started + WAIT_REPORT_S
        conn = None
        try:
            while not done.wait(0.5):
                now = time.monotonic()
                late = wait_s is not None and now - started >= wait_s
                if now < next_report and not late:
                    continue
                next_report = now + 60
                try:
                    conn = conn if conn is not None and not conn.closed else connect(conninfo)
                    if late:
                        gave_up.set()
                        with server_errors():
                            conn.execute("SELECT pg_cancel_backend(%s)", (waiting_pid,))
                        return
                    open_now = open_transactions(conn, [waiting_pid, conn.info.backend_pid])
                except PipelineError as exc:  # advice only: the next round tries again
                    log.debug("snapshot: could not list or cancel: %s", exc)
                    continue
                if open_now:
                    log.warning(
                        "snapshot: waiting %.0f s for open transactions to end: %s",
                        now - started,
                        "; ".join(str(t) for t in open_now[:5]),
                    )
        finally:
            if conn is not None:
                conn.close()

    watcher = threading.Thread(target=watch, name="snapshot-wait", daemon=True)
    watcher.start()
    try:
        yield
    except PipelineError as exc:
        if gave_up.is_set() and exc.sqlstate == "57014":  # our cancel, not another failure
            raise SnapshotWaiting(
                f"gave up after {wait_s:.0f} s waiting for transactions open on the server to "
                "end (see the warnings above for their pids); the tables are left to the next run"
            ) from exc
        raise
    finally:
        done.set()
        watcher.join()


@contextmanager
def exported_snapshot(
    conninfo: Mapping[str, Any], temp_slot_name: str, wait_s: float | None = None
) -> Iterator[SnapshotPoint]:
    """Hold an exported snapshot open for the ``with`` block, then end it and drop its slot.

    The snapshot waits for transactions open on the server to end, naming them as it waits;
    ``wait_s``: give up after that long (:class:`SnapshotWaiting`; None: wait on)."""
    repl_conn = connect_replication(conninfo)
    try:
        with _watched(conninfo, repl_conn, wait_s):
            point = export_snapshot(repl_conn, temp_slot_name)
        yield point
        with server_errors():
            repl_conn.execute("COMMIT")
            # Closing the session would drop the slot too, but only once the server notices.
            repl_conn.execute(
                sql.SQL("DROP_REPLICATION_SLOT {}").format(sql.Identifier(temp_slot_name))
            )
    finally:
        repl_conn.close()


def use_snapshot(conn: psycopg.Connection, snapshot_name: str) -> None:
    """Begin a read-only transaction on ``conn`` (autocommit) inside an exported snapshot."""
    with server_errors():
        conn.execute("BEGIN READ ONLY ISOLATION LEVEL REPEATABLE READ")
        conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(snapshot_name)))


def publication_tables(conn: psycopg.Connection, publication: str) -> list[PublishedTable]:
    """The tables ``publication`` publishes, by schema and name."""
    with server_errors():
        exists = conn.execute(
            sql.SQL("SELECT 1 FROM pg_publication WHERE pubname = {}").format(
                sql.Literal(publication)
            )
        ).fetchone()
        if exists is None:
            raise PublicationDropped(f"publication {publication!r} does not exist")
        rows = conn.execute(
            sql.SQL(
                "SELECT c.oid, n.nspname, c.relname"
                " FROM pg_publication_tables p"
                " JOIN pg_namespace n ON n.nspname = p.schemaname"
                " JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = p.tablename"
                " WHERE p.pubname = {} ORDER BY n.nspname, c.relname"
            ).format(sql.Literal(publication))
        ).fetchall()
    return [PublishedTable(int(oid), schema, name) for oid, schema, name in rows]


def publishes_stored_generated(conn: psycopg.Connection, publication: str) -> bool:
    """Whether ``publication`` sends stored generated columns (PostgreSQL 18+)."""
    if conn.info.server_version < 180000:
        return False
    with server_errors():
        row = conn.execute(
            "SELECT pubgencols::text = 's' FROM pg_publication WHERE pubname = %s", (publication,)
        ).fetchone()
    return bool(row and row[0])


def table_schema_at_snapshot(
    conn: psycopg.Connection, oid: int, *, stored_generated: bool = False
) -> TableSchema:
    """The table's columns (in order), primary key and replica identity, as ``conn`` sees them.

    Inside :func:`use_snapshot` that is the schema at the snapshot, which is the schema the
    snapshot rows have; a table dropped by then raises :class:`TableDropped`.
    ``stored_generated``: the publication publishes stored generated columns (see
    :func:`publishes_stored_generated`), so they are captured like any other column.
    """
    oid_literal = sql.Literal(int(oid))
    left_out = "a.attgenerated = 'v'" if stored_generated else "a.attgenerated <> ''"
    with server_errors():
        table = conn.execute(
            sql.SQL(
                "SELECT n.nspname, c.relname, c.relreplident::text FROM pg_class c"
                " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = {}::oid"
            ).format(oid_literal)
        ).fetchone()
        if table is None:
            raise TableDropped(f"table with oid {oid} does not exist")
        columns = conn.execute(
            sql.SQL(
                "SELECT a.attname, a.atttypid::int8, a.atttypmod, a.attnotnull,"
                " format_type(a.atttypid, a.atttypmod), "
                + left_out
                + ","
                + TYPE_FACTS_SQL
                + " FROM pg_attribute a"
                + TYPE_JOINS_SQL
                + " WHERE a.attrelid = {}::oid AND a.attnum > 0"
                " AND NOT a.attisdropped ORDER BY a.attnum"
            ).format(oid_literal)
        ).fetchall()
        primary_key = conn.execute(
            sql.SQL(
                "SELECT a.attname FROM pg_index i"
                " CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, position)"
                " JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum"
                " WHERE i.indrelid = {}::oid AND i.indisprimary ORDER BY k.position"
            ).format(oid_literal)
        ).fetchall()
    schema, name, replica_identity = table
    return TableSchema(
        oid=int(oid),
        schema=schema,
        name=name,
        columns=tuple(Column(*column) for column in columns),
        primary_key=tuple(key for (key,) in primary_key),
        replica_identity=replica_identity,
        partitions=leaf_partitions(conn, [int(oid)]).get(int(oid), ()),
        catalog=catalog_of(conn, [int(oid)])[int(oid)].to_record(),
    )


def shaped(schema: TableSchema, shape: Shape) -> TableSchema:
    """``schema`` as it lands: only listed columns, excluded ones gone, hashed ones text.

    A stored generated column named in a column list is published (PostgreSQL 18), so it is
    captured. A primary key that lost a column is no key of what lands.
    """
    check_protected_present(
        f"{schema.schema}.{schema.name}",
        dict(shape.policies),
        {column.name for column in schema.columns},
        shape.column_list,
    )
    listed = None if shape.column_list is None else set(shape.column_list)
    columns = []
    for column in schema.columns:
        if listed is not None:
            if column.name not in listed:
                continue
            column = replace(column, generated=False)
        rule = shape.rule(column.name)
        if rule == EXCLUDE:
            continue
        if rule == HASH:
            column = replace(
                column,
                type_oid=TEXT_OID,
                typmod=-1,
                type_name="text",
                base_type_oid=0,
                element_type_oid=0,
                category="S",
            )
        columns.append(column)
    kept = {column.name for column in columns}
    key = schema.primary_key if all(k in kept for k in schema.primary_key) else ()
    catalog = Catalog.from_record(schema.catalog)
    if catalog is not None:  # no value of a withheld column in bronze, not even its default
        policied = {name for name, _ in shape.policies}
        schema = replace(schema, catalog=catalog.landed(shape.column_list, policied).to_record())
    return replace(schema, columns=tuple(columns), primary_key=key, shape=shape)


def copy_columns(schema: TableSchema) -> tuple[list[str], list[int]]:
    """The columns a snapshot of ``schema`` (shaped) copies, and the positions of hashed ones."""
    columns = [c.name for c in schema.columns if not c.generated]
    shape = schema.shape or Shape()
    return columns, [i for i, name in enumerate(columns) if shape.rule(name) == HASH]


def leaf_partitions(conn: psycopg.Connection, oids: Sequence[int]) -> dict[int, tuple[int, ...]]:
    """The leaf partitions of those of ``oids`` that are partitioned tables."""
    if not oids:
        return {}
    with server_errors():
        rows = conn.execute(
            "SELECT c.oid::int8, array_agg(t.relid::int8 ORDER BY t.relid::int8)"
            " FROM pg_class c CROSS JOIN LATERAL pg_partition_tree(c.oid) t"
            " WHERE c.oid = ANY(%s::oid[]) AND c.relkind = 'p' AND t.isleaf GROUP BY c.oid",
            (list(oids),),
        ).fetchall()
    return {int(oid): tuple(leaves) for oid, leaves in rows}


def estimate_table_block_counts(conn: psycopg.Connection, oids: Iterable[int]) -> dict[int, int]:
    """Blocks per table from the relation's size on disk; 0 for an unknown oid."""
    counts = dict.fromkeys((int(oid) for oid in oids), 0)
    if not counts:
        return counts
    with server_errors():
        rows = conn.execute(
            sql.SQL(
                "SELECT oid::int8, pg_relation_size(oid) / current_setting('block_size')::int8"
                " FROM pg_class WHERE oid IN ({})"
            ).format(sql.SQL(", ").join(sql.Literal(oid) for oid in counts))
        ).fetchall()
    counts.update((oid, int(blocks)) for oid, blocks in rows)
    return counts


def worker_ctid_ranges(block_count: int, workers: int, server_version: int) -> list[CtidRange]:
    """Split ``block_count`` blocks into at most ``workers`` contiguous ranges, last open-ended.

    ``server_version`` is ``conn.info.server_version`` (e.g. ``150013``). An empty-looking
    table, one worker, or a server without TID Range Scans gets one whole-table range.
    """
    if server_version < TID_RANGE_SCAN_MIN_VERSION or block_count <= 0 or workers <= 1:
        return [WHOLE_TABLE]
    count = min(workers, block_count)
    bounds = [i * block_count // count for i in range(count)]
    return [(start, end) for start, end in zip(bounds, bounds[1:], strict=False)] + [
        (bounds[-1], None)
    ]


def copy_range(
    conninfo: Mapping[str, Any],
    snapshot_name: str,
    table: tuple[str, str],
    columns: Sequence[str],
    ctid_range: CtidRange,
    row_filter: str | None = None,
) -> Iterator[bytes]:
    """Each row of ``table`` (schema, name) in ``ctid_range``, as of the snapshot.

    A row is its COPY TEXT line without the trailing newline: columns separated by tabs,
    ``\\N`` for NULL, backslash escapes inside values. The generator owns its own session; it
    drains the COPY before leaving, and closes the session if the caller stops early.
    """
    for line in _copy_lines(conninfo, snapshot_name, table, columns, ctid_range, row_filter):
        yield bytes(line[:-1])


def copy_range_chunks(
    conninfo: Mapping[str, Any],
    snapshot_name: str,
    table: tuple[str, str],
    columns: Sequence[str],
    ctid_range: CtidRange,
    chunk_bytes: int = 4 << 20,
    row_filter: str | None = None,
) -> Iterator[tuple[int, bytes]]:
    """The rows of :func:`copy_range` as ``(row_count, chunk)``: consecutive COPY TEXT lines,
    each ending in its newline, exactly as the server sent them, about ``chunk_bytes`` each.

    A COPY TEXT value never holds a raw newline (it is written ``\\n``), so the newlines are
    the row boundaries. This is the snapshot's hot loop: where the conninfo allows it
    (:func:`pgmedallion.capture.copy_stream.asyncpg_params`), the server's messages are read in
    socket-buffer pieces by asyncpg and no Python code runs per row; otherwise psycopg reads
    them a row at a time and they are joined here.
    """
    params = asyncpg_params(conninfo)
    if params is not None:
        yield from copy_chunks(
            params,
            [
                sql.SQL("SET TRANSACTION SNAPSHOT {}")
                .format(sql.Literal(snapshot_name))
                .as_string(None),
                _lock_nowait(table).as_string(None),
            ],
            select_query(table, columns, ctid_range, row_filter).as_string(None),
            chunk_bytes,
            conninfo,
        )
        return
    lines: list[memoryview] = []
    size = 0
    for line in _copy_lines(conninfo, snapshot_name, table, columns, ctid_range, row_filter):
        lines.append(line)
        size += len(line)
        if size >= chunk_bytes:
            yield len(lines), b"".join(lines)
            lines, size = [], 0
    if lines:
        yield len(lines), b"".join(lines)


def _lock_nowait(table: tuple[str, str]) -> sql.Composed:
    # The leader holds ACCESS SHARE on the table (lock_for_snapshot); waiting here behind a
    # DROP queued on it would wait forever, so fail (transiently) instead.
    return sql.SQL("LOCK TABLE ONLY {} IN ACCESS SHARE MODE NOWAIT").format(sql.Identifier(*table))


def _copy_lines(
    conninfo: Mapping[str, Any],
    snapshot_name: str,
    table: tuple[str, str],
    columns: Sequence[str],
    ctid_range: CtidRange,
    row_filter: str | None,
) -> Iterator[memoryview]:
    """The COPY's messages (one row each, newline included), in a session of its own."""
    query = copy_query(table, columns, ctid_range, row_filter)
    conn = connect(conninfo)
    try:
        use_snapshot(conn, snapshot_name)
        with server_errors():
            conn.execute(_lock_nowait(table))
        with server_errors(), conn.cursor() as cursor, cursor.copy(query) as copy:
            yield from copy
        with server_errors():
            conn.execute("COMMIT")
    finally:
        conn.close()


def select_query(
    table: tuple[str, str],
    columns: Sequence[str],
    ctid_range: CtidRange,
    row_filter: str | None = None,
) -> sql.Composed:
    """``SELECT columns FROM table WHERE (row filter) AND <ctid range>``.

    ``row_filter`` is a publication's filter as PostgreSQL itself prints it from its catalog
    (``capture.published``), so it is taken as SQL; a row passes where it is true, as in the
    stream (NULL is false in a WHERE as there).
    """
    start, end = ctid_range
    conditions = []
    if row_filter is not None:
        conditions.append(sql.SQL("({})").format(sql.SQL(row_filter)))
    if ctid_range != WHOLE_TABLE:
        conditions.append(sql.SQL("ctid >= {}::tid").format(sql.Literal(f"({start},0)")))
    if end is not None:
        conditions.append(sql.SQL("ctid < {}::tid").format(sql.Literal(f"({end},0)")))
    where = sql.SQL(" WHERE ") + sql.SQL(" AND ").join(conditions) if conditions else sql.SQL("")
    return sql.SQL("SELECT {columns} FROM {table}{where}").format(
        columns=sql.SQL(", ").join(sql.Identifier(column) for column in columns),
        table=sql.Identifier(*table),
        where=where,
    )


def copy_query(
    table: tuple[str, str],
    columns: Sequence[str],
    ctid_range: CtidRange,
    row_filter: str | None = None,
) -> sql.Composed:
    """``COPY (SELECT columns FROM table WHERE ...) TO STDOUT`` (see :func:`select_query`)."""
    return sql.SQL("COPY ({}) TO STDOUT").format(
        select_query(table, columns, ctid_range, row_filter)
    )


def lock_for_snapshot(conn: psycopg.Connection, oid: int, table: tuple[str, str]) -> None:
    """Hold ``ACCESS SHARE`` on ``table`` in ``conn``'s open transaction, as ``pg_dump`` does.

    Taken by the snapshot's leader right after it enters the snapshot, the lock makes a
    ``DROP TABLE`` (or any ``ACCESS EXCLUSIVE`` DDL) wait until every range is copied, so a
    table that exists at the snapshot is copied whole. A table already dropped raises
    :class:`TableDropped`; one that still exists under another name (renamed since the
    snapshot, so its COPY by name would fail) raises a transient error: the next run reads
    the publication again. Each attempt runs in a savepoint so a failure leaves the
    transaction usable for the other tables.
    """
    with server_errors():
        conn.execute("SAVEPOINT pgm_lock")
        try:
            conn.execute(
                sql.SQL("LOCK TABLE ONLY {} IN ACCESS SHARE MODE").format(sql.Identifier(*table))
            )
            (found,) = conn.execute(
                sql.SQL("SELECT to_regclass({})::oid::int8").format(
                    sql.Literal(sql.Identifier(*table).as_string(conn))
                )
            ).fetchone()
        except psycopg.errors.UndefinedTable:
            conn.execute("ROLLBACK TO SAVEPOINT pgm_lock")
            found = None
        conn.execute("RELEASE SAVEPOINT pgm_lock")
        if found == oid:
            return
        # pg_relation_size reads the current catalog, not the snapshot: NULL once dropped.
        (size,) = conn.execute(
            sql.SQL("SELECT pg_relation_size({}::oid)").format(sql.Literal(int(oid)))
        ).fetchone()
    name = ".".join(table)
    if size is None:
        raise TableDropped(f"table {name} (oid {oid}) was dropped before its snapshot")
    raise TransientError(f"table {name} (oid {oid}) was renamed or replaced during the snapshot")
