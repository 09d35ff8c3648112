"""Bronze's two batch writers on a real Delta table: what delta-rs commits, Spark reads row for
row; a batch committed once is never committed again, whichever writer saw it first; and the
choice of writer."""

from __future__ import annotations

import json
import uuid

import pyarrow as pa
import pytest
from chispa import assert_df_equality
from pyspark.sql import functions as F

from bronze.table import ARROW_SCHEMA, RecordBuffer, WalBuffer, app_id, ensure_bronze_table
from bronze.writer import (
    WRITER_ENV,
    DeltaRsWriter,
    SparkWriter,
    batch_writer,
    local_table_path,
    write_data_file,
)

SOURCE = "wsrc"


@pytest.fixture
def bronze(spark):
    schema = "bronze_writer_" + uuid.uuid4().hex[:8]
    spark.sql(f"CREATE SCHEMA {schema}")
    table = f"{schema}.bronze"
    ensure_bronze_table(spark, table)
    yield table
    spark.sql(f"DROP SCHEMA {schema} CASCADE")


def _sealed(batch_id: int, messages: int = 3):
    buffer = WalBuffer(SOURCE, "run-" + str(batch_id))
    for i in range(messages):
        payload = b"I\x00\tcaf\xc3\xa9\n\\N" if i % 2 else bytes(range(256)) * (i + 1)
        buffer.add_wal(1000 * batch_id + 16, 1000 * batch_id + i, 700 + batch_id, i, payload)
    buffer.others.add("progress", 1000 * batch_id + 999, payload=b'{"system_id": "1"}')
    return buffer.seal(batch_id)


def _versions(spark, table) -> int:
    return spark.sql(f"DESCRIBE HISTORY {table}").count()


def test_delta_rs_commits_what_spark_reads_once(spark, bronze):
    writer = batch_writer(spark, bronze, SOURCE)
    assert isinstance(writer, DeltaRsWriter)
    first, second = _sealed(0), _sealed(1, messages=40)
    writer.write(first)
    writer.write(second)
    expected = spark.createDataFrame(first.to_arrow()).unionByName(
        spark.createDataFrame(second.to_arrow())
    )
    actual = spark.table(bronze)
    assert actual.columns == [f.name for f in ARROW_SCHEMA]
    assert_df_equality(actual, expected, ignore_row_order=True, ignore_nullable=True)
    history = _versions(spark, bronze)
    # Retried after a crash (the same batch again, through either writer): nothing lands.
    writer.write(second)
    DeltaRsWriter(local_table_path(spark, bronze), SOURCE).write(first)
    SparkWriter(spark, bronze, SOURCE).write(second)
    assert _versions(spark, bronze) == history
    assert spark.table(bronze).count() == 3 + 1 + 40 + 1
    # Spark's commits and delta-rs's share one transaction record.
    SparkWriter(spark, bronze, SOURCE).write(_sealed(2))
    assert writer.committed(2) and not writer.committed(3)
    writer.write(_sealed(2))
    writer.write(_sealed(3))
    counts = {
        r["batch_id"]: r["count"] for r in spark.table(bronze).groupBy("batch_id").count().collect()
    }
    assert counts == {0: 4, 1: 41, 2: 4, 3: 4}
    txn = (
        spark.sql(f"DESCRIBE HISTORY {bronze}")
        .where(F.col("operation").isin("WRITE", "APPEND"))
        .count()
    )
    assert txn == _versions(spark, bronze) - 1  # every commit but the CREATE TABLE appended
    assert app_id(SOURCE) == "pgmedallion-wsrc"


def test_the_writer_follows_the_setting(spark, bronze, monkeypatch):
    monkeypatch.setenv(WRITER_ENV, "spark")
    assert isinstance(batch_writer(spark, bronze, SOURCE), SparkWriter)
    monkeypatch.setenv(WRITER_ENV, "delta-rs")
    assert isinstance(batch_writer(spark, bronze, SOURCE), DeltaRsWriter)
    monkeypatch.setenv(WRITER_ENV, "fast")
    with pytest.raises(ValueError, match="auto, delta-rs or spark"):
        batch_writer(spark, bronze, SOURCE)


def test_a_table_delta_rs_must_not_write_goes_to_spark(spark, bronze, monkeypatch):
    # Column mapping needs writer protocol 5: delta-rs is not asked to write such a table.
    spark.sql(
        f"ALTER TABLE {bronze} SET TBLPROPERTIES ('delta.minReaderVersion' = '2',"
        " 'delta.minWriterVersion' = '5', 'delta.columnMapping.mode' = 'name')"
    )
    assert isinstance(batch_writer(spark, bronze, SOURCE), SparkWriter)
    monkeypatch.setenv(WRITER_ENV, "delta-rs")
    with pytest.raises(ValueError, match="writer protocol 5"):
        batch_writer(spark, bronze, SOURCE)


def test_files_written_beside_the_table_commit_once_with_their_statistics(spark, bronze):
    writer = batch_writer(spark, bronze, SOURCE)
    tables = []
    for oid in (11, 12):
        records = RecordBuffer(SOURCE, "snap")
        for i in range(50):
            records.add(
                "copy",
                500,
                table_oid=oid,
                table_schema="s",
                table_name=f"t{oid}",
                ordinal=i + 1,
                part=0,
                payload=f"{i}\trow {i}\n".encode(),
            )
        tables.append(records.to_arrow(7))
    files = [write_data_file(writer.path, t.to_batches(max_chunksize=16)) for t in tables]
    assert write_data_file(writer.path, []) is None
    stats = json.loads(files[0].stats)
    assert stats["numRecords"] == 50 and stats["nullCount"]["table_oid"] == 0
    assert stats["minValues"]["table_oid"] == stats["maxValues"]["table_oid"] == 11
    assert (stats["minValues"]["kind"], stats["maxValues"]["batch_id"]) == ("copy", 7)
    assert writer.commit_files(files, 7)
    assert not writer.commit_files(files, 7)  # a rerun's commit of the same batch: skipped
    expected = spark.createDataFrame(pa.concat_tables(tables))
    assert_df_equality(spark.table(bronze), expected, ignore_row_order=True, ignore_nullable=True)
    # Delta skips the other table's file by the statistics.
    scanned = (
        spark.table(bronze).where("table_oid = 12").select(F.input_file_name()).distinct().count()
    )
    assert scanned == 1
