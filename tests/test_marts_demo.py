"""The demo marts' pure functions (``marts/demo/logic.py``), on real local Spark."""

from __future__ import annotations

from datetime import date, datetime
from decimal import Decimal

import pytest
from chispa import assert_df_equality

from pgmedallion.marts.demo.logic import daily_revenue, order_status

ORDERS = "id long, customer_id long, status string, placed_at timestamp, total decimal(14,2)"


@pytest.fixture
def orders(spark):
    return spark.createDataFrame(
        [
            (1, 10, "paid", datetime(2026, 1, 1, 9, 0), Decimal("10.50")),
            (2, 11, "new", datetime(2026, 1, 1, 23, 59), Decimal("4.50")),
            (3, 10, "cancelled", datetime(2026, 1, 1, 12, 0), Decimal("100.00")),
            (4, 12, "shipped", datetime(2026, 1, 2, 0, 0), Decimal("7.25")),
            (5, 12, "cancelled", datetime(2026, 1, 3, 8, 0), Decimal("1.00")),
        ],
        ORDERS,
    )


def test_daily_revenue_counts_every_order_but_the_cancelled_per_day(spark, orders):
    expected = spark.createDataFrame(
        [(date(2026, 1, 1), 2, Decimal("15.00")), (date(2026, 1, 2), 1, Decimal("7.25"))],
        "day date, orders long, revenue decimal(24,2)",
    )
    assert_df_equality(daily_revenue(orders), expected, ignore_row_order=True, ignore_nullable=True)


def test_order_status_counts_and_sums_per_status(spark, orders):
    expected = spark.createDataFrame(
        [
            ("paid", 1, Decimal("10.50")),
            ("new", 1, Decimal("4.50")),
            ("cancelled", 2, Decimal("101.00")),
            ("shipped", 1, Decimal("7.25")),
        ],
        "status string, orders long, value decimal(24,2)",
    )
    assert_df_equality(order_status(orders), expected, ignore_row_order=True, ignore_nullable=True)
