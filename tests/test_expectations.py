"""Expectation semantics outside Databricks: warn keeps, drop filters, fail raises; all count."""

from __future__ import annotations

from datetime import datetime

import pytest
from chispa import assert_df_equality
from pyspark.errors import PySparkException
from pyspark.sql import Row

from pgmedallion.core.expectations import (
    DROP,
    FAIL,
    QUALITY_ARROW,
    WARN,
    Expectation,
    apply_expectations,
    expect,
    expect_all,
    expect_all_or_drop,
    expect_all_or_fail,
    expect_or_drop,
    expect_or_fail,
    quality_counts,
    quality_frame,
    quality_rows,
    rules_of,
)
from pgmedallion.gold import reports as gold_reports

SCHEMA = "id long, qty long"


@pytest.fixture
def rows(spark):
    return spark.createDataFrame([(1, 5), (2, -1), (None, 3), (4, None)], SCHEMA)


def test_warn_keeps_every_row_and_counts_failures(spark, rows):
    rules = [Expectation("qty_positive", "qty > 0", WARN)]
    assert_df_equality(apply_expectations(rows, rules), rows)
    assert quality_counts(rows, "t", rules).collect() == [
        Row(dataset="t", rule="qty_positive", action="warn", passed=2, failed=2)
    ]


def test_drop_filters_false_and_null_and_counts(spark, rows):
    rules = [
        Expectation("id_present", "id IS NOT NULL", DROP),
        Expectation("qty_positive", "qty > 0", DROP),
    ]
    expected = spark.createDataFrame([(1, 5)], SCHEMA)
    assert_df_equality(apply_expectations(rows, rules), expected)
    assert quality_counts(rows, "t", rules).collect() == [
        Row(dataset="t", rule="id_present", action="drop", passed=3, failed=1),
        Row(dataset="t", rule="qty_positive", action="drop", passed=2, failed=2),
    ]


def test_fail_names_the_rule_and_the_offending_row(spark):
    rows = spark.createDataFrame([(1, 5), (2, -1), (3, 7)], SCHEMA)
    rules = [Expectation("qty_positive", "qty > 0", FAIL)]
    with pytest.raises(PySparkException) as info:
        apply_expectations(rows, rules).collect()
    message = str(info.value)
    assert "qty_positive" in message
    assert '"id":2' in message and '"qty":-1' in message


def test_fail_passes_clean_data_through(spark):
    clean = spark.createDataFrame([(1, 5), (2, 7)], SCHEMA)
    assert_df_equality(apply_expectations(clean, [Expectation("q", "qty > 0", FAIL)]), clean)


def test_decorators_stack_rules_in_order():
    @expect("a", "x > 0")
    @expect_or_drop("b", "y > 0")
    @expect_or_fail("c", "z > 0")
    @expect_all({"d": "1 = 1", "e": "2 = 2"})
    @expect_all_or_drop({"f": "true"})
    @expect_all_or_fail({"g": "true"})
    def dataset():
        return "df"

    assert dataset() == "df"
    assert [(r.name, r.action) for r in rules_of(dataset)] == [
        ("g", FAIL),
        ("f", DROP),
        ("d", WARN),
        ("e", WARN),
        ("c", FAIL),
        ("b", DROP),
        ("a", WARN),
    ]


def test_quality_counts_become_rows_of_the_shared_quality_format(spark, rows):
    """A dataset's counts land in the columns of gold's ``_quality`` (one format for both)."""
    assert gold_reports.QUALITY_ARROW is QUALITY_ARROW
    rules = [Expectation("qty_positive", "qty > 0", WARN), Expectation("id", "id > 0", FAIL)]
    at = datetime(2026, 1, 2, 3, 4, 5)
    got = quality_rows(quality_counts(rows, "t", rules), run=7, source="shop", checked_at=at)
    expected = quality_frame(
        spark,
        [
            (7, "shop", "t", "qty_positive", "warn", 2, 2, "[]", at),
            (7, "shop", "t", "id", "fail", 1, 3, "[]", at),
        ],
    )
    assert_df_equality(got, expected, ignore_nullable=True)
