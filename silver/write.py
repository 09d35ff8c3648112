"""Silver's writes: every append of a run, idempotent per run.

Every append carries ``txnAppId = pgmedallion-silver-<source>`` and ``txnVersion = <run>``, so
a run repeated after a crash skips each table Delta already has it in. A table's unsettled
rows (see ``silver/__init__.py``) go in a second append of the run under their own
``txnAppId`` (:data:`UNSETTLED_APP_SUFFIX`).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import pyarrow as pa

from pgmedallion.core import deletion_vectors, delta_rs, engine, sparkapi
from pgmedallion.core.failpoints import failpoint
from pgmedallion.core.naming import COLUMN_MAPPING, STATS_COLUMNS, plain, quote, stats_columns
from pgmedallion.core.spark import create_table
from pgmedallion.core.sparkapi import F, T
from pgmedallion.silver.cast_columns import CAST_ERRORS_COLUMN, cast_values
from pgmedallion.silver.contract import Names, TableInfo
from pgmedallion.silver.errors import ErrorRecord
from pgmedallion.silver.kernel import cast_rows
from pgmedallion.silver.pgtypes import pg_type_of

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

UNSETTLED_APP_SUFFIX = "-late"
"""The ``txnAppId`` suffix of a table's append of its unsettled rows. The text is the one runs
have always written: a run redone after an upgrade must find the appends it made before."""


def append(
    spark: SparkSession,
    n: Names,
    name: str,
    rows: list[tuple],
    ddl: str,
    source: str,
    run: int,
    stamp: str | None = None,
) -> None:
    """Append ``rows`` (in ``ddl``'s column order; ``stamp``: a column holding the commit's
    time, added) to silver's own table ``name`` as run ``run``'s idempotent commit: by
    delta-rs where the table is a local directory (a few milliseconds; Spark's write of a few
    rows costs a second or two), through Spark elsewhere. Either way the commit records
    ``txnAppId = pgmedallion-silver-<source>`` at ``run``, and a commit made before is skipped."""
    app = f"pgmedallion-silver-{source}"
    names = [column.split(" ", 1)[0] for column in ddl.split(", ")]
    path = delta_rs.table_dir(delta_rs.schema_dir(spark, n.schema), name)
    extra = {stamp: datetime.now(UTC)} if stamp else {}
    records = [dict(zip(names, row, strict=True), **extra) for row in rows]
    failpoint("silver.before_append")  # once, whichever engine writes
    columns = names + list(extra)
    if delta_rs.write_records(path, records, columns, app=app, version=run) is None:
        df = spark.createDataFrame(rows, ddl)
        if stamp:
            df = df.withColumn(stamp, F.current_timestamp())
        writer = df.write.format("delta").mode("append").option("txnAppId", app)
        writer.option("txnVersion", run).saveAsTable(n.table(name))
    failpoint("silver.after_append")


def diffs_app(source: str, unsettled: bool = False) -> str:
    """The ``txnAppId`` of a table's append of its diffs (``unsettled``: its second one)."""
    return f"pgmedallion-silver-{source}" + (UNSETTLED_APP_SUFFIX if unsettled else "")


def append_diffs(
    df: DataFrame,
    table: str,
    source: str,
    run: int,
    unsettled: bool = False,
    new: bool = False,
) -> int | None:
    """Append a table's diffs of run ``run`` (``unsettled``: the rows its first append left
    out), as an idempotent Delta commit; how many rows it wrote (None: not known, the write was
    skipped as done before). ``new``: the table was created in this attempt at the run, so
    no commit of the run can be in it and the write is not skipped (its version is then not
    read before and after: two Spark jobs fewer).

    ``df`` is computed by Spark, so Spark's executors write it (``writeTo``, whose write fills
    the metrics a ``DataFrame.observe`` in ``df``'s plan collects; ``saveAsTable``'s does not):
    its rows never pass through the driver, however many there are. A new column (schema
    evolution) is added by the same write."""
    app = diffs_app(source, unsettled)
    observation = sparkapi.Observation(f"pgm_rows_{uuid.uuid4().hex}")
    writer = (
        df.observe(observation, F.count(F.lit(1)).alias("rows"))
        .writeTo(table)
        .option("txnAppId", app)
        .option("txnVersion", str(run))
        .option("mergeSchema", "true")
    )
    failpoint("silver.before_append")
    before = None if new else _version(df.sparkSession, table)
    writer.append()
    failpoint("silver.after_append")
    if before is not None and _version(df.sparkSession, table) == before:
        # skipped as done before (idempotent): the observed plan did not run, and
        # Observation.get would wait for it forever
        return None
    try:
        return observation.get.get("rows")
    except Exception:  # the observed plan did not complete
        return None


def _version(spark: SparkSession, table: str) -> int | None:
    """The table's newest Delta version (None: not a Delta table yet)."""
    from delta.tables import DeltaTable

    try:
        return int(DeltaTable.forName(spark, table).history(1).first()["version"])
    except Exception:
        return None


def written(spark: SparkSession, target: str, run: int, counts: list[int | None]) -> int:
    """The rows run ``run`` appended to ``target``: the writes' own counts, or (a write
    skipped as done before) a count of the table's rows of the run."""
    if all(c is not None for c in counts):
        return sum(counts)
    return spark.table(target).where(F.col("_run") == run).count()


def create_diff_table(
    spark: SparkSession,
    table: str,
    schema: T.StructType | pa.Schema,
    keys: Sequence[str] = (),
    *,
    local: tuple[str, str] | None = None,
) -> None:
    """A table's diffs table, with column mapping by name (any PostgreSQL name works) and file
    statistics for ``keys`` (its primary key), ``_lsn`` and ``_run`` only: readers skip files
    by run and LSN; statistics of every column cost the write of a Spark-engine first load
    about a sixth of its time (benchmarks/RESULTS.md, session 44). ``local``: its schema and
    name, for a creation by delta-rs before Spark starts (``delta_rs.create_unregistered``)."""
    kept = [c for c in dict.fromkeys([*keys, "_lsn", "_run"]) if _bounded(schema, c)]
    properties = {**COLUMN_MAPPING, STATS_COLUMNS: stats_columns(kept)}
    if local is not None:
        if delta_rs.create_unregistered(spark, *local, schema, properties) is not None:
            return
    from delta.tables import DeltaTable

    if isinstance(schema, pa.Schema):
        schema = delta_rs.spark_types(schema)

    builder = DeltaTable.createIfNotExists(spark).tableName(table).addColumns(schema)
    for key, value in properties.items():
        builder = builder.property(key, value)
    create_table(spark, builder.execute)


def _bounded(schema: T.StructType | pa.Schema, name: str) -> bool:
    """Whether Delta keeps bounds for column ``name`` of ``schema`` (numbers, strings, dates
    and times; it refuses a statistics column of any other type) and whose name needs no
    quoting there (see :func:`pgmedallion.core.naming.plain`)."""
    if not plain(name):
        return False
    if isinstance(schema, pa.Schema):
        if schema.get_field_index(name) < 0:
            return False
        t = schema.field(name).type
        return (
            pa.types.is_integer(t)
            or pa.types.is_floating(t)
            or pa.types.is_decimal(t)
            or pa.types.is_string(t)
            or pa.types.is_large_string(t)
            or pa.types.is_date(t)
            or pa.types.is_timestamp(t)
        )
    if name not in schema.fieldNames():
        return False
    return isinstance(
        schema[name].dataType,
        T.NumericType | T.StringType | T.DateType | T.TimestampType | T.TimestampNTZType,
    )


def write_errors(
    spark: SparkSession,
    n: Names,
    source: str,
    run: int,
    tables: dict[int, TableInfo],
    errors: list[ErrorRecord],
) -> None:
    """Append the run's error records to ``_errors``."""
    rows = []
    for e in errors:
        info = tables.get(e.table_oid)
        schema, name = (info.schema, info.name) if info is not None else (None, None)
        rows.append(
            (source, e.table_oid, schema, name, e.lsn, e.code, e.column, e.raw, e.message, run)
        )
    ddl = (
        "source string, table_oid long, table_schema string, table_name string, lsn long, "
        "code string, column_name string, raw string, message string, run long"
    )
    append(spark, n, "_errors", rows, ddl, source, run, stamp="detected_at")


def write_adjustments(
    spark: SparkSession,
    n: Names,
    source: str,
    run: int,
    tables: dict[int, TableInfo],
    adjusted: list[tuple],
) -> None:
    """Append ``(table_oid, column, code, count, first_lsn, sample)`` rows to ``_adjustments``."""
    rows = [
        (source, oid, tables[oid].schema, tables[oid].name, run, *rest) for oid, *rest in adjusted
    ]
    ddl = (
        "source string, table_oid long, table_schema string, table_name string, run long, "
        "column_name string, code string, count long, first_lsn long, sample string"
    )
    append(spark, n, "_adjustments", rows, ddl, source, run, stamp="detected_at")


def write_commits(
    spark: SparkSession, n: Names, source: str, run: int, commits: list[tuple[int, datetime]]
) -> None:
    """Append ``(lsn, commit_time)`` of the window's transactions to ``_commits``."""
    rows = [(source, lsn, at, run) for lsn, at in commits]
    ddl = "source string, lsn long, commit_time timestamp, run long"
    append(spark, n, "_commits", rows, ddl, source, run)


def write_relations(
    spark: SparkSession,
    n: Names,
    source: str,
    run: int,
    relations: list[tuple[int, int, int, bytes]],
) -> None:
    """Append ``(relid, lsn, ordinal, payload)`` Relation messages to ``_relations``."""
    rows = [(source, relid, lsn, o, p, run) for relid, lsn, o, p in relations]
    ddl = "source string, relid long, lsn long, ordinal long, payload binary, run long"
    append(spark, n, "_relations", rows, ddl, source, run)


def write_progress(
    spark: SparkSession,
    n: Names,
    source: str,
    run: int,
    frontier: int,
    batch: int,
    tables: list,
    source_time: datetime | None,
) -> None:
    """The run's ``_progress`` row: its last write."""
    ddl = (
        "source string, run long, frontier long, bronze_batch long, tables array<long>, "
        "source_time timestamp"
    )
    rows = [(source, run, frontier, batch, tables, source_time)]
    append(spark, n, "_progress", rows, ddl, source, run, stamp="completed_at")


def restate_added(
    spark: SparkSession,
    target: str,
    info: TableInfo,
    names: list[str],
    run: int,
    path: str | None = None,
) -> str | None:
    """Give the rows of runs before ``run`` the value of each column of ``names``: columns this
    run adds to the table that PostgreSQL added with a value for the rows already there
    (``ADD COLUMN c ... DEFAULT 1``: ``attmissingval``, the column entry's ``missing``), which
    every row silver holds from before the column reads at the source.

    One overwrite commit adds the columns and restates those rows, so no reader sees them
    with NULL there; a redo after a crash makes the same commit again (every row of an earlier
    run predates the column). Returns why it could not (a value the column's cast rejects:
    the table then needs a new snapshot), or None."""
    entries = [c for c in info.columns if c["name"] in names]
    if delta_rs.usable(path) and delta_rs.small(path, None, engine.current().driver_rows):
        # a local table the driver holds: the kernel casts the values, and one commit of ours
        # adds the columns and rewrites the rows (core.deletion_vectors.restate)
        values = missing_values(entries)
        if values is None:
            return "the value for existing rows of column(s) " + ", ".join(names) + " does not cast"
        failpoint("silver.before_restate")
        if deletion_vectors.restate(path, values, ("_run", run)):
            return None
    texts = spark.createDataFrame([([c["missing"] for c in entries],)], "values array<string>")
    renamed = [(f"_pgm_added_{i}", pg_type_of(c)) for i, c in enumerate(entries)]
    values = cast_values(texts, "values", renamed)
    (check,) = values.select(F.size(CAST_ERRORS_COLUMN).alias("errors")).collect()
    if check["errors"]:
        return "the value for existing rows of column(s) " + ", ".join(names) + " does not cast"
    earlier = spark.table(target)
    joined = earlier.crossJoin(values.drop(CAST_ERRORS_COLUMN))
    restated = {
        c["name"]: F.when(F.col("_run") < run, F.col(alias)).otherwise(
            F.col(quote(c["name"])) if c["name"] in earlier.columns else F.lit(None)
        )
        for (alias, _), c in zip(renamed, entries, strict=True)
    }
    out = [restated.pop(name, F.col(quote(name))).alias(name) for name in earlier.columns]
    out += [value.alias(name) for name, value in restated.items()]
    failpoint("silver.before_restate")
    joined.select(*out).writeTo(target).option("mergeSchema", "true").overwrite(F.lit(True))
    return None


def missing_values(entries: list[dict]) -> pa.Table | None:
    """The value each column entry's ``missing`` (the source added the column with it for the
    rows already there) casts to, by the kernel: one row; None when one does not cast."""
    typed = cast_rows(
        pa.array([[c["missing"] for c in entries]], pa.list_(pa.string())),
        [(c["name"], pg_type_of(c)) for c in entries],
    )
    if typed.errors:
        return None
    return pa.table(typed.columns, names=[c["name"] for c in entries])


def widen_columns(spark: SparkSession, target: str, types: dict[str, T.DataType]) -> list[str]:
    """Give ``target``'s columns of ``types`` their new, wider Spark type (the source widened
    them: ``capture.schema_changes.widens``), every row cast in one overwrite commit. Delta's
    own type widening would change only metadata, but delta-rs 1.x cannot read a table with
    that feature (``Unsupported table features required: [TypeWidening]``, measured with
    deltalake 1.6.6), and the batched paths read silver through it. Only columns whose type
    still differs, so a redo after a crash does nothing more. Returns the columns widened."""
    earlier = spark.table(target)
    have = {f.name: f.dataType for f in earlier.schema.fields}
    wider = {name: t for name, t in types.items() if name in have and have[name] != t}
    if not wider:
        return []
    out = [
        F.col(quote(name)).cast(wider[name]).alias(name) if name in wider else F.col(quote(name))
        for name in earlier.columns
    ]
    failpoint("silver.before_widen")
    earlier.select(*out).writeTo(target).option("overwriteSchema", "true").overwrite(F.lit(True))
    return sorted(wider)


def rename_by_rewrite(
    spark: SparkSession, target: str, order: list[str], renames: dict[str, str]
) -> str | None:
    """Rename ``target``'s columns (old -> new) where some new name is another column's now (a
    swap, a rotation), in one overwrite commit: Delta renames one column per commit, and a
    crash between two would leave names no redo could tell apart. ``order``: the renamed
    columns' old names in the table's order, which the rewrite keeps, so the names in that
    order tell whether the commit was made: the old ones (to do) or the new ones (done).
    Returns why it could not (the table holds neither: a new snapshot makes it exact), or
    None."""
    earlier = spark.table(target)
    names = set(renames) | set(renames.values())
    current = [n for n in earlier.columns if n in names]
    if current == [renames[n] for n in order]:
        return None  # done by an attempt before a crash
    if current != order:
        return "silver's columns are neither those before the renames nor those after them"
    out = [
        F.col(quote(n)).alias(renames[n]) if n in renames else F.col(quote(n))
        for n in earlier.columns
    ]
    failpoint("silver.before_rename")
    earlier.select(*out).writeTo(target).option("overwriteSchema", "true").overwrite(F.lit(True))
    return None
