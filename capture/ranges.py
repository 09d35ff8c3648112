"""A large keyed table's snapshot in key ranges, each landed on its own: a snapshot that resumes.

A table whose primary key is one column of an integer type or ``uuid``, and whose heap is
larger than two ranges (``[source] snapshot_range_mb``), is read in ranges of that key instead
of ctid ranges: ``key >= lo AND key < hi`` for boundaries sampled once, at the first attempt
(:func:`sample_bounds`). Each range lands in bronze in a commit of its own (with the other
ranges of its wave, one per worker), with a ``range`` record naming the range, the boundaries
and the snapshot LSN it was read at. A run that stops half way (killed, a lost connection)
keeps the ranges it landed; the next attempt reads only the others, at its own snapshot
(:func:`resume_plan`). Once every range has landed, one ``rewind`` record for the table names
each range's LSN and batch, and silver takes the table from there.

Why that is exact. A range read at LSN ``L`` holds its keys' rows as of ``L``. Silver reads the
table's changes from the oldest range's LSN on and applies the rule of every snapshot per key:
a change to key ``k`` at LSN ``x`` is already in the snapshot, so it is rewound, iff ``x <=
L(range(k))`` (``silver.rewind.snapshot_floor``). An update that moves a row across a boundary
is a retraction judged by the old key's range and an insertion judged by the new one's.

Why only these keys. Silver decides which range a key is in, outside PostgreSQL, so it must
order keys as PostgreSQL does: integers and ``uuid`` (bytewise, as their canonical text sorts)
are ordered the same everywhere; ``text`` under a collation, composite keys and tables without a
key are not, and restart their snapshot (read in ctid ranges, landed in one commit). So does a
table under REPLICA IDENTITY USING INDEX: a change's old row may carry that index's columns
only, not the key that names its range.

A range landed earlier is kept while the table's schema (its landed columns, key, catalog
fingerprint and leaf partitions) is the one it was read with, its boundaries are the plan's,
and bronze recorded no gap after it (``resync --all`` after a lost slot): anything else starts
the table over.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from pgmedallion.bronze.table import json_payload
from pgmedallion.capture.errors import server_errors
from pgmedallion.capture.snapshot import Column, TableSchema

INTEGER_TYPES = {20: "int8", 21: "int2", 23: "int4"}
UUID_TYPE = 2950
RANGE_KEY_TYPES = {**INTEGER_TYPES, UUID_TYPE: "uuid"}
"""Key types whose order is the same in PostgreSQL, Arrow and Spark (by base type OID)."""

MAX_RANGES = 512
SAMPLE_ROWS = 20_000
"""About how many keys :func:`sample_bounds` reads to place the boundaries."""

Bound = int | str


@dataclass(frozen=True)
class RangePlan:
    """How one table's snapshot is read: ``bounds`` split the key into ``len(bounds) + 1``
    ranges (range ``i`` holds ``bounds[i-1] <= key < bounds[i]``), and ``landed`` maps the
    ranges landed by earlier attempts to ``(snapshot LSN, batch id)``."""

    key: str
    type_oid: int
    bounds: tuple[Bound, ...]
    fingerprint: str
    landed: Mapping[int, tuple[int, int]]

    @property
    def count(self) -> int:
        return len(self.bounds) + 1

    def todo(self) -> list[int]:
        return [i for i in range(self.count) if i not in self.landed]

    def limits(self, index: int) -> tuple[Bound | None, Bound | None]:
        lo = None if index == 0 else self.bounds[index - 1]
        hi = None if index == len(self.bounds) else self.bounds[index]
        return lo, hi

    def record(self) -> dict[str, Any]:
        """The payload of each ``range`` record."""
        return {
            "key": self.key,
            "type_oid": self.type_oid,
            "bounds": list(self.bounds),
            "schema": self.fingerprint,
        }


def range_key(schema: TableSchema) -> Column | None:
    """The column a snapshot of ``schema`` (as it lands) may be read in key ranges of, or None."""
    if len(schema.primary_key) != 1 or schema.replica_identity not in ("d", "f"):
        return None  # (USING INDEX: a deleted row's old key may be another index's columns)
    (name,) = schema.primary_key
    for column in schema.columns:
        if column.name == name and not column.generated:
            return column if key_type(column) in RANGE_KEY_TYPES else None
    return None


def key_type(column: Column) -> int:
    return column.base_type_oid or column.type_oid


def range_count(heap_bytes: int, range_bytes: int) -> int:
    """How many key ranges a heap of ``heap_bytes`` is read in (1: not in key ranges)."""
    if range_bytes <= 0 or heap_bytes < 2 * range_bytes:
        return 1
    return min(MAX_RANGES, math.ceil(heap_bytes / range_bytes))


def fingerprint(schema: TableSchema) -> str:
    """What a range's rows depend on besides the key: the landed schema as recorded."""
    return hashlib.sha256(json_payload(schema)).hexdigest()[:32]


def sample_bounds(
    conn: psycopg.Connection, schema: TableSchema, key: Column, count: int, rows: int
) -> tuple[Bound, ...]:
    """``count - 1`` boundaries splitting the key into ranges of about as many rows, from a
    sample of about :data:`SAMPLE_ROWS` of the table's ``rows`` (estimated) keys, read in the
    snapshot ``conn`` is in. Fewer where the sample holds fewer distinct keys; none for an
    empty sample."""
    percent = min(100.0, max(0.01, 100.0 * SAMPLE_ROWS / max(rows, 1)))
    fractions = [i / count for i in range(1, count)]
    query = sql.SQL(
        "SELECT percentile_disc({fractions}::float8[]) WITHIN GROUP (ORDER BY {key})::text[]"
        " FROM {table} TABLESAMPLE SYSTEM ({percent})"
    ).format(
        fractions=sql.Literal(fractions),
        key=sql.Identifier(key.name),
        table=sql.Identifier(schema.schema, schema.name),
        percent=sql.Literal(percent),
    )
    with server_errors():
        (found,) = conn.execute(query).fetchone()
    parse = int if key_type(key) in INTEGER_TYPES else str
    return tuple(sorted({parse(v) for v in found or ()}))


def key_condition(key: str, type_oid: int, lo: Bound | None, hi: Bound | None) -> sql.Composed:
    """``key >= lo AND key < hi`` (either side left out where open)."""
    cast = sql.SQL(RANGE_KEY_TYPES[type_oid])
    parts = []
    if lo is not None:
        parts.append(sql.SQL("{} >= {}::{}").format(sql.Identifier(key), sql.Literal(lo), cast))
    if hi is not None:
        parts.append(sql.SQL("{} < {}::{}").format(sql.Identifier(key), sql.Literal(hi), cast))
    return sql.SQL(" AND ").join(parts) if parts else sql.SQL("true")


def resume_plan(
    landed: Sequence[Mapping[str, Any]], key: Column, fingerprint_now: str
) -> RangePlan | None:
    """The plan of an attempt that finds ``landed`` (the table's ``range`` records since its
    last snapshot or resync request and after bronze's last gap, oldest first: ``lsn``,
    ``batch_id``, ``part`` and the decoded ``payload``): the newest plan's boundaries and the
    ranges landed under it, when it was read with this key and schema; None to start the
    table over."""
    if not landed:
        return None
    newest = landed[-1]["payload"]  # an attempt that started over planned anew
    if newest.get("key") != key.name or newest.get("schema") != fingerprint_now:
        return None
    kept: dict[int, tuple[int, int]] = {}
    for record in landed:
        if record["payload"] == newest:  # (the ranges of an abandoned plan are not)
            kept.setdefault(int(record["part"]), (int(record["lsn"]), int(record["batch_id"])))
    return RangePlan(key.name, key_type(key), tuple(newest["bounds"]), fingerprint_now, kept)


def rewind_payload(plan: RangePlan, landed: Mapping[int, tuple[int, int]]) -> bytes:
    """The payload of the ``rewind`` record that completes a snapshot read in key ranges:
    the key, the boundaries and each range's ``[snapshot LSN, batch id]``, in range order
    (``silver.rewind.snapshot_floor`` reads it)."""
    return json.dumps(
        {
            "key": plan.key,
            "type_oid": plan.type_oid,
            "bounds": list(plan.bounds),
            "ranges": [list(landed[i]) for i in range(plan.count)],
        },
        sort_keys=True,
    ).encode()
