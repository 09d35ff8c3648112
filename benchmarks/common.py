"""What every benchmark shares: the environment, timing, the result line and the record.

Fairness rules the benchmarks keep
    Both sides do the same work on the same data in the same run, one after the other, so the
    noise of a shared machine hits both alike; the ratio compares wall times of that same work
    (``ratio = peer seconds / our seconds``, so above 1 means we are faster). A rate is the
    work (bytes of the table, messages of the backlog) divided by each side's wall time.
    Megabytes are 10^6 bytes. A memory benchmark reports a :class:`MemoryResult` instead:
    each side's peak resident set through the same work, ``ratio = our peak / the peer's``
    (lower is better, the line says so) and a ceiling on our peak as the goal.

Environment
    :class:`BenchEnv` holds the PostgreSQL server, the database the benchmarks use, and a Spark
    session created on first use. The command line builds one over ``.pgmedallion/bench``
    (its own embedded PostgreSQL and Spark warehouse); the tests build one over their fixtures.
    Spark is started with extra Maven packages when a benchmark needs them (the PostgreSQL
    JDBC driver for ``--peer jdbc``); :func:`jdbc_driver_loaded` tells whether the session at
    hand has it, since a running session cannot gain ``spark.jars.packages``.

Client programs (``psql``, ``pg_recvlogical``) come from the server's ``bin`` directory, or
Debian's PostgreSQL 15; they get the password through ``PGPASSWORD`` in their environment,
never on a command line.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Any

import psycopg
from psycopg import sql

from pgmedallion.localpg import LocalPostgres

DEFAULT_STATE_DIR = Path(".pgmedallion/bench")
DEFAULT_DBNAME = "bench"
BRONZE_SCHEMA = "bench_bronze"
PG15_BIN = Path("/usr/lib/postgresql/15/bin")
MB = 1_000_000


@dataclass(frozen=True)
class Timing:
    """One side's wall time for the benchmark's work."""

    label: str
    seconds: float


@dataclass(frozen=True)
class Result:
    """What a benchmark measured: the same ``work`` done by us and by the peer."""

    name: str
    work: dict[str, float]
    """Amount per rate unit, first one primary: ``{"MB/s": 1073.7}`` means 1073.7 MB."""
    ours: Timing
    peer: Timing
    goal: float | None
    """The ratio we aim for (``ratio >= goal``), or None where none is set."""
    params: dict[str, Any] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def ratio(self) -> float:
        """Our throughput over the peer's (same work, so peer seconds over ours)."""
        return self.peer.seconds / self.ours.seconds

    def rates(self, timing: Timing) -> dict[str, float]:
        return {unit: amount / timing.seconds for unit, amount in self.work.items()}

    def summary_line(self) -> str:
        """``NAME: pgmedallion <rates>, <peer> <rates>, ratio R (goal >= G)``."""
        goal = f"goal >= {self.goal:g}" if self.goal is not None else "no goal set"
        return (
            f"{self.name}: {self.ours.label} {format_rates(self.rates(self.ours))}, "
            f"{self.peer.label} {format_rates(self.rates(self.peer))}, "
            f"ratio {self.ratio:.2f} ({goal})"
        )

    def to_record(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "ratio": self.ratio,
            "goal": self.goal,
            "ours": {**asdict(self.ours), "rates": self.rates(self.ours)},
            "peer": {**asdict(self.peer), "rates": self.rates(self.peer)},
            "work": self.work,
            "params": self.params,
            "details": self.details,
        }


@dataclass(frozen=True)
class Peak:
    """One side's peak resident set size through the benchmark's work."""

    label: str
    kib: int
    """KiB, as Linux reports it (``VmHWM``, ``ru_maxrss``)."""

    @property
    def mb(self) -> float:
        return self.kib * 1024 / MB


@dataclass(frozen=True)
class MemoryResult:
    """What a memory benchmark measured: our and the peer's peak RSS through the same work.

    Lower is better, so unlike :class:`Result` the ratio is ours over the peer's (above 1: we
    use more), and the goal is a ceiling on our own peak, not on the ratio.
    """

    name: str
    ours: Peak
    peer: Peak
    goal_mb: float | None
    """Our peak RSS should be at most this many MB (10^6 bytes), or None where none is set."""
    params: dict[str, Any] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def ratio(self) -> float:
        """Our peak RSS over the peer's."""
        return self.ours.kib / self.peer.kib

    @property
    def goal_met(self) -> bool | None:
        return None if self.goal_mb is None else self.ours.mb <= self.goal_mb

    def summary_line(self) -> str:
        """``NAME: pgmedallion peak RSS <mb> MB, <peer> peak RSS <mb> MB, ratio R (...)``."""
        goal = (
            f"goal {self.ours.label} <= {self.goal_mb:g} MB"
            if self.goal_mb is not None
            else "no goal set"
        )
        return (
            f"{self.name}: {self.ours.label} peak RSS {format_mb(self.ours.mb)}, "
            f"{self.peer.label} peak RSS {format_mb(self.peer.mb)}, "
            f"ratio {self.ratio:.2f} (ours / peer, lower is better; {goal})"
        )

    def to_record(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "metric": "peak_rss",
            "ratio": self.ratio,
            "ratio_is": "ours / peer peak RSS, lower is better",
            "goal": None,
            "goal_ours_max_mb": self.goal_mb,
            "goal_met": self.goal_met,
            "ours": {**asdict(self.ours), "peak_rss_mb": self.ours.mb},
            "peer": {**asdict(self.peer), "peak_rss_mb": self.peer.mb},
            "params": self.params,
            "details": self.details,
        }


def format_mb(mb: float) -> str:
    return f"{mb:.0f} MB" if mb >= 1000 else f"{mb:.1f} MB"


def format_rates(rates: Mapping[str, float]) -> str:
    return " ".join(
        f"{value:.0f} {unit}" if value >= 1000 else f"{value:.1f} {unit}"
        for unit, value in rates.items()
    )


class BenchEnv:
    """The server, database and (lazily) Spark session a benchmark run uses."""

    def __init__(
        self,
        server: LocalPostgres,
        dbname: str,
        state_dir: Path,
        *,
        spark=None,
        spark_packages: tuple[str, ...] = (),
        results_path: Path | None = None,
    ) -> None:
        self.server = server
        self.dbname = dbname
        self.state_dir = Path(state_dir).absolute()
        self.spark_packages = spark_packages
        self.results_path = results_path
        self._spark = spark

    @property
    def conninfo(self) -> dict[str, str]:
        return self.server.conninfo(dbname=self.dbname)

    def start_spark(self) -> float:
        """Start the Spark session now (if not yet); seconds it took, so timings exclude it."""
        with Stopwatch() as watch:
            self.spark  # noqa: B018 (the property starts the session)
        return watch.seconds

    @property
    def spark(self):
        if self._spark is None:
            from pgmedallion.core.spark import get_spark

            self._spark = get_spark(self.state_dir / "spark", packages=self.spark_packages)
        return self._spark

    def bronze_table(self, name: str) -> str:
        """A fresh (dropped) bronze table ``bench_bronze.<name>`` for one measurement."""
        spark = self.spark
        spark.sql(f"CREATE SCHEMA IF NOT EXISTS {BRONZE_SCHEMA}")
        spark.sql(f"DROP TABLE IF EXISTS {BRONZE_SCHEMA}.{name}")
        return f"{BRONZE_SCHEMA}.{name}"

    def client(self, program: str) -> Path:
        """A PostgreSQL client program from the server's bin directory or Debian's 15."""
        for bin_dir in (self.server.bin_dir, PG15_BIN):
            path = Path(bin_dir) / program
            if path.exists():
                return path
        raise FileNotFoundError(f"{program} not found in {self.server.bin_dir} or {PG15_BIN}")

    def client_env(self) -> dict[str, str]:
        """The environment for a libpq client: PG* variables pointing at the benchmark db."""
        info = self.conninfo
        return {
            **os.environ,
            "PGHOST": info["host"],
            "PGPORT": info["port"],
            "PGUSER": info["user"],
            "PGDATABASE": info["dbname"],
            "PGPASSWORD": info["password"],
        }

    def connect(self) -> psycopg.Connection:
        return psycopg.connect(**self.conninfo, autocommit=True)


def ensure_database(server: LocalPostgres, dbname: str) -> None:
    with psycopg.connect(**server.conninfo(), autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (dbname,)).fetchone()
        if exists is None:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname)))


def add_engine_argument(parser) -> None:
    """``--engine``: pgmedallion's ``[lakehouse] engine`` for a benchmark's whole processes."""
    parser.add_argument(
        "--engine",
        choices=("auto", "spark", "delta-rs"),
        default="auto",
        help="pgmedallion's [lakehouse] engine (%(default)s; spark: what a Databricks job runs)",
    )


def write_pipeline_config(
    env: BenchEnv,
    path: Path,
    lake: Path,
    *,
    source: str,
    publication: str,
    slot: str,
    password_env: str,
    writer: str,
    engine: str = "auto",
    source_settings: dict[str, Any] | None = None,
) -> Path:
    """A ``pgmedallion.toml`` for whole ``pgmedallion`` processes against the benchmark
    database: its source (the password in ``$password_env``, never in the file), an existing
    publication, the lakehouse under ``lake`` with schemas ``<source>_bronze|silver|gold``,
    read and written by ``engine`` (``[lakehouse] engine``: ``spark`` is what Databricks runs)."""
    info = env.conninfo
    text = "\n".join(
        [
            f"# Written by `python -m benchmarks {writer}`; the password is in ${password_env}",
            "[source]",
            f"name = {json.dumps(source)}",
            f"host = {json.dumps(info['host'])}",
            f"port = {int(info['port'])}",
            f"dbname = {json.dumps(info['dbname'])}",
            f"user = {json.dumps(info['user'])}",
            f"password_env = {json.dumps(password_env)}",
            f"publication = {json.dumps(publication)}",
            f"slot = {json.dumps(slot)}",
            "create_publication = false",
            *(f"{k} = {json.dumps(v)}" for k, v in (source_settings or {}).items()),
            "",
            "[lakehouse]",
            f"state_dir = {json.dumps(str(lake))}",
            f"engine = {json.dumps(engine)}",
            *(f'{layer}_schema = "{source}_{layer}"' for layer in ("bronze", "silver", "gold")),
            "",
        ]
    )
    path.write_text(text)
    return path


def drop_slot(conn: psycopg.Connection, slot: str) -> None:
    """Drop replication slot ``slot`` if it exists, ending its walsender first."""
    conn.execute(
        "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots"
        " WHERE slot_name = %s AND active_pid IS NOT NULL",
        (slot,),
    )
    deadline = time.monotonic() + 30
    exists = "SELECT 1 FROM pg_replication_slots WHERE slot_name = %s"
    while conn.execute(exists, (slot,)).fetchone():
        try:
            conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
        except Exception:  # still active: its walsender has not exited yet
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def cli_env(args: argparse.Namespace, spark_packages: tuple[str, ...] = ()) -> BenchEnv:
    """The environment of a command-line run: everything under ``--state-dir``."""
    state_dir = Path(args.state_dir).absolute()
    server = LocalPostgres(state_dir).start()
    ensure_database(server, DEFAULT_DBNAME)
    return BenchEnv(
        server,
        DEFAULT_DBNAME,
        state_dir,
        spark_packages=spark_packages,
        results_path=None if args.no_record else state_dir / "results.jsonl",
    )


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--state-dir",
        default=str(DEFAULT_STATE_DIR),
        help="state directory of the benchmark's PostgreSQL and Spark (default %(default)s)",
    )
    parser.add_argument(
        "--no-record", action="store_true", help="do not append the result to results.jsonl"
    )


def module_parser(module: ModuleType) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=f"python -m benchmarks {module.NAME}", description=module.DESCRIPTION
    )
    add_common_arguments(parser)
    module.add_arguments(parser)
    return parser


def execute(module: ModuleType, args: argparse.Namespace) -> Result | MemoryResult:
    """Run one benchmark: its details, then its summary as the last line; record it."""
    print(f"== {module.NAME}: {module.DESCRIPTION}", flush=True)
    load_before = os.getloadavg()
    result = module.run(args)
    record = result.to_record()
    record["details"]["loadavg_before"] = [round(x, 2) for x in load_before]
    record["details"]["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    if args.env.results_path is not None:
        append_record(args.env.results_path, record)
    print(result.summary_line(), flush=True)
    return result


def append_record(path: Path, record: dict[str, Any]) -> None:
    record = {
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": shlex.join([Path(sys.executable).name, "-m", "benchmarks", *sys.argv[1:]]),
        "git": git_commit(),
        "machine": machine_info(),
        **record,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps(record, sort_keys=True) + "\n")


def git_commit() -> str | None:
    """HEAD's short hash, with ``-dirty`` when the work tree (shared by several) has changes."""
    try:
        out = subprocess.run(
            ["git", "describe", "--always", "--dirty"], capture_output=True, text=True, check=True
        )
    except (OSError, subprocess.CalledProcessError):
        return None
    return out.stdout.strip() or None


def machine_info() -> dict[str, Any]:
    mem_kb = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    mem_kb = int(line.split()[1])
    except OSError:
        pass
    return {
        "cpus": os.cpu_count(),
        "mem_gib": round(mem_kb / 2**20, 1) if mem_kb else None,
        "python": platform.python_version(),
        "system": platform.platform(terse=True),
    }


def say(text: str) -> None:
    print(f"  {text}", flush=True)


class Stopwatch:
    """``with Stopwatch() as w: ...`` then ``w.seconds``: wall time of the block."""

    def __enter__(self) -> Stopwatch:
        self.seconds = 0.0
        self._start = time.perf_counter()
        return self

    def __exit__(self, *_: object) -> None:
        self.seconds = time.perf_counter() - self._start


def jdbc_driver_loaded(spark) -> bool:
    """Whether the running Spark session can load the PostgreSQL JDBC driver."""
    jvm = spark.sparkContext._jvm
    try:
        jvm.java.lang.Thread.currentThread().getContextClassLoader().loadClass(
            "org.postgresql.Driver"
        )
    except Exception:  # py4j wraps the ClassNotFoundException
        return False
    return True


def jdbc_url(conninfo: Mapping[str, str]) -> str:
    """``jdbc:postgresql://host:port/db`` (credentials go in properties, not the URL)."""
    return f"jdbc:postgresql://{conninfo['host']}:{conninfo['port']}/{conninfo['dbname']}"


def recvlogical_command(env: BenchEnv, slot: str, end_lsn: int, publication: str) -> list[str]:
    """``pg_recvlogical`` reading ``slot``'s pgoutput (protocol 1) up to ``end_lsn`` into
    /dev/null: the peer of the stream and rss benchmarks."""
    from pgmedallion.capture.pgoutput import format_lsn

    return [
        str(env.client("pg_recvlogical")),
        "--dbname",
        env.dbname,
        "--slot",
        slot,
        "--start",
        "--no-loop",
        "--endpos",
        format_lsn(end_lsn),
        "-o",
        "proto_version=1",
        "-o",
        f"publication_names={publication}",
        "-f",
        "/dev/null",
    ]


def peak_rss_kib(pid: int | str = "self") -> int | None:
    """``VmHWM`` of a process in KiB (its peak resident set), or None if it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def small_vs_large(name: str, args: argparse.Namespace, measure) -> Result:
    """The best of ``args.repeats`` timed runs ``measure(rows, run)`` on ``args.small`` and on
    ``args.large`` rows, interleaved so that the load of a shared machine hits both alike;
    "pgmedallion" is the large run, the peer the small one (goal: large <= 1.5x small)."""
    smalls, larges = [], []
    for i in range(args.repeats):
        smalls.append(measure(args.small, 2 + i))
        larges.append(measure(args.large, 2 + i))
    small, large = min(smalls), min(larges)
    say(
        f"best of {args.repeats}: {small:.1f} s on {args.small} rows, {large:.1f} s on {args.large}"
    )
    say(f"large / small time: {large / small:.2f}x (goal <= 1.5x)")
    return Result(
        name=name,
        work={"changes/s": float(args.changes)},
        ours=Timing("pgmedallion", large),
        peer=Timing(f"same on {args.small} rows", small),
        goal=1 / 1.5,
        params={
            "small": args.small,
            "large": args.large,
            "changes": args.changes,
            "pattern": args.pattern,
            "repeats": args.repeats,
            **({"identity": args.identity} if hasattr(args, "identity") else {}),
        },
        details={"large_over_small": large / small, "small_runs": smalls, "large_runs": larges},
    )
