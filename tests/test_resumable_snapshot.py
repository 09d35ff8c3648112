"""A snapshot that resumes where it stopped (``capture.ranges``): a large table with an integer
or uuid key is read in key ranges, each landed on its own. A run killed after some ranges
landed loses none of them: the next run reads only the others, at a snapshot of its own, and
the rows changed in between (keys moved across ranges included) come out exact. PostgreSQL is
the oracle (``verify``); the runs are whole ``pgmedallion`` processes, killed by a failpoint
(SIGKILL) the way a lost machine stops one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import psycopg
import pyarrow.compute as pc
from deltalake import DeltaTable

from pgmedallion.capture.ranges import RangePlan, range_count, resume_plan, rewind_payload
from pgmedallion.capture.snapshot import Column
from pgmedallion.core.config import load_config
from pgmedallion.core.failpoints import ENV
from tests.test_cli import source_config

REPO = Path(__file__).resolve().parent.parent

SCHEMA = """
CREATE TABLE items (id bigint PRIMARY KEY, name text, qty int, pad text);
CREATE TABLE tokens (id uuid PRIMARY KEY, n int, pad text);
CREATE TABLE labels (code text PRIMARY KEY, v int);
CREATE TABLE plain (v int, pad text);
ALTER TABLE plain REPLICA IDENTITY FULL;
INSERT INTO items SELECT g, 'item ' || g, g % 100, repeat('p', 120)
  FROM generate_series(1, 40000) g;
INSERT INTO tokens SELECT md5(g::text)::uuid, g, repeat('t', 120) FROM generate_series(1, 20000) g;
INSERT INTO labels SELECT 'c' || g, g FROM generate_series(1, 500) g;
INSERT INTO plain SELECT g, repeat('x', 50) FROM generate_series(1, 500) g;
CREATE PUBLICATION rs_pub FOR ALL TABLES;
"""


def _workload(conn: psycopg.Connection, step: int) -> None:
    """Changes in ranges landed and not: updates, deletes, inserts, keys moved across ranges
    (a low key to a high one, and back), on every table."""
    conn.execute("UPDATE items SET qty = qty + %s WHERE id %% 13 = 0", (step,))
    conn.execute("DELETE FROM items WHERE id %% 29 = %s", (step,))
    conn.execute(
        "INSERT INTO items SELECT g, 'late ' || g, %s, 'l' FROM generate_series(%s, %s) g",
        (step, 100000 * step, 100000 * step + 199),
    )
    conn.execute("UPDATE items SET id = id + 1000000 WHERE id BETWEEN %s AND %s", (step, step + 40))
    conn.execute("UPDATE items SET id = %s WHERE id = (SELECT max(id) FROM items)", (-step,))
    conn.execute("UPDATE tokens SET n = n + 1 WHERE n %% 17 = %s", (step,))
    conn.execute("DELETE FROM tokens WHERE n %% 31 = %s", (step,))
    conn.execute(
        "INSERT INTO tokens SELECT md5('s' || %s || g)::uuid, -g, 'n'"
        " FROM generate_series(1, 50) g",
        (step,),
    )
    conn.execute("UPDATE labels SET v = v + 1 WHERE v % 7 = 0")
    conn.execute("INSERT INTO plain VALUES (%s, 'again')", (step,))


def _lakehouse(tmp_path: Path, db: dict) -> tuple[Path, dict]:
    config = tmp_path / "pgmedallion.toml"
    text = source_config(db, "rs", tmp_path / "state")
    config.write_text(text.replace("[lakehouse]", "snapshot_range_mb = 0.5\n[lakehouse]"))
    env = dict(os.environ, RS_PW=db["password"], PYTHONPATH=str(REPO))
    env.pop(ENV, None)
    return config, env


def _run(config: Path, env: dict, *args: str, failpoints: str = "") -> subprocess.CompletedProcess:
    env = dict(env, **({ENV: failpoints} if failpoints else {}))
    return subprocess.run(
        [sys.executable, "-m", "pgmedallion.cli", "-c", str(config), *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=900,
    )


def _ranges(config: Path) -> list[dict]:
    """Bronze's ``range`` records (``table_name``, ``part``, ``lsn``, ``batch_id``)."""
    path = load_config(config).local_table_path("bronze", "bronze")
    records = DeltaTable(path).to_pyarrow_table(
        columns=["kind", "table_name", "part", "lsn", "batch_id"]
    )
    return records.filter(pc.equal(records.column("kind"), "range")).to_pylist()


def _copied(config: Path, table: str) -> int:
    """Rows of ``table`` in bronze's copy records, every attempt's (a part holds as many rows
    as its largest ordinal)."""
    path = load_config(config).local_table_path("bronze", "bronze")
    records = DeltaTable(path).to_pyarrow_table(
        columns=["kind", "table_name", "part", "batch_id", "ordinal"]
    )
    copies = records.filter(
        pc.and_(
            pc.equal(records.column("kind"), "copy"), pc.equal(records.column("table_name"), table)
        )
    )
    parts: dict[tuple[int, int], int] = {}
    for r in copies.to_pylist():
        key = (r["batch_id"], r["part"])
        parts[key] = max(parts.get(key, 0), r["ordinal"])
    return sum(parts.values())


def test_a_killed_snapshot_resumes_with_the_ranges_it_landed(db, tmp_path):
    with psycopg.connect(**db, autocommit=True) as conn:
        conn.execute(SCHEMA)
    config, env = _lakehouse(tmp_path, db)

    # 1. killed after the 3rd wave of ranges (two per wave: two workers)
    killed = _run(config, env, "run", failpoints="snapshot.range_landed=3")
    assert killed.returncode == -9, killed.stdout + killed.stderr
    first = _ranges(config)
    assert len(first) == 6, first
    status = _run(config, env, "status")
    assert "snapshot under way: public.items: 6 of " in status.stdout, status.stdout
    with psycopg.connect(**db, autocommit=True) as conn:
        _workload(conn, 1)

    # 2. killed again, two waves later: it read none of the six ranges again
    killed = _run(config, env, "run", failpoints="snapshot.range_landed=2")
    assert killed.returncode == -9, killed.stdout + killed.stderr
    assert "key ranges landed before" in killed.stderr, killed.stderr
    second = _ranges(config)
    assert len(second) == 10, second
    with psycopg.connect(**db, autocommit=True) as conn:
        _workload(conn, 2)

    # 3. to the end: the other ranges only, then the stream; gold exact
    done = _run(config, env, "run")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert "snapshot under way" not in _run(config, env, "status").stdout
    ranges = _ranges(config)
    per_table = Counter(r["table_name"] for r in ranges)
    landed = Counter((r["table_name"], r["part"]) for r in ranges)
    assert set(landed.values()) == {1}, landed  # no range was read twice
    assert per_table["items"] >= 10 and per_table["tokens"] >= 4, per_table
    assert {"labels", "plain"}.isdisjoint(per_table)  # text key, no key: one commit as before
    lsns = {r["lsn"] for r in ranges if r["table_name"] == "items"}
    assert len(lsns) == 3, lsns  # three snapshots, one per attempt
    # every range's rows once: as many copy rows as the three attempts' ranges held
    # (a whole second read would hold twice the table's 40,000 rows)
    assert 38000 < _copied(config, "items") <= 40000 + 400, _copied(config, "items")

    with psycopg.connect(**db, autocommit=True) as conn:
        _workload(conn, 3)
    again = _run(config, env, "run")
    assert again.returncode == 0, again.stdout + again.stderr
    verified = _run(config, env, "verify")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert "verify: OK" in verified.stdout, verified.stdout
    for table in ("items", "tokens", "labels", "plain"):
        assert f"public.{table}" in verified.stdout, verified.stdout


def test_a_range_plan_is_kept_only_for_the_same_key_and_schema():
    key = Column("id", 20, -1, True, "bigint", False)
    record = {"key": "id", "type_oid": 20, "bounds": [10, 20], "schema": "s1"}
    landed = [
        {"lsn": 100, "batch_id": 3, "part": 0, "payload": record},
        {"lsn": 100, "batch_id": 3, "part": 2, "payload": record},
    ]
    plan = resume_plan(landed, key, "s1")
    assert plan == RangePlan("id", 20, (10, 20), "s1", {0: (100, 3), 2: (100, 3)})
    assert plan.todo() == [1]
    assert plan.limits(0) == (None, 10) and plan.limits(1) == (10, 20)
    assert plan.limits(2) == (20, None)
    assert resume_plan(landed, key, "s2") is None  # the schema changed: start over
    other = Column("code", 20, -1, True, "bigint", False)
    assert resume_plan(landed, other, "s1") is None
    mixed = [*landed, {"lsn": 90, "batch_id": 2, "part": 1, "payload": {**record, "bounds": [5]}}]
    assert resume_plan(mixed, key, "s1") is None
    assert resume_plan([], key, "s1") is None
    assert range_count(10 << 20, 32 << 20) == 1  # below two ranges: not in key ranges
    assert range_count(100 << 20, 32 << 20) == 4
    assert range_count(100 << 20, 0) == 1


def test_the_rewind_record_names_each_range_snapshot_lsn_and_batch():
    plan = RangePlan("id", 20, (10, 20), "s", {})
    payload = json.loads(rewind_payload(plan, {0: (5, 1), 1: (7, 2), 2: (7, 2)}))
    assert payload == {
        "key": "id",
        "type_oid": 20,
        "bounds": [10, 20],
        "ranges": [[5, 1], [7, 2], [7, 2]],
    }
