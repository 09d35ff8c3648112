"""Spark applies the Arrow rules of ``pgmedallion.core.multiset`` to a large table, a group of
keys at a time.

A rule that groups rows by a key (consolidation, key rows, MERGE operations) is a function
``pa.Table -> pa.Table`` that is correct on any set of rows holding *all* the rows of each key
it sees. Spark hashes each row's key into one of :data:`BUCKETS` buckets, shuffles, and hands
each bucket's rows to the function in a Python worker (``applyInArrow``); two inputs are
cogrouped the same way. The hash is computed on the key as Spark's equality sees it (-0.0 made
0.0; NaN hashes as one value), and a nested column that may hold a float is left out of it, so
rows Spark calls equal always meet in one bucket::

    rows ──hash(key) mod BUCKETS──> bucket 0: rule(rows of its keys) ─┐
                                    bucket 1: rule(...)               ├─> rows
                                    ...                               ┘
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from pgmedallion.core.multiset import group_ids
from pgmedallion.core.naming import quote
from pgmedallion.core.sparkapi import F, T

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

BUCKETS = 64
BUCKET = "_pgm_bucket"
Rule = Callable[[pa.Table], pa.Table]


def _has_float(t: T.DataType) -> bool:
    if isinstance(t, T.FloatType | T.DoubleType):
        return True
    if isinstance(t, T.ArrayType):
        return _has_float(t.elementType)
    if isinstance(t, T.MapType):
        return _has_float(t.keyType) or _has_float(t.valueType)
    if isinstance(t, T.StructType):
        return any(_has_float(f.dataType) for f in t.fields)
    return False


def bucket(df: DataFrame, key: Sequence[str]) -> Column:
    """The bucket of each row's ``key`` (see the module doc)."""
    types = {f.name: f.dataType for f in df.schema.fields}
    hashed: list[Column] = []
    for name in key:
        col, t = F.col(quote(name)), types[name]
        if isinstance(t, T.FloatType | T.DoubleType):
            hashed.append(F.when(col == F.lit(0), F.lit(0).cast(t)).otherwise(col))
        elif isinstance(t, T.MapType) or _has_float(t):
            continue
        else:
            hashed.append(col)
    if not hashed:
        return F.lit(0)
    return F.pmod(F.xxhash64(*hashed), F.lit(BUCKETS))


def by_key(df: DataFrame, key: Sequence[str], rule: Rule, schema: T.StructType | str) -> DataFrame:
    """``rule`` applied to the rows of each bucket of keys; its rows have ``schema``."""
    bucketed, names = _bucketed(df, key)
    return bucketed.groupBy(BUCKET).applyInArrow(_drop_bucket(rule, names), schema)


def by_key_ranges(
    df: DataFrame, key: Sequence[str], rule: Rule, schema: T.StructType | str, ranges: int
) -> DataFrame:
    """``rule`` applied to ``df``'s rows cut into ``ranges`` ranges of ``key`` (Spark samples
    the keys for the bounds) and sorted by key within each, whole keys at a time: a range's
    batches stream through one Python worker, and the rows of the last key of a batch wait
    for the next (Spark's sort puts rows its equality calls equal side by side, and
    :func:`pgmedallion.core.multiset.group_ids` groups by that equality). The result stays
    in those ranges, each in key order where ``rule`` keeps its input's order: what a
    clustered write wants, with no second shuffle. ``key``'s columns must be orderable (no map)."""
    ordered = [F.col(quote(k)) for k in key]
    ranged = df.repartitionByRange(max(1, ranges), *ordered).sortWithinPartitions(*ordered)
    positional, names = by_position(ranged)

    def apply(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        waiting = None
        for batch in batches:
            rows = pa.Table.from_batches([batch]).rename_columns(names)
            if waiting is not None:
                rows = pa.concat_tables([waiting, rows])
            cut = _last_key_start(rows, key)
            if cut:
                yield from rule(rows.slice(0, cut)).to_batches()
            waiting = rows.slice(cut)
        if waiting is not None and waiting.num_rows:
            yield from rule(waiting).to_batches()

    return positional.mapInArrow(apply, schema)


def _last_key_start(rows: pa.Table, key: Sequence[str]) -> int:
    """The first row of the last key's rows in ``rows`` (sorted by ``key``; 0 when it holds
    one key)."""
    ids = group_ids([rows.column(k) for k in key], rows.num_rows)
    if not len(ids):
        return 0
    return int(np.argmax(ids == ids[-1]))


def by_position(df: DataFrame, *more: Column) -> tuple[DataFrame, list[str]]:
    """``df``'s columns named by position (and ``more``), and their names.

    PySpark's ``applyInArrow`` and ``mapInArrow`` name each input column by parsing its name,
    which fails for a name such as ``back`tick`` (PostgreSQL allows any); a rule renames the
    Arrow columns it gets back to the names."""
    names = list(df.columns)
    cols = [F.col(quote(n)).alias(f"_pgm_c{i}") for i, n in enumerate(names)]
    return df.select(*cols, *more), names


def _bucketed(df: DataFrame, key: Sequence[str]) -> tuple[DataFrame, list[str]]:
    """:func:`by_position`, with each row's bucket."""
    return by_position(df, bucket(df, key).alias(BUCKET))


def cogrouped(
    left: DataFrame,
    right: DataFrame,
    key: Sequence[str],
    rule: Callable[[pa.Table, pa.Table], pa.Table],
    schema: T.StructType,
) -> DataFrame:
    """``rule(left rows, right rows)`` for each bucket of keys either side has."""
    # Both sides' key columns have the same types, so equal keys hash alike.
    (lhs, left_names), (rhs, right_names) = _bucketed(left, key), _bucketed(right, key)
    grouped = lhs.groupBy(BUCKET).cogroup(rhs.groupBy(BUCKET))
    return grouped.applyInArrow(_drop_buckets(rule, left_names, right_names), schema)


def _without_bucket(table: pa.Table, names: list[str]) -> pa.Table:
    """A bucket's rows with the bucket left out and their columns named again."""
    if BUCKET in table.column_names:
        table = table.drop_columns([BUCKET])
    return table.rename_columns(names)


def _drop_bucket(rule: Rule, names: list[str]) -> Rule:
    def apply(table: pa.Table) -> pa.Table:
        return rule(_without_bucket(table, names))

    return apply


def _drop_buckets(
    rule: Callable[[pa.Table, pa.Table], pa.Table], left: list[str], right: list[str]
):
    def apply(lhs: pa.Table, rhs: pa.Table) -> pa.Table:
        return rule(_without_bucket(lhs, left), _without_bucket(rhs, right))

    return apply
