"""What a capture run is given and what it returns: the target, the options, the results.

``CaptureTarget`` names the source and its bronze table; ``CaptureOptions`` says how one run
goes (every attempt of it the same); ``StreamLimits`` when the stream commits a batch;
``RetryPolicy`` how transient errors are retried. The sizes below are measured choices (see
benchmarks/RESULTS.md).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pgmedallion.bronze.engines import delta_rs_unusable, open_bronze, writer_choice
from pgmedallion.bronze.store import Bronze
from pgmedallion.capture.progress import (
    ProgressCallback,
)
from pgmedallion.capture.schema_changes import FOLLOW
from pgmedallion.core.config import Config, on_databricks

if TYPE_CHECKING:  # a capture without Spark never imports it
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)


COPY_CHUNK_BYTES = 1 << 20
"""Raw COPY bytes per bronze ``copy`` record (a record holds whole rows, so it can be larger)."""
ARROW_BATCH_BYTES = 16 << 20
IDLE_COMMIT_BYTES = 16 << 20
"""One WAL segment: what a slot may hold back at most because no change of ours came."""
STREAM_BATCH_MESSAGES = 500_000
STREAM_BATCH_BYTES = 48 << 20
"""Payload bytes per stream batch committed through Spark. Two batches live at once (one
committing, one filling): through a 1M-row transaction the capture's peak RSS was 530 MB at
64 MiB, 385 MB at 48 MiB and 334 MB at 32 MiB; a Spark commit costs about the same at any of
these sizes, so smaller batches slow the stream (1M messages: 3 commits, ratio 0.22; 5 commits
at 32 MiB, 0.17)."""
DELTA_RS_BATCH_MESSAGES = 100_000
DELTA_RS_BATCH_BYTES = 8 << 20
"""The same through delta-rs, whose commit costs tens of milliseconds: small batches cost the
stream little and keep the capture's memory low (see benchmarks/RESULTS.md, session 12)."""


@dataclass(frozen=True)
class CaptureTarget:
    conninfo: Mapping[str, Any]
    source: str
    publication: str
    slot: str
    bronze: str
    """The bronze table's qualified name."""
    bronze_path: str | None = None
    """Its local directory, when known without Spark (see :func:`bronze.store.open_bronze`)."""
    pii: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    """``schema.table`` -> column -> ``exclude`` | ``hash`` (``pgmedallion.capture.published``)."""
    hash_key: bytes | None = field(default=None, repr=False)
    """The key of hashed columns (a secret: never in a message or ``repr``)."""
    engine: str = "auto"
    """``[lakehouse] engine``: who commits bronze (``pgmedallion.core.engine``)."""
    schema_changes: Mapping[str, str] = field(default_factory=dict)
    """``schema.table`` -> its ``on_schema_change`` where not ``follow``
    (``pgmedallion.capture.schema_changes``)."""

    snapshot_wait_s: float | None = 300.0
    """How long a snapshot waits for open transactions before leaving its tables to the next
    run (None: as long as they take)."""

    failover_slot: str = "auto"
    """``[source] failover_slot``: ``auto`` | ``on`` | ``off`` (``capture.slot.wants_failover``)."""

    snapshot_range_bytes: int = 32 << 20
    """``[source] snapshot_range_mb``: a keyed table's snapshot is read in key ranges of about
    this much heap, each landed on its own, once the table holds two (``capture.ranges``)."""

    ranges_per_commit: int = 0
    """``[source] snapshot_ranges_per_commit`` (0: ``Bronze.ranges_per_commit``)."""

    def on_schema_change(self, table: str) -> str:
        return self.schema_changes.get(table, FOLLOW)


def capture_target(cfg: Config) -> CaptureTarget:
    """The configured source's capture target (its column policies and hash key included)."""
    pii = {table: policy.pii() for table, policy in cfg.tables.items() if policy.pii()}
    schema_changes = {
        table: policy.on_schema_change
        for table, policy in cfg.tables.items()
        if policy.on_schema_change != FOLLOW
    }
    hashed = any("hash" in columns.values() for columns in pii.values())
    return CaptureTarget(
        cfg.source.conninfo(),
        source=cfg.source.name,
        publication=cfg.source.publication,
        slot=cfg.source.slot,
        bronze=cfg.qualified("bronze", "bronze"),
        bronze_path=cfg.local_table_path("bronze", "bronze"),
        pii=pii,
        hash_key=cfg.source.hash_key() if hashed else None,
        engine=cfg.lakehouse.engine,
        schema_changes=schema_changes,
        snapshot_wait_s=cfg.source.snapshot_wait_seconds or None,
        failover_slot=cfg.source.failover_slot,
        snapshot_range_bytes=int(cfg.source.snapshot_range_mb * (1 << 20)),
        ranges_per_commit=max(0, int(cfg.source.snapshot_ranges_per_commit)),
    )


def capture_needs_spark(cfg: Config) -> bool:
    """Whether capture commits bronze through Spark here (see ``bronze.store``); locally,
    with the ``local`` extra, it runs without a JVM (and without PySpark installed)."""
    if on_databricks() or writer_choice(cfg.lakehouse.engine) == "spark":
        return True
    return delta_rs_unusable(cfg.local_table_path("bronze", "bronze")) is not None


def bronze_of(spark: SparkSession | Bronze | None, target: CaptureTarget) -> Bronze:
    """``target``'s bronze: given, or opened with ``spark`` (None: without Spark, by delta-rs)."""
    if isinstance(spark, Bronze):
        return spark
    return open_bronze(
        target.bronze, target.source, path=target.bronze_path, spark=spark, engine=target.engine
    )


@dataclass(frozen=True)
class StreamLimits:
    """When the stream commits a batch."""

    batch_messages: int | None = None
    """Messages per batch; None: the writer's (``STREAM_BATCH_*`` for Spark, ``DELTA_RS_*``)."""
    batch_bytes: int | None = None
    """Payload bytes per batch; None: the writer's."""
    commit_interval_s: float = 10.0
    """Continuous mode: commit what arrived at least this often."""
    idle_commit_interval_s: float = 60.0
    """Continuous mode: commit a frontier moved only by keepalives at least this often."""
    idle_commit_bytes: int = IDLE_COMMIT_BYTES
    """Triggered: a frontier moved only by WAL the publication does not carry (other tables,
    other databases, checkpoints) is committed and acknowledged once it moved this far since
    bronze's frontier; less is left for a later run, so a run with nothing new lands nothing
    and costs no Spark (``pgmedallion.current``). 0: always (``verify`` needs bronze past its
    snapshot)."""
    publication_check_interval_s: float = 10.0
    """Continuous mode: look for a dropped publication or newly published tables."""


@dataclass(frozen=True)
class RetryPolicy:
    """Transient errors: ``attempts`` tries in a row without progress, exponential backoff."""

    attempts: int = 5
    initial_delay_s: float = 1.0
    max_delay_s: float = 60.0

    def delay_s(self, failures: int) -> float:
        """The wait after the ``failures``-th failure in a row (1, 2, 4, ... seconds, capped)."""
        return min(self.max_delay_s, self.initial_delay_s * 2 ** max(0, failures - 1))


@dataclass(frozen=True)
class CaptureResult:
    snapshotted: dict[str, int]
    """``schema.table`` -> rows landed, for the tables snapshotted by this run."""
    snapshot_lsn: int | None
    messages: int
    frontier: int
    batches: int
    table_errors: dict[str, str] = field(default_factory=dict)
    """``schema.table`` -> the definite error recorded for it by this run (e.g. dropped)."""
    retries: int = 0
    deferred: list[str] = field(default_factory=list)
    """``schema.table`` of the tables whose snapshot waited too long on open transactions and
    is left to the next run."""
    bronze: Bronze | None = field(default=None, compare=False, repr=False)
    """The bronze this capture read and wrote: what it read of bronze's records since its last
    commit answers later questions without reading them again (:func:`bronze_of`)."""

    def then(self, more: CaptureResult) -> CaptureResult:
        """This capture followed by ``more`` (a later one of the same run)."""
        return CaptureResult(
            snapshotted={**self.snapshotted, **more.snapshotted},
            snapshot_lsn=more.snapshot_lsn or self.snapshot_lsn,
            messages=self.messages + more.messages,
            frontier=more.frontier or self.frontier,
            batches=self.batches + more.batches,
            table_errors={**self.table_errors, **more.table_errors},
            retries=self.retries + more.retries,
            deferred=sorted(set(self.deferred) | set(more.deferred)),
            bronze=more.bronze or self.bronze,
        )


@dataclass(frozen=True)
class SnapshotLanded:
    """What :func:`land_snapshot` landed; unpacks as ``snapshot_lsn, counts``."""

    snapshot_lsn: int
    counts: dict[str, int]
    dropped: dict[str, str] = field(default_factory=dict)
    """``schema.table`` -> message, for the tables skipped because they were dropped."""

    def __iter__(self) -> Iterator[Any]:
        return iter((self.snapshot_lsn, self.counts))


@dataclass
class StreamResult:
    messages: int = 0
    frontier: int | None = None
    batches: int = 0
    new_tables: bool = False
    """Continuous mode ended the stream because new tables were published."""
    commit_s: float = 0.0
    """Seconds spent in bronze commits (in the background, while reading went on)."""
    wait_s: float = 0.0
    """Seconds the reader waited for a commit (its slack: commit_s - wait_s overlapped)."""
    writer: str = ""
    """Which writer committed the batches: ``delta-rs`` or ``spark`` (see bronze/writer.py)."""


@dataclass(frozen=True)
class CaptureOptions:
    """How one capture run goes; the same for every attempt of the run."""

    workers: int = 2
    """Parallel COPY ranges per table snapshot."""
    tables: Sequence[str] | None = None
    """``schema.table`` names to capture; None: every table of the publication."""
    continuous: bool = False
    """Stream until stopped (``stop``, ``max_seconds``, a signal) instead of catching up once."""
    max_seconds: float | None = None
    retry: RetryPolicy = RetryPolicy()
    limits: StreamLimits = StreamLimits()
    handle_signals: bool = True
    """In the main thread, SIGINT/SIGTERM commit the batch in hand, then stop."""
    progress: ProgressCallback | None = None
    """Receives per-table snapshot progress."""
    stop: threading.Event | None = field(default=None, compare=False)
    """Set it (from another thread) to end the run after committing what was read."""
