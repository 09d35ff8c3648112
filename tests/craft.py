"""Silver tables written by hand, following the contract in ``silver/__init__.py``.

Gold reads nothing but that contract, so its tests and its benchmark build silver themselves:
``_tables``, ``_progress``, ``_errors`` and one diffs table per source table, all Delta, with
column mapping mode ``name`` on the diffs tables so any PostgreSQL column name works. This is
not a second silver: no decoding, no consolidation, just the tables' shapes and the run
bookkeeping (a run's diffs, then its ``_progress`` row, as silver commits them).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from pgmedallion.core.config import Config
from pgmedallion.core.naming import COLUMN_MAPPING  # noqa: E402

TABLES_SCHEMA = T.StructType(
    [
        T.StructField("source", T.StringType()),
        T.StructField("table_oid", T.LongType()),
        T.StructField("table_schema", T.StringType()),
        T.StructField("table_name", T.StringType()),
        T.StructField("silver_table", T.StringType()),
        T.StructField("snapshot_lsn", T.LongType()),
        T.StructField("primary_key", T.ArrayType(T.StringType())),
        T.StructField("not_null", T.ArrayType(T.StringType())),
        T.StructField("columns", T.StringType()),
        T.StructField("updated_at", T.TimestampType()),
        T.StructField("snapshot_run", T.LongType()),
    ]
)
ERRORS_SCHEMA = T.StructType(
    [
        T.StructField("source", T.StringType()),
        T.StructField("table_oid", T.LongType()),
        T.StructField("table_schema", T.StringType()),
        T.StructField("table_name", T.StringType()),
        T.StructField("lsn", T.LongType()),
        T.StructField("code", T.StringType()),
        T.StructField("column_name", T.StringType()),
        T.StructField("raw", T.StringType()),
        T.StructField("message", T.StringType()),
        T.StructField("run", T.LongType()),
        T.StructField("detected_at", T.TimestampType()),
    ]
)
PROGRESS_SCHEMA = T.StructType(
    [
        T.StructField("source", T.StringType()),
        T.StructField("run", T.LongType()),
        T.StructField("frontier", T.LongType()),
        T.StructField("bronze_batch", T.LongType()),
        T.StructField("completed_at", T.TimestampType()),
        T.StructField("tables", T.ArrayType(T.LongType())),
    ]
)
DIFF_COLUMNS = [
    T.StructField("_lsn", T.LongType()),
    T.StructField("_diff", T.LongType()),
    T.StructField("_run", T.LongType()),
]


@dataclass
class CraftedTable:
    """One source table as silver describes it in ``_tables``."""

    silver_table: str
    columns: T.StructType
    primary_key: tuple[str, ...] = ()
    not_null: tuple[str, ...] = ()
    table_oid: int = 0
    table_schema: str = "public"
    table_name: str = ""
    snapshot_lsn: int | None = 0

    def row(self, source: str) -> tuple:
        cols = [
            {"name": f.name, "spark_type": f.dataType.simpleString()} for f in self.columns.fields
        ]
        return (
            source,
            self.table_oid,
            self.table_schema,
            self.table_name or self.silver_table,
            self.silver_table,
            self.snapshot_lsn,
            list(self.primary_key),
            list(self.not_null),
            json.dumps(cols),
            None,
            None,
        )


@dataclass
class SilverCrafter:
    """Writes silver-contract tables into ``cfg``'s silver schema."""

    spark: SparkSession
    cfg: Config
    tables: dict[str, CraftedTable] = field(default_factory=dict)
    touched: set[int] = field(default_factory=set)

    def name(self, table: str) -> str:
        return self.cfg.qualified("silver", table)

    def ensure(self) -> SilverCrafter:
        # An empty name leaves just the (catalog.)schema, back-quoted.
        self.spark.sql(f"CREATE SCHEMA IF NOT EXISTS {self.cfg.qualified('silver', '')}")
        for table, schema_ in (
            ("_tables", TABLES_SCHEMA),
            ("_errors", ERRORS_SCHEMA),
            ("_progress", PROGRESS_SCHEMA),
        ):
            self._create(self.name(table), schema_, {})
        return self

    def _create(self, name: str, schema: T.StructType, props: dict[str, str]) -> None:
        from delta.tables import DeltaTable

        builder = DeltaTable.createIfNotExists(self.spark).tableName(name).addColumns(schema)
        for key, value in props.items():
            builder = builder.property(key, value)
        builder.execute()

    def add_table(self, table: CraftedTable) -> CraftedTable:
        """Register ``table`` in ``_tables`` (rewritten whole, as silver does) and create it."""
        self.tables[table.silver_table] = table
        self._create(
            self.name(table.silver_table),
            T.StructType([*table.columns.fields, *DIFF_COLUMNS]),
            COLUMN_MAPPING,
        )
        self.write_tables()
        return table

    def write_tables(self) -> None:
        rows = [t.row(self.cfg.source.name) for t in self.tables.values()]
        df = self.spark.createDataFrame(rows, TABLES_SCHEMA)
        df.write.format("delta").mode("overwrite").saveAsTable(self.name("_tables"))

    def diffs(self, silver_table: str, rows: Iterable[Sequence], run: int) -> None:
        """Append ``(col..., _lsn, _diff)`` tuples as silver run ``run``."""
        table = self.tables[silver_table]
        schema = T.StructType([*table.columns.fields, *DIFF_COLUMNS])
        data = [(*r, run) for r in rows]
        self.append_df(silver_table, self.spark.createDataFrame(data, schema))

    def append_df(self, silver_table: str, df: DataFrame) -> None:
        """Append a DataFrame already shaped ``(col..., _lsn, _diff, _run)``."""
        df.write.format("delta").mode("append").saveAsTable(self.name(silver_table))
        self.touched.add(self.tables[silver_table].table_oid)

    def error(
        self, silver_table: str, lsn: int, run: int, code: str = "CastError", message: str = ""
    ) -> None:
        t = self.tables[silver_table]
        row = (
            self.cfg.source.name,
            t.table_oid,
            t.table_schema,
            t.table_name or t.silver_table,
            lsn,
            code,
            None,
            None,
            message or f"{code} at {lsn}",
            run,
            None,
        )
        df = self.spark.createDataFrame([row], ERRORS_SCHEMA)
        df.write.format("delta").mode("append").saveAsTable(self.name("_errors"))
        self.touched.add(t.table_oid)

    def complete_run(self, run: int, frontier: int) -> None:
        """The run's ``_progress`` row, listing the tables this crafter appended to or gave
        an error since its last one, as silver lists the tables a run wrote for (NULL, read
        as every table, when it wrote nothing: the diffs may have come from elsewhere)."""
        tables = sorted(self.touched) or None
        row = (self.cfg.source.name, run, frontier, run, None, tables)
        self.touched.clear()
        df = self.spark.createDataFrame([row], PROGRESS_SCHEMA)
        df.write.format("delta").mode("append").saveAsTable(self.name("_progress"))
