"""What a gold run starts from: silver's runs and frontiers, and the state gold already holds.

Silver's side is read through its contract (``_progress``, ``_tables``, ``_errors``,
``_adjustments``); gold's side from each gold table's Delta history (the newest commit tagged
by ``gold.table_io.tagged_commit``) and from ``_frontier`` (what the last gold run reported).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from pgmedallion.core import delta_rs
from pgmedallion.core.config import Config
from pgmedallion.core.errors import holds_table
from pgmedallion.core.sparkapi import F
from pgmedallion.silver.catalog import load_tables
from pgmedallion.silver.contract import TableInfo

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

TAG = "pgmedallion_gold"  # the key of gold's JSON in its commits' ``userMetadata``
SAMPLE_ROWS = 5
HISTORY_FIRST = 20  # gold commits are looked for among this many newest commits first


@dataclass(frozen=True)
class Applied:
    """What a gold table holds, as its newest gold commit records it."""

    silver_run: int
    frontier: int
    silver_frontier: int
    quarantine_version: int | None
    version: int
    rows: int | None = None  # gold's own row accounting after the commit
    key: tuple[str, ...] | None = None  # the primary key it was built by (None: not recorded)

    @property
    def held(self) -> bool:
        return self.frontier < self.silver_frontier


@dataclass(frozen=True)
class ErrorSummary:
    count: int = 0
    first_lsn: int | None = None
    sample: str = "[]"


@dataclass(frozen=True)
class Reported:
    """A table's row of ``_frontier``: what the last gold run reported for it."""

    silver_run: int
    frontier: int
    rows: int | None


# --------------------------------------------------------------------------- silver


@dataclass(frozen=True)
class SilverProgress:
    """Silver's latest completed run and its frontier, from one read of ``_progress``: with
    the source's clock for the frontiers of its runs and the tables each run wrote for."""

    run: int
    frontier: int
    times: tuple[tuple[int, datetime | None], ...] = ()
    """``(frontier, source_time)`` of the runs that know it."""
    runs: tuple[tuple[int, frozenset[int] | None], ...] = ()
    """``(run, tables)`` of every run (tables None: a run made before ``_progress`` listed
    them, taken to touch every table)."""

    def as_of(self, frontier: int) -> datetime | None:
        """The source's clock for a state at ``frontier``: that of the newest run whose frontier
        is not past it (a held-back table's state is at least as new), None where unknown."""
        known = [(f, t) for f, t in self.times if f <= frontier]
        return max(known)[1] if known else None

    def touched(self, after: int) -> list[tuple[int, set[int] | None]]:
        """Silver's runs in (``after``, ``run``] with the tables each wrote something for."""
        return [
            (r, None if tables is None else set(tables))
            for r, tables in self.runs
            if after < r <= self.run
        ]


def latest_progress(spark: SparkSession, cfg: Config) -> SilverProgress | None:
    """Silver's latest completed run and its frontier for the source, or None."""
    schema = cfg.schema("silver")
    have = set(delta_rs.bookkeeping_columns(spark, schema, "_progress"))
    # silver adds the newer columns before its next run; gold may run first after an upgrade
    columns = ["run", "frontier"] + [c for c in ("source_time", "tables") if c in have]
    rows = delta_rs.bookkeeping_rows(
        spark, schema, "_progress", columns, {"source": cfg.source.name}
    )
    if not rows:
        return None
    last = max(rows, key=lambda r: r["run"])
    times = sorted(
        {(int(r["frontier"]), r["source_time"]) for r in rows if r.get("source_time") is not None}
    )
    runs = sorted(
        (int(r["run"]), None if r.get("tables") is None else frozenset(r["tables"])) for r in rows
    )
    return SilverProgress(int(last["run"]), int(last["frontier"]), tuple(times), tuple(runs))


def read_tables(spark: SparkSession, cfg: Config) -> list[TableInfo]:
    """The source's snapshotted tables, by schema and name (silver's ``_tables`` reader)."""
    tables = [t for t in load_tables(spark, cfg).values() if t.snapshot_lsn is not None]
    return sorted(tables, key=lambda t: (t.schema, t.name))


def read_errors(
    spark: SparkSession,
    cfg: Config,
    frontier: int,
    since: dict[int, int] | None = None,
    snapshots: dict[int, int] | None = None,
) -> dict[tuple, ErrorSummary]:
    """Definite errors below the frontier, per ``(table_oid, table_schema, table_name)``;
    ``since``: table OID -> the silver run that rebuilt it (its errors before are history);
    ``snapshots``: table OID -> its snapshot's LSN: errors below it are history too, even of
    that run (a source-wide error, a lost slot say, that silver reads in the run that also
    reads the table's new snapshot: the snapshot holds the table's rows from before it)."""
    floor = snapshots or {}
    local = _local_rows(
        spark, cfg, "_errors", ["table_oid", "table_schema", "table_name", *ERROR_SAMPLE]
    )
    if local is not None:
        rebuilt = since or {}
        kept = [
            r
            for r in local
            if r["lsn"] is not None
            and r["lsn"] < frontier
            and holds_table(
                r["run"], r["lsn"], rebuilt.get(r["table_oid"]), floor.get(r["table_oid"])
            )
        ]
        return {
            key: ErrorSummary(
                len(group), min(r["lsn"] for r in group), _sample(group, ERROR_SAMPLE)
            )
            for key, group in _grouped(kept, ("table_oid", "table_schema", "table_name")).items()
        }
    errors = spark.table(cfg.qualified("silver", "_errors")).filter(
        (F.col("source") == cfg.source.name) & (F.col("lsn") < frontier)
    )
    errors = _since(spark, errors, since)
    if floor:  # holds_table's LSN half, as a join (its run half is _since)
        snapped = spark.createDataFrame(list(floor.items()), "table_oid long, _from long")
        errors = errors.join(F.broadcast(snapped), "table_oid", "left")
        errors = errors.where(F.col("_from").isNull() | (F.col("lsn") >= F.col("_from")))
        errors = errors.drop("_from")
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
    spark: SparkSession, cfg: Config, silver_run: int, since: dict[int, int] | None = None
) -> dict[int, ErrorSummary]:
    """Values silver's runs up to ``silver_run`` adjusted by a declared policy (rounded
    numerics, clamped or nulled infinities), per table OID: counted in ``_quality`` as
    ``values_adjusted`` (always ``warn``: the user declared them)."""
    local = _local_rows(spark, cfg, "_adjustments", ["table_oid", "first_lsn", *ADJUSTED_SAMPLE])
    if local is not None:
        kept = _after_rebuild([r for r in local if r["run"] <= silver_run], since)
        return {
            oid: ErrorSummary(
                sum(r["count"] for r in group),
                min((r["first_lsn"] for r in group if r["first_lsn"] is not None), default=None),
                _sample(group, ADJUSTED_SAMPLE),
            )
            for (oid,), group in _grouped(kept, ("table_oid",)).items()
        }
    name = cfg.qualified("silver", "_adjustments")
    if not spark.catalog.tableExists(name):
        return {}
    sample = F.struct("column_name", "code", "count", "sample", "run")
    adjustments = spark.table(name).where(
        (F.col("source") == cfg.source.name) & (F.col("run") <= silver_run)
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


ERROR_SAMPLE = ("lsn", "code", "column_name", "message", "run")
ADJUSTED_SAMPLE = ("column_name", "code", "count", "sample", "run")
"""The fields of a summary's sample rows, in the order they sort by."""


def _local_rows(spark: SparkSession, cfg: Config, name: str, columns: list[str]) -> list | None:
    """The source's rows of silver's table ``name`` read by delta-rs where it is local (a
    Spark job costs a third of a second even when the table is empty); None: ask Spark."""
    path = delta_rs.table_dir(delta_rs.schema_dir(spark, cfg.schema("silver")), name)
    if not delta_rs.usable(path):
        return None
    source = cfg.source.name.replace("'", "''")
    sql = f"SELECT {delta_rs.sql_names(columns)} FROM t WHERE source = '{source}'"
    return delta_rs.query(path, sql).to_pylist()


def _after_rebuild(rows: list[dict], since: dict[int, int] | None) -> list[dict]:
    """``rows`` without those from before their table's rebuild (``since``: OID -> run)."""
    if not since:
        return rows
    return [
        r for r in rows if since.get(r["table_oid"]) is None or r["run"] >= since[r["table_oid"]]
    ]


def _grouped(rows: list[dict], key: tuple[str, ...]) -> dict[tuple, list[dict]]:
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault(tuple(r[k] for k in key), []).append(r)
    return groups


def _sample(rows: list[dict], fields: tuple[str, ...]) -> str:
    """The first ``SAMPLE_ROWS`` of ``rows`` in the order of ``fields`` (NULL first), as the
    JSON list Spark's ``to_json(slice(sort_array(collect_list(struct(...)))))`` writes: one
    object per row, its NULL fields left out."""
    ordered = sorted(rows, key=lambda r: tuple((r[f] is not None, r[f]) for f in fields))
    out = [{f: r[f] for f in fields if r[f] is not None} for r in ordered[:SAMPLE_ROWS]]
    return json.dumps(out, separators=(",", ":"), ensure_ascii=False)


def errors_of(table: TableInfo, errors: dict[tuple, ErrorSummary]) -> ErrorSummary:
    """The table's errors: matched by OID, or by name where silver knew no OID."""
    found = [
        e
        for (oid, schema, name), e in errors.items()
        if oid == table.oid or (oid is None and (schema, name) == (table.schema, table.name))
    ]
    if not found:
        return ErrorSummary()
    first = min(found, key=lambda e: e.first_lsn)
    return ErrorSummary(sum(e.count for e in found), first.first_lsn, first.sample)


# --------------------------------------------------------------------------- gold


def applied_state(spark: SparkSession, gold: str, path: str | None = None) -> Applied | None:
    """The newest gold commit of ``gold``, from its Delta history (None: nothing applied).

    The newest commits are looked at first (Delta reads one commit file per version of
    history), the whole history only when none of them is gold's. A table in a local
    directory (``path``) has its history read by delta-rs (milliseconds, not a Spark query).
    """
    if delta_rs.usable(path):
        return _applied_of(delta_rs.tagged_commit(path, TAG, HISTORY_FIRST))
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
    return _applied_of((int(rows[0]["version"]), rows[0]["userMetadata"]) if rows else None)


def _applied_of(commit: tuple[int, str] | None) -> Applied | None:
    """What a gold commit ``(version, userMetadata)`` records as applied."""
    if commit is None:
        return None
    meta = json.loads(commit[1])[TAG]
    return Applied(
        silver_run=int(meta["silver_run"]),
        frontier=int(meta["frontier"]),
        silver_frontier=int(meta["silver_frontier"]),
        quarantine_version=meta.get("quarantine_version"),
        version=commit[0],
        rows=meta.get("rows"),
        key=None if meta.get("key") is None else tuple(meta["key"]),
    )


def read_reported(spark: SparkSession, cfg: Config) -> dict[tuple[int, str], Reported]:
    """``_frontier``'s rows of the source by ``(table_oid, gold_table)``."""
    rows = delta_rs.bookkeeping_rows(
        spark,
        cfg.schema("gold"),
        "_frontier",
        ["table_oid", "gold_table", "silver_run", "frontier", "rows"],
        {"source": cfg.source.name},
    )
    return {
        (int(r["table_oid"]), r["gold_table"]): Reported(
            int(r["silver_run"]), int(r["frontier"]), r["rows"]
        )
        for r in rows
        if r["silver_run"] is not None and r["frontier"] is not None
    }
