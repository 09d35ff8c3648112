"""Bronze's record buffers and helpers, and the failpoints, without a PostgreSQL server."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from chispa import assert_df_equality
from pyspark.sql import functions as F

from pgmedallion.bronze.spark_table import copy_row_counts, sealed_dataframe
from pgmedallion.bronze.table import ARROW_SCHEMA, RecordBuffer, WalBuffer, copy_lines
from pgmedallion.core.spark import one_task_per_partition

REPO = Path(__file__).resolve().parents[1]

MESSAGES = [
    (0x10, 0x11, 7, 0, b"B" + bytes(range(20))),
    (0x10, 0x12, 7, 1, b"I\x00\tcaf\xc3\xa9\n\\N"),
    (0x10, 0x13, 7, 2, b""),
    (0x20, 0x21, 8, 0, b"C" * 5000),
]


def _without_time(table):
    return table.drop_columns(["captured_at"])


def test_wal_buffer_packs_the_same_records_as_the_row_buffer():
    packed, rows = WalBuffer("src", "run1"), RecordBuffer("src", "run1")
    for lsn, end, xid, ordinal, payload in MESSAGES:
        packed.add_wal(lsn, end, xid, ordinal, payload)
        rows.add("wal", lsn, end_lsn=end, xid=xid, ordinal=ordinal, payload=payload)
    packed.others.add("progress", 0x30, payload=b"{}")
    rows.add("progress", 0x30, payload=b"{}")
    assert len(packed) == 5 and packed.messages == 4
    assert packed.payload_bytes == rows.payload_bytes
    table = packed.seal(42).to_arrow()
    assert table.schema == ARROW_SCHEMA
    assert _without_time(table).to_pylist() == _without_time(rows.to_arrow(42)).to_pylist()


def test_a_sealed_batch_gives_the_rows_of_the_full_arrow_table(spark):
    buffer = WalBuffer("src", "run1")
    for lsn, end, xid, ordinal, payload in MESSAGES:
        buffer.add_wal(lsn, end, xid, ordinal, payload)
    buffer.others.add("progress", 0x30, payload=b"{}")
    expected = spark.createDataFrame(buffer.seal(42).to_arrow())
    sealed = buffer.seal(42)
    assert sealed.messages == 4 and sealed.wal.num_columns == 5  # constants are not shipped
    actual = sealed_dataframe(spark, sealed)
    assert actual.columns == [f.name for f in ARROW_SCHEMA]
    assert_df_equality(
        actual.drop("captured_at"),
        expected.drop("captured_at"),
        ignore_row_order=True,
        ignore_nullable=True,
    )
    times = actual.select("captured_at").distinct().collect()
    assert len(times) == 1 and times[0][0] is not None


def test_wal_buffer_clear_starts_a_new_batch_and_keeps_the_old_table_intact():
    buffer = WalBuffer("src", "run1")
    buffer.add_wal(1, 2, 3, 0, b"first")
    table = buffer.seal(0).to_arrow()
    buffer.clear()
    buffer.add_wal(4, 5, 6, 0, b"second")
    assert table.column("payload").to_pylist() == [b"first"]
    assert buffer.seal(1).to_arrow().column("payload").to_pylist() == [b"second"]
    assert WalBuffer("src", "r").seal(0).to_arrow().num_rows == 0


def test_copy_lines_splits_a_chunk_on_row_newlines():
    assert copy_lines(b"1\ta\\nb\n2\t\\N\n") == [b"1\ta\\nb", b"2\t\\N"]
    assert copy_lines(b"") == []
    assert copy_lines(b"\n") == [b""]  # one row of an empty single column


def test_copy_row_counts_takes_each_ranges_largest_ordinal(spark):
    records = spark.createDataFrame(
        [
            (1, "s", "t", 0, 1000),
            (1, "s", "t", 0, 2500),
            (1, "s", "t", 1, 700),
            (2, "s", "u", 0, 3),
        ],
        "table_oid long, table_schema string, table_name string, part int, ordinal long",
    )
    expected = spark.createDataFrame(
        [(1, "s", "t", 3200), (2, "s", "u", 3)],
        "table_oid long, table_schema string, table_name string, rows long",
    )
    assert_df_equality(
        copy_row_counts(records), expected, ignore_row_order=True, ignore_nullable=True
    )


def test_one_task_per_partition_gives_each_id_its_own_partition(spark):
    rows = (
        one_task_per_partition(spark, 5).select("id", F.spark_partition_id().alias("p")).collect()
    )
    assert sorted(r["id"] for r in rows) == [0, 1, 2, 3, 4]
    assert len({r["p"] for r in rows}) == 5
    assert one_task_per_partition(spark, 0).count() == 0


def _run_with_failpoints(spec: str | None, hits: int) -> subprocess.CompletedProcess:
    code = (
        "from core.failpoints import failpoint\n"
        f"for i in range({hits}):\n"
        "    print(i, flush=True)\n"
        "    failpoint('demo.point')\n"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop("PGMEDALLION_FAILPOINTS", None)
    if spec is not None:
        env["PGMEDALLION_FAILPOINTS"] = spec
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )


def test_a_failpoint_kills_the_process_at_its_nth_hit():
    killed = _run_with_failpoints("other.point,demo.point=3", 5)
    assert killed.returncode == -signal.SIGKILL
    assert killed.stdout.split() == ["0", "1", "2"]
    unarmed = _run_with_failpoints(None, 5)
    assert unarmed.returncode == 0 and unarmed.stdout.split() == ["0", "1", "2", "3", "4"]


def test_a_malformed_failpoint_spec_is_an_error():
    broken = _run_with_failpoints("demo.point=three", 1)
    assert broken.returncode == 1 and "is not NAME or NAME=N" in broken.stderr


@pytest.mark.parametrize("spec", ["", " , "])
def test_an_empty_failpoint_spec_arms_nothing(spec):
    assert _run_with_failpoints(spec, 2).returncode == 0
