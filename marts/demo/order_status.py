"""Orders per status, from gold's orders."""

from pgmedallion.core.expectations import expect, expect_or_fail, materialized_view
from pgmedallion.marts.demo import logic


@materialized_view(name="order_status")
@expect_or_fail("known_status", "status IN ('new', 'paid', 'shipped', 'cancelled')")
@expect("value_not_negative", "value >= 0")
def order_status():
    return logic.order_status(logic.gold_table(spark, "public_orders"))  # noqa: F821
