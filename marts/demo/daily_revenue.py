"""Revenue per day, from gold's orders."""

from pgmedallion.core.expectations import expect, expect_or_drop, materialized_view
from pgmedallion.marts.demo import logic


@materialized_view(name="daily_revenue")
@expect_or_drop("day_present", "day IS NOT NULL")
@expect("revenue_positive", "revenue > 0")
def daily_revenue():
    return logic.daily_revenue(logic.gold_table(spark, "public_orders"))  # noqa: F821
