"""The ``pgmedallion`` command."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from pathlib import Path

from pgmedallion.core import engine
from pgmedallion.core.config import Config, ConfigError, load_config, on_databricks
from pgmedallion.core.errors import PipelineError

log = logging.getLogger("pgmedallion")


def _local_pg(config: Config):
    from pgmedallion.localpg import LocalPostgres

    return LocalPostgres(config.state_dir / "postgres")


def cmd_postgres(config: Config, args: argparse.Namespace) -> int:
    pg = _local_pg(config)
    if args.action == "start":
        pg.start()
        print(f"PostgreSQL {pg.major} running on 127.0.0.1:{pg.port} (data: {pg.data})")
        print(f"password file: {pg.root / 'password'}")
    elif args.action == "stop":
        pg.stop()
        print("stopped")
    elif args.action == "status":
        running = pg.is_running()
        print(
            f"PostgreSQL {pg.major}: "
            + (f"running on 127.0.0.1:{pg.port}" if running else "stopped")
        )
        return 0 if running else 3
    elif args.action == "env":
        pg.start()
        for key, value in pg.env().items():
            if key != "PGPASSWORD":
                print(f"export {key}={value}")
        print(f'# export PGPASSWORD="$(cat {pg.root / "password"})"')
    return 0


def cmd_sdp(config: Config, args: argparse.Namespace) -> int:
    from pgmedallion.marts import GOLD_SCHEMA_KEY
    from pgmedallion.marts.runner import format_quality, run_pipeline

    definitions = [Path(d) for d in args.definitions]
    missing = [str(d) for d in definitions if not d.is_dir()]
    if missing:
        print(f"error: no pipeline definitions folder at {', '.join(missing)}", file=sys.stderr)
        return 2
    result = run_pipeline(
        definitions,
        state_dir=config.state_dir,
        name=config.source.name,
        schema=args.schema or config.lakehouse.gold_schema,
        configuration={GOLD_SCHEMA_KEY: config.lakehouse.gold_schema},
        source=config.source.name,
        full_refresh=args.full_refresh,
        echo=True,
    )
    if not result.ok:
        print(f"pipeline run failed:\n{result.failure()}", file=sys.stderr)
        return 1
    if result.quality:
        print("expectations:")
        print(format_quality(result.quality))
    return 0


def _checks(config: Config):
    """The ``doctor`` checks for the configured source (``run`` and ``capture`` run them first)."""
    from pgmedallion.capture.provision import run_checks
    from pgmedallion.checks import check_column_policies

    return [
        *run_checks(
            config.source.conninfo(),
            publication=config.source.publication,
            slot=config.source.slot,
            tables=list(config.source.tables),
            create_publication=config.source.create_publication,
            failover_slot=config.source.failover_slot,
        ),
        check_column_policies(config),
    ]


def _preflight(config: Config, command: str) -> bool:
    from pgmedallion.capture.provision import all_ok, format_report

    results = _checks(config)
    if not all_ok(results):
        print(format_report(results), file=sys.stderr)
        print(f"{command}: preflight failed (see above); nothing was captured", file=sys.stderr)
        return False
    return True


def cmd_run(config: Config, args: argparse.Namespace) -> int:
    from pgmedallion.capture.pgoutput import format_lsn
    from pgmedallion.capture.progress import RichSnapshotProgress
    from pgmedallion.pipeline import STAGES, run, stage_spinner

    stages = STAGES if args.stage == "all" else (args.stage,)
    resync = [t.strip() for t in (args.resync or "").split(",") if t.strip()]
    if stages == ("marts",) and not config.lakehouse.marts:
        print("run: no marts are configured ([lakehouse] marts)", file=sys.stderr)
        return 2
    if "capture" in stages and not args.skip_doctor and not _preflight(config, "run"):
        return 1
    if args.continuous and stages != ("capture",):
        if stages != STAGES:
            print("run: --continuous runs the whole pipeline or capture alone", file=sys.stderr)
            return 2
        return _run_continuous(config, resync)
    extra = {"continuous": True} if args.continuous else {}
    bars = RichSnapshotProgress() if "capture" in stages else None
    if bars is not None:
        extra["progress"] = bars
    try:
        result = run(config, stages, resync=resync, show=stage_spinner(), **extra)
    except PipelineError as e:
        if e.stage == "resync":
            print(f"resync: {e}; nothing was changed", file=sys.stderr)
            return 2
        print(failure(e), file=sys.stderr)
        return 1
    finally:
        if bars is not None:
            bars.close()
    if result.resynced:
        print(f"resync: {', '.join(result.resynced)} will be snapshotted again and rebuilt")
    if result.capture is not None:
        c = result.capture
        for table, rows in sorted(c.snapshotted.items()):
            print(f"capture: snapshot {table}: {rows} rows at {format_lsn(c.snapshot_lsn)}")
        print(f"capture: {c.messages} messages, frontier {format_lsn(c.frontier)}")
        for table in c.deferred:
            print(f"capture: snapshot {table}: left to the next run (transactions open)")
    if result.current:
        local = not (engine.spark_only() or on_databricks())
        print(
            "silver, gold: nothing new since the last run; current"
            + (" (Spark not started)" if local else "")
        )
    if result.silver is not None:
        s = result.silver
        if s.run is None:
            print("silver: nothing new")
        else:
            print(
                f"silver: run {s.run}, frontier {format_lsn(s.frontier)}, "
                f"{sum(s.rows.values())} diff rows, {s.errors} errors"
            )
    if result.gold is not None:
        for t in result.gold.tables:
            name = t.table.qualified_name
            print(f"gold: {name}: {t.rows} rows at {format_lsn(t.frontier)} ({t.mode})")
    if result.marts is not None:
        from pgmedallion.marts.runner import format_quality

        print(f"marts: updated {config.lakehouse.marts_schema}; expectations:")
        print(format_quality(result.marts.quality))
    return 0


def _run_continuous(config: Config, resync: list[str]) -> int:
    """``run --continuous``: one line per application of bronze's new batches to silver and
    gold, until SIGINT/SIGTERM (see ``pgmedallion.continuous``)."""
    import time

    from pgmedallion.capture.pgoutput import format_lsn
    from pgmedallion.capture.progress import RichSnapshotProgress
    from pgmedallion.continuous import Application, run_continuous
    from pgmedallion.pipeline import request_resync

    if resync:
        try:
            chosen = request_resync(None, config, resync)
        except PipelineError as e:
            print(f"resync: {e}; nothing was changed", file=sys.stderr)
            return 2
        print(f"resync: {', '.join(chosen)} will be snapshotted again and rebuilt")
    if config.lakehouse.marts:
        print("run --continuous: the marts are not refreshed continuously; run them on a schedule")

    def applied(app: Application) -> None:
        stamp = time.strftime("%H:%M:%S")
        if app.error is not None:
            print(f"{stamp} applied with errors: {app.error}", file=sys.stderr, flush=True)
        elif app.frontier is not None:
            print(
                f"{stamp} gold at {format_lsn(app.frontier)} (silver run {app.silver_run}, "
                f"{app.seconds:.1f} s)",
                flush=True,
            )

    print("run --continuous: capturing and applying; SIGINT or SIGTERM stops cleanly", flush=True)
    bars = RichSnapshotProgress()
    try:
        result = run_continuous(config, on_applied=applied, progress=bars)
    except KeyboardInterrupt:
        print("run --continuous: aborted; the next run resumes from what was committed")
        return 130
    finally:
        bars.close()
    if result.capture_error is not None:
        error = result.capture_error
        if isinstance(error, PipelineError):
            error.stage = error.stage or "capture"
            print(failure(error), file=sys.stderr)
        else:
            print(f"capture failed: {type(error).__name__}: {error}", file=sys.stderr)
        return 1
    last = result.applications[-1] if result.applications else None
    print(f"run --continuous: stopped; gold at {format_lsn(result.frontier or 0)}")
    return 1 if last is not None and last.error is not None else 0


def _request_resync(spark, config: Config, tables: list[str]) -> bool:
    from pgmedallion.pipeline import NotCaptured, request_resync

    try:
        chosen = request_resync(spark, config, tables)
    except NotCaptured as e:
        print(f"resync: {e}; nothing was changed", file=sys.stderr)
        return False
    print(f"resync: {', '.join(chosen)} will be snapshotted again and rebuilt")
    return True


def cmd_resync(config: Config, args: argparse.Namespace) -> int:
    from pgmedallion.pipeline import ALL_TABLES

    if bool(args.tables) == bool(args.all):
        print("resync: name the tables, or --all (not both)", file=sys.stderr)
        return 2
    if args.all:
        args.tables = [ALL_TABLES]
    if args.request_only:
        from pgmedallion.capture.run import capture_needs_spark
        from pgmedallion.core.spark import get_spark

        spark = get_spark(config.state_dir) if capture_needs_spark(config) else None
        return 0 if _request_resync(spark, config, args.tables) else 2
    args.resync, args.stage, args.continuous = ",".join(args.tables), "all", False
    return cmd_run(config, args)


def cmd_verify(config: Config, args: argparse.Namespace) -> int:
    from pgmedallion.pipeline import open_lakehouse
    from pgmedallion.verify import verify

    spark = open_lakehouse(config)
    try:
        result = verify(spark, config, catch_up=not args.no_catch_up)
    except PipelineError as e:
        print(failure(e), file=sys.stderr)
        return 1
    print(result.report())
    if args.great_expectations:
        from pgmedallion.gold.ge_suite import validate_gold

        ok, report = validate_gold(spark, config)
        print(report)
        if not ok:
            return 1
    return 0 if result.ok else 1


def failure(error: PipelineError) -> str:
    """The one line a failed stage prints: ``<stage> failed: <code>: <message>``."""
    return f"{error.stage or 'run'} failed: {error.code}: {error}"


def _has_pyspark() -> bool:
    try:
        import pyspark  # noqa: F401
    except ModuleNotFoundError:
        return False
    return True


def cmd_status(config: Config, args: argparse.Namespace) -> int:
    from pgmedallion.status import collect_status, format_status, watch

    started: list = []

    def spark():
        """The lakehouse's Spark session, started on first need (a table that is not local);
        None where PySpark is not installed."""
        if not started:
            if _has_pyspark():
                from pgmedallion.pipeline import open_lakehouse

                started.append(open_lakehouse(config))
            else:
                started.append(None)
        return started[0]

    if args.watch is not None:
        if args.watch <= 0:
            print("status --watch: the interval must be a positive number of seconds")
            return 2
        stop = threading.Event()
        # Ctrl-C or SIGTERM end the watch between two reports (handlers of our own: a process
        # started with SIGINT ignored, as some supervisors start theirs, would not stop else)
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, lambda *_: stop.set())
        try:
            watch(config, spark, args.watch, stop, sys.stdout)
        except KeyboardInterrupt:  # a signal PySpark's handler turned into one
            pass
        return 0
    status = collect_status(config, spark)
    print(format_status(status))
    return 0 if status.ok else 1


def cmd_sql(config: Config, args: argparse.Namespace) -> int:
    from pgmedallion.pipeline import open_lakehouse
    from pgmedallion.status import print_query

    spark = open_lakehouse(config)
    from pyspark.logger import PySparkLogger

    # PySpark logs a failed query's error as a JSON record with the JVM's stack trace; the
    # error is the user's query, said in one line below
    PySparkLogger.getLogger("SQLQueryContextLogger").setLevel(logging.CRITICAL)
    try:
        print_query(spark, config, args.query, limit=args.limit)
    except Exception as e:  # an analysis or parse error is the user's query, not a crash
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        print(f"sql error: {first}", file=sys.stderr)
        return 1
    return 0


def cmd_capture(config: Config, args: argparse.Namespace) -> int:
    from pgmedallion.capture.pgoutput import format_lsn
    from pgmedallion.capture.progress import RichSnapshotProgress
    from pgmedallion.capture.run import (
        CaptureOptions,
        RetryPolicy,
        bronze_of,
        capture_needs_spark,
        capture_once,
        capture_target,
    )

    if not _preflight(config, "capture"):
        return 1
    spark = None  # locally bronze is written by delta-rs: no JVM, no PySpark needed
    if capture_needs_spark(config):
        from pgmedallion.core.spark import get_spark
        from pgmedallion.pipeline import ensure_schemas

        spark = get_spark(config.state_dir)
        ensure_schemas(spark, config)
    target = capture_target(config)
    bars = RichSnapshotProgress()
    try:
        options = CaptureOptions(
            workers=args.workers,
            tables=list(config.source.tables) or None,
            continuous=args.continuous,
            progress=bars,
            retry=RetryPolicy(attempts=args.retries),
        )
        result = capture_once(bronze_of(spark, target), target, options)
    except PipelineError as e:
        e.stage = e.stage or "capture"
        print(failure(e), file=sys.stderr)
        return 1
    finally:
        bars.close()
    for table, rows in sorted(result.snapshotted.items()):
        print(f"snapshot {table}: {rows} rows at {format_lsn(result.snapshot_lsn)}")
    print(
        f"{result.messages} messages in {result.batches} batch(es); "
        f"frontier {format_lsn(result.frontier)}"
    )
    for table in result.deferred:
        print(f"snapshot {table}: left to the next run (transactions open on the server)")
    for table, message in sorted(result.table_errors.items()):
        print(f"capture error: {table}: {message}", file=sys.stderr)
    return 1 if result.table_errors else 0


def cmd_doctor(config: Config, args: argparse.Namespace) -> int:
    from pgmedallion.capture.provision import all_ok, format_report

    results = _checks(config)
    print(format_report(results))
    return 0 if all_ok(results) else 1


def cmd_demo(config: Config, args: argparse.Namespace) -> int:
    from pgmedallion.demo import run_demo

    return run_demo(config)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pgmedallion",
        description="PostgreSQL tables into a Delta Lake medallion lakehouse, exactly once.",
    )
    parser.add_argument("-c", "--config", help="TOML config file (default: ./pgmedallion.toml)")
    parser.add_argument("-v", "--verbose", action="store_true")
    # The same options after the command name too: ``pgmedallion run --config x.toml``.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-c", "--config", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    common.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = sub.add_parser(
        "demo", help="embedded PostgreSQL + local Spark: the whole pipeline", parents=[common]
    )
    demo.set_defaults(func=cmd_demo)

    doctor = sub.add_parser(
        "doctor",
        help="preflight: wal_level, privileges, publication, replica identity, slot",
        parents=[common],
    )
    doctor.set_defaults(func=cmd_doctor)

    capture = sub.add_parser(
        "capture",
        help="snapshot new tables and stream the slot into bronze until caught up",
        parents=[common],
    )
    capture.add_argument("--workers", type=int, default=2, help="parallel COPY ranges per table")
    capture.add_argument(
        "--continuous", action="store_true", help="keep streaming until SIGINT/SIGTERM"
    )
    capture.add_argument(
        "--retries", type=int, default=5, help="attempts on transient errors (default 5)"
    )
    capture.set_defaults(func=cmd_capture)

    run = sub.add_parser(
        "run", help="one pipeline run: capture, silver, gold, marts", parents=[common]
    )
    run.add_argument(
        "--stage", choices=["all", "capture", "silver", "gold", "marts"], default="all"
    )
    run.add_argument(
        "--continuous",
        action="store_true",
        help="keep capturing and applying to silver and gold until SIGINT/SIGTERM",
    )
    run.add_argument("--skip-doctor", action="store_true", help="skip the preflight checks")
    run.add_argument(
        "--resync",
        metavar="TABLES",
        help="comma-separated tables to snapshot again and rebuild first (see resync)",
    )
    run.set_defaults(func=cmd_run)

    resync = sub.add_parser(
        "resync",
        help="snapshot tables again and rebuild their silver and gold (recovers any error state)",
        parents=[common],
    )
    resync.add_argument("tables", nargs="*", metavar="TABLE", help="schema.table (or table)")
    resync.add_argument(
        "--all",
        action="store_true",
        help="every captured table: also the way back from a lost replication slot (a new slot"
        " is made, and the gap recorded)",
    )
    resync.add_argument(
        "--request-only",
        action="store_true",
        help="only record the request; the next run (or scheduled job) does the work",
    )
    resync.add_argument("--skip-doctor", action="store_true", help="skip the preflight checks")
    resync.set_defaults(func=cmd_resync)

    verify = sub.add_parser(
        "verify", help="reconcile silver and gold with the source at a snapshot", parents=[common]
    )
    verify.add_argument(
        "--no-catch-up", action="store_true", help="don't run the pipeline up to the snapshot"
    )
    verify.add_argument(
        "--great-expectations", action="store_true", help="also run the gold expectation suites"
    )
    verify.set_defaults(func=cmd_verify)

    status = sub.add_parser(
        "status", help="slot lag, frontiers, rows and errors per table", parents=[common]
    )
    status.add_argument(
        "--watch",
        nargs="?",
        type=float,
        const=2.0,
        metavar="SECONDS",
        help="show the report again every SECONDS (default 2) until Ctrl-C",
    )
    status.set_defaults(func=cmd_status)

    sql = sub.add_parser(
        "sql", help="run a SQL query on the local bronze/silver/gold tables", parents=[common]
    )
    sql.add_argument("query")
    sql.add_argument("--limit", type=int, default=100, help="rows to print (default 100)")
    sql.set_defaults(func=cmd_sql)

    sdp = sub.add_parser(
        "sdp", help="run Spark Declarative Pipelines definitions locally", parents=[common]
    )
    sdp.add_argument(
        "--definitions",
        action="append",
        required=True,
        help="folder of dataset definition files (repeatable)",
    )
    sdp.add_argument("--schema", help="target schema (default: the gold schema)")
    sdp.add_argument("--full-refresh", action="store_true")
    sdp.set_defaults(func=cmd_sdp)

    postgres = sub.add_parser(
        "postgres", help="the project-owned local PostgreSQL server", parents=[common]
    )
    postgres.add_argument("action", choices=["start", "stop", "status", "env"])
    postgres.set_defaults(func=cmd_postgres)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not args.verbose:  # py4j logs every gateway connection it closes at INFO
        logging.getLogger("py4j").setLevel(logging.WARNING)
    try:
        config = load_config(args.config)
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    from pgmedallion.core.errors import JavaMissing

    started = None
    if args.func in _ON_DEMO_STATE and _no_own_source(args):
        config, started = _demo_state(config, needs_server=args.func is not cmd_sql)
    try:
        return args.func(config, args)
    except JavaMissing as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except ConfigError as e:  # e.g. a secret scope off Databricks, found when connecting
        print(f"config error: {e}", file=sys.stderr)
        return 2
    finally:
        if started is not None:
            started.stop()


def _no_own_source(args: argparse.Namespace) -> bool:
    """No config file and no source in the environment: the user has not set one up."""
    import os

    from pgmedallion.core.config import DEFAULT_FILE

    if getattr(args, "config", None) or Path(DEFAULT_FILE).exists():
        return False
    return not any(
        os.environ.get(k)
        for k in ("PGMEDALLION_SOURCE_DSN", "PGMEDALLION_SOURCE_HOST", "PGHOST", "PGDATABASE")
    )


def _demo_state(config: Config, *, needs_server: bool):
    """After ``pgmedallion demo`` in this directory: the demo's source, its embedded server
    started for this command when it needs one (and stopped after it: returned)."""
    from pgmedallion.demo import demo_config, demo_marker
    from pgmedallion.localpg import LocalPostgres

    if not demo_marker(config).exists():
        return config, None
    pg = LocalPostgres(config.state_dir / "postgres")
    if not pg.initialised():
        return config, None
    started = None
    if needs_server and not pg.is_running():
        pg.start()
        started = pg
    print(
        "(the demo's state: `pgmedallion demo` ran here and there is no pgmedallion.toml)",
        file=sys.stderr,
    )
    return demo_config(config, pg), started


_ON_DEMO_STATE = (cmd_run, cmd_status, cmd_sql, cmd_verify, cmd_doctor, cmd_capture, cmd_resync)


def entry() -> None:
    """Console-script and Databricks wheel-task entry point: the exit code always reaches the
    caller (a wheel task ignores a returned value; SystemExit fails the task)."""
    code = main()
    if code:
        raise SystemExit(code)


if __name__ == "__main__":
    sys.exit(main())
