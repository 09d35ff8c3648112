"""Upkeep after gold: what keeps a pipeline that runs all day as cheap in its hundredth hour
as in its first.

Every run appends a file or two to each silver table it touches, MERGEs into gold tables, and
appends a row to silver's and gold's own tables. A table with more than ``FILES`` data files
is compacted, one commit each:

- a silver diffs table: the diffs gold has applied, consolidated into their state
  (:func:`pgmedallion.silver.compact.compact_table`, bounded by gold's ``_frontier`` row; in
  the driver by delta-rs where the table is local and small enough: ``compact_local``);
- a gold table, and the layers' own tables (``_progress``, ``_plans``, ``_quality``, ...):
  Delta's ``OPTIMIZE`` (small files bin-packed; the rows do not change).

Bronze is not compacted here: capture commits to it meanwhile and its readers rely on its
batches' layout (control records in row groups of their own). Files that compaction replaces
stay on disk until ``VACUUM`` removes them (Delta's retention, 7 days by default).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from pgmedallion.core import deletion_vectors, delta_rs
from pgmedallion.core.config import Config
from pgmedallion.gold.history import read_reported
from pgmedallion.gold.history_table import expire, history_name
from pgmedallion.silver.catalog import load_tables
from pgmedallion.silver.compact import compact_local, compact_table

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

FILES = 16
"""A table with more data files than this is compacted. In a continuous run at 200 tps with
48, an application went from 9 s after a compaction to 19-22 s before the next (the previous
images of REPLICA IDENTITY DEFAULT changes read every earlier run's rows), and a compaction of
every table took about 20 s."""

OWN_EVERY = 8
"""A run adds at most one file to each of the layers' own tables, and counting a table's files
is a Spark job where Spark reads it (half a second each, nine tables): a pipeline run looks at
them every 8th silver run, so they are compacted by 24 files at most. A call for every table
(``tables`` None: the tests, a person) looks at them each time."""

OWN_TABLES = {
    "silver": (
        "_progress",
        "_plans",
        "_relations",
        "_errors",
        "_adjustments",
        "_tables",
        "_commits",
    ),
    "gold": ("_quality", "_frontier"),
}


def data_files(spark: SparkSession, qualified: str, path: str | None) -> int | None:
    """How many data files the table has (None: it does not exist)."""
    if delta_rs.usable(path):
        return len(delta_rs.open_table(path).file_uris())
    if not spark.catalog.tableExists(qualified):
        return None
    return int(spark.sql(f"DESCRIBE DETAIL {qualified}").first()["numFiles"])


def optimize(spark: SparkSession, qualified: str, path: str | None) -> None:
    """Delta's ``OPTIMIZE`` of a table (small files bin-packed, the rows unchanged): by
    delta-rs where the table is local, which needs no Spark job and no replay in the JVM of the
    commits delta-rs made (measured in a continuous pipeline: a third of its upkeep time). A
    column-mapped table, which delta-rs does not compact, is compacted by a commit of ours
    (``core.deletion_vectors.compact``: gold's tables, whose incremental runs add a file
    each)."""
    if delta_rs.usable(path) and (delta_rs.compact(path) or deletion_vectors.compact(path)):
        return
    spark.sql(f"OPTIMIZE {qualified}")


def touched(result) -> set[int]:
    """The OIDs of the tables a gold run (``GoldResult``) built or held: the ones whose silver
    and gold tables may have gained files (an unchanged table's did not)."""
    return {o.table.oid for o in result.tables if o.mode != "unchanged"}


def _history_upkeep(spark, cfg: Config, info, gold_dir, crowded, every: bool) -> list[str]:
    """A history table's upkeep: versions past the retention deleted, then its files compacted,
    when it has more than ``FILES`` of them (each gold run adds one), or on every call for
    every table (``every``)."""
    name = history_name(info)
    path = delta_rs.table_dir(gold_dir, name)
    if not (crowded("gold", name) or every):
        return []
    done = []
    expired = expire(spark, cfg, info, path)
    if expired:
        done.append(f"gold {name}: {expired} versions past the retention deleted")
    if data_files(spark, cfg.qualified("gold", name), path) is None:
        return done
    optimize(spark, cfg.qualified("gold", name), path)
    return [*done, f"gold {name}: files compacted"]


def maintain(
    spark: SparkSession,
    cfg: Config,
    files: int = FILES,
    tables: set[int] | None = None,
    limit: int | None = None,
    compacted: set[tuple[str, str]] | None = None,
    gold=None,
) -> list[str]:
    """Compact the source's tables that have more than ``files`` data files (``tables``: only
    these OIDs' silver and gold tables, with the layers' own); what was done. ``limit``: at
    most that many compactions in this call; ``compacted``: ``(layer, table)`` compacted by
    earlier calls of the same round, left alone, and added to as tables are compacted (a
    continuous pipeline spreads a round over its applications: a round ends when a call
    finds nothing left, however many tables stay crowded or grow meanwhile). ``gold``: the
    gold run (``GoldResult``) just made, whose tables and ``_frontier`` rows are then not
    read again (two reads through Spark, 2-3 s on the Spark engine)."""
    started = time.monotonic()
    done: list[str] = []
    dirs = {layer: delta_rs.schema_dir(spark, cfg.schema(layer)) for layer in ("silver", "gold")}
    compacted = set() if compacted is None else compacted

    def crowded(layer: str, name: str) -> bool:
        if (limit is not None and len(done) >= limit) or (layer, name) in compacted:
            return False
        compacted.add((layer, name))  # looked at once this round, whatever comes of it
        path = delta_rs.table_dir(dirs[layer], name)
        count = data_files(spark, cfg.qualified(layer, name), path)
        return count is not None and count > files

    if gold is not None:
        known = {o.table.oid: o.table for o in gold.tables}
        everything = gold.reported()
    else:
        known = load_tables(spark, cfg)
        everything = read_reported(spark, cfg)
    last_run = max((r.silver_run for r in everything.values()), default=0)
    for (oid, _), reported in sorted(everything.items()):
        info = known.get(oid)
        if info is None or (tables is not None and oid not in tables):
            continue
        name = info.silver_table
        if crowded("silver", name):
            path = delta_rs.table_dir(dirs["silver"], name)
            consolidated = compact_local(path, reported.silver_run, reported.frontier)
            if consolidated is None:
                consolidated = compact_table(
                    spark, cfg.qualified("silver", name), reported.silver_run, reported.frontier
                )
            if consolidated:
                done.append(f"silver {name}: applied diffs consolidated")
        if crowded("gold", name):
            optimize(spark, cfg.qualified("gold", name), delta_rs.table_dir(dirs["gold"], name))
            done.append(f"gold {name}: files compacted")
        if cfg.history(info.qualified_name):
            done += _history_upkeep(spark, cfg, info, dirs["gold"], crowded, every=tables is None)
    own_due = tables is None or (last_run + 1) % OWN_EVERY == 0
    for layer, names in OWN_TABLES.items() if own_due else ():
        for name in names:
            if crowded(layer, name):
                optimize(spark, cfg.qualified(layer, name), delta_rs.table_dir(dirs[layer], name))
                done.append(f"{layer} {name}: files compacted")
    if done:
        log.info("maintenance (%.1f s): %s", time.monotonic() - started, "; ".join(sorted(done)))
    return done
