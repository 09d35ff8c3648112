"""One gold table's build: what it works on (``Table``, resolved once), its ``plan``, and its
outcome (``TableOutcome``, reported in ``_frontier`` and ``_quality``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

import pyarrow as pa

from pgmedallion.core import delta_rs
from pgmedallion.core.config import Config
from pgmedallion.core.sparkapi import F, T
from pgmedallion.gold.history import Applied, ErrorSummary
from pgmedallion.gold.on_spark import c
from pgmedallion.gold.quality import VALUES_ADJUSTED, QualityRecord, row_rules
from pgmedallion.silver.contract import DIFF, LSN, METADATA, TableInfo
from pgmedallion.silver.contract import RUN as SILVER_RUN

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession


@dataclass
class TableOutcome:
    table: TableInfo
    gold_table: str
    policy: str
    mode: str  # full | incremental | unchanged | held
    frontier: int
    silver_run: int
    rows: int
    quality: list[QualityRecord] = field(default_factory=list)

    @property
    def failures(self) -> list[QualityRecord]:
        """The rules the table broke (values adjusted by a declared policy are only reported)."""
        return [r for r in self.quality if r.failed and r.rule != VALUES_ADJUSTED]


@dataclass
class Table:
    """Everything one table's build needs, resolved once."""

    spark: SparkSession
    cfg: Config
    info: TableInfo
    silver_run: int
    silver_frontier: int
    errors: ErrorSummary
    adjusted: ErrorSummary = field(default_factory=ErrorSummary)
    policy: str = ""
    columns: list[pa.Field] = field(default_factory=list)  # silver's, as Arrow names them
    range_pred: Column | None = None  # touched keys' ranges, on gold's columns
    range_pred_target: Column | None = None  # the same on the MERGE target alias ``t``
    touched: int = 0  # how many keys the run touches
    path: str | None = None  # the gold table's local directory (delta-rs commits), if any
    silver_path: str | None = None  # the silver table's, likewise
    local: bool = False  # a small local table: its rows are read by delta-rs, see ``updates``
    ranges: int | None = None  # a full build's key ranges (``pruning.key_ranges_of``), if any

    def __post_init__(self) -> None:
        self.policy = self.cfg.policy(self.info.qualified_name).on_error
        self.gold = self.cfg.qualified("gold", self.info.silver_table)
        self.quarantine = self.cfg.qualified("gold", self.info.silver_table + "__quarantine")
        schema = (
            delta_rs.arrow_schema(self.silver_path)
            if delta_rs.usable(self.silver_path)
            else delta_rs.arrow_types(self.silver.schema)
        )
        self.columns = [f for f in schema if f.name not in METADATA]
        self.names = [f.name for f in self.columns]
        self.keyed = bool(self.info.primary_key)
        self.key = list(self.info.primary_key) if self.keyed else self.names
        self.rules = row_rules(self.info.primary_key, self.info.not_null, self.policy)
        held = self.policy == "quarantine" and self.errors.count
        self.frontier = (
            min(self.silver_frontier, self.errors.first_lsn) if held else self.silver_frontier
        )
        self.app_id = f"pgmedallion-gold-{self.info.source}-{self.info.silver_table}"

    def commit_meta(self, mode: str, rows: int, quarantine_version: int | None) -> dict:
        """What a gold commit of this table records (``gold.history.Applied`` reads it back):
        what it applies, and the key it was built by (a key the source changed since asks a
        full build: :func:`gold.table.build_mode`)."""
        return {
            "source": self.info.source,
            "silver_run": self.silver_run,
            "frontier": self.frontier,
            "silver_frontier": self.silver_frontier,
            "quarantine_version": quarantine_version,
            "mode": mode,
            "rows": rows,
            "key": list(self.info.primary_key),
        }

    @cached_property
    def spark_columns(self) -> list[T.StructField]:
        """:attr:`columns` as Spark names them."""
        return delta_rs.spark_types(pa.schema(self.columns)).fields

    @cached_property
    def silver(self) -> DataFrame:
        return self.spark.table(self.cfg.qualified("silver", self.info.silver_table))

    @property
    def held(self) -> bool:
        return self.frontier < self.silver_frontier

    def updates_where(self, after_silver_run: int | None) -> str:
        """:meth:`updates`' condition in SQL (for a delta-rs read of the silver table)."""
        where = f"{SILVER_RUN} <= {int(self.silver_run)}"
        if after_silver_run is not None:
            where += f" AND {SILVER_RUN} > {int(after_silver_run)}"
        if self.held:
            where += f" AND {LSN} < {int(self.frontier)}"
        return where

    def updates(self, after_silver_run: int | None) -> DataFrame:
        """Silver's diffs of the runs in (``after_silver_run``, ``silver_run``], below the
        table's frontier (read by delta-rs for a small local table, :attr:`local`)."""
        cond = F.col(SILVER_RUN) <= self.silver_run
        if after_silver_run is not None:
            cond = cond & (F.col(SILVER_RUN) > after_silver_run)
        if self.held:
            cond = cond & (F.col(LSN) < self.frontier)
        if self.local:
            fields = {f.name: f for f in delta_rs.spark_schema(self.silver_path).fields}
            schema = T.StructType([fields[n] for n in [*self.names, LSN, DIFF]])
            where = self.updates_where(after_silver_run)
            return delta_rs.read(self.spark, self.silver_path, schema, where)
        return self.silver.filter(cond).select(*[c(n) for n in self.names], LSN, DIFF)


def plan(applied: Applied | None, silver_run: int, frontier: int) -> str:
    """``full``, ``incremental`` or ``unchanged`` for a table whose target frontier is given."""
    if applied is None or silver_run < applied.silver_run or frontier < applied.frontier:
        return "full"
    if applied.held and frontier != applied.frontier:
        return "full"  # rows held back below the old frontier live in runs already applied
    if silver_run == applied.silver_run and frontier == applied.frontier:
        return "unchanged"
    return "incremental"
