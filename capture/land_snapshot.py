"""A snapshot landed in bronze: every wanted table at one exported snapshot, in one commit.

The leader holds the exported snapshot's transaction open (and ``ACCESS SHARE`` on every table,
as ``pg_dump`` does) while one task per ctid range imports the snapshot and streams its COPY
rows into Arrow batches: a thread each where delta-rs writes bronze, a Spark task each where
Spark does (``bronze.store``). The copy rows, one ``schema`` and one ``rewind`` record per table
are one Delta commit: a table's snapshot is in bronze whole or not at all.
"""

from __future__ import annotations

import functools
import logging
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import nullcontext
from typing import Any

import pyarrow as pa

from pgmedallion.bronze.store import Bronze
from pgmedallion.bronze.table import (
    RecordBuffer,
    json_payload,
)
from pgmedallion.capture.connection import connect
from pgmedallion.capture.error_records import record_error, table_name
from pgmedallion.capture.errors import (
    TableDropped,
    server_errors,
)
from pgmedallion.capture.options import (
    ARROW_BATCH_BYTES,
    COPY_CHUNK_BYTES,
    CaptureTarget,
    SnapshotLanded,
)
from pgmedallion.capture.progress import (
    CopyProgressMonitor,
    ProgressCallback,
    TableProgress,
    copy_application_name,
    estimate_rows,
    table_sizes,
)
from pgmedallion.capture.published import EVERYTHING, Shape, hash_copy_lines, published
from pgmedallion.capture.snapshot import (
    PublishedTable,
    TableSchema,
    copy_columns,
    copy_range_chunks,
    estimate_table_block_counts,
    exported_snapshot,
    lock_for_snapshot,
    publishes_stored_generated,
    shaped,
    table_schema_at_snapshot,
    use_snapshot,
    worker_ctid_ranges,
)
from pgmedallion.core.failpoints import failpoint

log = logging.getLogger(__name__)


def _copy_task_rows(
    ids: Iterator[pa.RecordBatch],
    tasks: Sequence[Mapping[str, Any]],
    conninfo: Mapping[str, Any],
    snapshot_name: str,
    source: str,
    run_id: str,
    snapshot_lsn: int,
    batch_id: int,
    hash_key: bytes | None = None,
) -> Iterator[pa.RecordBatch]:
    """Spark task body: COPY each assigned ctid range into bronze ``copy`` records, a chunk of
    raw COPY TEXT lines each (``ordinal``: the range's row count up to and including it), the
    publication's row filter applied and hashed columns hashed before anything is kept."""
    for id_batch in ids:
        for task in (tasks[i] for i in id_batch.column("id").to_pylist()):
            buffer = RecordBuffer(source, run_id)
            session = dict(conninfo)
            session["application_name"] = copy_application_name(run_id, task["oid"], task["part"])
            chunks = copy_range_chunks(
                session,
                snapshot_name,
                (task["schema"], task["name"]),
                task["columns"],
                (task["start"], task["end"]),
                COPY_CHUNK_BYTES,
                task["row_filter"],
            )
            rows = 0
            for count, chunk in chunks:
                failpoint("snapshot.copy_chunk")
                if task["hashed"]:
                    chunk = hash_copy_lines(chunk, task["hashed"], hash_key)
                rows += count
                buffer.add(
                    "copy",
                    snapshot_lsn,
                    table_oid=task["oid"],
                    table_schema=task["schema"],
                    table_name=task["name"],
                    ordinal=rows,
                    part=task["part"],
                    payload=chunk,
                )
                if buffer.payload_bytes >= ARROW_BATCH_BYTES:
                    yield from buffer.to_arrow(batch_id).to_batches()
                    buffer.clear()
            if len(buffer):
                yield from buffer.to_arrow(batch_id).to_batches()


def land_snapshot(
    bronze: Bronze,
    target: CaptureTarget,
    tables: Sequence[int | PublishedTable],
    *,
    workers: int,
    run_id: str,
    progress: ProgressCallback | None = None,
) -> SnapshotLanded:
    """Snapshot ``tables`` (OIDs or published tables) at one exported snapshot, as one commit.

    A table dropped before the snapshot is skipped and gets an ``error`` record.
    """
    wanted = [
        t if isinstance(t, PublishedTable) else PublishedTable(int(t), "", "") for t in tables
    ]
    temp_slot = f"pgm_snap_{uuid.uuid4().hex[:16]}"
    dropped: dict[PublishedTable, TableDropped] = {}
    with exported_snapshot(target.conninfo, temp_slot, target.snapshot_wait_s) as point:
        conn = connect(target.conninfo)
        try:
            use_snapshot(conn, point.snapshot_name)
            stored_generated = publishes_stored_generated(conn, target.publication)
            publishes = published(conn, target.publication, [t.oid for t in wanted])
            schemas = []
            for table in wanted:
                try:
                    schema = table_schema_at_snapshot(
                        conn, table.oid, stored_generated=stored_generated
                    )
                    shape = Shape.of(
                        publishes.get(schema.oid, EVERYTHING),
                        target.pii.get(f"{schema.schema}.{schema.name}", {}),
                        target.hash_key,
                    )
                    schema = shaped(schema, shape)
                    lock_for_snapshot(conn, table.oid, (schema.schema, schema.name))
                except TableDropped as exc:
                    dropped[table] = exc
                    continue
                schemas.append(schema)
            oids = [schema.oid for schema in schemas]
            blocks = estimate_table_block_counts(conn, oids)
            estimates = {oid: estimate_rows(size) for oid, size in table_sizes(conn, oids).items()}
            version = conn.info.server_version
            names = {schema.oid: f"{schema.schema}.{schema.name}" for schema in schemas}
            if schemas:
                batch_id = bronze.next_batch_id()
                monitor = (
                    CopyProgressMonitor(
                        target.conninfo,
                        run_id,
                        names,
                        estimates,
                        progress,
                        server_version=version,
                    )
                    if progress is not None
                    else nullcontext()
                )
                with monitor:
                    _write_snapshot(
                        bronze, target, schemas, blocks, version, point, workers, run_id, batch_id
                    )
            failpoint("snapshot.after_commit")
            with server_errors():
                conn.execute("COMMIT")  # the table locks go only now that the commit is in
        finally:
            conn.close()
    table_errors = {}
    for table, exc in dropped.items():
        if record_error(bronze, exc, lsn=point.snapshot_lsn, run_id=run_id, table=table):
            table_errors[table_name(table)] = str(exc)
    counts = bronze.landed_counts(batch_id) if schemas else {}
    for name in names.values():
        counts.setdefault(name, 0)
    if progress is not None and names:
        progress(
            [
                TableProgress(names[oid], counts[names[oid]], estimates.get(oid), done=True)
                for oid in names
            ]
        )
    return SnapshotLanded(point.snapshot_lsn, counts, table_errors)


def _write_snapshot(
    bronze: Bronze,
    target: CaptureTarget,
    schemas: list[TableSchema],
    blocks: dict[int, int],
    version: int,
    point,
    workers: int,
    run_id: str,
    batch_id: int,
) -> None:
    tasks = []
    for schema in schemas:
        columns, hashed = copy_columns(schema)
        for part, (start, end) in enumerate(
            worker_ctid_ranges(blocks[schema.oid], workers, version)
        ):
            tasks.append(
                {
                    "oid": schema.oid,
                    "schema": schema.schema,
                    "name": schema.name,
                    "columns": columns,
                    "row_filter": (schema.shape or Shape()).row_filter,
                    "hashed": hashed,
                    "part": part,
                    "start": start,
                    "end": end,
                }
            )
    meta = RecordBuffer(target.source, run_id)
    for schema in schemas:
        _add_snapshot_records(meta, schema, point.snapshot_lsn)
    copy_rows = functools.partial(
        _copy_task_rows,
        tasks=tasks,
        conninfo=dict(target.conninfo),
        snapshot_name=point.snapshot_name,
        source=target.source,
        run_id=run_id,
        snapshot_lsn=point.snapshot_lsn,
        batch_id=batch_id,
        hash_key=target.hash_key,
    )
    bronze.write_snapshot(len(tasks), copy_rows, meta.to_arrow(batch_id), batch_id, workers)


def _add_snapshot_records(buffer: RecordBuffer, schema: TableSchema, snapshot_lsn: int) -> None:
    ident = dict(table_oid=schema.oid, table_schema=schema.schema, table_name=schema.name)
    buffer.add("schema", snapshot_lsn, payload=json_payload(schema), **ident)
    buffer.add("rewind", snapshot_lsn, **ident)
