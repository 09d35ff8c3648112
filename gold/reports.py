"""Gold's reports: the quality records of a table, and the ``_frontier`` and ``_quality``
tables they land in (see ``gold/__init__.py`` for their columns).

Reports are written after every table of a run; a crash before them loses a report, never
state (``gold/build.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import pyarrow as pa

from pgmedallion.core import delta_rs
from pgmedallion.core.config import Config
from pgmedallion.core.expectations import QUALITY_ARROW, quality_frame
from pgmedallion.core.parallel import concurrently
from pgmedallion.core.session import unstarted
from pgmedallion.core.spark import create_table, first_time, forget
from pgmedallion.core.sparkapi import F
from pgmedallion.gold.history import SAMPLE_ROWS, ErrorSummary
from pgmedallion.gold.on_spark import c
from pgmedallion.gold.plan import TableOutcome
from pgmedallion.gold.quality import QualityRecord, Rule
from pgmedallion.gold.state import COPIES, COUNTED, GOLD, HELD, RULES, TO_GOLD, rule_count

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession


FRONTIER_ARROW = pa.schema(
    [
        ("source", pa.string()),
        ("table_oid", pa.int64()),
        ("table_schema", pa.string()),
        ("table_name", pa.string()),
        ("gold_table", pa.string()),
        ("frontier", pa.int64()),
        ("silver_run", pa.int64()),
        ("rows", pa.int64()),
        ("updated_at", pa.timestamp("us", tz="UTC")),
        ("source_time", pa.timestamp("us", tz="UTC")),
    ]
)
"""``_frontier``: a gold table's frontier, one row per table."""


def summary_record(table: str, rule: str, policy: str, summary: ErrorSummary) -> QualityRecord:
    """A rule counted from a summary (definite errors, adjusted values): passed when none."""
    return QualityRecord(
        table,
        rule,
        policy,
        failed=summary.count,
        passed=0 if summary.count else 1,
        sample=summary.sample,
    )


def count_rules(
    counts: dict, checked: DataFrame, rules: Sequence[Rule], table: str, policy: str
) -> tuple[list[QualityRecord], int, int]:
    """Failed and passed row counts per rule (``counts``: the table's tallies), with up to five
    failing rows of ``checked`` as JSON; how many rows stay out of gold, and how many rows gold
    gets."""
    hidden = (RULES, TO_GOLD, COPIES)
    payload = F.to_json(F.struct(*[c(n) for n in checked.columns if n not in hidden]))
    return rule_records(counts, rules, table, policy, checked, payload)


def rule_records(
    counts: dict,
    rules: Sequence[Rule],
    table: str,
    policy: str,
    checked: DataFrame,
    row_json: Column,
) -> tuple[list[QualityRecord], int, int]:
    """The quality records of one table from its ``tallies`` row (``_f<i>``: the rows failing
    ``rules[i]``); the samples of a failed rule are read from ``checked`` (up to five rows'
    ``row_json``, a row as JSON). Then how many rows stay out of gold, and how many gold gets."""
    records = []
    for i, rule in enumerate(rules):
        failed = int(counts[rule_count(i)])
        sample = "[]"
        if failed:
            rows = (
                checked.filter(F.array_contains(F.col(RULES), rule.name))
                .select(row_json.alias("j"))
                .limit(SAMPLE_ROWS)
                .collect()
            )
            sample = "[" + ",".join(r["j"] for r in rows) + "]"
        records.append(
            QualityRecord(table, rule.name, policy, failed, int(counts[COUNTED]) - failed, sample)
        )
    return records, int(counts[HELD]), int(counts[GOLD] or 0)


def ensure_report_tables(spark: SparkSession, cfg: Config) -> None:
    """The gold schema, ``_frontier`` and ``_quality``, created (or upgraded) when missing;
    once per Spark application while their directories stay (where local)."""
    frontier = cfg.qualified("gold", "_frontier")
    where = lambda: [  # noqa: E731
        delta_rs.table_dir(delta_rs.schema_dir(spark, cfg.schema("gold")), t)
        for t in ("_frontier", "_quality")
    ]
    if not first_time(spark, frontier, where):
        return
    current = {"_frontier": {"source_time"}, "_quality": set()}
    if delta_rs.local_tables_current(spark, cfg.schema("gold"), current):
        return
    schemas = {"_frontier": FRONTIER_ARROW, "_quality": QUALITY_ARROW}
    if delta_rs.create_layer_unregistered(spark, cfg.schema("gold"), schemas):
        return  # a first run before Spark: put in the catalog when it starts
    try:
        _ensure_report_tables(spark, cfg)
    except BaseException:
        forget(spark, frontier)
        raise
    delta_rs.mark_ready(spark, cfg.schema("gold"), current)


def _ensure_report_tables(spark: SparkSession, cfg: Config) -> None:
    spark.sql(f"CREATE SCHEMA IF NOT EXISTS {cfg.qualified('gold', '')}")
    from delta.tables import DeltaTable

    def create(table: tuple[str, pa.Schema]) -> None:
        name, columns = table
        builder = DeltaTable.createIfNotExists(spark).tableName(cfg.qualified("gold", name))
        create_table(spark, builder.addColumns(delta_rs.spark_types(columns)).execute)

    concurrently(create, [("_frontier", FRONTIER_ARROW), ("_quality", QUALITY_ARROW)], 2)
    if "source_time" not in _columns(spark, cfg, "_frontier"):  # made before the column was
        spark.sql(
            f"ALTER TABLE {cfg.qualified('gold', '_frontier')} ADD COLUMNS (source_time TIMESTAMP)"
        )


LAG_VIEW = "_lag"


def ensure_lag_view(spark: SparkSession, cfg: Config, existing: set[str]) -> None:
    """The ``_lag`` view over ``_frontier`` (for alerting), created when not in ``existing``
    (the gold schema's table names). Per gold table: its frontier, ``as_of`` (the source's
    clock for it), ``updated_at`` (when gold last reported it), ``lag_seconds`` (now minus
    ``as_of``: how long ago the source was in gold's state; while ``run --continuous`` runs,
    capture's progress records keep ``as_of`` moving on an idle source too) and
    ``applied_lag_seconds`` (``updated_at`` minus ``as_of``: what the last application took
    from the source's clock to gold). Not before a lazy session starts (a view is no
    directory to list, and a first run, which starts Spark, made it)."""
    if LAG_VIEW in existing or unstarted(spark):
        return
    frontier = cfg.qualified("gold", "_frontier")
    spark.sql(
        f"CREATE VIEW IF NOT EXISTS {cfg.qualified('gold', LAG_VIEW)} AS SELECT source, "
        "table_schema, table_name, gold_table, frontier, source_time AS as_of, updated_at, "
        "(unix_micros(current_timestamp()) - unix_micros(source_time)) / 1e6 AS lag_seconds, "
        "(unix_micros(updated_at) - unix_micros(source_time)) / 1e6 AS applied_lag_seconds "
        f"FROM {frontier}"
    )
    existing.add(LAG_VIEW)


def _columns(spark: SparkSession, cfg: Config, name: str) -> list[str]:
    """The columns of gold's report table ``name``: from its Delta log by delta-rs where it
    is local (milliseconds), else through Spark."""
    path = delta_rs.table_dir(delta_rs.schema_dir(spark, cfg.schema("gold")), name)
    if delta_rs.usable(path):
        return delta_rs.open_table(path).schema().to_arrow().names
    return spark.table(cfg.qualified("gold", name)).columns


def write_frontier(
    spark: SparkSession,
    cfg: Config,
    outcomes: Sequence[TableOutcome],
    now: datetime,
    as_of: Callable[[int], datetime | None],
) -> None:
    """Replace the source's rows of ``_frontier`` by one row per outcome (``as_of``: the
    source's clock for a frontier)."""
    frontier = [
        (
            o.table.source,
            o.table.oid,
            o.table.schema,
            o.table.name,
            o.gold_table,
            o.frontier,
            o.silver_run,
            o.rows,
            now,
            as_of(o.frontier),
        )
        for o in outcomes
    ]
    # One atomic commit replacing this source's rows: by delta-rs where the table is local,
    # else through Spark. (A DataFrameWriterV2 overwrite: the V1 saveAsTable overwrite also
    # asks the Hive metastore to alter the table, which it refuses.)
    source = cfg.source.name.replace("'", "''")
    if _local_write(spark, cfg, "_frontier", frontier, FRONTIER_ARROW, f"source = '{source}'"):
        return
    spark.createDataFrame(frontier, delta_rs.spark_types(FRONTIER_ARROW)).writeTo(
        cfg.qualified("gold", "_frontier")
    ).overwrite(F.col("source") == F.lit(cfg.source.name))


def write_quality(
    spark: SparkSession,
    cfg: Config,
    silver_run: int,
    outcomes: Sequence[TableOutcome],
    now: datetime,
) -> None:
    """Append the outcomes' quality records to ``_quality`` (its ``run``: ``silver_run``)."""
    quality = [
        (silver_run, o.table.source, r.table, r.rule, r.policy, r.failed, r.passed, r.sample, now)
        for o in outcomes
        for r in o.quality
    ]
    if quality and not _local_write(spark, cfg, "_quality", quality, QUALITY_ARROW):
        quality_frame(spark, quality).write.format("delta").mode("append").saveAsTable(
            cfg.qualified("gold", "_quality")
        )


def _local_write(
    spark: SparkSession,
    cfg: Config,
    name: str,
    rows: list[tuple],
    schema: pa.Schema,
    replace_where: str | None = None,
) -> bool:
    """``rows`` written to gold's report table ``name`` by delta-rs (a few milliseconds where
    Spark's write of a few rows takes a second or two); False where it cannot be (not a local
    table): then the caller writes through Spark."""
    path = delta_rs.table_dir(delta_rs.schema_dir(spark, cfg.schema("gold")), name)
    names = schema.names
    records = [{k: _utc(v) for k, v in zip(names, row, strict=True)} for row in rows]
    return delta_rs.write_records(path, records, names, replace_where=replace_where) is not None


def _utc(value):
    """A naive timestamp (UTC, as Spark's session here takes it) made explicit for Arrow."""
    return value.replace(tzinfo=UTC) if isinstance(value, datetime) and not value.tzinfo else value


def write_reports(
    spark: SparkSession,
    cfg: Config,
    silver_run: int,
    outcomes: Sequence[TableOutcome],
    as_of: Callable[[int], datetime | None],
) -> None:
    """Replace the source's rows of ``_frontier``; append this run's rows to ``_quality``."""
    now = datetime.now(UTC).replace(tzinfo=None)
    write_frontier(spark, cfg, outcomes, now, as_of)
    write_quality(spark, cfg, silver_run, outcomes, now)
