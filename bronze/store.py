"""Where capture reads and writes bronze: one interface, a delta-rs and a Spark implementation.

Capture needs little of bronze: a few aggregates over its control records (the frontier, the
next batch id, which tables have a snapshot, which errors were recorded), idempotent appends
(stream batches, snapshots, error and resync records) and a way to land a snapshot's ctid
ranges in parallel. Each question has one answer, :class:`Bronze`'s, computed over the records
other than ``wal`` messages; an implementation only reads them (``_records``, ``_payload``):
Spark with a query that bronze's statistics on ``kind`` prune, delta-rs from the Parquet row
groups that hold any (row groups of only ``wal`` messages skipped by their statistics).
``tests/test_bronze_writer.py`` holds the answers equal on one table written by both engines.

``DeltaRsBronze`` (the ``deltalake`` package)
    Where bronze is a directory of the local file system (local runs, the tests, the demo).
    Nothing here needs a JVM: it creates the table if there is none (the same schema, protocol
    and statistics columns as Spark's ``CREATE TABLE``), reads it with delta-rs' SQL engine,
    appends with ``txnAppId``/``txnVersion`` checked first, and lands a snapshot with one
    thread per ctid range, each writing its Parquet file into the table's directory, then one
    commit of all of them.
``SparkBronze`` (:mod:`pgmedallion.bronze.spark_table`)
    On Databricks (a Unity Catalog managed table is written through the catalog), wherever
    bronze is not a local directory, when the table needs a protocol delta-rs does not write,
    and when ``[lakehouse] engine = "spark"`` asks for it. The snapshot is one Spark job of
    one task per ctid range.

:func:`pgmedallion.bronze.engines.open_bronze` picks one. The capture process imports
pyspark only for the Spark one.
"""

from __future__ import annotations

import json
import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import unquote, urlparse

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pgmedallion.bronze.table import (
    ARROW_SCHEMA,
    STATS_COLUMNS,
    BronzeState,
    RecordBuffer,
    app_id,
    json_payload,
)
from pgmedallion.bronze.writer import (
    BatchWriter,
    DataFile,
    DeltaRsWriter,
    write_data_file,
)
from pgmedallion.core.errors import PipelineError
from pgmedallion.core.failpoints import failpoint

log = logging.getLogger(__name__)

CopyTask = Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]
"""A snapshot task body: given record batches of task ids (column ``id``), the bronze
``copy`` records of those tasks' ctid ranges, in :data:`~pgmedallion.bronze.table.ARROW_SCHEMA`."""

CONTROL_KINDS = ("progress", "rewind", "error", "resync")
PAYLOAD_KINDS = ("progress", "error", "schema", "schema_change", "resync", "range", "rewind")
"""The records whose payload a question reads."""


def _control_fields(r: dict[str, Any]) -> dict[str, Any]:
    return {k: r[k] for k in ("kind", "table_oid", "table_schema", "table_name", "lsn", "batch_id")}


class WindowEnd(NamedTuple):
    """Where bronze ends for a reader: its frontier, its last batch id (None each before the
    first progress record / batch), and the source's clock for the frontier."""

    frontier: int | None
    batch: int | None
    source_time: datetime | None
    """When the source was exactly as of the frontier (see ``capture/replication.py``); None
    where the progress record predates the field."""


def source_time(progress_payload: bytes | None) -> datetime | None:
    """The source's clock a progress record's payload carries (UTC, naive as Spark's
    ``TIMESTAMP`` values are here), or None."""
    if not progress_payload:
        return None
    us = json.loads(progress_payload).get("source_time_us")
    if us is None:
        return None
    return datetime.fromtimestamp(us / 1_000_000, UTC).replace(tzinfo=None)


class Bronze(ABC):
    """One source's rows of the bronze table, as capture reads and writes them."""

    name: str
    """``delta-rs`` or ``spark``: which engine commits (reported in :class:`StreamResult`)."""

    def __init__(self, table: str, source: str) -> None:
        self.table = table
        """The bronze table's qualified name (as the catalog knows it)."""
        self.source = source
        self.app = app_id(source)

    # -- what each engine provides

    @abstractmethod
    def _records(self) -> list[dict[str, Any]]:
        """The source's records other than ``wal`` messages, without payloads: the columns of
        :data:`INDEX_COLUMNS` (and where each is, for :meth:`_payload`)."""

    @abstractmethod
    def _payload(self, record: dict[str, Any]) -> bytes | None:
        """The payload of one of :meth:`_records`' records."""

    def refresh(self) -> Bronze:
        """Read the records anew at the next question: another process (a ``pgmedallion
        resync``, silver) may have committed since. An engine that keeps what it read forgets
        it; one that reads the table's log at each question has nothing to do."""
        return self

    @abstractmethod
    def append(self, records: pa.Table, batch_id: int, app: str | None = None) -> bool:
        """Commit ``records`` (in ARROW_SCHEMA) as batch ``batch_id`` of transaction ``app``
        (default: the source's), unless that batch is committed already. Returns whether it
        committed."""

    @abstractmethod
    def writer(self) -> BatchWriter:
        """The committer of stream batches."""

    @abstractmethod
    def write_snapshot(
        self, tasks: int, copy_task: CopyTask, meta: pa.Table, batch_id: int, workers: int
    ) -> None:
        """Run ``copy_task`` for task ids ``0 .. tasks-1``, at most ``workers`` at a time, and
        commit their records with ``meta`` as batch ``batch_id``: all of it or none."""

    def ranges_per_commit(self, workers: int) -> int:
        """How many key ranges of a snapshot one commit lands (a wave), by default: one per
        worker, so a stopped snapshot redoes at most the ranges of one wave."""
        return max(1, workers)

    # -- questions: one answer each, over the control records, whichever engine read them

    def state(self) -> BronzeState:
        """The frontier, the recorded server, the next batch id and the complete snapshots, from
        the records other than wal messages (every batch holds one: a stream batch its
        ``progress`` record, a wave of key ranges its ``range`` records)."""
        records = self._records()
        control = [r for r in records if r["kind"] in CONTROL_KINDS]
        progress = sorted(
            (r for r in control if r["kind"] == "progress"), key=lambda r: -r["batch_id"]
        )
        identity = None
        for r in progress:
            identity = self._payload(r)
            if identity is not None:
                break
        return _state(
            max((r["lsn"] for r in progress), default=None),
            max((r["batch_id"] for r in records), default=None),
            identity,
            [r for r in control if r["kind"] in ("rewind", "resync")],
        )

    def frontier(self) -> int | None:
        """The highest committed frontier, or None before the first progress record."""
        return max((r["lsn"] for r in self._records() if r["kind"] == "progress"), default=None)

    def window_end(self) -> WindowEnd:
        """The frontier and the last batch id from one read of the records, so the two agree
        while a capture commits meanwhile (a continuous one): the frontier is never that of a
        batch after the batch id. With the source's clock for the frontier."""
        records = self._records()
        progress = max(
            (r for r in records if r["kind"] == "progress"),
            key=lambda r: (r["lsn"], r["batch_id"]),
            default=None,
        )
        return WindowEnd(
            None if progress is None else progress["lsn"],
            max((r["batch_id"] for r in records), default=None),
            None if progress is None else source_time(self._payload(progress)),
        )

    def next_batch_id(self) -> int:
        last = max((r["batch_id"] for r in self._records()), default=None)
        return 0 if last is None else last + 1

    def snapshotted_tables(self) -> dict[int, int]:
        """OID -> snapshot LSN of every table whose snapshot is complete in bronze."""
        tables: dict[int, int] = {}
        for r in self._records():
            if r["kind"] == "rewind":
                tables[r["table_oid"]] = max(tables.get(r["table_oid"], r["lsn"]), r["lsn"])
        return tables

    def landed_ranges(self, oid: int) -> list[dict[str, Any]]:
        """The ``range`` records (``lsn``, ``batch_id``, ``part``, decoded ``payload``) of the
        table's snapshot in progress: those in batches after its newest snapshot (``rewind``),
        its newest resync request and bronze's newest gap (``record_gap``, a resync record for
        no table), oldest first (``capture.ranges.resume_plan`` decides which a new attempt
        keeps)."""
        records = self._records()
        after = max(
            (
                r["batch_id"]
                for r in records
                if (r["kind"] in ("rewind", "resync") and r["table_oid"] == oid)
                or (r["kind"] == "resync" and r["table_oid"] is None)
            ),
            default=-1,
        )
        found = [
            {
                "lsn": r["lsn"],
                "batch_id": r["batch_id"],
                "part": r["part"],
                "payload": json.loads(self._payload(r) or b"{}"),
            }
            for r in records
            if r["kind"] == "range" and r["table_oid"] == oid and r["batch_id"] > after
        ]
        return sorted(found, key=lambda r: (r["batch_id"], r["part"]))

    def ranges_landed(self) -> int:
        """How many key ranges bronze holds, every table's and attempt's (``range`` records)."""
        return sum(1 for r in self._records() if r["kind"] == "range")

    def snapshots_under_way(self) -> list[tuple[str, int, int]]:
        """``(schema.table, ranges landed, ranges in all)`` of each table whose snapshot in key
        ranges has ranges landed and is not complete (a run stopped during it: the next one
        reads the other ranges)."""
        tables = {
            (r["table_oid"], r["table_schema"], r["table_name"])
            for r in self._records()
            if r["kind"] == "range"
        }
        out = []
        dropped = self.dropped_tables()
        for oid, schema, name in sorted(tables, key=lambda t: (t[1], t[2])):
            landed = [] if oid in dropped else self.landed_ranges(oid)
            if not landed:
                continue
            plan = landed[-1]["payload"]  # (the newest plan: capture.ranges.resume_plan)
            parts = {r["part"] for r in landed if r["payload"] == plan}
            out.append((f"{schema}.{name}", len(parts), len(plan.get("bounds", ())) + 1))
        return out

    def recorded_errors(self) -> set[tuple[str, int | None, int]]:
        """``(code, table_oid, lsn)`` of every error record."""
        return {
            (json.loads(self._payload(r))["code"], r["table_oid"], r["lsn"])
            for r in self._records()
            if r["kind"] == "error"
        }

    def dropped_tables(self) -> set[int]:
        """The captured tables recorded as dropped at the source (``TableDropped``)."""
        return {oid for code, oid, _ in self.recorded_errors() if code == "TableDropped" and oid}

    def gaps(self) -> list[tuple[int, int, str]]:
        """``(from, to, why)`` of every gap recorded (:meth:`record_gap`), oldest first."""
        out = []
        for r in self._records():
            if r["kind"] == "resync" and r["table_oid"] is None:
                p = json.loads(self._payload(r) or b"{}")
                out.append((int(p["gap_from"]), r["lsn"], p.get("reason", "")))
        return sorted(out, key=lambda g: g[1])

    def record_gap(self, start: int, end: int, why: str) -> None:
        """Record that the changes from ``start`` (bronze's frontier) to ``end`` (where the
        stream goes on) were not read, and ``why``: one ``resync`` record for no table at
        ``end`` (every table was snapshotted again at or after it)."""
        payload = {"requested_at": datetime.now(UTC).isoformat(), "reason": why, "gap_from": start}
        self._record_alone("gap", "resync", end, payload)

    def record_server(self, frontier: int, identity: Mapping[str, Any]) -> None:
        """Record that the positions from ``frontier`` on are the server ``identity``'s
        (``{"system_id", "timeline"}``): a ``progress`` record at the unchanged frontier
        (capture adopting a new server after ``resync --all``)."""
        self._record_alone("server", "progress", frontier, dict(identity))

    def _record_alone(self, what: str, kind: str, lsn: int, payload: Mapping[str, Any]) -> None:
        """One ``kind`` record for no table at ``lsn``, in a batch of its own."""
        run_id = f"{what}-" + datetime.now(UTC).strftime("%Y%m%dT%H%M%S%f")
        buffer = RecordBuffer(self.source, run_id)
        buffer.add(kind, lsn, payload=json_payload(dict(payload)))
        batch_id = self.next_batch_id()
        self.append(buffer.to_arrow(batch_id), batch_id)

    def landed_counts(self, batch_id: int) -> dict[str, int]:
        """``schema.table`` -> rows of the snapshot committed as batch ``batch_id`` (a ctid
        range holds as many rows as its largest ``ordinal``)."""
        counts: dict[str, int] = {}
        for (_, schema, name, _, _), rows in self.landed_parts([batch_id]).items():
            counts[f"{schema}.{name}"] = counts.get(f"{schema}.{name}", 0) + rows
        return counts

    def landed_parts(self, batches: Collection[int]) -> dict[tuple[int, str, str, int, int], int]:
        """``(table_oid, schema, name, part, batch_id)`` -> rows, of the ``copy`` records
        of ``batches`` (a part holds as many rows as its largest ``ordinal``)."""
        wanted = set(batches)
        parts: dict[tuple[int, str, str, int, int], int] = {}
        for r in self._records():
            if r["kind"] == "copy" and r["batch_id"] in wanted:
                key = (r["table_oid"], r["table_schema"], r["table_name"], r["part"], r["batch_id"])
                parts[key] = max(parts.get(key, 0), r["ordinal"])
        return parts

    def snapshot_schemas(
        self, oids: Sequence[int], upto: int | None = None
    ) -> dict[int, dict[str, Any]]:
        """OID -> the table schema recorded by the table's newest snapshot (its JSON object:
        columns, leaf partitions, shape); ``upto``: among batches up to that one."""
        wanted = set(oids)
        newest: dict[int, dict[str, Any]] = {}
        for r in self._records():
            if r["kind"] != "schema" or r["table_oid"] not in wanted:
                continue
            if upto is not None and r["batch_id"] > upto:
                continue
            if r["table_oid"] not in newest or newest[r["table_oid"]]["batch_id"] < r["batch_id"]:
                newest[r["table_oid"]] = r
        return {oid: json.loads(self._payload(r)) for oid, r in newest.items()}

    def control_window(self, after: int, upto: int) -> list[dict[str, Any]]:
        """The ``schema``, ``rewind`` and ``error`` records of batches (``after``, ``upto``],
        and one ``copy`` record per table with COPY records there (at its first such batch,
        no payload), in batch order: what a silver run reads before its changes. Each with
        kind, table_oid, table_schema, table_name, lsn, payload, batch_id."""
        found, copied = [], {}
        for r in self._records():
            if not after < r["batch_id"] <= upto:
                continue
            kind = r["kind"]
            if kind in ("schema", "rewind", "error"):
                found.append({**_control_fields(r), "payload": self._payload(r)})
            elif kind == "copy":
                copied[r["table_oid"]] = min(
                    copied.get(r["table_oid"], r["batch_id"]), r["batch_id"]
                )
        for oid, batch in copied.items():
            found.append(
                {
                    "kind": "copy",
                    "table_oid": oid,
                    "table_schema": None,
                    "table_name": None,
                    "lsn": None,
                    "payload": None,
                    "batch_id": batch,
                }
            )
        return sorted(found, key=lambda r: r["batch_id"])

    def schema_events(self, newest: int = 10) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        """The newest ``resync`` and ``schema_change`` records, newest first: ``(record,
        payload)`` (record: kind, table_schema, table_name, lsn, batch_id)."""
        events = sorted(
            (r for r in self._records() if r["kind"] in ("resync", "schema_change")),
            key=lambda r: -r["batch_id"],
        )
        return [(r, json.loads(self._payload(r) or b"{}")) for r in events[:newest]]

    def followed_catalogs(
        self, oids: Sequence[int], upto: int | None = None
    ) -> dict[int, tuple[int, dict]]:
        """OID -> (snapshot LSN, catalog) of the newest ``schema_change`` record of each table
        among ``oids`` that holds the catalog capture saw when it recorded the change;
        ``upto``: among batches up to that one (a silver run's window, so that its redo after
        a crash decides the same)."""
        wanted = set(oids)
        newest: dict[int, tuple[int, int, dict]] = {}
        for r in self._records():
            oid = r["table_oid"]
            if r["kind"] != "schema_change" or oid not in wanted:
                continue
            if upto is not None and r["batch_id"] > upto:
                continue
            if oid in newest and newest[oid][0] >= r["batch_id"]:
                continue
            p = json.loads(self._payload(r))
            if p.get("catalog"):
                newest[oid] = (r["batch_id"], int(p["snapshot_lsn"]), p["catalog"])
        return {oid: (lsn, catalog) for oid, (_, lsn, catalog) in newest.items()}

    def followed_changes(self) -> set[tuple[int, str, int]]:
        """``(table_oid, change, snapshot LSN)`` of every schema change recorded as followed."""
        found = set()
        for r in self._records():
            if r["kind"] == "schema_change":
                p = json.loads(self._payload(r))
                found.add((r["table_oid"], p["change"], int(p["snapshot_lsn"])))
        return found

    def record_followed(
        self, changes: Sequence[tuple[int, str, str, str, int, dict | None]], lsn: int
    ) -> int:
        """One batch of ``schema_change`` records: ``(oid, schema, name, change, snapshot
        LSN, catalog)``, each a schema change since the table's snapshot that capture follows
        without a new one, noticed at ``lsn`` (the bronze frontier), with the table's catalog
        as capture saw it then (later changes are compared with it). Returns the batch id."""
        now = datetime.now(UTC)
        buffer = RecordBuffer(self.source, "schema-" + now.strftime("%Y%m%dT%H%M%S%f"))
        for oid, schema, name, change, snapshot_lsn, catalog in changes:
            payload = json_payload(
                {
                    "change": change,
                    "done": "followed",
                    "snapshot_lsn": snapshot_lsn,
                    "noticed_at": now.isoformat(),
                    **({"catalog": catalog} if catalog is not None else {}),
                }
            )
            buffer.add(
                "schema_change",
                lsn,
                table_oid=oid,
                table_schema=schema,
                table_name=name,
                payload=payload,
            )
        batch_id = self.next_batch_id()
        self.append(buffer.to_arrow(batch_id), batch_id, self.app + "-schema")
        return batch_id

    def request_resync(
        self,
        tables: Sequence[tuple[int, str, str]],
        lsn: int,
        reasons: Mapping[int, str] | None = None,
    ) -> int:
        """One batch of ``resync`` records for ``tables`` (``(oid, schema, name)``), at ``lsn``
        (the bronze frontier): the next capture snapshots them again. ``reasons``: why, by
        OID, where capture decided it (none: a person asked). Returns the batch id."""
        now = datetime.now(UTC)
        buffer = RecordBuffer(self.source, "resync-" + now.strftime("%Y%m%dT%H%M%S%f"))
        for oid, schema, name in tables:
            why = {"reason": reasons[oid]} if reasons and oid in reasons else {}
            payload = json_payload({"requested_at": now.isoformat(), **why})
            buffer.add(
                "resync", lsn, table_oid=oid, table_schema=schema, table_name=name, payload=payload
            )
        # Its own transaction id: a capture committing the same batch id at the same time (a
        # continuous capture) must not make Delta skip either commit as a repeat. Two requests
        # at once (silver's and a person's) can take the same id: the one Delta skips as a
        # repeat is made again under the next id.
        for _ in range(5):
            batch_id = self.next_batch_id()
            if self.append(buffer.to_arrow(batch_id), batch_id, self.app + "-resync"):
                return batch_id
        raise PipelineError("the resync request could not be committed (5 tries)")


def _state(
    frontier: int | None,
    last_batch: int | None,
    identity: bytes | None,
    tables: list[dict[str, Any]],
) -> BronzeState:
    """:class:`BronzeState` from the frontier, the highest batch id, the newest progress
    payload and the ``rewind``/``resync`` records."""
    snapshots: dict[int, tuple[int, str, str]] = {}
    newest: dict[tuple[str, int], int] = {}  # (kind, oid) -> newest batch
    for r in tables:
        key = (r["kind"], r["table_oid"])
        newest[key] = max(newest.get(key, -1), r["batch_id"])
        if r["kind"] == "resync":
            continue  # (one for no table records a gap: see Bronze.record_gap)
        if r["table_oid"] not in snapshots or snapshots[r["table_oid"]][0] < r["lsn"]:
            snapshots[r["table_oid"]] = (r["lsn"], r["table_schema"], r["table_name"])
    resync = frozenset(
        oid
        for (kind, oid), batch in newest.items()
        if kind == "resync" and oid is not None and batch > newest.get(("rewind", oid), -1)
    )
    return BronzeState(
        frontier=frontier,
        system_identity=None if identity is None else json.loads(bytes(identity)),
        next_batch_id=0 if last_batch is None else last_batch + 1,
        snapshots=snapshots,
        resync=resync,
    )


class DeltaRsBronze(Bronze):
    """Bronze in a local directory, read and written by delta-rs (no JVM)."""

    name = "delta-rs"

    def __init__(self, path: str, table: str, source: str) -> None:
        from deltalake import DeltaTable

        super().__init__(table, source)
        self.path = path
        if not (Path(path) / "_delta_log").is_dir():
            create_local_bronze(path)
        self._table = DeltaTable(path)
        self._files: dict[str, list[dict[str, Any]]] = {}
        """Data file URI -> its records but wal (files never change, and their names are
        unique: a reader kept across runs reads each once)."""
        self._payloads: dict[tuple[str, int], pa.Array] = {}

    # Capture's questions are answered from the records other than wal messages, read from
    # the Parquet row groups that hold any (a stream batch's control record is a row group of
    # its own, see DeltaRsWriter.write), without payloads; the few payloads needed are read
    # one row group at a time. Data files never change, so each is read once per process.
    # (delta-rs' SQL engine would answer the same, but loading it costs the capture process
    # about 60 MB.)

    def reopen(self) -> DeltaRsBronze:
        """The table's log read anew (a table dropped and created again at the same path is
        not taken for the old one's later versions); the files read so far stay read."""
        from deltalake import DeltaTable

        self._table = DeltaTable(self.path)
        return self

    def _records(self) -> list[dict[str, Any]]:
        self._table.update_incremental()
        records = []
        for uri in self._table.file_uris():
            found = self._files.get(uri)
            if found is None:
                found = self._files[uri] = _records_but_wal(_local(uri))
            records.extend(r for r in found if r["source"] == self.source)
        return records

    def _payload(self, record: dict[str, Any]) -> bytes | None:
        where = (record["_file"], record["_group"])
        column = self._payloads.get(where)
        if column is None:
            group = pq.ParquetFile(record["_file"]).read_row_group(
                record["_group"], columns=["payload"]
            )
            column = self._payloads[where] = group.column(0)
        return column[record["_row"]].as_py()

    def append(self, records: pa.Table, batch_id: int, app: str | None = None) -> bool:
        return DeltaRsWriter(self.path, app or self.app).append(records, batch_id)

    def writer(self) -> DeltaRsWriter:
        return DeltaRsWriter(self.path, self.app)

    def write_snapshot(
        self, tasks: int, copy_task: CopyTask, meta: pa.Table, batch_id: int, workers: int
    ) -> None:
        def one(task: int) -> DataFile | None:
            ids = pa.record_batch({"id": pa.array([task], pa.int64())})
            return write_data_file(self.path, copy_task(iter([ids])))

        # The COPY is read by asyncpg and encoded by Arrow, both outside the GIL for most of
        # their work, so threads run the ranges in parallel without worker processes.
        with ThreadPoolExecutor(max(1, min(workers, tasks)), "snapshot-copy") as pool:
            files = [f for f in pool.map(one, range(tasks)) if f is not None]
        meta_file = write_data_file(self.path, meta.to_batches())
        failpoint("snapshot.before_commit")
        DeltaRsWriter(self.path, self.app).commit_files([*files, meta_file], batch_id)


INDEX_COLUMNS = [
    "source",
    "kind",
    "table_oid",
    "table_schema",
    "table_name",
    "lsn",
    "batch_id",
    "part",
    "ordinal",
]


def _local(uri: str) -> str:
    return unquote(urlparse(uri).path) if uri.startswith("file:") else uri


def _records_but_wal(path: str) -> list[dict[str, Any]]:
    """The records of a bronze data file other than ``wal`` messages, without payloads, each
    with where it is (``_file``, ``_group``, ``_row``). Row groups whose statistics say they
    hold only wal messages are not read."""
    parquet = pq.ParquetFile(path)
    kind = parquet.schema_arrow.get_field_index("kind")
    found = []
    for group in range(parquet.num_row_groups):
        stats = parquet.metadata.row_group(group).column(kind).statistics
        if stats is not None and stats.has_min_max and stats.min == stats.max == "wal":
            continue
        table = parquet.read_row_group(group, columns=INDEX_COLUMNS)
        rows = pc.indices_nonzero(pc.not_equal(table.column("kind"), "wal"))
        for row, record in zip(rows.to_pylist(), table.take(rows).to_pylist(), strict=True):
            record.update(_file=path, _group=group, _row=row)
            found.append(record)
    return found


def create_local_bronze(path: str) -> None:
    """Create an empty bronze table at ``path`` with delta-rs: the schema, protocol (1, 2) and
    statistics columns of Spark's ``CREATE TABLE`` (``bronze.spark_table.ensure_bronze_table``).
    """
    from deltalake import DeltaTable

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    DeltaTable.create(
        path,
        ARROW_SCHEMA,
        mode="ignore",  # another process created it first: use that one
        configuration={"delta.dataSkippingStatsColumns": STATS_COLUMNS},
    )
    log.info("created bronze table at %s", path)
