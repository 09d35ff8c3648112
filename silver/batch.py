"""Tables with a few changes each, run in the driver: the batched path of :func:`silver.build`.

A run that touches many tables with a few changes each spent most of its time on per-table
Spark jobs (the cast's count, the key-range query, the identity resolution's Python job, the
append's collect: 0.15-0.35 s each, whatever the rows). Here the tables that qualify (below)
are run in the driver on a few rows, and need no Spark when the window was read there
(:mod:`silver.window`):

    1. cast        each column's kernel (``pgmedallion.silver.kernel``) over each table's
                   changes: typed values, or an error record for a value that does not cast
                   (its row is not a diff); for a window Spark holds, one Spark job per
                   :data:`core.packed.PARTS_PER_JOB` tables (the plain expressions, packed,
                   collected as Arrow)
    2. resolve     previous images (``pgmedallion.silver.identity.resolve``, the same function
                   the Spark path runs in a Python task) against the table's rows of earlier
                   runs, read and summed by delta-rs
    3. consolidate summed per (row, LSN): ``silver.rewind.consolidated_rows``
    4. append      per table, through delta-rs, concurrently: the same commit (``txnAppId``,
                   ``txnVersion``) the per-table path makes, so a rerun skips it either way

What qualifies: a table with changes in the window and nothing else (no snapshot rows, no
truncate), whose silver table exists in a local directory, whose window holds at most
``[lakehouse] batch_changes`` changes; and whose earlier rows are few to read: none needed (no
previous images to resolve), or at most ``[lakehouse] small_table_rows`` rows, or an identity
key with an integer column (the earlier rows are then read narrowed to the retracted keys'
values of it). A table whose Spark cast leaves a row unsettled, or with a change at or below
its snapshot LSN (a rewind), goes back to the per-table path, which writes what this path
would and also records the errors and the rewinds; so does one whose silver columns are not the
run's (a new column: schema evolution is Spark's).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pgmedallion.core import deletion_vectors, delta_rs, engine, packed
from pgmedallion.core.failpoints import failpoint
from pgmedallion.core.naming import quote
from pgmedallion.core.parallel import concurrently
from pgmedallion.core.sparkapi import F
from pgmedallion.silver.cast_columns import UNSETTLED_COLUMN, plain_cast
from pgmedallion.silver.cast_rows import ROW_DIFF, ROW_LSN, cast_base, typed_columns
from pgmedallion.silver.changes import PLAIN, RETRACT
from pgmedallion.silver.contract import DIFF, LSN, RUN, TableInfo
from pgmedallion.silver.errors import CastError, ErrorRecord
from pgmedallion.silver.identity import (
    COLUMNS,
    KIND,
    ORDINAL,
    Change,
    hashable,
    resolve,
    state_before,
)
from pgmedallion.silver.kernel import cast_rows
from pgmedallion.silver.rewind import consolidated_rows
from pgmedallion.silver.write import diffs_app

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

_CAST_SHARED = (ROW_LSN, ROW_DIFF, ORDINAL, KIND, COLUMNS, UNSETTLED_COLUMN)


class TooLarge(Exception):
    """More earlier rows to read than the driver takes: the per-table path runs the table."""


@dataclass
class Candidate:
    info: TableInfo
    wal: Callable[[], DataFrame]
    """The table's decoded changes of the window (``CHANGE_ARROW``), as Spark's."""
    rows: pa.Table | None
    """The same in the driver (``CHANGE_ARROW``), when the window was read there."""
    path: str
    keys: tuple[int, ...] | None
    """Its identity's key positions, when its changes need previous images."""


@dataclass
class Outcome:
    rows: int | None
    """Rows appended; None when the commit was made before (a rerun)."""
    errors: list[ErrorRecord]
    adjusted: list[tuple] = field(default_factory=list)
    """``(column, code, count, first_lsn, sample)``: values a declared rule adjusted."""


@dataclass
class DriverCast:
    """A candidate's changes cast in the driver: the rows that cast (``_CAST_SHARED`` after
    the data columns, none unsettled), an error per value that did not (its row is not a
    diff), and the adjustments."""

    rows: pa.Table
    errors: list[ErrorRecord]
    adjusted: list[tuple]


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
    source: str,
) -> tuple[dict[int, Outcome], list[int]]:
    """The candidates' runs: outcomes by table oid, and the oids left to the per-table path.

    Each table's one commit holds all of its rows of the run and stands for both of the
    per-table path's commits (``write.diffs_app``: its settled and its unsettled rows), so a
    redo on that path finds nothing left to do. A redo here of a run whose per-table attempt
    made only its first commit goes to the per-table path, which decides what is left."""
    app, app_unsettled = diffs_app(source), diffs_app(source, unsettled=True)
    ready: list[tuple[Candidate, pa.Table]] = []
    rest: list[int] = []
    in_spark: list[Candidate] = []
    cast_out: dict[int, DriverCast] = {}
    for cand in candidates:
        if cand.rows is None:
            in_spark.append(cand)
            continue
        cast = _cast_in_driver(cand)
        cast_out[cand.info.oid] = cast
        ready.append((cand, cast.rows))
    ready += _cast_in_spark(in_spark, rest)
    ready = [(cand, rows) for cand, rows in ready if _settled(cand, rows, rest)]
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

    def commit(i: int) -> tuple[int, Outcome | None]:
        cand, _ = ready[i]
        oid = cand.info.oid
        names = [c["name"] for c in cand.info.columns]
        rows = consolidated_rows(results[i][0], names, run)
        table = delta_rs.open_table(cand.path)
        if not delta_rs.conforms(table, rows.column_names):
            return oid, None
        cast = cast_out.get(oid)
        errors = results[i][1] + (cast.errors if cast else [])
        adjusted = cast.adjusted if cast else []
        if delta_rs.done(table, app, run):  # a rerun: the crashed attempt made this commit
            if not delta_rs.done(table, app_unsettled, run):
                return oid, None  # the per-table path's first commit: it decides the rest
            return oid, Outcome(None, errors, adjusted)
        rows = _conformed(cand.path, delta_rs.in_table_order(table, rows))
        failpoint("silver.before_append")
        delta_rs.append(cand.path, rows, app, run, also=[app_unsettled])
        failpoint("silver.after_append")
        return oid, Outcome(rows.num_rows, errors, adjusted)

    done: dict[int, Outcome] = {}
    for oid, outcome in concurrently(commit, list(range(len(ready))), engine.current().workers):
        if outcome is None:
            rest.append(oid)
        else:
            done[oid] = outcome
    log.info("silver run %d: %d tables batched, %d per table", run, len(done), len(rest))
    return done, rest


def _settled(cand: Candidate, rows: pa.Table, rest: list[int]) -> bool:
    """Whether the table's cast rows are all settled and need no rewind (its changes are all
    above its snapshot LSN); else it goes to ``rest``, the per-table path, which casts in full
    (with the errors) and rewinds (``silver.rewind``)."""
    floor = cand.info.newest_snapshot_lsn
    rewound = floor is not None and rows.num_rows and pc.min(rows.column(ROW_LSN)).as_py() <= floor
    if pc.any(rows.column(UNSETTLED_COLUMN)).as_py() or rewound:
        rest.append(cand.info.oid)
        return False
    return True


def _cast_in_driver(cand: Candidate) -> DriverCast:
    """The candidate's changes cast by each column's kernel (:mod:`silver.kernel`), as
    ``_cast_in_spark`` gives them, without the rows that did not cast (their errors instead)."""
    rows = cand.rows
    columns = typed_columns(cand.info)
    cast = cast_rows(rows.column("values"), columns)
    names = [name for name, _ in columns]
    shared = [
        rows.column("lsn"),
        rows.column("diff"),
        rows.column("ordinal"),
        rows.column("kind"),
        rows.column("columns"),
        pa.array(np.zeros(rows.num_rows, bool)),
    ]
    table = pa.Table.from_arrays([*cast.columns, *shared], names=[*names, *_CAST_SHARED])
    lsns = rows.column("lsn").to_numpy()
    errors = [
        ErrorRecord(cand.info.oid, int(lsns[row]), CastError.__name__, message, column, raw)
        for row, column, raw, message in cast.errors
    ]
    adjusted = cast.adjustments(lsns)
    if cast.failed.any():
        table = table.filter(pa.array(~cast.failed))
    return DriverCast(table, errors, adjusted)


def _cast_in_spark(
    candidates: list[Candidate], rest: list[int]
) -> list[tuple[Candidate, pa.Table]]:
    """The candidates' changes cast by Spark's plain cast in one job per
    :data:`pgmedallion.core.packed.PARTS_PER_JOB` tables, collected; a table with a type that
    has no plain cast goes to ``rest``."""
    cast: list[tuple[Candidate, DataFrame]] = []
    for cand in candidates:
        staged = plain_cast(cast_base(cand.wal(), changes=True), "values", typed_columns(cand.info))
        if staged is None:
            rest.append(cand.info.oid)
            continue
        names = [c["name"] for c in cand.info.columns]
        columns = [F.col(quote(n)) for n in names] + [F.col(c) for c in _CAST_SHARED]
        cast.append((cand, staged.select(*columns)))
    if not cast:
        return []
    collected = packed.collect([df for _, df in cast], _CAST_SHARED)
    return [(cand, rows) for (cand, _), rows in zip(cast, collected, strict=True)]


def _conformed(path: str, rows: pa.Table) -> pa.Table:
    """``rows`` in the Arrow types delta-rs reads the table at ``path`` in (the driver's
    cast and Spark's collect may give other widths or time zones of the same values)."""
    types = delta_rs.read_arrow(path, rows.column_names, "FALSE").schema
    return pa.table(
        [rows.column(f.name).cast(f.type) for f in types], schema=types.remove_metadata()
    )


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
    the table's rows of earlier runs.

    The earlier rows of the retracted keys are read (Arrow, in threads of its own) while the
    changes are made Python rows for the rule; the rows that are whole already stay Arrow."""
    keys = cand.keys
    floor = -1 if cand.info.snapshot_lsn is None else cand.info.snapshot_lsn
    kind = rows.column(KIND)
    changed = pc.and_(pc.is_valid(kind), pc.greater(rows.column(ROW_LSN), floor))
    retracted = pc.and_(changed, pc.equal(kind, RETRACT))
    for p in keys:
        retracted = pc.and_(retracted, pc.is_valid(rows.column(names[p])))
    key = rows.filter(retracted).select([names[p] for p in keys])
    with ThreadPoolExecutor(max_workers=1) as pool:
        prior = pool.submit(_prior_rows, cand.path, names, run, key)
        picked = rows.filter(changed)
        # column by column: a dict per row of 80,000 changes cost more than resolving them
        data = [picked.column(n).to_pylist() for n in names]
        lsns, diffs = picked.column(ROW_LSN).to_pylist(), picked.column(ROW_DIFF).to_pylist()
        kinds, ordinals = picked.column(KIND).to_pylist(), picked.column(ORDINAL).to_pylist()
        touched = picked.column(COLUMNS).to_pylist()
        changes = [
            Change(lsns[i], ordinals[i], diffs[i], kinds[i], tuple(touched[i] or ()), values)
            for i, values in enumerate(map(list, zip(*data, strict=True)) if names else ())
        ]
        wanted = {
            tuple(hashable(c.values[p]) for p in keys)
            for c in changes
            if c.kind == RETRACT and all(c.values[p] is not None for p in keys)
        }
        earlier = prior.result()
    base = [
        values
        for values in earlier
        if all(values[p] is not None for p in keys)
        and tuple(hashable(values[p]) for p in keys) in wanted
    ]
    out, unresolved = resolve(base, changes, keys)
    schema = pa.schema(
        [rows.schema.field(n) for n in names]
        + [pa.field("_lsn", pa.int64()), pa.field("_diff", pa.int64())]
    )
    whole = rows.filter(pc.fill_null(pc.equal(kind, PLAIN), True)) if names else rows.slice(0, 0)
    whole = pa.Table.from_arrays(
        [
            *(whole.column(n) for n in names),
            whole.column(ROW_LSN).cast(pa.int64()),
            whole.column(ROW_DIFF).cast(pa.int64()),
        ],
        schema=schema,
    )
    columns = [[o.values[p] for o in out] for p in range(len(names))]
    columns += [[o.lsn for o in out], [o.diff for o in out]]
    arrays = [pa.array(c, f.type) for c, f in zip(columns, schema, strict=True)]
    return pa.concat_tables([whole, pa.Table.from_arrays(arrays, schema=schema)]), unresolved


def _prior_rows(path: str, names: list[str], run: int, key: pa.Table) -> list[list]:
    """The table's state before run ``run`` (:func:`pgmedallion.silver.identity.state_before`
    of its rows of earlier runs, read by delta-rs), of the rows whose key columns hold one of
    ``key``'s rows (and maybe others): found file by file by the key's values
    (``deletion_vectors.locate``), or read narrowed by its integer columns' values."""
    most = engine.current().driver_rows  # bounded by the retracted keys, not the table's size
    try:
        located = deletion_vectors.locate(path, key, [*names, LSN, DIFF, RUN], most)
    except deletion_vectors.Unsupported as reason:
        log.debug("%s: earlier rows by narrowed reads (%s)", path, reason)
        narrowed = {
            n: key.column(n)
            for n in key.column_names
            if pa.types.is_integer(key.schema.field(n).type)
        }
        parts = delta_rs.narrowings(narrowed) if narrowed else ["TRUE"]
        earlier = delta_rs.read_at_most(
            path, [*names, LSN, DIFF], f"{RUN} < {int(run)}", parts, most
        )
    else:
        earlier = None
        if located is not None:
            rows = located.rows
            earlier = rows.filter(pc.less(rows.column(RUN), int(run))).drop_columns([RUN])
    if earlier is None:
        raise TooLarge(f"more than {most} earlier rows to read")
    state = state_before(earlier, names)
    return [list(r) for r in zip(*(state.column(n).to_pylist() for n in names), strict=True)]
