"""``core.multiset``: which rows are equal (Spark's equality) and their sums, against plain Python.

Arrow's own grouping tells NaNs of different bits apart, tells -0.0 from 0.0 and takes no
nested keys; ``group_ids`` must group exactly as Spark's ``groupBy`` does.
"""

from __future__ import annotations

import math
import struct
from collections import Counter

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from pgmedallion.core.multiset import DIFF, LSN, MULT, consolidate, group_ids, positive

OTHER_NAN = struct.unpack("<d", struct.pack("<Q", 0x7FF8000000000001))[0]
floats = st.sampled_from([None, 0.0, -0.0, 1.5, math.nan, OTHER_NAN])
ints = st.sampled_from([None, 1, 2])
lists = st.one_of(st.none(), st.lists(floats, max_size=2))
structs = st.one_of(st.none(), st.fixed_dictionaries({"a": ints, "b": floats}))
rows = st.lists(st.tuples(ints, floats, lists, structs), max_size=12)
SCHEMA = pa.schema(
    [
        ("i", pa.int64()),
        ("f", pa.float64()),
        ("l", pa.list_(pa.float64())),
        ("s", pa.struct([("a", pa.int64()), ("b", pa.float64())])),
    ]
)


def spark_equal_form(value):
    if isinstance(value, float):
        return "NaN" if math.isnan(value) else value + 0.0
    if isinstance(value, list):
        return tuple(spark_equal_form(v) for v in value)
    if isinstance(value, dict):
        return tuple((k, spark_equal_form(v)) for k, v in sorted(value.items()))
    return value


def table_of(values: list[tuple]) -> pa.Table:
    return pa.Table.from_pylist([dict(zip(SCHEMA.names, v, strict=True)) for v in values], SCHEMA)


@settings(deadline=None)
@given(rows)
def test_group_ids_group_as_spark_does(values):
    table = table_of(values)
    ids = group_ids([table.column(n) for n in SCHEMA.names], table.num_rows)
    forms = [tuple(spark_equal_form(v) for v in row) for row in values]
    for a in range(len(values)):
        for b in range(len(values)):
            assert (ids[a] == ids[b]) == (forms[a] == forms[b]), (values[a], values[b])
    assert sorted(set(ids.tolist())) == list(range(len(set(forms))))


@settings(deadline=None)
@given(rows, st.lists(st.sampled_from([-2, -1, 1, 3]), min_size=12, max_size=12))
def test_consolidate_sums_diffs_per_row_and_drops_zeros(values, diffs):
    table = table_of(values)
    table = table.append_column(LSN, pa.array(range(len(values)), pa.int64()))
    table = table.append_column(DIFF, pa.array(diffs[: len(values)], pa.int64()))
    want: Counter = Counter()
    last: dict = {}
    for i, row in enumerate(values):
        form = tuple(spark_equal_form(v) for v in row)
        want[form] += diffs[i]
        last[form] = i
    got = consolidate(table, SCHEMA.names).to_pylist()
    assert {tuple(spark_equal_form(r[n]) for n in SCHEMA.names): r[MULT] for r in got} == {
        k: m for k, m in want.items() if m != 0
    }
    assert all(r[LSN] == last[tuple(spark_equal_form(r[n]) for n in SCHEMA.names)] for r in got)
    kept = positive(consolidate(table, SCHEMA.names)).column(MULT).to_pylist()
    assert kept == [m for m in (r[MULT] for r in got) if m > 0]


def test_no_columns_is_one_group_and_no_rows_none():
    assert group_ids([], 3).tolist() == [0, 0, 0]
    assert group_ids([pa.array([], pa.int64())], 0).tolist() == []
