"""The marts stage in a process of its own (it ends the process's Spark JVM, which the test
session's shared one must survive).

Run as ``python -m tests.marts_child STATE`` from the repository root. The child opens a local
session on STATE, writes a gold ``public_orders`` table, runs ``run_stages(spark, cfg,
("marts",))`` with the demo's marts, opens a new session on the same metastore and reads the
marts back; then it adds an order with an unknown status and runs the marts again, which the
``known_status`` expect_or_fail rule must fail. It prints one JSON object.
"""

from __future__ import annotations

import json
import sys
from datetime import datetime
from decimal import Decimal

from pgmedallion.core.config import Config, LakehouseConfig, SourceConfig
from pgmedallion.core.spark import get_spark
from pgmedallion.demo import DEMO_MARTS
from pgmedallion.marts.runner import MartsError
from pgmedallion.pipeline import run_stages

ORDERS = "id long, customer_id long, status string, placed_at timestamp, total decimal(14,2)"
ROWS = [
    (1, 10, "paid", datetime(2026, 1, 1, 9, 0), Decimal("10.50")),
    (2, 11, "new", datetime(2026, 1, 1, 23, 59), Decimal("4.50")),
    (3, 10, "cancelled", datetime(2026, 1, 2, 12, 0), Decimal("100.00")),
    (4, 12, "shipped", datetime(2026, 1, 2, 0, 0), Decimal("7.25")),
]


def _write_orders(state: str, rows: list[tuple]) -> None:
    spark = get_spark(state)
    spark.sql("CREATE SCHEMA IF NOT EXISTS pgm_gold")
    spark.createDataFrame(rows, ORDERS).write.format("delta").mode("overwrite").saveAsTable(
        "pgm_gold.public_orders"
    )


def main(state: str) -> int:
    cfg = Config(
        source=SourceConfig(name="shop"),
        lakehouse=LakehouseConfig(state_dir=state, marts=str(DEMO_MARTS)),
    )
    _write_orders(state, ROWS)
    result = run_stages(get_spark(state), cfg, ("marts",))
    spark = get_spark(state)  # a new JVM on the same metastore
    revenue = spark.table("pgm_marts.daily_revenue").orderBy("day").collect()
    statuses = spark.table("pgm_marts.order_status").count()
    recorded = spark.table("pgm_marts._quality").count()

    _write_orders(state, [*ROWS, (5, 12, "lost", datetime(2026, 1, 3), Decimal("1.00"))])
    try:
        run_stages(get_spark(state), cfg, ("marts",))
        failure = None
    except MartsError as e:
        failure = str(e)
    out = {
        "stages": result.stages,
        "quality": result.marts.quality,
        "revenue": [[str(r["day"]), r["orders"], str(r["revenue"])] for r in revenue],
        "statuses": statuses,
        "recorded": recorded,
        "failure": failure,
    }
    print("RESULT " + json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
