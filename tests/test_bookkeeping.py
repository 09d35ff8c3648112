"""A layer's own small tables (``_progress``, ``_frontier``, ...) read by either reader: delta-rs
where the table is a local directory, Spark elsewhere (``core.delta_rs.bookkeeping_rows`` and
``bookkeeping_max``). The callers' logic runs over either reader's answer, so both must give the
same one."""

from __future__ import annotations

import pytest

from pgmedallion.core import delta_rs, engine
from pgmedallion.core.config import LakehouseConfig

SCHEMA = "`pgm_bookkeeping`"


@pytest.fixture
def progress(spark):
    spark.sql("DROP SCHEMA IF EXISTS pgm_bookkeeping CASCADE")
    spark.sql("CREATE SCHEMA pgm_bookkeeping")
    rows = [("a", 1, 10), ("a", 2, 30), ("a", 3, None), ("b's", 4, 99), ("c", 5, None)]
    spark.createDataFrame(rows, "source string, run long, frontier long").write.format(
        "delta"
    ).saveAsTable("pgm_bookkeeping._progress")
    yield "_progress"
    spark.sql("DROP SCHEMA IF EXISTS pgm_bookkeeping CASCADE")


@pytest.mark.parametrize("setting", ["auto", "spark"])
def test_rows_and_the_largest_value_are_the_same_through_either_reader(spark, progress, setting):
    engine.use(LakehouseConfig(engine=setting))
    assert delta_rs.bookkeeping_through_spark(spark, SCHEMA) == (setting == "spark")

    def largest(source: str):
        return delta_rs.bookkeeping_max(spark, SCHEMA, progress, "frontier", {"source": source})

    assert largest("a") == 30  # NULLs left out
    assert largest("b's") == 99  # a quote in the value
    assert largest("c") is None and largest("nobody") is None
    rows = delta_rs.bookkeeping_rows(spark, SCHEMA, progress, ["run", "frontier"], {"source": "a"})
    assert sorted(rows, key=lambda r: r["run"]) == [
        {"run": 1, "frontier": 10},
        {"run": 2, "frontier": 30},
        {"run": 3, "frontier": None},
    ]
    assert len(delta_rs.bookkeeping_rows(spark, SCHEMA, progress, ["run"], {})) == 5


@pytest.mark.parametrize("setting", ["auto", "spark"])
def test_the_newest_row_is_the_same_through_either_reader(spark, progress, setting):
    engine.use(LakehouseConfig(engine=setting))

    def newest(source: str, by: str):
        return delta_rs.bookkeeping_latest(
            spark, SCHEMA, progress, ["run", "frontier"], {"source": source}, by=by
        )

    assert newest("a", "run") == {"run": 3, "frontier": None}
    assert newest("a", "frontier") == {"run": 2, "frontier": 30}  # NULLs last
    assert newest("b's", "run") == {"run": 4, "frontier": 99}
    assert newest("nobody", "run") is None
