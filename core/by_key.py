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
    """``rule`` applied to ``df``'s rows cut into ``ranges`` ranges of ``key`` (``_in_ranges``)
    and sorted by key within each, whole keys at a time: a range's
    batches stream through one Python worker, and the rows of the last key of a batch wait
    for the next (Spark's sort puts rows its equality calls equal side by side, and
    :func:`pgmedallion.core.multiset.group_ids` groups by that equality). The result stays
    in those ranges, each in key order where ``rule`` keeps its input's order: what a
    clustered write wants, with no second shuffle. ``key``'s columns must be orderable (no map)."""
    ordered = [F.col(quote(k)) for k in key]
    ranged = _in_ranges(df, key, max(1, ranges)).sortWithinPartitions(*ordered)
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


SAMPLED_KEYS = 20_000
"""About how many of a table's keys ``_in_ranges`` reads to set the ranges' bounds."""


def _in_ranges(df: DataFrame, key: Sequence[str], ranges: int) -> DataFrame:
    """``df``'s rows in ``ranges`` partitions, the i-th holding the i-th range of ``key``
    (rows with equal keys in one).

    Spark's ``repartitionByRange`` computes ``df`` whole to sample it (every column of a
    table's scan, a job as long as the shuffle's own). Here the bounds are quantiles of a
    sample of the key columns alone, read by a job that scans only them; each row's range is
    then a comparison with the bounds, and a hash partitioning on a value chosen per range
    (:func:`range_tags`) puts range i in partition i. Equal keys compare alike with every
    bound (Spark's comparison makes -0.0 equal 0.0 and NaN equal NaN), so a key never straddles
    two ranges. Bounds that are not literals Spark takes back leave the split to Spark."""
    ordered = [F.col(quote(k)) for k in key]
    if ranges == 1:
        return df.repartition(1)
    keys = df.select(*ordered)
    rows = keys.count()
    fraction = min(1.0, SAMPLED_KEYS / max(rows, 1))
    sample = keys.sample(fraction=fraction, seed=17).orderBy(*ordered).collect()
    if len(sample) < ranges:
        return df.repartitionByRange(ranges, *ordered)
    types = {f.name: f.dataType for f in df.schema.fields}
    picked = [sample[len(sample) * i // ranges] for i in range(1, ranges)]
    try:
        bounds = [
            F.struct(*[F.lit(v).cast(types[k]).alias(k) for k, v in zip(key, row, strict=True)])
            for row in picked
        ]
    except (TypeError, ValueError):
        return df.repartitionByRange(ranges, *ordered)
    this = F.struct(*ordered)
    tags = range_tags(ranges)
    tag = F.lit(tags[0])
    for i, bound in enumerate(bounds):  # the last bound the key reaches names its range
        tag = F.when(this >= bound, F.lit(tags[i + 1])).otherwise(tag)
    return df.repartition(ranges, tag.alias("_pgm_range"))


def range_tags(partitions: int) -> list[int]:
    """Per partition i, an int that Spark's hash partitioning into ``partitions`` partitions
    sends to partition i (``pmod(hash(v), partitions)``, Murmur3 with seed 42)."""
    tags: dict[int, int] = {}
    v = 0
    while len(tags) < partitions:
        tags.setdefault(spark_hash_int(v) % partitions, v)
        v += 1
    return [tags[i] for i in range(partitions)]


def spark_hash_int(value: int, seed: int = 42) -> int:
    """Spark's ``hash`` of an int column's value (Murmur3 x86 32-bit), as a signed int."""
    mask = 0xFFFFFFFF

    def rotl(x: int, r: int) -> int:
        return ((x << r) | (x >> (32 - r))) & mask

    k1 = (value & mask) * 0xCC9E2D51 & mask
    k1 = rotl(k1, 15) * 0x1B873593 & mask
    h1 = seed ^ k1
    h1 = (rotl(h1, 13) * 5 + 0xE6546B64) & mask
    h1 ^= 4
    h1 ^= h1 >> 16
    h1 = h1 * 0x85EBCA6B & mask
    h1 ^= h1 >> 13
    h1 = h1 * 0xC2B2AE35 & mask
    h1 ^= h1 >> 16
    return h1 - (1 << 32) if h1 >= 1 << 31 else h1


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
