"""Small Delta commits without Spark: delta-rs (the ``deltalake`` package) where it can.

A Spark Delta commit of a few rows costs 0.25-2 s of driver time (the log, the commit
protocol, a job per step); delta-rs makes the same commit in 10-25 ms. Silver's appends and
gold's MERGEs use it for tables in a local directory (see ``Config.local_table_path``) and
Spark everywhere else (Databricks, a catalog, a table delta-rs cannot write).

Both engines honour the same idempotency record: a commit carries Delta's ``txn`` action
(``appId``, ``version``), written by Spark's ``txnAppId``/``txnVersion`` options or by
delta-rs' ``Transaction``, and a commit whose version is not above the recorded one is
skipped by either.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import tempfile
import threading
import time
import zlib
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import unquote, urlparse

import pyarrow as pa
import pyarrow.compute as pc

try:  # the `local` extra; a Databricks cluster commits through Spark
    from deltalake import (
        CommitProperties,
        DeltaTable,
        QueryBuilder,
        Schema,
        Transaction,
        write_deltalake,
    )
    from deltalake.exceptions import DeltaProtocolError
except ImportError:  # pragma: no cover - exercised only without the extra
    DeltaTable = None

from pgmedallion.core import engine
from pgmedallion.core.config import on_databricks
from pgmedallion.core.session import unstarted

log = logging.getLogger(__name__)


def usable(path: str | None) -> bool:
    """Whether delta-rs may write the Delta table at ``path`` (a local table that exists)."""
    if DeltaTable is None or path is None:
        return False
    if engine.spark_only():
        return False
    return (Path(path) / "_delta_log").is_dir()


def schema_dir(spark, schema: str) -> str | None:
    """The local directory of Spark schema ``schema`` (qualified, back-quoted), under which
    its managed tables live as ``<dir>/<table name in lower case>``; None when it is not on
    this file system, on Databricks, or delta-rs is not installed or turned off."""
    if DeltaTable is None or on_databricks():
        return None
    if engine.spark_only():
        return None
    if unstarted(spark):
        return spark.schema_dir(schema)
    key = (application(spark), schema)
    path = _SCHEMA_DIRS.get(key)
    if path is not None and Path(path).is_dir():
        return path  # a schema's location does not move while its directory is there
    rows = spark.sql(f"DESCRIBE SCHEMA EXTENDED {schema}").collect()
    info = {r[0].strip().lower(): r[1] for r in rows}
    url = urlparse(info.get("location") or "")
    if url.scheme not in ("file", ""):
        return None
    path = unquote(url.path)
    if not Path(path).is_dir():
        return None
    _SCHEMA_DIRS[key] = path
    return path


_SCHEMA_DIRS: dict[tuple[str, str], str] = {}
"""(Spark application, schema) -> its local directory: a run asks a dozen times."""


def application(spark) -> str:
    """The Spark application ``spark`` belongs to (its sessions share a catalog)."""
    if unstarted(spark):
        return f"unstarted-{id(spark)}"
    try:
        return spark.sparkContext.applicationId
    except Exception:  # Spark Connect: no SparkContext
        return f"session-{id(spark)}"


def bookkeeping_rows(
    spark, schema: str, table: str, columns: list[str], equal: Mapping[str, object]
) -> list[dict]:
    """The rows of one of a layer's own small tables (``_progress``, ``_frontier``, ...:
    ``table`` in the qualified ``schema``) whose columns equal ``equal``'s values, as dicts of
    ``columns``. Read by delta-rs where the table is a local directory (milliseconds), else by
    Spark (a Delta snapshot and a job: 0.3-1 s each even in a warm JVM, and a run asks a dozen
    such questions). The caller's logic is the same over either engine's rows."""
    path = table_dir(schema_dir(spark, schema), table)
    if usable(path):
        sql = f"SELECT {sql_names(columns)} FROM t{_where(equal)}"
        return [{k: naive_utc(v) for k, v in row.items()} for row in query(path, sql).to_pylist()]
    return [r.asDict() for r in _spark_rows(spark, schema, table, equal).select(*columns).collect()]


def bookkeeping_max(
    spark, schema: str, table: str, column: str, equal: Mapping[str, object]
) -> object | None:
    """The largest ``column`` of the rows :func:`bookkeeping_rows` would read (None: none),
    computed where they are (a table with a row per run grows without end)."""
    path = table_dir(schema_dir(spark, schema), table)
    if usable(path):
        sql = f"SELECT max({sql_names([column])}) AS m FROM t{_where(equal)}"
        return query(path, sql).column("m")[0].as_py()
    from pyspark.sql import functions as F

    row = _spark_rows(spark, schema, table, equal).agg(F.max(column)).first()
    return row[0] if row else None


def bookkeeping_latest(
    spark, schema: str, table: str, columns: list[str], equal: Mapping[str, object], by: str
) -> dict | None:
    """The row of :func:`bookkeeping_rows` with the largest ``by`` (None: none), found where the
    rows are: a table with a row per run (``_progress``, ``_plans``) grows without end, and a
    run needs its newest row only."""
    path = table_dir(schema_dir(spark, schema), table)
    if usable(path):
        sql = (
            f"SELECT {sql_names(columns)} FROM t{_where(equal)}"
            f" ORDER BY {sql_names([by])} DESC NULLS LAST LIMIT 1"
        )
        rows = query(path, sql).to_pylist()
        return {k: naive_utc(v) for k, v in rows[0].items()} if rows else None
    from pyspark.sql import functions as F

    rows = _spark_rows(spark, schema, table, equal).orderBy(F.desc_nulls_last(by)).limit(1)
    found = rows.select(*columns).collect()
    return found[0].asDict() if found else None


def _where(equal: Mapping[str, object]) -> str:
    where = " AND ".join(f"{sql_names([k])} = {_literal(v)}" for k, v in equal.items())
    return f" WHERE {where}" if where else ""


def _spark_rows(spark, schema: str, table: str, equal: Mapping[str, object]):
    from pyspark.sql import functions as F

    df = spark.table(f"{schema}.`{table}`")
    for k, v in equal.items():
        df = df.where(F.col(k) == F.lit(v))
    return df


def bookkeeping_through_spark(spark, schema: str) -> bool:
    """Whether :func:`bookkeeping_rows` reads ``schema``'s small tables through a started
    Spark (a job each, 0.3-2 s, mostly waiting: worth making side by side) rather than by
    delta-rs in milliseconds."""
    return not unstarted(spark) and schema_dir(spark, schema) is None


def bookkeeping_columns(spark, schema: str, table: str) -> list[str]:
    """The columns of one of a layer's own small tables (see :func:`bookkeeping_rows`): a
    table made by an earlier version may lack the newest ones."""
    path = table_dir(schema_dir(spark, schema), table)
    if usable(path):
        return open_table(path).schema().to_arrow().names
    return spark.table(f"{schema}.`{table}`").columns


def naive_utc(value):
    """A Delta timestamp as Spark's rows give it here: naive, in UTC."""
    if isinstance(value, datetime) and value.tzinfo is not None:
        return value.astimezone(UTC).replace(tzinfo=None)
    return value


def _literal(value: object) -> str:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise TypeError(f"not a bookkeeping value: {value!r}")
    return str(value) if isinstance(value, int) else "'" + value.replace("'", "''") + "'"


def table_dir(schema: str | None, table: str) -> str | None:
    """Where managed table ``table`` of the schema at ``schema`` (:func:`schema_dir`) lives."""
    return None if schema is None else str(Path(schema) / table.lower())


def open_table(path: str) -> DeltaTable:
    """The Delta table at ``path`` at its newest version.

    A long-lived process (``run --continuous``) opens the same tables at every application:
    the table it opened before is brought up to date with the commits made since (a listing of
    the log past its version) instead of read again from its checkpoint, which took about a
    third of the delta-rs threads' time in a continuous pipeline. Unless the table at ``path``
    is no longer the one opened (dropped and created again, its log cleaned up): then the
    commit file of the version held is gone or another file, and the table is read afresh.
    One object per table is shared by the threads of the process; delta-rs serializes their
    calls into it, but a write commits outside its lock and then stores its new state: two
    threads writing one table at once could leave it at the older of their versions (no two
    threads write one table here: a stage gives each table to one thread)."""
    with _OPENED_LOCK:
        held = _OPENED.pop(path, None)
    table = None
    if held is not None and _commit_stamp(path, held[1]) == held[2]:
        try:
            held[0].update_incremental()
            table = held[0]
        except Exception as exc:  # read afresh below
            log.debug("delta-rs: %s read again (%s)", path, exc)
    if table is None:
        table = DeltaTable(path)
    version = table.version()
    stamp = _commit_stamp(path, version)
    with _OPENED_LOCK:
        if stamp is not None:
            _OPENED[path] = (table, version, stamp)
            while len(_OPENED) > _OPENED_MOST:
                _OPENED.popitem(last=False)  # the least recently opened
    return table


_OPENED: OrderedDict[str, tuple[DeltaTable, int, tuple[int, int, int, int]]] = OrderedDict()
_OPENED_MOST = 256
_OPENED_LOCK = threading.Lock()


def _commit_stamp(path: str, version: int) -> tuple[int, int, int, int] | None:
    """Which commit of ``version`` the table at ``path`` has (None: none): its file (inode,
    time, size, which a table dropped and written again within milliseconds can repeat) and a
    checksum of its first bytes (the commit's time and transaction id are there)."""
    try:
        with open(Path(path) / "_delta_log" / f"{version:020d}.json", "rb") as f:
            st = os.fstat(f.fileno())
            head = f.read(_STAMP_BYTES)
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size, zlib.crc32(head)


_STAMP_BYTES = 64 * 1024


def done(table: DeltaTable, app: str, version: int) -> bool:
    """Whether ``table`` already has a commit of ``app`` at ``version`` or later."""
    have = table.transaction_version(app)
    return have is not None and have >= version


def commit_properties(
    app: str | None,
    version: int | None,
    metadata: Mapping[str, str] | None = None,
    also: Sequence[str] = (),
) -> CommitProperties:
    """The commit's idempotency record (``app`` at ``version``, and each of ``also`` at the
    same version: the commit stands for theirs too) and ``commitInfo`` entries
    (``userMetadata`` as Spark writes it: a top-level string)."""
    transactions = None
    if app is not None and version is not None:
        transactions = [Transaction(a, version) for a in (app, *also)]
    return CommitProperties(
        app_transactions=transactions, custom_metadata=dict(metadata) if metadata else None
    )


def conforms(table: DeltaTable, names: list[str]) -> bool:
    """Whether rows with columns ``names`` can be appended: the table's column names, in any
    order (:func:`in_table_order` puts them in the table's; delta-rs cannot add a column to a
    column-mapped table). A column added by a later commit (schema evolution, a restatement)
    comes after silver's ``_lsn``, ``_diff`` and ``_run``, so the order differs then."""
    have = [f.name for f in table.schema().fields]
    return len(have) == len(names) and set(have) == set(names)


def in_table_order(table: DeltaTable, rows: pa.Table) -> pa.Table:
    """``rows`` with its columns in ``table``'s order (see :func:`conforms`)."""
    return rows.select([f.name for f in table.schema().fields])


def append(
    path: str,
    data: pa.Table,
    app: str,
    version: int,
    metadata: Mapping[str, str] | None = None,
    mode: str = "append",
    also: Sequence[str] = (),
) -> bool:
    """Append ``data`` to the table at ``path`` (``mode="overwrite"``: replace every row by
    it) as the commit of ``app`` at ``version`` (and of each of ``also``: see
    :func:`commit_properties`). False when that commit was made before (nothing is
    written)."""
    table = open_table(path)
    if done(table, app, version):
        return False
    write_deltalake(
        table,
        data,
        mode=mode,
        commit_properties=commit_properties(app, version, metadata, also),
    )
    return True


def append_pieces(
    path: str,
    schema: pa.Schema,
    pieces: Iterator[pa.Table],
    app: str,
    version: int,
    metadata: Mapping[str, str] | None = None,
    mode: str = "append",
    also: Sequence[str] = (),
) -> bool:
    """:func:`append` of the rows of ``pieces`` (tables of ``schema``), made as the writer asks
    for them: the driver holds one piece while the writer has the one before, whatever the
    whole's size. One commit, as :func:`append` makes it; none if ``pieces`` raises (that
    exception is raised here).

    Delta-rs' writer pulls rows from within its own runtime, where another delta-rs call (a
    read a piece needs) cannot run, so the pieces are made in a thread of their own, one ahead
    of the writer."""
    table = open_table(path)
    if done(table, app, version):
        return False
    ahead: queue.Queue = queue.Queue(maxsize=1)
    stop = threading.Event()
    failed: list[BaseException] = []
    waited = {"writer": 0.0, "pieces": 0.0, "made": 0}  # seconds each side waited on the other

    def hand(item) -> None:
        start = time.perf_counter()
        while not stop.is_set():
            try:
                ahead.put(item, timeout=0.2)
                break
            except queue.Full:
                continue
        waited["pieces"] += time.perf_counter() - start

    def make() -> None:
        try:
            for piece in pieces:
                hand(pa.table([piece.column(f.name).cast(f.type) for f in schema], schema=schema))
                if stop.is_set():
                    return  # the writer stopped: no next piece is made
        except BaseException as exc:  # noqa: BLE001 - raised on the caller's side
            failed.append(exc)
        hand(None)

    def batches():
        while True:
            start = time.perf_counter()
            piece = ahead.get()
            waited["writer"] += time.perf_counter() - start
            if piece is None:
                break
            waited["made"] += 1
            yield from piece.to_batches()
        if failed:
            raise RuntimeError("a piece failed")  # ends the write: nothing is committed

    maker = threading.Thread(target=make, name="delta-rs-pieces", daemon=True)
    maker.start()
    try:
        write_deltalake(
            table,
            pa.RecordBatchReader.from_batches(schema, batches()),
            mode=mode,
            commit_properties=commit_properties(app, version, metadata, also),
        )
    except BaseException:
        if failed:
            raise failed[0] from None
        raise
    finally:
        stop.set()
        maker.join()
    log.debug(
        "%s: %d pieces written; the writer waited %.1f s for them, they waited %.1f s for it",
        path,
        waited["made"],
        waited["writer"],
        waited["pieces"],
    )
    return True


def write_records(
    path: str | None,
    records: list[dict],
    names: list[str],
    *,
    app: str | None = None,
    version: int | None = None,
    replace_where: str | None = None,
) -> bool | None:
    """``records`` (column name -> value, for every one of ``names``) appended to the table at
    ``path`` in the table's own schema, as the commit of ``app`` at ``version`` when given;
    ``replace_where`` (a SQL predicate): replacing the rows it matches, in the same commit.
    False when that commit was made before (nothing is written). None when delta-rs cannot
    write the table here (not local, columns other than ``names``, a protocol delta-rs does
    not write): the caller writes through Spark."""
    if not usable(path):
        return None
    table = open_table(path)
    schema = pa.schema(table.schema().to_arrow())
    if sorted(schema.names) != sorted(names):
        return None
    if app is not None and version is not None and done(table, app, version):
        return False
    data = pa.Table.from_pylist(records, schema=schema)
    try:
        write_deltalake(
            table,
            data,
            mode="overwrite" if replace_where else "append",
            predicate=replace_where,
            commit_properties=commit_properties(app, version),
        )
    except DeltaProtocolError as exc:
        log.debug("delta-rs cannot write %s (%s): through Spark", path, exc)
        return None
    return True


def replace_where(path: str, data: pa.Table, predicate: str) -> None:
    """The rows of the table at ``path`` matching ``predicate`` (SQL) replaced by ``data``, in
    one commit (Delta's ``replaceWhere``)."""
    table = open_table(path)
    write_deltalake(table, in_table_order(table, data), mode="overwrite", predicate=predicate)


def empty_commit(
    path: str, app: str, version: int, metadata: Mapping[str, str] | None = None
) -> None:
    """A commit that changes no data and records ``app`` at ``version`` (and ``metadata``):
    what Spark commits for a MERGE whose source is empty, and delta-rs does not."""
    table = open_table(path)
    table.create_write_transaction(
        [],
        mode="append",
        schema=table.schema(),
        commit_properties=commit_properties(app, version, metadata),
    )


def compact(path: str) -> bool:
    """The table at ``path``'s small files bin-packed into larger ones, rows unchanged, in one
    commit that changes no data (Delta's ``OPTIMIZE`` without Z-order). False when delta-rs
    cannot (column mapping, another table feature it does not write, a failed commit): the
    caller runs ``OPTIMIZE`` through Spark."""
    try:
        table = open_table(path)
        if table.metadata().configuration.get("delta.columnMapping.mode", "none") != "none":
            return False  # delta-rs 1.x: "Column mapping is not supported for ... 'OPTIMIZE'"
        table.optimize.compact()
    except Exception as exc:
        log.debug("delta-rs cannot compact %s (%s): through Spark", path, exc)
        return False
    return True


def tagged_commit(path: str, tag: str, first: int) -> tuple[int, str] | None:
    """The newest commit of the table at ``path`` whose ``userMetadata`` holds ``tag``, as
    ``(version, userMetadata)``; among the ``first`` newest commits first, then all."""
    table = open_table(path)
    for limit in (first, None):
        for commit in table.history(limit):  # newest first
            meta = commit.get("userMetadata")
            if isinstance(meta, str) and tag in meta:
                return int(commit["version"]), meta
    return None


def small_rows() -> int:
    """Tables of at most this many rows are read through delta-rs into Spark's memory where a
    run reads them whole or nearly (see :func:`read`): ``[lakehouse] small_table_rows``."""
    return engine.current().small_table_rows


def small(path: str | None, columns: list[str] | None = None, most: int | None = None) -> bool:
    """Whether the table at ``path`` is local, has at most ``most`` rows (default
    :func:`small_rows`; by its log's statistics) and, given ``columns``, has all of them."""
    if not usable(path):
        return False
    table = open_table(path)
    if columns is not None:
        have = {f.name for f in table.schema().fields}
        if not set(columns) <= have:
            return False
    actions = pa.table(table.get_add_actions(flatten=True))
    if "num_records" not in actions.column_names:
        return False
    counts = actions.column("num_records")
    if counts.null_count:
        return False
    return sum(counts.to_pylist()) <= (small_rows() if most is None else most)


def has_columns(path: str | None, columns: list[str]) -> bool:
    """Whether the table at ``path`` is local and has every column of ``columns``."""
    if not usable(path):
        return False
    have = {f.name for f in open_table(path).schema().fields}
    return set(columns) <= have


def local_tables_current(spark, schema: str, tables: Mapping[str, set[str]]) -> bool:
    """Whether every table of ``tables`` (name -> columns it must have) is in the catalog's
    schema ``schema`` and a local directory holding those columns: then a layer's tables need
    no creating nor upgrading, and a cold process asks only the metastore (each ``CREATE TABLE
    IF NOT EXISTS`` loads the table's Delta snapshot in the JVM: seconds before the first
    run). A directory the catalog does not list (a creation killed before its catalog entry, a
    metastore lost) is left to the DDL, which repairs it."""
    try:
        where = schema_dir(spark, schema)
        listed = None if unstarted(spark) else table_names(spark, schema)
    except Exception:  # the schema is not there
        return False
    if where is None:
        return False
    if listed is None and not _ready_marker(where, tables).exists():
        return False  # before Spark starts: only tables Spark noted as made (mark_ready)
    for table, columns in tables.items():
        if listed is not None and table.lower() not in listed:
            return False
        path = table_dir(where, table)
        if not usable(path):
            return False
        if columns and not columns <= {f.name for f in open_table(path).schema().fields}:
            return False
    if listed is not None:
        mark_ready(spark, schema, tables)
    return True


def table_names(spark, schema: str) -> set[str]:
    """The names (lower case) of the tables in ``schema`` (qualified): the catalog's, or,
    before a :class:`pgmedallion.core.session.LazySession` starts, the Delta tables in the
    schema's local directory (a session started there would list those: it is the catalog's
    warehouse, and only Spark creates tables in it)."""
    if unstarted(spark):
        where = spark.schema_dir(schema)
        if where is None:
            return set()
        return {
            p.name
            for p in Path(where).iterdir()
            if (p / "_delta_log").is_dir() and not creation_leftover(p)
        }
    return {r["tableName"].lower() for r in spark.sql(f"SHOW TABLES IN {schema}").collect()}


def creation_leftover(path: Path) -> bool:
    """Whether ``path`` holds only a Delta log of at most version 0 and no data: what a
    ``CREATE TABLE`` killed before its catalog record leaves (or a table created and never
    written, which a listing without the catalog cannot tell apart, and leaves to Spark). A
    table delta-rs created before Spark started (:func:`create_unregistered`) is none."""
    if not path.is_dir() or _register_marker(path).exists():
        return False
    for f in path.rglob("*"):
        if not f.is_file():
            continue
        parts = f.relative_to(path).parts
        if parts[0] != "_delta_log":
            return False
        name = f.name
        if name.endswith(".json") and not name.startswith("."):
            if name != f"{0:020d}.json":
                return False
        elif name.endswith(".parquet"):  # a checkpoint: more than a creation
            return False
    return True


_REGISTER = ".pgmedallion-register-"


def waiting_for_catalog(where: str) -> bool:
    """Whether the schema directory ``where`` holds tables :func:`create_unregistered` made
    that the catalog does not know yet."""
    return any(Path(where).glob(_REGISTER + "*"))


def _register_marker(path: Path) -> Path:
    return path.parent / (_REGISTER + path.name)


def create_unregistered(
    spark, schema: str, table: str, columns, configuration: Mapping[str, str] = {}
) -> str | None:
    """Before a :class:`~pgmedallion.core.session.LazySession` starts: table ``table`` of
    ``schema`` (qualified) created empty by delta-rs with ``columns`` and table properties
    ``configuration``, in the directory where the catalog keeps its managed tables, and noted
    there to be put in the catalog when Spark starts (:func:`register_created`); ``columns``:
    an Arrow schema or a Spark ``StructType``. A first run
    then needs no JVM: the metastore's start and a ``CREATE TABLE`` per table cost a cold
    process 10-16 s before any row is read. Returns the table's directory; None where this
    cannot be (Spark started, a lakehouse that is not local): the caller creates the table
    through Spark."""
    if not unstarted(spark) or DeltaTable is None or engine.spark_only():
        return None
    where = spark.schema_path(schema)
    if where is None:
        return None
    if not isinstance(columns, pa.Schema):
        from pyspark.sql.pandas.types import to_arrow_schema

        columns = to_arrow_schema(columns, timezone="UTC")
    path = Path(table_dir(where, table))
    path.parent.mkdir(parents=True, exist_ok=True)
    _register_marker(path).touch()  # before the table: a crash between leaves no orphan
    if not (path / "_delta_log").is_dir():
        _create(path, columns, configuration)
    return str(path)


def _timestamp_ntz(t: pa.DataType) -> bool:
    """Whether ``t`` is or holds a timestamp without time zone (Delta's ``timestamp_ntz``)."""
    if pa.types.is_timestamp(t):
        return t.tz is None
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return _timestamp_ntz(t.value_type)
    if pa.types.is_struct(t):
        return any(_timestamp_ntz(t.field(i).type) for i in range(t.num_fields))
    if pa.types.is_map(t):
        return _timestamp_ntz(t.key_type) or _timestamp_ntz(t.item_type)
    return False


def spark_protocol(columns: pa.Schema, configuration: Mapping[str, str]) -> dict:
    """The protocol Spark gives a new table of ``columns`` with ``configuration``: versions
    (1, 2), or (2, 5) with column mapping; with deletion vectors or a ``timestamp_ntz`` column,
    (3, 7) and table features, the writer's listing those that versions 2-5 implied."""
    mapped = configuration.get("delta.columnMapping.mode", "none") != "none"
    vectors = configuration.get("delta.enableDeletionVectors") == "true"
    ntz = any(_timestamp_ntz(f.type) for f in columns)
    if not (vectors or ntz):
        return {"minReaderVersion": 2 if mapped else 1, "minWriterVersion": 5 if mapped else 2}
    legacy = ["invariants", "appendOnly"]
    if mapped:
        legacy = [
            "checkConstraints",
            "generatedColumns",
            *legacy,
            "changeDataFeed",
            "columnMapping",
        ]
    own = ["deletionVectors"] if vectors else []
    return {
        "minReaderVersion": 3,
        "minWriterVersion": 7,
        "readerFeatures": [
            *own,
            *(["columnMapping"] if mapped else []),
            *(["timestampNtz"] if ntz else []),
        ],
        "writerFeatures": [*own, *legacy, *(["timestampNtz"] if ntz else [])],
    }


def _create(path: Path, columns: pa.Schema, configuration: Mapping[str, str]) -> None:
    """The empty Delta table at ``path`` as Spark creates it with ``configuration``: delta-rs
    writes the first commit (column mapping's physical names and ids), and its protocol is
    then written as Spark writes it (:func:`spark_protocol`). delta-rs 1.x lists other table
    features: without ``columnMapping`` beside deletion vectors or ``timestampNtz``, which
    Spark refuses (``DELTA_FEATURES_PROTOCOL_METADATA_MISMATCH``)."""
    config = {
        k: v
        for k, v in configuration.items()
        if k not in ("delta.minReaderVersion", "delta.minWriterVersion")
    }
    protocol = spark_protocol(columns, config)
    vectors = config.pop("delta.enableDeletionVectors", None)
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=".creating-") as scratch:
        DeltaTable.create(scratch, columns, configuration=config)
        first = Path(scratch) / "_delta_log" / f"{0:020d}.json"
        actions = [json.loads(line) for line in first.read_text().splitlines() if line]
        for action in actions:
            if "protocol" in action:
                action["protocol"] = protocol
            if "metaData" in action and vectors is not None:
                action["metaData"]["configuration"]["delta.enableDeletionVectors"] = vectors
        log_dir = path / "_delta_log"
        log_dir.mkdir(parents=True, exist_ok=True)
        written = Path(scratch) / "commit.json"
        written.write_text("".join(json.dumps(a) + "\n" for a in actions))
        try:  # the commit appears whole or not at all, and never over another one
            os.link(written, log_dir / first.name)
        except FileExistsError:
            pass


def create_layer_unregistered(spark, schema: str, tables: Mapping[str, object]) -> bool:
    """Before Spark starts (a first run): a layer's own ``tables`` (name -> columns) created by
    :func:`create_unregistered` and noted as ready (:func:`mark_ready`); False where that
    cannot be, or some of them are there already (Spark creates or upgrades them)."""
    if not unstarted(spark) or table_names(spark, schema) & set(tables):
        return False
    for name, columns in tables.items():
        if create_unregistered(spark, schema, name, columns) is None:
            return False
    mark_ready(spark, schema, tables)
    return True


def register_created(spark, schema: str, qualify) -> list[str]:
    """The tables :func:`create_unregistered` made in ``schema`` (qualified) put in the
    catalog (``qualify(name)``: a table's qualified name), as Spark points it at a table that
    is there (``CREATE TABLE ... LOCATION``, as bronze is registered); their names."""
    where = schema_dir(spark, schema)
    if where is None:
        return []
    done = []
    for marker in sorted(Path(where).glob(_REGISTER + "*")):
        name = marker.name[len(_REGISTER) :]
        path = Path(where) / name
        if not (path / "_delta_log").is_dir():
            continue  # being created by a run right now (or never will be): its note stays
        location = str(path).replace("\\", "\\\\").replace("'", "\\'")
        table = qualify(name)
        spark.sql(f"CREATE TABLE IF NOT EXISTS {table} USING DELTA LOCATION '{location}'")
        done.append(name)
        marker.unlink(missing_ok=True)
    if done:
        log.info("registered in the catalog: %s", ", ".join(f"{schema}.{n}" for n in done))
    return done


def arrow_columns(ddl: str) -> pa.Schema:
    """The Arrow schema of a column list in Spark's DDL as silver's own tables write theirs
    (``name TYPE [NOT NULL], ...``; types STRING, BIGINT, TIMESTAMP, BINARY, ARRAY<STRING>,
    ARRAY<BIGINT>), as Spark would create the Delta table."""
    types = {
        "STRING": pa.string(),
        "BIGINT": pa.int64(),
        "TIMESTAMP": pa.timestamp("us", tz="UTC"),
        "BINARY": pa.binary(),
        "ARRAY<STRING>": pa.list_(pa.string()),
        "ARRAY<BIGINT>": pa.list_(pa.int64()),
    }
    fields = []
    for column in ddl.split(", "):
        name, rest = column.strip().split(" ", 1)
        rest = rest.strip().upper()
        required = rest.endswith(" NOT NULL")
        kind = rest.removesuffix(" NOT NULL").strip()
        fields.append(pa.field(name, types[kind], nullable=not required))
    return pa.schema(fields)


def _ready_marker(where: str, tables) -> Path:
    return Path(where) / (".pgmedallion-ready-" + "+".join(sorted(t.lower() for t in tables)))


def mark_ready(spark, schema: str, tables) -> None:
    """Note in the schema's local directory that Spark created (or found) ``tables`` in the
    catalog, so that a run before Spark starts may take them as there
    (:func:`local_tables_current`): a creation killed halfway leaves no such note."""
    where = schema_dir(spark, schema)
    if where is not None:
        try:
            _ready_marker(where, tables).touch()
        except OSError:  # a read-only lakehouse: Spark is asked each time
            pass


LISTED_VALUES = 10_000
"""Up to this many distinct values of a column go into one value list of a narrowing
(:func:`narrowings`). DataFusion (delta-rs 1.6) read a 4M-row table narrowed by a list of
10,000 or 20,000 values in 0.24 s and 0.45 s, and crashed the process (SIGSEGV) on 40,000."""

LISTS = 10
"""Up to this many value lists (queries) narrow one read: more values narrow by their range."""


def narrowings(values: dict[str, pa.Array | pa.ChunkedArray]) -> list[str]:
    """DataFusion SQL predicates, disjoint, whose union holds every row whose integer columns
    hold one of ``values`` (by column name; a NULL among them admits NULL), and some others.
    Each column's distinct values narrow as a list within their range (the range lets file
    statistics skip files); the column with the most values is cut into sorted lists of at
    most :data:`LISTED_VALUES` (one predicate each, their ranges apart); a column with more
    values than :data:`LISTED_VALUES` times :data:`LISTS` (or another column with more than
    :data:`LISTED_VALUES`) narrows by its range alone. A read narrowed by them holds every row
    of the keys named; the caller picks those exactly, and bounds the rows it reads
    (:func:`read_at_most`): a range or a column of few values can admit most of a table."""
    distinct = {name: pc.unique(column.drop_null()) for name, column in values.items()}
    nulls = {name: column.null_count > 0 for name, column in values.items()}
    if any(len(d) == 0 and not nulls[name] for name, d in distinct.items()):
        return ["FALSE"]
    cut = max(distinct, key=lambda name: len(distinct[name]), default=None)
    if cut is not None and not LISTED_VALUES < len(distinct[cut]) <= LISTED_VALUES * LISTS:
        cut = None
    others = " AND ".join(
        _narrowed(name, distinct[name], nulls[name]) for name in distinct if name != cut
    )
    if cut is None:
        return [others or "TRUE"]
    ordered = pc.sort_indices(distinct[cut])
    ordered = pc.take(distinct[cut], ordered)
    out = []
    for start in range(0, len(ordered), LISTED_VALUES):
        part = ordered.slice(start, LISTED_VALUES)
        term = _narrowed(cut, part, nulls[cut] and start == 0)
        out.append(f"{term} AND {others}" if others else term)
    return out


def _narrowed(name: str, distinct: pa.Array, nulls: bool) -> str:
    """One column's term of :func:`narrowings`: its values as a list within their range (the
    range alone past :data:`LISTED_VALUES`), ``OR ... IS NULL`` when a NULL is among them."""
    quoted = sql_names([name])
    if len(distinct) == 0:
        term = "FALSE"
    else:
        low, high = pc.min_max(distinct).values()
        term = f"{quoted} BETWEEN {int(low.as_py())} AND {int(high.as_py())}"
        if len(distinct) <= LISTED_VALUES:
            listed = ", ".join(str(int(v)) for v in distinct.to_pylist())
            term = f"{term} AND {quoted} IN ({listed})"
    if nulls:
        term = f"{term} OR {quoted} IS NULL"
    return f"({term})"


def count_narrowed(path: str, where: str | None, narrowed: list[str]) -> int:
    """How many rows of the table at ``path`` satisfy ``where`` and one of ``narrowed``
    (disjoint predicates, :func:`narrowings`): one query each."""
    return sum(count(path, _both(where, n)) for n in narrowed)


def read_narrowed(path: str, names: list[str], where: str | None, narrowed: list[str]) -> pa.Table:
    """:func:`read_arrow` of the rows that satisfy ``where`` and one of ``narrowed``."""
    parts = [read_arrow(path, names, _both(where, n)) for n in narrowed]
    return pa.concat_tables(parts) if len(parts) > 1 else parts[0]


def read_at_most(
    path: str, names: list[str], where: str | None, narrowed: list[str], most: int
) -> pa.Table | None:
    """:func:`read_narrowed`, or None when more than ``most`` rows satisfy it: each query
    stops one row past what is left (no count before the read)."""
    parts: list[pa.Table] = []
    left = most
    for n in narrowed:
        sql = f"SELECT {sql_names(names)} FROM t WHERE {_both(where, n)} LIMIT {left + 1}"
        part = query(path, sql)
        left -= part.num_rows
        if left < 0:
            return None
        parts.append(part)
    return pa.concat_tables(parts) if len(parts) > 1 else parts[0]


def _both(where: str | None, narrowed: str) -> str:
    return narrowed if where is None else f"({where}) AND {narrowed}"


def count(path: str, where: str | None = None) -> int:
    """How many rows of the table at ``path`` satisfy ``where`` (DataFusion SQL)."""
    sql = "SELECT count(*) AS n FROM t" + (f" WHERE {where}" if where else "")
    return int(query(path, sql).column("n")[0].as_py())


def read_arrow(path: str, names: list[str], where: str | None = None) -> pa.Table:
    """Columns ``names`` of the table at ``path`` (``WHERE where``, DataFusion SQL over the
    table as ``t``) as Arrow. Column mapping and deletion vectors are honoured
    (``QueryBuilder``; ``to_pyarrow_table`` is not used: it reads a column-mapped table's
    columns as NULL)."""
    sql = f"SELECT {sql_names(names)} FROM t" + (f" WHERE {where}" if where else "")
    return query(path, sql)


def sql_name(name: str) -> str:
    """A column name quoted for DataFusion SQL."""
    return '"' + name.replace('"', '""') + '"'


def sql_names(names: list[str]) -> str:
    """Column names quoted for DataFusion SQL, comma separated."""
    return ", ".join(sql_name(n) for n in names)


def query(path: str, sql: str) -> pa.Table:
    """The answer of DataFusion SQL ``sql`` over the table at ``path`` (named ``t``)."""
    reader = QueryBuilder().register("t", open_table(path)).execute(sql)
    table = pa.RecordBatchReader.from_stream(reader).read_all()
    plain = pa.schema([f.with_type(plain_type(f.type)) for f in table.schema])
    return table if plain == table.schema else table.cast(plain)


def plain_type(t: pa.DataType) -> pa.DataType:
    """``t`` with views as the plain types (DataFusion answers strings as ``string_view``,
    which not every Arrow kernel, nor Spark, takes)."""
    if pa.types.is_string_view(t):
        return pa.string()
    if pa.types.is_binary_view(t):
        return pa.binary()
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_list_view(t):
        return pa.list_(t.value_field.with_type(plain_type(t.value_type)))
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(plain_type(f.type)) for f in t])
    if pa.types.is_map(t):
        return pa.map_(plain_type(t.key_type), t.item_field.with_type(plain_type(t.item_type)))
    return t


def arrow_schema(path: str) -> pa.Schema:
    """The table's columns as Arrow's schema, without Delta's field metadata (a column-mapped
    table's ids and physical names): what :func:`spark_schema` gives, in Arrow's terms."""
    return bare_schema(pa.schema(open_table(path).schema().to_arrow()))


def bare_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` without field metadata, at any depth."""
    return pa.schema([_bare(f) for f in schema])


def _bare(f: pa.Field) -> pa.Field:
    t = f.type
    if pa.types.is_struct(t):
        t = pa.struct([_bare(c) for c in t])
    elif pa.types.is_list(t) or pa.types.is_large_list(t):
        t = pa.list_(_bare(t.value_field))
    elif pa.types.is_map(t):
        t = pa.map_(_bare(t.key_field), _bare(t.item_field))
    return pa.field(f.name, t, f.nullable)


def delta_type(t: pa.DataType):
    """Arrow's ``t`` as a Delta schema names it (JSON: ``"long"``, ``{"type": "array", ...}``)."""
    return json.loads(Schema.from_arrow(pa.schema([("c", t)])).to_json())["fields"][0]["type"]


def arrow_types(schema) -> pa.Schema:
    """Spark's ``schema`` (a ``StructType``) as Arrow's, timestamps in UTC."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timezone="UTC")


def spark_types(schema: pa.Schema):
    """Arrow's ``schema`` as Spark's ``StructType`` (a timestamp without time zone is Spark's
    ``timestamp_ntz``)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(schema, prefer_timestamp_ntz=True)


def spark_schema(path: str):
    """The table's columns as Spark's ``StructType`` (what ``spark.table(...).schema`` gives,
    without a catalog call: Delta keeps Spark's own JSON form of the schema)."""
    import json

    from pyspark.sql import types as T

    parsed = T.StructType.fromJson(json.loads(open_table(path).schema().to_json()))
    return T.StructType([T.StructField(f.name, f.dataType, f.nullable) for f in parsed.fields])


def read(spark, path: str, schema, where: str | None = None):
    """The rows of the table at ``path`` (``WHERE where``, DataFusion SQL over the table as
    ``t``) as a Spark DataFrame of ``schema`` made from local data.

    A Spark scan of a Delta table pays for the table's snapshot (a job that replays its log
    when another engine wrote the newest commits) before it reads a row; for a small table
    delta-rs reads it in milliseconds and Spark computes on the rows in memory
    (:func:`read_arrow`)."""
    return frame(spark, read_arrow(path, [f.name for f in schema.fields], where), schema)


def frame(spark, rows: pa.Table, schema):
    """``rows``' columns of Spark ``schema`` as a Spark DataFrame made from local data."""
    from pyspark.sql.pandas.types import to_arrow_schema

    rows = rows.select([f.name for f in schema.fields])
    target = to_arrow_schema(schema, timezone="UTC")
    rows = pa.Table.from_arrays(
        [col.cast(f.type) for col, f in zip(rows.columns, target, strict=True)], schema=target
    )
    if rows.num_rows == 0:  # PySpark cannot localize the time zone of a column of no chunks
        return spark.createDataFrame([], schema=schema)
    return spark.createDataFrame(rows.combine_chunks(), schema=schema)
