"""A table past ``[lakehouse] driver_rows`` is computed and written by Spark's executors, or
by the driver a bounded piece at a time: its rows never pass through the driver whole.

The driver may receive at most 16 MB of task results here (``spark.driver.maxResultSize``),
and the table holds about 22 MB of text. Before, silver collected such a table into the driver
(``df.toArrow()``) for delta-rs to commit, and the run failed with "Total size of serialized
results ... is bigger than spark.driver.maxResultSize" (at 8M rows under the default 1 GB,
every run). The runs are whole ``pgmedallion run`` processes; PostgreSQL is the oracle
(``verify``).
"""

from __future__ import annotations

import os
import re

import psycopg

from tests.test_run_without_spark import _lakehouse, _run

SPARK_ENGINE = os.environ.get("PGMEDALLION_LAKEHOUSE_ENGINE") == "spark"

SCHEMA = """
CREATE TABLE wide (id bigint PRIMARY KEY, pad text NOT NULL, n int);
INSERT INTO wide
SELECT g, repeat(md5(g::text), 28), g % 1000 FROM generate_series(1, 25000) g;
"""


def test_a_table_past_driver_rows_never_passes_through_the_driver(db, tmp_path):
    config, env, _ = _lakehouse(db, tmp_path, "bound", SCHEMA, "wide")
    with config.open("a") as f:  # [lakehouse] is the file's last section
        f.write("driver_rows = 1000\nsmall_table_rows = 1000\n")
    env = dict(env, PGMEDALLION_SPARK_CONF="spark.driver.maxResultSize=16m")

    first = _run(config, env, "run")
    assert first.returncode == 0, first.stdout + first.stderr
    assert "gold: public.wide: 25000 rows" in first.stdout, first.stdout
    # The first run: silver's first load and gold's first build go through the driver in
    # pieces of driver_rows / 4 rows, one held at a time (silver: ranges of two COPY parts of
    # 12,500 rows; gold: ranges of the key), without Spark; on the Spark engine, on Spark
    pieces = re.search(
        r"public.wide: snapshot of 25000 rows read in the driver \((\d+) pieces\)", first.stderr
    )
    built = "`pgm_gold`.`public_wide`: built in 100 pieces" in first.stderr
    if SPARK_ENGINE:
        assert pieces is None and not built, first.stderr[-3000:]
    else:
        assert pieces and 100 <= int(pieces.group(1)) <= 102, first.stderr[-3000:]
        assert built, first.stderr[-3000:]
        assert "starting Spark" not in first.stderr, first.stderr[-3000:]

    with psycopg.connect(**db, autocommit=True) as conn:
        conn.execute("UPDATE wide SET n = n + 1, pad = upper(pad) WHERE id % 50 = 0")
        conn.execute("DELETE FROM wide WHERE id % 97 = 0")
        conn.execute("INSERT INTO wide VALUES (200000, 'new', 1)")
    second = _run(config, env, "run")
    assert second.returncode == 0, second.stdout + second.stderr
    if not SPARK_ENGINE:
        assert "starting Spark" in second.stderr  # 1,258 diffs: past driver_rows
    assert "gold: public.wide: 24744 rows" in second.stdout, second.stdout

    verify = _run(config, env, "verify")
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert "verify: OK" in verify.stdout, verify.stdout
    for out in (first, second, verify):
        assert "maxResultSize" not in out.stderr and "Traceback" not in out.stderr, out.stderr
