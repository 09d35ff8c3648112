"""The history rule (``gold.versions.versions``) against a model: for random diffs, applied in
one increment or in several, the versions read as of every LSN are the multiset the diffs sum
to there; and the SCD2 shape holds (several changes in one transaction are one version, a key
change ends one version where the next starts, a restart continues what the new state holds).
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from hypothesis import given, settings
from hypothesis import strategies as st

from pgmedallion.gold.versions import END, END_AT, START, START_AT, TIME, Times, versions

COLUMNS = ["k", "v"]
SCHEMA = pa.schema(
    [
        ("k", pa.int64()),
        ("v", pa.string()),
        (START, pa.int64()),
        (END, pa.int64()),
        (START_AT, TIME),
        (END_AT, TIME),
    ]
)


def _diffs(rows: list[tuple]) -> pa.Table:
    k, v, lsn, diff = zip(*rows, strict=True) if rows else ([], [], [], [])
    return pa.table(
        {
            "k": pa.array(k, pa.int64()),
            "v": pa.array(v, pa.string()),
            "_lsn": pa.array(lsn, pa.int64()),
            "_diff": pa.array(diff, pa.int64()),
        }
    )


def _apply(history: pa.Table, diffs: pa.Table, times: Times, **kw) -> pa.Table:
    """One increment as the table sees it: its open versions replaced by the rule's rows."""
    is_open = pc.is_null(history.column(END))
    closed = history.filter(pc.invert(is_open))
    out = versions(history.filter(is_open), diffs, COLUMNS, times, **kw)
    return pa.concat_tables([closed, out.cast(SCHEMA)])


def _as_of(history: pa.Table, lsn: int) -> Counter:
    rows = history.to_pylist()
    return Counter(
        (r["k"], r["v"]) for r in rows if r[START] <= lsn and (r[END] is None or r[END] > lsn)
    )


def _model(diffs: list[tuple], lsn: int, floor: int = 0) -> Counter:
    out: Counter = Counter()
    for k, v, at, d in diffs:
        if max(at, floor) <= lsn:
            out[(k, v)] += d
    return Counter({row: n for row, n in out.items() if n > 0})


# A valid diff stream: per LSN, a transaction that inserts, deletes or updates rows of a small
# key space with few values (so values repeat: copies, a value coming back), never taking a
# row below zero copies.
@st.composite
def streams(draw):
    present: Counter = Counter()
    out = []
    lsn = 10
    for _ in range(draw(st.integers(1, 25))):
        lsn += draw(st.integers(1, 3))
        for _ in range(draw(st.integers(1, 4))):
            k, v = draw(st.integers(0, 3)), draw(st.sampled_from(["a", "b", None]))
            if present[(k, v)] and draw(st.booleans()):
                out.append((k, v, lsn, -1))
                present[(k, v)] -= 1
                if draw(st.booleans()):  # an update: the row comes back with another value
                    w = draw(st.sampled_from(["a", "b", "c"]))
                    out.append((k, w, lsn, 1))
                    present[(k, w)] += 1
            else:
                out.append((k, v, lsn, 1))
                present[(k, v)] += 1
    return out


@settings(max_examples=150, deadline=None)
@given(streams(), st.lists(st.integers(0, 100), max_size=3))
def test_versions_read_as_of_every_lsn_are_the_diffs_summed_there(stream, cuts):
    times = Times.of([d[2] for d in stream], [d[2] * 1_000_000 for d in stream])
    lsns = sorted({d[2] for d in stream})
    bounds = sorted({lsns[c % len(lsns)] for c in cuts}) + [lsns[-1] + 1]
    history, low = SCHEMA.empty_table(), 0
    for high in bounds:  # increments: the diffs of LSNs in [low, high)
        part = [d for d in stream if low <= d[2] < high]
        history = _apply(history, _diffs(part), times)
        low = high
    for at in range(lsns[0] - 1, lsns[-1] + 2):
        assert _as_of(history, at) == _model(stream, at), at
    # every version is a real interval, and its times are those of its LSNs' commits
    for r in history.to_pylist():
        assert r[END] is None or r[END] > r[START]
        assert r[START_AT].timestamp() == r[START]
        assert (r[END_AT] is None) == (r[END] is None)


def test_several_changes_in_one_transaction_make_one_version_and_a_key_change_joins_up():
    times = Times.of([5, 7, 9], [5_000_000, 7_000_000, 9_000_000])
    stream = [
        (1, "a", 5, 1),
        (1, "a", 7, -1),  # updated twice in transaction 7: a -> x -> b
        (1, "x", 7, 1),
        (1, "x", 7, -1),
        (1, "b", 7, 1),
        (1, "b", 9, -1),  # key change at 9: 1 -> 2
        (2, "b", 9, 1),
    ]
    h = _apply(SCHEMA.empty_table(), _diffs(stream), times)
    got = sorted((r["k"], r["v"], r[START], r[END]) for r in h.to_pylist())
    assert got == [(1, "a", 5, 7), (1, "b", 7, 9), (2, "b", 9, None)]


def test_a_snapshot_starts_at_its_lsn_and_a_restart_continues_what_the_new_state_holds():
    times = Times.of([3, 20], [3_000_000, 20_000_000])
    # a snapshot at LSN 10: its rows at 0, a rewind of a change it holds (LSN 3) at 0
    snap = [(1, "a", 0, 1), (2, "b", 0, 1), (3, "c", 0, 1), (3, "c", 0, -1), (3, "c", 3, 1)]
    h = _apply(SCHEMA.empty_table(), _diffs(snap), times, floor=10)
    assert sorted((r["k"], r[START]) for r in h.to_pylist()) == [(1, 10), (2, 10), (3, 10)]
    # snapshotted again at 30: row 1 unchanged, row 2 gone, row 4 new; then a change at 40
    again = [(1, "a", 0, 1), (3, "c", 0, 1), (4, "d", 0, 1), (3, "c", 40, -1)]
    h = _apply(h, _diffs(again), times, floor=30, restart_at=30)
    got = sorted((r["k"], r["v"], r[START], r[END]) for r in h.to_pylist())
    assert got == [(1, "a", 10, None), (2, "b", 10, 30), (3, "c", 10, 40), (4, "d", 30, None)]
    # the start of the restart's versions takes the last commit's time before it
    four = [r for r in h.to_pylist() if r["k"] == 4][0]
    assert four[START_AT].timestamp() == 20


def test_copies_of_a_row_are_versions_of_their_own():
    times = Times.of([], [])
    stream = [(1, "a", 5, 2), (1, "a", 6, 1), (1, "a", 8, -2)]
    h = _apply(SCHEMA.empty_table(), _diffs(stream[:2]), times)
    h = _apply(h, _diffs(stream[2:]), times)
    got = sorted((r[START], r[END]) for r in h.to_pylist())
    assert got == [(5, 8), (5, 8), (6, None)]  # the oldest copies end first
    assert all(r[START_AT] is None for r in h.to_pylist())  # no commit time known
    assert np.array_equal(np.array([_as_of(h, x)[(1, "a")] for x in (4, 5, 6, 8)]), [0, 2, 3, 1])


def test_as_of_reads_are_rewritten_into_a_history_subquery():
    from pgmedallion.gold.as_of import AsOfError, rewrite

    cols = ["id", "name", START, END, START_AT, END_AT]
    seen = []

    def columns_of(name):
        seen.append(name)
        if "missing" in name:
            raise LookupError(name)
        return cols

    q = rewrite(
        "SELECT o.id FROM gold.orders AS OF LSN '0/10' o JOIN gold.items AS OF LSN '16' "
        "ON o.id = items.id WHERE o.id > 1",
        columns_of,
        lambda t: 99,
    )
    assert seen == ["gold.`orders__history`", "gold.`items__history`"]
    assert "WHERE __start_lsn <= 16 AND (__end_lsn IS NULL OR __end_lsn > 16)) AS o JOIN" in q
    assert q.endswith("AS items ON o.id = items.id WHERE o.id > 1"), q
    assert "`name`" in q and "__start_at" not in q
    t = rewrite("SELECT * FROM orders AS OF TIMESTAMP '2026-11-28 12:00:00'", columns_of, len)
    assert "__start_lsn <= 19 " in t and t.endswith("AS orders")  # len(...) is the "LSN"
    try:
        rewrite("SELECT * FROM missing AS OF LSN '1'", columns_of, len)
        raise AssertionError("no error")
    except AsOfError as e:
        assert "keeps no history" in str(e)
    try:
        rewrite("SELECT * FROM orders AS OF LSN 'x/y/z'", columns_of, len)
        raise AssertionError("no error")
    except AsOfError as e:
        assert "not an LSN" in str(e)
