"""Gold's Delta tables: their schemas, creating them, and the tagged commits that write them.

Every commit of a gold run carries gold's JSON tag in its ``userMetadata`` (what it applied:
``gold.history.applied_state`` reads it back) and, given an app id and a version, Delta's
idempotent-write settings, so that a commit repeated after a crash is skipped.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from pgmedallion.core import deletion_vectors, delta_rs
from pgmedallion.core.config import Config
from pgmedallion.core.naming import COLUMN_MAPPING, quote
from pgmedallion.core.spark import create_table as create_managed
from pgmedallion.core.sparkapi import F, T
from pgmedallion.gold.history import TAG
from pgmedallion.gold.on_spark import c
from pgmedallion.gold.plan import Table
from pgmedallion.gold.pruning import small
from pgmedallion.gold.state import DELETE, INSERT, LSN, MULT, OP, RULES, UPSERT
from pgmedallion.silver.contract import RUN as SILVER_RUN

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

log = logging.getLogger(__name__)

GOLD_PROPERTIES = {**COLUMN_MAPPING, "delta.enableDeletionVectors": "true"}


@contextmanager
def tagged_commit(
    spark: SparkSession, metadata: dict, app_id: str | None, version: int | None
) -> Iterator[None]:
    """Delta commits made inside carry ``metadata`` and, given an app id, are idempotent."""
    settings = {"spark.databricks.delta.commitInfo.userMetadata": json.dumps({TAG: metadata})}
    if app_id is not None and version is not None:
        settings["spark.databricks.delta.write.txnAppId"] = app_id
        settings["spark.databricks.delta.write.txnVersion"] = str(version)
    for key, value in settings.items():
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key in settings:
            spark.conf.unset(key)


def table_exists(spark: SparkSession, name: str) -> bool:
    return spark.catalog.tableExists(name)


def latest_version(spark: SparkSession, name: str) -> int:
    return int(spark.sql(f"DESCRIBE HISTORY {name} LIMIT 1").collect()[0]["version"])


def layer_schema(cfg: Config, layer: str) -> str:
    """A layer's schema (``gold``, ``silver``), qualified and back-quoted."""
    return cfg.schema(layer)


def gold_table_names(spark: SparkSession, cfg: Config) -> set[str]:
    """The gold schema's table names, lower case (one catalog call)."""
    return delta_rs.table_names(spark, layer_schema(cfg, "gold"))


def plain_name(cfg: Config, layer: str, name: str) -> str:
    schema = getattr(cfg.lakehouse, f"{layer}_schema")
    return ".".join(p for p in (cfg.lakehouse.catalog, schema, name) if p)


def create_table(
    spark: SparkSession,
    name: str,
    schema: T.StructType | pa.Schema,
    *,
    local: tuple[str, str] | None = None,
) -> None:
    """Gold table ``name`` with ``schema`` and gold's properties; ``local``: its schema and
    table name, for a creation by delta-rs before Spark starts
    (``delta_rs.create_unregistered``)."""
    if local is not None:
        if delta_rs.create_unregistered(spark, *local, schema, GOLD_PROPERTIES) is not None:
            return
    from delta.tables import DeltaTable

    if isinstance(schema, pa.Schema):
        schema = delta_rs.spark_types(schema)

    builder = DeltaTable.createIfNotExists(spark).tableName(name).addColumns(schema)
    for key, value in GOLD_PROPERTIES.items():
        builder = builder.property(key, value)
    create_managed(spark, builder.execute)


def _nullable(fields: Sequence[pa.Field]) -> list[pa.Field]:
    return [f.with_nullable(True) for f in fields]


def gold_schema(columns: Sequence[pa.Field]) -> pa.Schema:
    """A gold table's columns: silver's (``Table.columns``), then ``_lsn``."""
    return pa.schema([*_nullable(columns), pa.field(LSN, pa.int64())])


def quarantine_schema(columns: Sequence[pa.Field]) -> pa.Schema:
    """A gold table's quarantine's columns."""
    return pa.schema(
        [
            *_nullable(columns),
            pa.field(LSN, pa.int64()),
            pa.field(MULT, pa.int64()),
            pa.field(RULES, pa.list_(pa.string())),
            pa.field(SILVER_RUN, pa.int64()),
        ]
    )


def same_columns(spark: SparkSession, name: str, schema: pa.Schema) -> bool:
    have = [(f.name, f.dataType) for f in spark.table(name).schema.fields]
    return have == [(f.name, f.dataType) for f in delta_rs.spark_types(schema).fields]


def key_match(key: Sequence[str]) -> Column:
    """The MERGE condition of target ``t`` and source ``s`` on ``key`` (NULL equal to NULL)."""
    cond = F.lit(True)
    for k in key:
        cond = cond & c(k, "t").eqNullSafe(c(k, "s"))
    return cond


def ranges_target(t: Table) -> Column:
    """The touched keys' ranges on the MERGE target (true when the run has none)."""
    return t.range_pred_target if t.range_pred_target is not None else F.lit(True)


def merge_gold(t: Table, ops: DataFrame) -> None:
    """One keyed MERGE of ``pgmedallion.gold.state.merge_operations``'s rows into the gold table."""
    from delta.tables import DeltaTable

    # Every clause takes its values from the source alone: with deletion vectors, Delta's
    # second pass then reads only the key columns of the files it touches, not whole rows
    # (a condition comparing old and new values made it read every column: 9 s instead of
    # 5.3 s at 10M rows). An upsert equal to the old row is rare (the LSN moves with any
    # change) and costs one rewritten row.
    values = {quote(n): c(n, "s") for n in [*t.names, LSN]}
    cond = (F.col(f"s.{OP}") != "insert") & key_match(t.key) & ranges_target(t)
    target = DeltaTable.forName(t.spark, t.gold).alias("t")
    (
        target.merge(small(t, ops).alias("s"), cond)
        .whenMatchedDelete(condition=F.col(f"s.{OP}") == "delete")
        .whenMatchedUpdate(condition=F.col(f"s.{OP}") == "upsert", set=values)
        .whenNotMatchedInsert(condition=F.col(f"s.{OP}").isin("upsert", "insert"), values=values)
        .execute()
    )


# Gold tables up to ``[lakehouse] small_table_rows`` rows take their MERGE through delta-rs
# (local tables only). delta-rs rewrites every file a MERGE touches (no deletion vectors) and
# prunes no files by the touched keys' ranges; for large tables Spark, which does both, was
# measured (the ``incremental`` benchmark, 1M and 10M rows) and delta-rs was not, so they stay
# with Spark.


def merge_gold_delta_rs(
    t: Table, ops: DataFrame, metadata: dict, version: int | None, rows_before: int | None
) -> bool:
    """:func:`merge_gold` through delta-rs: one Spark job collects the MERGE's source rows as
    Arrow and :func:`merge_arrow` commits them. False, having written nothing, where it does
    not apply: not a local table, no idempotency record, a table above
    ``small_table_rows``, or a source delta-rs cannot take."""
    if version is None or rows_before is None or rows_before > delta_rs.small_rows():
        return False
    if not delta_rs.usable(t.path):
        return False
    if delta_rs.done(delta_rs.open_table(t.path), t.app_id, version):
        return True
    return merge_arrow(t, ops.toArrow(), metadata, version)


def merge_by_vectors(
    t: Table, located: deletion_vectors.Located, source: pa.Table, metadata: dict, version: int
) -> bool:
    """:func:`merge_arrow`'s MERGE written as Spark writes it on a table with deletion vectors:
    the gold rows ``located`` read whose key a ``delete`` or ``upsert`` source row names are
    deleted by deletion vector, the ``upsert`` and ``insert`` rows appended, in one commit
    (``core.deletion_vectors``). ``located`` holds every gold row of the source's keys. False,
    having written nothing, when the table cannot take it or was written since it was read
    (then :func:`merge_arrow`)."""
    table = delta_rs.open_table(t.path)
    if delta_rs.done(table, t.app_id, version):
        return True
    op = source.column(OP)
    matched = source.filter(pc.is_in(op, value_set=pa.array([DELETE, UPSERT])))
    deleted = deletion_vectors.matching(located.rows, matched.select(t.key))
    added = source.filter(pc.is_in(op, value_set=pa.array([UPSERT, INSERT]))).drop_columns([OP])
    meta = {"userMetadata": json.dumps({TAG: metadata})}
    try:
        return deletion_vectors.delete_and_append(
            located, deleted, added, app=t.app_id, version=version, metadata=meta
        )
    except deletion_vectors.Unsupported as reason:
        log.info("%s: MERGE by delta-rs (%s)", t.gold, reason)
        return False


def merge_arrow(t: Table, source: pa.Table, metadata: dict, version: int) -> bool:
    """The MERGE of source rows ``(columns, _lsn, _op)`` (see ``gold.state.merge_operations``)
    into the local gold table at ``t.path`` by delta-rs, with gold's tag and the table's
    idempotency record at ``version`` (a MERGE of that version made before is skipped). False,
    having written nothing, when delta-rs cannot take it (then Spark's MERGE is the way)."""
    table = delta_rs.open_table(t.path)
    if delta_rs.done(table, t.app_id, version):
        return True
    values = {delta_rs.sql_name(n): f"s.{delta_rs.sql_name(n)}" for n in [*t.names, LSN]}
    # Each term in parentheses: DataFusion parses ``a AND b IS NOT DISTINCT FROM c`` otherwise
    # (a text key column then fails to plan).
    match = " AND ".join(
        f"(t.{delta_rs.sql_name(k)} IS NOT DISTINCT FROM s.{delta_rs.sql_name(k)})" for k in t.key
    )
    meta = {"userMetadata": json.dumps({TAG: metadata})}
    props = delta_rs.commit_properties(t.app_id, version, meta)
    try:
        (
            table.merge(
                source,
                predicate=f"(s.{OP} != '{INSERT}') AND {match}",
                source_alias="s",
                target_alias="t",
                commit_properties=props,
            )
            .when_matched_delete(predicate=f"s.{OP} = '{DELETE}'")
            .when_matched_update(updates=values, predicate=f"s.{OP} = '{UPSERT}'")
            .when_not_matched_insert(
                updates=values, predicate=f"s.{OP} IN ('{UPSERT}', '{INSERT}')"
            )
            .execute()
        )
    except Exception as exc:  # e.g. a type delta-rs does not take
        if delta_rs.done(delta_rs.open_table(t.path), t.app_id, version):
            return True  # the commit was made
        log.warning("%s: the MERGE goes through Spark (delta-rs: %s)", t.gold, exc)
        return False
    if not delta_rs.done(delta_rs.open_table(t.path), t.app_id, version):
        # A MERGE that changed nothing (an empty source) made no commit: the run's record is
        # made as Spark's MERGE makes it, by a commit of no data.
        delta_rs.empty_commit(t.path, t.app_id, version, meta)
    return True
