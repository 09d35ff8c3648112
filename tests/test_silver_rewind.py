"""Rewinds, truncates and consolidation (silver/rewind.py): pure DataFrame steps, on Spark."""

from __future__ import annotations

from chispa import assert_df_equality
from pyspark.sql import functions as F

from pgmedallion.silver.rewind import consolidated, rewinds, truncated, with_rewinds

ROWS = "id int, v string, lsn bigint, diff bigint"


def test_rewinds_negate_the_changes_at_or_below_the_snapshot_at_lsn_0(spark):
    changes = spark.createDataFrame(
        [
            (1, "a", 0, 1),  # a snapshot row: never rewound
            (1, "a", 10, -1),
            (1, "b", 10, 1),
            (2, "c", 20, 1),  # at the snapshot LSN: rewound
            (3, "d", 21, 1),  # after the snapshot: stays
        ],
        ROWS,
    )
    expected = spark.createDataFrame(
        [(1, "a", 0, 1), (1, "b", 0, -1), (2, "c", 0, -1)],
        ROWS,
    )
    assert_df_equality(
        rewinds(changes, "lsn", "diff", 20), expected, ignore_row_order=True, ignore_nullable=True
    )


def test_with_rewinds_adds_them_to_the_rows_only_for_a_snapshotted_table(spark):
    rows = spark.createDataFrame([(1, "x", 0, 1), (1, "x", 5, -1), (1, "y", 5, 1)], ROWS)
    data = [F.col("id"), F.col("v")]
    out = "id int, v string, _lsn bigint, _diff bigint"
    plain = spark.createDataFrame([(1, "x", 0, 1), (1, "x", 5, -1), (1, "y", 5, 1)], out)
    assert_df_equality(
        with_rewinds(rows, rows, data, "lsn", "diff", None),
        plain,
        ignore_row_order=True,
        ignore_nullable=True,
    )
    rewound = spark.createDataFrame(
        [(1, "x", 0, 1), (1, "x", 5, -1), (1, "y", 5, 1), (1, "x", 0, 1), (1, "y", 0, -1)], out
    )
    assert_df_equality(
        with_rewinds(rows, rows, data, "lsn", "diff", 5),
        rewound,
        ignore_row_order=True,
        ignore_nullable=True,
    )
    # consolidated: the snapshot row and its rewind sum, the rewound change cancels
    summed = spark.createDataFrame(
        [(1, "x", 0, 2, 7), (1, "x", 5, -1, 7), (1, "y", 5, 1, 7), (1, "y", 0, -1, 7)],
        "id int, v string, _lsn bigint, _diff bigint, _run bigint",
    )
    assert_df_equality(
        consolidated(with_rewinds(rows, rows, data, "lsn", "diff", 5), data, 7),
        summed,
        ignore_row_order=True,
        ignore_nullable=True,
    )


def test_a_truncate_retracts_the_state_below_it(spark):
    out = "id int, _lsn bigint, _diff bigint"
    rows = spark.createDataFrame([(1, 0, 1), (2, 3, 1), (3, 9, 1)], out)
    earlier = spark.createDataFrame([(4, 0, 1), (4, 1, -1), (5, 1, 1)], out)
    expected = spark.createDataFrame(
        [(1, 0, 1), (2, 3, 1), (3, 9, 1), (1, 5, -1), (2, 5, -1), (5, 5, -1)], out
    )
    assert_df_equality(
        truncated(rows, [F.col("id")], [(5, 0)], earlier),
        expected,
        ignore_row_order=True,
        ignore_nullable=True,
    )
