"""Many small gold tables of one run in a few Spark jobs: the batched increment.

A run that touches many small tables spent about 0.9 s per table in gold, almost all of it in
Spark jobs of a few rows each (the touched keys' old rows, the checked state, the rule counts,
the MERGE source). A small table's increment touches a handful of rows, so here it is computed
in the driver, and Spark does only what must be Spark's, the rule conditions (Spark SQL), in
one job per :data:`pgmedallion.core.packed.PARTS_PER_JOB` tables:

    read      delta-rs: the gold commit's record (history), silver's new diffs, gold's rows
    state     the touched keys' old rows (+1 each) and the new diffs, summed per row
              (``pgmedallion.gold.state.consolidate``), with ``_key_rows`` (``with_key_rows``)
    rules     one packed Spark job: each row's failed rules (``failed_rules``) and, for a
              failing row, its JSON sample, as ``count_rules`` writes it
    merge     the MERGE operations (``merge_operations``: upsert, delete, insert per key) and
              delta-rs' MERGE with gold's tag and idempotency record (``merge_arrow``)

What qualifies: an incremental build of a table whose gold and silver tables are local, of at
most ``[lakehouse] small_table_rows`` rows, with gold's columns as silver's, no quarantine
table, and no map column. A table whose new state sends a row to quarantine goes back to the
per-table path (which writes the quarantine) before anything is written, and so does one whose
MERGE delta-rs refuses.

Grouping in the driver is exact: the rows come from Delta tables that Spark's grouping wrote
(silver's consolidation, gold's MERGE), whose floating-point values are already normalized; a
NaN is equal to a NaN here as in Spark's grouping.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from pgmedallion.core import delta_rs, engine, packed
from pgmedallion.core.failpoints import failpoint
from pgmedallion.core.naming import quote
from pgmedallion.core.parallel import concurrently
from pgmedallion.gold.history import SAMPLE_ROWS, TAG, Applied, applied_state
from pgmedallion.gold.plan import Table, TableOutcome
from pgmedallion.gold.quality import NO_DEFINITE_ERRORS, QualityRecord
from pgmedallion.gold.reports import summary_record
from pgmedallion.gold.state import DELETE, DIFF, INSERT, LSN, MULT, OP, RULES, UPSERT, failed_rules
from pgmedallion.gold.table import build_mode, ensure_gold, outcome
from pgmedallion.gold.table_io import gold_schema, merge_arrow

log = logging.getLogger(__name__)

KEY_ROWS, ROW, SAMPLE = "_key_rows", "_pgm_row", "_pgm_sample"
_SHARED = (MULT, LSN, KEY_ROWS, ROW)
_SHARED_SCHEMA = T.StructType(
    [
        T.StructField(MULT, T.LongType()),
        T.StructField(LSN, T.LongType()),
        T.StructField(KEY_ROWS, T.LongType()),
        T.StructField(ROW, T.LongType()),
    ]
)


@dataclass
class _Item:
    t: Table
    applied: Applied | None
    mode: str = "incremental"
    """``incremental`` or ``full`` (a small table built from all of silver's rows)."""
    exists: bool = True
    state: list[tuple[list, int, int]] = field(default_factory=list)
    """The touched keys' new state: ``(values, multiplicity, lsn)``."""
    affected: dict = field(default_factory=dict)
    """Every touched key (normalized) -> ``(key values, gold's rows of it before)``."""
    old_rows: int = 0
    arrow: pa.Schema | None = None
    """Gold's columns and ``_lsn`` as Arrow."""


def _norm(value):
    """A value as a grouping key: NaN equal to NaN, lists and structs as tuples."""
    if isinstance(value, float):
        return ("NaN",) if value != value else (0.0 if value == 0 else value)
    if isinstance(value, list | tuple):
        return tuple(_norm(v) for v in value)
    if isinstance(value, dict):  # a struct: its fields in order
        return tuple((k, _norm(v)) for k, v in value.items())
    return value


def _has_map(t: T.DataType) -> bool:
    if isinstance(t, T.MapType):
        return True
    if isinstance(t, T.ArrayType):
        return _has_map(t.elementType)
    if isinstance(t, T.StructType):
        return any(_has_map(f.dataType) for f in t.fields)
    return False


def qualifies(t: Table, exists: bool) -> _Item | None:
    """The table's batch item if its build takes this path (delta-rs reads only)."""
    if not (t.path and delta_rs.usable(t.silver_path)):
        return None
    if any(_has_map(f.dataType) for f in t.columns):
        return None
    applied = None
    if exists:
        if not delta_rs.usable(t.path):
            return None
        have = delta_rs.spark_schema(t.path)
        want = gold_schema(t.columns)
        if [(f.name, f.dataType) for f in have.fields] != [
            (f.name, f.dataType) for f in want.fields
        ]:
            return None  # the per-table path recreates it
        applied = applied_state(t.spark, t.gold, t.path)
    if applied is not None and (applied.quarantine_version is not None or applied.rows is None):
        return None
    if applied is not None and t.silver_run <= applied.silver_run:
        return None  # no idempotency record to commit under
    mode = build_mode(t, applied)
    if mode == "incremental" and applied.rows <= delta_rs.small_rows():
        return _Item(t, applied, mode, exists)
    quarantine = str(Path(t.path).parent / (t.info.silver_table + "__quarantine").lower())
    if mode == "full" and not delta_rs.usable(quarantine) and delta_rs.small(t.silver_path):
        return _Item(t, applied, mode, exists)
    return None


def _state(item: _Item) -> None:
    """Reads silver's new diffs and gold's rows of the touched keys (a full build: all of
    silver's rows, no gold rows); the new state. Creates a new gold table first."""
    t = item.t
    if not item.exists:
        ensure_gold(t, False)
    names = t.names
    positions = [names.index(k) for k in t.key]
    after = item.applied.silver_run if item.mode == "incremental" else None
    updates = delta_rs.read_arrow(
        t.silver_path, [*names, LSN, DIFF], t.updates_where(after)
    ).to_pylist()
    touched = {}
    for r in updates:
        values = [r[n] for n in names]
        key = tuple(_norm(values[p]) for p in positions)
        touched.setdefault(key, [values[p] for p in positions])
    where = None if item.mode == "incremental" else "false"  # a full build reads no gold rows
    gold = delta_rs.read_arrow(t.path, [*names, LSN], where)
    item.arrow = gold.schema
    sums: dict[tuple, list] = {}
    old: dict[tuple, int] = {}

    def add(values: list, lsn: int, diff: int) -> None:
        row = sums.setdefault(tuple(_norm(v) for v in values), [values, 0, None])
        row[1] += diff
        row[2] = lsn if row[2] is None or (lsn is not None and lsn > row[2]) else row[2]

    for r in gold.to_pylist():
        values = [r[n] for n in names]
        key = tuple(_norm(values[p]) for p in positions)
        if key in touched:
            old[key] = old.get(key, 0) + 1
            add(values, r[LSN], 1)
    for r in updates:
        add([r[n] for n in names], r[LSN], r[DIFF])
    item.old_rows = sum(old.values())
    item.affected = {k: (v, old.get(k, 0)) for k, v in touched.items()}
    item.state = [(v, m, lsn) for v, m, lsn in sums.values() if m != 0]


def _key_rows(item: _Item) -> list[int]:
    """``with_key_rows`` per state row: copies (positive multiplicity) of the row's key."""
    if not item.t.keyed:
        return [max(m, 0) for _, m, _ in item.state]
    positions = [item.t.names.index(k) for k in item.t.key]
    per_key: dict[tuple, int] = {}
    keys = [tuple(_norm(v[p]) for p in positions) for v, _, _ in item.state]
    for k, (_, m, _) in zip(keys, item.state, strict=True):
        per_key[k] = per_key.get(k, 0) + max(m, 0)
    return [per_key[k] for k in keys]


def _rules(spark: SparkSession, items: list[_Item]) -> list[list[tuple[list[str], str | None]]]:
    """Per item, per state row: the rules it fails and (failing) its JSON sample; one Spark job
    per :data:`pgmedallion.core.packed.PARTS_PER_JOB` items."""
    out: list[list[tuple[list[str], str | None]]] = []
    for group in packed.chunks(items):
        tables, schemas = [], []
        for item in group:
            names = item.t.names
            key_rows = _key_rows(item)
            records = [
                {**dict(zip(names, v, strict=True)), MULT: m, LSN: lsn, KEY_ROWS: kr, ROW: i}
                for i, ((v, m, lsn), kr) in enumerate(zip(item.state, key_rows, strict=True))
            ]
            fields = [item.arrow.field(n) for n in names]
            arrow = pa.schema(fields + [pa.field(c, pa.int64()) for c in _SHARED])
            tables.append(pa.Table.from_pylist(records, schema=arrow))
            own = [T.StructField(f.name, f.dataType) for f in item.t.columns]
            schemas.append(T.StructType(own))
        frame = packed.frame(spark, tables, schemas, _SHARED_SCHEMA)
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
        per = [[([], None)] * len(item.state) for item in group]
        for r in result:
            per[r[packed.PART]][r[ROW]] = (r[RULES] or [], r[SAMPLE])
        out += per
    return out


def _operations(item: _Item, to_gold: list[tuple[list, int, int]]) -> pa.Table:
    """``pgmedallion.gold.state.merge_operations`` on the driver: the MERGE source rows."""
    t = item.t
    positions = [t.names.index(k) for k in t.key]
    new: dict[tuple, int] = {}
    for v, m, _ in to_gold:
        k = tuple(_norm(v[p]) for p in positions)
        new[k] = new.get(k, 0) + m
    multi = set()
    records = []
    for k, (key_values, old) in item.affected.items():
        n = new.get(k, 0)
        several = old > 1 or n > 1  # the key's old rows all go, its new ones are inserted
        if several:
            multi.add(k)
        if (several and old >= 1) or (old == 1 and n == 0):
            row = {name: None for name in t.names}
            row.update(dict(zip(t.key, key_values, strict=True)))
            records.append({**row, LSN: None, OP: DELETE})
    for v, m, lsn in to_gold:
        k = tuple(_norm(v[p]) for p in positions)
        row = {**dict(zip(t.names, v, strict=True)), LSN: lsn}
        if k in multi:
            records += [{**row, OP: INSERT}] * m
        else:
            records.append({**row, OP: UPSERT})
    schema = pa.schema([*item.arrow, pa.field(OP, pa.string())])
    return pa.Table.from_pylist(records, schema=schema)


def build_batched(
    spark: SparkSession, tables: list[tuple[Table, bool]]
) -> tuple[dict[int, TableOutcome], list[int]]:
    """The batched builds of ``tables`` (``(table, gold table exists)``): outcomes by index,
    and the indexes left to the per-table path."""
    workers = engine.current().workers  # delta-rs reads and MERGEs release the GIL
    found = concurrently(lambda x: qualifies(*x), tables, workers)
    items = {i: item for i, item in enumerate(found) if item is not None}
    rest = [i for i in range(len(tables)) if i not in items]
    if not items:
        return {}, rest

    def state(i: int) -> bool:
        try:
            _state(items[i])
            return True
        except Exception as exc:  # e.g. a value the driver cannot take: Spark can
            log.warning("%s: built alone (%s)", items[i].t.gold, exc)
            return False

    order = sorted(items)
    read = concurrently(state, order, workers)
    rest += [i for i, ok in zip(order, read, strict=True) if not ok]
    order = [i for i, ok in zip(order, read, strict=True) if ok]
    if not order:
        return {}, sorted(rest)
    checked = _rules(spark, [items[i] for i in order])

    def finish(n: int) -> TableOutcome | None:
        item = items[order[n]]
        return _finish(item, checked[n])

    done: dict[int, TableOutcome] = {}
    results = concurrently(finish, list(range(len(order))), workers)
    for i, result in zip(order, results, strict=True):
        if result is None:
            rest.append(i)
        else:
            done[i] = result
    log.info("gold: %d tables batched, %d per table", len(done), len(rest))
    return done, sorted(rest)


def _finish(item: _Item, rules: Sequence[tuple[list[str], str | None]]) -> TableOutcome | None:
    """Counts, the MERGE and the outcome of one table; None: the per-table path takes it."""
    t, applied = item.t, item.applied
    to_gold, records = [], []
    held = 0
    for (values, m, lsn), (failed, _) in zip(item.state, rules, strict=True):
        goes = not (m < 0 or (t.policy == "quarantine" and failed))
        if not goes:
            held += 1
        elif m > 0:
            to_gold.append((values, m, lsn))
    if held:
        return None  # rows for the quarantine: the per-table path writes it
    errors_record = summary_record(t.info.qualified_name, NO_DEFINITE_ERRORS, t.policy, t.errors)
    counted = []
    for rule in t.rules:
        samples = [s for failed, s in rules if rule.name in failed]
        sample = "[" + ",".join(samples[:SAMPLE_ROWS]) + "]"
        passed = len(item.state) - len(samples)
        counted.append(
            QualityRecord(t.info.qualified_name, rule.name, t.policy, len(samples), passed, sample)
        )
    records = [errors_record, *counted]
    if t.policy == "fail" and any(r.failed for r in records):
        return outcome(t, applied, "held", records)
    gold_rows = sum(m for _, m, _ in to_gold)
    full = item.mode == "full"
    rows = gold_rows if full else gold_rows + applied.rows - item.old_rows
    meta = {
        "source": t.info.source,
        "silver_run": t.silver_run,
        "frontier": t.frontier,
        "silver_frontier": t.silver_frontier,
        "quarantine_version": None,
        "mode": item.mode,
        "rows": rows,
    }
    try:
        data = _gold_rows(item, to_gold) if full else _operations(item, to_gold)
    except Exception as exc:  # a value Arrow cannot take as the driver holds it
        log.warning("%s: built alone (%s)", t.gold, exc)
        return None
    if full:
        tag = {"userMetadata": json.dumps({TAG: meta})}
        delta_rs.append(t.path, data, t.app_id, t.silver_run, tag, mode="overwrite")
    elif not merge_arrow(t, data, meta, t.silver_run):
        return None
    failpoint("gold.after_table")
    now = Applied(
        silver_run=t.silver_run,
        frontier=t.frontier,
        silver_frontier=t.silver_frontier,
        quarantine_version=None,
        version=-1,
        rows=rows,
    )
    return outcome(t, now, item.mode, records)


def _gold_rows(item: _Item, to_gold: list[tuple[list, int, int]]) -> pa.Table:
    """A full build's gold rows: a row of multiplicity m m times (``gold.state.expand``)."""
    names = item.t.names
    records = [
        {**dict(zip(names, v, strict=True)), LSN: lsn} for v, m, lsn in to_gold for _ in range(m)
    ]
    return pa.Table.from_pylist(records, schema=item.arrow)
