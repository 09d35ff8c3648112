"""Deletes by deletion vector without Spark (``core.deletion_vectors``): the commits gold's
MERGE of a large table makes, read by the engines that read gold.

Tables made by Spark as gold's are (column mapping by name, deletion vectors enabled), then
written by ``delete_and_append`` and ``compact``, and read by Spark and delta-rs, which must
both see what a plain model of the rows says (chispa). Spark's own DELETE and UPDATE are
mixed in: a vector Spark wrote is read by ``locate`` and merged into the next one. Deleted
positions go both ways through Roaring's two container kinds (more and fewer than 4,096
positions in one 65,536 block). A table written meanwhile, a table whose rules such a commit
would not keep, and a repeated commit are refused.
"""

from __future__ import annotations

import json
import random

import numpy as np
import pyarrow as pa
import pytest
from chispa import assert_df_equality
from deltalake import DeltaTable

from pgmedallion.core import deletion_vectors as dv
from pgmedallion.core import delta_rs, naming
from pgmedallion.core.spark import reshape_columns

COLUMNS = ["id", "part", "name", "at"]


def _make(spark, path, rows: int, properties: str = "") -> None:
    spark.sql(
        f"""CREATE TABLE delta.`{path}` (id BIGINT, part INT, name STRING, at TIMESTAMP)
        USING DELTA TBLPROPERTIES ('delta.columnMapping.mode' = 'name',
        'delta.enableDeletionVectors' = 'true' {properties})"""
    )
    spark.range(0, rows).selectExpr(
        "id",
        "cast(id % 3 as int) AS part",
        "concat('n', id) AS name",
        "timestamp_micros(id * 1000003) AS at",
    ).repartition(2).write.format("delta").mode("append").save(str(path))


def _model(rows: int) -> dict[tuple[int, int], tuple]:
    return {(i, i % 3): (f"n{i}", i * 1000003) for i in range(rows)}


def _assert_reads(spark, path, model) -> None:
    """Spark and delta-rs both read the rows of ``model``."""
    expected = spark.createDataFrame(
        [(k[0], k[1], v[0], v[1]) for k, v in model.items()],
        "id BIGINT, part INT, name STRING, micros BIGINT",
    ).selectExpr("id", "part", "name", "timestamp_micros(micros) AS at")
    actual = spark.read.format("delta").load(str(path))
    assert_df_equality(actual, expected, ignore_row_order=True, ignore_nullable=True)
    read = delta_rs.read_arrow(str(path), ["id", "part", "name"])
    columns = [read.column(c).to_pylist() for c in ["id", "part", "name"]]
    assert sorted(zip(*columns, strict=True)) == sorted(
        (k[0], k[1], v[0]) for k, v in model.items()
    )


def _apply(path, model, delete: list[tuple[int, int]], upsert: dict, app="t", version=1):
    """Deletes ``delete`` and the old rows of ``upsert``'s keys; appends ``upsert``'s rows."""
    keys = list(delete) + list(upsert)
    key = pa.table(
        {
            "id": pa.array([k[0] for k in keys], pa.int64()),
            "part": pa.array([k[1] for k in keys], pa.int32()),
        }
    )
    located = dv.locate(str(path), key, COLUMNS, 10**7)
    assert located is not None
    ids, parts = located.rows.column("id").to_pylist(), located.rows.column("part").to_pylist()
    found = set(zip(ids, parts, strict=True))
    assert found == {k for k in keys if k in model}  # every live row of the keys, no other
    deleted = dv.matching(located.rows, key)
    added = pa.table(
        {
            "id": pa.array([k[0] for k in upsert], pa.int64()),
            "part": pa.array([k[1] for k in upsert], pa.int32()),
            "name": pa.array([v[0] for v in upsert.values()], pa.string()),
            "at": pa.array([v[1] for v in upsert.values()], pa.timestamp("us", "UTC")),
        }
    )
    assert dv.delete_and_append(located, deleted, added, app=app, version=version)
    for k in delete:
        model.pop(k, None)
    model.update(upsert)


def test_spark_and_delta_rs_read_what_is_deleted_and_appended(spark, tmp_path):
    path = tmp_path / "gold"
    rows = 150_000
    _make(spark, path, rows, ", 'delta.checkpointInterval' = '2'")
    model = _model(rows)
    rng = random.Random(7)
    # a dense block (a bitmap container: over 4,096 positions of one 65,536 block) and a sparse one
    dense = [(i, i % 3) for i in range(10_000, 20_000)]
    sparse = [(i, i % 3) for i in rng.sample(range(rows), 300)]
    upsert = {(i, i % 3): (f"u{i}", i) for i in rng.sample(range(rows), 200)}
    upsert[(rows + 5, 2)] = ("new", 5)  # a key gold did not have
    _apply(path, model, dense + sparse + [(rows + 9, 0)], upsert, version=1)
    _assert_reads(spark, path, model)
    assert delta_rs.done(DeltaTable(str(path)), "t", 1)
    # the next commit finds the files' adds (their vectors) in a checkpoint, then in the log
    DeltaTable(str(path)).create_checkpoint()

    # Spark deletes and updates on top of our vectors; ours then merge with Spark's
    spark.sql(f"DELETE FROM delta.`{path}` WHERE id % 1000 = 1")
    spark.sql(f"UPDATE delta.`{path}` SET name = 'spark' WHERE id % 1000 = 2")
    for i in list(model):
        if i[0] % 1000 == 1:
            del model[i]
        elif i[0] % 1000 == 2:
            model[i] = ("spark", model[i][1])
    again = {(i, i % 3): (f"again{i}", i) for i in rng.sample(range(rows), 500)}
    gone = [(i, i % 3) for i in rng.sample(range(rows), 500)]
    _apply(path, model, gone, again, version=2)
    _assert_reads(spark, path, model)

    # the commit is Delta's: one version, the deletion vectors and the record of the write
    commit = (path / "_delta_log" / f"{DeltaTable(str(path)).version():020d}.json").read_text()
    actions = [json.loads(line) for line in commit.splitlines()]
    assert actions[1] == {
        "txn": {"appId": "t", "version": 2, "lastUpdated": actions[1]["txn"]["lastUpdated"]}
    }
    vectors = [
        a["add"]["deletionVector"] for a in actions if "add" in a and "deletionVector" in a["add"]
    ]
    assert vectors and all(v["storageType"] == "u" for v in vectors)

    # compaction: the small files and the vectors' deleted rows are gone, the rows are not
    before = len(DeltaTable(str(path)).file_uris())
    assert dv.compact(str(path), most_rows=100_000)
    table = DeltaTable(str(path))
    assert len(table.file_uris()) < before
    _assert_reads(spark, path, model)
    # our commits write the checkpoints delta-rs writes after its own (every 2nd version here)
    version = table.version()
    checkpoint = path / "_delta_log" / f"{version:020d}.checkpoint.parquet"
    assert checkpoint.exists() == (version % 2 == 0), version


def test_the_vector_format_is_what_spark_writes(spark, tmp_path):
    """The bytes for the positions Spark's DELETE wrote are the bytes Spark wrote."""
    path = tmp_path / "spark"
    _make(spark, path, 70_000)
    spark.sql(f"DELETE FROM delta.`{path}` WHERE id % 7 = 0 OR id BETWEEN 100 AND 20000")
    table = DeltaTable(str(path))
    masks = dv._keep_masks(table, str(path))
    log = path / "_delta_log"
    adds = [
        json.loads(line)["add"]
        for f in sorted(log.glob("*.json"))
        for line in f.read_text().splitlines()
        if '"add"' in line and "deletionVector" in line
    ]
    assert adds
    for add in adds:
        d = add["deletionVector"]
        blob = (path / f"deletion_vector_{_uuid(d['pathOrInlineDv'][-20:])}.bin").read_bytes()
        size = int.from_bytes(blob[d["offset"] : d["offset"] + 4], "big")
        theirs = blob[d["offset"] + 4 : d["offset"] + 4 + size]
        keep = masks[add["path"]]
        ours = dv.serialize(np.flatnonzero(~keep))
        assert ours == theirs
        assert d["cardinality"] == int((~keep).sum())


def _uuid(encoded: str) -> str:
    import uuid

    alphabet = dv._Z85
    raw = b""
    for i in range(0, 20, 5):
        value = 0
        for ch in encoded[i : i + 5]:
            value = value * 85 + alphabet.index(ch)
        raw += value.to_bytes(4, "big")
    assert dv.z85(raw) == encoded
    return str(uuid.UUID(bytes=raw))


def test_a_table_written_meanwhile_is_left_alone(spark, tmp_path):
    path = tmp_path / "raced"
    _make(spark, path, 1000)
    key = pa.table({"id": pa.array([1, 2], pa.int64())})
    located = dv.locate(str(path), key, COLUMNS, 100)
    spark.sql(f"DELETE FROM delta.`{path}` WHERE id = 500")
    version = DeltaTable(str(path)).version()
    files = set(p.name for p in path.rglob("*") if p.is_file())
    added = pa.table(
        {
            "id": pa.array([], pa.int64()),
            "part": pa.array([], pa.int32()),
            "name": pa.array([], pa.string()),
            "at": pa.array([], pa.timestamp("us", "UTC")),
        }
    )
    assert not dv.delete_and_append(located, np.ones(2, bool), added, app="t", version=1)
    assert DeltaTable(str(path)).version() == version
    assert set(p.name for p in path.rglob("*") if p.is_file()) == files  # nothing left behind
    assert dv.locate(str(path), key, COLUMNS, 1) is None  # more rows than asked for


@pytest.mark.parametrize(
    "properties, reason",
    [
        (", 'delta.enableChangeDataFeed' = 'true'", "change data feed"),
        (", 'delta.appendOnly' = 'true'", "append-only"),
    ],
)
def test_a_table_whose_rules_such_a_commit_breaks_is_refused(spark, tmp_path, properties, reason):
    path = tmp_path / "refused"
    _make(spark, path, 10, properties)
    with pytest.raises(dv.Unsupported, match=reason):
        dv.writable(DeltaTable(str(path)))
    assert not dv.compact(str(path))


def test_constraints_and_partitions_are_refused(spark, tmp_path):
    path = tmp_path / "checked"
    _make(spark, path, 10)
    spark.sql(f"ALTER TABLE delta.`{path}` ADD CONSTRAINT positive CHECK (id >= 0)")
    with pytest.raises(dv.Unsupported, match="CHECK"):
        dv.writable(DeltaTable(str(path)))
    parted = tmp_path / "parted"
    spark.range(10).selectExpr("id", "id % 2 AS p").write.format("delta").partitionBy("p").save(
        str(parted)
    )
    with pytest.raises(dv.Unsupported, match="partitioned"):
        dv.locate(str(parted), pa.table({"id": pa.array([1], pa.int64())}), ["id"], 10)


def test_keys_match_as_the_merge_matches_them_null_to_null():
    rows = pa.table(
        {
            "id": pa.array([1, None, 2, None, 3], pa.int64()),
            "part": pa.array([None, 1, 2, None, 3], pa.int32()),
        }
    )
    one = pa.table({"id": pa.array([None, 3, 9], pa.int64())})
    assert dv.matching(rows, one).tolist() == [False, True, False, True, True]
    two = pa.table(
        {"id": pa.array([None, 1, 2], pa.int64()), "part": pa.array([None, None, 9], pa.int32())}
    )
    assert dv.matching(rows, two).tolist() == [True, False, False, True, False]
    assert dv.matching(rows.slice(0, 0), two).tolist() == []


def test_files_whose_key_bounds_hold_no_key_are_not_read(tmp_path, monkeypatch):
    from deltalake import write_deltalake

    path = str(tmp_path / "ranges")
    for start in (0, 1000, 2000):  # three files, their ids apart
        ids = list(range(start, start + 1000))
        write_deltalake(path, pa.table({"id": pa.array(ids, pa.int64()), "v": ids}), mode="append")
    read = []
    original = dv._matched
    monkeypatch.setattr(dv, "_matched", lambda file, *a: read.append(file) or original(file, *a))
    rng = random.Random(5)
    for keys in ([1500, 1501, 99999], [-5, 2999], [rng.randrange(-10, 3010) for _ in range(50)]):
        read.clear()
        located = dv.locate(path, pa.table({"id": pa.array(keys, pa.int64())}), ["id", "v"], 10**6)
        assert sorted(located.rows.column("id").to_pylist()) == sorted(
            {k for k in keys if 0 <= k < 3000}
        )
        assert len(read) == len({k // 1000 for k in keys if 0 <= k < 3000})
    read.clear()
    with_null = pa.table({"id": pa.array([1500, None], pa.int64())})
    assert dv.locate(path, with_null, ["id"], 10**6).rows.column("id").to_pylist() == [1500]
    assert len(read) == 3  # a NULL among the keys: no file is skipped by its bounds


def test_columns_altered_by_a_metadata_commit_read_as_spark_alters_them(spark, tmp_path):
    """``alter_columns``: a new column's id and physical name as Spark gives them, NULL in the
    rows before it and written by Spark after it; a column the table has already is left
    alone, one of its name in another case and a type with fields of its own are refused. A
    rename and a drop keep every row's values under the new names, for Spark and delta-rs, and
    are not made twice."""
    path = tmp_path / "t"
    _make(spark, path, 10)
    before = DeltaTable(str(path)).version()
    done = dv.alter_columns(str(path), [("Note", "string"), ("n", "long")], before="at")
    assert done is not None and done.added == ["Note", "n"]
    assert DeltaTable(str(path)).version() == before + 1
    again = dv.alter_columns(str(path), [("Note", "string")])  # there already
    assert again is not None and again.added == []
    assert DeltaTable(str(path)).version() == before + 1
    assert dv.alter_columns(str(path), [("note", "string")]) is None  # Spark: the same name
    assert dv.alter_columns(str(path), [("s", {"type": "struct", "fields": []})]) is None

    df = spark.read.format("delta").load(str(path))
    assert df.columns == ["id", "part", "name", "Note", "n", "at"]
    fields = json.loads(DeltaTable(str(path)).schema().to_json())["fields"]
    ids = [f["metadata"]["delta.columnMapping.id"] for f in fields]
    assert ids[3:5] == [max(ids) - 1, max(ids)] and len(set(ids)) == 6  # new ids, never reused
    physical = {f["metadata"]["delta.columnMapping.physicalName"] for f in fields}
    assert len(physical) == 6
    config = DeltaTable(str(path)).metadata().configuration
    assert config["delta.columnMapping.maxColumnId"] == str(max(ids))

    spark.sql(f"INSERT INTO delta.`{path}` VALUES (100, 1, 'n100', 'x', 7, NULL)")
    rows = sorted(
        (r["id"], r["Note"], r["n"])
        for r in spark.read.format("delta").load(str(path)).where("id IN (3, 100)").collect()
    )
    assert rows == [(3, None, None), (100, "x", 7)]
    read = delta_rs.read_arrow(str(path), ["id", "Note", "n"], "id IN (3, 100)")
    columns = [read.column(c).to_pylist() for c in ["id", "Note", "n"]]
    assert sorted(zip(*columns, strict=True)) == rows

    renamed = dv.alter_columns(str(path), renames={"name": "label"}, drops=["part"])
    assert renamed is not None and (renamed.renamed, renamed.dropped) == (["name"], ["part"])
    version = DeltaTable(str(path)).version()
    redo = dv.alter_columns(str(path), renames={"name": "label"}, drops=["part"])
    assert redo is not None and (redo.renamed, redo.dropped) == ([], [])
    assert DeltaTable(str(path)).version() == version
    df = spark.read.format("delta").load(str(path))
    assert df.columns == ["id", "label", "Note", "n", "at"]
    got = sorted((r["id"], r["label"]) for r in df.where("id IN (3, 100)").collect())
    assert got == [(3, "n3"), (100, "n100")]
    read = delta_rs.read_arrow(str(path), ["id", "label"], "id IN (3, 100)")
    assert (
        sorted(zip(read.column("id").to_pylist(), read.column("label").to_pylist(), strict=True))
        == got
    )
    spark.sql(f"INSERT INTO delta.`{path}` VALUES (101, 'y', NULL, 8, NULL)")  # 5 columns now
    assert spark.read.format("delta").load(str(path)).where("label = 'y'").count() == 1


def _stats_keys(path, since: int) -> list[set[str]]:
    """The columns (physical names) each file added after version ``since`` has bounds or
    NULL counts for, read from the table's log."""
    out = []
    for commit in sorted((path / "_delta_log").glob("*.json")):
        if int(commit.name.split(".")[0]) <= since:
            continue
        for line in commit.read_text().splitlines():
            add = json.loads(line).get("add")
            if add and add.get("stats"):
                stats = json.loads(add["stats"])
                out.append(set(stats.get("minValues", {})) | set(stats.get("nullCount", {})))
    return out


def test_statistics_columns_follow_renames_and_drops_as_spark_makes_them(spark, tmp_path):
    """A table whose ``delta.dataSkippingStatsColumns`` lists some columns: ``alter_columns``
    renames and drops them in the property as Spark's ``ALTER TABLE`` does (a column renamed
    to a name Delta would have to quote leaves it), and files written afterwards by Spark or by
    this module's own commit keep statistics for the listed columns only."""
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    for path in (ours, theirs):
        spark.sql(
            f"""CREATE TABLE delta.`{path}` (id BIGINT, wei INT, name STRING, at TIMESTAMP)
            USING DELTA TBLPROPERTIES ('delta.columnMapping.mode' = 'name',
            'delta.enableDeletionVectors' = 'true',
            'delta.dataSkippingStatsColumns' = 'id,wei,name')"""
        )
        spark.sql(f"INSERT INTO delta.`{path}` VALUES (1, 2, 'a', NULL), (2, 3, 'b', NULL)")

    def listed(path) -> list[str]:
        config = DeltaTable(str(path)).metadata().configuration
        return naming.parse_stats_columns(config[naming.STATS_COLUMNS])

    done = dv.alter_columns(str(ours), renames={"name": "label"})
    assert done is not None and done.renamed == ["name"]
    spark.sql(f"ALTER TABLE delta.`{theirs}` RENAME COLUMN name TO label")
    assert listed(ours) == listed(theirs) == ["id", "wei", "label"]
    assert dv.alter_columns(str(ours), drops=["label"]) is not None
    spark.sql(f"ALTER TABLE delta.`{theirs}` DROP COLUMN label")
    assert listed(ours) == listed(theirs) == ["id", "wei"]
    # with a quoted name listed, Delta 4.x's DROP COLUMN of another column fails (it reads the
    # name unquoted): a column renamed to such a name leaves the list
    assert dv.alter_columns(str(ours), renames={"wei": "we ird"}) is not None
    assert listed(ours) == ["id"]
    spark.sql(f"ALTER TABLE delta.`{ours}` ADD COLUMNS (extra INT)")
    spark.sql(f"ALTER TABLE delta.`{ours}` DROP COLUMN extra")  # Spark can alter it further
    assert listed(ours) == ["id"]
    # and so does the Spark engine's rename (core.spark.reshape_columns)
    assert reshape_columns(spark, f"delta.`{theirs}`", {"wei": "we ird"}, []) == (["wei"], [])
    assert listed(theirs) == ["id"]
    spark.sql(f"ALTER TABLE delta.`{theirs}` ADD COLUMNS (extra INT)")
    spark.sql(f"ALTER TABLE delta.`{theirs}` DROP COLUMN extra")
    assert spark.read.format("delta").load(str(theirs)).columns == ["id", "we ird", "at"]

    fields = json.loads(DeltaTable(str(ours)).schema().to_json())["fields"]
    physical = {f["name"]: f["metadata"]["delta.columnMapping.physicalName"] for f in fields}
    kept = {physical["id"]}
    since = DeltaTable(str(ours)).version()
    spark.sql(f"INSERT INTO delta.`{ours}` VALUES (3, 4, NULL)")  # Spark's file
    key = pa.table({"id": pa.array([1], pa.int64())})
    located = dv.locate(str(ours), key, ["id", "we ird", "at"], 100)
    assert located is not None
    appended = pa.table(
        {
            "id": pa.array([1], pa.int64()),
            "we ird": pa.array([20], pa.int32()),
            "at": pa.array([None], pa.timestamp("us", "UTC")),
        }
    )
    deleted = dv.matching(located.rows, key)
    assert dv.delete_and_append(located, deleted, appended, app="t", version=1)  # ours
    new = _stats_keys(ours, since)
    assert len(new) == 2 and all(s == kept for s in new), (new, kept)
    got = spark.read.format("delta").load(str(ours)).orderBy("id").collect()
    assert [(r["id"], r["we ird"]) for r in got] == [(1, 20), (2, 3), (3, 4)]


@pytest.mark.parametrize(
    "names",
    [["id", "_lsn", "_run"], ["we.ird", "a b", "x`y", "Ünï", "", "c,d"], ["k1", " sp "]],
)
def test_statistics_column_names_read_back_as_written(names):
    assert naming.parse_stats_columns(naming.stats_columns(names)) == names


def test_statistics_columns_that_name_a_field_or_are_malformed_are_not_read():
    for text in ("a.b", "`a`.b", "a,", ",a", "`a", "a`b", "a,,b"):
        assert naming.parse_stats_columns(text) is None, text
    assert naming.parse_stats_columns(" a , `b c` ,d") == ["a", "b c", "d"]
