"""The narrowed reads of the batched paths (``core.delta_rs.narrowings``): a large table's gold
rows, or silver's earlier rows, are read only where the changed keys' integer values can be, and the
rules then pick the touched keys' rows exactly. So the filter must admit every row holding the
values it was built from, whatever they are: NULLs, the extremes of int64, one value, many
(more than ``LISTED_VALUES``: several lists, each a query; past ``LISTS`` of them: a range),
none; and a row once only (the lists are disjoint). Real Delta tables written and read by
delta-rs.
"""

from __future__ import annotations

import pyarrow as pa
import pytest
from deltalake import write_deltalake
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pgmedallion.core import delta_rs

INT64 = st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1), st.integers(-3, 3))
ROWS = st.lists(
    st.tuples(INT64, st.one_of(st.none(), st.integers(-(2**15), 2**15 - 1))), max_size=30
)


@pytest.fixture(scope="module")
def where(tmp_path_factory):
    return tmp_path_factory.mktemp("narrowing")


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(rows=ROWS, picks=st.lists(st.integers(0, 29), max_size=8), extra=st.lists(INT64, max_size=5))
def test_a_narrowed_read_holds_every_row_of_the_values_it_names(where, rows, picks, extra):
    table = pa.table(
        {
            "id": pa.array([r[0] for r in rows], pa.int64()),
            "n": pa.array([r[1] for r in rows], pa.int16()),
            "seq": pa.array(range(len(rows)), pa.int64()),
        }
    )
    path = str(where / f"t{abs(hash((tuple(rows), tuple(picks), tuple(extra))))}")
    write_deltalake(path, table, mode="overwrite")
    chosen = [rows[i] for i in picks if i < len(rows)]
    ids = pa.array([r[0] for r in chosen] + extra, pa.int64())
    ns = pa.array([r[1] for r in chosen], pa.int16())
    parts = delta_rs.narrowings({"id": ids, "n": ns})
    seqs = delta_rs.read_narrowed(path, ["seq"], None, parts).column("seq").to_pylist()
    read = set(seqs)
    assert len(read) == len(seqs)  # no row twice
    wanted = {i for i, r in enumerate(rows) if r in chosen}
    assert wanted <= read
    assert delta_rs.count_narrowed(path, None, parts) == len(read)
    if not chosen and not extra:
        assert read == set()  # no values: nothing to read


def test_many_values_narrow_by_several_lists_then_by_their_range(where, monkeypatch):
    monkeypatch.setattr(delta_rs, "LISTED_VALUES", 50)
    monkeypatch.setattr(delta_rs, "LISTS", 3)
    path = str(where / "many")
    ids = pa.array([*range(3_000), None], pa.int64())
    write_deltalake(path, pa.table({"id": ids}), mode="overwrite")
    for count, step in ((51, 7), (150, 3), (151, 2)):
        values = pa.array([*range(100, 100 + step * count, step), None], pa.int64())
        parts = delta_rs.narrowings({"id": values})
        expected = [v for v in values.to_pylist() if v is not None]
        if count <= 150:
            assert len(parts) == -(-count // 50)
            assert all(" IN " in p for p in parts)
        else:  # past three lists: the range alone
            assert len(parts) == 1 and " IN " not in parts[0]
            expected = list(range(100, 100 + step * (count - 1) + 1))
        got = delta_rs.read_narrowed(path, ["id"], "id >= 0 OR id IS NULL", parts)
        assert sorted(v for v in got.column("id").to_pylist() if v is not None) == expected
        assert got.column("id").null_count == 1  # the NULL row, once
        assert delta_rs.count_narrowed(path, None, parts) == got.num_rows


def test_a_bounded_read_gives_every_row_or_says_there_are_more(where, monkeypatch):
    """``read_at_most`` reads what ``read_narrowed`` reads when it is at most the bound, and
    None past it, whichever of several lists the bound is crossed in."""
    monkeypatch.setattr(delta_rs, "LISTED_VALUES", 50)
    path = str(where / "bounded")
    write_deltalake(path, pa.table({"id": pa.array(range(1_000), pa.int64())}), mode="overwrite")
    parts = delta_rs.narrowings({"id": pa.array(range(0, 240, 2), pa.int64())})  # 120: 3 lists
    assert len(parts) == 3
    whole = delta_rs.read_narrowed(path, ["id"], None, parts)
    assert whole.num_rows == 120
    exact = delta_rs.read_at_most(path, ["id"], None, parts, 120)
    assert sorted(exact.column("id").to_pylist()) == sorted(whole.column("id").to_pylist())
    for most in (0, 49, 50, 99, 119):
        assert delta_rs.read_at_most(path, ["id"], None, parts, most) is None, most
    assert delta_rs.read_at_most(path, ["id"], "id < 100", parts, 50).num_rows == 50
