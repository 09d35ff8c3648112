r"""A table's first snapshot in the driver: COPY rows decoded, cast and consolidated over Arrow,
appended by delta-rs.

A first load spends most of its time in Spark's jobs over the snapshot's rows (decode, cast,
consolidation, write: 26 s of a 34 s run at 1M rows), where the same work over Arrow takes
about 5 s. Here a table whose silver table does not exist yet, and whose run brings its
snapshot's COPY rows and nothing else, takes that path:

    read         delta-rs: the table's ``copy`` records of the run's batch window
    decode       lines split on newlines, fields on tabs, ``\N`` is NULL; a line with another
                 escape is decoded by the reference decoder (``capture.copy_text.decode_copy_row``)
    cast         every column's kernel (``silver.kernel``): typed values, or an error record
    consolidate  ``silver.rewind.consolidated_rows`` (every row at LSN 0, +1)
    create       the silver table, by Spark (its catalog entry)
    append       delta-rs, one idempotent commit that stands for both of the per-table path's
                 (its settled and its unsettled rows)

Anything else goes the per-table path before anything is written: a table with changes,
truncates or columns added since the snapshot in the run, a line that is not valid COPY TEXT
or has the wrong number of fields (its error record is the per-table path's), more rows than
``[lakehouse] driver_rows``, a bronze or silver that is not local. A run that crashed after
the append is redone by the per-table path, which finds the table and rebuilds it from the
snapshot.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pgmedallion.core import delta_rs, engine
from pgmedallion.core.failpoints import failpoint
from pgmedallion.core.parallel import concurrently
from pgmedallion.silver.cast_rows import typed_columns
from pgmedallion.silver.contract import TableInfo
from pgmedallion.silver.copy_arrow import copy_columns
from pgmedallion.silver.errors import CastError, ErrorRecord
from pgmedallion.silver.kernel import Rows, cast_columns, merged_adjustments
from pgmedallion.silver.pgtypes import arrow_type
from pgmedallion.silver.rewind import consolidated_rows, distinct_snapshot
from pgmedallion.silver.write import create_diff_table, diffs_app

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)


def _halves(payloads: pa.Array) -> list[pa.Array]:
    """``payloads`` in two runs of whole payloads of about half the bytes each (the decode and
    cast of each are Arrow kernels, which release the GIL: two threads take two cores)."""
    if len(payloads) < 2:
        return [payloads]
    sizes = np.cumsum(pc.fill_null(pc.binary_length(payloads), 0).to_numpy(zero_copy_only=False))
    cut = int(np.searchsorted(sizes, sizes[-1] / 2)) + 1
    cut = min(max(cut, 1), len(payloads) - 1)
    return [payloads.slice(0, cut), payloads.slice(cut)]


def _typed(payloads: pa.Array, width: int, columns) -> Rows | None:
    """The rows of ``payloads`` decoded (:func:`copy_columns`) and cast
    (``silver.kernel.cast_columns``); None when a line needs the per-table path."""
    texts = copy_columns(payloads, width)
    if texts is None:
        return None
    return cast_columns(texts, columns)


@dataclass
class FirstLoad:
    rows: int
    """Rows appended."""
    errors: list[ErrorRecord]
    """A ``CastError`` per value that does not cast (its row is not a diff)."""
    adjusted: list[tuple]
    """``(column, code, count, first_lsn, sample)``: values a declared rule adjusted."""


def diff_schema(info: TableInfo) -> pa.Schema:
    """The silver table's columns as the per-table path creates them."""
    return pa.schema(
        [
            *(pa.field(name, arrow_type(t)) for name, t in typed_columns(info)),
            pa.field("_lsn", pa.int64()),
            pa.field("_diff", pa.int64()),
            pa.field("_run", pa.int64(), nullable=False),
        ]
    )


def first_snapshot(
    spark: SparkSession,
    info: TableInfo,
    bronze: str | None,
    where: str,
    target: str,
    path: str | None,
    width: int,
    source: str,
    run: int,
    silver: str,
) -> FirstLoad | None:
    """The table's first snapshot appended to a new silver table ``target`` (at ``path``, in
    schema ``silver``) from bronze's ``copy`` records at ``bronze`` matching ``where``: the
    rows appended, with the errors and adjustments of its values; None when the per-table path
    must take it (nothing was written).

    The one commit holds every row of the snapshot, and stands for both of the per-table
    path's commits of the run (its settled and its unsettled rows, ``write.diffs_app``).

    The snapshot goes through in pieces of at most a quarter of ``driver_rows`` rows (ranges
    of each COPY part's record ordinals), each decoded, cast and handed to delta-rs' writer
    before the next is read, so the driver holds one piece whatever the table's size: a
    snapshot of a table with a primary key has distinct rows, and each piece is consolidated
    alone. A table without one is consolidated whole, so it takes this path only up to
    ``driver_rows`` rows."""
    columns = typed_columns(info)
    if not (delta_rs.usable(bronze) and path is not None) or len(columns) != width:
        return None
    names = [name for name, _ in columns]
    distinct = distinct_snapshot(info.primary_key, names)
    most = engine.current().driver_rows
    sql = f"SELECT part, max(ordinal) AS n FROM t WHERE {where} GROUP BY part"
    counted = delta_rs.query(bronze, sql).to_pylist()
    if any(c["n"] is None or c["part"] is None for c in counted):
        return None  # records the pieces' ranges would not tell apart
    total = sum(c["n"] for c in counted)
    if total > most and not distinct:
        return None
    pieces = _pieces(counted, max(most // 4, 1) if distinct else max(total, 1))
    errors: list[ErrorRecord] = []
    adjusted: list[list[tuple]] = []
    appended = lines = 0

    def piece_rows(piece: str) -> pa.Table:
        nonlocal appended, lines
        read = delta_rs.read_arrow(bronze, ["payload"], f"({where}) AND {piece}")
        payloads = read.column("payload").combine_chunks()
        parts = concurrently(
            lambda part: _typed(part, width, columns), _halves(payloads), engine.current().workers
        )
        if any(part is None for part in parts):
            raise _PerTable
        errors.extend(
            ErrorRecord(info.oid, 0, CastError.__name__, message, column, raw)
            for part in parts
            for _, column, raw, message in part.errors
        )
        adjusted.extend(part.adjustments(np.zeros(len(part.failed))) for part in parts)
        kept = [pa.array(~part.failed) for part in parts]
        typed = [
            pa.chunked_array(
                [part.columns[i].filter(k) for part, k in zip(parts, kept, strict=True)]
            )
            for i in range(len(columns))
        ]
        rows = sum(int((~part.failed).sum()) for part in parts)
        lines += sum(len(part.failed) for part in parts)
        table = pa.Table.from_arrays(
            [*typed, pa.array(np.zeros(rows, np.int64)), pa.array(np.ones(rows, np.int64))],
            names=[*names, "_lsn", "_diff"],
        )
        out = consolidated_rows(table, names, run, distinct=distinct)
        appended += out.num_rows
        return out

    try:
        ready = [piece_rows(pieces[0])]  # the first piece before the table is made
    except _PerTable:
        return None
    create_diff_table(
        spark, target, diff_schema(info), info.primary_key, local=(silver, info.silver_table)
    )
    dt = delta_rs.open_table(path)
    app = diffs_app(source)
    if delta_rs.done(dt, app, run):
        return None  # cannot be: a new table; the per-table path decides
    types = delta_rs.read_arrow(path, [*names, "_lsn", "_diff", "_run"], "FALSE").schema

    def rows():
        yield ready.pop()
        for piece in pieces[1:]:
            yield piece_rows(piece)
        if lines != total:  # every line of the snapshot in exactly one piece, or nothing
            raise _PerTable

    failpoint("silver.before_append")
    try:
        delta_rs.append_pieces(
            path, types, rows(), app, run, also=[diffs_app(source, unsettled=True)]
        )
    except _PerTable:
        return None  # nothing was committed
    failpoint("silver.after_append")
    log.info(
        "silver: %s: snapshot of %d rows read in the driver%s",
        info.qualified_name,
        appended,
        f" ({len(pieces)} pieces)" if len(pieces) > 1 else "",
    )
    return FirstLoad(appended, errors, merged_adjustments(adjusted))


class _PerTable(Exception):
    """A line of the snapshot needs the per-table path (nothing is committed)."""


def _pieces(counted: list[dict], most: int) -> list[str]:
    """Predicates (SQL over bronze's ``part`` and ``ordinal``) that split a snapshot whose COPY
    parts hold ``counted`` rows (``part``, ``n``: its greatest ordinal) into pieces of about
    ``most`` rows each; one piece that takes everything when it fits."""
    if sum(c["n"] or 0 for c in counted) <= most:
        return ["TRUE"]
    out = []
    for c in sorted(counted, key=lambda c: c["part"]):
        n, part = c["n"] or 0, int(c["part"])
        for low in range(0, max(n, 1), most):
            high = "" if low + most >= n else f" AND ordinal <= {low + most}"
            out.append(f"(part = {part} AND ordinal > {low}{high})")
    return out
