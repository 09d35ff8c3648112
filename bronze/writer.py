"""Idempotent Delta commits of bronze batches, by delta-rs; Parquet files for a snapshot.

Every batch is one commit carrying the Delta transaction ``(txnAppId = pgmedallion-<source>,
txnVersion = batch_id)``; a batch whose version the table already records is skipped, so a
commit retried after a crash never lands twice.

``DeltaRsWriter`` (the ``deltalake`` package, delta-rs) appends an Arrow table straight from
the capture process, with the transaction in the same commit (``CommitProperties
(app_transactions=...)``). It first reads the application's transaction version from the
newest log (``update_incremental``) and skips a batch already there: delta-rs itself would
accept a repeated version. A commit that loses a race is checked the same way. A commit costs
tens of milliseconds (a 340,000-message batch 0.1 s) against 2-5 s through Spark. delta-rs
writes a local directory with the same atomic put-if-absent of the log entry as Spark.

Spark's writer (``pgmedallion.bronze.spark_table.SparkWriter``, the same contract through
``DataFrameWriter``'s ``txnAppId``/``txnVersion``) commits where delta-rs cannot:
:mod:`pgmedallion.bronze.store` says where each runs. The table stays an ordinary Delta table: Spark
reads what either writer committed (the tests read every table delta-rs wrote).

A snapshot's ranges are written as Parquet files into the table's directory
(:func:`write_data_file`, with the statistics Delta keeps for bronze) and committed together
(:meth:`DeltaRsWriter.commit_files`).
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

try:  # in the `local` extra: a Databricks cluster commits bronze through Spark
    from deltalake import CommitProperties, DeltaTable, Transaction
    from deltalake.exceptions import CommitFailedError
    from deltalake.transaction import AddAction
except ImportError:
    DeltaTable = None

from pgmedallion.bronze.table import ARROW_SCHEMA, STATS_COLUMNS, SealedBatch

log = logging.getLogger(__name__)


class BatchWriter(Protocol):
    name: str

    def write(self, batch: SealedBatch) -> None:
        """Commit ``batch`` once: a batch already committed is skipped."""


class DeltaRsWriter:
    """Idempotent appends to the Delta table at ``path`` as transaction ``app``."""

    name = "delta-rs"

    def __init__(self, path: str, app: str) -> None:
        self.path = path
        self.table = DeltaTable(path)
        self.app = app

    def committed(self, batch_id: int) -> bool:
        self.table.update_incremental()
        version = self.table.transaction_version(self.app)
        return version is not None and version >= batch_id

    def commit_files(
        self, files: Sequence[DataFile], batch_id: int, *, checked: bool = False
    ) -> bool:
        """Commit Parquet files already written into the table's directory (a snapshot's, by
        :func:`write_data_file`) as one commit of batch ``batch_id``. Returns False if that
        batch was committed before (the files are then left unused)."""
        if not checked and self.committed(batch_id):
            log.info("bronze batch %d was committed before: skipped", batch_id)
            return False
        now = int(time.time() * 1000)
        actions = [AddAction(f.path, f.size, {}, now, True, f.stats) for f in files]
        try:
            self.table.create_write_transaction(
                actions,
                mode="append",
                schema=self.table.schema(),
                commit_properties=self._transaction(batch_id),
            )
        except CommitFailedError:
            if self.committed(batch_id):
                return False
            raise
        return True

    def append(self, records: pa.Table, batch_id: int) -> bool:
        """Commit ``records`` as batch ``batch_id``; False if it was committed before."""
        return self._commit(records.to_batches(), batch_id)

    def write(self, batch: SealedBatch) -> None:
        # The wal messages and the batch's progress record go into separate row groups, so
        # that a reader of the control records skips the messages by their statistics.
        parts = [batch.wal_arrow()]
        if batch.others is not None:
            parts.append(batch.others)
        self._commit([b for part in parts for b in part.to_batches()], batch.batch_id)

    def _commit(self, batches: Sequence[pa.RecordBatch], batch_id: int) -> bool:
        # The Parquet file is written here and committed by delta-rs' transaction API: the
        # same file and log entry as ``write_deltalake``, without loading its query engine.
        if self.committed(batch_id):
            log.info("bronze batch %d was committed before: skipped", batch_id)
            return False
        written = write_data_file(self.path, batches)
        files = [written] if written is not None else []
        return self.commit_files(files, batch_id, checked=True)  # checked just above

    def _transaction(self, batch_id: int) -> CommitProperties:
        return CommitProperties(app_transactions=[Transaction(self.app, batch_id)])


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


PARQUET_OPTIONS = {
    "compression": "snappy",
    # Dictionaries and statistics only where they serve: a payload column tried as a
    # dictionary (then given up) and min/max over megabyte payloads cost every write.
    "use_dictionary": ["source", "kind", "table_schema", "table_name", "run_id"],
    "write_statistics": _STATS_COLUMNS,
}


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
                writer = pq.ParquetWriter(path, ARROW_SCHEMA, **PARQUET_OPTIONS)
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
