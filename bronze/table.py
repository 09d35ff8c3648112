"""The bronze table: one append-only Delta table of everything capture saw, raw.

Columns (documented in the README):

    source       the configured source name
    kind         copy | wal | rewind | schema | error | progress | resync | range
    table_oid    the source table's OID (NULL for Begin/Commit/Truncate messages and progress)
    table_schema, table_name   the source table's schema and name, unquoted
    lsn          wal: the transaction's commit LSN; copy/rewind/schema: the snapshot LSN;
                 progress: the frontier F (every transaction committing below F is in bronze)
    end_lsn      wal: the XLogData walEnd the message arrived with
    xid          wal: the transaction id
    ordinal      wal: the message's position in its transaction (Begin = 0);
                 copy: the number of rows of its ctid range up to and including this record
                 (so a range holds as many rows as its largest ordinal)
    part         copy: the ctid range the rows came from, or the key range (a snapshot read
                 in key ranges, ``capture.ranges``); range: the key range
    payload      copy: consecutive COPY TEXT rows of one ctid range, each ending in a newline,
                 as the server sent them (about 1 MiB per record; :func:`copy_lines` splits
                 them); wal: one pgoutput message; schema: JSON;
                 error: JSON ``{"code", "message", "lsn"}``;
                 progress: JSON ``{"system_id", "timeline", "source_time_us"}``: the server the
                 LSNs belong to, and its clock for F (Unix microseconds; see
                 ``capture/replication.py``);
                 range: JSON ``{"key", "type_oid", "bounds", "schema"}``: one key range of
                 a snapshot read in key ranges landed, read at ``lsn`` (the boundaries split
                 the key into ranges; ``schema`` fingerprints what the rows were read with);
                 rewind: NULL, or for a snapshot read in key ranges JSON ``{"key",
                 "type_oid", "bounds", "ranges"}``, each range's ``[lsn, batch_id]`` (the
                 record's own ``lsn`` is then the oldest range's);
                 resync: JSON ``{"requested_at", "reason"?}`` (snapshot this table again:
                 ``pgmedallion resync``, or capture's own decision and its reason, a schema
                 change say; a table whose newest resync record is newer than its newest
                 snapshot is snapshotted by the next capture); one with no table records a
                 gap: ``{"requested_at", "reason", "gap_from"}``, the changes from
                 ``gap_from`` (bronze's frontier then) to its ``lsn`` were not read (a lost
                 slot, after ``pgmedallion resync --all`` snapshotted every table again)
    batch_id     the capture batch that committed the row (Delta txnVersion, per source)
    run_id       the capture attempt that produced it: one snapshot and one streaming session
                 (a retry after a transient error is a new run_id, so "one read" of a
                 transaction is the messages of one run_id)
    captured_at  when it was captured (UTC)

Invariants: every batch is one Delta commit made with ``txnAppId = pgmedallion-<source>`` and
``txnVersion = batch_id``, so a retried commit of the same batch is skipped by Delta itself;
batch ids only grow. A snapshot's copy rows, its rewind and schema records are one commit, so
a table's snapshot is either wholly in bronze or not at all; a snapshot read in key ranges
lands a wave of ranges per commit, and its schema and rewind records come once every range
is in (until then its ranges are not read downstream). The slot is acknowledged only up to
the frontier of a committed progress record.

Error records. A definite error (publication dropped, slot missing, invalidated or compacted,
timeline changed: ``table_oid`` NULL; a table dropped: that table's identity) is one ``error``
record in a batch of its own, at the LSN where capture stopped (the frontier) or, for a dropped
table, where the drop was noticed. The same error is not recorded twice
(:func:`recorded_errors`).
"""

from __future__ import annotations

import json
from array import array
from dataclasses import asdict, dataclass
from datetime import UTC, datetime

import pyarrow as pa

KINDS = ("copy", "wal", "rewind", "schema", "error", "progress", "resync", "range")

BRONZE_DDL = (
    "source STRING NOT NULL, kind STRING NOT NULL, table_oid BIGINT, table_schema STRING, "
    "table_name STRING, lsn BIGINT NOT NULL, end_lsn BIGINT, xid BIGINT, ordinal BIGINT, "
    "part INT, payload BINARY, batch_id BIGINT NOT NULL, run_id STRING NOT NULL, "
    "captured_at TIMESTAMP NOT NULL"
)

ARROW_SCHEMA = pa.schema(
    [
        pa.field("source", pa.string(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),
        pa.field("table_oid", pa.int64()),
        pa.field("table_schema", pa.string()),
        pa.field("table_name", pa.string()),
        pa.field("lsn", pa.int64(), nullable=False),
        pa.field("end_lsn", pa.int64()),
        pa.field("xid", pa.int64()),
        pa.field("ordinal", pa.int64()),
        pa.field("part", pa.int32()),
        pa.field("payload", pa.binary()),
        pa.field("batch_id", pa.int64(), nullable=False),
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("captured_at", pa.timestamp("us", tz="UTC"), nullable=False),
    ]
)


def app_id(source: str) -> str:
    return f"pgmedallion-{source}"


STATS_COLUMNS = "source,kind,table_oid,lsn,batch_id"
"""The columns Delta keeps file statistics of: what readers filter bronze on. Statistics of the
others (payloads above all) would cost every write and skip nothing."""


@dataclass(frozen=True)
class BronzeState:
    """What capture needs to know of a source's bronze rows before it reads on, from one query
    over the control records (every batch holds one: a snapshot its rewinds, a stream batch its
    progress record, an error batch its error)."""

    frontier: int | None
    """The highest committed frontier, None before the first progress record."""
    system_identity: dict | None
    """``{"system_id", "timeline"}`` of the newest progress record that carries one."""
    next_batch_id: int
    snapshots: dict[int, tuple[int, str, str]]
    """OID -> (snapshot LSN, schema, name) of every table with a complete snapshot."""
    resync: frozenset[int] = frozenset()
    """Tables whose newest resync request is newer than their newest snapshot."""


class RecordBuffer:
    """Column buffers of bronze records for one batch, turned into an Arrow table at flush."""

    def __init__(self, source: str, run_id: str) -> None:
        self.source = source
        self.run_id = run_id
        self.clear()

    def clear(self) -> None:
        self.columns: dict[str, list] = {f.name: [] for f in ARROW_SCHEMA}
        self.payload_bytes = 0

    def __len__(self) -> int:
        return len(self.columns["kind"])

    def add(
        self,
        kind: str,
        lsn: int,
        *,
        table_oid: int | None = None,
        table_schema: str | None = None,
        table_name: str | None = None,
        end_lsn: int | None = None,
        xid: int | None = None,
        ordinal: int | None = None,
        part: int | None = None,
        payload: bytes | None = None,
    ) -> None:
        c = self.columns
        c["source"].append(self.source)
        c["kind"].append(kind)
        c["table_oid"].append(table_oid)
        c["table_schema"].append(table_schema)
        c["table_name"].append(table_name)
        c["lsn"].append(lsn)
        c["end_lsn"].append(end_lsn)
        c["xid"].append(xid)
        c["ordinal"].append(ordinal)
        c["part"].append(part)
        c["payload"].append(payload)
        if payload is not None:
            self.payload_bytes += len(payload)

    def to_arrow(self, batch_id: int, captured_at: datetime | None = None) -> pa.Table:
        n = len(self)
        cols = dict(self.columns)
        cols["batch_id"] = [batch_id] * n
        cols["run_id"] = [self.run_id] * n
        cols["captured_at"] = [captured_at or datetime.now(UTC)] * n
        return pa.table(cols, schema=ARROW_SCHEMA)


class WalBuffer:
    """A stream batch: pgoutput messages packed into flat buffers (not one Python object per
    message and column), plus a few other records (the batch's ``progress`` record).

    The payloads go into one ``bytearray`` with an offsets array, the LSNs, xids and ordinals
    into ``array('q')``; ``to_arrow`` wraps them without copying each message. Memory is about
    the payload bytes plus 40 bytes per message. After ``to_arrow`` the Arrow table shares the
    payload bytes: call ``clear`` (new buffers) before adding more.
    """

    def __init__(self, source: str, run_id: str) -> None:
        self.source = source
        self.run_id = run_id
        self.clear()

    def clear(self) -> None:
        self.lsn = array("q")
        self.end_lsn = array("q")
        self.xid = array("q")
        self.ordinal = array("q")
        self.offsets = array("q", [0])
        self.data = bytearray()
        self.others = RecordBuffer(self.source, self.run_id)

    @property
    def messages(self) -> int:
        return len(self.lsn)

    @property
    def payload_bytes(self) -> int:
        return len(self.data) + self.others.payload_bytes

    def __len__(self) -> int:
        return len(self.lsn) + len(self.others)

    def add_wal(self, lsn: int, end_lsn: int, xid: int, ordinal: int, payload: bytes) -> None:
        self.lsn.append(lsn)
        self.end_lsn.append(end_lsn)
        self.xid.append(xid)
        self.ordinal.append(ordinal)
        self.data += payload
        self.offsets.append(len(self.data))

    def seal(self, batch_id: int) -> SealedBatch:
        """The batch as it is committed: only the columns that vary per message go to Arrow
        (the constant ones are added by the writer), so a sealed batch holds about the payload bytes
        plus 36 bytes per message. The Arrow table shares the payload bytes: ``clear`` (or drop
        the buffer) before adding more."""
        n = len(self.lsn)
        if len(self.data) >= 1 << 31:
            raise ValueError("a stream batch holds at most 2 GiB of payload")
        wal = pa.table(
            {
                "lsn": pa.array(self.lsn, pa.int64()),
                "end_lsn": pa.array(self.end_lsn, pa.int64()),
                "xid": pa.array(self.xid, pa.int64()),
                "ordinal": pa.array(self.ordinal, pa.int64()),
                "payload": pa.Array.from_buffers(
                    pa.binary(),
                    n,
                    [None, pa.py_buffer(array("i", self.offsets)), pa.py_buffer(self.data)],
                ),
            }
        )
        now = datetime.now(UTC)
        others = self.others.to_arrow(batch_id, now) if len(self.others) else None
        return SealedBatch(self.source, self.run_id, batch_id, now, wal, others)


@dataclass(frozen=True)
class SealedBatch:
    """A stream batch ready to commit (see :meth:`WalBuffer.seal`)."""

    source: str
    run_id: str
    batch_id: int
    captured_at: datetime
    wal: pa.Table
    """``lsn, end_lsn, xid, ordinal, payload`` of each pgoutput message."""
    others: pa.Table | None
    """Other records (the batch's ``progress`` record), in :data:`ARROW_SCHEMA`."""

    @property
    def messages(self) -> int:
        return self.wal.num_rows

    def to_arrow(self) -> pa.Table:
        """The batch's bronze rows in :data:`ARROW_SCHEMA` (see :meth:`wal_arrow`)."""
        wal = self.wal_arrow()
        return wal if self.others is None else pa.concat_tables([wal, self.others])

    def wal_arrow(self) -> pa.Table:
        """The batch's wal messages in :data:`ARROW_SCHEMA`: the constant columns are repeated
        (Arrow's ``repeat``, one value and a length), the payloads shared, not copied."""
        n = self.messages
        constants = {
            "source": pa.repeat(self.source, n).cast(pa.string()),
            "kind": pa.repeat("wal", n).cast(pa.string()),
            "table_oid": pa.nulls(n, pa.int64()),
            "table_schema": pa.nulls(n, pa.string()),
            "table_name": pa.nulls(n, pa.string()),
            "part": pa.nulls(n, pa.int32()),
            "batch_id": pa.repeat(self.batch_id, n).cast(pa.int64()),
            "run_id": pa.repeat(self.run_id, n).cast(pa.string()),
            "captured_at": pa.repeat(pa.scalar(self.captured_at, pa.timestamp("us", tz="UTC")), n),
        }
        columns = {
            f.name: constants[f.name] if f.name in constants else self.wal.column(f.name)
            for f in ARROW_SCHEMA
        }
        return pa.table(columns, schema=ARROW_SCHEMA)


def copy_lines(payload: bytes) -> list[bytes]:
    """The COPY TEXT rows of a ``copy`` record's payload, without their newlines."""
    lines = bytes(payload).split(b"\n")
    if lines and not lines[-1]:
        lines.pop()
    return lines


def error_payload(code: str, message: str, lsn: str) -> bytes:
    """The JSON payload of an ``error`` record: the error's type, its one-line message, LSN."""
    return json_payload({"code": code, "message": message, "lsn": lsn})


def json_payload(obj) -> bytes:
    """Deterministic JSON for schema and error records (dataclasses become objects)."""

    def default(o):
        if hasattr(o, "__dataclass_fields__"):
            return asdict(o)
        raise TypeError(f"cannot encode {type(o).__name__}")

    return json.dumps(obj, default=default, sort_keys=True).encode()
