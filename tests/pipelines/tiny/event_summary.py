"""A materialized view over the streaming table, with a warn and a drop expectation."""

from pyspark.sql import functions as F

from pgmedallion.core.expectations import expect, expect_or_drop, materialized_view


@materialized_view(name="event_summary")
@expect("small_value", "value < 100")
@expect_or_drop("has_kind", "kind IS NOT NULL")
def event_summary():
    return (
        spark.read.table("events")  # noqa: F821 - SDP injects `spark`
        .groupBy("kind")
        .agg(F.count("*").alias("n"), F.sum("value").alias("value"))
    )
