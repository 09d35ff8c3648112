"""Casting a DataFrame's texts: an ``array<string>`` column -> one typed column per table column.

:func:`plain_cast` is the fast half: plain (code-generated) expressions only, which settle
almost every row and mark the rest *unsettled* (``_pgm_unsettled``); :func:`cast_values` is the
full cast, with an error message per value that does not cast. Both take each type's casts
from the registry in :mod:`silver.casts`, and cast all columns of one type together, so the
plan holds each distinct type's cast once however wide the table is.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.utils import is_remote

from pgmedallion.core.naming import quote
from pgmedallion.silver.casts import (
    CAST_ERROR_TYPE,
    CAST_ERRORS_COLUMN,
    caster,
    is_partial,
    nulled,
    plain_value,
    type_label,
)
from pgmedallion.silver.pgtypes import PgType, spark_type


def cast_values(df: DataFrame, values_col: str, columns: Sequence[tuple[str, PgType]]) -> DataFrame:
    """Replace ``values_col`` (``array<string>``) by one typed column per ``(name, type)``.

    Column ``i`` comes from ``values_col[i]``. The typed columns take ``values_col``'s place,
    the other columns of ``df`` stay, and ``_cast_errors`` (``array<struct<column_name, raw,
    message>>``, empty when the row cast cleanly) comes last. A row with fewer values than
    ``columns`` has an error for each missing one.

    The columns of one type are cast together, ``transform(array(texts...), <cast>)``, so the
    plan holds each distinct type's cast once however wide the table is, and the cast of a type
    is built once per process.
    """
    if values_col not in df.columns:
        raise ValueError(f"no column {values_col!r} in the DataFrame")
    names = [name for name, _ in columns]
    outputs = [name for name in df.columns if name != values_col] + names + [CAST_ERRORS_COLUMN]
    clashes = sorted({name for name in outputs if outputs.count(name) > 1})
    if clashes:
        raise ValueError(f"cast_values would produce duplicate columns: {clashes}")
    c = _ColumnsCast(df, values_col, columns)
    staged = c.staged(df)
    value_at, error_at = c.values_and_errors()
    typed = [value_at[p].alias(name) for p, name in enumerate(names)]
    output: list[Column] = []
    for name in df.columns:
        output.extend(typed if name == values_col else [column(name)])
    output.append(c.errors(error_at).cast(CAST_ERROR_TYPE).alias(CAST_ERRORS_COLUMN))
    return staged.select(*output)


class _ColumnsCast:
    """The expressions of one :func:`cast_values`: the columns grouped by type, each group's
    texts in one array column, and each scalar column's plain value in a column of its own."""

    def __init__(self, df: DataFrame, values_col: str, columns: Sequence[tuple[str, PgType]]):
        self.columns = columns
        self.positions: dict[PgType, list[int]] = {}
        for position, (_, t) in enumerate(columns):
            self.positions.setdefault(t, []).append(position)
        prefix = _unused_prefix(df.columns)
        self.group_names = {t: f"{prefix}{_type_key(t)}" for t in self.positions}
        self.value_names = {p: f"{prefix}v{p}" for p in range(len(columns))}
        self.plain = {t: plain_value(t) for t in self.positions}
        self.nulled = {p: nulled(t) for p, (_, t) in enumerate(columns)}
        self.values = column(values_col)

    def failed(self, p: int) -> Column:
        """Whether column ``p``'s plain value failed (a non-NULL text, a NULL value)."""
        text = F.get(self.values, p)
        out = text.isNotNull() & column(self.value_names[p]).isNull()
        return out & ~self.nulled[p](text) if self.nulled[p] else out

    def _any_failed(self, group: list[int]) -> Column:
        return functools.reduce(lambda a, b: a | b, (self.failed(p) for p in group))

    def staged(self, df: DataFrame) -> DataFrame:
        """``df`` with each type's texts and, for scalar types, each plain value; the full cast
        of a scalar type's group only for a row where some plain value failed. Arrays and
        intervals: the full cast for every row."""
        everything = [column(name) for name in df.columns]
        groups, plain = self.positions.items(), self.plain
        texts = df.select(
            *everything,
            *(
                F.array(*(F.get(self.values, p) for p in group)).alias(self.group_names[t])
                for t, group in groups
            ),
        )
        staged = texts.select(
            *everything,
            *(
                (column(self.group_names[t]) if plain[t] else self._cast(t)).alias(
                    self.group_names[t]
                )
                for t in self.positions
            ),
            *(
                plain[t](F.get(self.values, p)).alias(self.value_names[p])
                for t, group in groups
                if plain[t]
                for p in group
            ),
        )
        return staged.select(
            *everything,
            *(column(self.value_names[p]) for t, group in groups if plain[t] for p in group),
            *(
                (
                    F.when(self._any_failed(group), self._cast(t))
                    if plain[t]
                    else column(self.group_names[t])
                ).alias(self.group_names[t])
                for t, group in groups
            ),
        )

    def _cast(self, t: PgType) -> Column:
        return _group_cast(t, self.group_names[t], is_remote())

    def values_and_errors(self) -> tuple[dict[int, Column], dict[int, Column]]:
        """Each column's typed value and error (NULL: none), by position."""
        value_at: dict[int, Column] = {}
        error_at: dict[int, Column] = {}
        for t, group in self.positions.items():
            plain = self.plain[t]
            for k, p in enumerate(group):
                pair = F.get(column(self.group_names[t]), k)
                if is_partial(plain):
                    value_at[p] = F.coalesce(
                        column(self.value_names[p]), F.when(self.failed(p), pair["value"])
                    )
                    error_at[p] = F.when(self.failed(p), pair["error"])
                elif plain:
                    value_at[p] = column(self.value_names[p])
                    error_at[p] = F.when(
                        self.failed(p),
                        F.coalesce(
                            pair["error"], F.lit(f"cannot cast to {type_label(spark_type(t))}")
                        ),
                    )
                else:
                    value_at[p] = pair["value"]
                    error_at[p] = pair["error"]
        return value_at, error_at

    def errors(self, error_at: dict[int, Column]) -> Column:
        """The row's ``_cast_errors``: built (a lambda function, without generated code) only
        for a row that has one."""
        values, count = self.values, F.size(self.values)
        names = [name for name, _ in self.columns]
        errors = [
            F.struct(
                F.lit(name).alias("column_name"),
                F.get(values, p).alias("raw"),
                F.coalesce(
                    F.when(values.isNull() | (count <= p), F.lit(f"no value at position {p}")),
                    error_at[p],
                ).alias("message"),
            )
            for p, name in enumerate(names)
        ]
        may_fail = [values.isNull(), count < len(names)] + [
            self.failed(p) if self.plain[t] else error_at[p].isNotNull()
            for t, group in self.positions.items()
            for p in group
        ]
        return F.when(
            functools.reduce(lambda a, b: a | b, may_fail),
            F.filter(F.array(*errors), lambda e: e["message"].isNotNull()),
        ).otherwise(F.array().cast(CAST_ERROR_TYPE))


UNSETTLED_COLUMN = "_pgm_unsettled"


def plain_cast(
    df: DataFrame, values_col: str, columns: Sequence[tuple[str, PgType]]
) -> DataFrame | None:
    """The fast half of :func:`cast_values`: plain expressions only, so Spark generates code for
    all of it (a lambda function anywhere in a projection leaves the projection uncompiled).

    Returns ``df``'s other columns, one typed column per ``(name, type)`` from its plain value,
    ``values_col`` only where the row is unsettled (NULL elsewhere), and ``_pgm_unsettled``: whether
    the plain values do not settle the row (a value did not cast or was left to the full cast,
    or the row has fewer values than ``columns``, or none). The typed columns of a row that is
    not unsettled are exactly what :func:`cast_values` gives it, with no errors; cast the unsettled
    rows' ``values_col`` with :func:`cast_values` for theirs.

    None when some type has no plain value (arrays of other element types than text, interval)
    or when a column is named ``values_col`` or ``_pgm_unsettled``: use :func:`cast_values`.
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
    exprs = _plain_exprs(values_col, tuple(columns), tuple(df.columns), is_remote())
    if exprs is None:
        return None
    typed, output = exprs
    return df.select(*typed).select(*output)


@functools.lru_cache(maxsize=256)
def _plain_exprs(
    values_col: str, columns: tuple[tuple[str, PgType], ...], taken: tuple[str, ...], remote: bool
) -> tuple[list[Column], list[Column]] | None:
    """The two projections of :func:`plain_cast`, or None. Cached: building them costs one
    call into the JVM per expression node (thousands for a wide table, most of a second), and
    a run casts the same table's columns for its changes and for its snapshot, as do runs in
    one process. ``remote`` keeps Spark Connect columns apart from classic ones."""
    del remote
    names = [name for name, _ in columns]
    plain = [plain_value(t) for _, t in columns]
    if any(p is None for p in plain):
        return None
    values = column(values_col)
    prefix = _unused_prefix(taken)
    typed = [
        *(column(n) for n in taken),
        *(fn(F.get(values, p)).alias(f"{prefix}{p}") for p, fn in enumerate(plain)),
    ]
    failed = [
        F.get(values, p).isNotNull() & column(f"{prefix}{p}").isNull() for p in range(len(plain))
    ]
    unsettled = functools.reduce(
        lambda a, b: a | b, [values.isNull(), F.size(values) < len(names), *failed]
    )
    others = [column(n) for n in taken if n != values_col]
    output = [
        *others,
        *(column(f"{prefix}{p}").alias(name) for p, name in enumerate(names)),
        F.when(unsettled, values).alias(values_col),
        unsettled.alias(UNSETTLED_COLUMN),
    ]
    return typed, output


@functools.lru_cache(maxsize=1024)
def _group_cast(t: PgType, texts: str, remote: bool) -> Column:
    """``transform(texts, <cast to t>)``; cached, because building a cast costs hundreds of
    calls into the JVM and a silver run casts the same types table after table, run after run.
    ``remote`` keeps Spark Connect columns apart from classic ones.
    """
    del remote
    return F.transform(column(texts), caster(t))


def _type_key(t: PgType) -> str:
    return hashlib.sha1(repr(t).encode()).hexdigest()[:16]


def _unused_prefix(taken: Sequence[str]) -> str:
    prefix = "__pgm_cast_"
    while any(name.startswith(prefix) for name in taken):
        prefix = "_" + prefix
    return prefix


def column(name: str) -> Column:
    """A reference to the column called ``name``, whatever characters the name has."""
    return F.col(quote(name))
