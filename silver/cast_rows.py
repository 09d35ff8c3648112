"""Casting: one table's diff rows of a run -> typed rows, errors and adjustments.

The plain cast (:func:`silver.cast_columns.plain_cast`: the kernels of :mod:`silver.kernel` in
Spark's Python workers) settles almost every row. The rows it leaves out are the table's
*unsettled* rows (decode errors, values that do not
cast or that a declared rule adjusts); they are cast again with their error messages
(:func:`silver.cast_columns.cast_values`), and their adjustments counted.
:func:`cast_in_one_pass` casts in the job that writes the settled rows and the unsettled ones
afterwards; :func:`cast_diffs` casts all of them before anything is written.
"""

from __future__ import annotations

import dataclasses
import functools
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa

from pgmedallion.core import sparkapi
from pgmedallion.core.sparkapi import F
from pgmedallion.silver.cast_columns import (
    CAST_ERRORS_COLUMN,
    UNSETTLED_COLUMN,
    cast_values,
    plain_cast,
    plain_cast_batch,
)
from pgmedallion.silver.contract import TableInfo
from pgmedallion.silver.decode import TableDiffs, copy_parts
from pgmedallion.silver.errors import CastError, ErrorRecord
from pgmedallion.silver.identity import COLUMNS, KIND, ORDINAL
from pgmedallion.silver.kernel import adjustment, cast_rows, merged_adjustments
from pgmedallion.silver.pgtypes import PgType, pg_type_of

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, Observation


def typed_columns(info: TableInfo) -> list[tuple[str, PgType]]:
    return [(c["name"], pg_type_of(c)) for c in info.columns]


# Internal names while a table's rows are cast: no PostgreSQL column can be one of these
# without also colliding with silver's own _lsn/_diff/_run, which the README reserves.
ROW_LSN, ROW_DIFF = "_pgm_lsn", "_pgm_diff"
_CODE, _RAW, _MESSAGE = "_pgm_code", "_pgm_raw", "_pgm_message"


def data_columns(info: TableInfo) -> list:
    """The table's columns, as Spark column references (names quoted)."""
    return [F.col(f"`{c['name'].replace('`', '``')}`") for c in info.columns]


@dataclass
class CastRows:
    """One table's diff rows after the cast (see :func:`cast_diffs`)."""

    rows: DataFrame
    """The rows that cast: one column per table column, then ``_pgm_lsn`` and ``_pgm_diff``."""
    errors: list[ErrorRecord]
    """The table's decode errors and ``CastError`` records."""
    cached: list[DataFrame]
    adjusted: list[tuple] = dataclasses.field(default_factory=list)
    """Values a declared policy changed: ``(column, code, count, first_lsn, sample)``."""

    def unpersist(self) -> None:
        for df in self.cached:
            df.unpersist()


def cast_base(rows: DataFrame, changes: bool = False) -> DataFrame:
    """The columns a cast works on; with ``changes``, also what :mod:`silver.identity` needs of
    a change's rows (NULL for snapshot rows)."""
    extra = []
    if changes:
        has = set(rows.columns)
        extra = [
            F.col("ordinal").alias(ORDINAL),
            (F.col("kind") if "kind" in has else F.lit(None).cast("int")).alias(KIND),
            (F.col("columns") if "columns" in has else F.lit(None).cast("array<int>")).alias(
                COLUMNS
            ),
        ]
    return rows.select(
        "values",
        F.col("lsn").alias(ROW_LSN),
        F.col("diff").alias(ROW_DIFF),
        F.col("code").alias(_CODE),
        F.col("raw").alias(_RAW),
        F.col("message").alias(_MESSAGE),
        *extra,
    )


_CHANGE_COLUMNS = (ORDINAL, KIND, COLUMNS)


def _out(info: TableInfo, changes: bool = False) -> list:
    return [
        *data_columns(info),
        F.col(ROW_LSN),
        F.col(ROW_DIFF),
        *(_CHANGE_COLUMNS if changes else ()),
    ]


def cast_diffs(info: TableInfo, diffs: TableDiffs, changes: bool = False) -> CastRows:
    """One table's diff rows cast to its types; the decode errors and the values that did not
    cast, all known before any row is written.

    Every value is first cast by plain (code-generated) expressions (``plain_cast``), and the
    result persisted. One count over it finds the rows those leave unsettled; usually there are
    none and that is all. Otherwise :func:`_cast_unsettled` casts them. The caller calls
    ``unpersist`` when it has written the rows. With ``changes`` the rows keep each change's
    ordinal, kind and columns (for :mod:`silver.identity`). :func:`cast_in_one_pass` does the
    same work without the persisted copy, for a caller that can write the unsettled rows
    afterwards.
    """
    columns = typed_columns(info)
    base = cast_base(diffs.rows, changes)
    staged = plain_cast(base, "values", columns)
    plain = staged is not None
    if staged is None:  # some type has no plain value: every row takes the full cast
        staged = base.withColumn(UNSETTLED_COLUMN, F.lit(True))
    staged = staged.persist(sparkapi.StorageLevel.MEMORY_AND_DISK)
    parts = [staged.where(~F.col(UNSETTLED_COLUMN)).select(*_out(info, changes))] if plain else []
    cached, errors = [staged], []
    unsettled = _cast_unsettled(info, diffs, staged.where(F.col(UNSETTLED_COLUMN)), changes)
    adjusted = []
    if unsettled is not None:
        parts.append(unsettled.rows)
        cached += unsettled.cached
        errors, adjusted = unsettled.errors, unsettled.adjusted
    if not parts:  # no rows at all, and no plain values to give the typed columns' schema
        kept = ("values", ROW_LSN, ROW_DIFF, *(_CHANGE_COLUMNS if changes else ()))
        empty = base.where(F.lit(False)).select(*kept)
        parts.append(cast_values(empty, "values", columns).select(*_out(info, changes)))
    union = functools.reduce(sparkapi.DataFrame.unionByName, parts)
    return CastRows(union, errors, cached, adjusted)


def _cast_unsettled(
    info: TableInfo, diffs: TableDiffs, unsettled: DataFrame, changes: bool = False
) -> CastRows | None:
    """The rows the plain cast left unsettled (``unsettled``: rows of ``plain_cast``'s output
    that set ``_pgm_unsettled``, read at most three times): their decode errors, the rows of
    the records marked for Python decoded there, and all the rest cast in full with their error
    messages (``cast_values``). None when there are no unsettled rows."""
    columns = typed_columns(info)
    if not unsettled.count():
        return None
    flagged = unsettled.where(F.col(_CODE).isNotNull()).select(ROW_LSN, _CODE, _RAW, _MESSAGE)
    flagged = flagged.collect()
    errors = [
        ErrorRecord(info.oid, r[ROW_LSN], r[_CODE], r[_MESSAGE], raw=r[_RAW]) for r in flagged
    ]
    cached: list[DataFrame] = []
    kept = ("values", ROW_LSN, ROW_DIFF, *(_CHANGE_COLUMNS if changes else ()))
    texts = unsettled.where(F.col(_CODE).isNull()).select(*kept)
    full = cast_values(texts, "values", columns).persist(sparkapi.StorageLevel.MEMORY_AND_DISK)
    cached.append(full)
    errors += _cast_errors(info, full)
    rows = full.where(F.size(CAST_ERRORS_COLUMN) == 0).select(*_out(info, changes))
    return CastRows(rows, errors, cached, _adjusted(info, texts))


def _adjusted(info: TableInfo, texts: DataFrame) -> list[tuple]:
    """How many of ``texts``' values a declared rule adjusted (``silver.kernel.adjustment``),
    per column and kind: ``(column, code, count, first_lsn, sample)``, counts above zero, among
    the rows that cast. Only unsettled rows can hold such values (the plain cast settles none
    of them). Each Arrow batch's counts are made by the kernel in a Python worker; the driver
    merges them (a few rows)."""
    columns = typed_columns(info)
    if not any(adjustment(t) for _, t in columns):
        return []
    schema = "name string, code string, count long, first_lsn long, sample string"
    parts = texts.select("values", ROW_LSN).mapInArrow(_Adjusted(tuple(columns)), schema)
    return merged_adjustments([[tuple(r)] for r in parts.collect()])


class _Adjusted:
    """``mapInArrow``'s function: each batch's adjustments (``silver.kernel.Rows.adjustments``)."""

    def __init__(self, columns: tuple):
        self.columns = columns

    def __call__(self, batches):
        for batch in batches:
            rows = cast_rows(batch.column("values"), list(self.columns))
            found = rows.adjustments(batch.column(ROW_LSN))
            yield pa.RecordBatch.from_pylist(
                [dict(zip(_ADJUSTED, a, strict=True)) for a in found], schema=_ADJUSTED_ARROW
            )


_ADJUSTED = ("name", "code", "count", "first_lsn", "sample")
_ADJUSTED_ARROW = pa.schema(
    [
        ("name", pa.string()),
        ("code", pa.string()),
        ("count", pa.int64()),
        ("first_lsn", pa.int64()),
        ("sample", pa.string()),
    ]
)


@dataclass
class OnePass:
    """One table's diff rows cast as part of the job that writes them (see
    :func:`cast_in_one_pass`)."""

    rows: DataFrame
    """The rows the plain cast settles, as :attr:`CastRows.rows`. Use it in exactly one action
    (the write), then call :meth:`finish`."""
    wal_rows: DataFrame
    """The same for the table's decoded changes alone (for rewinds; not observed)."""
    info: TableInfo
    diffs: TableDiffs
    observation: Observation
    unsettled: DataFrame
    """All of the table's unsettled rows (the decode run again), for :meth:`finish`."""

    def finish(self, observed: bool = True) -> CastRows | None:
        """After the action that consumed :attr:`rows`: the rows it left out, cast in full,
        with the table's errors; None when it left none out (the common case, known from the
        count the action itself made). ``observed``: whether that action ran; when it did not
        (the write was skipped: a run repeated after a crash, whose first write Delta already
        has) the unsettled rows are counted again. (``Observation.get`` waits for the observed
        plan's first action: asked of a plan that never runs, it waits forever.)"""
        counted = None
        if observed:
            try:
                counted = self.observation.get.get("unsettled")
            except Exception:  # the observed plan did not complete: its metrics row is empty
                counted = None
        if counted == 0:
            return None
        unsettled = self.unsettled.persist(sparkapi.StorageLevel.MEMORY_AND_DISK)
        cast = _cast_unsettled(self.info, self.diffs, unsettled)
        if cast is None:
            unsettled.unpersist()
            return None
        cast.cached.insert(0, unsettled)
        return cast


def cast_in_one_pass(info: TableInfo, diffs: TableDiffs) -> OnePass | None:
    """The cast of :func:`cast_diffs` in the job that writes the rows, with no persisted copy.

    ``rows`` are the rows the plain cast settles (usually all of them); the write that
    consumes them also counts the others (an observed metric). :meth:`OnePass.finish` then
    casts those, when there are some, for a second write. None when some type has no plain
    value: use :func:`cast_diffs`.
    """
    columns = typed_columns(info)
    wal = plain_cast(cast_base(diffs.wal), "values", columns)
    copy = _plain_copy(diffs, columns)
    if wal is None or copy is None:
        return None
    staged = wal.unionByName(copy, allowMissingColumns=True)
    observation = sparkapi.Observation(f"pgm_unsettled_{uuid.uuid4().hex}")
    observed = staged.observe(observation, F.count_if(F.col(UNSETTLED_COLUMN)).alias("unsettled"))

    def settled(df: DataFrame) -> DataFrame:
        return df.where(~F.col(UNSETTLED_COLUMN)).select(*_out(info))

    return OnePass(
        settled(observed),
        settled(wal),
        info,
        diffs,
        observation,
        staged.where(F.col(UNSETTLED_COLUMN)),
    )


def _plain_copy(diffs: TableDiffs, columns: list[tuple[str, PgType]]) -> DataFrame | None:
    """``plain_cast(cast_base(diffs.copy))``: the snapshot's COPY records decoded
    (``silver.decode.copy_parts``) and cast in the same ``mapInArrow``, so each batch passes
    through Spark's Python workers once, not once to decode and again to cast, and the decoded
    columns go to the cast as they are (a row's values as a list only when it is unsettled)."""
    base = cast_base(diffs.copy)
    plain = plain_cast(base, "values", columns)
    if plain is None or diffs.records is None:
        return plain
    cast = plain_cast_batch("values", columns, base.columns)
    widths = dict(diffs.widths or {})
    decoded = ["values", "lsn", "diff", "code", "raw", "message"]  # cast_base's, in its order

    def decode_and_cast(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for part, texts in copy_parts(batch, widths):
                rows = pa.RecordBatch.from_arrays([part.column(n) for n in decoded], decoded)
                yield cast(rows, texts)

    return diffs.records.mapInArrow(decode_and_cast, plain.schema)


def _cast_errors(info: TableInfo, typed: DataFrame) -> list[ErrorRecord]:
    code = CastError.__name__
    return [
        ErrorRecord(
            info.oid, r[ROW_LSN], code, r["e"]["message"], r["e"]["column_name"], r["e"]["raw"]
        )
        for r in typed.where(F.size(CAST_ERRORS_COLUMN) > 0)
        .select(ROW_LSN, F.explode(CAST_ERRORS_COLUMN).alias("e"))
        .collect()
    ]
