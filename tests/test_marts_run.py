"""``run`` runs the configured marts after gold, and a run without marts pays nothing for them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pgmedallion.core.config import load_config
from tests.conftest import STATE

ROOT = Path(__file__).resolve().parents[1]


def _child_env() -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path}


def test_marts_folder_is_relative_to_the_config_file(tmp_path):
    conf = tmp_path / "conf" / "pgmedallion.toml"
    conf.parent.mkdir()
    conf.write_text('[lakehouse]\nmarts = "marts/shop"\nmarts_schema = "shop_marts"\n')
    loaded = load_config(conf, env={})
    assert loaded.lakehouse.marts == str(tmp_path / "conf" / "marts" / "shop")
    assert loaded.lakehouse.marts_schema == "shop_marts"
    assert loaded.qualified("marts", "_quality") == "`shop_marts`.`_quality`"
    # A variable names a folder relative to the working directory, as given.
    assert load_config(conf, env={"PGMEDALLION_LAKEHOUSE_MARTS": "m"}).lakehouse.marts == "m"
    (tmp_path / "empty.toml").write_text("")
    assert load_config(tmp_path / "empty.toml", env={}).lakehouse.marts == ""


def test_a_run_without_marts_imports_and_starts_nothing_for_them():
    code = (
        "import sys\n"
        "from core.config import Config\n"
        "from pgmedallion.pipeline import run_stages\n"
        "def no_spark():\n"
        "    raise AssertionError('Spark was asked for')\n"
        "result = run_stages(no_spark, Config(), ('marts',))\n"
        "print(result.stages, result.marts, 'pgmedallion.marts.runner' in sys.modules)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=_child_env(), capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["[]", "None", "False"]


@pytest.mark.slow
def test_marts_stage_ends_the_local_jvm_then_runs_and_records_expectations():
    state = STATE / "marts-run"
    shutil.rmtree(state, ignore_errors=True)
    proc = subprocess.run(
        [sys.executable, "-m", "tests.marts_child", str(state)],
        cwd=ROOT,
        env=_child_env(),
        capture_output=True,
        text=True,
        timeout=1200,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = json.loads(lines[-1].removeprefix("RESULT "))
    assert out["stages"] == ["marts"]
    # The pipeline's datasets, read back by a new local JVM on the same metastore.
    assert out["revenue"] == [["2026-01-01", 2, "15.00"], ["2026-01-02", 1, "7.25"]]
    assert out["statuses"] == 4
    rules = [
        (q["run"], q["table"], q["rule"], q["policy"], q["passed"], q["failed"])
        for q in out["quality"]
    ]
    assert rules == [
        (1, "daily_revenue", "day_present", "drop", 2, 0),
        (1, "daily_revenue", "revenue_positive", "warn", 2, 0),
        (1, "order_status", "known_status", "fail", 4, 0),
        (1, "order_status", "value_not_negative", "warn", 4, 0),
    ]
    assert out["recorded"] == 4
    # An expect_or_fail rule broken by gold's data fails the update, naming the rule.
    assert out["failure"] is not None and "known_status" in out["failure"]
    assert "Traceback" not in proc.stderr
