"""Many small tables of one run in a few Spark jobs: the batched path of :func:`silver.build`.

A run that touches many tables with a few changes each spent most of its time on per-table
Spark jobs (the cast's count, the key-range query, the identity resolution's Python job, the
append's collect: 0.15-0.35 s each, whatever the rows). Here the tables that qualify (below)
go through two jobs per :data:`core.packed.PARTS_PER_JOB` tables, and the rest of each table's
work is in the driver on a few rows:

    1. cast        one job: every table's changes cast by the plain expressions, packed
                   (``pgmedallion.core.packed``), collected as Arrow
    2. resolve     in the driver: previous images (``pgmedallion.silver.identity.resolve``, the same
                   function the Spark path runs in a Python task) against the table's rows of
                   earlier runs, read and summed by delta-rs; then the rewinds
    3. consolidate one job: the rows sent back packed, summed per (table, row, LSN) by
                   Spark's grouping, collected
    4. append      per table, through delta-rs, concurrently: the same commit (``txnAppId``,
                   ``txnVersion``) the per-table path makes, so a rerun skips it either way

What qualifies: a table with changes in the window and nothing else (no snapshot rows, no
truncate), whose silver table exists in a local directory, whose window holds at most
``[lakehouse] batch_changes`` changes, and whose types all have plain casts; and whose earlier
rows are few to read: none needed (no previous images to resolve), or at most
``[lakehouse] small_table_rows`` rows, or an identity key with an integer column (the earlier
rows are then read narrowed to the retracted keys' values of it). A table whose cast leaves a
row unsettled (a value that does not cast, or needs the full cast) goes back to the per-table
path, which writes what this path would and also records the errors; so does one whose silver
columns are not the run's (a new column: schema evolution is Spark's).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from pgmedallion.core import delta_rs, engine, packed
from pgmedallion.core.failpoints import failpoint
from pgmedallion.core.naming import quote
from pgmedallion.core.parallel import concurrently
from pgmedallion.silver.cast_columns import UNSETTLED_COLUMN, plain_cast
from pgmedallion.silver.cast_rows import ROW_DIFF, ROW_LSN, cast_base, typed_columns
from pgmedallion.silver.changes import PLAIN, RETRACT
from pgmedallion.silver.contract import DIFF, LSN, RUN, TableInfo
from pgmedallion.silver.errors import ErrorRecord
from pgmedallion.silver.identity import (
    COLUMNS,
    KIND,
    ORDINAL,
    Change,
    hashable,
    resolve,
    state_before,
)
from pgmedallion.silver.rewind import consolidated, with_rewinds

log = logging.getLogger(__name__)

_CAST_SHARED = (ROW_LSN, ROW_DIFF, ORDINAL, KIND, COLUMNS, UNSETTLED_COLUMN)
_SUM_SHARED = (LSN, DIFF, RUN)
_SUM_SCHEMA = T.StructType([T.StructField(LSN, T.LongType()), T.StructField(DIFF, T.LongType())])


class TooLarge(Exception):
    """More earlier rows to read than the driver takes: the per-table path runs the table."""


@dataclass
class Candidate:
    info: TableInfo
    wal: DataFrame
    """The table's decoded changes of the window (``DIFF_SCHEMA``)."""
    path: str
    keys: tuple[int, ...] | None
    """Its identity's key positions, when its changes need previous images."""


@dataclass
class Outcome:
    rows: int | None
    """Rows appended; None when the commit was made before (a rerun)."""
    errors: list[ErrorRecord]


_INTEGER_TYPES = {20, 21, 23}  # int8, int2, int4


def _narrowing_keys(info: TableInfo, keys: tuple[int, ...]) -> list[int]:
    """The positions among ``keys`` of integer columns (domains over them included)."""
    columns = info.columns
    return [
        p
        for p in keys
        if (columns[p].get("base_type_oid") or columns[p]["type_oid"]) in _INTEGER_TYPES
    ]


def qualifies(
    info: TableInfo, path: str | None, changes: int, keys: tuple[int, ...] | None
) -> bool:
    """Whether the table may take this path (the cast's own test comes later). ``keys``: its
    identity's key positions when its changes need previous images."""
    if changes > engine.current().batch_changes or not delta_rs.usable(path):
        return False
    columns = [*(c["name"] for c in info.columns), "_lsn", "_diff", "_run"]
    if keys is None or _narrowing_keys(info, keys):
        return delta_rs.has_columns(path, columns)  # no earlier row is read, or few are
    return delta_rs.small(path, columns)


def run_batched(
    spark: SparkSession,
    candidates: list[Candidate],
    run: int,
    app: str,
) -> tuple[dict[int, Outcome], list[int]]:
    """The candidates' runs: outcomes by table oid, and the oids left to the per-table path."""
    cast: list[tuple[Candidate, DataFrame]] = []
    rest: list[int] = []
    for cand in candidates:
        staged = plain_cast(cast_base(cand.wal, changes=True), "values", typed_columns(cand.info))
        if staged is None:
            rest.append(cand.info.oid)
            continue
        names = [c["name"] for c in cand.info.columns]
        columns = [F.col(quote(n)) for n in names] + [F.col(c) for c in _CAST_SHARED]
        cast.append((cand, staged.select(*columns)))
    if not cast:
        return {}, rest
    collected = packed.collect([df for _, df in cast], _CAST_SHARED)
    ready: list[tuple[Candidate, pa.Table]] = []
    for (cand, _), rows in zip(cast, collected, strict=True):
        if pc.any(rows.column(UNSETTLED_COLUMN)).as_py():
            rest.append(cand.info.oid)
        else:
            ready.append((cand, rows))
    if not ready:
        return {}, rest

    def resolved(item: tuple[Candidate, pa.Table]) -> tuple[pa.Table, list[ErrorRecord]] | None:
        cand, rows = item
        try:
            return _resolved(cand, rows, run)
        except TooLarge as reason:
            log.info("%s: run alone (%s)", cand.info.qualified_name, reason)
            return None
        except Exception as exc:  # e.g. a type DataFusion cannot group by: Spark can
            log.warning("%s: run alone (%s)", cand.info.qualified_name, exc)
            return None

    outcomes = concurrently(resolved, ready, engine.current().workers)
    rest += [cand.info.oid for (cand, _), out in zip(ready, outcomes, strict=True) if out is None]
    ready = [item for item, out in zip(ready, outcomes, strict=True) if out is not None]
    results = [out for out in outcomes if out is not None]
    if not ready:
        return {}, rest
    cast_schemas = {cand.info.oid: _data_schema(df, cand) for cand, df in cast}
    schemas = [cast_schemas[cand.info.oid] for cand, _ in ready]
    summed: list[pa.Table] = []
    for group in packed.chunks(list(range(len(ready)))):
        frame = packed.frame(
            spark,
            [results[i][0] for i in group],
            [schemas[i] for i in group],
            _SUM_SCHEMA,
        )
        # The rewinds and the consolidation are silver.rewind's, applied to the packed
        # frame: each part's snapshot LSN, and each part grouped by its own columns.
        data = [F.col(packed.PART), *[F.col(s) for s in packed.packed_columns(len(group))]]
        snapshots = [(n, ready[i][0].info.snapshot_lsn) for n, i in enumerate(group)]
        snapshot_lsn = None
        for n, lsn in snapshots:
            if lsn is not None:
                base = F if snapshot_lsn is None else snapshot_lsn
                snapshot_lsn = base.when(F.col(packed.PART) == n, F.lit(lsn).cast("bigint"))
        rows = with_rewinds(frame, frame, data, LSN, DIFF, snapshot_lsn)
        grouped = consolidated(rows, data, run)
        summed += packed.unpack(grouped.coalesce(2).toArrow(), len(group), _SUM_SHARED)

    def commit(i: int) -> tuple[int, Outcome | None]:
        cand, _ = ready[i]
        rows = summed[i]
        table = delta_rs.open_table(cand.path)
        if not delta_rs.conforms(table, rows.column_names):
            return cand.info.oid, None
        if delta_rs.done(table, app, run):  # a rerun: the crashed attempt made this commit
            return cand.info.oid, Outcome(None, results[i][1])
        failpoint("silver.before_append")
        delta_rs.append(cand.path, delta_rs.in_table_order(table, rows), app, run)
        failpoint("silver.after_append")
        return cand.info.oid, Outcome(rows.num_rows, results[i][1])

    outcomes: dict[int, Outcome] = {}
    for oid, outcome in concurrently(commit, list(range(len(ready))), engine.current().workers):
        if outcome is None:
            rest.append(oid)
        else:
            outcomes[oid] = outcome
    log.info("silver run %d: %d tables batched, %d per table", run, len(outcomes), len(rest))
    return outcomes, rest


def _data_schema(df: DataFrame, cand: Candidate) -> T.StructType:
    names = {c["name"] for c in cand.info.columns}
    return T.StructType([f for f in df.schema.fields if f.name in names])


def _resolved(cand: Candidate, rows: pa.Table, run: int) -> tuple[pa.Table, list[ErrorRecord]]:
    """A table's cast rows -> its rows with previous images resolved (``data..., _lsn,
    _diff``; the rewinds and the consolidation come after, packed), and the changes that did
    not resolve."""
    info = cand.info
    names = [c["name"] for c in info.columns]
    data = rows.select(names)
    errors: list[ErrorRecord] = []
    if cand.keys is None:
        out = pa.Table.from_arrays(
            [*data.columns, rows.column(ROW_LSN), rows.column(ROW_DIFF)],
            names=[*names, "_lsn", "_diff"],
        )
    else:
        out, unresolved = _resolve(cand, rows, names, run)
        errors = [ErrorRecord(info.oid, e.lsn, e.code, e.message) for e in unresolved]
    return out, errors


def _resolve(cand: Candidate, rows: pa.Table, names: list[str], run: int):
    """:func:`pgmedallion.silver.identity.resolve_previous_images` on the driver: whole rows for the
    ``RETRACT`` and ``FILL`` changes above the snapshot LSN, the state before the run read from
    the table's rows of earlier runs."""
    keys = cand.keys
    floor = -1 if cand.info.snapshot_lsn is None else cand.info.snapshot_lsn
    records = rows.to_pylist()
    changes, whole = [], []
    for r in records:
        values = [r[n] for n in names]
        kind = r[KIND]
        if kind is None or kind == PLAIN:
            whole.append((values, r[ROW_LSN], r[ROW_DIFF]))
        if kind is not None and r[ROW_LSN] > floor:
            changes.append(
                Change(r[ROW_LSN], r[ORDINAL], r[ROW_DIFF], kind, tuple(r[COLUMNS] or ()), values)
            )
    wanted = {
        tuple(hashable(c.values[p]) for p in keys)
        for c in changes
        if c.kind == RETRACT and all(c.values[p] is not None for p in keys)
    }
    narrowed = {
        names[p]: pa.array([w[i] for w in wanted], rows.schema.field(names[p]).type)
        for i, p in enumerate(keys)
        if pa.types.is_integer(rows.schema.field(names[p]).type)
    }
    base = [
        values
        for values in _prior_rows(cand.path, names, run, narrowed)
        if all(values[p] is not None for p in keys)
        and tuple(hashable(values[p]) for p in keys) in wanted
    ]
    out, unresolved = resolve(base, changes, keys)
    schema = pa.schema(
        [rows.schema.field(n) for n in names]
        + [pa.field("_lsn", pa.int64()), pa.field("_diff", pa.int64())]
    )
    table = pa.Table.from_pylist(
        [{**dict(zip(names, v, strict=True)), "_lsn": lsn, "_diff": d} for v, lsn, d in whole]
        + [
            {**dict(zip(names, o.values, strict=True)), "_lsn": o.lsn, "_diff": o.diff} for o in out
        ],
        schema=schema,
    )
    return table, unresolved


def _prior_rows(path: str, names: list[str], run: int, narrowed: dict[str, pa.Array]) -> list[list]:
    """The table's state before run ``run`` (:func:`pgmedallion.silver.identity.state_before`
    of its rows of earlier runs, read by delta-rs), of the rows whose integer key columns hold
    the ``narrowed`` values (and maybe others; all rows when it is empty)."""
    where = f"{RUN} < {int(run)}"
    parts = delta_rs.narrowings(narrowed) if narrowed else ["TRUE"]
    found = delta_rs.count_narrowed(path, where, parts)
    if found > delta_rs.small_rows():
        raise TooLarge(f"{found} earlier rows to read")
    earlier = delta_rs.read_narrowed(path, [*names, LSN, DIFF], where, parts)
    return [[r[n] for n in names] for r in state_before(earlier, names).to_pylist()]
