"""A snapshot landed in bronze: every wanted table at one exported snapshot.

The leader holds the exported snapshot's transaction open (and ``ACCESS SHARE`` on every table,
as ``pg_dump`` does) while one task per range imports the snapshot and streams its COPY rows
into Arrow batches: a thread each where delta-rs writes bronze, a Spark task each where Spark
does (``bronze.store``).

Most tables are read in ctid ranges, and their copy rows, one ``schema`` and one ``rewind``
record per table are one Delta commit: such a table's snapshot is in bronze whole or not at
all. A large table with a key that orders alike everywhere is read in key ranges instead
(``capture.ranges``), a wave of them (one per worker) per commit, each with a ``range`` record;
a later attempt keeps the ranges landed and reads the others, and the table's ``schema`` and
``rewind`` records come in a last commit once every range is in.
"""

from __future__ import annotations

import functools
import json
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
from pgmedallion.capture.ranges import (
    RangePlan,
    fingerprint,
    key_condition,
    key_type,
    range_count,
    range_key,
    resume_plan,
    rewind_payload,
    sample_bounds,
)
from pgmedallion.capture.snapshot import (
    WHOLE_TABLE,
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
            sizes = table_sizes(conn, oids)
            estimates = {oid: estimate_rows(size) for oid, size in sizes.items()}
            version = conn.info.server_version
            names = {schema.oid: f"{schema.schema}.{schema.name}" for schema in schemas}
            plans = _range_plans(bronze, target, conn, schemas, sizes, estimates)
            batches: list[int] = []
            if schemas:
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
                    else None
                )
                if monitor is not None:
                    monitor.landed.update(_rows_landed(bronze, plans))
                    monitor.ranges.update(
                        (oid, (len(plan.landed), plan.count)) for oid, plan in plans.items()
                    )
                with monitor or nullcontext():
                    whole = [schema for schema in schemas if schema.oid not in plans]
                    if whole:
                        batches.append(bronze.next_batch_id())
                        _write_snapshot(
                            bronze,
                            target,
                            whole,
                            blocks,
                            version,
                            point,
                            workers,
                            run_id,
                            batches[-1],
                        )
                    batches += _write_ranges(
                        bronze,
                        target,
                        [schema for schema in schemas if schema.oid in plans],
                        plans,
                        point,
                        workers,
                        run_id,
                        monitor,
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
    counts = dict.fromkeys(names.values(), 0) if schemas else {}
    if schemas:
        for (oid, _, _, _, _), rows in _landed_parts(bronze, batches, plans).items():
            if oid in names:
                counts[names[oid]] += rows
    if progress is not None and names:
        progress(
            [
                TableProgress(
                    names[oid],
                    counts[names[oid]],
                    estimates.get(oid),
                    done=True,
                    ranges=(plans[oid].count, plans[oid].count) if oid in plans else None,
                )
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
    tasks = [
        _task(schema, part, ctid_range)
        for schema in schemas
        for part, ctid_range in enumerate(worker_ctid_ranges(blocks[schema.oid], workers, version))
    ]
    meta = RecordBuffer(target.source, run_id)
    for schema in schemas:
        _add_snapshot_records(meta, schema, point.snapshot_lsn)
    _land(bronze, target, point, run_id, tasks, meta, batch_id, workers)


def _task(
    schema: TableSchema, part: int, ctid_range: tuple[int, int | None], key_range: str | None = None
) -> dict[str, Any]:
    """One COPY task of a snapshot: a ctid range of ``schema``, or (``key_range``, SQL) a key
    range of it (the whole heap)."""
    columns, hashed = copy_columns(schema)
    row_filter = (schema.shape or Shape()).row_filter
    if key_range is not None:
        row_filter = key_range if row_filter is None else f"({row_filter}) AND {key_range}"
    return {
        "oid": schema.oid,
        "schema": schema.schema,
        "name": schema.name,
        "columns": columns,
        "row_filter": row_filter,
        "hashed": hashed,
        "part": part,
        "start": ctid_range[0],
        "end": ctid_range[1],
    }


def _land(
    bronze: Bronze,
    target: CaptureTarget,
    point,
    run_id: str,
    tasks: list[dict[str, Any]],
    meta: RecordBuffer,
    batch_id: int,
    workers: int,
) -> None:
    """Run ``tasks`` and commit their copy rows with ``meta`` as batch ``batch_id``."""
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


def _range_plans(
    bronze: Bronze,
    target: CaptureTarget,
    conn,
    schemas: list[TableSchema],
    sizes: dict,
    estimates: dict[int, int],
) -> dict[int, RangePlan]:
    """The tables of ``schemas`` read in key ranges, each with its plan: the ranges an earlier
    attempt landed kept where they still hold (``capture.ranges.resume_plan``), otherwise
    boundaries sampled now for a table past two ranges' size."""
    plans: dict[int, RangePlan] = {}
    for schema in schemas:
        key = range_key(schema)
        if key is None:
            continue
        now = fingerprint(schema)
        plan = resume_plan(bronze.landed_ranges(schema.oid), key, now)
        name = f"{schema.schema}.{schema.name}"
        if plan is not None:
            log.info(
                "snapshot of %s resumes: %d of %d key ranges landed before, %d to read",
                name,
                len(plan.landed),
                plan.count,
                len(plan.todo()),
            )
            plans[schema.oid] = plan
            continue
        size = sizes.get(schema.oid)
        heap = 0 if size is None else size.blocks * size.block_size
        count = range_count(heap, target.snapshot_range_bytes)
        if count < 2:
            continue
        bounds = sample_bounds(conn, schema, key, count, estimates.get(schema.oid, 0))
        if bounds:
            plans[schema.oid] = RangePlan(key.name, key_type(key), bounds, now, {})
    return plans


def _rows_landed(bronze: Bronze, plans: dict[int, RangePlan]) -> dict[int, int]:
    """Rows of each table that earlier attempts landed (the kept ranges)."""
    rows: dict[int, int] = {}
    for (oid, _, _, _, _), count in _landed_parts(bronze, [], plans).items():
        rows[oid] = rows.get(oid, 0) + count
    return rows


def _landed_parts(bronze: Bronze, batches: list[int], plans: dict[int, RangePlan]) -> dict:
    """The rows of each part of ``batches`` and of the ranges the plans kept from earlier
    attempts (only those: a batch of an earlier attempt may hold other tables' ranges)."""
    kept = {
        (oid, part, batch)
        for oid, plan in plans.items()
        for part, (_, batch) in plan.landed.items()
    }
    parts = bronze.landed_parts([*batches, *(batch for _, _, batch in kept)])
    mine = set(batches)
    return {
        key: rows
        for key, rows in parts.items()
        if key[4] in mine or (key[0], key[3], key[4]) in kept
    }


def _write_ranges(
    bronze: Bronze,
    target: CaptureTarget,
    schemas: list[TableSchema],
    plans: dict[int, RangePlan],
    point,
    workers: int,
    run_id: str,
    monitor: CopyProgressMonitor | None,
) -> list[int]:
    """Land the ranges ``plans`` still need, a wave per commit (``[source]
    snapshot_ranges_per_commit``, or the bronze writer's ``ranges_per_commit``), each range with
    its ``range`` record, then one commit of every table's ``schema`` and ``rewind`` records.
    Returns the batch ids this call committed."""
    landed = {oid: dict(plan.landed) for oid, plan in plans.items()}
    pieces = [(schema, index) for schema in schemas for index in plans[schema.oid].todo()]
    wave = target.ranges_per_commit or bronze.ranges_per_commit(workers)
    batches = []
    for start in range(0, len(pieces), wave):
        batch_id = bronze.next_batch_id()
        tasks, meta = [], RecordBuffer(target.source, run_id)
        for schema, index in pieces[start : start + wave]:
            plan = plans[schema.oid]
            condition = key_condition(plan.key, plan.type_oid, *plan.limits(index))
            tasks.append(_task(schema, index, WHOLE_TABLE, condition.as_string(None)))
            meta.add(
                "range",
                point.snapshot_lsn,
                table_oid=schema.oid,
                table_schema=schema.schema,
                table_name=schema.name,
                part=index,
                payload=json.dumps(plan.record(), sort_keys=True).encode(),
            )
        _land(bronze, target, point, run_id, tasks, meta, batch_id, workers)
        batches.append(batch_id)
        for schema, index in pieces[start : start + wave]:
            landed[schema.oid][index] = (point.snapshot_lsn, batch_id)
            if monitor is not None:
                monitor.ranges[schema.oid] = (len(landed[schema.oid]), plans[schema.oid].count)
        failpoint("snapshot.range_landed")
    if schemas:
        batch_id = bronze.next_batch_id()
        meta = RecordBuffer(target.source, run_id)
        for schema in schemas:
            plan, ranges = plans[schema.oid], landed[schema.oid]
            ident = dict(table_oid=schema.oid, table_schema=schema.schema, table_name=schema.name)
            meta.add("schema", point.snapshot_lsn, payload=json_payload(schema), **ident)
            oldest = min(lsn for lsn, _ in ranges.values())
            meta.add("rewind", oldest, payload=rewind_payload(plan, ranges), **ident)
        bronze.append(meta.to_arrow(batch_id), batch_id)
        batches.append(batch_id)
    return batches
