"""A transaction of one million narrow rows passes through capture in bounded memory.

The capture runs in a process of its own (``tests/capture_child.py``) with the production
stream limits and without Spark (bronze written by delta-rs, as a local capture does), so its
peak resident set (``VmHWM``) is the whole capture's. The transaction commits before the run
starts, so the run both snapshots the table (one COPY thread per ctid range) and streams the
whole transaction from the slot (rewound by the snapshot, but landed whole).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from pyspark.sql import functions as F

from pgmedallion.bronze.spark_table import copy_row_counts
from pgmedallion.capture.connection import connect_replication
from pgmedallion.capture.slot import ensure_slot

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
ROWS = 1_000_000
PEAK_RSS_LIMIT_KIB = 512 * 1024


def test_one_million_row_transaction_in_bounded_memory(spark, db, tmp_path, record_property):
    slot = "mem_" + db["dbname"]
    with psycopg.connect(**db, autocommit=True) as conn:
        conn.execute("CREATE TABLE m (id int)")
        conn.execute("CREATE PUBLICATION pub FOR TABLE m")
    repl = connect_replication(db)
    ensure_slot(repl, slot)
    repl.close()
    with psycopg.connect(**db) as conn:  # one transaction
        conn.execute("INSERT INTO m SELECT generate_series(1, %s)", (ROWS,))

    state = tmp_path / "child-state"
    spec = tmp_path / "spec.json"
    spec.write_text(
        json.dumps(
            {
                "conninfo": db,
                "state_dir": str(state),
                "source": "mem",
                "publication": "pub",
                "slot": slot,
                "bronze": "mem.bronze",
            }
        )
    )
    log = tmp_path / "child.log"
    with log.open("wb") as stderr:
        done = subprocess.run(
            [sys.executable, "-m", "tests.capture_child", str(spec)],
            cwd=REPO,
            env=dict(os.environ, PYTHONPATH=str(REPO)),
            stdout=subprocess.PIPE,
            stderr=stderr,
            timeout=1800,
        )
    assert done.returncode == 0, f"capture child failed, see {log}"
    result = json.loads(done.stdout.decode().strip().splitlines()[-1])

    bronze = spark.read.format("delta").load(str(state / "warehouse" / "mem.db" / "bronze"))
    [copied] = copy_row_counts(bronze.where("kind = 'copy'")).collect()
    assert copied["rows"] == ROWS
    wal = bronze.where("kind = 'wal'")
    kinds = {
        r["k"]: r["count"]
        for r in wal.groupBy(F.expr("substring(payload, 1, 1)").alias("k")).count().collect()
    }
    assert kinds.get(b"I") == ROWS and kinds.get(b"B") == 1 and kinds.get(b"C") == 1
    assert result["batches"] > 1  # the transaction was landed in several bounded batches

    python_kib = result["python_peak_rss_kib"]
    record_property("python_peak_rss_mib", python_kib // 1024)
    print(
        f"\n1M-row transaction: {result['messages']} messages in {result['batches']} batches; "
        f"peak RSS {python_kib // 1024} MiB, without Spark"
    )
    assert not result["pyspark_imported"]  # the whole capture ran without a JVM
    assert python_kib < PEAK_RSS_LIMIT_KIB
