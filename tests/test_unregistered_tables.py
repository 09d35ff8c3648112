"""Tables a first run creates with delta-rs before Spark starts (``delta_rs.create_unregistered``)
are the tables Spark would have created: the same protocol (versions and table features, for
column mapping, deletion vectors and ``timestamp_ntz`` columns), the same columns; Spark reads,
writes, renames in and deletes from them once ``register_created`` puts them in the catalog,
and delta-rs reads what Spark wrote."""

from __future__ import annotations

import json
import uuid
from datetime import datetime
from pathlib import Path

import pyarrow as pa
from pyspark.sql import types as T

from pgmedallion.core import delta_rs
from pgmedallion.core.naming import COLUMN_MAPPING
from pgmedallion.core.session import LazySession
from pgmedallion.gold.table_io import GOLD_PROPERTIES
from pgmedallion.silver.contract import TABLES_DDL

DIFFS = T.StructType(
    [
        T.StructField("id", T.LongType()),
        T.StructField("Name with space", T.StringType()),
        T.StructField("at", T.TimestampNTZType()),
        T.StructField("price", T.DecimalType(12, 2)),
        T.StructField("_lsn", T.LongType()),
        T.StructField("_diff", T.LongType()),
        T.StructField("_run", T.LongType(), False),
    ]
)
GOLD = T.StructType([T.StructField("id", T.LongType()), T.StructField("note", T.StringType())])


def _protocol(path: Path) -> dict:
    for line in (path / "_delta_log" / f"{0:020d}.json").read_text().splitlines():
        action = json.loads(line)
        if "protocol" in action:
            p = action["protocol"]
            return {k: sorted(v) if isinstance(v, list) else v for k, v in p.items()}
    raise AssertionError("no protocol")


def _spark_created(spark, name: str, schema: T.StructType, properties: dict) -> Path:
    from delta.tables import DeltaTable

    builder = DeltaTable.createIfNotExists(spark).tableName(name).addColumns(schema)
    for key, value in properties.items():
        builder = builder.property(key, value)
    builder.execute()
    location = spark.sql(f"DESCRIBE DETAIL {name}").first()["location"]
    return Path(location.removeprefix("file:"))


def test_tables_made_before_spark_are_the_tables_spark_makes(spark):
    suffix = uuid.uuid4().hex[:8]
    mine, theirs_schema = f"unreg_rs_{suffix}", f"unreg_spark_{suffix}"
    spark.sql(f"CREATE SCHEMA {theirs_schema}")
    spark.sql(f"CREATE SCHEMA {mine}")
    where = Path(delta_rs.schema_dir(spark, mine))
    lazy = LazySession(lambda: spark, {mine: str(where)})
    cases = [
        ("diffs", DIFFS, COLUMN_MAPPING),
        ("gold", GOLD, GOLD_PROPERTIES),
        ("gold_ntz", DIFFS, GOLD_PROPERTIES),
        ("plain", T.StructType([T.StructField("x", T.LongType(), False)]), {}),
    ]
    made = {}
    for name, schema, properties in cases:
        made[name] = delta_rs.create_unregistered(lazy, mine, name, schema, properties)
        assert made[name] is not None
        theirs = _spark_created(spark, f"{theirs_schema}.{name}", schema, properties)
        assert _protocol(Path(made[name])) == _protocol(theirs), name

    bookkeeping = delta_rs.create_unregistered(
        lazy, mine, "_tables", delta_rs.arrow_columns(TABLES_DDL)
    )
    spark.sql(f"CREATE TABLE {theirs_schema}._tables ({TABLES_DDL}) USING DELTA")
    assert delta_rs.spark_schema(bookkeeping) == spark.table(f"{theirs_schema}._tables").schema

    # Spark (now started) puts them in the catalog, and works on them as on its own
    registered = delta_rs.register_created(spark, mine, lambda n: f"{mine}.`{n}`")
    assert sorted(registered) == ["_tables", "diffs", "gold", "gold_ntz", "plain"]
    assert not list(where.glob(".pgmedallion-register-*"))
    assert spark.table(f"{mine}.diffs").schema == spark.table(f"{theirs_schema}.diffs").schema
    spark.sql(
        f"INSERT INTO {mine}.diffs VALUES "
        "(1, 'a', TIMESTAMP_NTZ'2026-01-02 03:04:05', 1.50, 0, 1, 0), "
        "(2, 'b', NULL, NULL, 0, 1, 0)"
    )
    spark.sql(f"ALTER TABLE {mine}.diffs RENAME COLUMN `Name with space` TO renamed")
    spark.sql(f"INSERT INTO {mine}.gold_ntz SELECT * FROM {mine}.diffs")
    spark.sql(f"DELETE FROM {mine}.gold_ntz WHERE id = 2")  # a deletion vector
    got = delta_rs.read_arrow(str(where / "diffs"), ["id", "renamed", "at"])
    assert sorted(got.to_pylist(), key=lambda r: r["id"]) == [
        {"id": 1, "renamed": "a", "at": datetime(2026, 1, 2, 3, 4, 5)},
        {"id": 2, "renamed": "b", "at": None},
    ]
    gold = delta_rs.read_arrow(str(where / "gold_ntz"), ["id"])
    assert gold.column("id").to_pylist() == [1]
    # delta-rs appends to a table it made, Spark reads it
    one = pa.table({"x": [7]}, schema=pa.schema([pa.field("x", pa.int64(), False)]))
    delta_rs.append(made["plain"], one, "test", 1)
    assert [r["x"] for r in spark.table(f"{mine}.plain").collect()] == [7]
