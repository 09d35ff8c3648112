"""Many small gold tables of one run in a few Spark jobs: the batched increment.

A run that touches many small tables spent about 0.9 s per table in gold, almost all of it in
Spark jobs of a few rows each (the touched keys' old rows, the checked state, the rule counts,
the MERGE source). A small table's increment touches a handful of rows, so here ``gold.state``'s
rules run in the driver on the table's rows as delta-rs reads them, and Spark does only what
must be Spark's, the rule conditions (Spark SQL), in one job per
:data:`pgmedallion.core.packed.PARTS_PER_JOB` tables:

    read      delta-rs: the gold commit's record (history), silver's new diffs, gold's rows
    state     ``old_state``, ``affected_keys`` and ``state_of`` (consolidation, key rows)
    rules     one packed Spark job: each row's failed rules (``failed_rules``) and, for a
              failing row, its JSON sample, as ``count_rules`` writes it
    judge     ``judge`` and ``tallies``
    merge     ``merge_operations`` (or ``gold_rows`` for a full build) and delta-rs' MERGE
              or one by deletion vectors, with gold's tag and idempotency record

The rules are the functions a large table's build applies bucket by bucket in Spark
(``gold.on_spark``): one definition, two places to run it.

What qualifies: an incremental build of a table whose gold and silver tables are local, with
gold's columns as silver's, no quarantine table, and no map column, when the table has at most
``[lakehouse] small_table_rows`` rows, or when its run brings at most that many diffs and its
key can find them. Then only the gold rows those diffs can touch are read:

- a primary key of integer, text, date, timestamp, decimal or boolean columns finds them
  file by file (``core.deletion_vectors.locate``: each file's key columns joined to the
  touched keys), and the MERGE deletes them by deletion vector and appends the new rows
  (``merge_by_vectors``) instead of rewriting every file that holds one;
- otherwise the key's integer columns narrow delta-rs' read by value lists or ranges
  (``old_state`` still picks the touched keys' rows exactly), and delta-rs' MERGE rewrites
  the files holding them.

A large table's run with more diffs goes the per-table path. A full build qualifies when
silver's table has at most ``[lakehouse] driver_rows`` rows (a first build of a large table is
faster here than in Spark's buckets: 1M rows). A table whose new state sends a row to
quarantine goes back to the per-table path (which writes the quarantine) before anything is
written, and so does one whose MERGE delta-rs refuses.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from pgmedallion.core import deletion_vectors, delta_rs, engine, packed
from pgmedallion.core.failpoints import failpoint
from pgmedallion.core.naming import quote
from pgmedallion.core.parallel import concurrently
from pgmedallion.core.sparkapi import F, T
from pgmedallion.gold import state as rules_of
from pgmedallion.gold.history import SAMPLE_ROWS, TAG, Applied, applied_state
from pgmedallion.gold.on_spark import failed_rules
from pgmedallion.gold.plan import Table, TableOutcome
from pgmedallion.gold.pruning import has_map
from pgmedallion.gold.quality import NO_DEFINITE_ERRORS, QualityRecord, Rule
from pgmedallion.gold.reports import summary_record
from pgmedallion.gold.state import DIFF, KEY_ROWS, LSN, MULT, OP, RULES
from pgmedallion.gold.table import build_mode, ensure_gold, followed_in_place, outcome
from pgmedallion.gold.table_io import gold_schema, merge_arrow, merge_by_vectors
from pgmedallion.silver.write import missing_values

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

ROW, SAMPLE = "_pgm_row", "_pgm_sample"
_SHARED = (MULT, LSN, KEY_ROWS, ROW)


@dataclass
class _Item:
    t: Table
    applied: Applied | None
    mode: str = "incremental"
    """``incremental`` or ``full`` (a small table built from all of silver's rows)."""
    exists: bool = True
    state: pa.Table | None = None
    """The touched keys' new state (``gold.state.state_of``), in gold's column types."""
    affected: pa.Table | None = None
    """Every touched key with gold's rows of it before (``gold.state.affected_keys``)."""
    old_rows: int = 0
    arrow: pa.Schema | None = None
    """Gold's columns and ``_lsn`` as Arrow."""
    located: deletion_vectors.Located | None = None
    """A large table's gold rows of the touched keys, where they are (its MERGE then deletes
    them by deletion vector)."""
    pieces: tuple[list[str], int] | None = None
    """A full build made in pieces (:func:`_build_in_pieces`): each piece's predicate over
    silver, and silver's rows."""


def _shapes(schema: pa.Schema) -> list[tuple]:
    """The columns' names and types (field metadata left out by ``delta_rs.arrow_schema``), for
    comparing a table's columns with the ones it should have."""
    return [(f.name, f.type) for f in schema]


def _followed(t: Table, have: pa.Schema, want: pa.Schema) -> bool:
    """Whether gold's table (``have``) now has silver's columns (``want``), followed in place
    (``gold.table.followed_in_place``: renamed, dropped, added with NULL before ``_lsn``) by a
    metadata commit (``core.deletion_vectors.alter_columns``), where the per-table path would
    do the same through Spark or rebuild the table."""
    followed = followed_in_place(t.info, [n for n in have.names if n != LSN])
    if followed is None:
        return _restated(t, have, want)
    renames, drops, added = followed
    types = {f.name: f.type for f in want}
    if any(name not in types for name in added):
        return False
    add = [(name, delta_rs.delta_type(types[name])) for name in added]
    done = deletion_vectors.alter_columns(t.path, add, renames, drops, before=LSN)
    if done is None:
        return False
    log.info(
        "gold: %s: columns followed in place (renamed: %s; dropped: %s; added: %s)",
        t.info.qualified_name,
        ", ".join(f"{a} -> {renames[a]}" for a in done.renamed) or "none",
        ", ".join(done.dropped) or "none",
        ", ".join(done.added) or "none",
    )
    return _shapes(delta_rs.arrow_schema(t.path)) == _shapes(want)


def _restated(t: Table, have: pa.Schema, want: pa.Schema) -> bool:
    """Whether gold's table (``have``) lacked only columns the source added with a value for
    the rows already there (silver restated its rows, ``silver.write.restate_added``) and now
    has them, every row of gold (all from before them) holding that value, in one commit of
    ours (``core.deletion_vectors.restate``), where the per-table path would rebuild the table
    through Spark. Only a table the driver holds."""
    names = set(have.names)
    entries = [c for c in t.info.columns if c["name"] not in names]
    if not entries or _shapes(have) != [s for s in _shapes(want) if s[0] in names]:
        return False
    if any(c.get("missing") is None for c in entries):
        return False
    if not delta_rs.small(t.path, None, engine.current().driver_rows):
        return False
    values = missing_values(entries)
    if values is None or not deletion_vectors.restate(t.path, values, before=LSN):
        return False
    log.info(
        "gold: %s: column(s) %s added with the value of the rows already there",
        t.info.qualified_name,
        ", ".join(c["name"] for c in entries),
    )
    return _shapes(delta_rs.arrow_schema(t.path)) == _shapes(want)


def qualifies(t: Table, exists: bool) -> _Item | None:
    """The table's batch item if its build takes this path (delta-rs reads only)."""
    if not (t.path and delta_rs.usable(t.silver_path)):
        return None
    if any(has_map(f.type) for f in t.columns):
        return None
    applied = None
    quarantine = str(Path(t.path).parent / (t.info.silver_table + "__quarantine").lower())
    if exists:
        if not delta_rs.usable(t.path):
            return None
        have = delta_rs.arrow_schema(t.path)
        want = gold_schema(t.columns)
        differs = _shapes(have) != _shapes(want)
        if differs and delta_rs.usable(quarantine):
            return None  # the per-table path recreates both
        applied = applied_state(t.spark, t.gold, t.path)
        if applied is not None and (applied.quarantine_version is not None or applied.rows is None):
            return None
        if differs and (build_mode(t, applied) != "incremental" or not _followed(t, have, want)):
            return None  # the per-table path recreates it
    if applied is not None and t.silver_run <= applied.silver_run:
        return None  # no idempotency record to commit under
    mode = build_mode(t, applied)
    if mode == "incremental" and (
        applied.rows <= delta_rs.small_rows() or _narrowing_columns(t) or _locatable(t)
    ):
        return _Item(t, applied, mode, exists)
    most = engine.current().driver_rows
    if mode == "full" and not delta_rs.usable(quarantine):
        if delta_rs.small(t.silver_path, None, most):
            return _Item(t, applied, mode, exists)
        pieces = _pieces_of(t, max(most // 4, 1))
        if pieces is not None:
            return _Item(t, applied, mode, exists, pieces=pieces)
    return None


def _pieces_of(t: Table, most: int) -> tuple[list[str], int] | None:
    """How a full build of a large table goes in pieces of about ``most`` of silver's rows
    whose state each piece holds whole: ranges of the first key column's values (an integer:
    every diff of a key falls in one range), when silver's diffs of the build are all
    insertions (a first snapshot's), so that gold gets exactly silver's rows once the rules
    pass. The ranges' predicates and silver's rows; None: the table is built whole."""
    if not (t.keyed and _narrowing_columns(t)[:1] == t.key[:1]):
        return None
    where = t.updates_where(None)
    sql = (
        f"SELECT count(*) AS n, sum(CASE WHEN {DIFF} = 1 THEN 0 ELSE 1 END) AS other"
        f" FROM t WHERE {where}"
    )
    (counted,) = delta_rs.query(t.silver_path, sql).to_pylist()
    if counted["other"] or counted["n"] <= most:
        return None
    keys = delta_rs.read_arrow(t.silver_path, [t.key[0]], where).column(0)
    if keys.null_count:
        return None
    ordered = np.sort(keys.to_numpy())
    cuts = sorted({int(v) for v in ordered[most::most]})
    sizes = np.diff([0, *np.searchsorted(ordered, cuts).tolist(), len(ordered)])
    if sizes.max(initial=0) > 2 * most:
        return None  # a first key column of few values (a tenant's id): no even ranges
    name = delta_rs.sql_names([t.key[0]])
    bounds = [None, *cuts, None]
    predicates = [
        " AND ".join(
            [f"{name} >= {low}"] * (low is not None) + [f"{name} < {high}"] * (high is not None)
        )
        for low, high in zip(bounds, bounds[1:], strict=False)
        if (low, high) != (None, None)
    ]
    return (predicates or ["TRUE"]), int(counted["n"])


class _NotInPieces(Exception):
    """A piece's rows do not all pass the rules as they are (or not as counted): the build
    goes the per-table path, which writes their samples and quarantine."""


def _build_in_pieces(item: _Item) -> TableOutcome | None:
    """A full build of a large keyed table (``item.pieces``), one piece of silver's keys at a
    time: its state, rules and gold rows, handed to delta-rs' writer (one overwrite commit), so
    the driver holds one piece whatever the table's size. The same rules as a whole build
    (``gold.state``: the tallies of pieces add up to the whole's). Nothing is written when a
    row fails a rule (its sample, the quarantine: the per-table path's) or the rows differ from
    silver's count; None then."""
    t, (predicates, expected) = item.t, item.pieces
    errors_record = summary_record(t.info.qualified_name, NO_DEFINITE_ERRORS, t.policy, t.errors)
    if t.policy == "fail" and errors_record.failed:
        return None
    if not item.exists:
        ensure_gold(t, False)
    names = t.names
    arrow = _nullable(delta_rs.read_arrow(t.path, [*names, LSN], "FALSE").schema)
    diffs = arrow.append(pa.field(DIFF, pa.int64()))
    where = t.updates_where(None)
    rule_names = [r.name for r in t.rules]
    totals: dict[str, int] = {}

    def piece(predicate: str) -> pa.Table:
        read = delta_rs.read_arrow(t.silver_path, [*names, LSN, DIFF], f"({where}) AND {predicate}")
        # insertions of a keyed table: two equal rows would share a key, which the key's
        # rule counts (primary_key_unique fails, and the table is built alone), so none is
        # grouped with another
        state = rules_of.state_of(_conformed(read, diffs), names, t.info.primary_key, distinct=True)
        passed = _all_pass(_Item(t, item.applied, "full", True, state=state))
        if passed is None:
            raise _NotInPieces(f"rows fail a rule in {predicate}")
        checked = rules_of.judge(passed[0], t.policy)
        (counts,) = rules_of.tallies(checked, rule_names).to_pylist()
        for k, v in counts.items():
            totals[k] = totals.get(k, 0) + v
        return _conformed(rules_of.gold_rows(checked, names), arrow)

    def rows():
        for predicate in predicates:
            yield piece(predicate)
        if totals.get(rules_of.GOLD) != expected or totals.get(rules_of.HELD):
            raise _NotInPieces(f"{totals.get(rules_of.GOLD)} rows for {expected} diffs")

    meta = t.commit_meta("full", expected, None)
    tag = {"userMetadata": json.dumps({TAG: meta})}
    try:
        if not delta_rs.append_pieces(
            t.path, arrow, rows(), t.app_id, t.silver_run, tag, "overwrite"
        ):
            return None  # made before: the per-table path decides what is left
    except _NotInPieces as reason:
        log.info("%s: built alone (%s)", t.gold, reason)
        return None
    except pa.ArrowException as exc:  # a value Arrow cannot take as the driver holds it
        log.warning("%s: built alone (%s)", t.gold, exc)
        return None
    failpoint("gold.after_table")
    log.info("%s: built in %d pieces", t.gold, len(predicates))
    records = [errors_record]
    records += [
        QualityRecord(t.info.qualified_name, name, t.policy, 0, totals[rules_of.COUNTED], "[]")
        for name in rule_names
    ]
    return outcome(t, _applied(t, expected), "full", records)


def _state(item: _Item) -> None:
    """Reads silver's new diffs and gold's rows of the touched keys (a full build: all of
    silver's rows, no gold rows); the new state. Creates a new gold table first."""
    t = item.t
    if not item.exists:
        ensure_gold(t, False)
    names = t.names
    after = item.applied.silver_run if item.mode == "incremental" else None
    # A large table's increment is read bounded: its diffs, and gold's rows of their keys, as
    # many as the driver holds of a first build (``driver_rows``), whatever the table's size.
    large = item.mode == "incremental" and item.applied.rows > delta_rs.small_rows()
    most = engine.current().driver_rows
    where = t.updates_where(after)
    columns = [*names, LSN, DIFF]
    updates = (
        delta_rs.read_at_most(t.silver_path, columns, None, [where or "TRUE"], most)
        if large
        else delta_rs.read_arrow(t.silver_path, columns, where)
    )
    if updates is None:
        raise _TooLarge(f"more than {most} diffs into {item.applied.rows} rows")
    parts = ["TRUE"] if item.mode == "incremental" else ["FALSE"]  # a full build reads none
    gold = None
    if large and t.keyed:
        try:
            item.located = deletion_vectors.locate(
                t.path, updates.select(t.key), [*names, LSN], most
            )
        except deletion_vectors.Unsupported as reason:
            log.debug("%s: gold rows by narrowed reads (%s)", t.gold, reason)
        else:
            if item.located is None:
                raise _TooLarge(f"more than {most} gold rows to read for {updates.num_rows} diffs")
            gold = item.located.rows
    if large and gold is None:
        parts = delta_rs.narrowings({k: updates.column(k) for k in _narrowing_columns(t)})
        gold = delta_rs.read_at_most(t.path, [*names, LSN], None, parts, most)
        if gold is None:
            raise _TooLarge(f"more than {most} gold rows to read for {updates.num_rows} diffs")
    if gold is None:
        gold = delta_rs.read_narrowed(t.path, [*names, LSN], None, parts)
    item.arrow = _nullable(gold.schema)
    diffs = item.arrow.append(pa.field(DIFF, pa.int64()))
    updates = _conformed(updates, diffs)
    keys = updates.select(t.key)
    old = rules_of.old_state(_conformed(gold, item.arrow), keys, t.key, names)
    item.old_rows = old.num_rows
    item.affected = rules_of.affected_keys(keys, old, t.key)
    both = pa.concat_tables([updates, _conformed(old, diffs)])
    item.state = rules_of.state_of(both, names, t.info.primary_key)


class _TooLarge(Exception):
    """A large table's run with more diffs than the driver takes: the per-table path builds it."""


def _narrowing_columns(t: Table) -> list[str]:
    """The key's integer columns (every column is the key of a table without one)."""
    types = {f.name: f.type for f in t.columns}
    return [k for k in t.key if k in types and pa.types.is_integer(types[k])]


def _locatable_type(t: pa.DataType) -> bool:
    """Integers, strings, dates, timestamps with a time zone, decimals and booleans."""
    if pa.types.is_timestamp(t):
        return t.tz is not None
    return any(
        test(t)
        for test in (pa.types.is_integer, pa.types.is_string, pa.types.is_date32)
        + (pa.types.is_decimal, pa.types.is_boolean)
    )


def _locatable(t: Table) -> bool:
    """Whether a large table's touched keys' rows are found by their key columns' values
    (``deletion_vectors.locate``: a primary key of types a hash join takes exactly)."""
    types = {f.name: f.type for f in t.columns}
    return t.keyed and all(k in types and _locatable_type(types[k]) for k in t.key)


def _nullable(schema: pa.Schema) -> pa.Schema:
    return pa.schema([f.with_nullable(True) for f in schema])


def _conformed(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table``'s columns ``schema.names`` of ``schema``'s types (silver's and gold's Arrow
    types may differ in width or nullability)."""
    return pa.table([table.column(f.name).cast(f.type) for f in schema], schema=schema)


def _rules(spark: SparkSession, items: list[_Item]) -> list[tuple[pa.Table, list]]:
    """Per item: its state with ``_rules`` (the rules each row fails, ``failed_rules``), and
    per row its JSON sample (failing rows only). In the driver (each rule's
    :class:`~pgmedallion.gold.quality.Check`) for an item whose rows all pass; the others in one
    Spark job per :data:`pgmedallion.core.packed.PARTS_PER_JOB` items, which writes the samples
    of the failing rows as Spark's ``to_json`` writes them."""
    found: dict[int, tuple[pa.Table, list]] = {}
    failing: list[int] = []
    for i, item in enumerate(items):
        passed = _all_pass(item)
        if passed is None:
            failing.append(i)
        else:
            found[i] = passed
    for i, result in zip(failing, _rules_in_spark(spark, [items[i] for i in failing]), strict=True):
        found[i] = result
    return [found[i] for i in range(len(items))]


def _all_pass(item: _Item) -> tuple[pa.Table, list] | None:
    """The item's checked state when every row passes every rule, by the driver; else None."""
    rows, rules = item.state, item.t.rules
    if any(not isinstance(r, Rule) or r.check is None for r in rules):
        return None
    failed = rules_of.failed_rules(rows, rules)
    if len(failed.values):
        return None
    return rows.append_column(RULES, failed), [None] * rows.num_rows


def _rules_in_spark(spark: SparkSession, items: list[_Item]) -> list[tuple[pa.Table, list]]:
    out: list[tuple[pa.Table, list]] = []
    for group in packed.chunks(items):
        tables, schemas = [], []
        for item in group:
            rows = item.state.num_rows
            tables.append(
                item.state.select([*item.t.names, MULT, LSN, KEY_ROWS]).append_column(
                    ROW, pa.array(range(rows), pa.int64())
                )
            )
            own = [T.StructField(f.name, f.dataType) for f in item.t.spark_columns]
            schemas.append(T.StructType(own))
        frame = packed.frame(
            spark, tables, schemas, T.StructType([T.StructField(c, T.LongType()) for c in _SHARED])
        )
        parts: list[DataFrame] = []
        for i, item in enumerate(group):
            rows = frame.where(F.col(packed.PART) == i).select(f"_pgm_p{i}.*", *_SHARED)
            rules = failed_rules(item.t.rules)
            payload = F.to_json(F.struct(*[F.col(quote(n)) for n in [*item.t.names, MULT, LSN]]))
            parts.append(
                rows.withColumn(RULES, rules).select(
                    F.lit(i).alias(packed.PART),
                    F.col(ROW),
                    F.col(RULES),
                    F.when(F.size(RULES) > 0, payload).alias(SAMPLE),
                )
            )
        union = parts[0]
        for p in parts[1:]:
            union = union.union(p)
        result = union.coalesce(2).toArrow().to_pylist()
        failed: list[list] = [[[] for _ in range(item.state.num_rows)] for item in group]
        samples: list[list] = [[None] * item.state.num_rows for item in group]
        for r in result:
            failed[r[packed.PART]][r[ROW]] = r[RULES] or []
            samples[r[packed.PART]][r[ROW]] = r[SAMPLE]
        for item, names, sample in zip(group, failed, samples, strict=True):
            checked = item.state.append_column(RULES, pa.array(names, pa.list_(pa.string())))
            out.append((checked, sample))
    return out


def build_batched(
    spark: SparkSession, tables: list[tuple[Table, bool]]
) -> tuple[dict[int, TableOutcome], list[int]]:
    """The batched builds of ``tables`` (``(table, gold table exists)``): outcomes by index,
    and the indexes left to the per-table path."""
    workers = engine.current().workers  # delta-rs reads and MERGEs release the GIL
    found = concurrently(lambda x: qualifies(*x), tables, workers)
    items = {i: item for i, item in enumerate(found) if item is not None}
    rest = [i for i in range(len(tables)) if i not in items]
    done: dict[int, TableOutcome] = {}
    for i in [i for i, item in items.items() if item.pieces is not None]:
        built = _build_in_pieces(items.pop(i))  # one at a time: each takes the cores
        if built is None:
            rest.append(i)
        else:
            done[i] = built
    if not items:
        return done, sorted(rest)

    def state(i: int) -> bool:
        try:
            _state(items[i])
            return True
        except _TooLarge as reason:
            log.info("%s: built alone (%s)", items[i].t.gold, reason)
            return False
        except Exception as exc:  # e.g. a value the driver cannot take: Spark can
            log.warning("%s: built alone (%s)", items[i].t.gold, exc)
            return False

    order = sorted(items)
    read = concurrently(state, order, workers)
    rest += [i for i, ok in zip(order, read, strict=True) if not ok]
    order = [i for i, ok in zip(order, read, strict=True) if ok]
    if not order:
        return done, sorted(rest)
    checked = _rules(spark, [items[i] for i in order])

    def finish(n: int) -> TableOutcome | None:
        return _finish(items[order[n]], *checked[n])

    results = concurrently(finish, list(range(len(order))), workers)
    for i, result in zip(order, results, strict=True):
        if result is None:
            rest.append(i)
        else:
            done[i] = result
    log.info("gold: %d tables batched, %d per table", len(done), len(rest))
    return done, sorted(rest)


def _finish(item: _Item, checked: pa.Table, samples: list) -> TableOutcome | None:
    """Counts, the MERGE and the outcome of one table; None: the per-table path takes it."""
    t, applied = item.t, item.applied
    checked = rules_of.judge(checked, t.policy)
    names = [r.name for r in t.rules]
    (counts,) = rules_of.tallies(checked, names).to_pylist()
    if counts[rules_of.HELD]:
        return None  # rows for the quarantine: the per-table path writes it
    errors_record = summary_record(t.info.qualified_name, NO_DEFINITE_ERRORS, t.policy, t.errors)
    counted = []
    for i, rule in enumerate(t.rules):
        failed = counts[rules_of.rule_count(i)]
        mine = [samples[r] for r in rules_of.failing(checked, rule.name).nonzero()[0]]
        sample = "[" + ",".join(mine[:SAMPLE_ROWS]) + "]"
        passed = counts[rules_of.COUNTED] - failed
        counted.append(
            QualityRecord(t.info.qualified_name, rule.name, t.policy, failed, passed, sample)
        )
    records = [errors_record, *counted]
    if t.policy == "fail" and any(r.failed for r in records):
        return outcome(t, applied, "held", records)
    gold_rows = counts[rules_of.GOLD]
    full = item.mode == "full"
    rows = gold_rows if full else gold_rows + applied.rows - item.old_rows
    meta = t.commit_meta(item.mode, rows, None)
    ops = item.arrow.append(pa.field(OP, pa.string()))
    try:
        data = (
            _conformed(rules_of.gold_rows(checked, t.names), item.arrow)
            if full
            else _conformed(rules_of.merge_operations(checked, item.affected, t.key, t.names), ops)
        )
    except pa.ArrowException as exc:  # a value Arrow cannot take as the driver holds it
        log.warning("%s: built alone (%s)", t.gold, exc)
        return None
    if full:
        tag = {"userMetadata": json.dumps({TAG: meta})}
        delta_rs.append(t.path, data, t.app_id, t.silver_run, tag, mode="overwrite")
    elif not (
        item.located is not None and merge_by_vectors(t, item.located, data, meta, t.silver_run)
    ) and not merge_arrow(t, data, meta, t.silver_run):
        return None
    failpoint("gold.after_table")
    return outcome(t, _applied(t, rows), item.mode, records)


def _applied(t: Table, rows: int) -> Applied:
    """What the table's gold commit of this run applies (``rows``: gold's rows after it)."""
    return Applied(
        silver_run=t.silver_run,
        frontier=t.frontier,
        silver_frontier=t.silver_frontier,
        quarantine_version=None,
        version=-1,
        rows=rows,
        key=tuple(t.info.primary_key),
    )
