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
read every table the delta-rs writer produced), and snapshots and error records are still
committed through Spark. The two writers never commit at the same time: a capture attempt
commits its snapshot before it streams, and one stream batch at a time.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Protocol
from urllib.parse import unquote, urlparse

from pyspark.sql import SparkSession

try:  # in the `local` extra: a Databricks cluster commits bronze through Spark
    from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
    from deltalake.exceptions import CommitFailedError
except ImportError:
    DeltaTable = None

from bronze.table import SealedBatch, app_id, write_batch
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
        self.table = DeltaTable(path)
        self.app = app_id(source)

    def committed(self, batch_id: int) -> bool:
        self.table.update_incremental()
        version = self.table.transaction_version(self.app)
        return version is not None and version >= batch_id

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
    reason = _delta_rs_refusal(spark, table)
    if reason is None:
        return DeltaRsWriter(local_table_path(spark, table), source)
    if choice == "delta-rs":
        raise ValueError(f"{WRITER_ENV}=delta-rs, but {reason}")
    log.info("bronze batches are committed through Spark: %s", reason)
    return SparkWriter(spark, table, source)


def _delta_rs_refusal(spark: SparkSession, table: str) -> str | None:
    if DeltaTable is None:
        return "the deltalake package is not installed"
    path = local_table_path(spark, table)
    if path is None:
        return f"{table} is not a directory of the local file system"
    protocol = DeltaTable(path).protocol()
    if protocol.min_writer_version > _MAX_WRITER_VERSION or protocol.writer_features:
        return f"{table} has writer protocol {protocol.min_writer_version}"
    return None
