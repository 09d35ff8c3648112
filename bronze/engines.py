"""Which implementation of bronze a process uses (``[lakehouse] engine``, the table's protocol,
where it lives): :func:`open_bronze`.

``store`` (the interface and the delta-rs implementation) and ``spark_table`` (the Spark one)
do not import each other; this module knows both, and imports the Spark one only when it is
chosen.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa

from pgmedallion.bronze.store import Bronze, DeltaRsBronze
from pgmedallion.core.config import ENGINES, on_databricks
from pgmedallion.core.engine import current

if TYPE_CHECKING:  # only the Spark implementation needs pyspark
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

_MAX_WRITER_VERSION = 2
"""The protocol Spark gives bronze (writer version 2: NOT NULL invariants, no table features);
delta-rs writes it. A table upgraded beyond it is left to Spark."""


def writer_choice(choice: str | None = None) -> str:
    """``choice`` (default: the process's ``[lakehouse] engine``), checked."""
    choice = current().engine if choice is None else choice
    if choice not in ENGINES:
        raise ValueError(f"[lakehouse] engine must be auto, delta-rs or spark, not {choice!r}")
    return choice


def delta_rs_unusable(path: str | None) -> str | None:
    """Why delta-rs cannot write bronze at ``path`` (None: it can)."""
    try:
        from deltalake import DeltaTable
    except ImportError:
        return "the deltalake package is not installed"
    if path is None:
        return "bronze is not a directory of the local file system"
    if not (Path(path) / "_delta_log").is_dir():
        return None  # created by delta-rs, with the protocol it writes
    protocol = DeltaTable(path).protocol()
    if protocol.min_writer_version > _MAX_WRITER_VERSION or protocol.writer_features:
        return f"bronze at {path} has writer protocol {protocol.min_writer_version}"
    return None


def open_bronze(
    table: str,
    source: str,
    *,
    path: str | None = None,
    spark: SparkSession | None = None,
    engine: str | None = None,
) -> Bronze:
    """Bronze for capture: delta-rs where it can write (see the module docstring), else Spark.

    ``path``: bronze's local directory when the caller knows it without Spark (the configured
    state directory's warehouse); with ``spark``, the table is created through the catalog if
    it does not exist and its location asked of Spark. Without ``spark`` nothing here starts a
    JVM, and bronze must be a local directory. ``engine``: ``[lakehouse] engine`` (default:
    the process's, ``pgmedallion.core.engine``).
    """
    choice = writer_choice(engine)
    if choice == "spark" or (choice == "auto" and on_databricks()):
        return _spark_bronze(spark, table, source, path)
    if spark is not None:
        from pgmedallion.bronze.spark_table import ensure_bronze_table, local_table_path

        ensure_bronze_table(spark, table, path)
        path = local_table_path(spark, table, path)
    reason = delta_rs_unusable(path)
    if reason is None:
        if spark is None:
            # A capture process of its own: Arrow's default allocator (mimalloc) kept about
            # 25 MB more resident than the system's through a stream of 8 MiB batches.
            pa.set_memory_pool(pa.system_memory_pool())
        return DeltaRsBronze(str(path), table, source)
    if choice == "delta-rs":
        raise ValueError(f"[lakehouse] engine is delta-rs, but {reason}")
    log.info("bronze is committed through Spark: %s", reason)
    return _spark_bronze(spark, table, source, path)


def _spark_bronze(spark: SparkSession | None, table: str, source: str, path: str | None) -> Bronze:
    if spark is None:
        raise ValueError(f"bronze table {table} is committed through Spark here: start a session")
    from pgmedallion.bronze.spark_table import SparkBronze, ensure_bronze_table

    ensure_bronze_table(spark, table, path)
    return SparkBronze(spark, table, source)
