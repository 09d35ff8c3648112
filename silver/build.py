"""The silver run: new bronze rows in, typed consolidated diffs per table and errors out.

One run ``R`` reads a window of bronze and appends to the tables of the contract in
``silver/__init__.py``::

    plan R:  frontier window [F_prev, F)   F = bronze's committed frontier
             batch window    (b_prev, b]   b = bronze's last batch
    wal      lsn in [F_prev, F), batch <= b; per commit LSN the messages of one capture run
             that reached the Commit (a re-read may renumber ordinals, so never mix reads)
    copy / schema / rewind / error records     batch in (b_prev, b]
             │
             ├─ Relation messages ──> per-table column layouts (kept in ``_relations``)
             ├─ Insert/Update/Delete ──> (values, lsn, ±1)       [Python workers, Arrow]
             ├─ COPY rows ──> (values, 0, +1)          [Spark SQL; rare escapes: Python]
             ├─ casts (Spark SQL) ──> typed rows; values that do not cast ──> ``_errors``
             ├─ rewinds: changes with lsn <= snapshot LSN again at 0 with the diff negated
             ├─ TRUNCATE: an error, or (policy ``delete``) every row retracted at its LSN
             └─ consolidate: sum diffs per (row, lsn), drop zeros ──> ``<silver_table>``

Exactly once. The plan (both windows) is written to ``_plans`` before anything else, and a
rerun after a crash redoes the planned run with the same windows, which read the same
immutable bronze rows. Every append carries ``txnAppId = pgmedallion-silver-<source>`` and
``txnVersion = R``, so Delta skips the tables the crashed attempt had already committed. The
``_progress`` row is the run's last write.

One pass per table. A table's rows are decoded and cast by plain Spark SQL expressions in the
job that appends them, which also counts (an observed metric) the rows those expressions do not
settle: decode errors, records left to the Python decoder, values with no plain cast. Usually
there are none. Otherwise those rows are cast in full, with their error messages, and appended
in a second commit of the run (``txnAppId = pgmedallion-silver-<source>-late``) with their
rewinds: the two commits hold different (row, LSN) pairs (see :func:`_table_run`).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import re
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pyarrow as pa
from pyspark import StorageLevel
from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from bronze.spark_table import bronze_frontier
from bronze.table import copy_lines
from capture.pgoutput import Relation, Truncate, decode, format_lsn
from core.config import Config
from core.failpoints import failpoint
from core.parallel import concurrently
from silver.casts import (
    CAST_ERRORS_COLUMN,
    SUSPECT_COLUMN,
    PgType,
    adjustments,
    cast_values,
    pg_type_of,
    plain_cast,
    spark_type,
)
from silver.changes import (
    RETRACT,
    ChangeError,
    LayoutIndex,
    TableColumn,
    change_diffs,
    plan_columns,
)
from silver.copy_sql import PYTHON_CODE, copy_diffs, python_diffs
from silver.copy_text import CopyDecodeError, InvalidCopyInput, decode_copy_row
from silver.identity import COLUMNS, KIND, ORDINAL, resolve_previous_images
from silver.policies import with_policies

log = logging.getLogger(__name__)

META_COLUMNS = ("_lsn", "_diff", "_run")

TABLES_DDL = (
    "source STRING NOT NULL, table_oid BIGINT NOT NULL, table_schema STRING, table_name STRING, "
    "silver_table STRING NOT NULL, snapshot_lsn BIGINT, primary_key ARRAY<STRING>, "
    "not_null ARRAY<STRING>, columns STRING, updated_at TIMESTAMP, snapshot_run BIGINT"
)
ERRORS_DDL = (
    "source STRING NOT NULL, table_oid BIGINT, table_schema STRING, table_name STRING, "
    "lsn BIGINT, code STRING NOT NULL, column_name STRING, raw STRING, message STRING, "
    "run BIGINT NOT NULL, detected_at TIMESTAMP NOT NULL"
)
PROGRESS_DDL = (
    "source STRING NOT NULL, run BIGINT NOT NULL, frontier BIGINT NOT NULL, "
    "bronze_batch BIGINT NOT NULL, completed_at TIMESTAMP NOT NULL, tables ARRAY<BIGINT>"
)
"""One row per completed run; ``tables``: the OIDs of the tables whose diffs, errors or
adjustments the run wrote (NULL in runs made before it existed: any table)."""
PLANS_DDL = (
    "source STRING NOT NULL, run BIGINT NOT NULL, frontier_from BIGINT NOT NULL, "
    "frontier BIGINT NOT NULL, batch_from BIGINT NOT NULL, batch_to BIGINT NOT NULL, "
    "planned_at TIMESTAMP NOT NULL"
)
ADJUSTMENTS_DDL = (
    "source STRING NOT NULL, table_oid BIGINT NOT NULL, table_schema STRING, table_name STRING, "
    "run BIGINT NOT NULL, column_name STRING NOT NULL, code STRING NOT NULL, "
    "count BIGINT NOT NULL, first_lsn BIGINT, sample STRING, detected_at TIMESTAMP NOT NULL"
)
"""Values a declared policy changed instead of keeping exactly (``Rounded``, ``Clamped``,
``Nulled``), counted per table, column and run; gold reports them in ``_quality``."""
RELATIONS_DDL = (
    "source STRING NOT NULL, relid BIGINT NOT NULL, lsn BIGINT NOT NULL, ordinal BIGINT NOT NULL, "
    "payload BINARY NOT NULL, run BIGINT NOT NULL"
)

DIFF_SCHEMA = T.StructType(
    [
        T.StructField("table_oid", T.LongType()),
        T.StructField("lsn", T.LongType()),
        T.StructField("ordinal", T.LongType()),
        T.StructField("diff", T.LongType()),
        T.StructField("values", T.ArrayType(T.StringType())),
        T.StructField("code", T.StringType()),
        T.StructField("message", T.StringType()),
        T.StructField("raw", T.StringType()),
    ]
)
_DIFF_ARROW = pa.schema(
    [
        ("table_oid", pa.int64()),
        ("lsn", pa.int64()),
        ("ordinal", pa.int64()),
        ("diff", pa.int64()),
        ("values", pa.list_(pa.string())),
        ("code", pa.string()),
        ("message", pa.string()),
        ("raw", pa.string()),
    ]
)
CHANGE_SCHEMA = T.StructType(
    [
        *DIFF_SCHEMA.fields,
        T.StructField("kind", T.IntegerType()),
        T.StructField("columns", T.ArrayType(T.IntegerType())),
    ]
)
"""A decoded change's diff rows: ``DIFF_SCHEMA`` plus what :mod:`silver.changes` says of a row
(``kind``: PLAIN, RETRACT or FILL, and its ``columns``)."""
_CHANGE_ARROW = pa.schema(
    [*_DIFF_ARROW, pa.field("kind", pa.int32()), pa.field("columns", pa.list_(pa.int32()))]
)


@dataclass
class TableInfo:
    """What silver knows about one source table (a row of ``_tables``)."""

    oid: int
    schema: str
    name: str
    silver_table: str
    snapshot_lsn: int | None
    primary_key: list[str]
    not_null: list[str]
    columns: list[dict]
    """``{name, type_oid, typmod, type_name, base_type_oid, element_type_oid, category,
    target, infinity}``."""
    snapshot_run: int | None = None
    """The silver run that (re)built the table from its newest snapshot: its earlier errors
    are history (``pgmedallion resync``)."""

    @property
    def qualified_name(self) -> str:
        return f"{self.schema}.{self.name}"


@dataclass(frozen=True)
class SilverResult:
    run: int | None
    """The run this call completed; None when there was nothing new."""
    frontier: int
    rows: dict[str, int]
    """``schema.table`` -> diff rows appended."""
    errors: int


class _Names:
    def __init__(self, cfg: Config) -> None:
        q = lambda name: cfg.qualified("silver", name)  # noqa: E731
        self.tables, self.errors, self.progress = q("_tables"), q("_errors"), q("_progress")
        self.plans, self.relations = q("_plans"), q("_relations")
        self.adjustments = q("_adjustments")
        self.bronze = cfg.qualified("bronze", "bronze")
        self.table = q
        parts = [p for p in (cfg.lakehouse.catalog, cfg.lakehouse.silver_schema) if p]
        self.schema = ".".join("`" + p.replace("`", "``") + "`" for p in parts)


def silver_table_name(schema: str, name: str, oid: int, taken: set[str]) -> str:
    """A metastore-safe, stable name: ``public."OrderItems"`` -> ``public_orderitems``."""
    base = re.sub(r"[^a-z0-9]+", "_", f"{schema}_{name}".lower()).strip("_")[:100] or "table"
    if base[0].isdigit():
        base = "t_" + base
    candidate = base if base not in taken else f"{base}_{oid}"
    taken.add(candidate)
    return candidate


def _append(df: DataFrame, table: str, source: str, run: int) -> None:
    writer = (
        df.write.format("delta")
        .mode("append")
        .option("txnAppId", f"pgmedallion-silver-{source}")
        .option("txnVersion", run)
    )
    failpoint("silver.before_append")
    writer.saveAsTable(table)
    failpoint("silver.after_append")


def ensure_silver_tables(spark: SparkSession, cfg: Config) -> None:
    n = _Names(cfg)
    spark.sql(f"CREATE SCHEMA IF NOT EXISTS {n.schema}")
    for table, ddl in (
        (n.tables, TABLES_DDL),
        (n.errors, ERRORS_DDL),
        (n.progress, PROGRESS_DDL),
        (n.plans, PLANS_DDL),
        (n.relations, RELATIONS_DDL),
        (n.adjustments, ADJUSTMENTS_DDL),
    ):
        spark.sql(f"CREATE TABLE IF NOT EXISTS {table} ({ddl}) USING DELTA")
    if "snapshot_run" not in spark.table(n.tables).columns:  # tables made before resync
        spark.sql(f"ALTER TABLE {n.tables} ADD COLUMNS (snapshot_run BIGINT)")
    if "tables" not in spark.table(n.progress).columns:  # made before runs listed their tables
        spark.sql(f"ALTER TABLE {n.progress} ADD COLUMNS (tables ARRAY<BIGINT>)")


def load_tables(spark: SparkSession, cfg: Config) -> dict[int, TableInfo]:
    n = _Names(cfg)
    out = {}
    for r in spark.table(n.tables).where(F.col("source") == cfg.source.name).collect():
        out[r["table_oid"]] = TableInfo(
            oid=r["table_oid"],
            schema=r["table_schema"],
            name=r["table_name"],
            silver_table=r["silver_table"],
            snapshot_lsn=r["snapshot_lsn"],
            primary_key=list(r["primary_key"] or []),
            not_null=list(r["not_null"] or []),
            columns=json.loads(r["columns"]),
            snapshot_run=r["snapshot_run"],
        )
    return out


def _plan(spark: SparkSession, cfg: Config) -> tuple[int, int, int, int, int] | None:
    """(run, frontier_from, frontier, batch_from, batch_to), or None when nothing is new."""
    n, source = _Names(cfg), cfg.source.name
    done = (
        spark.table(n.progress)
        .where(F.col("source") == source)
        .orderBy(F.col("run").desc())
        .limit(1)
        .collect()
    )
    last_run, f_prev, b_prev = (
        (done[0]["run"], done[0]["frontier"], done[0]["bronze_batch"]) if done else (-1, 0, -1)
    )
    run = last_run + 1
    planned = (
        spark.table(n.plans).where((F.col("source") == source) & (F.col("run") == run)).collect()
    )
    if planned:
        p = planned[0]
        log.info("silver run %d: redoing the planned run", run)
        return run, p["frontier_from"], p["frontier"], p["batch_from"], p["batch_to"]
    frontier = bronze_frontier(spark, n.bronze, source)
    frontier = f_prev if frontier is None else max(frontier, f_prev)
    row = spark.table(n.bronze).where(F.col("source") == source).agg(F.max("batch_id")).first()
    batch = b_prev if row is None or row[0] is None else row[0]
    if frontier == f_prev and batch == b_prev:
        return None
    plan = spark.createDataFrame(
        [(source, run, f_prev, frontier, b_prev, batch)],
        "source string, run long, frontier_from long, frontier long, batch_from long, "
        "batch_to long",
    ).withColumn("planned_at", F.current_timestamp())
    _append(plan, n.plans, source, run)
    return run, f_prev, frontier, b_prev, batch


def _complete_wal(bronze: DataFrame, f_from: int, f_to: int, b_to: int) -> DataFrame:
    """The window's wal rows, one capture read per commit LSN (one that reached its Commit)."""
    wal = bronze.where(
        (F.col("kind") == "wal")
        & (F.col("lsn") >= f_from)
        & (F.col("lsn") < f_to)
        & (F.col("batch_id") <= b_to)
    ).withColumn("mtype", F.hex(F.substring("payload", 1, 1)))
    chosen = (
        wal.where(F.col("mtype") == "43")  # 'C' Commit
        .groupBy("lsn")
        .agg(F.min("run_id").alias("run_id"))
    )
    return wal.join(chosen, ["lsn", "run_id"]).withColumn(
        "relid", F.conv(F.hex(F.substring("payload", 2, 4)), 16, 10).cast("bigint")
    )


def _decode_changes(
    batches: Iterator[pa.RecordBatch], layouts: dict[int, tuple[LayoutIndex, int]]
) -> Iterator[pa.RecordBatch]:
    """Worker body: Insert/Update/Delete messages -> diff rows (or error rows)."""
    for batch in batches:
        out = {name: [] for name in _CHANGE_ARROW.names}

        def emit(
            oid, lsn, ordinal, diff, values, code=None, message=None, kind=0, columns=(), out=out
        ):
            out["table_oid"].append(oid)
            out["lsn"].append(lsn)
            out["ordinal"].append(ordinal)
            out["diff"].append(diff)
            out["values"].append(values)
            out["code"].append(code)
            out["message"].append(message)
            out["raw"].append(None)
            out["kind"].append(kind)
            out["columns"].append(list(columns))

        cols = batch.to_pydict()
        for lsn, ordinal, payload in zip(
            cols["lsn"], cols["ordinal"], cols["payload"], strict=False
        ):
            message = decode(payload)
            relid = message.relid
            entry = layouts.get(relid)
            if entry is None:
                continue  # a table silver does not follow
            index, width = entry
            try:
                for d in change_diffs(message, index.at(lsn, ordinal), width):
                    emit(relid, lsn, ordinal, d.diff, d.values, kind=d.kind, columns=d.columns)
            except ChangeError as e:
                emit(relid, lsn, ordinal, 0, None, e.code, str(e))
        yield pa.RecordBatch.from_pydict(out, schema=_CHANGE_ARROW)


def _decode_copy(
    batches: Iterator[pa.RecordBatch], widths: dict[int, tuple[int, int]]
) -> Iterator[pa.RecordBatch]:
    """Worker body: COPY TEXT payloads -> ``(values, +1)`` at LSN 0 (or error rows).

    A payload is a chunk of rows or one row, each ended by a newline (see ``copy_diffs``).
    """
    for batch in batches:
        cols = batch.to_pydict()
        out = {name: [] for name in _DIFF_ARROW.names}
        values_out, diff_out, code_out = out["values"], out["diff"], out["code"]
        message_out, raw_out, lsn_out = out["message"], out["raw"], out["lsn"]
        oid_out = out["table_oid"]
        for oid, lsn, payload in zip(cols["table_oid"], cols["lsn"], cols["payload"], strict=False):
            copy_width, width = widths.get(oid, (None, None))
            if width is None:
                continue
            padding = [None] * (width - copy_width)
            for line in copy_lines(payload):
                oid_out.append(oid)
                try:
                    values = decode_copy_row(line, copy_width)
                except CopyDecodeError as e:
                    invalid = isinstance(e, InvalidCopyInput)
                    values_out.append(None)
                    diff_out.append(0)
                    code_out.append("InvalidCopyInput" if invalid else type(e).__name__)
                    message_out.append(str(e))
                    raw_out.append(line.decode("utf-8", "replace"))
                    lsn_out.append(lsn)
                    continue
                if padding:
                    values += padding
                values_out.append(values)
                diff_out.append(1)
                code_out.append(None)
                message_out.append(None)
                raw_out.append(None)
                lsn_out.append(0)
        out["ordinal"] = [None] * len(diff_out)
        yield pa.RecordBatch.from_pydict(out, schema=_DIFF_ARROW)


def snapshot_diffs(
    copy_rows: DataFrame, copy_widths: dict[int, tuple[int, int]], *, mark: bool = False
) -> DataFrame:
    """``table_oid, lsn, payload`` copy records -> diff rows (``DIFF_SCHEMA``), at LSN 0.

    ``copy_widths``: OID -> (columns of its COPY rows, columns of its silver rows). Decoding is
    Spark SQL, with the Python decoder for the rows SQL leaves to it (``silver/copy_sql.py``).
    With ``mark``, those rows are left out and marked instead (see :func:`cast_diffs`).
    """
    return copy_diffs(copy_rows, copy_widths, _python_copy(copy_widths), mark=mark)


def _python_copy(widths: dict[int, tuple[int, int]]):
    return lambda rows: rows.mapInArrow(lambda it: _decode_copy(it, widths), DIFF_SCHEMA)


def _column_entry(c: dict) -> dict:
    keys = (
        "name",
        "type_oid",
        "typmod",
        "type_name",
        "base_type_oid",
        "element_type_oid",
        "category",
        "target",
        "infinity",
    )
    text = ("type_name", "category", "target", "infinity")
    return {k: c.get(k, "" if k in text else 0) for k in keys}


def _pg_type(c: dict) -> PgType:
    return pg_type_of(c)


def run_silver(spark: SparkSession, cfg: Config) -> SilverResult:
    """One silver run over whatever bronze committed since the last one."""
    n, source = _Names(cfg), cfg.source.name
    ensure_silver_tables(spark, cfg)
    planned = _plan(spark, cfg)
    if planned is None:
        last = (
            spark.table(n.progress).where(F.col("source") == source).agg(F.max("frontier")).first()
        )
        return SilverResult(None, (last[0] if last else None) or 0, {}, 0)
    run, f_from, f_to, b_from, b_to = planned
    log.info(
        "silver run %d: wal [%s, %s), bronze batches (%d, %d]",
        run,
        format_lsn(f_from),
        format_lsn(f_to),
        b_from,
        b_to,
    )
    bronze = spark.table(n.bronze).where(F.col("source") == source)
    in_batches = bronze.where((F.col("batch_id") > b_from) & (F.col("batch_id") <= b_to))
    tables = load_tables(spark, cfg)
    known_before = set(tables)
    taken = {t.silver_table for t in tables.values()}
    new_snapshots: dict[int, int] = {}
    errors: list[tuple] = []  # (table_oid, lsn, code, column, raw, message)

    # Control records of the batch window (schema, rewind, error), and the tables with COPY
    # records in it, in one read.
    records = in_batches.select(
        "kind", "table_oid", "table_schema", "table_name", "lsn", "payload", "batch_id"
    )
    copied = (
        records.where(F.col("kind") == "copy")
        .groupBy("table_oid")
        .agg(F.min("batch_id").alias("batch_id"))
        .select(
            F.lit("copy").alias("kind"),
            "table_oid",
            F.lit(None).cast("string").alias("table_schema"),
            F.lit(None).cast("string").alias("table_name"),
            F.lit(None).cast("bigint").alias("lsn"),
            F.lit(None).cast("binary").alias("payload"),
            "batch_id",
        )
    )
    control = (
        records.where(F.col("kind").isin("schema", "rewind", "error"))
        .unionByName(copied)
        .orderBy("batch_id")
        .collect()
    )
    copied_oids = {r["table_oid"] for r in control if r["kind"] == "copy"}
    for r in control:
        if r["kind"] == "schema":
            s = json.loads(r["payload"])
            qualified = f"{s['schema']}.{s['name']}"
            cols = with_policies(
                qualified,
                cfg.policy(qualified),
                [_column_entry(c) for c in s["columns"] if not c.get("generated")],
            )
            old = tables.get(r["table_oid"])
            tables[r["table_oid"]] = TableInfo(
                oid=r["table_oid"],
                schema=s["schema"],
                name=s["name"],
                silver_table=old.silver_table
                if old
                else silver_table_name(s["schema"], s["name"], r["table_oid"], taken),
                snapshot_lsn=old.snapshot_lsn if old else None,
                snapshot_run=old.snapshot_run if old else None,
                primary_key=list(s["primary_key"]),
                not_null=[c["name"] for c in s["columns"] if c["not_null"]],
                columns=cols,  # a table snapshotted again is rebuilt with its columns of now
            )
    for r in control:
        if r["kind"] == "rewind" and r["table_oid"] in tables:
            tables[r["table_oid"]].snapshot_lsn = r["lsn"]
            tables[r["table_oid"]].snapshot_run = run
            new_snapshots[r["table_oid"]] = r["lsn"]
    for r in control:
        if r["kind"] == "error":
            e = json.loads(r["payload"]) if r["payload"] else {}
            targets = [r["table_oid"]] if r["table_oid"] is not None else list(tables)
            for oid in targets:
                errors.append(
                    (
                        oid,
                        r["lsn"],  # the payload's "lsn" is the same position, as text
                        e.get("code", "PipelineError"),
                        None,
                        None,
                        e.get("message", ""),
                    )
                )

    # The wal window: one read per transaction. A table silver held before and snapshots again
    # now is rebuilt from its snapshot on (see _table_run): its changes above the snapshot LSN
    # that earlier runs read (a stream ahead of the snapshot) are read again.
    rebuilt = {oid: lsn for oid, lsn in new_snapshots.items() if oid in known_before}
    reread_from = min([lsn + 1 for lsn in rebuilt.values()] + [f_from])
    wal = _complete_wal(bronze, reread_from, f_to, b_to)
    if reread_from < f_from:
        wal = wal.where((F.col("lsn") >= f_from) | F.col("relid").isin(list(rebuilt)))
    wal = wal.persist(StorageLevel.MEMORY_AND_DISK)
    rel_rows = (
        wal.where(F.col("mtype").isin("52", "54"))  # 'R' Relation, 'T' Truncate
        .select("lsn", "ordinal", "payload", "mtype")
        .collect()
    )
    window_relations = [
        (r["lsn"], r["ordinal"], bytes(r["payload"])) for r in rel_rows if r["mtype"] == "52"
    ]
    truncates = [
        (r["lsn"], r["ordinal"], decode(bytes(r["payload"])))
        for r in rel_rows
        if r["mtype"] == "54"
    ]
    earlier = (
        spark.table(n.relations)
        .where((F.col("source") == source) & (F.col("run") < run))
        .select("lsn", "ordinal", "payload")
        .collect()
    )
    relations: dict[int, list[tuple[int, int, Relation]]] = defaultdict(list)
    seen = set()
    for lsn, ordinal, payload in [(r[0], r[1], bytes(r[2])) for r in earlier] + window_relations:
        if (lsn, ordinal, payload) in seen:
            continue
        seen.add((lsn, ordinal, payload))
        rel = decode(payload)
        relations[rel.relid].append((lsn, ordinal, rel))
    # Tables seen only through the stream (added to the publication, not yet snapshotted).
    for relid, rels in relations.items():
        if relid not in tables:
            rels.sort(key=lambda e: (e[0], e[1]))
            first = rels[0][2]
            policy = cfg.policy(f"{first.namespace or 'pg_catalog'}.{first.name}")
            tables[relid] = TableInfo(
                oid=relid,
                schema=first.namespace or "pg_catalog",
                name=first.name,
                silver_table=silver_table_name(first.namespace, first.name, relid, taken),
                snapshot_lsn=None,
                primary_key=[c.name for c in first.columns if c.is_key],
                not_null=[],
                columns=[
                    _column_entry(
                        {
                            "name": c.name,
                            "type_oid": c.type_oid,
                            "typmod": c.type_modifier,
                            "target": policy.column(c.name).type,
                            "infinity": policy.column(c.name).infinity,
                        }
                    )
                    for c in first.columns
                ],
            )

    layouts: dict[int, tuple[LayoutIndex, int]] = {}
    copy_widths: dict[int, tuple[int, int]] = {}
    for oid, info in tables.items():
        base = [TableColumn(c["name"], c["type_oid"], c["typmod"]) for c in info.columns]
        copy_width = len(base)
        rels = sorted(relations.get(oid, []), key=lambda e: (e[0], e[1]))
        entries = {c["name"]: c for c in info.columns}

        def target_type(col: TableColumn, entries: dict = entries) -> T.DataType:
            entry = entries.get(col.name, {"type_oid": col.type_oid})
            return spark_type(_pg_type(_column_entry({**entry, "typmod": col.typmod})))

        final, rel_layouts = plan_columns(
            base, [(lsn, rel) for lsn, _, rel in rels], info.snapshot_lsn, target_type
        )
        for (lsn, _, _rel), layout in zip(rels, rel_layouts, strict=False):
            if layout.positions is None and lsn >= f_from:
                errors.append((oid, lsn, "SchemaIncompatible", None, None, layout.problem))
        known = {c["name"] for c in info.columns}
        policy = cfg.policy(info.qualified_name)
        for c in final:
            if c.name not in known:
                own = policy.column(c.name)
                info.columns.append(
                    _column_entry(
                        {
                            "name": c.name,
                            "type_oid": c.type_oid,
                            "typmod": c.typmod,
                            "target": own.type,
                            "infinity": own.infinity,
                        }
                    )
                )
        layouts[oid] = (
            LayoutIndex(
                [
                    ((lsn, ordinal), lay)
                    for (lsn, ordinal, _), lay in zip(rels, rel_layouts, strict=False)
                ]
            ),
            len(final),
        )
        copy_widths[oid] = (copy_width, len(final))

    changes = wal.where(F.col("mtype").isin("49", "55", "44")).select("lsn", "ordinal", "payload")
    wal_diffs = changes.mapInArrow(lambda it: _decode_changes(it, layouts), CHANGE_SCHEMA).persist(
        StorageLevel.MEMORY_AND_DISK
    )
    # One read of the decoded changes per run: the tables they touch, which of those have
    # decode errors, and which need their previous images (REPLICA IDENTITY DEFAULT / USING
    # INDEX), with their identity's key positions (the first, if the identity changed).
    changed = wal_diffs.groupBy("table_oid").agg(
        F.count_if(F.col("code").isNotNull()).alias("errors"),
        F.collect_set(F.when(F.col("kind") == RETRACT, F.col("columns"))).alias("identities"),
    )
    identity_keys: dict[int, tuple[int, ...]] = {}
    changed_oids, with_errors = set(), []
    for r in changed.collect():
        changed_oids.add(r["table_oid"])
        if r["errors"]:
            with_errors.append(r["table_oid"])
        if r["identities"]:
            identity_keys[r["table_oid"]] = min(tuple(keys) for keys in r["identities"])
    if with_errors:
        bad = wal_diffs.where(F.col("code").isNotNull() & F.col("table_oid").isin(with_errors))
        for r in bad.collect():
            errors.append((r["table_oid"], r["lsn"], r["code"], None, r["raw"], r["message"]))
    wal_good = wal_diffs.where(F.col("code").isNull())
    copy_rows = in_batches.where(F.col("kind") == "copy").select("table_oid", "lsn", "payload")

    rows: dict[str, int] = {}
    adjusted: list[tuple] = []  # (table_oid, column, code, count, first_lsn, sample)
    truncate_at: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for lsn, ordinal, msg in truncates:
        assert isinstance(msg, Truncate)
        for relid in msg.relids:
            if relid in tables:
                truncate_at[relid].append((lsn, ordinal))
    for oid, info in sorted(tables.items()):
        if cfg.policy(info.qualified_name).truncate == "error":
            for lsn, _ in truncate_at.get(oid, []):
                errors.append(
                    (oid, lsn, "TableTruncated", None, None, f"{info.qualified_name} was truncated")
                )
    # Only the tables this run has something for: a table with no rows, snapshot or truncate
    # in the window costs nothing. The others run concurrently (each its own Delta commits).
    work = sorted(
        oid
        for oid in tables
        if oid in changed_oids or oid in copied_oids or oid in new_snapshots or oid in truncate_at
    )

    existing = _silver_tables(spark, n) if work else set()

    def one_table(oid: int) -> tuple[int, list[tuple], list[tuple]]:
        info = tables[oid]
        deletes = cfg.policy(info.qualified_name).truncate == "delete"
        return _table_run(
            spark,
            cfg,
            n,
            info,
            table_diffs(oid, wal_good, copy_rows, copy_widths[oid]),
            run,
            new_snapshot=oid in new_snapshots,
            truncates=truncate_at.get(oid, []) if deletes else [],
            identity_keys=identity_keys.get(oid),
            exists=info.silver_table.lower() in existing,
        )

    for oid, (count, cast_errors, table_adjusted) in zip(
        work, concurrently(one_table, work, TABLE_WORKERS), strict=True
    ):
        rows[tables[oid].qualified_name] = count
        errors.extend(cast_errors)
        adjusted += [(oid, *a) for a in table_adjusted]

    if errors:
        err_df = spark.createDataFrame(
            [
                (
                    source,
                    oid,
                    tables[oid].schema if oid in tables else None,
                    tables[oid].name if oid in tables else None,
                    lsn,
                    code,
                    col,
                    raw,
                    msg,
                    run,
                )
                for oid, lsn, code, col, raw, msg in errors
            ],
            "source string, table_oid long, table_schema string, table_name string, lsn long, "
            "code string, column_name string, raw string, message string, run long",
        ).withColumn("detected_at", F.current_timestamp())
        _append(err_df, n.errors, source, run)
    if adjusted:
        adj_df = spark.createDataFrame(
            [
                (source, oid, tables[oid].schema, tables[oid].name, run, *rest)
                for oid, *rest in adjusted
            ],
            "source string, table_oid long, table_schema string, table_name string, run long, "
            "column_name string, code string, count long, first_lsn long, sample string",
        ).withColumn("detected_at", F.current_timestamp())
        _append(adj_df, n.adjustments, source, run)
    window_relations = [r for r in window_relations if r[0] >= f_from]  # not the re-read ones
    if window_relations:
        rel_df = spark.createDataFrame(
            [(source, decode(p).relid, lsn, o, p, run) for lsn, o, p in window_relations],
            "source string, relid long, lsn long, ordinal long, payload binary, run long",
        )
        _append(rel_df, n.relations, source, run)
    _write_tables(spark, n, source, tables)
    # The tables whose silver state or errors this run changed: gold leaves the others alone.
    touched = set(work) | {e[0] for e in errors if e[0] is not None} | {a[0] for a in adjusted}
    touched = sorted(touched)
    done = spark.createDataFrame(
        [(source, run, f_to, b_to, touched)],
        "source string, run long, frontier long, bronze_batch long, tables array<long>",
    ).withColumn("completed_at", F.current_timestamp())
    _append(done, n.progress, source, run)
    wal.unpersist()
    wal_diffs.unpersist()
    log.info("silver run %d done: frontier %s, %d errors", run, format_lsn(f_to), len(errors))
    return SilverResult(run, f_to, rows, len(errors))


def _typed_columns(info: TableInfo) -> list[tuple[str, PgType]]:
    return [(c["name"], _pg_type(c)) for c in info.columns]


# Internal names while a table's rows are cast: no PostgreSQL column can be one of these
# without also colliding with silver's own _lsn/_diff/_run, which the README reserves.
_LSN, _DIFF = "_pgm_lsn", "_pgm_diff"
_CODE, _RAW, _MESSAGE = "_pgm_code", "_pgm_raw", "_pgm_message"


def data_columns(info: TableInfo) -> list:
    """The table's columns, as Spark column references (names quoted)."""
    return [F.col(f"`{c['name'].replace('`', '``')}`") for c in info.columns]


@dataclass
class CastRows:
    """One table's diff rows after the cast (see :func:`cast_diffs`)."""

    rows: DataFrame
    """The rows that cast: one column per table column, then ``_pgm_lsn`` and ``_pgm_diff``."""
    errors: list[tuple]
    """The table's decode errors and ``CastError`` records, each ``(table_oid, lsn, code,
    column, raw, message)``."""
    cached: list[DataFrame]
    adjusted: list[tuple] = dataclasses.field(default_factory=list)
    """Values a declared policy changed: ``(column, code, count, first_lsn, sample)``."""

    def unpersist(self) -> None:
        for df in self.cached:
            df.unpersist()


@dataclass
class TableDiffs:
    """One table's diff rows of a run, before the cast (see :func:`table_diffs`)."""

    wal: DataFrame
    """``DIFF_SCHEMA`` rows of the table's decoded changes (good ones only)."""
    copy: DataFrame
    """``DIFF_SCHEMA`` rows of its COPY records: good ones, decode errors (``code`` set) and
    :data:`PYTHON_CODE` markers, one per record that holds rows for the Python decoder."""
    python: Callable[[], DataFrame]
    """The Python decoder's diff rows of the marked records (run only when there are some)."""

    @property
    def rows(self) -> DataFrame:
        return self.wal.unionByName(self.copy, allowMissingColumns=True)


def table_diffs(
    oid: int, wal_good: DataFrame, copy_rows: DataFrame, copy_width: tuple[int, int]
) -> TableDiffs:
    """Table ``oid``'s diff rows of a run: its decoded changes (from ``wal_good``, good rows
    only) and its COPY records (from ``copy_rows``: ``table_oid, lsn, payload``) decoded in
    Spark SQL, the rows left to Python marked."""
    own = copy_rows.where(F.col("table_oid") == oid)
    widths = {oid: copy_width}
    return TableDiffs(
        wal_good.where(F.col("table_oid") == oid),
        snapshot_diffs(own, widths, mark=True),
        lambda: python_diffs(own, widths, _python_copy(widths)),
    )


def _cast_base(rows: DataFrame, changes: bool = False) -> DataFrame:
    """The columns a cast works on; with ``changes``, also what :mod:`silver.identity` needs of
    a change's rows (NULL for snapshot rows)."""
    extra = []
    if changes:
        has = set(rows.columns)
        extra = [
            F.col("ordinal").alias(ORDINAL),
            (F.col("kind") if "kind" in has else F.lit(None).cast("int")).alias(KIND),
            (F.col("columns") if "columns" in has else F.lit(None).cast("array<int>")).alias(
                COLUMNS
            ),
        ]
    return rows.select(
        "values",
        F.col("lsn").alias(_LSN),
        F.col("diff").alias(_DIFF),
        F.col("code").alias(_CODE),
        F.col("raw").alias(_RAW),
        F.col("message").alias(_MESSAGE),
        *extra,
    )


_CHANGE_COLUMNS = (ORDINAL, KIND, COLUMNS)


def _out(info: TableInfo, changes: bool = False) -> list:
    return [*data_columns(info), F.col(_LSN), F.col(_DIFF), *(_CHANGE_COLUMNS if changes else ())]


def cast_diffs(info: TableInfo, diffs: TableDiffs, changes: bool = False) -> CastRows:
    """One table's diff rows cast to its types; the decode errors and the values that did not
    cast, all known before any row is written.

    Every value is first cast by plain (code-generated) expressions (``plain_cast``), and the
    result persisted. One count over it finds the rows those leave unsettled; usually there are
    none and that is all. Otherwise :func:`_cast_unsettled` casts them. The caller calls
    ``unpersist`` when it has written the rows. With ``changes`` the rows keep each change's
    ordinal, kind and columns (for :mod:`silver.identity`). :func:`cast_in_one_pass` does the
    same work without the persisted copy, for a caller that can write the unsettled rows
    afterwards.
    """
    columns = _typed_columns(info)
    base = _cast_base(diffs.rows, changes)
    staged = plain_cast(base, "values", columns)
    plain = staged is not None
    if staged is None:  # some type has no plain value: every row takes the full cast
        staged = base.withColumn(SUSPECT_COLUMN, F.lit(True))
    staged = staged.persist(StorageLevel.MEMORY_AND_DISK)
    parts = [staged.where(~F.col(SUSPECT_COLUMN)).select(*_out(info, changes))] if plain else []
    cached, errors = [staged], []
    unsettled = _cast_unsettled(info, diffs, staged.where(F.col(SUSPECT_COLUMN)), changes)
    adjusted = []
    if unsettled is not None:
        parts.append(unsettled.rows)
        cached += unsettled.cached
        errors, adjusted = unsettled.errors, unsettled.adjusted
    if not parts:  # no rows at all, and no plain values to give the typed columns' schema
        kept = ("values", _LSN, _DIFF, *(_CHANGE_COLUMNS if changes else ()))
        empty = base.where(F.lit(False)).select(*kept)
        parts.append(cast_values(empty, "values", columns).select(*_out(info, changes)))
    return CastRows(functools.reduce(DataFrame.unionByName, parts), errors, cached, adjusted)


def _cast_unsettled(
    info: TableInfo, diffs: TableDiffs, suspect: DataFrame, changes: bool = False
) -> CastRows | None:
    """The rows the plain cast left unsettled (``suspect``: rows of ``plain_cast``'s output
    that set ``_pgm_suspect``, read at most three times): their decode errors, the rows of the
    records marked for Python decoded there, and all the rest cast in full with their error
    messages (``cast_values``). None when there are no unsettled rows."""
    columns = _typed_columns(info)
    if not suspect.count():
        return None
    flagged = suspect.where(F.col(_CODE).isNotNull()).select(_LSN, _CODE, _RAW, _MESSAGE)
    flagged = flagged.collect()
    errors = [(info.oid, *r[:2], None, *r[2:]) for r in flagged if r[_CODE] != PYTHON_CODE]
    cached: list[DataFrame] = []
    kept = ("values", _LSN, _DIFF, *(_CHANGE_COLUMNS if changes else ()))
    texts = suspect.where(F.col(_CODE).isNull()).select(*kept)
    if any(r[_CODE] == PYTHON_CODE for r in flagged):
        python = diffs.python().persist(StorageLevel.MEMORY_AND_DISK)
        cached.append(python)
        errors += [
            (info.oid, r["lsn"], r["code"], None, r["raw"], r["message"])
            for r in python.where(F.col("code").isNotNull()).collect()
        ]
        texts = texts.unionByName(
            _cast_base(python.where(F.col("code").isNull()), changes).select(*kept)
        )
    full = cast_values(texts, "values", columns).persist(StorageLevel.MEMORY_AND_DISK)
    cached.append(full)
    errors += _cast_errors(info, full)
    rows = full.where(F.size(CAST_ERRORS_COLUMN) == 0).select(*_out(info, changes))
    return CastRows(rows, errors, cached, _adjusted(info, texts))


def _adjusted(info: TableInfo, texts: DataFrame) -> list[tuple]:
    """How many of ``texts``' values a declared policy changed (``silver.casts.adjustments``),
    per column and kind: ``(column, code, count, first_lsn, sample)``, counts above zero. Only
    unsettled rows can hold such values (the plain cast settles none of them)."""
    checks = adjustments(_typed_columns(info))
    if not checks:
        return []
    names = [c["name"] for c in info.columns]
    aggregates = []
    for i, (name, _, test) in enumerate(checks):
        text = F.get(F.col("values"), names.index(name))
        hit = text.isNotNull() & test(text)
        aggregates += [
            F.count_if(hit).alias(f"n{i}"),
            F.min(F.when(hit, F.col(_LSN))).alias(f"l{i}"),
            F.array_distinct(F.array(F.min(F.when(hit, text)), F.max(F.when(hit, text)))).alias(
                f"s{i}"
            ),
        ]
    row = texts.agg(*aggregates).first()
    return [
        (name, code, row[f"n{i}"], row[f"l{i}"], json.dumps(row[f"s{i}"]))
        for i, (name, code, _) in enumerate(checks)
        if row[f"n{i}"]
    ]


@dataclass
class OnePass:
    """One table's diff rows cast as part of the job that writes them (see
    :func:`cast_in_one_pass`)."""

    rows: DataFrame
    """The rows the plain cast settles, as :attr:`CastRows.rows`. Use it in exactly one action
    (the write), then call :meth:`finish`."""
    wal_rows: DataFrame
    """The same for the table's decoded changes alone (for rewinds; not observed)."""
    info: TableInfo
    diffs: TableDiffs
    observation: Observation
    unsettled: DataFrame
    """All of the table's unsettled rows (the decode run again), for :meth:`finish`."""

    def finish(self) -> CastRows | None:
        """After the action that consumed :attr:`rows`: the rows it left out, cast in full,
        with the table's errors; None when it left none out (the common case, known from the
        count the action itself made). When that count is missing (the write was skipped: a
        run repeated after a crash, whose first write Delta already has), the unsettled rows
        are counted again."""
        try:
            counted = self.observation.get.get("unsettled")
        except Exception:  # the observed plan did not run: its metrics row is empty
            counted = None
        if counted == 0:
            return None
        suspect = self.unsettled.persist(StorageLevel.MEMORY_AND_DISK)
        late = _cast_unsettled(self.info, self.diffs, suspect)
        if late is None:
            suspect.unpersist()
            return None
        late.cached.insert(0, suspect)
        return late


def cast_in_one_pass(info: TableInfo, diffs: TableDiffs) -> OnePass | None:
    """The cast of :func:`cast_diffs` in the job that writes the rows, with no persisted copy.

    ``rows`` are the rows the plain cast settles (usually all of them); the write that
    consumes them also counts the others (an observed metric). :meth:`OnePass.finish` then
    casts those, when there are some, for a second write. None when some type has no plain
    value: use :func:`cast_diffs`.
    """
    columns = _typed_columns(info)
    wal = plain_cast(_cast_base(diffs.wal), "values", columns)
    copy = plain_cast(_cast_base(diffs.copy), "values", columns)
    if wal is None or copy is None:
        return None
    staged = wal.unionByName(copy, allowMissingColumns=True)
    observation = Observation(f"pgm_unsettled_{uuid.uuid4().hex}")
    observed = staged.observe(observation, F.count_if(F.col(SUSPECT_COLUMN)).alias("unsettled"))

    def settled(df: DataFrame) -> DataFrame:
        return df.where(~F.col(SUSPECT_COLUMN)).select(*_out(info))

    return OnePass(
        settled(observed),
        settled(wal),
        info,
        diffs,
        observation,
        staged.where(F.col(SUSPECT_COLUMN)),
    )


def _cast_errors(info: TableInfo, typed: DataFrame) -> list[tuple]:
    return [
        (info.oid, r[_LSN], "CastError", r["e"]["column_name"], r["e"]["raw"], r["e"]["message"])
        for r in typed.where(F.size(CAST_ERRORS_COLUMN) > 0)
        .select(_LSN, F.explode(CAST_ERRORS_COLUMN).alias("e"))
        .collect()
    ]


TABLE_WORKERS = 4
"""How many tables a run works on at once. Per table a run is a few small Spark jobs and
Delta commits whose time is mostly the driver's (planning, the Delta log, the commit), so on
two cores four at a time still overlap."""


def _table_run(
    spark: SparkSession,
    cfg: Config,
    n: _Names,
    info: TableInfo,
    diffs: TableDiffs,
    run: int,
    *,
    new_snapshot: bool,
    truncates: list[tuple[int, int]],
    identity_keys: tuple[int, ...] | None = None,
    exists: bool | None = None,
) -> tuple[int, list[tuple], list[tuple]]:
    """Cast, rewind, truncate, consolidate and append one table's diffs of this run.

    Usually in one pass: the rows the plain cast settles are rewound, consolidated and written,
    and that write counts the rows it left out. When there are some (values the plain cast
    does not settle, decode errors, records for the Python decoder), they are cast in full and
    written in a second append of the same run (its own Delta transaction id, so a repeated run
    skips each append it already made), with its rewinds. The two appends hold different
    (row, LSN) pairs: whether the plain cast settles a row depends only on its values' text,
    which is the same in a change and in the snapshot's COPY row (rows the Python decoder
    reads, with octal or hex escapes PostgreSQL's COPY never writes, are the exception: sums
    stay right, but such a row and a change of it at the same LSN can then be two rows). A
    table with truncates to apply, or with a type that has no plain cast, or with changes that
    need their previous images (``identity_keys``: the key positions of its REPLICA IDENTITY
    DEFAULT or USING INDEX, see :mod:`silver.identity`), is cast whole before anything is
    written.
    """
    target = n.table(info.silver_table)
    if exists is None:
        exists = _table_exists(spark, target)
    if new_snapshot and exists:
        # Snapshotted again (a resync, or a table first read through the stream): the table is
        # rebuilt from this snapshot and the changes after it, with the columns and policies
        # of now. A crash before the run's _progress row redoes the same rebuild.
        spark.sql(f"DROP TABLE {target}")
        exists = False
    resolving = identity_keys is not None
    one = None if truncates or resolving else cast_in_one_pass(info, diffs)
    if one is not None:
        consolidated = _consolidated(info, _diff_parts(info, one.rows, one.wal_rows), run)
        if not exists:
            _create_diff_table(spark, target, consolidated.schema)
        written = [_append_diffs(consolidated, target, cfg.source.name, run)]
        late = one.finish()
        errors = late.errors if late is not None else []
        adjusted = late.adjusted if late is not None else []
        if late is not None:
            rows = _consolidated(info, _diff_parts(info, late.rows, late.rows), run)
            written.append(_append_diffs(rows, target, cfg.source.name, run, second=True))
            late.unpersist()
        return _written(spark, target, run, written), errors, adjusted

    cast = cast_diffs(info, diffs, changes=resolving)
    ok, errors = cast.rows, cast.errors
    if resolving:
        images = resolve_previous_images(
            ok,
            [c["name"] for c in info.columns],
            identity_keys,
            spark.table(target).where(F.col("_run") < run) if exists else None,
            info.snapshot_lsn,
            truncates,
        )
        ok = images.rows
        cast.cached += images.cached
        errors = errors + [
            (info.oid, lsn, code, None, None, msg) for lsn, code, msg in images.errors
        ]
    data = data_columns(info)
    out = _diff_parts(info, ok, ok)
    for lsn, _ in sorted(truncates):
        before = out.where(F.col("_lsn") < lsn)
        if exists:
            before = before.unionByName(
                spark.table(target).select(*data, "_lsn", "_diff").where(F.col("_lsn") < lsn)
            )
        state = before.groupBy(*data).agg(F.sum("_diff").alias("_diff")).where(F.col("_diff") > 0)
        out = out.unionByName(
            state.select(
                *data, F.lit(lsn).cast("bigint").alias("_lsn"), (-F.col("_diff")).alias("_diff")
            )
        )
    consolidated = _consolidated(info, out, run)
    if not exists:
        _create_diff_table(spark, target, consolidated.schema)
    written = _append_diffs(consolidated, target, cfg.source.name, run)
    count = _written(spark, target, run, [written])
    cast.unpersist()
    return count, errors, cast.adjusted


def _diff_parts(info: TableInfo, ok: DataFrame, wal_ok: DataFrame) -> DataFrame:
    """``ok``'s rows as ``data..., _lsn, _diff``, with the rewinds of a snapshot: the changes
    (from ``wal_ok``) at or below the snapshot's LSN, negated at LSN 0."""
    data = data_columns(info)
    out = ok.select(*data, F.col(_LSN).alias("_lsn"), F.col(_DIFF).alias("_diff"))
    s = info.snapshot_lsn
    if s is not None:
        rewound = wal_ok.where((F.col(_LSN) > 0) & (F.col(_LSN) <= s))
        out = out.unionByName(
            rewound.select(
                *data, F.lit(0).cast("bigint").alias("_lsn"), (-F.col(_DIFF)).alias("_diff")
            )
        )
    return out


def _consolidated(info: TableInfo, out: DataFrame, run: int) -> DataFrame:
    return (
        out.groupBy(*data_columns(info), "_lsn")
        .agg(F.sum("_diff").alias("_diff"))
        .where(F.col("_diff") != 0)
        .withColumn("_run", F.lit(run).cast("bigint"))
    )


def _append_diffs(
    df: DataFrame, table: str, source: str, run: int, second: bool = False
) -> int | None:
    """Append a table's diffs of run ``run`` (``second``: the rows its first append left out),
    as an idempotent Delta commit; how many rows it wrote (None: not known, the write was
    skipped as done before). Through ``writeTo``: its write fills the metrics a
    ``DataFrame.observe`` in ``df``'s plan collects (``saveAsTable``'s does not)."""
    app = f"pgmedallion-silver-{source}" + ("-late" if second else "")
    observation = Observation(f"pgm_rows_{uuid.uuid4().hex}")
    writer = (
        df.observe(observation, F.count(F.lit(1)).alias("rows"))
        .writeTo(table)
        .option("txnAppId", app)
        .option("txnVersion", str(run))
        .option("mergeSchema", "true")
    )
    failpoint("silver.before_append")
    writer.append()
    failpoint("silver.after_append")
    try:
        return observation.get.get("rows")
    except Exception:  # the write was skipped (idempotent): the observed plan did not run
        return None


def _written(spark: SparkSession, target: str, run: int, counts: list[int | None]) -> int:
    """The rows run ``run`` appended to ``target``: the writes' own counts, or (a write
    skipped as done before) a count of the table's rows of the run."""
    if all(c is not None for c in counts):
        return sum(counts)
    return spark.table(target).where(F.col("_run") == run).count()


def _silver_tables(spark: SparkSession, n: _Names) -> set[str]:
    """The silver schema's table names, lower case (one catalog call for the run)."""
    return {r["tableName"].lower() for r in spark.sql(f"SHOW TABLES IN {n.schema}").collect()}


def _table_exists(spark: SparkSession, qualified: str) -> bool:
    try:
        return spark.table(qualified).schema is not None
    except Exception:
        return False


def _create_diff_table(spark: SparkSession, table: str, schema: T.StructType) -> None:
    from delta.tables import DeltaTable

    (
        DeltaTable.createIfNotExists(spark)
        .tableName(table)
        .addColumns(schema)
        .property("delta.columnMapping.mode", "name")
        .property("delta.minReaderVersion", "2")
        .property("delta.minWriterVersion", "5")
        .execute()
    )


def _write_tables(
    spark: SparkSession, n: _Names, source: str, tables: dict[int, TableInfo]
) -> None:
    rows = []
    for info in tables.values():
        cols = [dict(c, spark_type=spark_type(_pg_type(c)).simpleString()) for c in info.columns]
        rows.append(
            (
                source,
                info.oid,
                info.schema,
                info.name,
                info.silver_table,
                info.snapshot_lsn,
                info.primary_key,
                info.not_null,
                json.dumps(cols, sort_keys=True),
                info.snapshot_run,
            )
        )
    df = spark.createDataFrame(
        rows,
        "source string, table_oid long, table_schema string, table_name string, "
        "silver_table string, snapshot_lsn long, primary_key array<string>, "
        "not_null array<string>, columns string, snapshot_run long",
    ).withColumn("updated_at", F.current_timestamp())
    # One atomic commit replacing this source's rows (other sources' rows stay as they are),
    # through the catalog (by name, so it works on Unity Catalog managed tables too).
    df.select(*spark.table(n.tables).columns).writeTo(n.tables).overwrite(
        F.col("source") == F.lit(source)
    )
