"""The README's first command: ``pgmedallion demo`` runs the whole pipeline and verifies it."""

from __future__ import annotations

import os
import subprocess

import pytest

from pgmedallion.localpg import LocalPostgres
from tests.conftest import STATE


@pytest.mark.slow
def test_demo_exits_0_with_an_exact_verify():
    state = STATE / "demo"
    env = {**os.environ, "PGMEDALLION_LAKEHOUSE_STATE_DIR": str(state)}
    proc = subprocess.run(
        ["pgmedallion", "demo"], env=env, capture_output=True, text=True, timeout=1800
    )
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-3000:]
    assert "verify: OK" in out
    for table in ("public.customers", "public.products", "public.orders", "public.OrderItems"):
        assert f"{table} " in out and "exact, gold" in out
    assert "MISMATCH" not in out
    # A few seconds of run --continuous seen through status --watch: changes arrive, and two
    # frames show each table's as-of time and lag
    assert "live: " in out and "changes in 50 transactions while it runs" in out, out[-3000:]
    assert out.count("pgmedallion status, every 1.5 s") == 2, out[-3000:]
    assert "as of (UTC)" in out and "live: stopped cleanly after" in out
    # The demo's marts ran after gold, and their expectation results are printed per rule.
    assert "marts expectations" in out
    for rule in ("daily_revenue.day_present", "order_status.known_status"):
        assert any(line.strip().startswith(rule) and "passed" in line for line in out.splitlines())
    server = LocalPostgres(state / "postgres")
    assert not server.is_running()  # nothing the demo started outlives it
    # In a new directory the two runs go as `pgmedallion run` goes: silver and gold make their
    # tables without Spark (delta-rs), and the catalog learns of them when Spark starts after.
    assert "registered in the catalog: `pgm_silver`._adjustments" in proc.stderr, proc.stderr[
        -3000:
    ]
    assert "registered in the catalog: `pgm_gold`._frontier" in proc.stderr, proc.stderr[-3000:]

    # The next commands in that directory work on the demo's state, with no setup.
    status = subprocess.run(
        ["pgmedallion", "status"], env=env, capture_output=True, text=True, timeout=600
    )
    assert status.returncode == 0, status.stdout[-2000:] + status.stderr[-2000:]
    assert "cannot connect" not in status.stdout and "public.orders" in status.stdout
    sql = subprocess.run(
        ["pgmedallion", "sql", "SELECT count(*) AS n FROM pgm_gold.public_products"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert sql.returncode == 0, sql.stderr[-2000:]
    assert "ERROR" not in sql.stderr and "ERROR" not in status.stderr
    assert not server.is_running()

    # The demo again in the same directory: it drops what the first one made and starts over.
    again = subprocess.run(
        ["pgmedallion", "demo"], env=env, capture_output=True, text=True, timeout=1800
    )
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "verify: OK" in again.stdout and "MISMATCH" not in again.stdout
    assert "public.customers             500 rows" in again.stdout
    assert not server.is_running()
