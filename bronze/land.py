"""Landing capture output in bronze: the snapshot as one Spark job, the stream in batches.

::

    ensure slot ──> tables without a complete snapshot? ──> land_snapshot (one commit)
                                                                  │
    resume = bronze frontier (or the slot's confirmed_flush) ─────┴──> land_stream
        read_until(pg_current_wal_lsn() at start) ─> buffer ─> commit batch ─> ack(frontier)

Snapshot. The driver holds the exported snapshot's transaction open while a Spark job runs one
task per ctid range; every task imports the snapshot and streams its COPY rows straight into
Arrow batches, so the COPY work runs in parallel Python worker processes, not threads. The copy
rows, one ``schema`` record and one ``rewind`` record per table are a single Delta commit: a
table's snapshot is in bronze whole or not at all, and a crash before the commit simply means
the next run snapshots again at a new LSN (rewinds make any snapshot LSN correct).

Stream. The main slot exists before any snapshot is taken, so the stream always starts at or
before every snapshot LSN, which is what rewinds need. A batch is committed when it holds
enough messages or bytes, or when the target is reached; its ``progress`` record carries the
frontier F (every transaction committing below F is in bronze), and only after the commit is F
acknowledged to the slot. Partial transactions may be committed to bound memory; silver only
reads transactions below the frontier and deduplicates re-sent messages by (lsn, ordinal).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql import SparkSession

from bronze.table import (
    ARROW_SCHEMA,
    RecordBuffer,
    bronze_frontier,
    ensure_bronze_table,
    json_payload,
    next_batch_id,
    snapshotted_tables,
    write_batch,
)
from capture.connection import connect, connect_replication
from capture.replication import Keepalive, ReplicationStream, start_replication
from capture.slot import check_resume_point, current_wal_lsn, ensure_slot, release_slot
from capture.snapshot import (
    TableSchema,
    copy_range,
    estimate_table_block_counts,
    exported_snapshot,
    publication_tables,
    table_schema_at_snapshot,
    use_snapshot,
    worker_ctid_ranges,
)
from pgmedallion.pgoutput import format_lsn

log = logging.getLogger(__name__)

ROWS_PER_ARROW_BATCH = 50_000
STREAM_BATCH_MESSAGES = 200_000
STREAM_BATCH_BYTES = 128 << 20


@dataclass(frozen=True)
class CaptureTarget:
    conninfo: Mapping[str, Any]
    source: str
    publication: str
    slot: str
    bronze: str
    """The bronze table's qualified name."""


@dataclass(frozen=True)
class CaptureResult:
    snapshotted: dict[str, int]
    """``schema.table`` -> rows landed, for the tables snapshotted by this run."""
    snapshot_lsn: int | None
    messages: int
    frontier: int
    batches: int


def _copy_task_rows(
    tasks: Iterator[pa.RecordBatch],
    conninfo: Mapping[str, Any],
    snapshot_name: str,
    source: str,
    run_id: str,
    snapshot_lsn: int,
    batch_id: int,
) -> Iterator[pa.RecordBatch]:
    """Spark task body: COPY each assigned ctid range and emit bronze ``copy`` rows."""
    for task_batch in tasks:
        for task in task_batch.to_pylist():
            buffer = RecordBuffer(source, run_id)
            rows = copy_range(
                conninfo,
                snapshot_name,
                (task["schema"], task["name"]),
                task["columns"],
                (task["start"], task["end"]),
            )
            for ordinal, row in enumerate(rows):
                buffer.add(
                    "copy",
                    snapshot_lsn,
                    table_oid=task["oid"],
                    table_schema=task["schema"],
                    table_name=task["name"],
                    ordinal=ordinal,
                    part=task["part"],
                    payload=row,
                )
                if len(buffer) >= ROWS_PER_ARROW_BATCH:
                    yield from buffer.to_arrow(batch_id).to_batches()
                    buffer.clear()
            if len(buffer):
                yield from buffer.to_arrow(batch_id).to_batches()


def land_snapshot(
    spark: SparkSession, target: CaptureTarget, oids: list[int], *, workers: int, run_id: str
) -> tuple[int, dict[str, int]]:
    """Snapshot ``oids`` at one exported snapshot into bronze as one commit.

    Returns the snapshot LSN and the rows landed per table.
    """
    temp_slot = f"pgm_snap_{uuid.uuid4().hex[:16]}"
    with exported_snapshot(target.conninfo, temp_slot) as point:
        conn = connect(target.conninfo)
        try:
            use_snapshot(conn, point.snapshot_name)
            schemas = [table_schema_at_snapshot(conn, oid) for oid in oids]
            blocks = estimate_table_block_counts(conn, oids)
            version = conn.info.server_version
            conn.execute("COMMIT")
        finally:
            conn.close()
        tasks = []
        for schema in schemas:
            for part, (start, end) in enumerate(
                worker_ctid_ranges(blocks[schema.oid], workers, version)
            ):
                tasks.append(
                    {
                        "oid": schema.oid,
                        "schema": schema.schema,
                        "name": schema.name,
                        "columns": [c.name for c in schema.columns if not c.generated],
                        "part": part,
                        "start": start,
                        "end": end,
                    }
                )
        batch_id = next_batch_id(spark, target.bronze, target.source)
        meta = RecordBuffer(target.source, run_id)
        for schema in schemas:
            _add_snapshot_records(meta, schema, point.snapshot_lsn)
        conninfo, name, source = dict(target.conninfo), point.snapshot_name, target.source
        lsn = point.snapshot_lsn
        task_df = spark.createDataFrame(
            tasks,
            "oid long, schema string, name string, columns array<string>, part int, "
            "start long, end long",
        ).repartition(max(1, len(tasks)))
        copy_df = task_df.mapInArrow(
            lambda it: _copy_task_rows(it, conninfo, name, source, run_id, lsn, batch_id),
            spark.createDataFrame([], _spark_schema(spark)).schema,
        )
        meta_df = spark.createDataFrame(meta.to_arrow(batch_id))
        write_batch(copy_df.unionByName(meta_df), target.bronze, target.source, batch_id)
    counts = {
        f"{r['table_schema']}.{r['table_name']}": r["n"]
        for r in spark.table(target.bronze)
        .where(f"batch_id = {batch_id} AND kind = 'copy' AND source = '{source}'")
        .groupBy("table_schema", "table_name")
        .count()
        .withColumnRenamed("count", "n")
        .collect()
    }
    for schema in schemas:
        counts.setdefault(f"{schema.schema}.{schema.name}", 0)
    return point.snapshot_lsn, counts


def _spark_schema(spark: SparkSession):
    return spark.createDataFrame(ARROW_SCHEMA.empty_table()).schema


def _add_snapshot_records(buffer: RecordBuffer, schema: TableSchema, snapshot_lsn: int) -> None:
    ident = dict(table_oid=schema.oid, table_schema=schema.schema, table_name=schema.name)
    buffer.add("schema", snapshot_lsn, payload=json_payload(schema), **ident)
    buffer.add("rewind", snapshot_lsn, **ident)


def land_stream(
    spark: SparkSession, target: CaptureTarget, *, run_id: str, continuous: bool = False
) -> tuple[int, int, int]:
    """Stream the slot into bronze until caught up with the WAL position seen at the start.

    Returns (messages landed, the final frontier, batches committed).
    """
    repl = connect_replication(target.conninfo)
    try:
        state = release_slot(repl, target.slot)
        frontier = bronze_frontier(spark, target.bronze, target.source)
        resume = frontier if frontier is not None else state.confirmed_flush_lsn or 0
        check_resume_point(state, resume)
        stop_at = current_wal_lsn(repl)
        log.info(
            "streaming slot %s from %s to %s", target.slot, format_lsn(resume), format_lsn(stop_at)
        )
        stream: ReplicationStream = start_replication(repl, target.slot, target.publication, resume)
        buffer = RecordBuffer(target.source, run_id)
        batch_id = next_batch_id(spark, target.bronze, target.source)
        messages = batches = 0
        committed = resume

        def commit(frontier_lsn: int) -> None:
            nonlocal batch_id, batches, committed
            buffer.add("progress", frontier_lsn)
            write_batch(
                spark.createDataFrame(buffer.to_arrow(batch_id)),
                target.bronze,
                target.source,
                batch_id,
            )
            stream.ack(frontier_lsn)
            committed = frontier_lsn
            batch_id += 1
            batches += 1
            buffer.clear()

        while True:
            for event in stream.read_until(stop_at):
                if isinstance(event, Keepalive):
                    continue
                buffer.add(
                    "wal",
                    event.commit_lsn,
                    table_oid=None,
                    end_lsn=event.end_lsn,
                    xid=event.xid,
                    ordinal=event.ordinal,
                    payload=event.payload,
                )
                messages += 1
                if (
                    len(buffer) >= STREAM_BATCH_MESSAGES
                    or buffer.payload_bytes >= STREAM_BATCH_BYTES
                ):
                    commit(committed if stream.in_transaction else stream.position)
            if stream.position > committed or len(buffer):
                commit(max(committed, stream.position))
            if not continuous:
                break
            stop_at = current_wal_lsn(connect(target.conninfo))
        stream.close()
        return messages, committed, batches
    finally:
        repl.close()


def capture_once(
    spark: SparkSession,
    target: CaptureTarget,
    *,
    workers: int = 2,
    tables: list[str] | None = None,
) -> CaptureResult:
    """One triggered capture run: provision the slot, snapshot new tables, stream to caught up."""
    run_id = uuid.uuid4().hex
    ensure_bronze_table(spark, target.bronze)
    repl = connect_replication(target.conninfo)
    try:
        ensure_slot(repl, target.slot)
    finally:
        repl.close()
    conn = connect(target.conninfo)
    try:
        published = publication_tables(conn, target.publication)
    finally:
        conn.close()
    if tables:
        wanted = set(tables)
        published = [t for t in published if f"{t.schema}.{t.name}" in wanted]
    done = snapshotted_tables(spark, target.bronze, target.source)
    pending = [t.oid for t in published if t.oid not in done]
    snapshot_lsn, counts = None, {}
    if pending:
        snapshot_lsn, counts = land_snapshot(spark, target, pending, workers=workers, run_id=run_id)
    messages, frontier, batches = land_stream(spark, target, run_id=run_id)
    return CaptureResult(counts, snapshot_lsn, messages, frontier, batches)
