"""Rewinds, truncates and consolidation: pure DataFrame -> DataFrame steps of a table's diffs.

A table snapshotted at LSN ``s`` after its changes at or below ``s`` were read holds those
changes twice: once in the snapshot's rows (at LSN 0) and once as changes. The rewinds take
them out again: each such change once more, at LSN 0, with its diff negated. Rows here are
``data..., _lsn, _diff``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pgmedallion.core.multiset import group_ids, int_column, sum_by
from pgmedallion.core.naming import quote
from pgmedallion.core.sparkapi import F, T

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame


def snapshot_floor(
    snapshot_lsn: int | None, ranges: Mapping[str, Any] | None
) -> Column | int | None:
    """The snapshot LSN a change of the table is judged by: a change at or below it is in the
    snapshot already. One LSN for a snapshot read at one; for one read in key ranges
    (``capture.ranges``, ``ranges`` its ``rewind`` payload), the LSN of the range the row's
    key falls in, as a column (range ``i`` holds ``bounds[i-1] <= key < bounds[i]``: integers
    and uuids, whose order here is PostgreSQL's)."""
    if not ranges:
        return snapshot_lsn
    key, bounds = F.col(quote(ranges["key"])), ranges["bounds"]
    lsns = [int(lsn) for lsn, _ in ranges["ranges"]]
    floor = None
    for bound, lsn in zip(bounds, lsns, strict=False):
        floor = (F if floor is None else floor).when(key < F.lit(bound), F.lit(lsn))
    last = F.lit(lsns[-1])
    return last if floor is None else floor.otherwise(last)


def rewinds(changes: DataFrame, lsn: str, diff: str, snapshot_lsn: int | Column) -> DataFrame:
    """The rewinds of a snapshot at ``snapshot_lsn`` (an LSN, or a column of the LSN each row
    is judged by, :func:`snapshot_floor`): the rows of ``changes`` with ``lsn`` in ``(0,
    snapshot_lsn]``, at ``lsn`` 0 and with ``diff`` negated; other columns as they are."""
    rewound = changes.where((F.col(lsn) > 0) & (F.col(lsn) <= snapshot_lsn))
    return rewound.withColumns({lsn: F.lit(0).cast("bigint"), diff: -F.col(diff)})


def with_rewinds(
    rows: DataFrame, changes: DataFrame, data: Sequence[Column], lsn: str, diff: str, snapshot_lsn
) -> DataFrame:
    """``rows`` as ``data..., _lsn, _diff``, plus the rewinds of ``changes`` (the same rows, or
    the changes among them) when the table has a snapshot (``snapshot_lsn`` not None)."""
    out = rows.select(*data, F.col(lsn).alias("_lsn"), F.col(diff).alias("_diff"))
    if snapshot_lsn is None:
        return out
    back = rewinds(changes, lsn, diff, snapshot_lsn)
    return out.unionByName(
        back.select(*data, F.col(lsn).cast("bigint").alias("_lsn"), F.col(diff).alias("_diff"))
    )


def truncated(
    rows: DataFrame, data: Sequence[Column], truncates: Sequence[tuple[int, int]], earlier=None
) -> DataFrame:
    """``rows`` (``data..., _lsn, _diff``) with every row retracted at each truncate's LSN:
    the state below it (with ``earlier``, a table's rows of earlier runs) negated there."""
    out = rows
    for lsn, _ in sorted(truncates):
        before = out.where(F.col("_lsn") < lsn)
        if earlier is not None:
            before = before.unionByName(
                earlier.select(*data, "_lsn", "_diff").where(F.col("_lsn") < lsn)
            )
        state = before.groupBy(*data).agg(F.sum("_diff").alias("_diff")).where(F.col("_diff") > 0)
        out = out.unionByName(
            state.select(
                *data, F.lit(lsn).cast("bigint").alias("_lsn"), (-F.col("_diff")).alias("_diff")
            )
        )
    return out


def distinct_snapshot(primary_key: Sequence[str], names: Sequence[str]) -> bool:
    """Whether the rows of a table's snapshot (every one at LSN 0, +1) are distinct: the table
    has a primary key and silver holds all of its columns."""
    return bool(primary_key) and set(primary_key) <= set(names)


def consolidated(
    rows: DataFrame, data: Sequence[Column], run: int, *, distinct: bool = False
) -> DataFrame:
    """Diffs summed per (row, LSN), zeros dropped, stamped with the run. ``distinct``: no two
    rows are equal (the rows of a snapshot and nothing else, :func:`distinct_snapshot`), so no
    sum has more than one term and the grouping, a shuffle of every row, is left out; a float
    column's -0.0 is written 0.0 all the same, as the grouping writes it (and
    :func:`consolidated_rows`)."""
    if not distinct:
        return (
            rows.groupBy(*data, "_lsn")
            .agg(F.sum("_diff").alias("_diff"))
            .where(F.col("_diff") != 0)
            .withColumn("_run", F.lit(run).cast("bigint"))
        )
    out = []
    for f in rows.schema.fields:
        column = F.col(f"`{f.name.replace('`', '``')}`")
        if isinstance(f.dataType, T.FloatType | T.DoubleType):
            column = F.when(column == 0, F.lit(0).cast(f.dataType)).otherwise(column)
        out.append(column.alias(f.name))
    return (
        rows.select(*out).where(F.col("_diff") != 0).withColumn("_run", F.lit(run).cast("bigint"))
    )


def consolidated_rows(
    rows: pa.Table, data: Sequence[str], run: int, *, distinct: bool = False
) -> pa.Table:
    """:func:`consolidated` in the driver: ``data..., _lsn, _diff`` rows summed per (row, LSN)
    with rows equal as Spark's grouping calls them equal (``pgmedallion.core.multiset``), zeros
    dropped, stamped with the run (``data..., _lsn, _diff, _run``); a float column's -0.0
    written 0.0, as Spark's grouping writes it. ``distinct``: no two rows are equal (a
    snapshot of a table with a primary key), so no sum has more than one term."""
    if distinct:
        sums = int_column(rows, "_diff")
        out = rows.select([*data, "_lsn"])
    else:
        keys = [rows.column(n) for n in [*data, "_lsn"]]
        ids = group_ids(keys, rows.num_rows)
        groups, first = np.unique(ids, return_index=True)
        sums = sum_by(ids, len(groups), int_column(rows, "_diff"))
        out = rows.select([*data, "_lsn"]).take(pa.array(first, pa.int64()))
    for i, f in enumerate(out.schema):
        if pa.types.is_floating(f.type):  # Spark's grouping writes -0.0 as 0.0
            column = out.column(i)
            zero = pc.fill_null(pc.equal(column, pa.scalar(0, f.type)), False)
            out = out.set_column(i, f, pc.if_else(zero, pa.scalar(0, f.type), column))
    out = out.append_column("_diff", pa.array(sums, pa.int64()))
    out = out.append_column("_run", pa.array(np.full(len(sums), run, np.int64)))
    return out.filter(pa.array(sums != 0))
