"""resume: a snapshot killed at about 50% and again at about 90%, then finished, vs. a whole one.

Issue 48's goal: a snapshot killed at 90% completes in at most 20% of a full snapshot's time,
and nothing is read twice beyond the ranges in flight at the kill. Whole cold ``pgmedallion
run --stage capture`` processes (what a scheduled job pays for the snapshot), on the ``load``
benchmark's table (``--rows``, default 4,000,000: a ``bigint`` primary key, so it is read in key
ranges, ``capture.ranges``):

Setup (untimed)
    The ``load`` table (built once and reused, see ``benchmarks.load``), a publication of it,
    and for each lakehouse below a fresh state directory under ``<state dir>/resume``.
What is timed, each a child process from start to exit
    ``full-ctid``   a fresh lakehouse with ``snapshot_range_mb = 0``: the snapshot in ctid
                    ranges, one commit (what every snapshot was before key ranges).
    ``full``        a fresh lakehouse, default settings: the snapshot in key ranges (the peer
                    of the resumed run: the goal is stated against it).
    ``killed-50``   a third fresh lakehouse, the failpoint ``snapshot.range_landed`` armed to
                    SIGKILL the process after the wave that passes half of the ranges;
    ``killed-90``   the next run on it, killed after the wave that passes 90%;
    ``resumed``     the next run on it, to the end.
    ``nothing-new`` one more run on it: what a capture process costs with nothing to snapshot
                    (Python, ``doctor``, the slot), the floor under any resumed run.
    The two killed runs must die of SIGKILL, the others exit 0. Bronze is read afterwards with
    delta-rs: each key range must be landed exactly once, and the bytes of COPY rows each run
    landed are reported (``resumed`` must land only the ranges the kills left).
The goal (ratio = full seconds / resumed seconds)
    ``>= 5``: the resumed run at most 20% of a full snapshot's. ``full-ctid`` against ``full``
    is what reading in key ranges costs a snapshot that is not interrupted (no goal).
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
from pathlib import Path

import pyarrow.compute as pc
from deltalake import DeltaTable

from benchmarks.common import MB, BenchEnv, Result, Timing, drop_slot, say, write_pipeline_config
from benchmarks.load import published_table, table_name
from benchmarks.process import ProcessRun, run_process

NAME = "resume"
DESCRIPTION = "a snapshot killed at 50% and 90%, then finished, vs. a whole one (cold processes)"
GOAL = 5.0
PUBLICATION = "bench_resume_pub"
SLOT = "bench_resume_slot"
SOURCE = "bench_resume"
PASSWORD_ENV = "BENCH_RESUME_PW"
WORKERS = 2
"""Ranges per wave: capture's snapshot workers (``CaptureOptions.workers``)."""
REPO = Path(__file__).resolve().parent.parent


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rows", type=int, default=4_000_000, help="table rows (%(default)s)")


def run(args: argparse.Namespace) -> Result:
    env: BenchEnv = args.env
    name = table_name(args.rows)
    root = env.state_dir / "resume"
    table = published_table(env, name, args.rows, PUBLICATION, SLOT)
    say(f"table public.{name}: {table['rows']} rows, {table['bytes'] / MB:.1f} MB")
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    runs: dict[str, ProcessRun] = {}
    try:
        runs["full-ctid"] = _Lakehouse(env, root, "ctid", range_mb=0).capture("full-ctid")
        full = _Lakehouse(env, root, "full")
        runs["full"] = full.capture("full")
        ranges = len(_records(full.bronze, "range"))
        waves = math.ceil(ranges / WORKERS)
        half = math.ceil(waves / 2)
        ninety = max(half + 1, math.floor(0.9 * ranges / WORKERS))
        say(f"{ranges} key ranges, {waves} waves of {WORKERS}: kills after waves {half}, {ninety}")
        lake = _Lakehouse(env, root, "killed")
        runs["killed-50"] = lake.capture("killed-50", failpoint=half)
        runs["killed-90"] = lake.capture("killed-90", failpoint=ninety - half)
        runs["resumed"] = lake.capture("resumed")
        runs["nothing-new"] = lake.capture("nothing-new")
    finally:
        with env.connect() as conn:
            drop_slot(conn, SLOT)
    for label in ("killed-50", "killed-90"):
        if runs[label].returncode != -9:
            raise RuntimeError(
                f"{label}: exited {runs[label].returncode}, not killed\n{runs[label].tail()}"
            )
    landed = _records(lake.bronze, "range")
    parts = [r["part"] for r in landed]
    if sorted(parts) != list(range(ranges)):
        raise RuntimeError(f"the key ranges landed are not each range once: {sorted(parts)}")
    read = _copy_bytes(lake.bronze)
    attempts = sorted(read.items(), key=lambda kv: kv[0])
    per_run = [b for _, b in attempts]
    whole = sum(per_run)
    labels = ("killed-50", "killed-90", "resumed")
    full_bytes = sum(_copy_bytes(full.bronze).values())
    say(
        "COPY bytes landed per run: "
        + ", ".join(f"{k} {b / MB:.1f} MB" for k, b in zip(labels, per_run, strict=False))
        + f" (all {whole / MB:.1f} MB; the full snapshot landed {full_bytes / MB:.1f} MB)"
    )
    for label, r in runs.items():
        say(f"{label}: {r.seconds:.1f} s (exit {r.returncode})")
    ratio = runs["full"].seconds / runs["resumed"].seconds
    floor = runs["nothing-new"].seconds
    beyond = (runs["resumed"].seconds - floor) / max(runs["full"].seconds - floor, 1e-9)
    say(
        f"a capture process with nothing to snapshot: {floor:.1f} s; beyond it, the resumed run "
        f"cost {100 * beyond:.0f}% of the full snapshot's"
    )
    say(
        f"resumed after a kill at 90%: {runs['resumed'].seconds:.1f} s, a full snapshot "
        f"{runs['full'].seconds:.1f} s: {100 / ratio:.0f}% (goal <= 20%); key ranges against "
        f"ctid ranges on a whole snapshot: {runs['full'].seconds:.1f} s vs "
        f"{runs['full-ctid'].seconds:.1f} s"
    )
    return Result(
        name=NAME,
        work={"MB/s": table["bytes"] / MB},
        ours=Timing("resumed", runs["resumed"].seconds),
        peer=Timing("full snapshot", runs["full"].seconds),
        goal=GOAL,
        params={"rows": args.rows},
        details={
            "ranges": ranges,
            "kills_after_waves": [half, ninety],
            "seconds": {k: round(v.seconds, 2) for k, v in runs.items()},
            "copy_bytes_per_run": per_run,
            "full_copy_bytes": full_bytes,
            "resumed_share_of_full": round(1 / ratio, 3),
            "resumed_share_beyond_process": round(beyond, 3),
            "ctid_full_s": round(runs["full-ctid"].seconds, 2),
        },
    )


class _Lakehouse:
    def __init__(self, env: BenchEnv, root: Path, label: str, range_mb: float | None = None):
        self.root = root / label
        self.root.mkdir()
        self.config = write_pipeline_config(
            env,
            self.root / "pgmedallion.toml",
            self.root / "lakehouse",
            source=SOURCE,
            publication=PUBLICATION,
            slot=SLOT,
            password_env=PASSWORD_ENV,
            writer=NAME,
            source_settings={} if range_mb is None else {"snapshot_range_mb": range_mb},
        )
        self.env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("PG", "PGMEDALLION_SOURCE_", "PGMEDALLION_LAKEHOUSE_"))
        }
        self.env[PASSWORD_ENV] = env.conninfo["password"]
        self.env.pop("PGMEDALLION_FAILPOINTS", None)
        self.bronze = self.root / "lakehouse" / "warehouse" / f"{SOURCE}_bronze.db" / "bronze"
        self.server = env

    def capture(self, label: str, failpoint: int | None = None) -> ProcessRun:
        if not (self.bronze / "_delta_log").is_dir():  # a new lakehouse: a new slot
            with self.server.connect() as conn:
                drop_slot(conn, SLOT)
        environ = dict(self.env)
        if failpoint is not None:
            environ["PGMEDALLION_FAILPOINTS"] = f"snapshot.range_landed={failpoint}"
        argv = [sys.executable, "-m", "pgmedallion.cli", "--config", str(self.config)]
        run = run_process(
            [*argv, "run", "--stage", "capture"],
            label=label,
            env=environ,
            cwd=self.root,
            log_dir=self.root / "logs",
            timeout=3600,
        )
        if failpoint is None:
            run.check()
        say(f"{label}: {run.seconds:.1f} s (exit {run.returncode})")
        return run


def _records(bronze: Path, kind: str) -> list[dict]:
    table = DeltaTable(str(bronze)).to_pyarrow_table(columns=["kind", "part", "lsn", "batch_id"])
    return table.filter(pc.equal(table.column("kind"), kind)).to_pylist()


def _copy_bytes(bronze: Path) -> dict[int, int]:
    """Bytes of COPY rows landed, by snapshot LSN (one per run)."""
    table = DeltaTable(str(bronze)).to_pyarrow_table(columns=["kind", "lsn", "payload"])
    copies = table.filter(pc.equal(table.column("kind"), "copy"))
    out: dict[int, int] = {}
    for lsn, size in zip(
        copies.column("lsn").to_pylist(),
        pc.binary_length(copies.column("payload")).to_pylist(),
        strict=True,
    ):
        out[lsn] = out.get(lsn, 0) + size
    return out
