"""Silver's table contract: the schemas of its own tables and of the rows between its stages.

``_tables``, ``_errors``, ``_progress``, ``_plans``, ``_relations`` and ``_adjustments`` (see
``silver/__init__.py``) are created here; :class:`Names` holds their qualified names.
``DIFF_ARROW`` is a decoded row of a table (snapshot or change) before the cast, and
``CHANGE_ARROW`` the same for a decoded change with what :mod:`silver.changes` says of it
(``core.delta_rs.spark_types`` names either as Spark does).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa

from pgmedallion.core import delta_rs
from pgmedallion.core.config import Config
from pgmedallion.core.parallel import concurrently
from pgmedallion.core.spark import create_table, first_time, forget

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

LSN, DIFF, RUN = "_lsn", "_diff", "_run"
"""The columns silver adds to each table's own: the change's commit LSN (0: the snapshot), its
multiplicity (+1 a row in, -1 a row out; consolidated per row and LSN), and the silver run that
wrote it. Gold and the pipeline read them by these names."""
METADATA = (LSN, DIFF, RUN)

TABLES_DDL = (
    "source STRING NOT NULL, table_oid BIGINT NOT NULL, table_schema STRING, table_name STRING, "
    "silver_table STRING NOT NULL, snapshot_lsn BIGINT, primary_key ARRAY<STRING>, "
    "not_null ARRAY<STRING>, columns STRING, updated_at TIMESTAMP, snapshot_run BIGINT, "
    "snapshot_ranges STRING"
)
ERRORS_DDL = (
    "source STRING NOT NULL, table_oid BIGINT, table_schema STRING, table_name STRING, "
    "lsn BIGINT, code STRING NOT NULL, column_name STRING, raw STRING, message STRING, "
    "run BIGINT NOT NULL, detected_at TIMESTAMP NOT NULL"
)
PROGRESS_DDL = (
    "source STRING NOT NULL, run BIGINT NOT NULL, frontier BIGINT NOT NULL, "
    "bronze_batch BIGINT NOT NULL, completed_at TIMESTAMP NOT NULL, tables ARRAY<BIGINT>, "
    "source_time TIMESTAMP"
)
"""One row per completed run; ``tables``: the OIDs of the tables whose diffs, errors or
adjustments the run wrote (NULL in runs made before it existed: any table); ``source_time``:
the source's clock for ``frontier`` (NULL where unknown)."""
PLANS_DDL = (
    "source STRING NOT NULL, run BIGINT NOT NULL, frontier_from BIGINT NOT NULL, "
    "frontier BIGINT NOT NULL, batch_from BIGINT NOT NULL, batch_to BIGINT NOT NULL, "
    "planned_at TIMESTAMP NOT NULL, source_time TIMESTAMP"
)
ADJUSTMENTS_DDL = (
    "source STRING NOT NULL, table_oid BIGINT NOT NULL, table_schema STRING, table_name STRING, "
    "run BIGINT NOT NULL, column_name STRING NOT NULL, code STRING NOT NULL, "
    "count BIGINT NOT NULL, first_lsn BIGINT, sample STRING, detected_at TIMESTAMP NOT NULL"
)
"""Values a declared policy changed instead of keeping exactly (``Rounded``, ``Clamped``,
``Nulled``), counted per table, column and run; gold reports them in ``_quality``."""
COMMITS_DDL = (
    "source STRING NOT NULL, lsn BIGINT NOT NULL, commit_time TIMESTAMP, run BIGINT NOT NULL"
)
"""The source's transactions a run read: each commit LSN and the commit's time (the Commit
message's timestamp), written where a table keeps history (``gold.history_table``): what
gives a version its times and a time its LSN."""
RELATIONS_DDL = (
    "source STRING NOT NULL, relid BIGINT NOT NULL, lsn BIGINT NOT NULL, ordinal BIGINT NOT NULL, "
    "payload BINARY NOT NULL, run BIGINT NOT NULL"
)

DIFF_ARROW = pa.schema(
    [
        ("table_oid", pa.int64()),
        ("lsn", pa.int64()),
        ("ordinal", pa.int64()),
        ("diff", pa.int64()),
        ("values", pa.list_(pa.string())),
        ("code", pa.string()),
        ("message", pa.string()),
        ("raw", pa.string()),
    ]
)
CHANGE_ARROW = pa.schema(
    [*DIFF_ARROW, pa.field("kind", pa.int32()), pa.field("columns", pa.list_(pa.int32()))]
)
"""A decoded change's diff rows: ``DIFF_ARROW`` plus what :mod:`silver.changes` says of a row
(``kind``: PLAIN, RETRACT or FILL, and its ``columns``)."""


@dataclass
class TableInfo:
    """What silver knows about one source table (a row of ``_tables``; gold reads the same
    rows through :func:`pgmedallion.silver.catalog.load_tables`)."""

    oid: int
    schema: str
    name: str
    silver_table: str
    snapshot_lsn: int | None
    primary_key: list[str]
    not_null: list[str]
    columns: list[dict]
    """``{name, type_oid, typmod, type_name, base_type_oid, element_type_oid, category,
    target, infinity}``."""
    snapshot_run: int | None = None
    """The silver run that (re)built the table from its newest snapshot: its earlier errors
    are history (``pgmedallion resync``); gold is rebuilt in full from it."""
    source: str = ""
    """The configured source it belongs to."""
    snapshot_ranges: dict | None = None
    """A snapshot taken in key ranges (``capture.ranges``): its ``rewind`` record's payload
    (``key``, ``bounds``, ``ranges``: each range's ``[snapshot LSN, batch id]``);
    ``snapshot_lsn`` is then the oldest range's, and a change is judged by its key's range
    (``silver.rewind.snapshot_floor``) in every run until the next snapshot."""
    snapshot_batch: int | None = None
    """In the run that reads the table's new snapshot: the bronze batch of its ``rewind``
    record (not kept in ``_tables``)."""

    @property
    def qualified_name(self) -> str:
        return f"{self.schema}.{self.name}"

    @property
    def newest_snapshot_lsn(self) -> int | None:
        """The LSN every range of the table's snapshot is at or below (``snapshot_lsn`` for a
        snapshot taken at one LSN)."""
        if self.snapshot_ranges:
            return max(lsn for lsn, _ in self.snapshot_ranges["ranges"])
        return self.snapshot_lsn

    def snapshot_batches(self) -> list[int]:
        """The bronze batches holding the copy rows of the snapshot this run reads: those its
        ranges name (key ranges), else its ``rewind`` record's batch. Copy rows of any other
        batch are not this snapshot's (a later snapshot's ranges still landing, say)."""
        if self.snapshot_ranges:
            return sorted({batch for _, batch in self.snapshot_ranges["ranges"]})
        return [] if self.snapshot_batch is None else [self.snapshot_batch]


@dataclass(frozen=True)
class SilverResult:
    run: int | None
    """The run this call completed; None when there was nothing new."""
    frontier: int
    rows: dict[str, int]
    """``schema.table`` -> diff rows appended."""
    errors: int
    resync: tuple[str, ...] = ()
    """``schema.table`` of the tables this call asked capture to snapshot again: their stream
    has a change silver cannot follow (see :func:`pgmedallion.silver.catalog.unfollowed`)."""

    def then(self, more: SilverResult) -> SilverResult:
        """This call's result followed by ``more``'s (a later call's): rows and errors add up."""
        if more.run is None:
            return self
        rows = dict(self.rows)
        for table, count in more.rows.items():
            rows[table] = rows.get(table, 0) + count
        resync = tuple(sorted(set(self.resync) | set(more.resync)))
        return SilverResult(more.run, more.frontier, rows, self.errors + more.errors, resync)


class Names:
    """The qualified names of silver's tables (and bronze's) for one configuration."""

    def __init__(self, cfg: Config) -> None:
        q = lambda name: cfg.qualified("silver", name)  # noqa: E731
        self.tables, self.errors, self.progress = q("_tables"), q("_errors"), q("_progress")
        self.plans, self.relations = q("_plans"), q("_relations")
        self.adjustments, self.commits = q("_adjustments"), q("_commits")
        self.bronze = cfg.qualified("bronze", "bronze")
        self.table = q
        self.schema = cfg.schema("silver")


def ensure_silver_tables(spark: SparkSession, cfg: Config) -> None:
    """Silver's schema and own tables, created (or upgraded) when missing; once per Spark
    application while their directories stay (where local)."""
    n = Names(cfg)
    names = ("_tables", "_errors", "_progress", "_plans", "_relations", "_adjustments", "_commits")
    where = lambda: [delta_rs.table_dir(delta_rs.schema_dir(spark, n.schema), t) for t in names]  # noqa: E731
    if not first_time(spark, n.progress, where):
        return
    current = {
        **{t: set() for t in names},
        "_tables": {"snapshot_run", "snapshot_ranges"},
        "_progress": {"tables", "source_time"},
        "_plans": {"source_time"},
    }
    if delta_rs.local_tables_current(spark, n.schema, current):
        return
    ddls = {
        "_tables": TABLES_DDL,
        "_errors": ERRORS_DDL,
        "_progress": PROGRESS_DDL,
        "_plans": PLANS_DDL,
        "_relations": RELATIONS_DDL,
        "_adjustments": ADJUSTMENTS_DDL,
        "_commits": COMMITS_DDL,
    }
    columns = {name: delta_rs.arrow_columns(ddl) for name, ddl in ddls.items()}
    if delta_rs.create_layer_unregistered(spark, n.schema, columns):
        return  # a first run before Spark: put in the catalog when it starts
    try:
        _ensure(spark, n)
    except BaseException:
        forget(spark, n.progress)
        raise
    delta_rs.mark_ready(spark, n.schema, current)


def _ensure(spark: SparkSession, n: Names) -> None:
    spark.sql(f"CREATE SCHEMA IF NOT EXISTS {n.schema}")
    tables = [
        (n.tables, TABLES_DDL),
        (n.errors, ERRORS_DDL),
        (n.progress, PROGRESS_DDL),
        (n.plans, PLANS_DDL),
        (n.relations, RELATIONS_DDL),
        (n.adjustments, ADJUSTMENTS_DDL),
        (n.commits, COMMITS_DDL),
    ]

    def create(table_ddl: tuple[str, str]) -> None:
        sql = f"CREATE TABLE IF NOT EXISTS {table_ddl[0]} ({table_ddl[1]}) USING DELTA"
        create_table(spark, lambda: spark.sql(sql))

    # side by side: each creation mostly waits (the catalog, Delta's first commit); seven
    # one after the other cost a first Spark-engine run 2.4 s, side by side 1.2 s
    concurrently(create, tables, len(tables))
    if "snapshot_run" not in spark.table(n.tables).columns:  # tables made before resync
        spark.sql(f"ALTER TABLE {n.tables} ADD COLUMNS (snapshot_run BIGINT)")
    if "snapshot_ranges" not in spark.table(n.tables).columns:  # before snapshots resumed
        spark.sql(f"ALTER TABLE {n.tables} ADD COLUMNS (snapshot_ranges STRING)")
    progress = spark.table(n.progress).columns
    if "tables" not in progress:  # made before runs listed their tables
        spark.sql(f"ALTER TABLE {n.progress} ADD COLUMNS (tables ARRAY<BIGINT>)")
    for table, columns in ((n.progress, progress), (n.plans, spark.table(n.plans).columns)):
        if "source_time" not in columns:  # made before frontiers carried the source's clock
            spark.sql(f"ALTER TABLE {table} ADD COLUMNS (source_time TIMESTAMP)")
