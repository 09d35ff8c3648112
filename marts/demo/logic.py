"""The demo marts' transformations: pure ``DataFrame -> DataFrame`` functions over gold tables.

The definition files beside this one only read gold and decorate; everything a mart computes is
here, tested with local Spark (``tests/test_marts_demo.py``).
"""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from pgmedallion.marts import GOLD_SCHEMA_KEY


def gold_table(spark: SparkSession, name: str) -> DataFrame:
    """Gold table ``name`` in the schema the pipeline's configuration names."""
    schema = spark.conf.get(GOLD_SCHEMA_KEY, "pgm_gold")
    return spark.read.table(f"`{schema}`.`{name}`")


def daily_revenue(orders: DataFrame) -> DataFrame:
    """Per day orders were placed on (in the session time zone, UTC locally): how many, and
    their revenue. Cancelled orders do not count."""
    return (
        orders.where(F.col("status") != "cancelled")
        .groupBy(F.to_date("placed_at").alias("day"))
        .agg(F.count("*").alias("orders"), F.sum("total").alias("revenue"))
    )


def order_status(orders: DataFrame) -> DataFrame:
    """Per order status: how many orders have it, and their total value."""
    return orders.groupBy("status").agg(F.count("*").alias("orders"), F.sum("total").alias("value"))
