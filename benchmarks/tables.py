"""tables: what a triggered run costs with many small tables, and what it costs with nothing new.

Setup (untimed)
    ``--tables`` (default 100) tables of ``--rows`` (default 1,000) rows each in a fresh
    schema of the benchmark database, with PostgreSQL's defaults (a primary key, REPLICA
    IDENTITY DEFAULT), and a fresh bronze, silver and gold. Spark is started before any timing.

What is timed (each a whole ``run_stages`` call, capture then silver then gold, in process)
    ``first``    the first run: snapshots of every table
    ``noop``     a run with nothing new since the last one
    ``one``      a run after one changed row in one table
    ``all``      a run after one changed row in each table
    each with the seconds per stage. The goals on these machines (issue 16): ``noop`` at most
    20 s, ``one`` at most 30 s, ``all`` at most 3x ``one``, ``first`` under 2 minutes. The
    ``pgmedallion run`` command adds Spark's start (printed, measured once) and ``doctor``.

In the framework's terms the ratio is ``one`` / ``all`` (the "peer" is the run after one changed
row, "pgmedallion" the run after one changed row in every table): the goal is ``>= 0.33``.
Each run's result is checked: the changed rows reach gold, and no table is rebuilt.
"""

from __future__ import annotations

import argparse
import re
import time

from benchmarks.common import Result, Stopwatch, Timing, say
from pgmedallion.core.config import Config, LakehouseConfig, SourceConfig

NAME = "tables"
DESCRIPTION = "triggered runs over 100 tables of 1,000 rows: first, nothing new, one, all"
SCHEMA = "many"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tables", type=int, default=100, help="tables (%(default)s)")
    parser.add_argument("--rows", type=int, default=1000, help="rows per table (%(default)s)")
    parser.add_argument(
        "--processes",
        action="store_true",
        help="time whole cold `pgmedallion run` processes, as a scheduled job pays them",
    )


def _config(env) -> Config:
    info = env.conninfo
    return Config(
        source=SourceConfig(
            name="benchtables",
            host=info["host"],
            port=int(info["port"]),
            dbname=info["dbname"],
            user=info["user"],
            password=info["password"],
            publication="bench_tables",
            slot="bench_tables",
        ),
        lakehouse=LakehouseConfig(
            state_dir=str(env.state_dir),
            bronze_schema="bench_tables_bronze",
            silver_schema="bench_tables_silver",
            gold_schema="bench_tables_gold",
        ),
    )


def prepare(env, cfg: Config, tables: int, rows: int) -> None:
    spark = env.spark
    for layer in ("bronze", "silver", "gold"):
        spark.sql(f"DROP SCHEMA IF EXISTS {getattr(cfg.lakehouse, layer + '_schema')} CASCADE")
    prepare_source(env, tables, rows, "bench_tables")


def prepare_source(env, tables: int, rows: int, slot: str) -> None:
    """The tables, their rows and the publication; ``slot`` dropped."""
    with env.connect() as conn:
        conn.execute(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
            "WHERE slot_name = %s",
            (slot,),
        )
        conn.execute("DROP PUBLICATION IF EXISTS bench_tables")
        conn.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
        conn.execute(f"CREATE SCHEMA {SCHEMA}")
        for i in range(tables):
            conn.execute(
                f"CREATE TABLE {SCHEMA}.t{i:03d} (id bigint PRIMARY KEY, name text, "
                f"amount numeric(12,2), at timestamptz)"
            )
            conn.execute(
                f"INSERT INTO {SCHEMA}.t{i:03d} SELECT g, 'row ' || g, g * 1.25, "
                f"'2026-01-01'::timestamptz + g * interval '1 minute' "
                f"FROM generate_series(1, {rows}) g"
            )
        conn.execute("CREATE PUBLICATION bench_tables FOR TABLES IN SCHEMA " + SCHEMA)


def timed_run(env, cfg: Config, label: str) -> tuple[float, dict[str, float], object]:
    from pgmedallion.gold.build import run_gold
    from pgmedallion.pipeline import ensure_schemas, run_capture
    from pgmedallion.silver.build import run_silver

    spark = env.spark
    stages: dict[str, float] = {}
    start = time.monotonic()
    ensure_schemas(spark, cfg)
    t = time.monotonic()
    run_capture(spark, cfg)
    stages["capture"] = time.monotonic() - t
    t = time.monotonic()
    silver = run_silver(spark, cfg)
    stages["silver"] = time.monotonic() - t
    t = time.monotonic()
    gold = run_gold(spark, cfg)
    stages["gold"] = time.monotonic() - t
    total = time.monotonic() - start
    detail = ", ".join(f"{k} {v:.1f} s" for k, v in stages.items())
    say(f"{label}: {total:.1f} s ({detail}); silver run {silver.run}")
    return total, stages, gold


def _change(env, tables: list[int], step: int) -> None:
    with env.connect() as conn:
        for i in tables:
            conn.execute(f"UPDATE {SCHEMA}.t{i:03d} SET name = 'changed {step}' WHERE id = 1")


def _check(gold, tables: int, rows: int, changed: set[int]) -> None:
    """Every table in gold with its rows; the changed ones applied incrementally, the others
    left alone (``unchanged``: not read, not written)."""
    modes = {o.table.name: o.mode for o in gold.tables}
    if len(modes) != tables:
        raise RuntimeError(f"gold has {len(modes)} tables, expected {tables}")
    expected = {f"t{i:03d}": "incremental" if i in changed else "unchanged" for i in range(tables)}
    wrong = {n: m for n, m in modes.items() if m != expected[n]}
    if wrong:
        raise RuntimeError(f"gold modes not as expected: {dict(list(wrong.items())[:5])}")
    counts = [o.table.name for o in gold.tables if o.rows != rows]
    if counts:
        raise RuntimeError(f"tables with a wrong row count: {counts[:5]}")


GOLD_LINE = re.compile(r"^gold: many\.t\d+: (\d+) rows at \S+ \((\w+)\)$", re.M)


def _process_check(run, tables: int, rows: int, changed: set[int] | None) -> None:
    """:func:`_check` of a process's output (``changed`` None: a run with nothing new)."""
    if changed is None:
        if "nothing new" not in run.stdout:
            raise RuntimeError(f"{run.label}: not a run with nothing new: {run.tail()}")
        return
    modes = [(int(r), m) for r, m in GOLD_LINE.findall(run.stdout)]
    incremental = sum(m == "incremental" for _, m in modes)
    if len(modes) != tables or any(r != rows for r, _ in modes):
        raise RuntimeError(f"{run.label}: gold lines not as expected: {run.tail()}")
    if changed and incremental != len(changed):
        raise RuntimeError(f"{run.label}: {incremental} tables built, {len(changed)} changed")


def run_processes(args: argparse.Namespace) -> Result:
    """The same four runs as whole cold ``pgmedallion run`` processes (``--processes``):
    what a scheduled job pays, Spark's start (where a run needs it), imports and ``doctor``
    included. The goals of issue 28: nothing new at most 10 s, one changed row at most 15 s,
    one in every table at most 3x one, a first run of 100 tables at most 60 s."""
    import importlib
    import shutil

    from benchmarks.common import write_pipeline_config

    load = importlib.import_module("benchmarks.load")

    env = args.env
    slot = "bench_tables_p"
    with Stopwatch() as setup:
        prepare_source(env, args.tables, args.rows, slot)
    say(f"{args.tables} tables of {args.rows} rows created in {setup.seconds:.1f} s (untimed)")
    root = env.state_dir / "tables-processes"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    config = write_pipeline_config(
        env,
        root / "pgmedallion.toml",
        root / "lakehouse",
        source="bench_tables_p",
        publication="bench_tables",
        slot=slot,
        password_env=load.PASSWORD_ENV,
        writer=NAME,
    )
    procs = load.Processes(env, root, config, {})
    try:
        first = procs.pgmedallion("first")
        _process_check(first, args.tables, args.rows, set())
        noop = procs.pgmedallion("noop")
        _process_check(noop, args.tables, args.rows, None)
        _change(env, [0], 1)
        one = procs.pgmedallion("one")
        _process_check(one, args.tables, args.rows, {0})
        _change(env, list(range(args.tables)), 2)
        every = procs.pgmedallion("all")
        _process_check(every, args.tables, args.rows, set(range(args.tables)))
    finally:
        with env.connect() as conn:
            load.drop_slot(conn, slot)
    goals = [
        ("first run", first.seconds, 60.0),
        ("nothing new", noop.seconds, 10.0),
        ("one table", one.seconds, 15.0),
        ("all tables", every.seconds, 3 * one.seconds),
    ]
    for label, seconds, goal in goals:
        verdict = "met" if seconds <= goal else "MISSED"
        say(f"{label}: {seconds:.1f} s (goal <= {goal:.1f} s) {verdict}")
    seconds = {"first_s": first.seconds, "noop_s": noop.seconds}
    seconds |= {"one_s": one.seconds, "all_s": every.seconds}
    return Result(
        name=NAME,
        work={"runs/s": 1.0},
        ours=Timing("pgmedallion run", every.seconds),
        peer=Timing("same after a change in one table", one.seconds),
        goal=1 / 3,
        params={"tables": args.tables, "rows": args.rows, "processes": True}
        | {k: round(v, 1) for k, v in seconds.items()},
        details=seconds,
    )


def run(args: argparse.Namespace) -> Result:
    if args.processes:
        return run_processes(args)
    env = args.env
    cfg = _config(env)
    started = env.start_spark()
    say(f"Spark started in {started:.1f} s (not in the figures below)")
    with Stopwatch() as setup:
        prepare(env, cfg, args.tables, args.rows)
    say(f"{args.tables} tables of {args.rows} rows created in {setup.seconds:.1f} s (untimed)")
    first, _, gold = timed_run(env, cfg, "first run (snapshots)")
    if len(gold.tables) != args.tables:
        raise RuntimeError(f"first run: gold has {len(gold.tables)} tables")
    noop, _, gold = timed_run(env, cfg, "nothing new")
    _check(gold, args.tables, args.rows, set())
    _change(env, [0], 1)
    one, _, gold = timed_run(env, cfg, "one changed row in one table")
    _check(gold, args.tables, args.rows, {0})
    _change(env, list(range(args.tables)), 2)
    every, _, gold = timed_run(env, cfg, f"one changed row in each of {args.tables} tables")
    _check(gold, args.tables, args.rows, set(range(args.tables)))
    goals = [
        ("first run", first, 120.0),
        ("nothing new", noop, 20.0),
        ("one table", one, 30.0),
        ("all tables", every, 3 * one),
    ]
    for label, seconds, goal in goals:
        verdict = "met" if seconds <= goal else "MISSED"
        say(f"{label}: {seconds:.1f} s (goal <= {goal:.1f} s) {verdict}")
    return Result(
        name=NAME,
        work={"runs/s": 1.0},
        ours=Timing("pgmedallion", every),
        peer=Timing("same after a change in one table", one),
        goal=1 / 3,
        params={
            "tables": args.tables,
            "rows": args.rows,
            "first_s": round(first, 1),
            "noop_s": round(noop, 1),
            "one_s": round(one, 1),
            "all_s": round(every, 1),
            "spark_start_s": round(started, 1),
        },
        details={"first_s": first, "noop_s": noop, "one_s": one, "all_s": every},
    )
