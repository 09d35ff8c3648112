"""One gold table brought to a silver run's frontier: plan, new state, checks, commits.

``build_table`` resolves the table once (``Table``), reads what gold already applied from its
history, plans ``full``, ``incremental`` or ``unchanged`` (``plan``), computes the new state
(all of silver for a full build; the touched keys' old state plus silver's new diffs for an
increment: ``incremental_diffs``), checks the rules, and writes the quarantine, then gold in
one tagged, idempotent commit (see ``gold/build.py`` for exactly-once).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from pgmedallion.core import delta_rs, sparkapi
from pgmedallion.core.config import Config
from pgmedallion.core.failpoints import failpoint
from pgmedallion.core.spark import drop_table, reshape_columns
from pgmedallion.core.sparkapi import F
from pgmedallion.gold.history import Applied, ErrorSummary, Reported, applied_state
from pgmedallion.gold.on_spark import (
    affected_keys,
    c,
    gold_rows,
    merge_operations,
    null_safe_join,
    old_state,
    settled,
    split,
)
from pgmedallion.gold.plan import Table, TableOutcome, plan
from pgmedallion.gold.pruning import clustered, comparable, key_ranges, key_ranges_of, small
from pgmedallion.gold.quality import NO_DEFINITE_ERRORS, VALUES_ADJUSTED, QualityRecord, row_rules
from pgmedallion.gold.quarantine import write_quarantine
from pgmedallion.gold.reports import count_rules, summary_record
from pgmedallion.gold.state import DIFF, LSN, MULT
from pgmedallion.gold.table_io import (
    create_table,
    gold_schema,
    merge_gold,
    merge_gold_delta_rs,
    plain_name,
    same_columns,
    table_exists,
    tagged_commit,
)
from pgmedallion.silver.contract import TableInfo

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)


def build_table(
    spark: SparkSession,
    cfg: Config,
    info: TableInfo,
    silver_run: int,
    frontier: int,
    errors: ErrorSummary,
    *,
    applied_override: Applied | None | str = "discover",
    adjusted: ErrorSummary | None = None,
    exists: bool | None = None,
    path: str | None = None,
    silver_path: str | None = None,
) -> TableOutcome:
    """Bring one gold table to ``silver_run`` at ``frontier`` (or hold it; see module doc).

    ``applied_override`` replaces what the gold history says was applied (tests use it to act
    as a run whose bookkeeping was lost); Delta's idempotent writes must then skip the commit.
    ``path``: the gold table's local directory, where its history is read and a MERGE made
    through delta-rs (see :func:`gold.table_io.merge_gold_delta_rs`); with ``silver_path``
    too, the increment of a table of at most ``[lakehouse] small_table_rows`` rows reads
    silver's new rows and gold's rows through delta-rs into Spark's memory (milliseconds)
    instead of scanning the Delta tables with Spark (a snapshot and a job per scan, 0.3-0.5 s
    each).
    """
    t = Table(
        spark,
        cfg,
        info,
        silver_run,
        frontier,
        errors,
        adjusted or ErrorSummary(),
        path=path,
        silver_path=silver_path,
    )
    errors_record = summary_record(info.qualified_name, NO_DEFINITE_ERRORS, t.policy, errors)
    ensure_gold(t, exists)
    discover = applied_override == "discover"
    applied = applied_state(spark, t.gold, path) if discover else applied_override
    mode = build_mode(t, applied)
    t.local = (
        mode == "incremental"
        and delta_rs.usable(path)
        and delta_rs.usable(silver_path)
        and applied.rows is not None
        and applied.rows <= delta_rs.small_rows()
    )
    if mode == "unchanged":
        untouched = [QualityRecord(info.qualified_name, r.name, t.policy, 0, 0) for r in t.rules]
        return outcome(t, applied, mode, [errors_record, *untouched])
    if mode == "full":
        diffs = t.updates(None)
        t.ranges = key_ranges_of(t, diffs)
        affected, quarantine_old, old_rows = None, 0, 0
    else:
        diffs, affected, quarantine_old, old_rows = incremental_diffs(t, applied)
    states = settled(diffs, t.names, info.primary_key, t.key, t.rules, t.policy, t.ranges)
    states = (
        states.localCheckpoint()
        if affected is not None
        else states.persist(sparkapi.StorageLevel.MEMORY_AND_DISK)
    )
    try:
        name = info.qualified_name
        checked, counts = split(states, [r.name for r in t.rules])
        counted, quarantined, rows_to_gold = count_rules(counts, checked, t.rules, name, t.policy)
        records = [errors_record] + counted
        if t.policy == "fail" and any(r.failed for r in records):
            return outcome(t, applied, "held", records)
        idempotent = applied is None or silver_run > applied.silver_run
        version = silver_run if idempotent else None
        q_version = write_quarantine(
            t, checked, affected, applied, quarantined, quarantine_old, version
        )
        rows = rows_to_gold + (applied.rows - old_rows if affected is not None else 0)
        old = applied.rows if affected is not None else None
        _write_gold(t, checked, affected, mode, q_version, rows, rows_to_gold, version, old)
    finally:
        states.unpersist()
    now = Applied(  # what the commit just made (or, skipped as done, had made) records
        silver_run=silver_run,
        frontier=t.frontier,
        silver_frontier=frontier,
        quarantine_version=q_version,
        version=-1,
        rows=rows,
        key=tuple(t.info.primary_key),
    )
    return outcome(t, now, mode, records)


def build_mode(t: Table, applied: Applied | None) -> str:
    """``plan``'s mode, made ``full`` where an increment cannot be built: silver rebuilt the
    table from a new snapshot since gold's last run, the source's primary key is not the one
    gold was built by, its key cannot be compared (a map), or gold's commit has no row
    accounting."""
    mode = plan(applied, t.silver_run, t.frontier)
    if mode != "incremental":
        return mode
    if (t.info.snapshot_run or -1) > applied.silver_run:
        return "full"
    if applied.key is not None and list(applied.key) != list(t.info.primary_key):
        return "full"  # the source's primary key changed (followed: capture.schema_changes)
    if not comparable(t.columns, t.key) or applied.rows is None:
        return "full"
    return mode


def ensure_gold(t: Table, exists: bool | None) -> None:
    """The gold table with the silver table's columns: created, or recreated (and its
    quarantine dropped) when the columns changed."""
    schema = gold_schema(t.columns)
    if exists is None:
        exists = table_exists(t.spark, t.gold)
    if exists and not same_columns(t.spark, t.gold, schema):
        _follow_in_place(t)
    if exists and not same_columns(t.spark, t.gold, schema):
        gold = t.cfg.schema("gold")
        drop_table(t.spark, gold, t.info.silver_table, t.gold)
        drop_table(t.spark, gold, t.info.silver_table + "__quarantine", t.quarantine)
        exists = False
    if not exists:
        create_table(t.spark, t.gold, schema, local=(t.cfg.schema("gold"), t.info.silver_table))


def followed_in_place(
    info: TableInfo, have: Sequence[str]
) -> tuple[dict[str, str], list[str], list[str]] | None:
    """How gold's columns ``have`` (without ``_lsn``) become the table's without a rebuild:
    ``(renames, drops, added)``: the columns silver renamed and dropped after the source (an
    entry's ``renamed_from``; a column silver no longer has), and those the source added with
    no value for the rows already there (NULL in every row gold holds). Delta's column mapping
    does all three without rewriting a file, so gold goes on incrementally. None when there is
    nothing to follow, or a column was added with a value (its rows need it: a full build)."""
    names = [c["name"] for c in info.columns]
    renames = {}
    for entry in info.columns:
        for old in entry.get("renamed_from", []):
            if old in have and entry["name"] not in have:
                renames[old] = entry["name"]
    after = [renames.get(n, n) for n in have]
    drops = [n for n in after if n not in names]
    added = [c for c in info.columns if c["name"] not in after]
    if any(c.get("missing") is not None for c in added) or not (renames or drops or added):
        return None
    return renames, drops, [c["name"] for c in added]


def _follow_in_place(t: Table) -> None:
    """:func:`followed_in_place` done in the gold table through Spark (the new columns before
    ``_lsn``) where it has no quarantine; a table still unlike silver's is rebuilt after."""
    if table_exists(t.spark, t.quarantine):
        # an increment reads the quarantine as of gold's last run, in that version's columns:
        # a table with rows held is rebuilt (its quarantine dropped) instead
        return
    have = [f.name for f in t.spark.table(t.gold).schema.fields if f.name != LSN]
    followed = followed_in_place(t.info, have)
    if followed is None:
        return
    renames, drops, added = followed
    types = {f.name: f.dataType for f in t.spark_columns}
    if any(n not in types or "timestamp_ntz" in types[n].simpleString() for n in added):
        return  # Spark adds a timestamp_ntz column only to a table with that feature: rebuilt
    reshape_columns(t.spark, t.gold, renames, drops, [(n, types[n]) for n in added], LSN)
    log.info(
        "gold: %s: columns followed in place (renamed: %s; dropped: %s; added: %s)",
        t.info.qualified_name,
        ", ".join(f"{a} -> {b}" for a, b in renames.items()) or "none",
        ", ".join(drops) or "none",
        ", ".join(added) or "none",
    )


def _write_gold(
    t: Table,
    checked: DataFrame,
    affected: DataFrame | None,
    mode: str,
    q_version: int | None,
    rows: int,
    rows_to_gold: int,
    version: int | None,
    rows_before: int | None = None,
) -> None:
    """The gold commit: an overwrite (full build) or one MERGE, tagged with what it applies
    (a small local table's MERGE through delta-rs)."""
    meta = t.commit_meta(mode, rows, q_version)
    if affected is not None:
        ops = merge_operations(checked, affected, t.key, t.names)
        if merge_gold_delta_rs(t, ops, meta, version, rows_before):
            failpoint("gold.after_table")
            return
    with tagged_commit(t.spark, meta, t.app_id, version):
        if affected is None:
            new = gold_rows(checked, t.names)  # clustered already where t.ranges
            new = new if t.ranges is not None else clustered(new, t, rows_to_gold)
            new.writeTo(t.gold).overwrite(F.lit(True))
        else:
            merge_gold(t, merge_operations(checked, affected, t.key, t.names))
    failpoint("gold.after_table")


def outcome(t: Table, applied: Applied | None, mode: str, records: list) -> TableOutcome:
    records = [*records, summary_record(t.info.qualified_name, VALUES_ADJUSTED, "warn", t.adjusted)]
    return TableOutcome(
        table=t.info,
        gold_table=plain_name(t.cfg, "gold", t.info.silver_table),
        policy=t.policy,
        mode=mode,
        frontier=applied.frontier if applied else 0,
        silver_run=applied.silver_run if applied else 0,
        rows=_rows(t.spark, t.gold, applied),
        quality=records,
    )


def _rows(spark: SparkSession, gold: str, applied: Applied | None) -> int:
    """Gold's row count as its commits account for it (no scan); counted only without one."""
    if applied is not None and applied.rows is not None:
        return int(applied.rows)
    return spark.table(gold).count()


def incremental_diffs(t: Table, applied: Applied) -> tuple[DataFrame, DataFrame, int, int]:
    """The touched keys' diffs (silver's new ones, gold's rows and the quarantined ones of
    those keys, as diffs), the touched keys with gold's row count for each, how many
    quarantined rows they had, and how many gold rows."""
    spark = t.spark
    updates = t.updates(applied.silver_run)
    if t.local:  # in memory already: no checkpoints, no file pruning
        keys = updates.select(*[c(k) for k in t.key]).distinct()
        gold = delta_rs.read(spark, t.path, delta_rs.spark_types(gold_schema(t.columns)))
    else:
        # Checkpointed: the touched keys are read several times below, silver once.
        keys = updates.select(*[c(k) for k in t.key]).distinct().localCheckpoint()
        t.range_pred, t.range_pred_target, t.touched = key_ranges(t, keys)
        gold = spark.table(t.gold).filter(t.range_pred)
    old_gold = old_state(gold, small(t, keys), t.key, t.names).localCheckpoint()
    old_rows = old_gold.count()
    affected = affected_keys(keys, old_gold, t.key)
    parts = [updates, old_gold]
    quarantine_old = 0
    if applied.quarantine_version is not None:
        version = int(applied.quarantine_version)
        old_q = spark.sql(f"SELECT * FROM {t.quarantine} VERSION AS OF {version}")
        if t.range_pred is not None:
            old_q = old_q.filter(t.range_pred)
        old_q = null_safe_join(old_q, small(t, keys), t.key, "left_semi")
        old_q = old_q.select(*[c(n) for n in t.names], LSN, F.col(MULT).alias(DIFF))
        old_q = old_q.localCheckpoint()
        quarantine_old = old_q.count()
        parts.append(old_q)
    union = parts[0]
    for p in parts[1:]:
        union = union.unionByName(p)
    return union, affected, quarantine_old, old_rows


def untouched_outcome(
    cfg: Config,
    info: TableInfo,
    silver_run: int,
    frontier: int,
    errors: ErrorSummary,
    adjusted: ErrorSummary | None,
    reported: Reported,
) -> TableOutcome:
    """The outcome of a table no silver run since its last gold run wrote anything for: its
    gold table holds its state at the new frontier as it is, so nothing is read or written
    (``_frontier`` records the new frontier)."""
    policy = cfg.policy(info.qualified_name).on_error
    held = policy == "quarantine" and errors.count
    records = [
        summary_record(info.qualified_name, NO_DEFINITE_ERRORS, policy, errors),
        *[
            QualityRecord(info.qualified_name, r.name, policy, 0, 0)
            for r in row_rules(info.primary_key, info.not_null, policy)
        ],
        summary_record(info.qualified_name, VALUES_ADJUSTED, "warn", adjusted or ErrorSummary()),
    ]
    return TableOutcome(
        table=info,
        gold_table=plain_name(cfg, "gold", info.silver_table),
        policy=policy,
        mode="unchanged",
        frontier=min(frontier, errors.first_lsn) if held else frontier,
        silver_run=silver_run,
        rows=int(reported.rows or 0),
        quality=records,
    )
