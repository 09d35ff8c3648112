"""The narrowed reads of the batched paths (``core.delta_rs.narrowing``): a large table's gold rows,
or silver's earlier rows, are read only where the changed keys' integer values can be, and the
rules then pick the touched keys' rows exactly. So the filter must admit every row holding the
values it was built from, whatever they are: NULLs, the extremes of int64, one value, many
(more than ``LISTED_VALUES``: a range), none. Real Delta tables written and read by delta-rs.
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
    sql = delta_rs.narrowing({"id": ids, "n": ns})
    read = set(delta_rs.read_arrow(path, ["seq"], sql).column("seq").to_pylist())
    wanted = {i for i, r in enumerate(rows) if r in chosen}
    assert wanted <= read
    assert delta_rs.count(path, sql) == len(read)
    if not chosen and not extra:
        assert read == set()  # no values: nothing to read


def test_many_values_narrow_by_their_range(where):
    path = str(where / "many")
    write_deltalake(path, pa.table({"id": pa.array(range(30_000), pa.int64())}), mode="overwrite")
    many = delta_rs.LISTED_VALUES + 1
    values = pa.array(range(100, 100 + 2 * many, 2), pa.int64())
    sql = delta_rs.narrowing({"id": values})
    assert " IN " not in sql
    read = delta_rs.read_arrow(path, ["id"], sql).column("id").to_pylist()
    assert sorted(read) == list(range(100, 100 + 2 * many - 1))
