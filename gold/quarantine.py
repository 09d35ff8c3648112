"""A gold table's quarantine: the rows of its state kept out of gold, written before gold.

The quarantine table is written first and its version recorded in the gold commit; the next
run reads it back *as of that version*, so a crash between the two commits re-reads the old
quarantine (see ``gold/build.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pgmedallion.core.naming import quote
from pgmedallion.core.sparkapi import F
from pgmedallion.gold.history import Applied
from pgmedallion.gold.on_spark import c
from pgmedallion.gold.plan import Table
from pgmedallion.gold.pruning import small
from pgmedallion.gold.state import LSN, MULT, OP, RULES, TO_GOLD
from pgmedallion.gold.table_io import (
    create_table,
    key_match,
    latest_version,
    quarantine_schema,
    ranges_target,
    table_exists,
    tagged_commit,
)
from pgmedallion.silver.contract import RUN as SILVER_RUN

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


def quarantine_rows(t: Table, checked: DataFrame) -> DataFrame:
    """The checked state's rows that stay out of gold, tagged with the silver run."""
    return checked.filter(~F.col(TO_GOLD)).select(
        *[c(n) for n in t.names],
        LSN,
        MULT,
        RULES,
        F.lit(t.silver_run).cast("bigint").alias(SILVER_RUN),
    )


def write_quarantine(
    t: Table,
    checked: DataFrame,
    affected: DataFrame | None,
    applied: Applied | None,
    new_rows: int,
    old_rows: int,
    version: int | None,
) -> int | None:
    """Write the quarantine table's new rows; its version after that (None: no table).

    ``affected`` None: a full build, which replaces the table; else the touched keys, whose
    old quarantined rows one MERGE replaces by the new ones.
    """
    spark = t.spark
    exists = table_exists(spark, t.quarantine)
    if not exists and not new_rows:
        return None
    if not exists:
        local = (t.cfg.schema("gold"), t.info.silver_table + "__quarantine")
        create_table(spark, t.quarantine, quarantine_schema(t.columns), local=local)
    meta = {"source": t.info.source, "silver_run": t.silver_run, "frontier": t.frontier}
    app_id = t.app_id + "__quarantine"
    rows = quarantine_rows(t, checked)
    if affected is None:
        with tagged_commit(spark, meta, app_id, version):
            rows.writeTo(t.quarantine).overwrite(F.lit(True))
    elif new_rows or old_rows:
        with tagged_commit(spark, meta, app_id, version):
            _merge_quarantine(t, rows, affected)
    elif applied is not None and applied.quarantine_version is not None:
        return applied.quarantine_version
    return latest_version(spark, t.quarantine)


def _merge_quarantine(t: Table, rows: DataFrame, affected: DataFrame) -> None:
    """Delete the touched keys' quarantined rows and insert ``rows``, in one MERGE."""
    from delta.tables import DeltaTable

    markers = affected.select(
        *[c(n) if n in t.key else F.lit(None).alias(n) for n in t.names],
        F.lit(None).cast("bigint").alias(LSN),
        F.lit(None).cast("bigint").alias(MULT),
        F.lit(None).cast("array<string>").alias(RULES),
        F.lit(None).cast("bigint").alias(SILVER_RUN),
        F.lit("delete").alias(OP),
    )
    markers = markers.select(
        *[F.col(quote(f.name)).cast(f.dataType).alias(f.name) for f in rows.schema.fields],
        OP,
    )
    source = markers.unionByName(rows.withColumn(OP, F.lit("insert")))
    cond = (F.col(f"s.{OP}") == "delete") & key_match(t.key) & ranges_target(t)
    target = DeltaTable.forName(t.spark, t.quarantine).alias("t")
    (
        target.merge(small(t, source).alias("s"), cond)
        .whenMatchedDelete()
        .whenNotMatchedInsert(
            condition=F.col(f"s.{OP}") == "insert",
            values={quote(f.name): c(f.name, "s") for f in rows.schema.fields},
        )
        .execute()
    )
