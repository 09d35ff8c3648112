"""What a gold run touches: which tables it builds, and which of their files and rows it reads.

Tables: a table no silver run wrote anything for since gold last applied or reported it is
``untouched`` (its gold table already holds its state at the new frontier). Files and rows:
an incremental run reads and MERGEs gold through a predicate on the touched keys' ranges
(``key_ranges``), which Delta's per-file min/max statistics use to skip files (a full build
writes keyed tables ``clustered`` by key range for that), and a bitmap of the touched keys'
hashes (``key_filter``) that keeps most of those files' other rows out of the joins. Few
touched keys are broadcast (``small``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import pyarrow as pa

from pgmedallion.core.naming import quote
from pgmedallion.core.sparkapi import F, T
from pgmedallion.gold.history import Reported
from pgmedallion.gold.on_spark import c
from pgmedallion.gold.plan import Table
from pgmedallion.gold.state import DIFF
from pgmedallion.silver.contract import TableInfo

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

ROWS_PER_FILE = 1_000_000  # a full build's file size, in rows
BROADCAST_KEYS = 1_000_000  # up to this many touched keys, joins with gold broadcast them
# Up to this many touched keys, gold's reads and MERGEs also filter gold's rows by a bitmap of
# the touched keys' hashes (see ``key_filter``), of this many bits per key.
KEY_FILTER_KEYS = 100_000
KEY_FILTER_BITS = 8


def untouched(
    info: TableInfo,
    reported: Reported | None,
    silver_run: int,
    silver_runs: Sequence[tuple[int, set[int] | None]],
    exists: bool,
) -> bool:
    """Whether the table's gold table already holds its state at ``silver_run``: it exists,
    ``_frontier`` reported it at a silver run no later, silver has not rebuilt it since, and
    no silver run since (``silver_runs``: each with the tables it wrote something for, None
    for all) wrote anything for it."""
    if reported is None or reported.silver_run > silver_run or not exists:
        return False
    if info.snapshot_run is not None and info.snapshot_run > reported.silver_run:
        return False
    return not any(
        reported.silver_run < n and (oids is None or info.oid in oids) for n, oids in silver_runs
    )


def comparable(columns: Sequence[pa.Field], key: Sequence[str]) -> bool:
    """Whether rows can be grouped and joined on ``key`` (maps cannot)."""
    types = {f.name: f.type for f in columns}
    return not any(has_map(types[k]) for k in key)


def has_map(t: pa.DataType) -> bool:
    """Whether ``t`` is or holds a map."""
    if pa.types.is_map(t):
        return True
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return has_map(t.value_type)
    if pa.types.is_struct(t):
        return any(has_map(f.type) for f in t)
    return False


def clustered(rows: DataFrame, t: Table, count: int) -> DataFrame:
    """A full build's rows in files that each hold one key range, sorted by key, so that the
    per-file min/max statistics let later runs' key-range predicates skip files."""
    if not t.keyed or not comparable(t.columns, t.key):
        return rows
    files = max(1, -(-count // ROWS_PER_FILE))
    return rows.repartitionByRange(files, *[c(k) for k in t.key]).sortWithinPartitions(
        *[c(k) for k in t.key]
    )


def key_ranges_of(t: Table, diffs: DataFrame) -> int | None:
    """How many key ranges a full build of ``t`` (its silver ``diffs``) computes its state in,
    one per :data:`ROWS_PER_FILE` rows of the state, so that its rows come
    out as :func:`clustered` writes them (a range per file, in key order) without shuffling
    them again; None where they are not clustered, or where a key column is nested (Spark's
    order of nested values with floats may part values its equality joins)."""
    if not t.keyed or not comparable(t.columns, t.key):
        return None
    types = {f.name: f.type for f in t.columns}
    if any(pa.types.is_nested(types[k]) for k in t.key):
        return None
    (rows,) = diffs.agg(F.coalesce(F.sum(F.col(DIFF)), F.lit(0))).first()
    return max(1, -(-int(rows) // ROWS_PER_FILE))  # (the diffs' sum: the rows the state holds)


def small(t: Table, df: DataFrame) -> DataFrame:
    """``df`` marked for a broadcast join when the run touches few keys.

    The touched keys, the old state read for them and the MERGE source are derived from
    checkpointed data Spark cannot size, so without the hint it plans sort-merge joins that
    shuffle the whole gold table; with it, gold is only scanned.
    """
    return F.broadcast(df) if t.touched <= BROADCAST_KEYS else df


def key_filter(t: Table, keys: DataFrame, count: int) -> tuple[Column, Column] | None:
    """A filter on gold's rows, on the bare column names and on the MERGE target alias ``t``,
    true for every row whose key is in ``keys`` and for few others (None: too many keys).

    Delta's MERGE joins gold with its source as the source's outer join (it has an insert
    clause), and Spark cannot broadcast the preserved side of an outer join, so without a
    filter every row of every touched file is shuffled and sorted (with random keys, the whole
    table). The filter is a bitmap of the touched keys' 64-bit hashes, ``KEY_FILTER_BITS`` bits
    per key (about 12% of other rows pass), looked up per row with integer expressions. Delta
    records a MERGE's condition, this literal included, in the commit: about 2.5 bytes per
    touched key (an exact set of hashes would be 20).
    """
    if count > KEY_FILTER_KEYS:
        return None
    words = [0] * max(1, -(-count * KEY_FILTER_BITS // 64))
    size = 64 * len(words)
    for (h,) in keys.select(F.xxhash64(*[c(k) for k in t.key])).collect():
        bit = h % size
        words[bit >> 6] |= 1 << (bit & 63)
    bitmap = ",".join(str(w - (1 << 64) if w >= 1 << 63 else w) for w in words)
    filters = []
    for alias in (None, "t"):
        cols = ", ".join(f"{alias}.{quote(k)}" if alias else quote(k) for k in t.key)
        bit = f"pmod(xxhash64({cols}), {size})"
        filters.append(
            F.expr(
                f"getbit(element_at(array({bitmap}), int(shiftright({bit}, 6)) + 1), "
                f"int({bit} & 63)) = 1"
            )
        )
    return filters[0], filters[1]


def key_ranges(t: Table, keys: DataFrame) -> tuple[Column, Column, int]:
    """A predicate on target columns only, true for every row whose key is in ``keys``: on
    the bare column names, and on the MERGE target alias ``t``.

    Built from the touched keys' min and max (and whether NULL is among them), it lets Delta
    skip the files whose statistics rule those keys out. Key-less tables use their first
    columns the same way. When the run touches at most ``KEY_FILTER_KEYS`` keys, it also holds
    ``key_filter``'s bitmap test.
    """
    types = {f.name: f.dataType for f in t.spark_columns}
    cols = [
        k
        for k in t.key
        if isinstance(
            types[k], (T.NumericType, T.StringType, T.DateType, T.TimestampType, T.TimestampNTZType)
        )
    ][:3]
    aggs = [F.count(F.lit(1)).alias("n")]
    for i, k in enumerate(cols):
        aggs += [
            F.min(c(k)).alias(f"lo{i}"),
            F.max(c(k)).alias(f"hi{i}"),
            F.max(c(k).isNull().cast("int")).alias(f"null{i}"),
        ]
    row = keys.agg(*aggs).collect()[0]
    filters = key_filter(t, keys, int(row["n"]))
    preds = []
    for j, alias in enumerate((None, "t")):
        pred = F.lit(True)
        for i, k in enumerate(cols):
            lo, hi, nulls = row[f"lo{i}"], row[f"hi{i}"], row[f"null{i}"]
            col = c(k, alias)
            term = col.between(F.lit(lo), F.lit(hi)) if lo is not None else F.lit(False)
            if nulls:
                term = term | col.isNull()
            pred = pred & term
        if filters is not None:
            pred = pred & filters[j]
        preds.append(pred)
    return preds[0], preds[1], int(row["n"])
