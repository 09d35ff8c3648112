"""A scheduled run whose work is small needs no Spark: capture, silver and gold in the driver
(delta-rs reads and commits, the plain cast over Arrow, gold's rule checks), and PostgreSQL
agrees with gold afterwards. A run that needs Spark starts it halfway and is exact too.

The runs are whole ``pgmedallion run`` processes as a scheduled job starts them; the ones that
must not start Spark run with ``JAVA_HOME`` pointing nowhere, where starting it fails
(``JavaMissing``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from tests.test_cli import source_config

REPO = Path(__file__).resolve().parent.parent

SCHEMA = """
CREATE DOMAIN positive AS int CHECK (VALUE > 0);
CREATE TABLE orders (
    id bigint PRIMARY KEY,
    qty positive NOT NULL,
    price numeric(12,2),
    ratio numeric,
    note text,
    placed timestamptz,
    local timestamp(3),
    day date,
    paid boolean,
    score double precision,
    small real,
    doc jsonb,
    ref uuid,
    blob bytea,
    tiny smallint
);
CREATE TABLE events (kind text, at timestamptz, n int);
CREATE TABLE spans (id int PRIMARY KEY, d interval);
INSERT INTO spans VALUES (1, '1 day'), (2, '2 mons 3 days 04:05:06');
ALTER TABLE events REPLICA IDENTITY FULL;
INSERT INTO orders
SELECT g, g % 7 + 1, g * 1.25, g / 4.0, 'note ' || g, '2026-01-01 00:00:00+00'::timestamptz
       + g * interval '1 minute 0.25 s', '2026-02-01 12:00:00'::timestamp + g * interval '1 s',
       '2026-01-01'::date + g, g % 2 = 0, g * 0.1, g / 4.0, jsonb_build_object('g', g),
       md5(g::text)::uuid, decode(lpad(to_hex(g), 4, '0'), 'hex'), g % 100
FROM generate_series(1, 400) g;
INSERT INTO events SELECT 'k' || (g % 5), '2026-03-01'::timestamptz + g * interval '1 h', g % 3
FROM generate_series(1, 60) g;
"""

CHANGES = """
UPDATE orders SET qty = qty + 1, price = price * 2, note = 'changed'
WHERE id % 10 = 0;
UPDATE orders SET ratio = 123456789.000000000001, score = 'NaN', small = '-0', placed = NULL
WHERE id = 7;
UPDATE orders SET score = '-Infinity', doc = '{"a": [1, 2, {"b": null}]}', blob = '\\x'
WHERE id = 8;
DELETE FROM orders WHERE id % 25 = 0;
INSERT INTO orders (id, qty, price, note, local, day, tiny)
VALUES (1001, 3, 0.5, E'tab\\there, newline\\nthere, back\\\\slash', '2026-05-05 05:05:05.5',
        '2000-02-29', -32768);
UPDATE orders SET id = 2000 WHERE id = 3;
UPDATE events SET n = n + 10 WHERE kind = 'k1';
DELETE FROM events WHERE kind = 'k2';
INSERT INTO events SELECT 'k1', at, n FROM events WHERE kind = 'k1' LIMIT 3;
"""


def _lakehouse(db: dict, tmp_path: Path, name: str, schema: str, tables: str):
    """``schema`` made in the test database and published (``tables``) as source ``name``:
    the config file, the environment of a run, and the same with ``JAVA_HOME`` nowhere."""
    with psycopg.connect(**db, autocommit=True) as conn:
        conn.execute(schema)
        conn.execute(f"CREATE PUBLICATION {name}_pub FOR TABLE {tables}")
    config = tmp_path / "pgmedallion.toml"
    config.write_text(source_config(db, name, tmp_path / "state"))
    env = dict(os.environ, **{f"{name.upper()}_PW": db["password"]}, PYTHONPATH=str(REPO))
    return config, env, dict(env, JAVA_HOME=str(tmp_path / "no-java-here"))


def _run(config: Path, env: dict, *args: str, pyspark: bool = True) -> subprocess.CompletedProcess:
    """``pgmedallion`` with ``args``; without ``pyspark``, in a process where PySpark, Delta's
    Spark package and py4j cannot be imported (``tests/nospark_child.py``), which fails if any
    of them was loaded."""
    command = ["-m", "pgmedallion.cli"] if pyspark else [str(REPO / "tests" / "nospark_child.py")]
    return subprocess.run(
        [sys.executable, *command, "-c", str(config), *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=900,
    )


@pytest.mark.skipif(
    os.environ.get("PGMEDALLION_LAKEHOUSE_ENGINE") == "spark",
    reason="Spark commits every table on this engine",
)
def test_an_incremental_run_needs_no_spark_and_gold_stays_exact(db, tmp_path):
    config, env, no_java = _lakehouse(db, tmp_path, "lazy", SCHEMA, "orders, events, spans")
    # every table keeps its history, in the driver too (gold/history_table.py)
    env["PGMEDALLION_LAKEHOUSE_HISTORY"] = no_java["PGMEDALLION_LAKEHOUSE_HISTORY"] = "true"

    first = _run(config, env, "run")
    assert first.returncode == 0, first.stdout + first.stderr
    assert "gold: public.orders: 400 rows" in first.stdout, first.stdout
    # the first snapshot's rows are decoded, cast and appended in the driver, of every type
    assert "public.orders: snapshot of 400 rows read in the driver" in first.stderr, first.stderr
    assert "public.spans: snapshot of 2 rows read in the driver" in first.stderr

    with psycopg.connect(**db, autocommit=True) as conn:
        conn.execute(CHANGES)
    driver = _run(config, no_java, "run")
    assert driver.returncode == 0, driver.stdout + driver.stderr
    assert "starting Spark" not in driver.stderr, driver.stderr
    assert "gold: public.orders: 385 rows" in driver.stdout, driver.stdout
    assert "(incremental)" in driver.stdout

    # interval is cast in the driver too
    with psycopg.connect(**db, autocommit=True) as conn:
        conn.execute("UPDATE spans SET d = d + interval '1 hour' WHERE id = 2")
    spans = _run(config, no_java, "run")
    assert spans.returncode == 0, spans.stdout + spans.stderr
    assert "starting Spark" not in spans.stderr, spans.stderr

    # A migration while captured: capture stops at the new Relation to read the catalog, and
    # reads the transaction again, so the window holds two reads of one commit LSN; the driver
    # keeps one (silver.decode.chosen_reads), as Spark would.
    with psycopg.connect(**db, autocommit=True) as conn:
        conn.execute(
            "BEGIN; INSERT INTO spans VALUES (3, '3 hours'); ALTER TABLE spans ADD COLUMN note"
            " text; INSERT INTO spans VALUES (4, '4 hours', 'four'); COMMIT"
        )
        conn.execute("UPDATE spans SET note = 'one' WHERE id = 1")
    migrated = _run(config, no_java, "-v", "run")
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr
    assert "wal rows of other reads of the window's transactions left out" in migrated.stderr
    assert "starting Spark" not in migrated.stderr, migrated.stderr
    assert "gold: public.spans: 4 rows" in migrated.stdout, migrated.stdout

    # The migrations application frameworks run: a column added with a default for the rows
    # already there (silver's and gold's rows take it), a column renamed; followed in place
    # by commits of ours, no Spark, gold incremental.
    with psycopg.connect(**db, autocommit=True) as conn:
        conn.execute("ALTER TABLE orders ADD COLUMN status text NOT NULL DEFAULT 'new'")
        conn.execute("ALTER TABLE events RENAME COLUMN n TO amount")
        conn.execute("UPDATE orders SET status = 'paid' WHERE id = 10")
        conn.execute("INSERT INTO events VALUES ('k9', '2026-04-01 00:00:00+00', 5)")
    reshaped = _run(config, no_java, "run")
    assert reshaped.returncode == 0, reshaped.stdout + reshaped.stderr
    assert "starting Spark" not in reshaped.stderr, reshaped.stderr
    gold_dir = tmp_path / "state" / "warehouse" / "pgm_gold.db"
    for table in ("orders", "events", "spans"):
        assert (gold_dir / f"public_{table}__history" / "_delta_log").is_dir()
    assert "gold: public.orders: 385 rows" in reshaped.stdout, reshaped.stdout
    orders = [line for line in reshaped.stdout.splitlines() if "gold: public.orders" in line]
    assert orders and "(incremental)" in orders[0], reshaped.stdout
    assert "column(s) status added with the value of the rows already there" in reshaped.stderr
    assert "renamed: n -> amount" in reshaped.stderr, reshaped.stderr

    # A run killed between a gold commit and its history's: the next run finds gold done and
    # brings the history up to it (verify, below, compares each history with gold).
    with psycopg.connect(**db, autocommit=True) as conn:
        conn.execute("UPDATE orders SET note = 'killed' WHERE id = 14")
    killed = _run(config, dict(no_java, PGMEDALLION_FAILPOINTS="gold.after_table"), "run")
    assert killed.returncode != 0, killed.stdout + killed.stderr

    # A run that needs Spark (here a table with more changes than [lakehouse] batch_changes)
    # starts it halfway, and is exact.
    with psycopg.connect(**db, autocommit=True) as conn:
        conn.execute("UPDATE spans SET d = d + interval '1 hour'")
        conn.execute("UPDATE orders SET note = 'again' WHERE id = 12")
    halfway = _run(config, dict(env, PGMEDALLION_LAKEHOUSE_BATCH_CHANGES="1"), "run")
    assert halfway.returncode == 0, halfway.stdout + halfway.stderr
    assert "starting Spark" in halfway.stderr, halfway.stderr

    verify = _run(config, env, "verify")
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert "public.orders" in verify.stdout and "public.events" in verify.stdout
    assert "verify: OK" in verify.stdout, verify.stdout
    # each table's history read as of gold's frontier is gold
    assert verify.stdout.count("history exact") == 3, verify.stdout
    assert "Traceback" not in driver.stderr + spans.stderr + migrated.stderr + halfway.stderr
    assert "Traceback" not in reshaped.stderr
    assert "history not updated" not in driver.stderr + spans.stderr + migrated.stderr
    assert "history not updated" not in reshaped.stderr + halfway.stderr
    assert "Traceback" not in verify.stderr


FIRST = """
CREATE TABLE items (id bigint PRIMARY KEY, "Name" text, price numeric(10,2), at timestamptz);
INSERT INTO items SELECT g, 'item ' || g, g * 0.5, '2026-01-01'::timestamptz + g * interval '1 h'
FROM generate_series(1, 300) g;
CREATE TABLE tags (item bigint, tag text);
ALTER TABLE tags REPLICA IDENTITY FULL;
INSERT INTO tags SELECT g % 50, 't' || (g % 7) FROM generate_series(1, 120) g;
CREATE TABLE history (tid int, delta int, mtime timestamp, filler char(22));
ALTER TABLE history REPLICA IDENTITY FULL;
"""


@pytest.mark.skipif(
    os.environ.get("PGMEDALLION_LAKEHOUSE_ENGINE") == "spark",
    reason="Spark commits every table on this engine",
)
def test_a_first_run_needs_no_spark_and_the_catalog_learns_its_tables_later(db, tmp_path):
    """The first run creates every table with delta-rs (no JVM: JAVA_HOME points nowhere).
    The first command that starts Spark puts them in the catalog, gold's ``_lag`` view too;
    SQL reads them, and a resync and a table dropped at the source, which drop and create
    tables through Spark, leave gold exact."""
    config, env, no_java = _lakehouse(db, tmp_path, "first", FIRST, "items, tags, history")

    first = _run(config, no_java, "run")
    assert first.returncode == 0, first.stdout + first.stderr
    assert "starting Spark" not in first.stderr, first.stderr
    assert "gold: public.items: 300 rows" in first.stdout, first.stdout
    assert "gold: public.tags: 120 rows" in first.stdout, first.stdout
    # an empty table (pgbench_history before the benchmark) is a snapshot of no rows
    assert "gold: public.history: 0 rows" in first.stdout, first.stdout
    silver = tmp_path / "state" / "warehouse" / "pgm_silver.db"
    assert sorted(p.name for p in silver.glob(".pgmedallion-register-*")), "nothing to register"

    query = (
        "SELECT (SELECT count(*) FROM pgm_gold.public_items) AS items, "
        "(SELECT sum(price) FROM pgm_gold.public_items) AS total, "
        "(SELECT count(*) FROM pgm_gold._lag) AS lagged, "
        "(SELECT count(*) FROM pgm_silver._progress) AS runs"
    )
    sql = _run(config, env, "sql", query)
    assert sql.returncode == 0, sql.stdout + sql.stderr
    assert "registered in the catalog" in sql.stderr, sql.stderr
    row = sql.stdout.split("\n")
    assert any("300" in line and "22575.00" in line for line in row), sql.stdout
    assert not list(silver.glob(".pgmedallion-register-*"))
    wrong = _run(config, env, "sql", "SELECT no_such_column FROM pgm_gold.public_items")
    assert wrong.returncode == 1, wrong.stdout + wrong.stderr
    assert "sql error: [UNRESOLVED_COLUMN" in wrong.stderr, wrong.stderr
    assert "SQLQueryContextLogger" not in wrong.stderr and "\tat org." not in wrong.stderr

    with psycopg.connect(**db, autocommit=True) as conn:
        conn.execute("UPDATE items SET price = price + 1 WHERE id <= 10")
        conn.execute("DELETE FROM tags WHERE item = 3")
    resync = _run(config, env, "run", "--resync", "public.items")
    assert resync.returncode == 0, resync.stdout + resync.stderr
    assert "gold: public.items: 300 rows" in resync.stdout, resync.stdout

    with psycopg.connect(**db, autocommit=True) as conn:
        conn.execute("ALTER PUBLICATION first_pub DROP TABLE tags")
        conn.execute("DROP TABLE tags")
        conn.execute("INSERT INTO items VALUES (301, 'new', 1.00, now())")
    after = _run(config, env, "run")
    assert after.returncode == 0, after.stdout + after.stderr
    verify = _run(config, env, "verify")
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert "verify: OK" in verify.stdout, verify.stdout
    assert "Traceback" not in first.stderr + sql.stderr + resync.stderr + verify.stderr


ZOO = """
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
CREATE DOMAIN money2 AS numeric(10,2);
CREATE TABLE zoo (
    id int PRIMARY KEY,
    o oid,
    oa oid[],
    tags text[],
    span interval,
    spans interval[],
    t time,
    tz timetz,
    m money,
    n numeric,
    r int4range,
    v tsvector,
    boxes box[],
    price numeric(12,2),
    d money2,
    days date[],
    at timestamptz,
    feel mood,
    nums numeric(6,2)[],
    grid int4[][]
);
INSERT INTO zoo
SELECT g, g, ARRAY[g, g + 1]::oid[], ARRAY['a' || g, NULL, 'q"uote', 'back\\slash', '', 'NULL'],
       make_interval(months => g, days => -g, secs => g * 1.5), ARRAY[interval '1 day', NULL],
       '12:34:56.789'::time, '12:34:56+05:30'::timetz, g * 1.25,
       (repeat('9', 20) || '.' || repeat('1', 20))::numeric / g,
       int4range(g, g + 10), to_tsvector('english', 'the quick fox ' || g),
       ARRAY[box(point(g, g), point(0, 0))], g * 0.5, g * 0.25,
       ARRAY['2026-01-01'::date + g, 'infinity'],
       '2026-01-01 00:00:00+00'::timestamptz + g * interval '1 s',
       (ARRAY['sad', 'ok', 'happy']::mood[])[g % 3 + 1], ARRAY[g * 0.01, NULL]::numeric(6,2)[],
       CASE WHEN g % 7 = 0 THEN '{}' ELSE ARRAY[[g, NULL], [-g, 3]] END
FROM generate_series(1, 200) g;
"""


@pytest.mark.skipif(
    os.environ.get("PGMEDALLION_LAKEHOUSE_ENGINE") == "spark",
    reason="Spark commits every table on this engine",
)
def test_a_table_of_every_kind_of_type_runs_without_spark(db, tmp_path):
    """Arrays of several element types (NULL elements, quotes, escapes, ``box[]``'s ``;``),
    interval, time, timetz, money, ranges, tsvector, an enum, a domain, unconstrained numeric
    whose values are rounded (counted in ``_adjustments``), a type override: the first run
    and a run after three changed rows cast every value in the driver (JAVA_HOME points
    nowhere: starting Spark would fail), and PostgreSQL agrees with gold."""
    config, env, no_java = _lakehouse(db, tmp_path, "zoo", ZOO, "zoo")
    rounded = "SELECT count(*) FROM zoo WHERE length(rtrim(split_part(n::text, '.', 2), '0')) > 18"
    with psycopg.connect(**db, autocommit=True) as conn:
        expected = conn.execute(rounded).fetchone()[0]
    with config.open("a") as f:
        f.write('[tables."public.zoo".columns]\nprice = "double"\n')

    first = _run(config, no_java, "run", pyspark=False)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "starting Spark" not in first.stderr, first.stderr
    assert "public.zoo: snapshot of 200 rows read in the driver" in first.stderr, first.stderr
    assert "gold: public.zoo: 200 rows" in first.stdout, first.stdout

    with psycopg.connect(**db, autocommit=True) as conn:
        conn.execute("UPDATE zoo SET tags = ARRAY['x,y', '{z}'], span = '-1 day' WHERE id = 1")
        conn.execute("UPDATE zoo SET n = 0.000000000000000000015, price = 3.25 WHERE id = 2")
        conn.execute("DELETE FROM zoo WHERE id = 3")
        # the two updates' new rows are silver's values too (the delete's is its key alone)
        expected += conn.execute(rounded + " AND id IN (1, 2)").fetchone()[0]
    again = _run(config, no_java, "run", pyspark=False)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "starting Spark" not in again.stderr, again.stderr
    assert "gold: public.zoo: 199 rows" in again.stdout, again.stdout

    # Columns a migration adds while captured: pgoutput gives neither a domain's modifier nor
    # an array's dimensions; capture's look at the catalog does.
    with psycopg.connect(**db, autocommit=True) as conn:
        conn.execute("ALTER TABLE zoo ADD COLUMN d2 money2, ADD COLUMN grid2 int4[][]")
        conn.execute("UPDATE zoo SET d2 = id * 0.5, grid2 = ARRAY[[id, 1], [2, NULL]] WHERE id < 6")
        expected += conn.execute(rounded + " AND id < 6").fetchone()[0]  # their n again
    migrated = _run(config, no_java, "run", pyspark=False)
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr
    assert "starting Spark" not in migrated.stderr, migrated.stderr
    assert "gold: public.zoo: 199 rows" in migrated.stdout, migrated.stdout

    # a domain over numeric(10,2) keeps its scale; int4[][] is an array of arrays
    typed = _run(
        config,
        env,
        "sql",
        "SELECT typeof(d) AS d_type, typeof(grid) AS grid_type, d, grid, typeof(d2), "
        "typeof(grid2), d2, grid2 FROM pgm_gold.public_zoo WHERE id = 4",
    )
    assert typed.returncode == 0, typed.stdout + typed.stderr
    want = "decimal(10,2) | array<array<int>> | 1.00 | [[4, None], [-4, 3]] | decimal(10,2) |"
    assert want + " array<array<int>> | 2.00 | [[4, 1], [2, None]]" in typed.stdout, typed.stdout
    adjusted = _run(
        config, env, "sql", "SELECT code, sum(count) FROM pgm_silver._adjustments GROUP BY code"
    )
    assert adjusted.returncode == 0, adjusted.stdout + adjusted.stderr
    assert f"Rounded | {expected} " in adjusted.stdout, (expected, adjusted.stdout)
    verify = _run(config, env, "verify")
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert "verify: OK" in verify.stdout, verify.stdout
