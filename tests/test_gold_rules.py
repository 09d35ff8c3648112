"""Gold's state and MERGE operations against a plain reference, on random diffs (hypothesis).

Gold's rules (``pgmedallion.gold.state``, Arrow) run in two places: a large table's build applies
them by buckets of keys in Spark's Python workers (``pgmedallion.gold.on_spark``), and the
batched path of small local tables in the driver (``pgmedallion.gold.batch``: rows read by
delta-rs, the quality rules of several tables packed into one Spark job). Both must turn gold's
old rows and silver's new diffs into MERGE operations that leave gold holding exactly the
reference state: for the keys the diffs touch, every row value
whose diffs (old gold rows counting +1) sum to m > 0, m times, at the largest LSN among them;
other keys as they were; and both must fail the same rules on the same rows. Keyed and
key-less tables, NULL keys, NaN and -0.0, negative multiplicities, several tables at once, and
tables counted as large (gold's rows read narrowed by the diffs' integer key values).
Real Spark, real Delta tables (written by delta-rs).
"""

from __future__ import annotations

import math
from collections import Counter
from types import SimpleNamespace

import pyarrow as pa
import pytest
from deltalake import write_deltalake
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import types as T

from pgmedallion.gold import on_spark
from pgmedallion.gold.batch import _Item, _rules, _state
from pgmedallion.gold.quality import row_rules
from pgmedallion.gold.state import (
    DELETE,
    INSERT,
    KEY_ROWS,
    LSN,
    MULT,
    OP,
    UPSERT,
    failed_rules,
    judge,
    merge_operations,
    state_of,
)

COLUMNS = [
    T.StructField("id", T.LongType()),
    T.StructField("v", T.DoubleType()),
    T.StructField("s", T.StringType()),
]
NAMES = [f.name for f in COLUMNS]
ARROW = pa.schema([("id", pa.int64()), ("v", pa.float64()), ("s", pa.string())])

rows = st.tuples(
    st.sampled_from([None, 1, 2, 3]),
    st.sampled_from([None, 0.0, -0.0, 1.5, math.nan]),
    st.sampled_from([None, "", "a", "b"]),
)
tables = st.fixed_dictionaries(
    {
        "keyed": st.booleans(),
        # a table above ``small_table_rows``: gold's rows read narrowed by the diffs' ids
        "large": st.booleans(),
        "gold": st.lists(st.tuples(rows, st.integers(0, 3)), max_size=6),
        "diffs": st.lists(
            st.tuples(rows, st.integers(1, 6), st.sampled_from([-2, -1, 1, 2])), max_size=8
        ),
    }
)


def norm(value):
    """Spark's equality for grouping and keys: NaN equal to NaN, -0.0 equal to 0.0."""
    if isinstance(value, float):
        return "NaN" if math.isnan(value) else value + 0.0
    return value


def key_of(row, keyed: bool):
    return (norm(row[0]),) if keyed else tuple(norm(v) for v in row)


def reference(table: dict) -> Counter:
    """Gold after the run: (normalized row, lsn) -> copies. The keys the diffs touch hold the
    row values whose diffs (gold's old rows counting +1) sum to m > 0, m times, at the largest
    LSN among them; gold's rows of other keys stay as they are."""
    keyed = table["keyed"]
    touched = {key_of(row, keyed) for row, _, _ in table["diffs"]}
    out: Counter = Counter()
    mult: dict = {}
    lsn: dict = {}
    for row, at in table["gold"]:
        k = tuple(norm(v) for v in row)
        if key_of(row, keyed) not in touched:
            out[(k, at)] += 1
            continue
        mult[k] = mult.get(k, 0) + 1
        lsn[k] = max(lsn.get(k, at), at)
    for row, at, diff in table["diffs"]:
        k = tuple(norm(v) for v in row)
        mult[k] = mult.get(k, 0) + diff
        lsn[k] = max(lsn.get(k, at), at)
    out.update({(k, lsn[k]): m for k, m in mult.items() if m > 0})
    return out


def apply_merge(table: dict, ops: list[dict]) -> Counter:
    """Delta MERGE of ``ops`` into gold's old rows, as ``merge_gold`` states it: a target row
    matching a non-insert source row on the key is deleted or replaced; an unmatched upsert or
    insert is inserted. Every target row matches at most one source row."""
    keyed = table["keyed"]
    target = [list(row) + [at] for row, at in table["gold"]]
    out = []
    matched_sources = set()
    for old in target:
        key = key_of(old[:3], keyed)
        hits = [
            i
            for i, op in enumerate(ops)
            if op[OP] != INSERT and key_of([op[n] for n in NAMES], keyed) == key
        ]
        assert len(hits) <= 1, "a target row matches several source rows"
        if not hits:
            out.append(old)
            continue
        matched_sources.add(hits[0])
        op = ops[hits[0]]
        if op[OP] == UPSERT:
            out.append([op[n] for n in NAMES] + [op[LSN]])
        else:
            assert op[OP] == DELETE
    for i, op in enumerate(ops):
        if i not in matched_sources and op[OP] in (UPSERT, INSERT):
            out.append([op[n] for n in NAMES] + [op[LSN]])
    return Counter((tuple(norm(v) for v in row[:3]), row[3]) for row in out)


def arrow_of(table: dict) -> tuple[pa.Table, pa.Table]:
    updates = pa.Table.from_pylist(
        [
            {**dict(zip(NAMES, row, strict=True)), LSN: at, "_diff": diff}
            for row, at, diff in table["diffs"]
        ],
        schema=pa.schema([*ARROW, (LSN, pa.int64()), ("_diff", pa.int64())]),
    )
    gold = pa.Table.from_pylist(
        [{**dict(zip(NAMES, row, strict=True)), LSN: at} for row, at in table["gold"]],
        schema=pa.schema([*ARROW, (LSN, pa.int64())]),
    )
    return updates, gold


def item_of(table: dict, where) -> _Item:
    """The batched path's item for a table whose silver and gold rows are Delta tables."""
    pk = ["id"] if table["keyed"] else []
    updates, gold = arrow_of(table)
    silver_path, gold_path = str(where / "silver"), str(where / "gold")
    write_deltalake(silver_path, updates, mode="overwrite")
    write_deltalake(gold_path, gold, mode="overwrite")
    t = SimpleNamespace(
        names=NAMES,
        columns=list(ARROW),
        spark_columns=COLUMNS,
        key=pk or NAMES,
        keyed=bool(pk),
        info=SimpleNamespace(primary_key=pk),
        rules=row_rules(pk, [], "warn"),
        silver_path=silver_path,
        path=gold_path,
        updates_where=lambda after: None,
    )
    rows = 10**12 if table["large"] else 0  # gold's rows as its last commit counted them
    item = _Item(t, SimpleNamespace(silver_run=0, rows=rows), "incremental", True)
    _state(item)
    return item


def state_rows(item: _Item) -> list[tuple[list, int, int]]:
    names = item.t.names
    return [([r[n] for n in names], r[MULT], r[LSN]) for r in item.state.to_pylist()]


def reference_rules(item: _Item, keyed: bool) -> list[set[str]]:
    """The rules each state row fails, computed plainly."""
    copies: Counter = Counter()
    for values, m, _ in state_rows(item):
        copies[key_of(values, keyed)] += max(m, 0)
    out = []
    for values, m, _ in state_rows(item):
        failed = set()
        if keyed and values[0] is None:
            failed.add("primary_key_not_null")
        if keyed and copies[key_of(values, keyed)] > 1:
            failed.add("primary_key_unique")
        if m < 0:
            failed.add("multiplicity_not_negative")
        out.append(failed)
    return out


def per_table_ops(spark, table: dict) -> list[dict]:
    """The large-table path: the same rules applied by Spark, by buckets of keys."""
    updates, gold = arrow_of(table)
    schema = T.StructType(COLUMNS)
    diffs = spark.createDataFrame(updates, schema=T.StructType([*schema, *_DIFF_FIELDS]))
    gold_df = spark.createDataFrame(
        gold.append_column("_diff", pa.array([1] * gold.num_rows, pa.int64())),
        schema=T.StructType([*schema, *_DIFF_FIELDS]),
    )
    pk = ["id"] if table["keyed"] else []
    key = pk or NAMES
    touched = diffs.select(*key).distinct()
    old = on_spark.old_state(gold_df.drop("_diff"), touched, key, NAMES)
    affected = on_spark.affected_keys(touched, old, key)
    rules = row_rules(pk, [], "warn")
    rows = on_spark.settled(diffs.unionByName(old), NAMES, pk, key, rules, "warn")
    checked, _ = on_spark.split(rows, [r.name for r in rules])
    ops = on_spark.merge_operations(checked, affected, key, NAMES)
    return [r.asDict() for r in ops.collect()]


_DIFF_FIELDS = [T.StructField(LSN, T.LongType()), T.StructField("_diff", T.LongType())]


SETTINGS = settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@pytest.mark.filterwarnings("ignore")
@SETTINGS
@given(st.lists(tables, min_size=1, max_size=3))
def test_merge_operations_leave_gold_at_the_reference_state(spark, tmp_path_factory, group):
    items = [item_of(table, tmp_path_factory.mktemp("t")) for table in group]
    checked = _rules(spark, items)  # several tables' rules in one packed Spark job
    for table, item, (with_rules, _) in zip(group, items, checked, strict=True):
        keyed = table["keyed"]
        want = reference(table)
        judged = judge(with_rules, "warn")
        driver = merge_operations(judged, item.affected, item.t.key, NAMES).to_pylist()
        assert apply_merge(table, driver) == want
        assert apply_merge(table, per_table_ops(spark, table)) == want
        touched = {key_of(row, keyed) for row, _, _ in table["diffs"]}
        old = sum(1 for row, _ in table["gold"] if key_of(row, keyed) in touched)
        assert item.old_rows == old
        failed = [set(r) for r in with_rules.column("_rules").to_pylist()]
        assert failed == reference_rules(item, keyed)
        rules = item.t.rules  # the same rules over Arrow (what Spark's workers evaluate)
        in_arrow = [set(r) for r in failed_rules(item.state, rules).to_pylist()]
        assert in_arrow == reference_rules(item, keyed)
        copies = Counter()
        for values, m, _ in state_rows(item):
            copies[key_of(values, keyed)] += max(m, 0)
        rows = state_rows(item)
        assert item.state.column(KEY_ROWS).to_pylist() == [
            copies[key_of(v, keyed)] for v, _, _ in rows
        ]


@settings(max_examples=80, deadline=None)
@given(st.lists(rows, max_size=8))
def test_insertions_of_a_keyed_table_need_no_grouping(values):
    """Gold's first build of a large table in pieces takes a keyed table's insertions as its
    state without grouping them (``state_of(..., distinct=True)``): where two of them are
    equal (Spark's equality: NaN = NaN, -0.0 = 0.0) they share a key, so the key's rule fails
    either way; otherwise the state is the grouped one, row for row."""
    diffs = pa.table(
        {
            "id": pa.array([v[0] for v in values], pa.int64()),
            "v": pa.array([v[1] for v in values], pa.float64()),
            "s": pa.array([v[2] for v in values], pa.string()),
            LSN: pa.array(range(len(values)), pa.int64()),
            "_diff": pa.array([1] * len(values), pa.int64()),
        }
    )
    rules = row_rules(["id"], [], "warn")

    def passes(state: pa.Table) -> bool:
        return all(bool(rule.check.passes(state).all()) for rule in rules)

    grouped = state_of(diffs, NAMES, ["id"])
    ungrouped = state_of(diffs, NAMES, ["id"], distinct=True)
    assert passes(grouped) == passes(ungrouped)
    if passes(grouped):
        assert sorted(map(repr, grouped.to_pylist())) == sorted(map(repr, ungrouped.to_pylist()))
