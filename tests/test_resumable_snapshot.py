"""A snapshot that resumes where it stopped (``capture.ranges``): a large table with an integer
or uuid key is read in key ranges, each landed on its own. A run killed after some ranges
landed loses none of them: the next run reads only the others, at a snapshot of its own, and
the rows changed in between (keys moved across ranges included) come out exact. PostgreSQL is
the oracle (``verify``); the runs are whole ``pgmedallion`` processes, killed by a failpoint
(SIGKILL) the way a lost machine stops one.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
from collections import Counter
from pathlib import Path

import psycopg
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable

from pgmedallion.bronze.spark_table import RANGES_PER_WORKER
from pgmedallion.bronze.store import DeltaRsBronze
from pgmedallion.capture.ranges import RangePlan, range_count, resume_plan, rewind_payload
from pgmedallion.capture.snapshot import Column
from pgmedallion.core.config import load_config
from pgmedallion.core.failpoints import ENV
from tests.test_cli import source_config
from tests.test_failover import _run as run_cli

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
    # two ranges per commit on either engine: the waves these trials count
    settings = "snapshot_range_mb = 0.5\nsnapshot_ranges_per_commit = 2\n"
    config.write_text(text.replace("[lakehouse]", settings + "[lakehouse]"))
    env = dict(os.environ, RS_PW=db["password"], PYTHONPATH=str(REPO))
    env.pop(ENV, None)
    return config, env


def _run(config: Path, env: dict, *args: str, failpoints: str = "") -> subprocess.CompletedProcess:
    """A whole ``pgmedallion`` process (``failpoints`` armed: it may die of SIGKILL)."""
    return run_cli(config, dict(env, **({ENV: failpoints} if failpoints else {})), *args)


def _ranges(config: Path) -> list[dict]:
    """Bronze's ``range`` records (``table_name``, ``part``, ``lsn``, ``batch_id``)."""
    path = load_config(config).local_table_path("bronze", "bronze")
    records = DeltaTable(path).to_pyarrow_table(
        columns=["kind", "table_name", "part", "lsn", "batch_id"]
    )
    return records.filter(pc.equal(records.column("kind"), "range")).to_pylist()


def _range_count(config: Path) -> int:
    """How many key ranges the (one) snapshot under way is read in, from its range records."""
    path = load_config(config).local_table_path("bronze", "bronze")
    records = DeltaTable(path).to_pyarrow_table(columns=["kind", "payload"])
    plans = {
        len(json.loads(p)["bounds"]) + 1
        for p in records.filter(pc.equal(records.column("kind"), "range"))
        .column("payload")
        .to_pylist()
    }
    (count,) = plans
    return count


def _bounds(config: Path) -> list[int]:
    """The boundaries of the (one) plan of integer key ranges, from its range records."""
    path = load_config(config).local_table_path("bronze", "bronze")
    records = DeltaTable(path).to_pyarrow_table(columns=["kind", "payload"])
    plans = {
        tuple(json.loads(p)["bounds"])
        for p in records.filter(pc.equal(records.column("kind"), "range"))
        .column("payload")
        .to_pylist()
    }
    (bounds,) = plans
    return [int(b) for b in bounds]


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
    # the waves hold no control record, and the next batch id counts them all the same (a
    # stream batch numbered as one of them would be skipped by Delta as committed)
    cfg = load_config(config)
    bronze = DeltaRsBronze(cfg.local_table_path("bronze", "bronze"), "bronze", "rs")
    assert bronze.state().next_batch_id == max(r["batch_id"] for r in first) + 1
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

    # the ranges' LSNs stay with the table for the runs after
    tables = DeltaTable(cfg.local_table_path("silver", "_tables")).to_pyarrow_table().to_pylist()
    [items] = [t for t in tables if t["table_name"] == "items"]
    assert len(json.loads(items["snapshot_ranges"])["ranges"]) == per_table["items"]

    with psycopg.connect(**db, autocommit=True) as conn:
        _workload(conn, 3)
    again = _run(config, env, "run")
    assert again.returncode == 0, again.stdout + again.stderr
    verified = _run(config, env, "verify")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert "verify: OK" in verified.stdout, verified.stdout
    for table in ("items", "tokens", "labels", "plain"):
        assert f"public.{table}" in verified.stdout, verified.stdout


def test_changes_read_after_the_run_that_took_the_snapshot_are_judged_by_their_range(db, tmp_path):
    """Silver takes a snapshot read in key ranges before the stream passes its newest range
    (capture killed right after the snapshot's last commit, silver run alone): the changes
    the next run reads, older than the newest range, are judged by each key's range."""
    with psycopg.connect(**db, autocommit=True) as conn:
        conn.execute("CREATE TABLE other (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO other SELECT g, 'v' FROM generate_series(1, 10) g")
        conn.execute("CREATE PUBLICATION rs_pub FOR ALL TABLES")
    config, env = _lakehouse(tmp_path, db)
    first = _run(config, env, "run")  # bronze's frontier F0, silver's and gold's too
    assert first.returncode == 0, first.stdout + first.stderr
    with psycopg.connect(**db, autocommit=True) as conn:  # a table published past F0
        conn.execute(
            "CREATE TABLE items (id bigint PRIMARY KEY, name text, qty int, pad text);"
            "INSERT INTO items SELECT g, 'item ' || g, g % 100, repeat('p', 120)"
            "  FROM generate_series(1, 20000) g"
        )
    killed = _run(config, env, "run", failpoints="snapshot.range_landed=2")
    assert killed.returncode == -9, killed.stdout + killed.stderr
    with psycopg.connect(**db, autocommit=True) as conn:
        conn.execute("UPDATE items SET qty = -qty WHERE id % 3 = 0")  # every range
        conn.execute("DELETE FROM items WHERE id % 7 = 0")
        conn.execute("UPDATE items SET id = id + 100000 WHERE id % 101 = 0")
    # the ranges not landed are read now, then the process dies before the stream goes on
    killed = _run(config, env, "run", "--stage", "capture", failpoints="snapshot.after_commit")
    assert killed.returncode == -9, killed.stdout + killed.stderr
    for stage in ("silver", "gold"):  # the snapshot, at frontier F0 (below both ranges' LSNs)
        alone = _run(config, env, "run", "--stage", stage)
        assert alone.returncode == 0, alone.stdout + alone.stderr
    assert "public.items" in alone.stdout, alone.stdout
    done = _run(config, env, "run")  # the stream: the changes between the two attempts
    assert done.returncode == 0, done.stdout + done.stderr
    verified = _run(config, env, "verify")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert "verify: OK" in verified.stdout, verified.stdout


def test_each_commit_lands_the_bronze_writers_number_of_ranges(db, tmp_path):
    """Without ``snapshot_ranges_per_commit``, a commit lands the bronze writer's number of key
    ranges: one per worker (two workers) locally, ``RANGES_PER_WORKER`` per worker through
    Spark, whose commits cost a second or two each; the last wave holds the rest. ``verify``
    is exact."""
    with psycopg.connect(**db, autocommit=True) as conn:
        conn.execute(SCHEMA)
    config, env = _lakehouse(tmp_path, db)
    config.write_text(config.read_text().replace("snapshot_ranges_per_commit = 2\n", ""))
    done = _run(config, env, "run")
    assert done.returncode == 0, done.stdout + done.stderr
    spark = os.environ.get("PGMEDALLION_LAKEHOUSE_ENGINE") == "spark"
    wave = 2 * (RANGES_PER_WORKER if spark else 1)
    ranges = _ranges(config)
    per_batch = Counter(r["batch_id"] for r in ranges)
    sizes = [per_batch[b] for b in sorted(per_batch)]
    assert len(ranges) > 2 * wave, sizes  # items and tokens: about 14 and 7 ranges
    assert sizes[:-1] == [wave] * (len(sizes) - 1) and 0 < sizes[-1] <= wave, sizes
    verified = _run(config, env, "verify")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert "verify: OK" in verified.stdout, verified.stdout


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
    # an attempt that started over (new bounds) is the plan; the abandoned ranges are not kept
    newer = {**record, "bounds": [5]}
    mixed = [*landed, {"lsn": 90, "batch_id": 4, "part": 1, "payload": newer}]
    assert resume_plan(mixed, key, "s1") == RangePlan("id", 20, (5,), "s1", {1: (90, 4)})
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


def _copy_by_snapshot(config: Path, table: str) -> dict[int, tuple[int, int]]:
    """Snapshot LSN (one per attempt) -> (rows, bytes) of ``table``'s copy records."""
    path = load_config(config).local_table_path("bronze", "bronze")
    records = DeltaTable(path).to_pyarrow_table(
        columns=["kind", "table_name", "lsn", "part", "batch_id", "ordinal", "payload"]
    )
    copies = records.filter(
        pc.and_(
            pc.equal(records.column("kind"), "copy"), pc.equal(records.column("table_name"), table)
        )
    )
    sizes = pc.binary_length(copies.column("payload")).to_pylist()
    parts: dict[tuple[int, int, int], int] = {}
    out: dict[int, list[int]] = {}
    for r, size in zip(copies.drop_columns(["payload"]).to_pylist(), sizes, strict=True):
        key = (r["lsn"], r["batch_id"], r["part"])
        parts[key] = max(parts.get(key, 0), r["ordinal"])
        out.setdefault(r["lsn"], [0, 0])[1] += size
    for (lsn, _, _), rows in parts.items():
        out[lsn][0] += rows
    return {lsn: (rows, size) for lsn, (rows, size) in out.items()}


@pytest.mark.slow
def test_a_4m_row_snapshot_killed_at_half_and_at_90_percent_reads_each_range_once(db, tmp_path):
    """Issue 48's trial at its size: 4M rows (about 660 MB of heap, default
    ``snapshot_range_mb``), killed after the wave that passes half of the ranges and again
    after the one that passes 90%, rows changed in between; the last run reads only the
    ranges not landed (rows and bytes), and ``verify`` is exact."""
    with psycopg.connect(**db, autocommit=True) as conn:
        conn.execute("CREATE TABLE big (id bigint PRIMARY KEY, a int, note text, at timestamptz)")
        for first in range(1, 4_000_001, 1_000_000):
            conn.execute(
                "INSERT INTO big SELECT g, g %% 1000, md5(g::text) || lpad(g::text, 8, '0'),"
                " timestamptz '2024-01-01' + g * interval '1 second'"
                " FROM generate_series(%s::int8, %s::int8) g",
                (first, first + 999_999),
            )
        conn.execute("VACUUM ANALYZE big")
        conn.execute("CREATE PUBLICATION rs_pub FOR TABLE big")
    config, env = _lakehouse(tmp_path, db)  # ranges of 16 MB: about 24 of them
    config.write_text(
        config.read_text().replace("snapshot_range_mb = 0.5", "snapshot_range_mb = 16")
    )

    def changes(conn: psycopg.Connection, step: int) -> None:
        conn.execute("UPDATE big SET a = -a - %s WHERE id %% 997 = 0", (step,))
        conn.execute("DELETE FROM big WHERE id %% 1009 = %s", (step,))
        conn.execute(
            "UPDATE big SET id = id + 10000000 WHERE id BETWEEN %s AND %s", (step, step + 9)
        )
        conn.execute(
            "INSERT INTO big SELECT g, 7, 'late', now() FROM generate_series(%s::int8, %s::int8) g",
            (20_000_000 + step * 1000, 20_000_000 + step * 1000 + 999),
        )

    killed = _run(config, env, "run", failpoints="snapshot.range_landed=6")  # 12 ranges
    assert killed.returncode == -9, killed.stdout + killed.stderr
    ranges = _ranges(config)
    assert len(ranges) == 12, ranges
    count = _range_count(config)
    assert 20 <= count <= 30, count
    ninety = math.ceil(0.9 * count / 2)  # the wave that passes 90%
    with psycopg.connect(**db, autocommit=True) as conn:
        changes(conn, 1)
    killed = _run(config, env, "run", failpoints=f"snapshot.range_landed={ninety - 6}")
    assert killed.returncode == -9, killed.stdout + killed.stderr
    assert f"12 of {count} key ranges landed before" in killed.stderr, killed.stderr
    before = 2 * ninety
    assert len(_ranges(config)) == before
    with psycopg.connect(**db, autocommit=True) as conn:
        changes(conn, 2)
    done = _run(config, env, "run")
    assert done.returncode == 0, done.stdout + done.stderr

    ranges = _ranges(config)
    assert len(ranges) == count
    landed = Counter(r["part"] for r in ranges)
    assert sorted(landed) == list(range(count)) and set(landed.values()) == {1}, landed
    attempts = [v for _, v in sorted(_copy_by_snapshot(config, "big").items())]
    assert len(attempts) == 3, attempts
    rows = [r for r, _ in attempts]
    sizes = [b for _, b in attempts]
    # each range once: the three attempts together read the table once (4M rows, plus the
    # thousand inserted before the last attempt at most)
    assert 3_990_000 <= sum(rows) <= 4_001_000, rows
    # each attempt read exactly the ranges it landed: its rows are the keys 1..4M its ranges
    # hold, give or take the few thousand the changes deleted, moved or inserted before it
    # (sampled boundaries make ranges uneven, so a share of the count is not a measure)
    bounds = _bounds(config)
    edges = [1, *(min(max(b, 1), 4_000_001) for b in bounds), 4_000_001]
    keys_in = [edges[i + 1] - edges[i] for i in range(count)]
    by_attempt: dict[int, int] = {}
    for r in ranges:
        by_attempt[r["lsn"]] = by_attempt.get(r["lsn"], 0) + keys_in[r["part"]]
    expected = [v for _, v in sorted(by_attempt.items())]
    assert sorted(by_attempt) == sorted(_copy_by_snapshot(config, "big"))
    parts = [n for _, n in sorted(Counter(r["lsn"] for r in ranges).items())]
    assert parts == [12, before - 12, count - before], parts
    for got, want in zip(rows, expected, strict=True):
        assert abs(got - want) <= 12_000, (rows, expected)
    # and bytes follow rows: the last attempt read no more than its ranges' share of the bytes
    assert sizes[2] <= (expected[2] / sum(expected) + 0.01) * sum(sizes), (sizes, expected)

    with psycopg.connect(**db, autocommit=True) as conn:
        changes(conn, 3)
    assert _run(config, env, "run").returncode == 0
    verified = _run(config, env, "verify")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert "verify: OK" in verified.stdout, verified.stdout
