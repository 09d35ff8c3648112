"""load: what a user pays: whole cold ``pgmedallion run`` processes vs. ``spark.read.jdbc``.

The other benchmarks time a stage inside a process that runs already. A scheduled job pays
more: each run is a new process that imports Python, starts a JVM, runs ``doctor``, then
capture, silver and gold. This one times exactly that, against what a Spark user would
schedule instead: a fresh process that reloads the table with ``spark.read.jdbc`` into Delta.

Setup (untimed)
    One table ``bench_load_<rows>`` of ``--rows`` rows (default 4,000,000; about 665 MB of
    ``pg_relation_size``) in the benchmark database: ``id bigint`` primary key, three ints,
    ``numeric(12,2)``, a 40-character text, ``timestamptz``, a small ``jsonb``, PostgreSQL's
    default replica identity. It is generated server-side, ``VACUUM ANALYZE``d, marked with a
    table comment and reused by a later run that finds the mark (the update waves of earlier
    runs stay in it). A publication of that table only; a fresh state directory
    ``<state dir>/load`` holding a pgmedallion config file (``pgmedallion.toml``: [source] with
    host, port, dbname, user, ``password_env``, publication, slot; [lakehouse] with the state
    directory and the three schemas). The password reaches every child process through the
    variable ``password_env`` names, never a command line. Before timing: one ``psql COPY`` of
    the table to /dev/null (the page cache), one Spark start in a throwaway process (Ivy, if
    the jars were never resolved, and the jars in the page cache), one for pgmedallion's own
    jars (each start writes its JVM class archive if there is none, see
    ``core.spark.class_archive_options``), and ``pgmedallion doctor``
    (the checks pass before anything is timed).

What is timed, each a child process from start to exit (``benchmarks.process``)
    ``jdbc first``  ``python -m benchmarks.load`` (as ``BENCH_LOAD_JDBC`` tells it): a local
                    Spark session as pgmedallion starts one (``core.spark.get_spark``, its own
                    state directory, ``packages=(POSTGRES_JDBC,)``), ``spark.read.jdbc`` on
                    ``id`` from min(id) to max(id)+1 in 2 partitions (fetchsize 10000), written
                    as a Delta table (``save`` to a path, overwrite). Its row count is checked
                    afterwards with delta-rs, untimed.
    ``jdbc 3 layers`` (``--floor`` only) the same process into a new Delta table, which it
                    then reads and writes again as a second one, and the second as a third:
                    the floor of any pipeline that lands three Delta layers through Spark (no
                    decoding, keys or bookkeeping). Each layer's row count is checked.
    ``first``       ``python -m pgmedallion.cli --config pgmedallion.toml run``: doctor, the
                    snapshot of the whole table, silver, gold.
    then an update wave, untimed: 1% of the rows (random keys, seeded), ``UPDATE ... SET b =
    <a negative marker>`` in transactions of 100 rows, committed.
    ``update``      the next ``pgmedallion run``.
    ``jdbc 3 layers update`` (``--floor`` only) the floor's process again, told the wave's
                    marker: the changed rows alone, read by ``spark.read.jdbc`` of ``WHERE b =
                    <marker>`` (what a peer that knows which rows changed reads) and cached,
                    appended to the first two layers and MERGEd into the third on ``id`` (the
                    floor's tables have deletion vectors, as gold has): the
                    floor of any update run that lands its changes in three Delta layers
                    through Spark. The third layer's sample is checked like gold's.
    ``jdbc reload`` the JDBC process again (overwriting the same Delta table).
    ``noop``        one more ``pgmedallion run``, with nothing new (``--skip-noop``: not run).
    Each must exit 0. After ``first`` and ``update`` gold (read with delta-rs from the gold
    table's directory) holds ``--rows`` rows, and after ``update`` and ``jdbc reload`` a sample
    of updated and untouched keys holds PostgreSQL's values. The peak memory of each process
    tree (JVM and Python workers included) is sampled from /proc alongside (see
    ``benchmarks.process``); ``pgmedallion run``'s own per-stage times (its stderr) are
    printed and recorded.

The goals (ratio = JDBC seconds / pgmedallion seconds, both cold processes)
    primary, the summary line: ``jdbc first / first >= 1.0``, a first load at least as fast as
    the JDBC load; and ``jdbc reload / update >= 4``, an update run at most a quarter of a JDBC
    reload (in ``details``, printed above the summary). ``noop`` seconds and the peaks are
    reported without a goal. The slot is dropped at the end (the state directory is kept for
    a look: its lakehouse cannot continue without the slot).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from psycopg import sql

from benchmarks.common import (
    MB,
    BenchEnv,
    Result,
    Stopwatch,
    Timing,
    add_engine_argument,
    drop_slot,
    format_mb,
    jdbc_url,
    say,
    write_pipeline_config,
)
from benchmarks.process import ProcessRun, run_process

NAME = "load"
DESCRIPTION = "whole cold `pgmedallion run` processes (first, update, noop) vs. spark.read.jdbc"
GOAL_FIRST = 1.0
GOAL_UPDATE = 4.0

PUBLICATION = "bench_load_pub"
SLOT = "bench_load_slot"
SOURCE = "bench_load"
SCHEMAS = {"bronze": "bench_load_bronze", "silver": "bench_load_silver", "gold": "bench_load_gold"}
PASSWORD_ENV = "BENCH_LOAD_PGPASSWORD"
JDBC_ENV = "BENCH_LOAD_JDBC"
WARM_ENV = "BENCH_LOAD_WARM"
JDBC_FETCH_SIZE = 10_000
JDBC_PARTITIONS = 2
CHUNK_ROWS = 500_000
UPDATE_FRACTION = 0.01
UPDATE_TXN_ROWS = 100
SAMPLE_KEYS = 20
SEED = 20260101
PROCESS_TIMEOUT_S = 3 * 3600
REPO = Path(__file__).resolve().parent.parent
COLUMNS = ("id", "a", "b", "c", "amount", "note", "at", "doc")
STAGE_LINE = re.compile(r"^(capture|silver|gold|marts): ([\d.]+) s$", re.MULTILINE)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rows", type=int, default=4_000_000, help="table rows (%(default)s)")
    parser.add_argument(
        "--skip-noop", action="store_true", help="do not time a last run with nothing new"
    )
    add_engine_argument(parser)
    parser.add_argument(
        "--snapshot-range-mb",
        type=float,
        default=None,
        help="[source] snapshot_range_mb (default: the configuration's; 0: the snapshot in ctid "
        "ranges, one commit, as before a snapshot could resume)",
    )
    parser.add_argument(
        "--warm",
        action="store_true",
        help="both sides in one long-lived Spark session instead of cold processes (what a "
        "job cluster that stays up gives): JDBC load, first run, update wave, run, JDBC reload, "
        "and a second wave and run",
    )
    parser.add_argument(
        "--history",
        action="store_true",
        help="then the same update run with the table keeping its history (issue 47): a run "
        "that builds the history, an update wave and run with it, a run with nothing new, and "
        "an update wave and run without it again",
    )
    parser.add_argument(
        "--floor",
        action="store_true",
        help="also time the floor of any three-layer Spark pipeline: one cold process that "
        "loads the table with spark.read.jdbc into Delta, then reads that table and writes it "
        "again as a second Delta table, and the second as a third (no decoding, keys or "
        "bookkeeping): what a first load that lands bronze, silver and gold cannot go below; "
        "and after the update wave the same process on the changed rows alone (read by JDBC, "
        "appended to two layers, MERGEd into the third): what an update run cannot go below",
    )
    parser.add_argument(
        "--migrations",
        action="store_true",
        help="then time the run after each of six schema migrations (followed in place) and "
        "one after `pgmedallion resync` (a new snapshot, what a migration cost before)",
    )


def table_name(rows: int) -> str:
    return f"bench_load_{rows}"


def run(args: argparse.Namespace) -> Result:
    env: BenchEnv = args.env
    if args.rows < 100:
        raise ValueError("need --rows >= 100")
    name = table_name(args.rows)
    root = env.state_dir / "load"
    table = published_table(env, name, args.rows, PUBLICATION, SLOT)
    say(
        f"table public.{name}: {table['rows']} rows, {table['bytes'] / MB:.1f} MB "
        f"(pg_relation_size), ids {table['min_id']}..{table['max_id']}"
    )
    shutil.rmtree(root, ignore_errors=True)  # a fresh lakehouse, metastore and JDBC target
    root.mkdir(parents=True)
    lake = root / "lakehouse"
    config = write_pipeline_config(
        env,
        root / "pgmedallion.toml",
        lake,
        source=SOURCE,
        publication=PUBLICATION,
        slot=SLOT,
        password_env=PASSWORD_ENV,
        writer=NAME,
        engine=args.engine,
        source_settings=(
            {} if args.snapshot_range_mb is None else {"snapshot_range_mb": args.snapshot_range_mb}
        ),
    )
    say(f"pgmedallion's engine: {args.engine}")
    gold_schema_dir = lake / "warehouse" / f"{SCHEMAS['gold']}.db"
    jdbc_path = root / "jdbc-delta" / name
    job = {
        "conninfo": {k: v for k, v in env.conninfo.items() if k != "password"},
        "table": f"public.{name}",
        "lower": table["min_id"],
        "upper": table["max_id"] + 1,
        "partitions": JDBC_PARTITIONS,
        "path": str(jdbc_path),
        "state_dir": str(root / "jdbc-spark"),
    }
    procs = Processes(env, root, config, job)
    if args.warm:
        try:
            return warm_session(args, env, procs, name, table, gold_schema_dir)
        finally:
            with env.connect() as conn:
                drop_slot(conn, SLOT)
    try:
        warm = warm_up(env, procs, name)
        ours, peer = {}, {}

        peer["first"] = procs.jdbc("jdbc-first")
        check_jdbc(jdbc_path, table["rows"])
        if args.floor:
            peer["floor"] = procs.jdbc("jdbc-3-layers", layers=FLOOR_LAYERS)
            for layer in range(1, FLOOR_LAYERS + 1):
                check_jdbc(layer_path(jdbc_path, layer), table["rows"])
        ours["first"] = procs.pgmedallion("first")
        check_first(ours["first"], name, table["rows"])
        gold_path = gold_table_dir(gold_schema_dir)
        check_gold_count(gold_path, table["rows"])

        wave = update_wave(env, name, table, SEED + int(time.time()))
        ours["update"] = procs.pgmedallion("update")
        check_gold_count(gold_path, table["rows"])
        check_sample(env, name, gold_path, wave, "gold")
        if args.floor:
            changes = f"b = {int(wave['marker'])}"
            peer["floor_update"] = procs.jdbc(
                "jdbc-3-layers-update", layers=FLOOR_LAYERS, changes=changes
            )
            top = layer_path(jdbc_path, FLOOR_LAYERS)
            check_jdbc(top, table["rows"])
            check_sample(env, name, top, wave, "the floor's third layer")
        peer["reload"] = procs.jdbc("jdbc-reload")
        check_jdbc(jdbc_path, table["rows"])
        check_sample(env, name, jdbc_path, wave, "the JDBC table")
        if not args.skip_noop:
            ours["noop"] = procs.pgmedallion("noop")
        if args.history:
            with_history(env, procs, name, table, gold_path, ours, args.skip_noop)
        if args.migrations:
            migrate(env, procs, name, table, gold_path, ours)
    finally:
        with env.connect() as conn:
            drop_slot(conn, SLOT)
    return report(args, table, ours, peer, warm, wave)


HISTORY_ENV = "PGMEDALLION_LAKEHOUSE_HISTORY"


def with_history(
    env: BenchEnv,
    procs: Processes,
    name: str,
    table: dict[str, int],
    gold_path: Path,
    ours: dict[str, ProcessRun],
    skip_noop: bool,
) -> None:
    """``--history``: the table keeps its history from a run on (``history-build``: the
    versions of its current rows), then an update wave and run with it (``update-history``), a
    run with nothing new (``noop-history``), and an update wave and run without it again
    (``update-again``: the same work without history, later in the same run)."""
    procs.ours_env[HISTORY_ENV] = "true"
    try:
        ours["history-build"] = procs.pgmedallion("history-build")
        wave = update_wave(env, name, table, SEED + 1 + int(time.time()))
        ours["update-history"] = procs.pgmedallion("update-history")
        check_gold_count(gold_path, table["rows"])
        check_sample(env, name, gold_path, wave, "gold")
        if not skip_noop:
            ours["noop-history"] = procs.pgmedallion("noop-history")
    finally:
        procs.ours_env.pop(HISTORY_ENV, None)
    wave = update_wave(env, name, table, SEED + 2 + int(time.time()))
    ours["update-again"] = procs.pgmedallion("update-again")
    check_sample(env, name, gold_path, wave, "gold")


class Processes:
    """The commands the benchmark times, with their environments."""

    def __init__(self, env: BenchEnv, root: Path, config: Path, job: dict[str, Any]) -> None:
        self.root, self.config, self.job = root, config, job
        base = {k: v for k, v in os.environ.items() if not _overrides_config(k)}
        base[PASSWORD_ENV] = env.conninfo["password"]
        self.ours_env = base
        python_path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
        self.peer_env = {**base, "PYTHONPATH": python_path}

    def pgmedallion(self, label: str, command: str = "run") -> ProcessRun:
        argv = [
            sys.executable,
            "-m",
            "pgmedallion.cli",
            "--config",
            str(self.config),
            *command.split(),
        ]
        return self._run(argv, label, self.ours_env, self.root)

    def jdbc(
        self,
        label: str,
        *,
        start_only: bool = False,
        packages: bool = True,
        layers: int = 1,
        changes: str | None = None,
    ) -> ProcessRun:
        job = {
            **self.job,
            "start_only": start_only,
            "packages": packages,
            "layers": layers,
            "changes": changes,
        }
        spark_dir = Path(job["state_dir"])
        spark_dir.mkdir(parents=True, exist_ok=True)
        environ = {**self.peer_env, JDBC_ENV: json.dumps(job)}
        return self._run([sys.executable, "-m", "benchmarks.load"], label, environ, spark_dir)

    def _run(self, argv: list[str], label: str, environ: dict, cwd: Path) -> ProcessRun:
        run = run_process(
            argv,
            label=label,
            env=environ,
            cwd=cwd,
            log_dir=self.root / "logs",
            timeout=PROCESS_TIMEOUT_S,
        ).check()
        stages = stage_seconds(run)
        shown = ", ".join(f"{k} {v:.1f} s" for k, v in stages.items())
        say(
            f"{label}: {run.seconds:.1f} s{f' ({shown})' if shown else ''}; peak RSS: tree "
            f"{_mb(run.tree_peak_kib)}, largest process {_mb(run.largest_kib)}, "
            f"{run.processes} processes"
            + (f", {run.stragglers} killed after it exited" if run.stragglers else "")
            + f"; CPU {cpu_shown(run)}"
        )
        return run


def _overrides_config(variable: str) -> bool:
    """libpq's PG* variables and ``PGMEDALLION_SOURCE_*``/``_LAKEHOUSE_*`` would change what
    the config file says; ``PGMEDALLION_SPARK_*`` apply to both sides alike and stay."""
    if variable.startswith("PGMEDALLION_"):
        return variable.startswith(("PGMEDALLION_SOURCE_", "PGMEDALLION_LAKEHOUSE_"))
    return variable.startswith("PG")


def cpu_shown(run: ProcessRun) -> str:
    """``125.4 s (JIT compilers 40.6 s, ...)``: the process tree's CPU time by part."""
    parts = dict(run.cpu_seconds)
    total = parts.pop("total", 0.0)
    return f"{total:.1f} s (" + ", ".join(f"{k} {v:.1f} s" for k, v in parts.items() if v) + ")"


def stage_seconds(run: ProcessRun) -> dict[str, float]:
    """The per-stage times ``pgmedallion run`` prints on stderr (``capture: 12.3 s``)."""
    return {m[1]: float(m[2]) for m in STAGE_LINE.finditer(run.stderr)}


def _mb(kib: int) -> str:
    return format_mb(kib * 1024 / MB)


# ---------------------------------------------------------------------------------------------
# Setup


def published_table(env: BenchEnv, name: str, rows: int, publication: str, slot: str) -> dict:
    """The benchmark table (:func:`ensure_table`) alone in ``publication`` (made anew), with
    ``slot`` dropped so that the next capture starts from a new one."""
    with env.connect() as conn:
        drop_slot(conn, slot)
        table = ensure_table(conn, name, rows)
        conn.execute(sql.SQL("DROP PUBLICATION IF EXISTS {}").format(sql.Identifier(publication)))
        conn.execute(
            sql.SQL("CREATE PUBLICATION {} FOR TABLE {}").format(
                sql.Identifier(publication), sql.Identifier("public", name)
            )
        )
    return table


def ensure_table(conn, name: str, rows: int) -> dict[str, int]:
    """The benchmark table of ``rows`` rows: reused when its mark says it is complete."""
    ident = sql.Identifier(name)
    mark = f"pgmedallion load benchmark table: {rows} rows, complete"
    if _comment(conn, name) != mark:
        say(f"building public.{name} ({rows} rows, server-side) ...")
        with Stopwatch() as watch:
            build_table(conn, ident, rows)
            conn.execute(sql.SQL("COMMENT ON TABLE {} IS {}").format(ident, sql.Literal(mark)))
        say(f"built in {watch.seconds:.1f} s")
    size, count, low, high = conn.execute(
        sql.SQL(
            "SELECT pg_relation_size({name}::regclass), count(*), min(id), max(id) FROM {table}"
        ).format(name=sql.Literal(name), table=ident)
    ).fetchone()
    if count != rows:
        raise RuntimeError(f"public.{name} holds {count} rows, not {rows}")
    return {"bytes": size, "rows": count, "min_id": low, "max_id": high}


def build_table(conn, ident: sql.Identifier, rows: int) -> None:
    conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(ident))
    conn.execute(
        sql.SQL(
            "CREATE TABLE {} (id bigint NOT NULL, a int, b int, c int, amount numeric(12,2),"
            " note text, at timestamptz, doc jsonb)"
        ).format(ident)
    )
    for first in range(1, rows + 1, CHUNK_ROWS):
        last = min(rows, first + CHUNK_ROWS - 1)
        conn.execute(
            sql.SQL(
                "INSERT INTO {} SELECT g, (g % 1000)::int, ((g * 7) % 100000)::int,"
                " (g % 7)::int, ((g % 10000000) / 100.0)::numeric(12,2),"
                " md5(g::text) || lpad(g::text, 8, '0'),"
                " timestamptz '2024-01-01 00:00:00+00' + g * interval '1 second',"
                " jsonb_build_object('k', g, 'tag', 'tag' || (g % 100), 'ok', g % 2 = 0)"
                " FROM generate_series({}::int8, {}::int8) g"
            ).format(ident, sql.Literal(first), sql.Literal(last))
        )
    conn.execute(sql.SQL("ALTER TABLE {} ADD PRIMARY KEY (id)").format(ident))
    conn.execute(sql.SQL("VACUUM ANALYZE {}").format(ident))


MIGRATIONS = (
    (  # first: a swap is read by position while no column was added or dropped
        "swap",
        "ALTER TABLE {t} RENAME COLUMN a TO tmp; ALTER TABLE {t} RENAME COLUMN c TO a;"
        " ALTER TABLE {t} RENAME COLUMN tmp TO c",
        "c",
    ),
    ("add_default", "ALTER TABLE {t} ADD COLUMN m1 int DEFAULT 1 NOT NULL", "m1"),
    ("rename", "ALTER TABLE {t} RENAME COLUMN note TO remark", "remark"),
    ("drop", "ALTER TABLE {t} DROP COLUMN at", None),
    ("widen", "ALTER TABLE {t} ALTER COLUMN b TYPE bigint", None),
    ("key", "ALTER TABLE {t} DROP CONSTRAINT {k}, ADD PRIMARY KEY (id, a)", None),
)
"""``--migrations``: (label, DDL statements separated by ``;``, a column gold must then
have). ``{t}``: the table, ``{k}``: its primary key constraint."""


def migrate(
    env: BenchEnv,
    procs: Processes,
    name: str,
    table: dict[str, int],
    gold_path: Path,
    ours: dict[str, ProcessRun],
) -> None:
    """Each migration, then 100 updated rows (the stream then carries the new Relation), then a
    timed ``pgmedallion run``: gold holds every row, with the new columns. Then ``pgmedallion
    resync`` (a request only) and a timed run: the new snapshot every one of these cost before
    they were followed in place. ``pgmedallion verify`` (untimed) must end exact. The table's
    mark is cleared, so the next ``load`` builds it again."""
    ident = sql.Identifier("public", name)
    try:
        for label, ddl, column in MIGRATIONS:
            with env.connect() as conn:
                key = sql.Identifier(f"{name}_pkey").as_string(conn)
                for statement in ddl.format(t=ident.as_string(conn), k=key).split(";"):
                    conn.execute(statement)
                conn.execute(
                    sql.SQL("UPDATE {} SET b = -b WHERE id <= {}").format(
                        ident, sql.Literal(table["min_id"] + 99)
                    )
                )
            ours[label] = procs.pgmedallion(label)
            check_gold_count(gold_path, table["rows"])
            names = [f.name for f in _delta_query(gold_path, "SELECT * FROM t LIMIT 0").schema]
            if column is not None and column not in names:
                raise RuntimeError(f"gold has no column {column} after {label}: {names}")
        procs.pgmedallion("resync-request", f"resync --request-only public.{name}")
        ours["resync"] = procs.pgmedallion("resync")
        check_gold_count(gold_path, table["rows"])
        procs.pgmedallion("verify", "verify")
    finally:
        with env.connect() as conn:
            conn.execute(sql.SQL("COMMENT ON TABLE {} IS NULL").format(ident))


def _comment(conn, name: str) -> str | None:
    return conn.execute(
        "SELECT obj_description(to_regclass(%s), 'pg_class')", (f"public.{name}",)
    ).fetchone()[0]


def warm_up(env: BenchEnv, procs: Processes, name: str) -> dict[str, float]:
    """Untimed: the table in the page cache, the Spark jars resolved and read once (and the
    JVM's class archive of each jar set written), the source's checks passed."""
    from pgmedallion.core.spark import POSTGRES_JDBC, delta_package, resolved_jars

    warm: dict[str, float] = {}
    query = f"COPY (SELECT * FROM public.{name}) TO STDOUT"
    with Stopwatch() as watch:
        subprocess.run(
            [str(env.client("psql")), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-c", query],
            env=env.client_env(),
            stdout=subprocess.DEVNULL,
            check=True,
        )
    warm["psql_copy_s"] = watch.seconds
    say(f"warm-up: psql COPY of the table to /dev/null in {watch.seconds:.1f} s (untimed)")
    # pgmedallion's own jar set: resolved if it never was, and (as for the JDBC set below) the
    # JVM's class archive written, which every later start of that set uses
    # (``core.spark.class_archive_options``): the timed runs are the runs of every day after.
    run = procs.jdbc("warmup-delta-jars", start_only=True, packages=False)
    warm["spark_delta_start_s"] = run.seconds
    packages = ",".join((delta_package(), POSTGRES_JDBC))
    resolved = resolved_jars(packages) is not None
    run = procs.jdbc("warmup-spark", start_only=True)
    warm["spark_start_s"] = run.seconds
    if not resolved:
        say("(that start resolved the JDBC driver with Ivy: the timed ones will not)")
    run = procs.pgmedallion("warmup-doctor", "doctor")
    warm["doctor_s"] = run.seconds
    return warm


def update_wave(env: BenchEnv, name: str, table: dict[str, int], seed: int) -> dict[str, Any]:
    """1% of the rows, random keys: ``b`` set to a negative marker no generated row holds, in
    transactions of :data:`UPDATE_TXN_ROWS` rows."""
    rng = random.Random(seed)
    count = max(1, int(table["rows"] * UPDATE_FRACTION))
    keys = rng.sample(range(table["min_id"], table["max_id"] + 1), count)
    marker = -1 - seed % 1_000_000_000
    statement = sql.SQL("UPDATE {} SET b = %s WHERE id = ANY(%s)").format(
        sql.Identifier("public", name)
    )
    with env.connect() as conn, Stopwatch() as watch:
        updated = 0
        for i in range(0, count, UPDATE_TXN_ROWS):
            with conn.transaction():
                cur = conn.execute(statement, (marker, keys[i : i + UPDATE_TXN_ROWS]))
                updated += cur.rowcount
    if updated != count:
        raise RuntimeError(f"the update wave updated {updated} rows, not {count}")
    say(
        f"update wave: {count} rows ({UPDATE_FRACTION:.0%}) in "
        f"{-(-count // UPDATE_TXN_ROWS)} transactions, {watch.seconds:.1f} s (untimed)"
    )
    untouched = set(keys)
    others = []
    while len(others) < min(SAMPLE_KEYS, table["rows"] - count):
        key = rng.randint(table["min_id"], table["max_id"])
        if key not in untouched:
            others.append(key)
            untouched.add(key)
    return {
        "rows": count,
        "marker": marker,
        "updated_sample": keys[:SAMPLE_KEYS],
        "other_sample": others,
        "seconds": watch.seconds,
    }


# ---------------------------------------------------------------------------------------------
# Checks (untimed)


def _delta_query(path: Path, query: str):
    import pyarrow as pa
    from deltalake import DeltaTable, QueryBuilder

    reader = QueryBuilder().register("t", DeltaTable(str(path))).execute(query)
    return pa.RecordBatchReader.from_stream(reader).read_all()


def check_first(run: ProcessRun, name: str, rows: int) -> None:
    snap = re.search(rf"^capture: snapshot public\.{name}: (\d+) rows", run.stdout, re.MULTILINE)
    if snap is None or int(snap[1]) != rows:
        raise RuntimeError(f"the first run did not snapshot {rows} rows of public.{name}")


def gold_table_dir(schema_dir: Path) -> Path:
    """The directory of the one gold table in the gold schema's (the others, ``_frontier``
    and ``_quality``, begin with ``_``)."""
    found = [d for d in schema_dir.iterdir() if d.is_dir() and not d.name.startswith(("_", "."))]
    if len(found) != 1 or not (found[0] / "_delta_log").is_dir():
        raise RuntimeError(f"not one gold table in {schema_dir}: {sorted(d.name for d in found)}")
    return found[0]


def check_gold_count(path: Path, rows: int) -> None:
    [n] = _delta_query(path, "SELECT count(*) AS n FROM t").column("n").to_pylist()
    if n != rows:
        raise RuntimeError(f"gold at {path} holds {n} rows, not {rows}")


def check_jdbc(path: Path, rows: int) -> None:
    [n] = _delta_query(path, "SELECT count(*) AS n FROM t").column("n").to_pylist()
    if n != rows:
        raise RuntimeError(f"spark.read.jdbc landed {n} rows of {rows} at {path}")


def check_sample(env: BenchEnv, name: str, path: Path, wave: dict[str, Any], what: str) -> None:
    """The sampled keys hold PostgreSQL's values of ``b`` (the marker for the updated ones)."""
    keys = [*wave["updated_sample"], *wave["other_sample"]]
    with env.connect() as conn:
        source = dict(
            conn.execute(
                sql.SQL("SELECT id, b FROM {} WHERE id = ANY(%s)").format(
                    sql.Identifier("public", name)
                ),
                (keys,),
            ).fetchall()
        )
    listed = ", ".join(str(int(k)) for k in keys)
    found = _delta_query(path, f"SELECT id, b FROM t WHERE id IN ({listed})").to_pylist()
    lake = {r["id"]: r["b"] for r in found}
    wrong = {k: (lake.get(k), source.get(k)) for k in keys if lake.get(k) != source.get(k)}
    stale = [k for k in wave["updated_sample"] if source.get(k) != wave["marker"]]
    if wrong or stale:
        raise RuntimeError(
            f"{what} does not hold the source's values: (lake, source) by id "
            f"{dict(list(wrong.items())[:5])}; updated in the source but not marked: {stale[:5]}"
        )


# ---------------------------------------------------------------------------------------------
# The result


def report(
    args: argparse.Namespace,
    table: dict[str, int],
    ours: dict[str, ProcessRun],
    peer: dict[str, ProcessRun],
    warm: dict[str, float],
    wave: dict[str, Any],
) -> Result:
    first, update, noop = ours["first"], ours["update"], ours.get("noop")
    jdbc_first, jdbc_reload = peer["first"], peer["reload"]
    first_ratio = jdbc_first.seconds / first.seconds
    update_ratio = jdbc_reload.seconds / update.seconds

    def verdict(ratio: float, goal: float) -> str:
        return "met" if ratio >= goal else "MISSED"

    say(
        f"first load: pgmedallion run {first.seconds:.1f} s, JDBC load {jdbc_first.seconds:.1f} s:"
        f" ratio {first_ratio:.2f} (goal >= {GOAL_FIRST:g}) {verdict(first_ratio, GOAL_FIRST)}"
    )
    say(
        f"update run ({wave['rows']} rows changed): pgmedallion run {update.seconds:.1f} s, "
        f"JDBC reload {jdbc_reload.seconds:.1f} s: ratio {update_ratio:.2f} "
        f"(goal >= {GOAL_UPDATE:g}) {verdict(update_ratio, GOAL_UPDATE)}"
    )
    if noop is not None:
        say(f"nothing new: pgmedallion run {noop.seconds:.1f} s")
    floor = peer.get("floor")
    if floor is not None:
        say(
            f"floor of a three-layer Spark pipeline (JDBC load, then two more Delta layers, one "
            f"cold process): {floor.seconds:.1f} s; pgmedallion's first run is "
            f"{first.seconds / floor.seconds:.2f}x it; the best first-load ratio such a pipeline "
            f"reaches here: {jdbc_first.seconds / floor.seconds:.2f}"
        )
    floor_update = peer.get("floor_update")
    if floor_update is not None:
        say(
            f"floor of a three-layer Spark update run (the changed rows by JDBC, appended to two "
            f"Delta layers and MERGEd into the third, one cold process): "
            f"{floor_update.seconds:.1f} s; pgmedallion's update run is "
            f"{update.seconds / floor_update.seconds:.2f}x it; the best update ratio such a "
            f"pipeline reaches here: {jdbc_reload.seconds / floor_update.seconds:.2f}"
        )
    for label, *_ in MIGRATIONS:
        if label in ours:
            say(
                f"after migration {label}: pgmedallion run {ours[label].seconds:.1f} s, "
                f"JDBC reload {jdbc_reload.seconds:.1f} s: ratio "
                f"{jdbc_reload.seconds / ours[label].seconds:.2f}"
            )
    if "resync" in ours:
        say(f"a new snapshot (pgmedallion resync, then run): {ours['resync'].seconds:.1f} s")
    history = {}
    if "update-history" in ours:
        plain = (update.seconds + ours["update-again"].seconds) / 2
        history = {
            "build_s": round(ours["history-build"].seconds, 2),
            "update_s": round(ours["update-history"].seconds, 2),
            "update_again_s": round(ours["update-again"].seconds, 2),
            "noop_s": round(ours["noop-history"].seconds, 2) if "noop-history" in ours else None,
            "added": round(ours["update-history"].seconds / plain - 1, 3),
        }
        say(
            f"history: building it {history['build_s']:.1f} s; the update run with it "
            f"{history['update_s']:.1f} s against {update.seconds:.1f} s and "
            f"{ours['update-again'].seconds:.1f} s without: {100 * history['added']:+.0f}% "
            "(goal <= +20%)"
            + (f"; nothing new {history['noop_s']:.1f} s" if history["noop_s"] else "")
        )
    runs = {**{k: v for k, v in ours.items()}, **{f"jdbc_{k}": v for k, v in peer.items()}}
    say(
        "peak RSS of the process trees: "
        + ", ".join(f"{k} {_mb(v.tree_peak_kib)}" for k, v in runs.items())
    )
    return Result(
        name=NAME,
        work={"MB/s": table["bytes"] / MB, "krows/s": table["rows"] / 1000},
        ours=Timing("pgmedallion", first.seconds),
        peer=Timing("spark.read.jdbc", jdbc_first.seconds),
        goal=GOAL_FIRST,
        params={
            "rows": args.rows,
            "snapshot_range_mb": args.snapshot_range_mb,
            "skip_noop": args.skip_noop,
            "migrations": args.migrations,
            "history": args.history,
            "floor": args.floor,
        },
        details={
            "table": table_name(args.rows),
            "table_bytes": table["bytes"],
            "first_s": round(first.seconds, 2),
            "update_s": round(update.seconds, 2),
            "noop_s": None if noop is None else round(noop.seconds, 2),
            "migrations_s": {
                label: round(ours[label].seconds, 2)
                for label in [m[0] for m in MIGRATIONS] + ["resync"]
                if label in ours
            },
            "history": history or None,
            "jdbc_first_s": round(jdbc_first.seconds, 2),
            "jdbc_reload_s": round(jdbc_reload.seconds, 2),
            "floor_s": None if floor is None else round(floor.seconds, 2),
            "floor_update_s": None if floor_update is None else round(floor_update.seconds, 2),
            "first_ratio": round(first_ratio, 3),
            "update_ratio": round(update_ratio, 3),
            "update_goal": GOAL_UPDATE,
            "update_goal_met": update_ratio >= GOAL_UPDATE,
            "updated_rows": wave["rows"],
            "update_wave_s": round(wave["seconds"], 2),
            "stages_s": {k: stage_seconds(v) for k, v in ours.items()},
            "peak_rss_tree_kib": {k: v.tree_peak_kib for k, v in runs.items()},
            "peak_rss_largest_process_kib": {k: v.largest_kib for k, v in runs.items()},
            "cpu_seconds": {k: dict(v.cpu_seconds) for k, v in runs.items()},
            "wait4_maxrss_kib": {k: v.wait4_maxrss_kib for k, v in runs.items()},
            "peer_inside_s": {k: _peer_inside(v) for k, v in peer.items()},
            "warmup_s": {k: round(v, 2) for k, v in warm.items()},
        },
    )


def warm_session(
    args, env: BenchEnv, procs: Processes, name: str, table, gold_schema_dir
) -> Result:
    """``--warm``: one child process holds one Spark session for both sides (the JDBC load
    into its Delta path, ``pgmedallion.pipeline.run`` on the lakehouse) and times each step it
    is told to take; the update waves are made here between steps, as in the cold runs."""
    environ = {**procs.peer_env, WARM_ENV: json.dumps({**procs.job, "config": str(procs.config)})}
    child = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.load"],
        env=environ,
        cwd=procs.root,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    timings: dict[str, float] = {}

    def step(command: str, label: str) -> float:
        child.stdin.write(f"{command}\n")
        child.stdin.flush()
        line = child.stdout.readline()
        if not line:
            raise RuntimeError(f"the warm session ended during {label} (exit {child.wait()})")
        seconds = json.loads(line)["seconds"]
        timings[label] = seconds
        say(f"{label} (warm): {seconds:.1f} s")
        return seconds

    try:
        say(f"warm session: Spark started in {step('start', 'start'):.1f} s (untimed)")
        step("jdbc", "jdbc_first")
        step("run", "first")
        gold_path = gold_table_dir(gold_schema_dir)
        check_gold_count(gold_path, table["rows"])
        waves = []
        for n, (run_label, jdbc_label) in enumerate(
            (("update", "jdbc_reload"), ("update_again", "jdbc_reload_again"))
        ):
            waves.append(update_wave(env, name, table, SEED + n + int(time.time())))
            step("run", run_label)
            check_gold_count(gold_path, table["rows"])
            check_sample(env, name, gold_path, waves[-1], "gold")
            step("jdbc", jdbc_label)
        child.stdin.write("quit\n")
        child.stdin.flush()
        if child.wait(timeout=600) != 0:
            raise RuntimeError(f"the warm session exited {child.returncode}")
    finally:
        if child.poll() is None:
            child.kill()
    first = timings["jdbc_first"] / timings["first"]
    updates = [
        timings["jdbc_reload"] / timings["update"],
        timings["jdbc_reload_again"] / timings["update_again"],
    ]
    say(
        f"warm, one Spark session: first load {timings['first']:.1f} s vs JDBC "
        f"{timings['jdbc_first']:.1f} s: ratio {first:.2f}; update runs {timings['update']:.1f} s "
        f"and {timings['update_again']:.1f} s vs JDBC reloads {timings['jdbc_reload']:.1f} s and "
        f"{timings['jdbc_reload_again']:.1f} s: ratios {updates[0]:.2f} and {updates[1]:.2f} "
        f"(goal >= {GOAL_UPDATE:g})"
    )
    return Result(
        name=NAME,
        work={"MB/s": table["bytes"] / MB, "krows/s": table["rows"] / 1000},
        ours=Timing("pgmedallion", timings["first"]),
        peer=Timing("spark.read.jdbc", timings["jdbc_first"]),
        goal=GOAL_FIRST,
        params={"rows": args.rows, "warm": True, "engine": args.engine},
        details={
            "table": table_name(args.rows),
            "warm_s": {k: round(v, 2) for k, v in timings.items()},
            "first_ratio": round(first, 3),
            "update_ratios": [round(u, 3) for u in updates],
            "updated_rows": [w["rows"] for w in waves],
        },
    )


def _warm_child() -> int:
    """``--warm``'s process: one Spark session (pgmedallion's, with the JDBC driver); each line
    of stdin is a step (``start``, ``jdbc``, ``run``, ``quit``), answered by one JSON line
    with its seconds."""
    from pgmedallion.core.config import load_config
    from pgmedallion.core.spark import POSTGRES_JDBC, get_spark
    from pgmedallion.pipeline import run as run_pipeline

    job = json.loads(os.environ[WARM_ENV])
    cfg = load_config(job["config"])
    # the answers on a stdout of their own: whatever else writes to fd 1 (the JVM, logging)
    # goes to stderr
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    spark = None
    for line in sys.stdin:
        command = line.strip()
        if command == "quit":
            return 0
        t = time.perf_counter()
        if command == "start":
            spark = get_spark(cfg.state_dir, packages=(POSTGRES_JDBC,))
        elif command == "jdbc":
            _jdbc_load(spark, job)
        elif command == "run":
            run_pipeline(cfg)
        else:
            raise ValueError(f"unknown step {command!r}")
        print(json.dumps({"seconds": time.perf_counter() - t}), file=answers, flush=True)
    return 0


def _peer_inside(run: ProcessRun) -> dict[str, float] | None:
    """What the JDBC process reported of its own time (Spark's start, the read and write)."""
    lines = [line for line in run.stdout.splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else None


# ---------------------------------------------------------------------------------------------
# The peer's process: python -m benchmarks.load, its job in BENCH_LOAD_JDBC


def _jdbc_child() -> int:
    """Start Spark as pgmedallion does, read the table with ``spark.read.jdbc`` and write it as
    Delta (overwrite); print its own timings as JSON. ``start_only``: only start Spark."""
    started = time.perf_counter()
    from pgmedallion.core.spark import POSTGRES_JDBC, get_spark

    job = json.loads(os.environ[JDBC_ENV])
    packages = (POSTGRES_JDBC,) if job.get("packages", True) else ()
    spark = get_spark(job["state_dir"], packages=packages)
    spark_s = time.perf_counter() - started
    if job.get("start_only"):
        print(json.dumps({"spark_start_s": round(spark_s, 2)}))
        return 0
    layers, base = job.get("layers", 1), Path(job["path"])
    if layers > 1:  # the floor's tables take deletion vectors, as gold's do (a cheaper MERGE)
        spark.conf.set("spark.databricks.delta.properties.defaults.enableDeletionVectors", "true")
    if job.get("changes"):
        timings = {"spark_start_s": spark_s, **_floor_update(spark, job, layers, base)}
        print(json.dumps({k: round(v, 2) for k, v in timings.items()}))
        return 0
    if layers > 1:  # every layer a new table, as a first load writes them
        job = {**job, "path": str(layer_path(base, 1))}
    t = time.perf_counter()
    _jdbc_load(spark, job)
    timings = {"spark_start_s": spark_s, "read_write_s": time.perf_counter() - t}
    for layer in range(2, layers + 1):
        t = time.perf_counter()
        below, here = (str(layer_path(base, n)) for n in (layer - 1, layer))
        spark.read.format("delta").load(below).write.format("delta").mode("overwrite").save(here)
        timings[f"layer{layer}_s"] = time.perf_counter() - t
    print(json.dumps({k: round(v, 2) for k, v in timings.items()}))
    return 0


FLOOR_LAYERS = 3


def layer_path(path: Path, layer: int) -> Path:
    """The ``--floor`` process's Delta table of ``layer`` (beside the JDBC load's own)."""
    return path.with_name(f"{path.name}_layer{layer}")


def _floor_update(spark, job: dict, layers: int, base: Path) -> dict[str, float]:
    """The update floor's work: the rows ``job["changes"]`` selects, read once by JDBC and
    cached, appended to every layer but the last and MERGEd into the last on ``id``."""
    from delta.tables import DeltaTable

    info = job["conninfo"]
    t = time.perf_counter()
    query = f"(SELECT * FROM {job['table']} WHERE {job['changes']}) AS changes"
    changes = spark.read.jdbc(jdbc_url(info), query, properties=_jdbc_properties(info)).cache()
    rows = changes.count()
    timings = {"read_changes_s": time.perf_counter() - t}
    for layer in range(1, layers):
        t = time.perf_counter()
        changes.write.format("delta").mode("append").save(str(layer_path(base, layer)))
        timings[f"layer{layer}_s"] = time.perf_counter() - t
    t = time.perf_counter()
    top = DeltaTable.forPath(spark, str(layer_path(base, layers)))
    (
        top.alias("t")
        .merge(changes.alias("s"), "t.id = s.id")
        .whenMatchedUpdateAll()
        .whenNotMatchedInsertAll()
        .execute()
    )
    timings[f"layer{layers}_merge_s"] = time.perf_counter() - t
    timings["changed_rows"] = rows
    return timings


def _jdbc_load(spark, job: dict) -> None:
    """The peer's work: ``spark.read.jdbc`` of the table, written as Delta (overwrite)."""
    info = job["conninfo"]
    frame = spark.read.jdbc(
        jdbc_url(info),
        job["table"],
        column="id",
        lowerBound=job["lower"],
        upperBound=job["upper"],
        numPartitions=job["partitions"],
        properties=_jdbc_properties(info),
    )
    frame.write.format("delta").mode("overwrite").save(job["path"])


def _jdbc_properties(info: dict) -> dict[str, str]:
    """The JDBC connection's properties (the password from the environment, never the job)."""
    return {
        "user": info["user"],
        "password": os.environ[PASSWORD_ENV],
        "driver": "org.postgresql.Driver",
        "fetchsize": str(JDBC_FETCH_SIZE),
    }


if __name__ == "__main__":
    sys.exit(_warm_child() if WARM_ENV in os.environ else _jdbc_child())
