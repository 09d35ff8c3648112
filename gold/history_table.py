"""A table's history (``<gold table>__history``), brought to gold's frontier in the gold run.

After a table's gold build, its history is brought to exactly what gold applied (the silver run
and frontier of gold's newest commit), in one commit of its own: the open versions of the keys
silver's new diffs touch are replaced by what :func:`pgmedallion.gold.versions.versions` makes
of them and the diffs. The commit carries ``{"pgmedallion_history": {silver_run, frontier}}``
and Delta's idempotent-write record (``pgmedallion-history-<source>-<table>`` at the silver
run), so a run repeated after a crash neither skips nor repeats it, and a history behind its
gold table (a crash between the two commits) catches up in the next run.

What a run reads of silver: the diffs of the runs after the one history applied (below gold's
frontier), and, when history must start over, all of them:

- no history yet: every diff, the snapshot's at its LSN (history starts at the snapshot);
- the table was snapshotted again (``resync``): the new snapshot is a whole state at
  ``X = max(its LSN, history's frontier)``; the rows it still holds go on, the others end at
  ``X``, and its new rows start there (the source's changes between the two are not known);
- a column added with a value for the rows already there (``ADD COLUMN ... DEFAULT``): the
  open versions are compared with silver's rows at history's frontier in the same way, so the
  current rows take the value from there; earlier versions hold NULL.

Columns follow the source: a renamed column is renamed (earlier versions keep their values
under the new name), an added one is NULL in earlier versions, and a dropped one stays, NULL
in the versions that start after the drop. A column whose type changed is not followed: the
run says so and leaves the history as it is (drop the history table to start it again).

Where: by delta-rs and deletion vectors in the driver for a local lakehouse (as gold's own
increments), through Spark elsewhere (``engine = "spark"``, Databricks, or more than
``[lakehouse] driver_rows`` rows to hold): the rule runs on the executors a bucket of keys at
a time (``core.by_key.cogrouped``) and one MERGE replaces the open versions.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pgmedallion.core import deletion_vectors, delta_rs, engine
from pgmedallion.core.by_key import cogrouped
from pgmedallion.core.config import Config
from pgmedallion.core.multiset import group_ids
from pgmedallion.core.naming import quote
from pgmedallion.core.session import real
from pgmedallion.core.spark import reshape_columns
from pgmedallion.core.sparkapi import F, T
from pgmedallion.gold.history import applied_state
from pgmedallion.gold.quality import row_rules
from pgmedallion.gold.table_io import create_table, table_exists
from pgmedallion.gold.versions import (
    END,
    END_AT,
    START,
    START_AT,
    TIME,
    VERSION_COLUMNS,
    Times,
    aligned,
    versions,
)
from pgmedallion.silver.contract import DIFF, LSN, METADATA, TableInfo
from pgmedallion.silver.contract import RUN as SILVER_RUN

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

TAG = "pgmedallion_history"
SUFFIX = "__history"
OP = "_op"


class CannotFollow(Exception):
    """A change of the source's columns history does not follow (a changed type)."""


@dataclass(frozen=True)
class HistoryApplied:
    silver_run: int
    frontier: int
    silver_frontier: int
    """Silver's frontier then: above ``frontier`` where gold held the table back."""


def history_name(info: TableInfo) -> str:
    """The history table's name in the gold schema."""
    return info.silver_table + SUFFIX


def version_fields() -> list[T.StructField]:
    return [
        T.StructField(START, T.LongType()),
        T.StructField(END, T.LongType()),
        T.StructField(START_AT, T.TimestampType()),
        T.StructField(END_AT, T.TimestampType()),
    ]


def keep_history(
    spark: SparkSession, cfg: Config, info: TableInfo, gold_dir: str | None, silver_dir: str | None
) -> str | None:
    """Table ``info``'s history brought to what its gold table applied; what was done
    (``built``, ``restarted``, ``incremental``, ``unchanged``), None where the table keeps no
    history or gold holds nothing yet."""
    if not cfg.history(info.qualified_name):
        return None
    h = _History(spark, cfg, info, gold_dir, silver_dir)
    try:
        return h.bring_up()
    except CannotFollow as reason:
        log.warning(
            "%s: history not updated: %s; history cannot follow a column's new type "
            "(drop %s to start it again)",
            info.qualified_name,
            reason,
            h.name,
        )
        return None


class _History:
    def __init__(
        self,
        spark: SparkSession,
        cfg: Config,
        info: TableInfo,
        gold_dir: str | None,
        silver_dir: str | None,
    ) -> None:
        self.spark, self.cfg, self.info = spark, cfg, info
        self.plain = history_name(info)
        self.name = cfg.qualified("gold", self.plain)
        self.gold = cfg.qualified("gold", info.silver_table)
        self.silver = cfg.qualified("silver", info.silver_table)
        self.path = delta_rs.table_dir(gold_dir, self.plain)
        self.gold_path = delta_rs.table_dir(gold_dir, info.silver_table)
        self.silver_path = delta_rs.table_dir(silver_dir, info.silver_table)
        self.commits_path = delta_rs.table_dir(silver_dir, "_commits")
        self.app_id = f"pgmedallion-history-{info.source}-{info.silver_table}"

    # ------------------------------------------------------------------ what there is

    def local(self) -> bool:
        return self.path is not None and not engine.spark_only()

    def exists(self) -> bool:
        if self.local():
            return delta_rs.usable(self.path)
        return table_exists(self.spark, self.name)

    def applied(self) -> HistoryApplied | None:
        if self.local():
            commit = delta_rs.tagged_commit(self.path, TAG, 20)
        else:
            rows = (
                self.spark.sql(f"DESCRIBE HISTORY {self.name}")
                .filter(F.col("userMetadata").contains(TAG))
                .orderBy(F.col("version").desc())
                .select("version", "userMetadata")
                .limit(1)
                .collect()
            )
            commit = (int(rows[0]["version"]), rows[0]["userMetadata"]) if rows else None
        if commit is None:
            return None
        meta = json.loads(commit[1])[TAG]
        frontier = int(meta["frontier"])
        return HistoryApplied(
            int(meta["silver_run"]), frontier, int(meta.get("silver_frontier", frontier))
        )

    def silver_fields(self) -> list[T.StructField]:
        if delta_rs.usable(self.silver_path):
            schema = delta_rs.spark_schema(self.silver_path)
        else:
            schema = self.spark.table(self.silver).schema
        return [f for f in schema.fields if f.name not in METADATA]

    def history_fields(self) -> list[T.StructField]:
        if delta_rs.usable(self.path):
            schema = delta_rs.spark_schema(self.path)
        else:
            schema = self.spark.table(self.name).schema
        return list(schema.fields)

    # ------------------------------------------------------------------ the run

    def bring_up(self) -> str | None:
        started = time.monotonic()
        gold_path = self.gold_path if delta_rs.usable(self.gold_path) else None
        target = applied_state(self.spark, self.gold, gold_path)
        if target is None:
            return None
        exists = self.exists()
        h = self.applied() if exists else None
        if h is not None and (h.silver_run, h.frontier) == (target.silver_run, target.frontier):
            return "unchanged"
        fields = self.silver_fields()
        if not exists:
            schema = T.StructType(
                [T.StructField(f.name, f.dataType, True) for f in fields] + version_fields()
            )
            local = (self.cfg.schema("gold"), self.plain) if self.path is not None else None
            create_table(self.spark, self.name, schema, local=local)
            self.path = self.path if self.path is not None and delta_rs.usable(self.path) else None
        added_with_values = self.follow_columns(fields) if exists else False
        snapshot = self.info.snapshot_lsn or 0
        if h is None:
            mode, floor, restart = "built", snapshot, None
        elif (self.info.snapshot_run or -1) > h.silver_run or added_with_values:
            x = max(snapshot, h.frontier)
            mode, floor, restart = "restarted", x, x
        else:
            mode, floor, restart = "incremental", snapshot, None
        where = f"{SILVER_RUN} <= {int(target.silver_run)} AND {LSN} < {int(target.frontier)}"
        if mode == "incremental" and h.frontier < h.silver_frontier:
            # rows held back below gold's frontier then are in runs already applied
            where += f" AND ({SILVER_RUN} > {int(h.silver_run)} OR {LSN} >= {int(h.frontier)})"
        elif mode == "incremental":  # silver's files are skipped by their runs' statistics
            where += f" AND {SILVER_RUN} > {int(h.silver_run)}"
        names = [f.name for f in fields]
        meta = {
            "silver_run": target.silver_run,
            "frontier": target.frontier,
            "silver_frontier": target.silver_frontier,
            "mode": mode,
        }
        done = False
        if self.local() and delta_rs.usable(self.silver_path):
            done = self.in_driver(names, where, floor, restart, meta)
        if not done:
            self.on_spark(fields, where, floor, restart, meta)
        log.info(
            "%s: history %s to silver run %d (%s, %.1f s)",
            self.info.qualified_name,
            mode,
            target.silver_run,
            "driver" if done else "Spark",
            time.monotonic() - started,
        )
        return mode

    def follow_columns(self, fields: list[T.StructField]) -> bool:
        """Renames and new columns of the source followed in the history table (dropped
        ones stay); whether a new column has a value for the rows already there."""
        have = {f.name: f.dataType for f in self.history_fields() if f.name not in VERSION_COLUMNS}
        renames = {}
        for entry in self.info.columns:
            for old in entry.get("renamed_from", []):
                if old in have and entry["name"] not in have:
                    renames[old] = entry["name"]
        after = {renames.get(n, n): t for n, t in have.items()}
        for f in fields:
            if f.name in after and after[f.name].simpleString() != f.dataType.simpleString():
                raise CannotFollow(
                    f"column {f.name} is {f.dataType.simpleString()} now, "
                    f"{after[f.name].simpleString()} in the history"
                )
        added = [f for f in fields if f.name not in after]
        if renames or added:
            done = None
            if delta_rs.usable(self.path):
                done = deletion_vectors.alter_columns(
                    self.path,
                    add=[(f.name, f.dataType.jsonValue()) for f in added],
                    renames=renames,
                    before=START,
                )
            if done is None:
                reshape_columns(
                    self.spark, self.name, renames, [], [(f.name, f.dataType) for f in added], START
                )
            log.info(
                "%s: history columns followed (renamed: %s; added: %s)",
                self.info.qualified_name,
                ", ".join(f"{a} -> {b}" for a, b in renames.items()) or "none",
                ", ".join(f.name for f in added) or "none",
            )
        values = {c["name"] for c in self.info.columns if c.get("missing") is not None}
        return any(f.name in values for f in added)

    def passing(self, rows: pa.Table) -> pa.Table:
        """The diffs whose rows gold would hold: under ``quarantine``, rows failing a row rule
        (a NULL key, a NULL in a NOT NULL column) are in the quarantine table, not gold."""
        policy = self.cfg.policy(self.info.qualified_name).on_error
        if policy != "quarantine" or rows.num_rows == 0:
            return rows
        ok = np.ones(rows.num_rows, bool)
        for rule in row_rules(self.info.primary_key, self.info.not_null, policy):
            check = rule.check
            if (
                check is not None
                and check.not_null
                and all(c in rows.column_names for c in check.not_null)
            ):
                ok &= check.passes(rows)
        return rows.filter(pa.array(ok))

    def key(self, names: list[str]) -> list[str]:
        pk = list(self.info.primary_key)
        return pk if pk and all(k in names for k in pk) else names

    def times(self, lsns: list[int]) -> Times:
        """The commits of ``_commits`` from the newest at or below the least of ``lsns`` to the
        greatest. The least is a commit's own LSN in an increment (a diff's), so the range is
        read alone; only a snapshot's or a restart's LSN, which is no commit, asks for the one
        before it (a read of every older file)."""
        if not lsns:
            return Times.of([], [])
        low, high = min(lsns), max(lsns)
        source = self.cfg.source.name.replace("'", "''")
        cond = f"source = '{source}'"
        if delta_rs.usable(self.commits_path):

            def read(where: str) -> tuple[list, list]:
                rows = delta_rs.query(
                    self.commits_path, f"SELECT lsn, commit_time FROM t WHERE {cond} AND {where}"
                )
                micros = rows.column("commit_time").cast(TIME).cast(pa.int64())
                return rows.column("lsn").to_pylist(), micros.to_pylist()

            found, micros = read(f"lsn >= {int(low)} AND lsn <= {int(high)}")
            if low not in found:
                (first,) = delta_rs.query(
                    self.commits_path,
                    f"SELECT max(lsn) AS m FROM t WHERE {cond} AND lsn < {int(low)}",
                ).to_pylist()
                if first["m"] is not None:
                    before, at = read(f"lsn = {int(first['m'])}")
                    found, micros = found + before, micros + at
            return Times.of(found, micros)
        commits = self.cfg.qualified("silver", "_commits")
        if not table_exists(self.spark, commits):
            return Times.of([], [])
        df = self.spark.table(commits).where(f"{cond}")
        us = F.unix_micros("commit_time").alias("us")
        got = df.where((F.col("lsn") >= low) & (F.col("lsn") <= high)).select("lsn", us).collect()
        if low not in {r["lsn"] for r in got}:
            first = df.where(F.col("lsn") < low).agg(F.max("lsn")).collect()[0][0]
            if first is not None:
                got += df.where(F.col("lsn") == first).select("lsn", us).collect()
        return Times.of([r["lsn"] for r in got], [r["us"] for r in got])

    # ------------------------------------------------------------------ in the driver

    def in_driver(
        self, names: list[str], where: str, floor: int, restart: int | None, meta: dict
    ) -> bool:
        """The run by delta-rs and a deletion-vector commit; False, having written nothing,
        where it does not fit (too many rows, a type it does not read or write)."""
        most = engine.current().driver_rows
        if delta_rs.count(self.silver_path, where) > most:
            return False
        diffs = self.passing(delta_rs.read_arrow(self.silver_path, [*names, LSN, DIFF], where))
        key = [k for k in self.key(names) if deletion_vectors.joinable(diffs.schema.field(k).type)]
        if not key:
            return False
        keys = diffs.select(key)
        all_names = [f.name for f in self.history_fields()]
        if restart is not None:
            open_keys = delta_rs.read_arrow(self.path, key, f"{delta_rs.sql_name(END)} IS NULL")
            keys = pa.concat_tables([keys, open_keys.cast(keys.schema)])
        metadata = {"userMetadata": json.dumps({TAG: meta})}
        version = int(meta["silver_run"])
        keyed = restart is None and key == list(self.info.primary_key)
        try:
            located, open_rows = None, None
            if keyed:  # the open versions' values from the diffs that close them
                short = [*key, START, START_AT, END, END_AT]
                short += [n for n in all_names if n not in names and n not in short]
                located = deletion_vectors.locate(self.path, keys, list(dict.fromkeys(short)), most)
                if located is not None:
                    open_rows = _closed_by(located.rows, diffs, key, all_names)
            if open_rows is None:
                located = deletion_vectors.locate(self.path, keys, all_names, most)
        except deletion_vectors.Unsupported as reason:
            # e.g. a column with fields of its own under column mapping: a small table's
            # history goes through delta-rs' MERGE, which rewrites the files it touches
            if delta_rs.count(self.path) > delta_rs.small_rows():
                log.info("%s: history through Spark (%s)", self.name, reason)
                return False
            return self.merged(diffs, keys, key, names, all_names, floor, restart, meta)
        if located is None:
            return False
        is_open = pc.is_null(located.rows.column(END)).to_numpy(zero_copy_only=False)
        if open_rows is None:
            open_rows = located.rows.filter(pa.array(is_open))
        times = self.times_of(diffs, floor, restart)
        out = versions(open_rows, diffs, names, times, floor=floor, restart_at=restart)
        try:
            return deletion_vectors.delete_and_append(
                located, is_open, out, app=self.app_id, version=version, metadata=metadata
            )
        except deletion_vectors.Unsupported as reason:
            log.info("%s: history through Spark (%s)", self.name, reason)
            return False

    def times_of(self, diffs: pa.Table, floor: int, restart: int | None) -> Times:
        """The commit times the rule asks for: those of the diffs' LSNs (a diff below
        ``floor`` counts at it) and of ``restart``."""
        lsns = pc.fill_null(diffs.column(LSN), 0).to_numpy(zero_copy_only=False).astype(np.int64)
        wanted = np.unique(np.maximum(lsns, floor)).tolist()
        return self.times(wanted + ([restart] if restart is not None else []))

    def merged(
        self,
        diffs: pa.Table,
        keys: pa.Table,
        key: list[str],
        names: list[str],
        all_names: list[str],
        floor: int,
        restart: int | None,
        meta: dict,
    ) -> bool:
        """:meth:`in_driver`'s commit as a delta-rs MERGE: the open versions of ``keys``
        deleted, the rule's rows inserted."""
        version = int(meta["silver_run"])
        table = delta_rs.open_table(self.path)
        if delta_rs.done(table, self.app_id, version):
            return True
        opened = delta_rs.read_arrow(self.path, all_names, f"{delta_rs.sql_name(END)} IS NULL")
        opened = opened.filter(pa.array(deletion_vectors.matching(opened, keys)))
        times = self.times_of(diffs, floor, restart)
        out = versions(opened, diffs, names, times, floor=floor, restart_at=restart)
        distinct = keys.group_by(keys.column_names).aggregate([])
        source = pa.concat_tables(
            [
                out.append_column(OP, pa.array(["insert"] * out.num_rows, pa.string())),
                _keyed_deletes(distinct, out.schema),
            ]
        )
        match = " AND ".join(
            f"(t.{delta_rs.sql_name(k)} IS NOT DISTINCT FROM s.{delta_rs.sql_name(k)})" for k in key
        )
        values = {delta_rs.sql_name(n): f"s.{delta_rs.sql_name(n)}" for n in all_names}
        end = delta_rs.sql_name(END)
        props = delta_rs.commit_properties(
            self.app_id, version, {"userMetadata": json.dumps({TAG: meta})}
        )
        (
            table.merge(
                source,
                predicate=f"(s.{OP} = 'delete') AND (t.{end} IS NULL) AND {match}",
                source_alias="s",
                target_alias="t",
                commit_properties=props,
            )
            .when_matched_delete()
            .when_not_matched_insert(updates=values, predicate=f"s.{OP} = 'insert'")
            .execute()
        )
        if not delta_rs.done(delta_rs.open_table(self.path), self.app_id, version):
            delta_rs.empty_commit(
                self.path, self.app_id, version, {"userMetadata": json.dumps({TAG: meta})}
            )
        return True

    # ------------------------------------------------------------------ on Spark

    def on_spark(
        self,
        fields: list[T.StructField],
        where: str,
        floor: int,
        restart: int | None,
        meta: dict,
    ) -> None:
        """The run on Spark's executors and one MERGE that replaces the open versions."""
        from delta.tables import DeltaTable

        spark = real(self.spark)
        try:  # a session of its own: the idempotent-commit settings below are a session's
            spark = spark.newSession()
        except Exception:  # Spark Connect has no newSession
            pass
        names = [f.name for f in fields]
        key = self.key(names)
        target = spark.table(self.name)
        schema = target.schema
        silver = spark.table(self.silver).where(where)
        policy = self.cfg.policy(self.info.qualified_name).on_error
        if policy == "quarantine":
            for rule in row_rules(self.info.primary_key, self.info.not_null, policy):
                if rule.check is not None and rule.check.not_null:
                    silver = silver.where(rule.check.sql())
        diffs = silver.select(*[F.col(quote(n)) for n in names], LSN, DIFF)
        open_rows = target.where(F.col(END).isNull())
        touched = diffs.select(*[F.col(quote(k)) for k in key]).distinct()
        if restart is None:
            open_rows = _semi(open_rows, touched, key)
        else:
            touched = touched.unionByName(
                open_rows.select(*[F.col(quote(k)) for k in key])
            ).distinct()
        bounds = diffs.agg(F.min(LSN), F.max(LSN)).collect()[0]
        wanted = [max(int(b), floor) for b in bounds if b is not None]
        wanted += [restart] if restart is not None else []
        rule = partial(
            _bucket,
            columns=names,
            history=schema.names,
            times=self.times(wanted),
            floor=floor,
            restart=restart,
        )
        out = cogrouped(open_rows, diffs, key, rule, schema)
        ops = out.withColumn(OP, F.lit("insert")).unionByName(
            touched.withColumn(OP, F.lit("delete")), allowMissingColumns=True
        )
        cond = (F.col(f"s.{OP}") == "delete") & F.col(f"t.{quote(END)}").isNull()
        for k in key:
            cond = cond & F.col(f"t.{quote(k)}").eqNullSafe(F.col(f"s.{quote(k)}"))
        values = {quote(n): F.col(f"s.{quote(n)}") for n in schema.names}
        settings = {
            "spark.databricks.delta.commitInfo.userMetadata": json.dumps({TAG: meta}),
            "spark.databricks.delta.write.txnAppId": self.app_id,
            "spark.databricks.delta.write.txnVersion": str(int(meta["silver_run"])),
        }
        for k, v in settings.items():
            spark.conf.set(k, v)
        try:
            (
                DeltaTable.forName(spark, self.name)
                .alias("t")
                .merge(ops.alias("s"), cond)
                .whenMatchedDelete()
                .whenNotMatchedInsert(condition=F.col(f"s.{OP}") == "insert", values=values)
                .execute()
            )
        finally:
            for k in settings:
                spark.conf.unset(k)


def expire(spark: SparkSession, cfg: Config, info: TableInfo, path: str | None) -> int | None:
    """The versions of ``info``'s history that ended more than ``[lakehouse]
    history_retention_days`` ago (by ``__end_at``) deleted; how many (None: not counted, or
    nothing to do). Current versions are never deleted, so reads as of any LSN within the
    retention stay exact."""
    days = cfg.lakehouse.history_retention_days
    if days <= 0:
        return None
    cutoff = datetime.now(UTC) - timedelta(days=days)
    name = cfg.qualified("gold", history_name(info))
    if delta_rs.usable(path):
        app = f"pgmedallion-history-retention-{info.source}-{info.silver_table}"
        try:
            count = deletion_vectors.delete_below(
                path,
                END_AT,
                pa.scalar(cutoff, TIME),
                app=app,
                version=int(cutoff.timestamp()),
                metadata={},
            )
        except deletion_vectors.Unsupported as reason:
            log.info("%s: retention through Spark (%s)", name, reason)
        else:
            if count is not None:
                return count
    if not table_exists(spark, name):
        return None
    micros = int(cutoff.timestamp() * 1_000_000)  # Delta's DELETE takes no parameter markers
    spark.sql(f"DELETE FROM {name} WHERE {END_AT} < timestamp_micros({micros})")
    return None


def _bucket(
    open_rows: pa.Table,
    diffs: pa.Table,
    *,
    columns: list[str],
    history: list[str],
    times: Times,
    floor: int,
    restart: int | None,
) -> pa.Table:
    """:func:`versions` over one bucket of keys on an executor."""
    return versions(
        open_rows.select(history), diffs, columns, times, floor=floor, restart_at=restart
    )


def _closed_by(
    located: pa.Table, diffs: pa.Table, key: list[str], all_names: list[str]
) -> pa.Table | None:
    """The open versions among ``located`` (their key, ``__start_lsn``, ``__start_at`` and
    the columns the source dropped) with the values of the row each holds, taken from the diff
    that ends it: in a table with a primary key each key has at most one open version, and
    the first retraction of its key in the increment retracts that version's row (silver's
    retractions hold the whole old row, REPLICA IDENTITY DEFAULT included). So a keyed
    table's history reads three small columns of its files, not its rows. None where that
    does not hold (a key with two open versions, an open version nothing retracts): the caller
    reads the rows."""
    is_open = pc.is_null(located.column(END))
    opened = located.filter(is_open)
    n = opened.num_rows
    retract = diffs.filter(pc.less(diffs.column(DIFF), 0))
    retract = retract.take(pc.sort_indices(retract, [(LSN, "ascending")]))
    both = pa.concat_tables(
        [opened.select(key), retract.select(key).cast(opened.select(key).schema)]
    )
    ids = group_ids([both.column(k) for k in key], both.num_rows)
    mine, theirs = ids[:n], ids[n:]
    if len(np.unique(mine)) != n:
        return None
    first_of, at = np.unique(theirs, return_index=True)  # the first retraction of each key
    where = np.searchsorted(first_of, mine)
    found = (where < len(first_of)) & (first_of[np.clip(where, 0, len(first_of) - 1)] == mine)
    if not found.all():
        return None
    rows = retract.take(pa.array(at[where], pa.int64()))
    columns = []
    for name in all_names:
        if name in rows.column_names and name not in (LSN, DIFF):
            columns.append(rows.column(name))
        else:
            columns.append(opened.column(name))
    return pa.table(columns, names=all_names)


def _keyed_deletes(keys: pa.Table, schema: pa.Schema) -> pa.Table:
    """A MERGE source row per key (``_op = 'delete'``; NULL in the other columns)."""
    rows = aligned(keys, schema)
    return rows.append_column(OP, pa.array(["delete"] * keys.num_rows, pa.string()))


def _semi(rows: DataFrame, keys: DataFrame, key: list[str]) -> DataFrame:
    """``rows`` whose key is one of ``keys``' (NULL equal to NULL)."""
    k = keys.select(*[F.col(quote(n)).alias(f"_k{i}") for i, n in enumerate(key)])
    cond = None
    for i, n in enumerate(key):
        term = F.col(quote(n)).eqNullSafe(F.col(f"_k{i}"))
        cond = term if cond is None else cond & term
    return rows.join(k, cond, "left_semi")
