"""A process killed inside Spark's CREATE TABLE: Delta's log written, the catalog's record not.

The crash trials found it: the next run's ``CREATE TABLE IF NOT EXISTS`` failed with
``DELTA_CREATE_TABLE_WITH_NON_EMPTY_LOCATION`` every time, so the pipeline could not
recover. ``core.spark.create_table`` removes such a leftover (a log of at most the creation
commit, no data) and creates the table; a directory holding anything more is never removed.
"""

from __future__ import annotations

import os
import shutil

import pytest
from pyspark.errors import AnalysisException

from pgmedallion.core.spark import create_table


def _schema_dir(spark, schema: str) -> str:
    spark.sql(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    spark.sql(f"CREATE SCHEMA {schema}")
    rows = spark.sql(f"DESCRIBE SCHEMA EXTENDED {schema}").collect()
    location = next(r[1] for r in rows if r[0].lower().startswith("location"))
    return location.removeprefix("file:")


def test_what_an_interrupted_create_left_is_replaced(spark):
    """The leftover as a SIGKILL left it: the creation commit of a managed table (here made
    by a real CREATE TABLE in another schema) and Delta's half-written checksum."""
    made = _schema_dir(spark, "interrupted_made")
    spark.sql("CREATE TABLE interrupted_made.t (a INT) USING DELTA")
    root = _schema_dir(spark, "interrupted_create")
    shutil.copytree(f"{made}/t/_delta_log", f"{root}/t/_delta_log")
    with open(f"{root}/t/_delta_log/.{0:020d}.crc.1c87e2fe.tmp", "w") as f:
        f.write("")
    sql = "CREATE TABLE IF NOT EXISTS interrupted_create.t (a INT) USING DELTA"
    with pytest.raises(AnalysisException):
        spark.sql(sql)  # what a bare CREATE does with the leftover
    create_table(spark, lambda: spark.sql(sql))
    spark.sql("INSERT INTO interrupted_create.t VALUES (1)")
    assert [r["a"] for r in spark.table("interrupted_create.t").collect()] == [1]


def test_a_directory_with_data_is_never_removed(spark):
    root = _schema_dir(spark, "interrupted_data")
    os.makedirs(f"{root}/t/_delta_log")
    data = f"{root}/t/part-00000.parquet"
    with open(data, "wb") as f:
        f.write(b"PAR1")
    sql = "CREATE TABLE IF NOT EXISTS interrupted_data.t (a INT) USING DELTA"
    with pytest.raises(AnalysisException) as raised:
        create_table(spark, lambda: spark.sql(sql))
    assert raised.value.getCondition() == "DELTA_CREATE_TABLE_WITH_NON_EMPTY_LOCATION"
    assert os.path.exists(data)
