"""Reconciliation: prove that silver (and gold) equal the source, table by table.

::

    source ── temporary slot USE_SNAPSHOT ──> exported snapshot at L (= consistent point - 1)
       │            COPY every table in parallel Spark tasks, decoded and cast exactly as silver
       │            casts, staged (the snapshot is released once staged)
       └── capture + silver until silver's frontier passes L
    compare per table:
       source rows at L            vs  silver diffs summed over _lsn <= L
       gold rows                   vs  silver diffs summed below gold's frontier
    by row count and an order-independent checksum (the sum of a 64-bit hash of every row,
    multiplicities included); on a mismatch, sample rows from both sides of the difference.

Both comparisons go through the same casts as silver (the source's COPY rows are decoded by
``pgmedallion.capture.copy_text``, the reference decoder that silver's Spark SQL decoding is tested
against), so verify proves capture, rewinds, consolidation and gold, not the cast mapping
(which has its own tests). A source row that fails to cast shows up as a mismatch with the
cast error beside it.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pyarrow as pa

from pgmedallion.capture.connection import connect
from pgmedallion.capture.copy_text import decode_copy_row
from pgmedallion.capture.options import StreamLimits
from pgmedallion.capture.pgoutput import format_lsn
from pgmedallion.capture.published import EVERYTHING, HASH, Shape, hash_copy_lines, published
from pgmedallion.capture.snapshot import (
    copy_range,
    estimate_table_block_counts,
    exported_snapshot,
    use_snapshot,
    worker_ctid_ranges,
)
from pgmedallion.core import delta_rs, engine
from pgmedallion.core.config import Config
from pgmedallion.core.errors import PipelineError
from pgmedallion.core.naming import quote
from pgmedallion.core.spark import one_task_per_partition
from pgmedallion.core.sparkapi import F, T
from pgmedallion.gold.as_of import read_as_of
from pgmedallion.gold.history_table import history_name
from pgmedallion.gold.table_io import gold_table_names
from pgmedallion.pipeline import run_stages, silver_state
from pgmedallion.silver.cast_columns import cast_values
from pgmedallion.silver.catalog import load_tables, table_exists
from pgmedallion.silver.contract import Names
from pgmedallion.silver.pgtypes import pg_type_of
from pgmedallion.silver.plan import last_frontier

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

_ROWS = pa.schema([("table_oid", pa.int64()), ("values", pa.list_(pa.string()))])
SAMPLE = 5


class NothingToVerify(PipelineError):
    """Silver has nothing to compare at the verify LSN (no tables yet, or it did not catch up)."""

    stage = "verify"


@dataclass
class TableCheck:
    table: str
    source_rows: int
    silver_rows: int
    exact: bool
    gold_rows: int | None = None
    gold_exact: bool | None = None
    history_exact: bool | None = None
    """The history table read as of gold's frontier equals gold (None: it keeps none)."""
    samples: list[str] = field(default_factory=list)


@dataclass
class VerifyResult:
    lsn: int
    tables: list[TableCheck]

    @property
    def ok(self) -> bool:
        return all(
            t.exact and t.gold_exact is not False and t.history_exact is not False
            for t in self.tables
        )

    def report(self) -> str:
        lines = [f"verify at LSN {format_lsn(self.lsn)}:"]
        for t in self.tables:
            gold = (
                ""
                if t.gold_exact is None
                else f", gold {t.gold_rows} {'exact' if t.gold_exact else 'MISMATCH'}"
            )
            if t.history_exact is not None:
                gold += f", history {'exact' if t.history_exact else 'MISMATCH'}"
            status = "exact" if t.exact else "MISMATCH"
            lines.append(
                f"  {t.table:<32} source {t.source_rows:>9}  silver {t.silver_rows:>9}  "
                f"{status}{gold}"
            )
            lines.extend(f"      {s}" for s in t.samples)
        lines.append("verify: OK" if self.ok else "verify: FAILED")
        return "\n".join(lines)


def _copy_tasks(
    ids: Iterator[pa.RecordBatch], tasks: list[dict], conninfo, snapshot, hash_key
) -> Iterator[pa.RecordBatch]:
    for batch in ids:
        for task in (tasks[i] for i in batch.column("id").to_pylist()):
            oids, values = [], []
            rows = copy_range(
                conninfo,
                snapshot,
                (task["schema"], task["name"]),
                task["columns"],
                (task["start"], task["end"]),
                task["row_filter"],
            )
            for raw in rows:
                if task["hashed"]:
                    raw = hash_copy_lines(raw + b"\n", task["hashed"], hash_key)[:-1]
                oids.append(task["oid"])
                values.append(decode_copy_row(raw, len(task["columns"])))
                if len(oids) >= 50_000:
                    yield pa.RecordBatch.from_pydict({"table_oid": oids, "values": values}, _ROWS)
                    oids, values = [], []
            if oids:
                yield pa.RecordBatch.from_pydict({"table_oid": oids, "values": values}, _ROWS)


def source_rows_at_snapshot(
    spark: SparkSession,
    cfg: Config,
    tables: dict[int, list[str]],
    *,
    workers: int = 2,
) -> tuple[int, DataFrame, dict[int, list[str]]]:
    """(L, rows, absent) of ``tables`` (oid -> column names) read at one new exported snapshot,
    as capture lands them: the publication's row filter applied, hashed columns hashed
    (``pgmedallion.capture.published``). ``absent``: oid -> the columns a table no longer has
    at L (renamed or dropped since silver's snapshot of it): such a table is not read.

    The rows (``table_oid``, ``values`` as text) are staged with a local checkpoint before the
    snapshot is released.
    """
    conninfo = cfg.source.conninfo()
    with exported_snapshot(conninfo, f"pgm_verify_{uuid.uuid4().hex[:12]}") as point:
        conn = connect(conninfo)
        try:
            use_snapshot(conn, point.snapshot_name)
            names = dict(
                conn.execute(
                    "SELECT c.oid::int8, n.nspname || '\x1f' || c.relname FROM pg_class c "
                    "JOIN pg_namespace n ON n.oid = c.relnamespace "
                    "WHERE c.oid = ANY(%s::oid[])",
                    (list(tables),),
                ).fetchall()
            )
            present: dict[int, set[str]] = {}
            for oid, column in conn.execute(
                "SELECT attrelid::int8, attname FROM pg_attribute WHERE attrelid = ANY(%s::oid[])"
                " AND attnum > 0 AND NOT attisdropped",
                (list(tables),),
            ).fetchall():
                present.setdefault(oid, set()).add(column)
            blocks = estimate_table_block_counts(conn, list(tables))
            shapes = published(conn, cfg.source.publication, list(tables))
            version = conn.info.server_version
            conn.execute("COMMIT")
        finally:
            conn.close()
        tasks = []
        hash_key = None
        absent = {}
        for oid, columns in tables.items():
            if oid not in names:
                continue  # dropped: verify reports it as missing
            absent[oid] = [c for c in columns if c not in present.get(oid, ())]
            if absent[oid]:
                continue
            del absent[oid]
            schema, name = names[oid].split("\x1f", 1)
            pii = cfg.policy(f"{schema}.{name}").pii()
            if HASH in pii.values() and hash_key is None:
                hash_key = cfg.source.hash_key()
            shape = Shape.of(shapes.get(oid, EVERYTHING), pii, hash_key)
            hashed = [i for i, column in enumerate(columns) if shape.rule(column) == HASH]
            for start, end in worker_ctid_ranges(blocks[oid], workers, version):
                tasks.append(
                    dict(
                        oid=oid,
                        schema=schema,
                        name=name,
                        columns=columns,
                        row_filter=shape.row_filter,
                        hashed=hashed,
                        start=start,
                        end=end,
                    )
                )
        info, snap = dict(conninfo), point.snapshot_name
        rows = (
            one_task_per_partition(spark, len(tasks))
            .mapInArrow(
                lambda it: _copy_tasks(it, tasks, info, snap, hash_key),
                T.StructType(
                    [
                        T.StructField("table_oid", T.LongType()),
                        T.StructField("values", T.ArrayType(T.StringType())),
                    ]
                ),
            )
            .localCheckpoint(eager=True)
        )
    return point.snapshot_lsn, rows, absent


def _checksums(frames: list[DataFrame]) -> list[tuple[int, int, int]]:
    """``(rows, checksum, rows that do not cast)`` of each frame, in one Spark job for all of
    them (a job over a few rows costs most of a second whatever it does; a verify of a few
    tables compared four frames per table, one job each). The checksum is the sum of a 64-bit
    hash of every row, multiplicities included; a frame's ``_cast_errors`` column (the source's
    casts) is counted, not hashed."""
    if not frames:
        return []
    parts = []
    for i, df in enumerate(frames):
        data = [F.col(quote(c)) for c in df.columns if c != "_cast_errors"]
        bad = (
            F.sum((F.size("_cast_errors") > 0).cast("long"))
            if "_cast_errors" in df.columns
            else F.lit(0).cast("long")
        )
        parts.append(
            df.agg(
                F.count(F.lit(1)).alias("n"),
                F.sum(F.xxhash64(*data).cast("decimal(38,0)")).alias("h"),
                bad.alias("bad"),
            ).select(F.lit(i).alias("i"), "n", "h", "bad")
        )
    union = parts[0]
    for part in parts[1:]:
        union = union.unionByName(part)
    out = {r["i"]: (int(r["n"]), int(r["h"] or 0), int(r["bad"] or 0)) for r in union.collect()}
    return [out[i] for i in range(len(frames))]


def _samples(a: DataFrame, b: DataFrame, a_name: str, b_name: str) -> list[str]:
    out = []
    for r in a.exceptAll(b).limit(SAMPLE).collect():
        out.append(f"only in {a_name}: {r.asDict()}")
    for r in b.exceptAll(a).limit(SAMPLE).collect():
        out.append(f"only in {b_name}: {r.asDict()}")
    return out


def verify(
    spark: SparkSession, cfg: Config, *, catch_up: bool = True, check_gold: bool = True
) -> VerifyResult:
    """Compare silver (and gold) with the source at a fresh snapshot LSN."""
    engine.use(cfg.lakehouse)
    if not table_exists(spark, Names(cfg).tables):
        raise NothingToVerify(
            f"silver holds no table of source {cfg.source.name!r} yet: run `pgmedallion run` first"
        )

    def columns(tables: dict) -> dict[int, list[str]]:
        return {oid: [c["name"] for c in info.columns] for oid, info in tables.items()}

    for _ in range(3):
        read = {
            oid: info
            for oid, info in load_tables(spark, cfg).items()
            if info.snapshot_lsn is not None
        }
        lsn, rows, absent = source_rows_at_snapshot(spark, cfg, columns(read))
        if catch_up:
            for _ in range(5):
                frontier = _silver_frontier(spark, cfg)
                if frontier > lsn:
                    break
                run_stages(
                    spark,
                    cfg,
                    ("capture", "silver", "gold") if check_gold else ("capture", "silver"),
                    limits=StreamLimits(idle_commit_bytes=0),  # past the verify LSN, changes or not
                )
        frontier = _silver_frontier(spark, cfg)
        if frontier <= lsn:
            raise NothingToVerify(
                f"silver's frontier {format_lsn(frontier)} did not pass "
                f"the verify LSN {format_lsn(lsn)}"
            )
        tables = {oid: info for oid, info in load_tables(spark, cfg).items() if oid in read}
        if columns(tables) == columns({oid: read[oid] for oid in tables}):
            break
        # the catch-up run followed a schema change (or snapshotted a table again with its
        # columns of now): read the source again with the columns silver holds now
        log.info("verify: columns changed during the catch-up run; reading the source again")
    gold_frontiers = _gold_frontiers(spark, cfg) if check_gold else {}
    # Every table's frames first; their checksums in one job; samples only where they differ.
    pairs = []  # (info, source, silver, gold, silver at gold's frontier, history there)
    have = gold_table_names(spark, cfg) if check_gold and cfg.keeps_history() else set()
    for oid, info in sorted(tables.items(), key=lambda kv: kv[1].qualified_name):
        if oid in absent:
            pairs.append((info, None, None, None, None, None))
            continue
        columns = [(c["name"], pg_type_of(c)) for c in info.columns]
        names = [c for c, _ in columns]
        source = rows.where(F.col("table_oid") == oid).select(
            F.concat(
                "values",
                F.array_repeat(F.lit(None).cast("string"), F.lit(len(names)) - F.size("values")),
            ).alias("values")
        )
        source = cast_values(source, "values", columns)
        silver = silver_state(spark, cfg, info.silver_table, lsn + 1).select(*_cols(names))
        gold = at_gold = history = None
        if check_gold and oid in gold_frontiers:
            gold = spark.table(cfg.qualified("gold", info.silver_table)).select(*_cols(names))
            at_gold = silver_state(spark, cfg, info.silver_table, gold_frontiers[oid])
            at_gold = at_gold.select(*_cols(names))
            if history_name(info).lower() in have:  # every transaction below the frontier
                history = read_as_of(spark, cfg, info.silver_table, gold_frontiers[oid] - 1)
                history = history.select(*_cols(names))
        pairs.append((info, source, silver, gold, at_gold, history))
    frames = [f for pair in pairs for f in pair[1:] if f is not None]
    sums = iter(_checksums(frames))
    checks = []
    for info, source, silver, gold, at_gold, history in pairs:
        if source is None:
            checks.append(_not_comparable(info, absent[info.oid], cfg))
            continue
        (ns, hs, bad), (nv, hv, _) = next(sums), next(sums)
        exact = ns == nv and hs == hv
        plain = source.drop("_cast_errors")
        samples = [] if exact else _samples(plain, silver, "source", "silver")
        if bad:
            failures = source.where(F.size("_cast_errors") > 0).limit(SAMPLE).collect()
            samples += [f"source row does not cast: {r['_cast_errors']}" for r in failures]
        check = TableCheck(info.qualified_name, ns, nv, exact, samples=samples)
        if gold is not None:
            (ng, hg, _), (na, ha, _) = next(sums), next(sums)
            gexact = ng == na and hg == ha
            check.gold_rows, check.gold_exact = ng, gexact
            if not gexact:
                check.samples += _samples(gold, at_gold, "gold", "silver")
            if history is not None:
                nh, hh, _ = next(sums)
                check.history_exact = nh == ng and hh == hg
                if not check.history_exact:
                    check.samples += _samples(history, gold, "history", "gold")
        elif check_gold:
            check.gold_exact = False
            check.samples.append("no gold frontier for this table")
        checks.append(check)
    result = VerifyResult(lsn, checks)
    log.info("verify at %s: %s", format_lsn(lsn), "OK" if result.ok else "FAILED")
    return result


def _not_comparable(info, absent: list[str], cfg: Config) -> TableCheck:
    """A table whose columns in silver the source no longer has, after the catch-up run: its
    schema change is not followed (policy ``error``, or capture could not run)."""
    policy = cfg.policy(info.qualified_name).on_schema_change
    why = (
        f"columns {', '.join(absent)} are no longer at the source (renamed or dropped): "
        f"silver still has the table as its snapshot had it (on_schema_change = {policy!r}"
        + (
            "; `pgmedallion resync` snapshots it again)"
            if policy == "error"
            else "; a run snapshots it again once the stream shows the change, which needs a "
            "change of the table, or now with `pgmedallion resync`)"
        )
    )
    return TableCheck(info.qualified_name, 0, 0, False, samples=[why])


def _cols(names: list[str]):
    return [F.col(quote(c)) for c in names]


def _silver_frontier(spark: SparkSession, cfg: Config) -> int:
    return last_frontier(spark, Names(cfg), cfg.source.name)


def _gold_frontiers(spark: SparkSession, cfg: Config) -> dict[int, int]:
    """Each table's frontier in gold's ``_frontier`` (its newest row's)."""
    try:
        rows = delta_rs.bookkeeping_rows(
            spark,
            cfg.schema("gold"),
            "_frontier",
            ["table_oid", "frontier", "updated_at"],
            {"source": cfg.source.name},
        )
    except Exception:  # no gold run yet
        return {}
    newest: dict[int, tuple] = {}
    for r in rows:
        at = (r["updated_at"] is not None, r["updated_at"] or 0)
        if r["table_oid"] not in newest or at > newest[r["table_oid"]][0]:
            newest[r["table_oid"]] = (at, r["frontier"])
    return {oid: frontier for oid, (_, frontier) in newest.items()}
