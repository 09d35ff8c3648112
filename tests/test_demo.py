"""The README's first command: ``pgmedallion demo`` runs the whole pipeline and verifies it."""

from __future__ import annotations

import os
import subprocess

import pytest

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
    subprocess.run(["pgmedallion", "postgres", "stop"], env=env, capture_output=True, timeout=120)
