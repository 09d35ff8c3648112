"""``pgmedallion status`` and ``pgmedallion sql``: what the pipeline holds, in plain text."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from pgmedallion.bronze.engines import DeltaRsBronze, delta_rs_unusable
from pgmedallion.bronze.store import Bronze
from pgmedallion.capture.pgoutput import format_lsn
from pgmedallion.core import delta_rs
from pgmedallion.core.config import Config
from pgmedallion.core.errors import holds_table
from pgmedallion.slot_status import slot_report

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)


@dataclass
class TableStatus:
    name: str
    rows: int | None
    frontier: int | None
    as_of: datetime | None
    errors: int


@dataclass
class Status:
    """What ``status`` shows, read once (``collect_status``) and printed by ``format_status``."""

    source: list[str]
    ok: bool
    wal: int | None
    """The source's current WAL position (None when it cannot be asked)."""
    read_at: datetime
    bronze: tuple[int | None, datetime | None] | None = None
    silver: tuple[int, int, datetime | None] | None = None
    tables: list[TableStatus] | None = None
    schema_events: list[str] = field(default_factory=list)
    gaps: list[tuple[int, int, str]] = field(default_factory=list)
    """Changes capture never read, ``(from, to, why)``: a lost slot (``Bronze.gaps``)."""
    under_way: list[tuple[str, int, int]] = field(default_factory=list)
    """Snapshots in key ranges a run stopped during: ``(table, ranges landed, in all)``."""
    lakehouse_note: str | None = None


class _Lakehouse:
    """The lakehouse's tables as ``status`` reads them: by delta-rs at their local
    directories (no JVM: ``status`` answers in about a second, and beside a running
    ``run --continuous``, whose Spark holds the local Derby metastore), else through Spark.

    ``spark()`` gives the session, started on first need; ``session``: a session already
    running, whose catalog then says where the tables are (else the configuration's state
    directory does, as for every local process started from it)."""

    def __init__(self, cfg: Config, spark: Callable[[], SparkSession | None], session=None) -> None:
        self.cfg = cfg
        self._spark = spark
        self._session = session
        self.local = delta_rs.DeltaTable is not None and (
            session is not None or cfg.local_table_path("gold", "x") is not None
        )

    def path(self, layer: str, name: str) -> str | None:
        """The table's local directory if it has one (None: ask Spark)."""
        if not self.local:
            return None
        if self._session is None:
            return self.cfg.local_table_path(layer, name)
        try:
            return delta_rs.table_dir(
                delta_rs.schema_dir(self._session, self.cfg.schema(layer)), name
            )
        except Exception:  # no such schema (yet)
            return None

    def _absent(self, path: str | None) -> bool | None:
        """True: the table does not exist; False: read it by delta-rs; None: ask Spark."""
        if path is None:
            return None
        if (Path(path) / "_delta_log").is_dir():
            return False
        return True if self._session is None else None

    def rows(self, layer: str, name: str, sql: str) -> list[dict[str, Any]] | None:
        """``sql`` (over ``{t}``) on table ``name`` of ``layer``; None when it does not exist."""
        path = self.path(layer, name)
        absent = self._absent(path)
        if absent:
            return None
        if absent is False:
            try:
                return [
                    {k: delta_rs.naive_utc(v) for k, v in r.items()}
                    for r in delta_rs.query(path, sql.format(t="t")).to_pylist()
                ]
            except Exception as exc:  # a protocol delta-rs does not read: through Spark
                log.debug("status: delta-rs cannot read %s (%s)", path, exc)
        spark = self._spark()
        if spark is None:
            return None
        from pyspark.errors import AnalysisException

        try:
            df = spark.sql(sql.format(t=self.cfg.qualified(layer, name)))
            return [r.asDict() for r in df.collect()]
        except AnalysisException:
            return None

    def bronze(self) -> Bronze | None:
        table, source = self.cfg.qualified("bronze", "bronze"), self.cfg.source.name
        path = self.path("bronze", "bronze")
        absent = self._absent(path)
        if absent:
            return None
        if absent is False and delta_rs_unusable(path) is None:
            return DeltaRsBronze(path, table, source)
        spark = self._spark()
        if spark is None or not spark.catalog.tableExists(table):
            return None
        from pgmedallion.bronze.spark_table import SparkBronze

        return SparkBronze(spark, table, source)


def collect_status(
    cfg: Config, spark: Callable[[], SparkSession | None], session: SparkSession | None = None
) -> Status:
    """Everything ``status`` shows: the slot and the source's WAL position, bronze's frontier,
    silver's last run, and per table its gold rows, frontier, the source's clock for it
    (``as of``) and errors. ``spark`` is called only where a table is not local; ``session``: a
    running session whose catalog locates the tables (see ``_Lakehouse``)."""
    lines, ok, wal = slot_report(cfg)
    status = Status(lines, ok, wal, datetime.now(UTC).replace(tzinfo=None))
    house = _Lakehouse(cfg, spark, session)
    where = "source = '" + cfg.source.name.replace("'", "''") + "'"
    bronze = house.bronze()
    if bronze is not None:
        end = bronze.window_end()
        status.bronze = (end.frontier, end.source_time)
        status.schema_events = _schema_events(bronze)
        status.gaps = bronze.gaps()
        status.under_way = bronze.snapshots_under_way()
    progress = house.rows("silver", "_progress", f"SELECT * FROM {{t}} WHERE {where}")
    if progress:
        last = max(progress, key=lambda r: r["run"])
        status.silver = (last["run"], last["frontier"], last.get("source_time"))
    errors = house.rows(
        "silver",
        "_errors",
        f"SELECT table_oid, run, lsn, count(*) AS n FROM {{t}} WHERE {where}"
        " GROUP BY table_oid, run, lsn",
    )
    gold: dict[int, dict[str, Any]] = {}
    for r in house.rows("gold", "_frontier", f"SELECT * FROM {{t}} WHERE {where}") or []:
        if r["table_oid"] not in gold or gold[r["table_oid"]]["updated_at"] < r["updated_at"]:
            gold[r["table_oid"]] = r
    tables = house.rows(
        "silver",
        "_tables",
        "SELECT table_oid, table_schema, table_name, snapshot_run, snapshot_lsn FROM {t}"
        f" WHERE {where}",
    )
    if tables is not None:
        status.tables = []
        for t in sorted(tables, key=lambda t: (t["table_schema"], t["table_name"])):
            g = gold.get(t["table_oid"], {})
            n_err = sum(  # those that hold the table: older ones are history
                e["n"]
                for e in errors or []
                if e["table_oid"] == t["table_oid"]
                and holds_table(e["run"], e["lsn"], t["snapshot_run"], t["snapshot_lsn"])
            )
            status.ok = status.ok and n_err == 0
            status.tables.append(
                TableStatus(
                    f"{t['table_schema']}.{t['table_name']}",
                    g.get("rows"),
                    g.get("frontier"),
                    g.get("source_time"),
                    n_err,
                )
            )
    elif bronze is None and not house.local and spark() is None:
        status.lakehouse_note = (
            "lakehouse: PySpark is not installed here, so only the source is shown"
        )
    return status


def format_status(s: Status) -> str:
    """The report: the source, bronze, silver, then a line per table with its lag: ``lag`` is
    how long ago the source was in the state gold holds (now minus ``as of``), ``behind`` how
    many bytes of WAL the source has written since gold's frontier (all of its WAL, not only
    the published tables')."""
    lines = list(s.source)
    if s.lakehouse_note:
        return "\n".join([*lines, s.lakehouse_note])
    if s.bronze is not None:
        frontier, at = s.bronze
        text = format_lsn(frontier) if frontier is not None else "none yet"
        lines.append(f"bronze frontier: {text}{_as_of(at, s.read_at)}")
    for start, end, why in s.gaps:
        lines.append(
            f"bronze gap: changes from {format_lsn(start)} to {format_lsn(end)} were not read"
            f" ({why}); every table was snapshotted again at or after {format_lsn(end)}"
        )
    for table, landed, ranges in s.under_way:
        lines.append(
            f"snapshot under way: {table}: {landed} of {ranges} key ranges landed"
            f" ({100 * landed // max(ranges, 1)}%); the next run reads the other {ranges - landed}"
        )
    if s.silver is not None:
        run, frontier, at = s.silver
        lines.append(f"silver frontier: {format_lsn(frontier)} (run {run}){_as_of(at, s.read_at)}")
    if s.tables is not None:
        lines.append(
            f"{'table':<36} {'gold rows':>10} {'gold frontier':>15} {'as of (UTC)':>19} "
            f"{'lag':>8} {'behind':>9} {'errors':>6}"
        )
        for t in s.tables:
            lag = _seconds(t.as_of, s.read_at)
            behind = (
                _bytes(max(0, s.wal - t.frontier))
                if s.wal is not None and t.frontier is not None
                else "-"
            )
            lines.append(
                f"{t.name:<36} {'-' if t.rows is None else t.rows:>10} "
                f"{format_lsn(t.frontier) if t.frontier else '-':>15} "
                f"{t.as_of.strftime('%Y-%m-%d %H:%M:%S') if t.as_of else '-':>19} "
                f"{lag:>8} {behind:>9} {t.errors:>6}"
            )
    elif s.bronze is None:
        lines.append("nothing captured yet: run `pgmedallion run`")
    if s.schema_events:
        lines += ["schema changes and resyncs by capture (newest first):", *s.schema_events]
    return "\n".join(lines)


def status_report(spark: SparkSession | None, cfg: Config) -> tuple[str, bool]:
    """The report text, and whether everything is healthy (slot present, no errors)."""
    s = collect_status(cfg, lambda: spark, spark)
    return format_status(s), s.ok


def watch(
    cfg: Config,
    spark: Callable[[], SparkSession | None],
    interval_s: float,
    stop: threading.Event,
    out: TextIO,
    frames: int | None = None,
    clear: bool | None = None,
) -> bool:
    """``status --watch``: the report again every ``interval_s`` seconds, in place on a
    terminal (``clear``; default: when ``out`` is one; appended otherwise), until ``stop`` is
    set or ``frames`` were shown. Whether the last report was healthy."""
    ok, shown = True, 0
    clear = out.isatty() if clear is None else clear
    while not stop.is_set() and (frames is None or shown < frames):
        started = time.monotonic()
        s = collect_status(cfg, spark)
        ok = s.ok
        header = (
            f"pgmedallion status, every {interval_s:g} s ({s.read_at:%H:%M:%S} UTC; Ctrl-C ends)"
        )
        out.write(("\x1b[H\x1b[2J" if clear else "") + header + "\n" + format_status(s) + "\n\n")
        out.flush()
        shown += 1
        stop.wait(max(0.0, interval_s - (time.monotonic() - started)))
    return ok


def _as_of(at: datetime | None, now: datetime) -> str:
    return "" if at is None else f", as of {at:%Y-%m-%d %H:%M:%S} UTC ({_seconds(at, now)} ago)"


def _seconds(at: datetime | None, now: datetime) -> str:
    if at is None:
        return "-"
    s = max(0.0, (now - at).total_seconds())
    if s < 100:
        return f"{s:.1f} s"
    if s < 6000:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"


def _bytes(n: int) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"


def _schema_events(bronze: Bronze, newest: int = 10) -> list[str]:
    """The newest schema changes capture saw, and what it did: tables it snapshotted again by
    itself, with why (a schema change, a changed publication shape, partitions moved), and
    changes it followed without a new snapshot."""
    lines = []
    for r, payload in bronze.schema_events(newest=5 * newest):
        if r["table_oid"] is None:
            continue  # a gap (its own line)
        if r["kind"] == "resync":
            what = payload.get("reason") and f"{payload['reason']}: snapshotted again"
        else:
            what = f"{payload['change']}: {payload.get('done', 'followed')}"
        if what and len(lines) < newest:
            table = f"{r['table_schema']}.{r['table_name']}"
            lines.append(f"  {table} at {format_lsn(r['lsn'])}: {what}")
    return lines


def format_rows(columns: list[str], rows: list[tuple]) -> str:
    """A plain text table: header, rule, one line per row; NULL for None."""
    cells = [[("NULL" if v is None else str(v)).replace("\n", "\\n") for v in r] for r in rows]
    widths = [min(60, max([len(c)] + [len(r[i]) for r in cells])) for i, c in enumerate(columns)]
    fmt = lambda vals: " | ".join(v[:w].ljust(w) for v, w in zip(vals, widths, strict=True))  # noqa: E731
    out = [fmt(columns), "-+-".join("-" * w for w in widths)]
    out += [fmt(r) for r in cells]
    return "\n".join(out)


def print_query(spark: SparkSession, cfg: Config, query: str, *, limit: int = 100) -> None:
    from pgmedallion.gold.as_of import sql_as_of

    df = spark.sql(sql_as_of(spark, cfg, query))
    rows = df.limit(limit + 1).collect()
    more = len(rows) > limit
    print(format_rows(df.columns, [tuple(r) for r in rows[:limit]]))
    print(f"({limit}+ rows, first {limit} shown)" if more else f"({len(rows)} rows)")
