"""How a stream batch becomes one idempotent Delta commit: delta-rs where it can, Spark elsewhere.

Every stream batch is one commit carrying the Delta transaction ``(txnAppId =
pgmedallion-<source>, txnVersion = batch_id)``; a batch whose version the table already
records is skipped, so a commit retried after a crash never lands twice. Two writers keep that
contract:

``DeltaRsWriter`` (the ``deltalake`` package, delta-rs)
    Appends the batch's Arrow table straight from the capture process, with the transaction
    in the same commit (``CommitProperties(app_transactions=...)``). It first reads the
    application's transaction version from the newest log (``update_incremental``) and skips a
    batch already there: delta-rs itself would accept a repeated version. A commit that loses
    a race is checked the same way. A commit costs tens of milliseconds (a 340,000-message batch
    0.1 s) against 2-5 s through Spark, which is what made the stream wait for its commits.
    It runs where bronze is a directory of the local file system (local runs, the tests, the
    demo): delta-rs writes there with the same atomic put-if-absent of the log entry as Spark.
``SparkWriter``
    ``DataFrameWriter`` with ``txnAppId``/``txnVersion``. It runs on Databricks (a Unity Catalog
    managed table can only be written through the catalog, and cloud storage needs the
    cluster's credentials), wherever bronze is not a local directory, when the table needs a
    protocol delta-rs does not write, and when ``PGMEDALLION_BRONZE_WRITER=spark`` asks for it.

The table stays an ordinary Delta table: Spark reads what either writer committed (the tests
read every table the delta-rs writer produced). Where delta-rs commits, a snapshot's Spark
tasks write their Parquet files into the table's directory (:func:`write_data_file`) and the
driver commits them (:meth:`DeltaRsWriter.commit_files`); error records go through Spark.
The two writers never commit at the same time: a capture attempt commits its snapshot before
it streams, and one stream batch at a time.
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol
from urllib.parse import unquote, urlparse

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql import SparkSession

try:  # in the `local` extra: a Databricks cluster commits bronze through Spark
    from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
    from deltalake.exceptions import CommitFailedError
    from deltalake.transaction import AddAction
except ImportError:
    DeltaTable = None

from bronze.table import ARROW_SCHEMA, STATS_COLUMNS, SealedBatch, app_id, write_batch
from pgmedallion.spark import on_databricks

log = logging.getLogger(__name__)

WRITER_ENV = "PGMEDALLION_BRONZE_WRITER"
"""``auto`` (the default), ``delta-rs`` (fail if it cannot) or ``spark``."""

_MAX_WRITER_VERSION = 2
"""The protocol Spark gives bronze (writer version 2: NOT NULL invariants, no table features);
delta-rs writes it. A table upgraded beyond it is left to Spark."""


class BatchWriter(Protocol):
    name: str

    def write(self, batch: SealedBatch) -> None:
        """Commit ``batch`` once: a batch already committed is skipped."""


class SparkWriter:
    name = "spark"

    def __init__(self, spark: SparkSession, table: str, source: str) -> None:
        self.spark, self.table, self.source = spark, table, source

    def write(self, batch: SealedBatch) -> None:
        write_batch(batch.to_dataframe(self.spark), self.table, self.source, batch.batch_id)


class DeltaRsWriter:
    name = "delta-rs"

    def __init__(self, path: str, source: str) -> None:
        self.path = path
        self.table = DeltaTable(path)
        self.app = app_id(source)

    def committed(self, batch_id: int) -> bool:
        self.table.update_incremental()
        version = self.table.transaction_version(self.app)
        return version is not None and version >= batch_id

    def commit_files(self, files: Sequence[DataFile], batch_id: int) -> bool:
        """Commit Parquet files already written into the table's directory (a snapshot's, by
        :func:`write_data_file` in its Spark tasks) as one commit of batch ``batch_id``.
        Returns False if that batch was committed before (the files are then left unused)."""
        if self.committed(batch_id):
            log.info("bronze batch %d was committed before: skipped", batch_id)
            return False
        now = int(time.time() * 1000)
        actions = [AddAction(f.path, f.size, {}, now, True, f.stats) for f in files]
        try:
            self.table.create_write_transaction(
                actions,
                mode="append",
                schema=self.table.schema(),
                commit_properties=CommitProperties(
                    app_transactions=[Transaction(self.app, batch_id)]
                ),
            )
        except CommitFailedError:
            if self.committed(batch_id):
                return False
            raise
        return True

    def write(self, batch: SealedBatch) -> None:
        if self.committed(batch.batch_id):
            log.info("bronze batch %d was committed before: skipped", batch.batch_id)
            return
        try:
            write_deltalake(
                self.table,
                batch.to_arrow(),
                mode="append",
                commit_properties=CommitProperties(
                    app_transactions=[Transaction(self.app, batch.batch_id)]
                ),
            )
        except CommitFailedError:
            if self.committed(batch.batch_id):  # another writer of the same batch won
                return
            raise


def local_table_path(spark: SparkSession, table: str) -> str | None:
    """The local directory of Delta table ``table``, or None if it is not on this file system."""
    location = spark.sql(f"DESCRIBE DETAIL {table}").first()["location"]
    url = urlparse(location or "")
    if url.scheme not in ("file", ""):
        return None
    path = unquote(url.path)
    return path if (Path(path) / "_delta_log").is_dir() else None


def batch_writer(spark: SparkSession, table: str, source: str) -> BatchWriter:
    """The writer for ``table``'s stream batches (see the module docstring)."""
    choice = os.environ.get(WRITER_ENV, "auto")
    if choice not in ("auto", "delta-rs", "spark"):
        raise ValueError(f"{WRITER_ENV} must be auto, delta-rs or spark, not {choice!r}")
    if choice == "spark" or (choice == "auto" and on_databricks()):
        return SparkWriter(spark, table, source)
    path, reason = _delta_rs_target(spark, table)
    if path is not None:
        return DeltaRsWriter(path, source)
    if choice == "delta-rs":
        raise ValueError(f"{WRITER_ENV}=delta-rs, but {reason}")
    log.info("bronze batches are committed through Spark: %s", reason)
    return SparkWriter(spark, table, source)


def _delta_rs_target(spark: SparkSession, table: str) -> tuple[str | None, str]:
    """``(path, "")`` when delta-rs can write ``table`` at ``path``, else ``(None, why not)``."""
    if DeltaTable is None:
        return None, "the deltalake package is not installed"
    path = local_table_path(spark, table)
    if path is None:
        return None, f"{table} is not a directory of the local file system"
    protocol = DeltaTable(path).protocol()
    if protocol.min_writer_version > _MAX_WRITER_VERSION or protocol.writer_features:
        return None, f"{table} has writer protocol {protocol.min_writer_version}"
    return path, ""


@dataclass(frozen=True)
class DataFile:
    """A Parquet file written into a Delta table's directory, not yet committed."""

    path: str
    """Relative to the table's directory."""
    size: int
    stats: str
    """Delta's JSON statistics (``numRecords``, and min, max and null count of the columns in
    ``delta.dataSkippingStatsColumns``)."""


_STATS_COLUMNS = STATS_COLUMNS.split(",")


def write_data_file(table_dir: str, batches: Iterable[pa.RecordBatch]) -> DataFile | None:
    """Write ``batches`` (in :data:`~bronze.table.ARROW_SCHEMA`) as one Parquet file of the
    Delta table at ``table_dir``, with the statistics Delta keeps for bronze; None if there were
    no rows. Files a crash leaves uncommitted are never read (``VACUUM`` removes them)."""
    name = f"part-{uuid.uuid4()}-c000.snappy.parquet"
    path = os.path.join(table_dir, name)
    rows = 0
    low: dict[str, object] = {}
    high: dict[str, object] = {}
    nulls = dict.fromkeys(_STATS_COLUMNS, 0)
    writer = None
    try:
        for batch in batches:
            if not batch.num_rows:
                continue
            if writer is None:
                writer = pq.ParquetWriter(path, ARROW_SCHEMA, compression="snappy")
            writer.write_batch(batch)
            rows += batch.num_rows
            for column in _STATS_COLUMNS:
                values = batch.column(column)
                nulls[column] += values.null_count
                if values.null_count == len(values):
                    continue
                bounds = pc.min_max(values).as_py()
                if column not in low or bounds["min"] < low[column]:
                    low[column] = bounds["min"]
                if column not in high or bounds["max"] > high[column]:
                    high[column] = bounds["max"]
    finally:
        if writer is not None:
            writer.close()
    if writer is None:
        return None
    stats = {"numRecords": rows, "minValues": low, "maxValues": high, "nullCount": nulls}
    return DataFile(name, os.path.getsize(path), json.dumps(stats))
