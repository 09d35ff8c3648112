"""Differential testing: PostgreSQL is the oracle.

A seeded workload (``tests/workload.py``) runs in bursts of concurrent multi-statement
transactions; between bursts the pipeline runs (capture -> silver -> gold), and after every
run ``verify`` takes a fresh snapshot of the source and must find every table exact in silver
and gold, with PostgreSQL's own row count on every side. A failing seed reproduces on its own:
``python -m pytest "tests/test_differential.py::test_seed_slow[3]"`` (what each session writes
depends on the seed alone; only the interleaving of commits between sessions varies).
"""

from __future__ import annotations

import os
import time

import pytest

from pgmedallion.pipeline import run_stages
from pgmedallion.verify import verify
from tests.workload import Workload, assert_engine, assert_exact, drop_schemas, make_config


def differential(
    spark, db, seed: int, bursts: list[dict], *, verify_snapshot: bool = True, **workload
) -> list[str]:
    wl = Workload(db, seed, **workload)
    wl.create()
    cfg = make_config(db, f"diff{seed}")
    drop_schemas(spark, cfg)
    log = []
    t0 = time.monotonic()
    run_stages(spark, cfg)  # the snapshot
    t1 = time.monotonic()
    if verify_snapshot:
        result = verify(spark, cfg)
        assert_exact(result, wl.counts())
    log.append(f"seed {seed} snapshot run {t1 - t0:.0f}s, verify {time.monotonic() - t1:.0f}s")
    for i, burst in enumerate(bursts):
        started = time.monotonic()
        burst = dict(burst)
        run = burst.pop("run", True)
        stats = wl.burst(**burst)
        assert stats.transactions == burst["transactions"] * len(wl.sessions)
        t1 = time.monotonic()
        if run:
            run_stages(spark, cfg)
        t2 = time.monotonic()
        # verify catches capture, silver and gold up to its snapshot first
        result = verify(spark, cfg)
        assert_exact(result, wl.counts())
        log.append(
            f"seed {seed} burst {i}: {stats}; burst {t1 - started:.0f}s, run {t2 - t1:.0f}s,"
            f" verify {time.monotonic() - t2:.0f}s"
        )
    assert_engine(spark, cfg)
    return log


@pytest.mark.parametrize("seed", [1])
def test_seed(spark, db, seed):
    # The quick loop: snapshot, one burst (with a large transaction per session), and verify,
    # whose catch-up run streams the burst through silver and gold before comparing.
    log = differential(
        spark,
        db,
        seed,
        [dict(transactions=20, large_rows=300, run=False)],
        verify_snapshot=False,
    )
    print("\n".join(log))


# Slow seeds: 2 by default (one takes 6-12 minutes here); PGMEDALLION_DIFF_SEEDS=2,3,4 for more.
SLOW_SEEDS = [int(s) for s in os.environ.get("PGMEDALLION_DIFF_SEEDS", "2").split(",") if s]


@pytest.mark.slow
@pytest.mark.parametrize("seed", SLOW_SEEDS)
def test_seed_slow(spark, db, seed):
    # Three sessions; verify after the snapshot, after a burst with a 3000-row transaction per
    # session (caught up by verify), and after a burst streamed by a run of its own.
    log = differential(
        spark,
        db,
        seed,
        [dict(transactions=30, large_rows=3000, run=False), dict(transactions=40)],
        sessions=3,
        initial_rows=200,
    )
    print("\n".join(log))
