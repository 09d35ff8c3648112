"""Casting a DataFrame's texts on Spark: an ``array<string>`` column -> one typed column per
table column, by the same kernels the driver runs (:mod:`silver.kernel`), in Spark's Python
workers over Arrow batches (``mapInArrow``).

:func:`cast_values` gives each row its typed values and ``_cast_errors`` (an error message per
value that does not cast). :func:`plain_cast` gives the typed values of the rows that cast
cleanly and marks the others *unsettled* (``_pgm_unsettled``: a value that does not cast or
that a declared rule adjusts, or fewer values than columns), for :func:`cast_values` to cast
with their errors, and for silver to count the adjustments of. Whether a row is unsettled
depends only on its texts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pgmedallion.core.naming import quote
from pgmedallion.core.sparkapi import F, T
from pgmedallion.silver.copy_arrow import as_lists
from pgmedallion.silver.kernel import cast_columns, cast_rows
from pgmedallion.silver.pgtypes import PgType, spark_type

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

CAST_ERRORS_COLUMN = "_cast_errors"
UNSETTLED_COLUMN = "_pgm_unsettled"

_ERROR_ARROW = pa.list_(
    pa.field(
        "item",
        pa.struct(
            [
                pa.field("column_name", pa.string()),
                pa.field("raw", pa.string()),
                pa.field("message", pa.string()),
            ]
        ),
        nullable=False,
    )
)


def cast_values(df: DataFrame, values_col: str, columns: Sequence[tuple[str, PgType]]) -> DataFrame:
    """Replace ``values_col`` (``array<string>``) by one typed column per ``(name, type)``.

    Column ``i`` comes from ``values_col[i]``. The typed columns take ``values_col``'s place,
    the other columns of ``df`` stay, and ``_cast_errors`` (``array<struct<column_name, raw,
    message>>``, empty when the row cast cleanly) comes last. A row with fewer values than
    ``columns`` has an error for each missing one.
    """
    if values_col not in df.columns:
        raise ValueError(f"no column {values_col!r} in the DataFrame")
    names = [name for name, _ in columns]
    outputs = [name for name in df.columns if name != values_col] + names + [CAST_ERRORS_COLUMN]
    clashes = sorted({name for name in outputs if outputs.count(name) > 1})
    if clashes:
        raise ValueError(f"cast_values would produce duplicate columns: {clashes}")
    from pyspark.sql.pandas.types import from_arrow_type

    typed = [T.StructField(name, spark_type(t), True) for name, t in columns]
    fields: list[T.StructField] = []
    for field in df.schema.fields:
        fields.extend(typed if field.name == values_col else [_nullable(field)])
    fields.append(T.StructField(CAST_ERRORS_COLUMN, from_arrow_type(_ERROR_ARROW), False))
    cast = _Cast(values_col, tuple(columns), df.columns, plain=False)
    return _positional(df).mapInArrow(cast, T.StructType(fields))


def plain_cast(
    df: DataFrame, values_col: str, columns: Sequence[tuple[str, PgType]]
) -> DataFrame | None:
    """``df``'s other columns, one typed column per ``(name, type)``, ``values_col`` only where
    the row is unsettled (NULL elsewhere), and ``_pgm_unsettled``: whether the row has a value
    that does not cast or that a declared rule adjusts, or fewer values than ``columns``. The
    typed columns of a row that is not unsettled are exactly what :func:`cast_values` gives
    it, with no errors; cast the unsettled rows' ``values_col`` with :func:`cast_values`.

    None when a column is named ``values_col`` or ``_pgm_unsettled``: use :func:`cast_values`.
    """
    if values_col not in df.columns:
        raise ValueError(f"no column {values_col!r} in the DataFrame")
    names = [name for name, _ in columns]
    if values_col in names or UNSETTLED_COLUMN in names:
        return None
    outputs = [n for n in df.columns if n != values_col] + names + [values_col, UNSETTLED_COLUMN]
    clashes = sorted({name for name in outputs if outputs.count(name) > 1})
    if clashes:
        raise ValueError(f"plain_cast would produce duplicate columns: {clashes}")
    others = [_nullable(f) for f in df.schema.fields if f.name != values_col]
    fields = [
        *others,
        *(T.StructField(name, spark_type(t), True) for name, t in columns),
        _nullable(df.schema[values_col]),
        T.StructField(UNSETTLED_COLUMN, T.BooleanType(), False),
    ]
    cast = _Cast(values_col, tuple(columns), df.columns, plain=True)
    return _positional(df).mapInArrow(cast, T.StructType(fields))


def plain_cast_batch(
    values_col: str, columns: Sequence[tuple[str, PgType]], order: list[str]
) -> Callable[[pa.RecordBatch, list[pa.Array] | None], pa.RecordBatch]:
    """:func:`plain_cast`'s work on one Arrow batch whose columns are ``order`` (by position),
    for a ``mapInArrow`` that computes that batch itself (``silver.cast_rows``: COPY records
    decoded and cast in one pass through the Python workers). Its second argument: the
    values as columns (``silver.decode.copy_parts``), or None to read ``values_col``."""
    return _Cast(values_col, tuple(columns), order, plain=True).cast


def _positional(df: DataFrame) -> DataFrame:
    """``df`` with its columns named by position: ``mapInArrow`` resolves each input column by
    its name, which fails for names such as ``a.b``. The function reads them by position."""
    return df.select(*(column(n).alias(f"_pgm_{i}") for i, n in enumerate(df.columns)))


def _nullable(field: T.StructField) -> T.StructField:
    return T.StructField(field.name, field.dataType, True, field.metadata)


class _Cast:
    """The function ``mapInArrow`` runs in Spark's Python workers: each batch's
    ``values_col`` cast by :func:`silver.kernel.cast_rows`, the other columns passed on."""

    def __init__(
        self,
        values_col: str,
        columns: tuple[tuple[str, PgType], ...],
        order: list[str],
        plain: bool,
    ):
        self.values_col = values_col
        self.columns = columns
        self.order = order
        self.plain = plain

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            yield self.cast(batch)

    def cast(self, batch: pa.RecordBatch, texts: list[pa.Array] | None = None) -> pa.RecordBatch:
        """``texts``: the values as columns (``values_col`` then left NULL but for the rows
        that stay unsettled, filled from them; plain casts only)."""
        batch = pa.RecordBatch.from_arrays(batch.columns, names=self.order)
        values = batch.column(self.values_col)
        if texts is None:
            rows = cast_rows(values, list(self.columns))
        else:
            rows = cast_columns(texts, list(self.columns))
        names = [name for name, _ in self.columns]
        if self.plain:
            unsettled = rows.failed.copy()
            for _, _, mask, _ in rows.adjusted:
                unsettled |= mask
            if texts is not None and unsettled.any():
                values = as_lists(texts)
            kept = [batch.column(n) for n in self.order if n != self.values_col]
            arrays = [
                *kept,
                *rows.columns,
                pc.if_else(pa.array(unsettled), values, pa.scalar(None, values.type)),
                pa.array(unsettled, pa.bool_()),
            ]
            out_names = [
                *(n for n in self.order if n != self.values_col),
                *names,
                self.values_col,
                UNSETTLED_COLUMN,
            ]
            return pa.RecordBatch.from_arrays(arrays, names=out_names)
        arrays, out_names = [], []
        for n in self.order:
            if n == self.values_col:
                arrays += rows.columns
                out_names += names
            else:
                arrays.append(batch.column(n))
                out_names.append(n)
        arrays.append(_errors(rows.errors, len(values)))
        out_names.append(CAST_ERRORS_COLUMN)
        return pa.RecordBatch.from_arrays(arrays, names=out_names)


def _errors(errors: list[tuple[int, str, str | None, str]], n: int) -> pa.Array:
    """Each row's errors (``(row, column, raw, message)``, rows in order) as ``_cast_errors``."""
    counts = np.zeros(n + 1, np.int32)
    for row, _, _, _ in errors:
        counts[row + 1] += 1
    offsets = pa.array(np.cumsum(counts, dtype=np.int32))
    items = pa.StructArray.from_arrays(
        [
            pa.array([e[1] for e in errors], pa.string()),
            pa.array([e[2] for e in errors], pa.string()),
            pa.array([e[3] for e in errors], pa.string()),
        ],
        fields=list(_ERROR_ARROW.value_type),
    )
    return pa.ListArray.from_arrays(offsets, items, type=_ERROR_ARROW)


def column(name: str) -> Column:
    """A reference to the column called ``name``, whatever characters the name has."""
    return F.col(quote(name))
