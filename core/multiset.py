"""Multisets of rows held as Arrow tables: which rows are equal, and their sums.

Every rule that groups rows (consolidation, key rows, the keys a run touches, the MERGE
operations) is written once, over Arrow tables, and runs wherever the rows are: in the driver
on a small table read by delta-rs, or in Spark's Python workers on a large one, a group of keys
at a time (``pgmedallion.core.by_key``). Both must call the same rows equal that Spark's own
grouping does::

    NULL  = NULL          (a NULL key is a key like any other)
    NaN   = NaN           (whatever its bits)
    -0.0  = 0.0
    equal structs and arrays: equal field by field, element by element, the same way

Arrow's hash grouping compares floating-point bits and takes no nested keys, so
:func:`group_ids` first rewrites each column into keys Arrow compares the right way: a float
becomes its value with NaN as NULL plus a NaN flag (-0.0 made 0.0), and a nested value becomes
the number of its canonical form (computed in Python: nested key columns are rare). Everything
else groups as it is.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

DIFF, LSN, MULT = "_diff", "_lsn", "_multiplicity"


def _canonical(value):
    """A nested value as a hashable, Spark-equal form."""
    if isinstance(value, float):
        return ("NaN",) if value != value else value + 0.0
    if isinstance(value, list):
        return tuple(_canonical(v) for v in value)
    if isinstance(value, tuple):  # a map entry
        return tuple(_canonical(v) for v in value)
    if isinstance(value, dict):  # a struct: its fields in order
        return tuple((k, _canonical(v)) for k, v in value.items())
    return value


def _nested(t: pa.DataType) -> bool:
    return pa.types.is_nested(t)


def _group_keys(column: pa.ChunkedArray | pa.Array) -> list[pa.Array]:
    """The columns Arrow's grouping compares for one column, Spark-equal."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    t = column.type
    if pa.types.is_dictionary(t):
        column = column.dictionary_decode()
        t = column.type
    if pa.types.is_floating(t):
        nan = pc.fill_null(pc.is_nan(column), False)
        zero = pc.fill_null(pc.equal(column, pa.scalar(0, t)), False)
        value = pc.if_else(zero, pa.scalar(0, t), column)
        value = pc.if_else(nan, pa.scalar(None, t), value)
        return [value, nan]
    if _nested(t):
        numbers: dict = {}
        ids = [numbers.setdefault(_canonical(v), len(numbers)) for v in column.to_pylist()]
        return [pa.array(ids, pa.int64())]
    return [column]


def group_ids(columns: Sequence[pa.ChunkedArray | pa.Array], rows: int) -> np.ndarray:
    """For each of ``rows`` rows, the number of its group: rows equal on ``columns`` (by
    Spark's equality, above) share one, numbered from 0 in order of first appearance. No
    columns: one group."""
    if rows == 0:
        return np.zeros(0, np.int64)
    if not columns:
        return np.zeros(rows, np.int64)
    keys: list[pa.Array] = []
    for column in columns:
        keys += _group_keys(column)
    try:
        return _encoded_ids(keys)
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid):  # a type it does not encode
        pass
    names = [f"k{i}" for i in range(len(keys))]
    table = pa.table([*keys, pa.array(np.arange(rows, dtype=np.int64))], names=[*names, "_i"])
    grouped = table.group_by(names, use_threads=False).aggregate([("_i", "list")])
    members = grouped.column("_i_list").combine_chunks()
    ids = np.empty(rows, np.int64)
    ids[members.flatten().to_numpy()] = pc.list_parent_indices(members).to_numpy()
    return ids


def _encoded_ids(keys: Sequence[pa.Array]) -> np.ndarray:
    """:func:`group_ids` by dictionary encoding (one hash pass per column; a grouping that
    lists each group's rows costs 5 s at 4M rows): each column's codes, in order of first
    appearance, NULL one value; a pair of codes then encoded again as one number. Once every
    row has a group of its own, the other columns cannot split one."""
    ids = None
    for key in keys:
        if ids is not None and len(ids) and int(ids.max()) + 1 == len(ids):
            break
        codes = _codes(key)
        if ids is None:
            ids = codes
            continue
        combined = ids * (int(codes.max(initial=0)) + 1) + codes  # both < rows: no overflow
        ids = _codes(pa.array(combined, pa.int64()))
    return ids


def _codes(key: pa.Array) -> np.ndarray:
    if isinstance(key, pa.ChunkedArray):
        key = key.combine_chunks()
    encoded = pc.dictionary_encode(key, null_encoding="encode")
    return encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)


def first_rows(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The groups of ``ids`` (ascending) and the first row of each."""
    return np.unique(ids, return_index=True)


def sum_by(ids: np.ndarray, groups: int, values: np.ndarray) -> np.ndarray:
    out = np.zeros(groups, np.int64)
    np.add.at(out, ids, values)
    return out


def max_by(ids: np.ndarray, groups: int, column: pa.ChunkedArray) -> pa.Array:
    """The largest non-NULL value of ``column`` (int64) per group; NULL where it has none."""
    valid = pc.is_valid(column).to_numpy(zero_copy_only=False)
    values = pc.fill_null(column, 0).to_numpy(zero_copy_only=False)
    low = np.iinfo(np.int64).min
    out = np.full(groups, low, np.int64)
    np.maximum.at(out, ids[valid], values[valid])
    return pa.array(out, pa.int64(), mask=out == low)


def int_column(table: pa.Table, name: str) -> np.ndarray:
    """An int64 column without NULLs as numpy."""
    return pc.fill_null(table.column(name), 0).to_numpy(zero_copy_only=False).astype(np.int64)


def consolidate(updates: pa.Table, columns: Sequence[str], *, distinct: bool = False) -> pa.Table:
    """``(columns, _lsn, _diff)`` -> one row per distinct value of ``columns``:
    ``_multiplicity`` (the sum of its diffs) and ``_lsn`` (the largest LSN among them).

    Values whose diffs sum to zero are not in the multiset and are dropped. ``distinct``: no
    two of ``updates`` have equal ``columns``, so each is its own row (nothing is grouped).
    """
    columns = list(columns)
    if distinct:
        mult = int_column(updates, DIFF)
        out = updates.select(columns).append_column(MULT, pa.array(mult, pa.int64()))
        return out.append_column(LSN, updates.column(LSN)).filter(pa.array(mult != 0))
    ids = group_ids([updates.column(n) for n in columns], updates.num_rows)
    groups, first = first_rows(ids)
    count = len(groups)
    mult = sum_by(ids, count, int_column(updates, DIFF))
    lsn = max_by(ids, count, updates.column(LSN))
    out = updates.select(columns).take(pa.array(first, pa.int64()))
    out = out.append_column(MULT, pa.array(mult, pa.int64())).append_column(LSN, lsn)
    return out.filter(pa.array(mult != 0))


def positive(state: pa.Table) -> pa.Table:
    """The rows of a consolidated multiset that are in it (a positive multiplicity)."""
    return state.filter(pc.greater(state.column(MULT), 0))
