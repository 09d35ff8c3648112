"""The gold run: silver's diffs applied to each table's current state, exactly once.

``run_gold(spark, cfg)`` takes silver's latest completed run R (the largest ``run`` in
``_progress`` for the source) and its frontier F, and brings every snapshotted table of
``_tables`` to its state at F (see ``gold/__init__.py`` for the tables it writes).

Per table, the plan depends on what gold already holds, read from the gold table's own Delta
history (the newest commit whose ``userMetadata`` carries gold's JSON tag):

``full``         nothing applied yet, the columns changed, silver was rebuilt, or the table's
                 frontier moves in a way an increment cannot express (a definite error found
                 below what was applied, or a held table released): the state is recomputed
                 from every silver row with ``_run <= R`` and written with one overwrite.
``incremental``  only silver rows with ``_run`` in (applied run, R] are read (silver is
                 append-only, so file statistics on ``_run`` skip the older files); the keys
                 they touch get their old state from gold (and quarantine), the new state is
                 old + changes, and one keyed MERGE writes it (see ``gold.state``). The reads of
                 gold for old rows and the MERGE carry a range predicate on the touched keys, so
                 Delta's min/max statistics skip the files that cannot hold them (a full build
                 writes keyed tables range-partitioned and sorted by key, so files hold key
                 ranges), and a bitmap of the touched keys' hashes (``key_filter``), so that
                 of the rows those files hold only the touched keys' (and ~12% others) reach
                 the joins: the MERGE's rewrite joins gold as the inner side of the source's
                 outer join, which Spark shuffles and sorts, and without the bitmap that was
                 every row of every touched file. The touched keys are broadcast elsewhere;
                 deletion vectors keep the rewrite proportional to the changed rows. What stays
                 proportional to the table is scanning the files whose key range the changes
                 fall in: changes spread uniformly over the key space touch every file.
``unchanged``    gold already holds run R at this frontier: nothing is written. Likewise a
                 table no silver run wrote anything for (diffs, errors, adjustments: the
                 ``tables`` of ``_progress``) since the run ``_frontier`` last reported for it
                 is not read at all: its gold table already holds its state at F, and only its
                 ``_frontier`` row moves to F. A run touches only the tables that changed, and
                 builds them concurrently (each in its own Spark session: the idempotent-commit
                 settings below are session settings).

Exactly once. The gold commit is what makes a run applied: its ``userMetadata`` records the
silver run, the frontier and the quarantine table's version, and it is made with Delta's
idempotent-write settings (``txnAppId = pgmedallion-gold-<source>-<table>``, ``txnVersion =
R``), which Delta 4.4 honours for MERGE as for writes. The quarantine table is written first
and read back *as of the version the gold commit names*, so a crash between the two commits
re-reads the old quarantine. ``_frontier`` and ``_quality`` are reports written after every
table; a crash before them loses a report, never state, and the next run rediscovers from the
gold commits what was applied. (A table's ``_frontier`` row at run R says its gold table holds
its state at R: either its gold commit is R's, or no silver run since that commit wrote
anything for it. A lost report only makes the next run look at more tables.) A run in which
nothing changed, not even a frontier, writes no reports.

Key-less tables take the same incremental path with the whole row as the key (a "key" is a
distinct row value; its copies are its multiplicity); only a table whose columns cannot be
compared (a map) is recomputed in full every run, at the cost of reading all its silver rows.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from queue import Queue

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from core.config import Config
from core.expectations import quality_frame
from core.failpoints import failpoint
from core.naming import COLUMN_MAPPING, quote
from core.parallel import concurrently
from gold.quality import (
    NO_DEFINITE_ERRORS,
    VALUES_ADJUSTED,
    GoldQualityError,
    QualityRecord,
    Rule,
    row_rules,
)
from gold.state import (
    DIFF,
    LSN,
    METADATA,
    MULT,
    OLD_GOLD,
    OP,
    RULES,
    RUN,
    TO_GOLD,
    c,
    check,
    consolidate,
    expand,
    merge_operations,
    null_safe_join,
)

TAG = "pgmedallion_gold"
GOLD_PROPERTIES = {**COLUMN_MAPPING, "delta.enableDeletionVectors": "true"}
SAMPLE_ROWS = 5
HISTORY_FIRST = 20  # gold commits are looked for among this many newest commits first
ROWS_PER_FILE = 1_000_000  # a full build's file size, in rows
BROADCAST_KEYS = 1_000_000  # up to this many touched keys, joins with gold broadcast them
# Up to this many touched keys, gold's reads and MERGEs also filter gold's rows by a bitmap of
# the touched keys' hashes (see ``key_filter``), of this many bits per key.
KEY_FILTER_KEYS = 100_000
KEY_FILTER_BITS = 8
_RANGE_TYPES = (
    T.NumericType,
    T.StringType,
    T.DateType,
    T.TimestampType,
    T.TimestampNTZType,
)

FRONTIER_SCHEMA = T.StructType(
    [
        T.StructField("source", T.StringType()),
        T.StructField("table_oid", T.LongType()),
        T.StructField("table_schema", T.StringType()),
        T.StructField("table_name", T.StringType()),
        T.StructField("gold_table", T.StringType()),
        T.StructField("frontier", T.LongType()),
        T.StructField("silver_run", T.LongType()),
        T.StructField("rows", T.LongType()),
        T.StructField("updated_at", T.TimestampType()),
    ]
)
QUALITY_SCHEMA = T.StructType(
    [
        T.StructField("run", T.LongType()),
        T.StructField("source", T.StringType()),
        T.StructField("table", T.StringType()),
        T.StructField("rule", T.StringType()),
        T.StructField("policy", T.StringType()),
        T.StructField("failed", T.LongType()),
        T.StructField("passed", T.LongType()),
        T.StructField("sample", T.StringType()),
        T.StructField("checked_at", T.TimestampType()),
    ]
)


@dataclass(frozen=True)
class SourceTable:
    """One row of silver's ``_tables``."""

    source: str
    table_oid: int
    table_schema: str
    table_name: str
    silver_table: str
    primary_key: tuple[str, ...]
    not_null: tuple[str, ...]
    snapshot_run: int | None = None
    """The silver run that rebuilt the table from its newest snapshot (see silver's
    ``_tables``): gold is rebuilt in full from it, and errors of earlier runs are history."""

    @property
    def name(self) -> str:
        return f"{self.table_schema}.{self.table_name}"


@dataclass(frozen=True)
class Applied:
    """What a gold table holds, as its newest gold commit records it."""

    silver_run: int
    frontier: int
    silver_frontier: int
    quarantine_version: int | None
    version: int
    rows: int | None = None  # gold's own row accounting after the commit

    @property
    def held(self) -> bool:
        return self.frontier < self.silver_frontier


@dataclass(frozen=True)
class ErrorSummary:
    count: int = 0
    first_lsn: int | None = None
    sample: str = "[]"


@dataclass
class TableOutcome:
    table: SourceTable
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
class GoldResult:
    source: str
    silver_run: int | None
    frontier: int | None
    tables: list[TableOutcome] = field(default_factory=list)

    def table(self, name: str) -> TableOutcome:
        """The outcome for a silver table name or a ``schema.table`` source name."""
        for t in self.tables:
            if name in (t.table.silver_table, t.table.name):
                return t
        raise KeyError(name)


# --------------------------------------------------------------------------- reading silver


def latest_progress(spark: SparkSession, cfg: Config) -> tuple[int, int] | None:
    """Silver's latest completed run and its frontier for the source, or None."""
    row = (
        spark.table(cfg.qualified("silver", "_progress"))
        .filter(F.col("source") == cfg.source.name)
        .agg(F.max("run").alias("run"), F.max_by("frontier", "run").alias("frontier"))
        .collect()[0]
    )
    return (int(row["run"]), int(row["frontier"])) if row["run"] is not None else None


def read_tables(spark: SparkSession, cfg: Config) -> list[SourceTable]:
    rows = (
        spark.table(cfg.qualified("silver", "_tables"))
        .filter((F.col("source") == cfg.source.name) & F.col("snapshot_lsn").isNotNull())
        .orderBy("table_schema", "table_name")
        .collect()
    )
    return [
        SourceTable(
            source=r["source"],
            table_oid=int(r["table_oid"]),
            table_schema=r["table_schema"],
            table_name=r["table_name"],
            silver_table=r["silver_table"],
            primary_key=tuple(r["primary_key"] or ()),
            not_null=tuple(r["not_null"] or ()),
            snapshot_run=r.asDict().get("snapshot_run"),  # absent before resync existed
        )
        for r in rows
    ]


def read_errors(
    spark: SparkSession, cfg: Config, frontier: int, since: dict[int, int] | None = None
) -> dict[tuple, ErrorSummary]:
    """Definite errors below the frontier, per ``(table_oid, table_schema, table_name)``;
    ``since``: table OID -> the silver run that rebuilt it (its errors before are history)."""
    errors = spark.table(cfg.qualified("silver", "_errors")).filter(
        (F.col("source") == cfg.source.name) & (F.col("lsn") < frontier)
    )
    errors = _since(spark, errors, since)
    sample = F.struct("lsn", "code", "column_name", "message", "run")
    rows = (
        errors.groupBy("table_oid", "table_schema", "table_name")
        .agg(
            F.count(F.lit(1)).alias("n"),
            F.min("lsn").alias("first_lsn"),
            F.to_json(F.slice(F.sort_array(F.collect_list(sample)), 1, SAMPLE_ROWS)).alias("s"),
        )
        .collect()
    )
    return {
        (r["table_oid"], r["table_schema"], r["table_name"]): ErrorSummary(
            int(r["n"]), int(r["first_lsn"]), r["s"]
        )
        for r in rows
    }


def _since(spark: SparkSession, rows: DataFrame, since: dict[int, int] | None) -> DataFrame:
    """``rows`` (with ``table_oid`` and ``run``) without those from before their table's
    rebuild."""
    if not since:
        return rows
    rebuilt = spark.createDataFrame(list(since.items()), "table_oid long, _since long")
    joined = rows.join(F.broadcast(rebuilt), "table_oid", "left")
    return joined.where(F.col("_since").isNull() | (F.col("run") >= F.col("_since"))).drop("_since")


def read_adjustments(
    spark: SparkSession, cfg: Config, run: int, since: dict[int, int] | None = None
) -> dict[int, ErrorSummary]:
    """Values silver's runs up to ``run`` adjusted by a declared policy (rounded numerics,
    clamped or nulled infinities), per table OID: counted in ``_quality`` as
    ``values_adjusted`` (always ``warn``: the user declared them)."""
    name = cfg.qualified("silver", "_adjustments")
    if not spark.catalog.tableExists(name):
        return {}
    sample = F.struct("column_name", "code", "count", "sample", "run")
    adjustments = spark.table(name).where(
        (F.col("source") == cfg.source.name) & (F.col("run") <= run)
    )
    rows = (
        _since(spark, adjustments, since)
        .groupBy("table_oid")
        .agg(
            F.sum("count").alias("n"),
            F.min("first_lsn").alias("first_lsn"),
            F.to_json(F.slice(F.sort_array(F.collect_list(sample)), 1, SAMPLE_ROWS)).alias("s"),
        )
        .collect()
    )
    return {r["table_oid"]: ErrorSummary(int(r["n"]), r["first_lsn"], r["s"]) for r in rows}


def errors_of(table: SourceTable, errors: dict[tuple, ErrorSummary]) -> ErrorSummary:
    """The table's errors: matched by OID, or by name where silver knew no OID."""
    found = [
        e
        for (oid, schema, name), e in errors.items()
        if oid == table.table_oid
        or (oid is None and (schema, name) == (table.table_schema, table.table_name))
    ]
    if not found:
        return ErrorSummary()
    first = min(found, key=lambda e: e.first_lsn)
    return ErrorSummary(sum(e.count for e in found), first.first_lsn, first.sample)


# --------------------------------------------------------------------------- gold bookkeeping


def table_exists(spark: SparkSession, name: str) -> bool:
    return spark.catalog.tableExists(name)


def applied_state(spark: SparkSession, gold: str) -> Applied | None:
    """The newest gold commit of ``gold``, from its Delta history (None: nothing applied).

    The newest commits are looked at first (Delta reads one commit file per version of
    history), the whole history only when none of them is gold's.
    """
    rows = []
    for limit in (HISTORY_FIRST, None):
        history = spark.sql(f"DESCRIBE HISTORY {gold}" + (f" LIMIT {limit}" if limit else ""))
        rows = (
            history.filter(F.col("userMetadata").contains(TAG))
            .orderBy(F.col("version").desc())
            .select("version", "userMetadata")
            .limit(1)
            .collect()
        )
        if rows:
            break
    if not rows:
        return None
    meta = json.loads(rows[0]["userMetadata"])[TAG]
    return Applied(
        silver_run=int(meta["silver_run"]),
        frontier=int(meta["frontier"]),
        silver_frontier=int(meta["silver_frontier"]),
        quarantine_version=meta.get("quarantine_version"),
        version=int(rows[0]["version"]),
        rows=meta.get("rows"),
    )


def latest_version(spark: SparkSession, name: str) -> int:
    return int(spark.sql(f"DESCRIBE HISTORY {name} LIMIT 1").collect()[0]["version"])


@contextmanager
def tagged_commit(
    spark: SparkSession, metadata: dict, app_id: str | None, version: int | None
) -> Iterator[None]:
    """Delta commits made inside carry ``metadata`` and, given an app id, are idempotent."""
    settings = {"spark.databricks.delta.commitInfo.userMetadata": json.dumps({TAG: metadata})}
    if app_id is not None and version is not None:
        settings["spark.databricks.delta.write.txnAppId"] = app_id
        settings["spark.databricks.delta.write.txnVersion"] = str(version)
    for key, value in settings.items():
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key in settings:
            spark.conf.unset(key)


def plan(applied: Applied | None, run: int, frontier: int) -> str:
    """``full``, ``incremental`` or ``unchanged`` for a table whose target frontier is given."""
    if applied is None or run < applied.silver_run or frontier < applied.frontier:
        return "full"
    if applied.held and frontier != applied.frontier:
        return "full"  # rows held back below the old frontier live in runs already applied
    if run == applied.silver_run and frontier == applied.frontier:
        return "unchanged"
    return "incremental"


def create_table(spark: SparkSession, name: str, schema: T.StructType) -> None:
    from delta.tables import DeltaTable

    builder = DeltaTable.createIfNotExists(spark).tableName(name).addColumns(schema)
    for key, value in GOLD_PROPERTIES.items():
        builder = builder.property(key, value)
    builder.execute()


def _nullable(fields: Sequence[T.StructField]) -> list[T.StructField]:
    return [T.StructField(f.name, f.dataType, True) for f in fields]


def gold_schema(columns: Sequence[T.StructField]) -> T.StructType:
    return T.StructType([*_nullable(columns), T.StructField(LSN, T.LongType())])


def quarantine_schema(columns: Sequence[T.StructField]) -> T.StructType:
    return T.StructType(
        [
            *_nullable(columns),
            T.StructField(LSN, T.LongType()),
            T.StructField(MULT, T.LongType()),
            T.StructField(RULES, T.ArrayType(T.StringType())),
            T.StructField(RUN, T.LongType()),
        ]
    )


def _same_columns(spark: SparkSession, name: str, schema: T.StructType) -> bool:
    have = [(f.name, f.dataType) for f in spark.table(name).schema.fields]
    return have == [(f.name, f.dataType) for f in schema.fields]


def plain_name(cfg: Config, layer: str, name: str) -> str:
    schema = getattr(cfg.lakehouse, f"{layer}_schema")
    return ".".join(p for p in (cfg.lakehouse.catalog, schema, name) if p)


# --------------------------------------------------------------------------- one table


@dataclass
class _Table:
    """Everything one table's run needs, resolved once."""

    spark: SparkSession
    cfg: Config
    info: SourceTable
    run: int
    silver_frontier: int
    errors: ErrorSummary
    adjusted: ErrorSummary = field(default_factory=ErrorSummary)
    policy: str = ""
    columns: list[T.StructField] = field(default_factory=list)
    range_pred: Column | None = None  # touched keys' ranges, on gold's columns
    range_pred_target: Column | None = None  # the same on the MERGE target alias ``t``
    touched: int = 0  # how many keys the run touches

    def __post_init__(self) -> None:
        self.policy = self.cfg.policy(self.info.name).on_error
        self.gold = self.cfg.qualified("gold", self.info.silver_table)
        self.quarantine = self.cfg.qualified("gold", self.info.silver_table + "__quarantine")
        self.silver = self.spark.table(self.cfg.qualified("silver", self.info.silver_table))
        self.columns = [f for f in self.silver.schema.fields if f.name not in METADATA]
        self.names = [f.name for f in self.columns]
        self.keyed = bool(self.info.primary_key)
        self.key = list(self.info.primary_key) if self.keyed else self.names
        self.rules = row_rules(self.info.primary_key, self.info.not_null, self.policy)
        held = self.policy == "quarantine" and self.errors.count
        self.frontier = (
            min(self.silver_frontier, self.errors.first_lsn) if held else self.silver_frontier
        )
        self.app_id = f"pgmedallion-gold-{self.info.source}-{self.info.silver_table}"

    @property
    def held(self) -> bool:
        return self.frontier < self.silver_frontier

    def updates(self, after_run: int | None) -> DataFrame:
        cond = F.col(RUN) <= self.run
        if after_run is not None:
            cond = cond & (F.col(RUN) > after_run)
        if self.held:
            cond = cond & (F.col(LSN) < self.frontier)
        return self.silver.filter(cond).select(*[c(n) for n in self.names], LSN, DIFF)


def build_table(
    spark: SparkSession,
    cfg: Config,
    info: SourceTable,
    run: int,
    frontier: int,
    errors: ErrorSummary,
    *,
    applied_override: Applied | None | str = "discover",
    adjusted: ErrorSummary | None = None,
    exists: bool | None = None,
) -> TableOutcome:
    """Bring one gold table to silver run ``run`` at ``frontier`` (or hold it; see module doc).

    ``applied_override`` replaces what the gold history says was applied (tests use it to act
    as a run whose bookkeeping was lost); Delta's idempotent writes must then skip the commit.
    """
    t = _Table(spark, cfg, info, run, frontier, errors, adjusted or ErrorSummary())
    errors_record = summary_record(info.name, NO_DEFINITE_ERRORS, t.policy, errors)
    schema = gold_schema(t.columns)
    if exists is None:
        exists = table_exists(spark, t.gold)
    if exists and not _same_columns(spark, t.gold, schema):
        spark.sql(f"DROP TABLE {t.gold}")
        spark.sql(f"DROP TABLE IF EXISTS {t.quarantine}")
        exists = False
    if not exists:
        create_table(spark, t.gold, schema)
    applied = applied_state(spark, t.gold) if applied_override == "discover" else applied_override
    mode = plan(applied, run, t.frontier)
    if mode == "incremental" and (info.snapshot_run or -1) > applied.silver_run:
        mode = "full"  # silver rebuilt the table from a new snapshot since gold's last run
    if mode == "unchanged":
        untouched = [QualityRecord(info.name, r.name, t.policy, 0, 0) for r in t.rules]
        records = [errors_record, *untouched]
        return _outcome(spark, t, applied, mode, records)

    if mode == "full" or not _comparable(t.columns, t.key) or applied.rows is None:
        mode = "full"
        state, affected, quarantine_old, old_rows = (
            consolidate(t.updates(None), t.names),
            None,
            0,
            0,
        )
    else:
        state, affected, quarantine_old, old_rows = _incremental_state(t, applied)
    checked = check(state, t.rules, info.primary_key, t.policy)
    checked = (
        checked.localCheckpoint()
        if affected is not None
        else checked.persist(StorageLevel.MEMORY_AND_DISK)
    )
    try:
        counted, quarantined, gold_rows = count_rules(checked, t.rules, info.name, t.policy)
        records = [errors_record] + counted
        if t.policy == "fail" and any(r.failed for r in records):
            return _outcome(spark, t, applied, "held", records)
        idempotent = applied is None or run > applied.silver_run
        version = run if idempotent else None
        q_version = _write_quarantine(
            t, checked, affected, applied, quarantined, quarantine_old, version
        )
        meta = {
            "source": info.source,
            "silver_run": run,
            "frontier": t.frontier,
            "silver_frontier": frontier,
            "quarantine_version": q_version,
            "mode": mode,
            "rows": gold_rows + (applied.rows - old_rows if affected is not None else 0),
        }
        with tagged_commit(spark, meta, t.app_id, version):
            if affected is None:
                rows = expand(checked.filter(F.col(TO_GOLD) & (F.col(MULT) > 0)))
                rows = clustered(rows.select(*[c(n) for n in t.names], LSN), t, gold_rows)
                rows.writeTo(t.gold).overwrite(F.lit(True))
            else:
                _merge_gold(t, merge_operations(checked, affected, t.key, t.names), affected)
        failpoint("gold.after_table")
    finally:
        checked.unpersist()
    now = Applied(  # what the commit just made (or, skipped as done, had made) records
        silver_run=run,
        frontier=t.frontier,
        silver_frontier=frontier,
        quarantine_version=q_version,
        version=-1,
        rows=meta["rows"],
    )
    return _outcome(spark, t, now, mode, records)


def clustered(rows: DataFrame, t: _Table, count: int) -> DataFrame:
    """A full build's rows in files that each hold one key range, sorted by key, so that the
    per-file min/max statistics let later runs' key-range predicates skip files."""
    if not t.keyed or not _comparable(t.columns, t.key):
        return rows
    files = max(1, -(-count // ROWS_PER_FILE))
    return rows.repartitionByRange(files, *[c(k) for k in t.key]).sortWithinPartitions(
        *[c(k) for k in t.key]
    )


def _comparable(columns: Sequence[T.StructField], key: Sequence[str]) -> bool:
    """Whether rows can be grouped and joined on ``key`` (maps cannot)."""
    types = {f.name: f.dataType for f in columns}
    return not any("map<" in types[k].simpleString() for k in key)


def _outcome(
    spark: SparkSession, t: _Table, applied: Applied | None, mode: str, records: list
) -> TableOutcome:
    adjusted = t.adjusted
    records = [
        *records,
        summary_record(t.info.name, VALUES_ADJUSTED, "warn", adjusted),
    ]
    return TableOutcome(
        table=t.info,
        gold_table=plain_name(t.cfg, "gold", t.info.silver_table),
        policy=t.policy,
        mode=mode,
        frontier=applied.frontier if applied else 0,
        silver_run=applied.silver_run if applied else 0,
        rows=_rows(spark, t.gold, applied),
        quality=records,
    )


def _rows(spark: SparkSession, gold: str, applied: Applied | None) -> int:
    """Gold's row count as its commits account for it (no scan); counted only without one."""
    if applied is not None and applied.rows is not None:
        return int(applied.rows)
    return spark.table(gold).count()


def small(t: _Table, df: DataFrame) -> DataFrame:
    """``df`` marked for a broadcast join when the run touches few keys.

    The touched keys, the old state read for them and the MERGE source are derived from
    checkpointed data Spark cannot size, so without the hint it plans sort-merge joins that
    shuffle the whole gold table; with it, gold is only scanned.
    """
    return F.broadcast(df) if t.touched <= BROADCAST_KEYS else df


def key_filter(t: _Table, keys: DataFrame, count: int) -> tuple[Column, Column] | None:
    """A filter on gold's rows, on the bare column names and on the MERGE target alias ``t``,
    true for every row whose key is in ``keys`` and for few others (None: too many keys).

    Delta's MERGE joins gold with its source as the source's outer join (it has an insert
    clause), and Spark cannot broadcast the preserved side of an outer join, so without a
    filter every row of every touched file is shuffled and sorted (with random keys, the whole
    table). The filter is a bitmap of the touched keys' 64-bit hashes, ``KEY_FILTER_BITS`` bits
    per key (about 12% of other rows pass), looked up per row with integer expressions. Delta
    records a MERGE's condition, this literal included, in the commit: about 2.5 bytes per
    touched key (an exact set of hashes would be 20).
    """
    if count > KEY_FILTER_KEYS:
        return None
    words = [0] * max(1, -(-count * KEY_FILTER_BITS // 64))
    size = 64 * len(words)
    for (h,) in keys.select(F.xxhash64(*[c(k) for k in t.key])).collect():
        bit = h % size
        words[bit >> 6] |= 1 << (bit & 63)
    bitmap = ",".join(str(w - (1 << 64) if w >= 1 << 63 else w) for w in words)
    filters = []
    for alias in (None, "t"):
        cols = ", ".join(f"{alias}.{quote(k)}" if alias else quote(k) for k in t.key)
        bit = f"pmod(xxhash64({cols}), {size})"
        filters.append(
            F.expr(
                f"getbit(element_at(array({bitmap}), int(shiftright({bit}, 6)) + 1), "
                f"int({bit} & 63)) = 1"
            )
        )
    return filters[0], filters[1]


def key_ranges(t: _Table, keys: DataFrame) -> tuple[Column, Column, int]:
    """A predicate on target columns only, true for every row whose key is in ``keys``: on
    the bare column names, and on the MERGE target alias ``t``.

    Built from the touched keys' min and max (and whether NULL is among them), it lets Delta
    skip the files whose statistics rule those keys out. Key-less tables use their first
    columns the same way. When the run touches at most ``KEY_FILTER_KEYS`` keys, it also holds
    ``key_filter``'s bitmap test.
    """
    types = {f.name: f.dataType for f in t.columns}
    cols = [k for k in t.key if isinstance(types[k], _RANGE_TYPES)][:3]
    aggs = [F.count(F.lit(1)).alias("n")]
    for i, k in enumerate(cols):
        aggs += [
            F.min(c(k)).alias(f"lo{i}"),
            F.max(c(k)).alias(f"hi{i}"),
            F.max(c(k).isNull().cast("int")).alias(f"null{i}"),
        ]
    row = keys.agg(*aggs).collect()[0]
    filters = key_filter(t, keys, int(row["n"]))
    preds = []
    for j, alias in enumerate((None, "t")):
        pred = F.lit(True)
        for i, k in enumerate(cols):
            lo, hi, nulls = row[f"lo{i}"], row[f"hi{i}"], row[f"null{i}"]
            col = c(k, alias)
            term = col.between(F.lit(lo), F.lit(hi)) if lo is not None else F.lit(False)
            if nulls:
                term = term | col.isNull()
            pred = pred & term
        if filters is not None:
            pred = pred & filters[j]
        preds.append(pred)
    return preds[0], preds[1], int(row["n"])


def _incremental_state(t: _Table, applied: Applied) -> tuple[DataFrame, DataFrame, int, int]:
    """New state of the touched keys, the touched keys with gold's row count for each, how
    many quarantined rows they had, and how many gold rows."""
    spark = t.spark
    updates = t.updates(applied.silver_run)
    # Checkpointed: the touched keys are read several times below, silver once.
    keys = updates.select(*[c(k) for k in t.key]).distinct().localCheckpoint()
    t.range_pred, t.range_pred_target, t.touched = key_ranges(t, keys)
    old_gold = null_safe_join(
        spark.table(t.gold).filter(t.range_pred), small(t, keys), t.key, "left_semi"
    )
    old_gold = old_gold.select(*[c(n) for n in t.names], LSN, F.lit(1).cast("bigint").alias(DIFF))
    old_gold = old_gold.localCheckpoint()
    old_rows = old_gold.count()
    counts = old_gold.groupBy(*[c(k) for k in t.key]).agg(F.count(F.lit(1)).alias(OLD_GOLD))
    affected = null_safe_join(keys, counts, t.key, "left").fillna(0, [OLD_GOLD])
    parts = [updates, old_gold]
    quarantine_old = 0
    if applied.quarantine_version is not None:
        version = int(applied.quarantine_version)
        old_q = spark.sql(f"SELECT * FROM {t.quarantine} VERSION AS OF {version}")
        old_q = null_safe_join(old_q.filter(t.range_pred), small(t, keys), t.key, "left_semi")
        old_q = old_q.select(*[c(n) for n in t.names], LSN, F.col(MULT).alias(DIFF))
        old_q = old_q.localCheckpoint()
        quarantine_old = old_q.count()
        parts.append(old_q)
    union = parts[0]
    for p in parts[1:]:
        union = union.unionByName(p)
    return consolidate(union, t.names), affected, quarantine_old, old_rows


def _quarantine_rows(t: _Table, checked: DataFrame) -> DataFrame:
    return checked.filter(~F.col(TO_GOLD)).select(
        *[c(n) for n in t.names], LSN, MULT, RULES, F.lit(t.run).cast("bigint").alias(RUN)
    )


def _write_quarantine(
    t: _Table,
    checked: DataFrame,
    affected: DataFrame | None,
    applied: Applied | None,
    new_rows: int,
    old_rows: int,
    version: int | None,
) -> int | None:
    """Write the quarantine table's new rows; its version after that (None: no table)."""
    spark = t.spark
    exists = table_exists(spark, t.quarantine)
    if not exists and not new_rows:
        return None
    if not exists:
        create_table(spark, t.quarantine, quarantine_schema(t.columns))
    meta = {"source": t.info.source, "silver_run": t.run, "frontier": t.frontier}
    app_id = t.app_id + "__quarantine"
    rows = _quarantine_rows(t, checked)
    if affected is None:
        with tagged_commit(spark, meta, app_id, version):
            rows.writeTo(t.quarantine).overwrite(F.lit(True))
    elif new_rows or old_rows:
        from delta.tables import DeltaTable

        markers = affected.select(
            *[c(n) if n in t.key else F.lit(None).alias(n) for n in t.names],
            F.lit(None).cast("bigint").alias(LSN),
            F.lit(None).cast("bigint").alias(MULT),
            F.lit(None).cast("array<string>").alias(RULES),
            F.lit(None).cast("bigint").alias(RUN),
            F.lit("delete").alias(OP),
        )
        markers = markers.select(
            *[F.col(quote(f.name)).cast(f.dataType).alias(f.name) for f in rows.schema.fields],
            OP,
        )
        source = markers.unionByName(rows.withColumn(OP, F.lit("insert")))
        cond = (F.col(f"s.{OP}") == "delete") & _key_match(t.key) & _ranges_target(t)
        target = DeltaTable.forName(spark, t.quarantine).alias("t")
        with tagged_commit(spark, meta, app_id, version):
            (
                target.merge(small(t, source).alias("s"), cond)
                .whenMatchedDelete()
                .whenNotMatchedInsert(
                    condition=F.col(f"s.{OP}") == "insert",
                    values={quote(f.name): c(f.name, "s") for f in rows.schema.fields},
                )
                .execute()
            )
    elif applied is not None and applied.quarantine_version is not None:
        return applied.quarantine_version
    return latest_version(spark, t.quarantine)


def _key_match(key: Sequence[str]) -> Column:
    cond = F.lit(True)
    for k in key:
        cond = cond & c(k, "t").eqNullSafe(c(k, "s"))
    return cond


def _ranges_target(t: _Table) -> Column:
    return t.range_pred_target if t.range_pred_target is not None else F.lit(True)


def _merge_gold(t: _Table, ops: DataFrame, affected: DataFrame) -> None:
    from delta.tables import DeltaTable

    # Every clause takes its values from the source alone: with deletion vectors, Delta's
    # second pass then reads only the key columns of the files it touches, not whole rows
    # (a condition comparing old and new values made it read every column: 9 s instead of
    # 5.3 s at 10M rows). An upsert equal to the old row is rare (the LSN moves with any
    # change) and costs one rewritten row.
    values = {quote(n): c(n, "s") for n in [*t.names, LSN]}
    cond = (F.col(f"s.{OP}") != "insert") & _key_match(t.key) & _ranges_target(t)
    target = DeltaTable.forName(t.spark, t.gold).alias("t")
    (
        target.merge(small(t, ops).alias("s"), cond)
        .whenMatchedDelete(condition=F.col(f"s.{OP}") == "delete")
        .whenMatchedUpdate(condition=F.col(f"s.{OP}") == "upsert", set=values)
        .whenNotMatchedInsert(condition=F.col(f"s.{OP}").isin("upsert", "insert"), values=values)
        .execute()
    )


def count_rules(
    checked: DataFrame, rules: Sequence[Rule], table: str, policy: str
) -> tuple[list[QualityRecord], int, int]:
    """Failed and passed row counts per rule, with up to five failing rows as JSON; how many
    rows stay out of gold, and how many rows gold gets."""
    to_gold = F.when(F.col(TO_GOLD) & (F.col(MULT) > 0), F.col(MULT)).otherwise(0)
    aggs = [
        F.count(F.lit(1)).alias("n"),
        F.count_if(~F.col(TO_GOLD)).alias("held"),
        F.sum(to_gold).alias("gold"),
    ]
    for i, rule in enumerate(rules):
        aggs.append(F.count_if(F.array_contains(F.col(RULES), rule.name)).alias(f"f{i}"))
    counts = checked.agg(*aggs).collect()[0]
    records = []
    payload = [c(n) for n in checked.columns if n not in (RULES, TO_GOLD)]
    for i, rule in enumerate(rules):
        failed = int(counts[f"f{i}"])
        sample = "[]"
        if failed:
            rows = (
                checked.filter(F.array_contains(F.col(RULES), rule.name))
                .select(F.to_json(F.struct(*payload)).alias("j"))
                .limit(SAMPLE_ROWS)
                .collect()
            )
            sample = "[" + ",".join(r["j"] for r in rows) + "]"
        records.append(
            QualityRecord(table, rule.name, policy, failed, int(counts["n"]) - failed, sample)
        )
    return records, int(counts["held"]), int(counts["gold"] or 0)


# --------------------------------------------------------------------------- the run


def ensure_gold_tables(spark: SparkSession, cfg: Config) -> None:
    spark.sql(f"CREATE SCHEMA IF NOT EXISTS {cfg.qualified('gold', '')}")
    from delta.tables import DeltaTable

    for name, schema in (("_frontier", FRONTIER_SCHEMA), ("_quality", QUALITY_SCHEMA)):
        DeltaTable.createIfNotExists(spark).tableName(cfg.qualified("gold", name)).addColumns(
            schema
        ).execute()


def write_reports(
    spark: SparkSession, cfg: Config, run: int, outcomes: Sequence[TableOutcome]
) -> None:
    """Replace the source's rows of ``_frontier``; append this run's rows to ``_quality``."""
    now = datetime.now(UTC).replace(tzinfo=None)
    frontier = [
        (
            o.table.source,
            o.table.table_oid,
            o.table.table_schema,
            o.table.table_name,
            o.gold_table,
            o.frontier,
            o.silver_run,
            o.rows,
            now,
        )
        for o in outcomes
    ]
    # One atomic commit replacing this source's rows. (A DataFrameWriterV2 overwrite: the V1
    # saveAsTable overwrite also asks the Hive metastore to alter the table, which it refuses.)
    spark.createDataFrame(frontier, FRONTIER_SCHEMA).writeTo(
        cfg.qualified("gold", "_frontier")
    ).overwrite(F.col("source") == F.lit(cfg.source.name))
    quality = [
        (run, o.table.source, r.table, r.rule, r.policy, r.failed, r.passed, r.sample, now)
        for o in outcomes
        for r in o.quality
    ]
    if quality:
        quality_frame(spark, quality).write.format("delta").mode("append").saveAsTable(
            cfg.qualified("gold", "_quality")
        )


@dataclass(frozen=True)
class Reported:
    """A table's row of ``_frontier``: what the last gold run reported for it."""

    silver_run: int
    frontier: int
    rows: int | None


def read_reported(spark: SparkSession, cfg: Config) -> dict[tuple[int, str], Reported]:
    """``_frontier``'s rows of the source by ``(table_oid, gold_table)``."""
    rows = (
        spark.table(cfg.qualified("gold", "_frontier"))
        .where(F.col("source") == cfg.source.name)
        .select("table_oid", "gold_table", "silver_run", "frontier", "rows")
        .collect()
    )
    return {
        (int(r["table_oid"]), r["gold_table"]): Reported(
            int(r["silver_run"]), int(r["frontier"]), r["rows"]
        )
        for r in rows
        if r["silver_run"] is not None and r["frontier"] is not None
    }


def touched_by_runs(
    spark: SparkSession, cfg: Config, after: int, run: int
) -> list[tuple[int, set[int] | None]]:
    """Silver's runs in (``after``, ``run``] with the tables each wrote something for (None:
    a run made before ``_progress`` listed them, taken to touch every table)."""
    progress = spark.table(cfg.qualified("silver", "_progress"))
    if "tables" not in progress.columns:
        return [(r, None) for r in range(after + 1, run + 1)]
    rows = (
        progress.where(
            (F.col("source") == cfg.source.name) & (F.col("run") > after) & (F.col("run") <= run)
        )
        .select("run", "tables")
        .collect()
    )
    return [(int(r["run"]), None if r["tables"] is None else set(r["tables"])) for r in rows]


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


def quiet_outcome(
    cfg: Config,
    info: SourceTable,
    run: int,
    frontier: int,
    errors: ErrorSummary,
    adjusted: ErrorSummary | None,
    reported: Reported,
) -> TableOutcome:
    """The outcome of a table no silver run since its last gold run wrote anything for: its
    gold table holds its state at the new frontier as it is, so nothing is read or written
    (``_frontier`` records the new frontier)."""
    policy = cfg.policy(info.name).on_error
    held = policy == "quarantine" and errors.count
    records = [
        summary_record(info.name, NO_DEFINITE_ERRORS, policy, errors),
        *[
            QualityRecord(info.name, r.name, policy, 0, 0)
            for r in row_rules(info.primary_key, info.not_null, policy)
        ],
    ]
    adjusted = adjusted or ErrorSummary()
    records.append(summary_record(info.name, VALUES_ADJUSTED, "warn", adjusted))
    return TableOutcome(
        table=info,
        gold_table=plain_name(cfg, "gold", info.silver_table),
        policy=policy,
        mode="unchanged",
        frontier=min(frontier, errors.first_lsn) if held else frontier,
        silver_run=run,
        rows=int(reported.rows or 0),
        quality=records,
    )


def _gold_tables(spark: SparkSession, cfg: Config) -> set[str]:
    """The gold schema's table names, lower case (one catalog call)."""
    parts = [p for p in (cfg.lakehouse.catalog, cfg.lakehouse.gold_schema) if p]
    schema = ".".join("`" + p.replace("`", "``") + "`" for p in parts)
    return {r["tableName"].lower() for r in spark.sql(f"SHOW TABLES IN {schema}").collect()}


GOLD_WORKERS = 4
"""How many tables a gold run builds at once (see ``silver.build.TABLE_WORKERS``)."""


def _sessions(spark: SparkSession, count: int) -> list[SparkSession]:
    """``count`` sessions of ``spark``'s context, each with its own settings; just ``spark``
    where one is enough or new sessions cannot be made (Spark Connect): then the tables are
    built one after another."""
    if count <= 1:
        return [spark]
    try:
        return [spark.newSession() for _ in range(count)]
    except Exception:  # Spark Connect has no newSession
        return [spark]


def run_gold(spark: SparkSession, cfg: Config) -> GoldResult:
    """One gold run over every snapshotted table of the configured source.

    A table no silver run wrote anything for since the run gold last applied or reported
    for it (``_progress.tables``) costs nothing: its gold table already holds its state at
    the new frontier, which ``_frontier`` records. The other tables are built concurrently,
    each in its own Spark session (its idempotent-commit settings are session settings).

    Raises ``GoldQualityError`` after processing every table when a table under the ``fail``
    policy broke a rule; the result is on the exception (``.result``).
    """
    progress = latest_progress(spark, cfg)
    if progress is None:
        return GoldResult(cfg.source.name, None, None)
    run, frontier = progress
    ensure_gold_tables(spark, cfg)
    tables = read_tables(spark, cfg)
    since = {t.table_oid: t.snapshot_run for t in tables if t.snapshot_run is not None}
    errors = read_errors(spark, cfg, frontier, since)
    adjusted = read_adjustments(spark, cfg, run, since)
    reported = read_reported(spark, cfg)
    runs = (
        touched_by_runs(spark, cfg, min(r.silver_run for r in reported.values()), run)
        if reported
        else []
    )
    existing = _gold_tables(spark, cfg)

    def report_of(info: SourceTable) -> Reported | None:
        return reported.get((info.table_oid, plain_name(cfg, "gold", info.silver_table)))

    def quiet(info: SourceTable) -> bool:
        r = report_of(info)
        if r is None or r.silver_run > run or info.silver_table.lower() not in existing:
            return False
        if info.snapshot_run is not None and info.snapshot_run > r.silver_run:
            return False
        return not any(
            r.silver_run < n and (oids is None or info.table_oid in oids) for n, oids in runs
        )

    outcomes: list[TableOutcome | None] = [None] * len(tables)
    work = []
    for i, info in enumerate(tables):
        summary = errors_of(info, errors)
        if quiet(info):
            outcomes[i] = quiet_outcome(
                cfg,
                info,
                run,
                frontier,
                summary,
                adjusted.get(info.table_oid),
                report_of(info),
            )
        else:
            work.append((i, info, summary))
    sessions: Queue = Queue()
    for session in _sessions(spark, min(GOLD_WORKERS, len(work))):
        sessions.put(session)

    def one_table(item: tuple[int, SourceTable, ErrorSummary]) -> TableOutcome:
        _, info, summary = item
        session = sessions.get()
        try:
            return build_table(
                session,
                cfg,
                info,
                run,
                frontier,
                summary,
                adjusted=adjusted.get(info.table_oid),
                exists=info.silver_table.lower() in existing,
            )
        finally:
            sessions.put(session)

    built = concurrently(one_table, work, sessions.qsize())
    for (i, _, _), outcome in zip(work, built, strict=True):
        outcomes[i] = outcome
    done = [o for o in outcomes if o is not None]
    failpoint("gold.before_reports")
    same = (
        not work
        and all(
            (report_of(o.table).silver_run, report_of(o.table).frontier)
            == (o.silver_run, o.frontier)
            for o in done
        )
        and len(reported) == len(done)
    )
    if not same:  # a run that changed nothing, not even a frontier, writes no reports
        write_reports(spark, cfg, run, done)
    outcomes = done
    result = GoldResult(cfg.source.name, run, frontier, outcomes)
    failures = {o.table.name: o.failures for o in outcomes if o.policy == "fail" and o.failures}
    if failures:
        raise GoldQualityError(failures, result)
    return result
