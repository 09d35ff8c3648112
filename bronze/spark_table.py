"""Bronze through Spark: the table's DDL, Spark's idempotent writer, and :class:`SparkBronze`.

Silver reads bronze with Spark always; capture uses this module only where delta-rs cannot
commit (see :mod:`bronze.store`): on Databricks, where bronze is not a local directory, or
when ``[lakehouse] engine = "spark"``. There a snapshot is one Spark job of one task per
ctid range.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlparse

import pyarrow as pa
import pyarrow.compute as pc

from pgmedallion.bronze.store import INDEX_COLUMNS, PAYLOAD_KINDS, Bronze, CopyTask
from pgmedallion.bronze.table import ARROW_SCHEMA, BRONZE_DDL, STATS_COLUMNS, SealedBatch, app_id
from pgmedallion.core.delta_rs import application
from pgmedallion.core.errors import PipelineError, error_type
from pgmedallion.core.spark import create_table, one_task_per_partition
from pgmedallion.core.sparkapi import F

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


def ensure_bronze_table(spark: SparkSession, table: str, path: str | None = None) -> None:
    """Create the bronze table in the catalog if it is not there. ``path``: where a capture
    without Spark (delta-rs) may have created it already; then the catalog is pointed at it."""
    if path is not None and (Path(path) / "_delta_log").is_dir():
        location = str(path).replace("\\", "\\\\").replace("'", "\\'")
        spark.sql(f"CREATE TABLE IF NOT EXISTS {table} USING DELTA LOCATION '{location}'")
        return
    sql = (
        f"CREATE TABLE IF NOT EXISTS {table} ({BRONZE_DDL}) USING DELTA "
        f"TBLPROPERTIES ('delta.dataSkippingStatsColumns' = '{STATS_COLUMNS}')"
    )
    create_table(spark, lambda: spark.sql(sql))


def local_table_path(spark: SparkSession, table: str, managed: str | None = None) -> str | None:
    """The local directory of Delta table ``table``, or None if it is not on this file system.
    ``managed``: where the local session's catalog keeps the table (``Config.local_table_path``:
    its warehouse under the state directory, where ``ensure_bronze_table`` registers a bronze
    that delta-rs created); taken when a Delta table is there. Else asked of Spark, once per
    application while the directory stays (``DESCRIBE DETAIL`` computes the table's snapshot:
    most of a second on a bronze table a continuous capture commits to every second, 4.6 s in
    a cold process)."""
    if managed is not None and (Path(managed) / "_delta_log").is_dir():
        return str(managed)
    key = (application(spark), table)
    known = _LOCATIONS.get(key)
    if known is not None and (Path(known) / "_delta_log").is_dir():
        return known
    location = spark.sql(f"DESCRIBE DETAIL {table}").first()["location"]
    url = urlparse(location or "")
    if url.scheme not in ("file", ""):
        return None
    path = unquote(url.path)
    if not (Path(path) / "_delta_log").is_dir():
        return None
    _LOCATIONS[key] = path
    return path


_LOCATIONS: dict[tuple[str, str], str] = {}


def bronze_dir(spark: SparkSession, cfg) -> str | None:
    """Bronze's local directory for ``cfg`` (:func:`local_table_path` with the local catalog's
    place for it), or None."""
    bronze = cfg.qualified("bronze", "bronze")
    return local_table_path(spark, bronze, cfg.local_table_path("bronze", "bronze"))


RANGES_PER_WORKER = 4
"""A snapshot wave's key ranges per worker when bronze is written through Spark (a stopped
snapshot redoes at most one wave: 256 MB of heap with two workers and 32 MB ranges)."""


def write_batch(df: DataFrame, table: str, source: str, batch_id: int, app: str | None = None):
    """Append one batch as one idempotent Delta commit."""
    (
        df.write.format("delta")
        .mode("append")
        .option("txnAppId", app or app_id(source))
        .option("txnVersion", batch_id)
        .saveAsTable(table)
    )


def copy_row_counts(copy_records: DataFrame) -> DataFrame:
    """Rows per table of some ``copy`` records: ``table_oid, table_schema, table_name, rows``.

    A ctid range's row count is its largest ``ordinal``; the records must be one snapshot's.
    """
    keys = ["table_oid", "table_schema", "table_name"]
    return (
        copy_records.groupBy(*keys, "part")
        .agg(F.max("ordinal").alias("rows"))
        .groupBy(*keys)
        .agg(F.sum("rows").cast("long").alias("rows"))
    )


def sealed_dataframe(spark: SparkSession, batch: SealedBatch) -> DataFrame:
    """A stream batch's bronze rows, in the bronze table's column order."""
    constants = {
        "source": F.lit(batch.source),
        "kind": F.lit("wal"),
        "table_oid": F.lit(None).cast("bigint"),
        "table_schema": F.lit(None).cast("string"),
        "table_name": F.lit(None).cast("string"),
        "part": F.lit(None).cast("int"),
        "batch_id": F.lit(batch.batch_id).cast("bigint"),
        "run_id": F.lit(batch.run_id),
        "captured_at": F.lit(batch.captured_at),
    }
    wal = spark.createDataFrame(batch.wal)
    df = wal.select(*[constants.get(f.name, F.col(f.name)).alias(f.name) for f in ARROW_SCHEMA])
    if batch.others is not None:
        df = df.unionByName(spark.createDataFrame(batch.others))
    # createDataFrame makes one partition of each Arrow batch of
    # spark.sql.execution.arrow.maxRecordsPerBatch rows (34 for a 340,000-message batch),
    # and the write one Parquet file of each: one file per commit instead writes the batch
    # in 60% of the time (measured) and keeps bronze's files few.
    return df.coalesce(1)


class SparkWriter:
    name = "spark"

    def __init__(
        self, spark: SparkSession, table: str, source: str, bronze: SparkBronze | None = None
    ) -> None:
        self.spark, self.table, self.source = spark, table, source
        self.bronze = bronze
        """The bronze whose records each commit changes: told what it committed."""

    def write(self, batch: SealedBatch) -> None:
        try:
            write_batch(
                sealed_dataframe(self.spark, batch), self.table, self.source, batch.batch_id
            )
        except BaseException:
            if self.bronze is not None:
                self.bronze.refresh()
            raise
        if self.bronze is not None:
            self.bronze._committed(batch.batch_id, batch.others)


class SparkBronze(Bronze):
    """Bronze read and committed through Spark (the catalog's table)."""

    name = "spark"

    def __init__(self, spark: SparkSession, table: str, source: str) -> None:
        super().__init__(table, source)
        self.spark = spark
        self._read: list[dict[str, Any]] | None = None
        self._next: int | None = None

    # Each read is a Spark job (0.5-1 s warm however few the records; more in a cold process,
    # Delta's state of bronze first), and a capture asks a dozen questions between two of its
    # commits: the records are read once and kept, with what this object commits added to them,
    # until ``refresh`` says another process may have committed (or a snapshot's wave, whose
    # copy records Spark's executors wrote, calls for a read). After its own commit it knows
    # the next batch id without a read: a snapshot in key ranges asks only that between two
    # ranges' commits.

    def refresh(self) -> SparkBronze:
        self._read, self._next = None, None
        return self

    def _committed(self, batch_id: int, records: pa.Table | None = None) -> None:
        """After this object's commit of ``batch_id``: the next batch id follows it. With the
        ``records`` it committed (a stream batch's progress record, a record appended), the
        records read before stay, those added (a read is a Spark job and a Delta snapshot of
        bronze: 4 s after a stream's commit in a cold process); without them (a snapshot's
        waves, whose copy records Spark's executors wrote), they are read anew at the next
        question. As between any two reads, another process's commits show after ``refresh``."""
        if records is None:
            self._read = None
        elif self._read is not None:
            kept = records.filter(pc.not_equal(records.column("kind"), "wal"))
            for r in kept.select([*INDEX_COLUMNS, "payload"]).to_pylist():
                if r["kind"] not in PAYLOAD_KINDS:
                    r["payload"] = None
                self._read.append(r)
        self._next = batch_id + 1 if self._next is None else max(self._next, batch_id + 1)

    def next_batch_id(self) -> int:
        if self._read is None and self._next is not None:
            return self._next
        found = super().next_batch_id()
        return found if self._next is None else max(found, self._next)

    def _records(self) -> list[dict[str, Any]]:
        if self._read is not None:
            return self._read
        # The payloads the questions read (progress, error and schema records) come along; the
        # copy records' (their rows) do not. Two scans in one job: a projection that only
        # nulls a payload still reads it, and a snapshot's files of copy records hold most of
        # bronze's bytes (after a 4M-row snapshot, the scan's stage took 2.2-4.5 s in a cold
        # process, 0.3-1.2 s in two scans: measured in each of capture and silver). Bronze's
        # statistics on ``kind`` skip the files of wal messages in both scans, and the files
        # of copy records in the one that reads payloads.
        table = self.spark.table(self.table).where(F.col("source") == self.source)
        needed = F.col("kind").isin(*PAYLOAD_KINDS)
        with_payload = table.where(needed).select(*INDEX_COLUMNS, "payload")
        without = table.where((F.col("kind") != "wal") & ~needed).select(
            *INDEX_COLUMNS, F.lit(None).cast("binary").alias("payload")
        )
        rows = with_payload.unionByName(without).collect()
        self._read = [r.asDict() for r in rows]
        return self._read

    def _payload(self, record: dict[str, Any]) -> bytes | None:
        payload = record["payload"]
        return None if payload is None else bytes(payload)

    def append(self, records: pa.Table, batch_id: int, app: str | None = None) -> bool:
        # Delta skips a txnVersion it has seen; whether it did is not reported.
        try:
            write_batch(self.spark.createDataFrame(records), self.table, self.source, batch_id, app)
        except BaseException:
            self.refresh()
            raise
        self._committed(batch_id, records)
        return True

    def writer(self) -> SparkWriter:
        return SparkWriter(self.spark, self.table, self.source, self)

    def ranges_per_commit(self, workers: int) -> int:
        """:data:`RANGES_PER_WORKER` ranges per worker: each commit through Spark costs a
        second or two beyond its rows (the idempotent write reconstructs the table's state in
        three Spark jobs, see ``benchmarks/RESULTS.md``, session 45), so a wave lands more."""
        return RANGES_PER_WORKER * max(1, workers)

    def write_snapshot(
        self, tasks: int, copy_task: CopyTask, meta: pa.Table, batch_id: int, workers: int
    ) -> None:
        schema = self.spark.createDataFrame(ARROW_SCHEMA.empty_table()).schema
        copy_df = one_task_per_partition(self.spark, tasks).mapInArrow(copy_task, schema)
        meta_df = self.spark.createDataFrame(meta)
        try:
            write_batch(copy_df.unionByName(meta_df), self.table, self.source, batch_id)
        except BaseException as exc:
            self.refresh()
            error = capture_error_from_spark(exc) if isinstance(exc, Exception) else None
            if error is None:
                raise
            raise error from exc
        self._committed(batch_id)


_ERROR_IN_TRACE = re.compile(r"pgmedallion\.(?:core|capture|silver)\.errors\.(\w+): ([^\n]*)")


def capture_error_from_spark(exc: BaseException) -> PipelineError | None:
    """The capture error a Spark task died of, from the Python traceback Spark relays."""
    matches = _ERROR_IN_TRACE.findall(str(exc))
    if not matches:
        return None
    name, message = matches[-1]
    cls = error_type(name)
    if cls is None:
        return None
    return cls(message.strip())
