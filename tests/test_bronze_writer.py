"""Bronze's two engines on a real Delta table: what delta-rs commits, Spark reads row for row; a
batch committed once is never committed again, whichever writer saw it first; both engines
answer capture's questions alike; a table delta-rs created is the one Spark would have; and the
choice of engine."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import pyarrow as pa
import pytest
from chispa import assert_df_equality
from pyspark.errors import AnalysisException
from pyspark.sql import functions as F

from pgmedallion.bronze.engines import open_bronze
from pgmedallion.bronze.spark_table import (
    SparkBronze,
    SparkWriter,
    ensure_bronze_table,
    local_table_path,
)
from pgmedallion.bronze.store import DeltaRsBronze
from pgmedallion.bronze.table import ARROW_SCHEMA, RecordBuffer, WalBuffer, app_id, json_payload
from pgmedallion.bronze.writer import DeltaRsWriter, write_data_file
from pgmedallion.core import engine
from pgmedallion.core.config import LakehouseConfig

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


def _writer(spark, bronze):
    store = open_bronze(bronze, SOURCE, spark=spark)
    assert isinstance(store, DeltaRsBronze)
    return store.writer()


def test_delta_rs_commits_what_spark_reads_once(spark, bronze):
    writer = _writer(spark, bronze)
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
    DeltaRsWriter(local_table_path(spark, bronze), app_id(SOURCE)).write(first)
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


def test_the_engine_follows_the_setting(spark, bronze):
    assert isinstance(open_bronze(bronze, SOURCE, spark=spark, engine="spark"), SparkBronze)
    with pytest.raises(ValueError, match="through Spark here"):
        open_bronze(bronze, SOURCE, engine="spark")  # and no session given
    delta_rs = open_bronze(bronze, SOURCE, spark=spark, engine="delta-rs")
    assert isinstance(delta_rs.writer(), DeltaRsWriter)
    with pytest.raises(ValueError, match="auto, delta-rs or spark"):
        open_bronze(bronze, SOURCE, spark=spark, engine="fast")
    # The process's setting, as the entry points apply it from [lakehouse] engine.
    engine.use(LakehouseConfig(engine="spark"))
    assert isinstance(open_bronze(bronze, SOURCE, spark=spark), SparkBronze)


def test_a_table_delta_rs_must_not_write_goes_to_spark(spark, bronze):
    # Column mapping needs writer protocol 5: delta-rs is not asked to write such a table.
    spark.sql(
        f"ALTER TABLE {bronze} SET TBLPROPERTIES ('delta.minReaderVersion' = '2',"
        " 'delta.minWriterVersion' = '5', 'delta.columnMapping.mode' = 'name')"
    )
    assert isinstance(open_bronze(bronze, SOURCE, spark=spark).writer(), SparkWriter)
    with pytest.raises(ValueError, match="writer protocol 5"):
        open_bronze(bronze, SOURCE, spark=spark, engine="delta-rs")


def test_files_written_beside_the_table_commit_once_with_their_statistics(spark, bronze):
    writer = _writer(spark, bronze)
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


def _control_records() -> list[pa.Table]:
    """Batches as capture commits them: a snapshot of two tables (copy rows of two ranges,
    schema and rewind records), stream progress, an error, a resync, a second snapshot."""
    snap = RecordBuffer(SOURCE, "r1")
    for oid, name, parts in ((21, "a", (3, 5)), (22, "b", (4,))):
        for part, rows in enumerate(parts):
            for ordinal in range(1, rows + 1):
                snap.add(
                    "copy",
                    100,
                    table_oid=oid,
                    table_schema="s",
                    table_name=name,
                    ordinal=ordinal,
                    part=part,
                    payload=b"1\tx\n",
                )
        snap.add(
            "schema",
            100,
            table_oid=oid,
            table_schema="s",
            table_name=name,
            payload=json_payload({"partitions": [oid * 10, oid * 10 + 1]}),
        )
        snap.add("rewind", 100, table_oid=oid, table_schema="s", table_name=name)
    stream = RecordBuffer(SOURCE, "r1")
    stream.add("progress", 180, payload=json_payload({"system_id": "7", "timeline": 1}))
    stream.add("progress", 250)
    error = RecordBuffer(SOURCE, "r2")
    error.add(
        "error",
        250,
        table_oid=22,
        table_schema="s",
        table_name="b",
        payload=json_payload({"code": "TableDropped", "message": "gone", "lsn": "0/FA"}),
    )
    resync = RecordBuffer(SOURCE, "r3")
    resync.add("resync", 250, table_oid=21, table_schema="s", table_name="a")
    again = RecordBuffer(SOURCE, "r4")
    again.add(
        "schema",
        300,
        table_oid=21,
        table_schema="s",
        table_name="a",
        payload=json_payload({"partitions": [210]}),
    )
    again.add("rewind", 300, table_oid=21, table_schema="s", table_name="a")
    other = RecordBuffer("another_source", "x")
    other.add("progress", 999)
    return [b.to_arrow(i) for i, b in enumerate((snap, stream, error, resync, again))] + [
        other.to_arrow(50)
    ]


def test_both_engines_answer_capture_alike(spark, bronze):
    delta_rs = open_bronze(bronze, SOURCE, spark=spark)
    through_spark = SparkBronze(spark, bronze, SOURCE)
    for store in (delta_rs, through_spark):  # empty
        assert store.state().next_batch_id == 0 and store.frontier() is None
        assert store.snapshotted_tables() == {} and store.recorded_errors() == set()
    records = _control_records()
    for batch_id, table in enumerate(records[:3]):
        assert delta_rs.append(table, batch_id)
    assert not delta_rs.append(records[2], 2)  # committed before: skipped
    for batch_id, table in ((3, records[3]), (4, records[4])):
        through_spark.append(table, batch_id)
    DeltaRsWriter(delta_rs.path, app_id("another_source")).append(records[5], 50)
    through_spark.refresh()  # it knows its own commits, and another writer's after a refresh
    answers = []
    for store in (delta_rs, through_spark):
        state = store.state()
        answers.append(
            (
                state,
                store.frontier(),
                store.next_batch_id(),
                store.snapshotted_tables(),
                store.recorded_errors(),
                store.landed_counts(0),
                store.landed_counts(4),
                store.snapshot_schemas([21, 22, 23]),
            )
        )
    assert answers[0] == answers[1]
    state, frontier, next_batch, snapshots, errors, counts, none, partitions = answers[0]
    assert (state.frontier, frontier, state.next_batch_id, next_batch) == (250, 250, 5, 5)
    assert state.system_identity == {"system_id": "7", "timeline": 1}
    assert state.snapshots == {21: (300, "s", "a"), 22: (100, "s", "b")}
    assert state.resync == frozenset()  # the resync of 21 was followed by its snapshot
    assert snapshots == {21: 300, 22: 100}
    assert errors == {("TableDropped", 22, 250)}
    assert counts == {"s.a": 8, "s.b": 4} and none == {}
    assert partitions == {21: {"partitions": [210]}, 22: {"partitions": [220, 221]}}
    # A resync request newer than the table's snapshot is pending.
    assert delta_rs.request_resync([(22, "s", "b")], 250) == 5
    assert delta_rs.state().resync == frozenset({22})
    # Spark's reader keeps what it read (and its own commits) until it is told another
    # process may have committed.
    assert through_spark.state().resync == frozenset()
    assert through_spark.refresh().state() == delta_rs.state()


def _jobs(spark, question):
    """``question()``'s answer and how many Spark jobs it ran."""
    group = "pgm-" + uuid.uuid4().hex[:8]
    spark.sparkContext.setJobGroup(group, "a question to bronze")
    try:
        answer = question()
    finally:
        spark.sparkContext.setJobGroup("pgm-none", "")
    return answer, len(spark.sparkContext.statusTracker().getJobIdsForGroup(group))


def test_spark_reader_knows_the_next_batch_after_its_own_commit(spark, bronze):
    """Between two commits of a snapshot in key ranges capture asks only for the next batch
    id: after Spark's reader commits, it answers without reading bronze (a job of 2-3 s once
    copy records are there); every other question, or ``refresh``, reads the records anew."""
    store = SparkBronze(spark, bronze, SOURCE)
    records = _control_records()
    store.append(records[0], 0)
    assert _jobs(spark, store.next_batch_id) == (1, 0)
    store.append(records[1], 1)
    assert _jobs(spark, store.next_batch_id) == (2, 0)
    state, jobs = _jobs(spark, store.state)  # read: the records it committed are there
    assert state.next_batch_id == 2 and state.frontier == 250 and jobs > 0
    # another process commits batch 2: a refresh forgets what this reader knew
    DeltaRsWriter(open_bronze(bronze, SOURCE, spark=spark).path, app_id(SOURCE)).append(
        records[2], 2
    )
    assert _jobs(spark, store.refresh().next_batch_id)[0] == 3
    # a commit that fails leaves nothing known: the next question reads
    with pytest.raises(AnalysisException):
        store.append(pa.table({"nonsense": [1]}), 3)
    answer, jobs = _jobs(spark, store.next_batch_id)
    assert answer == 3 and jobs > 0


def _answers(store):
    return (
        store.state(),
        store.frontier(),
        store.next_batch_id(),
        store.snapshotted_tables(),
        store.recorded_errors(),
        store.landed_counts(0),
        store.snapshot_schemas([21, 22]),
    )


def test_spark_reader_adds_its_own_commits_to_what_it_read(spark, bronze):
    """Once it has read bronze, Spark's reader adds what it commits (appended records, a stream
    batch's progress record) to what it read: capture's questions after a stream's commit are
    answered as a fresh read answers them, without reading bronze again (a Spark job and a
    Delta snapshot: 4 s in a cold process)."""
    store = SparkBronze(spark, bronze, SOURCE)
    records = _control_records()
    store.append(records[0], 0)
    assert store.state().next_batch_id == 1  # read
    store.append(records[1], 1)
    store.writer().write(_sealed(2))  # wal messages (left out) and a progress record
    store.append(records[3], 3)
    store.append(records[4], 4)
    answers, jobs = _jobs(spark, lambda: _answers(store))
    assert jobs == 0
    assert answers == _answers(SparkBronze(spark, bronze, SOURCE))
    state = answers[0]
    assert (state.frontier, state.next_batch_id) == (2999, 5)
    assert state.snapshots == {21: (300, "s", "a"), 22: (100, "s", "b")}
    assert state.system_identity == {"system_id": "1"}  # the newest progress record's
    # a stream commit that fails leaves nothing known: the next question reads
    with pytest.raises(AnalysisException):
        SparkWriter(spark, "no_such_schema_here.bronze", SOURCE, store).write(_sealed(5))
    answer, jobs = _jobs(spark, store.next_batch_id)
    assert answer == 5 and jobs > 0


def test_a_table_created_without_spark_is_the_one_spark_creates(spark, tmp_path):
    schema = "bronze_rs_" + uuid.uuid4().hex[:8]
    spark.sql(f"CREATE SCHEMA {schema}")
    try:
        path = str(tmp_path / "bronze")
        created = open_bronze(f"{schema}.rs", SOURCE, path=path)  # no Spark at all
        assert isinstance(created, DeltaRsBronze)
        created.writer().write(_sealed(0))
        ensure_bronze_table(spark, f"{schema}.rs", path)  # the catalog now points at it
        ensure_bronze_table(spark, f"{schema}.by_spark")
        assert spark.table(f"{schema}.rs").schema == spark.table(f"{schema}.by_spark").schema
        details = {
            t: spark.sql(f"DESCRIBE DETAIL {schema}.{t}").first() for t in ("rs", "by_spark")
        }
        for column in ("minReaderVersion", "minWriterVersion"):
            assert details["rs"][column] == details["by_spark"][column]
        stats = "delta.dataSkippingStatsColumns"
        assert details["rs"]["properties"][stats] == details["by_spark"]["properties"][stats]
        assert spark.table(f"{schema}.rs").count() == 4
        # Opened again (another run), it is the same table, not a new one.
        again = open_bronze(f"{schema}.rs", SOURCE, path=path)
        assert again.state().next_batch_id == 1
    finally:
        spark.sql(f"DROP SCHEMA {schema} CASCADE")


def _bytes_read(spark) -> int:
    """Bytes the Spark JVM (its executors' too: local mode) has read so far, page cache
    included (``rchar`` of ``/proc/<pid>/io``: Linux's count)."""
    io = Path(f"/proc/{spark._jvm.java.lang.ProcessHandle.current().pid()}/io")
    if not io.is_file():
        pytest.skip("no /proc/<pid>/io here (Linux counts a process's reads there)")
    return next(
        int(line.split()[1]) for line in io.read_text().splitlines() if line.startswith("rchar:")
    )


def test_spark_reader_reads_no_copy_payloads(spark, bronze):
    """Capture's questions read the payloads of progress, schema and error records, never a
    snapshot's rows: bronze's files of copy records (most of its bytes) are read for their
    index columns only. A projection that only nulls the payload would read it all."""
    SparkBronze(spark, bronze, SOURCE).state()  # (the classes a first read loads, read now)
    snap = RecordBuffer(SOURCE, "r1")
    rows = 64
    for ordinal in range(1, rows + 1):  # 64 MB of incompressible rows
        snap.add(
            "copy",
            100,
            table_oid=21,
            table_schema="s",
            table_name="a",
            ordinal=ordinal,
            part=0,
            payload=os.urandom(1 << 20),
        )
    control = RecordBuffer(SOURCE, "r1")
    control.add("rewind", 100, table_oid=21, table_schema="s", table_name="a")
    control.add("progress", 180, payload=json_payload({"system_id": "7", "timeline": 1}))
    writer = DeltaRsWriter(open_bronze(bronze, SOURCE, spark=spark).path, app_id(SOURCE))
    assert writer.append(snap.to_arrow(0), 0) and writer.append(control.to_arrow(1), 1)
    store = SparkBronze(spark, bronze, SOURCE)
    before = _bytes_read(spark)
    state = store.state()
    read = _bytes_read(spark) - before
    assert state.frontier == 180 and state.system_identity == {"system_id": "7", "timeline": 1}
    assert store.landed_counts(0) == {"s.a": rows} and state.snapshots == {21: (100, "s", "a")}
    assert 0 < read < (16 << 20), f"{read} bytes read"
