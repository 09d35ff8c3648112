"""``pgmedallion status`` and ``pgmedallion sql``: what the pipeline holds, in plain text."""

from __future__ import annotations

import json

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from pgmedallion.capture.pgoutput import format_lsn
from pgmedallion.core.config import Config
from pgmedallion.slot_status import slot_lines


def _table(spark: SparkSession, name: str) -> DataFrame | None:
    try:
        df = spark.table(name)
        df.schema  # noqa: B018 - resolves the table now
        return df
    except Exception:
        return None


def status_report(spark: SparkSession, cfg: Config) -> tuple[str, bool]:
    """The report text, and whether everything is healthy (slot present, no errors)."""
    source = cfg.source.name
    lines, ok = slot_lines(cfg)
    bronze = _table(spark, cfg.qualified("bronze", "bronze"))
    if bronze is not None:
        f = bronze.where((F.col("source") == source) & (F.col("kind") == "progress"))
        frontier = f.agg(F.max("lsn")).first()[0]
        lines.append(f"bronze frontier: {format_lsn(frontier) if frontier else 'none yet'}")
    progress = _table(spark, cfg.qualified("silver", "_progress"))
    if progress is not None:
        last = progress.where(F.col("source") == source).orderBy(F.col("run").desc()).first()
        if last:
            lines.append(f"silver frontier: {format_lsn(last['frontier'])} (run {last['run']})")
    errors: dict[int, int] = {}
    err = _table(spark, cfg.qualified("silver", "_errors"))
    if err is not None:
        errors = {
            r["table_oid"]: r["count"]
            for r in err.where(F.col("source") == source).groupBy("table_oid").count().collect()
        }
    gold: dict[int, tuple[int, int]] = {}
    fr = _table(spark, cfg.qualified("gold", "_frontier"))
    if fr is not None:
        for r in (
            fr.where(F.col("source") == source)
            .groupBy("table_oid")
            .agg(F.max_by(F.struct("frontier", "rows"), "updated_at").alias("s"))
            .collect()
        ):
            gold[r["table_oid"]] = (r["s"]["frontier"], r["s"]["rows"])
    tables = _table(spark, cfg.qualified("silver", "_tables"))
    if tables is not None:
        lines.append(f"{'table':<36} {'gold rows':>10} {'gold frontier':>15} {'errors':>7}")
        for t in (
            tables.where(F.col("source") == source).orderBy("table_schema", "table_name").collect()
        ):
            frontier, rows = gold.get(t["table_oid"], (None, None))
            n_err = errors.get(t["table_oid"], 0)
            ok = ok and n_err == 0
            lines.append(
                f"{t['table_schema'] + '.' + t['table_name']:<36} "
                f"{'-' if rows is None else rows:>10} "
                f"{format_lsn(frontier) if frontier else '-':>15} {n_err:>7}"
            )
    elif bronze is None:
        lines.append("nothing captured yet: run `pgmedallion run`")
    if bronze is not None:
        lines += _resynced(bronze, source)
    return "\n".join(lines), ok


def _resynced(bronze: DataFrame, source: str, newest: int = 10) -> list[str]:
    """The newest schema changes capture saw, and what it did: tables it snapshotted again by
    itself, with why (a schema change, a changed publication shape, partitions moved), and
    changes it followed without a new snapshot."""
    records = (
        bronze.where((F.col("source") == source) & F.col("kind").isin("resync", "schema_change"))
        .select("kind", "table_schema", "table_name", "lsn", "payload")
        .orderBy(F.col("batch_id").desc())
        .collect()
    )
    lines = []
    for r in records:
        payload = json.loads(bytes(r["payload"]).decode())
        if r["kind"] == "resync":
            what = payload.get("reason") and f"{payload['reason']}: snapshotted again"
        else:
            what = f"{payload['change']}: {payload.get('done', 'followed')}"
        if what and len(lines) < newest:
            table = f"{r['table_schema']}.{r['table_name']}"
            lines.append(f"  {table} at {format_lsn(r['lsn'])}: {what}")
    return ["schema changes and resyncs by capture (newest first):", *lines] if lines else []


def format_rows(columns: list[str], rows: list[tuple]) -> str:
    """A plain text table: header, rule, one line per row; NULL for None."""
    cells = [[("NULL" if v is None else str(v)).replace("\n", "\\n") for v in r] for r in rows]
    widths = [min(60, max([len(c)] + [len(r[i]) for r in cells])) for i, c in enumerate(columns)]
    fmt = lambda vals: " | ".join(v[:w].ljust(w) for v, w in zip(vals, widths, strict=True))  # noqa: E731
    out = [fmt(columns), "-+-".join("-" * w for w in widths)]
    out += [fmt(r) for r in cells]
    return "\n".join(out)


def print_query(spark: SparkSession, cfg: Config, query: str, *, limit: int = 100) -> None:
    df = spark.sql(query)
    rows = df.limit(limit + 1).collect()
    more = len(rows) > limit
    print(format_rows(df.columns, [tuple(r) for r in rows[:limit]]))
    print(f"({limit}+ rows, first {limit} shown)" if more else f"({len(rows)} rows)")
