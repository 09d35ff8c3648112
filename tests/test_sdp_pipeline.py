"""The declarative pipeline runs locally through Spark Connect, twice on the same state."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from chispa import assert_df_equality
from pyspark.sql import Row

from pgmedallion.core.expectations import quality_schema
from pgmedallion.marts.runner import run_pipeline
from tests.conftest import STATE

TINY = Path(__file__).parent / "pipelines" / "tiny"


def _append(spark, path: Path, rows: list[tuple[str | None, int]]) -> None:
    spark.createDataFrame(rows, "kind string, value long").write.format("delta").mode(
        "append"
    ).save(str(path))


def _read(spark, state: Path, table: str):
    # The pipeline has its own metastore (Derby admits one JVM), so read its tables by path.
    return spark.read.format("delta").load(str(state / "warehouse" / "tiny.db" / table))


@pytest.mark.slow
def test_streaming_table_and_materialized_view_twice(spark):
    state = STATE / "sdp-tiny"
    shutil.rmtree(state, ignore_errors=True)
    source = state / "source"
    conf = {"tiny.source": str(source)}
    _append(spark, source, [("a", 1), ("a", 2), ("b", 150), (None, 5)])

    first = run_pipeline([TINY], state_dir=state, name="tiny", schema="tiny", configuration=conf)
    assert first.ok, first.failure()
    summary_schema = "kind string, n long, value long"
    expected = spark.createDataFrame([("a", 2, 3), ("b", 1, 150)], summary_schema)
    assert_df_equality(
        _read(spark, state, "event_summary"), expected, ignore_row_order=True, ignore_nullable=True
    )
    quality = _read(spark, state, "event_summary_quality").collect()
    assert sorted(quality) == sorted(
        [
            Row(dataset="event_summary", rule="small_value", action="warn", passed=2, failed=1),
            Row(dataset="event_summary", rule="has_kind", action="drop", passed=2, failed=1),
        ]
    )

    # The counts also land in the schema's `_quality`, in gold's quality format, run 1.
    recorded = [
        (r["run"], r["source"], r["table"], r["rule"], r["policy"], r["failed"], r["passed"])
        for r in first.quality
    ]
    assert recorded == [
        (1, "tiny", "event_summary", "has_kind", "drop", 1, 2),
        (1, "tiny", "event_summary", "small_value", "warn", 1, 2),
    ]
    table = _read(spark, state, "_quality")
    assert table.schema.fieldNames() == quality_schema().fieldNames()
    assert sorted(tuple(r)[:7] for r in table.collect()) == recorded

    # The second run on the same state reads only the new source rows into the streaming table.
    _append(spark, source, [("a", 10), ("c", 1)])
    second = run_pipeline([TINY], state_dir=state, name="tiny", schema="tiny", configuration=conf)
    assert second.ok, second.failure()
    assert _read(spark, state, "events").count() == 6
    expected = spark.createDataFrame([("a", 3, 13), ("b", 1, 150), ("c", 1, 1)], summary_schema)
    assert_df_equality(
        _read(spark, state, "event_summary"), expected, ignore_row_order=True, ignore_nullable=True
    )
    assert [(r["run"], r["rule"], r["failed"]) for r in second.quality] == [
        (2, "has_kind", 1),
        (2, "small_value", 1),
    ]
    assert _read(spark, state, "_quality").count() == 4
