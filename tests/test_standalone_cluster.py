"""The pipeline on a real multi-process Spark: a standalone cluster the test starts (a master
and two worker processes, a ``spark://`` URL), executors in JVMs of their own whose Python
workers import the installed package.

Every other test runs Spark in ``local[*]`` mode, where the executors share the driver's JVM
and the driver's file system: a closure that leaned on state in the driver's process, or a
module only the driver can import, would pass there and fail on a cluster. Here the runs are
whole ``pgmedallion run`` processes with ``engine = "spark"`` (every table read and written
by Spark, as on Databricks), PostgreSQL is the oracle (``verify``, whose COPY tasks run on the
executors too), and each worker's work directory shows that it ran the application's
executor.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import time
from pathlib import Path

import psycopg
import pytest

from tests.test_run_without_spark import _lakehouse, _run

SCHEMA = """
CREATE TABLE accounts (id bigint PRIMARY KEY, owner text NOT NULL, balance numeric(12,2),
                       tags text[], opened date);
INSERT INTO accounts
SELECT g, 'owner ' || g, g * 1.5, ARRAY['t' || (g % 3), NULL], '2026-01-01'::date + g % 400
FROM generate_series(1, 5000) g;
CREATE TABLE events (kind text, n int);
ALTER TABLE events REPLICA IDENTITY FULL;
INSERT INTO events SELECT 'k' || (g % 4), g % 7 FROM generate_series(1, 300) g;
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spark_class() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "bin" / "spark-class"


@pytest.fixture
def cluster(tmp_path):
    """A standalone master and two workers of one core each; yields (URL, worker dirs)."""
    port = _free_port()
    url = f"spark://127.0.0.1:{port}"
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", SPARK_NO_DAEMONIZE="1")
    logs = tmp_path / "cluster-logs"
    logs.mkdir()
    procs = []
    master_log = (logs / "master.log").open("w")
    procs.append(
        subprocess.Popen(
            [
                str(_spark_class()),
                "org.apache.spark.deploy.master.Master",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--webui-port",
                str(_free_port()),
            ],
            env=env,
            stdout=master_log,
            stderr=subprocess.STDOUT,
        )
    )
    dirs = []
    for i in range(2):
        work = tmp_path / f"worker{i}"
        work.mkdir()
        dirs.append(work)
        procs.append(
            subprocess.Popen(
                [
                    str(_spark_class()),
                    "org.apache.spark.deploy.worker.Worker",
                    "--host",
                    "127.0.0.1",
                    "--cores",
                    "1",
                    "--memory",
                    "2g",
                    "--work-dir",
                    str(work),
                    "--webui-port",
                    str(_free_port()),
                    url,
                ],
                env=env,
                stdout=(logs / f"worker{i}.log").open("w"),
                stderr=subprocess.STDOUT,
            )
        )
    try:
        deadline = time.monotonic() + 120
        while True:
            registered = re.findall(r"Registering worker", (logs / "master.log").read_text())
            if len(registered) >= 2:
                break
            assert time.monotonic() < deadline, (logs / "master.log").read_text()[-3000:]
            assert all(p.poll() is None for p in procs), "a cluster process exited"
            time.sleep(0.5)
        yield url, dirs
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()


@pytest.mark.slow  # five JVMs on two cores: 6-13 minutes here (CI runs it with the engine trials)
def test_the_pipeline_on_a_standalone_cluster_is_exact(db, tmp_path, cluster):
    url, workers = cluster
    config, env, _ = _lakehouse(db, tmp_path, "standalone", SCHEMA, "accounts, events")
    with config.open("a") as f:  # [lakehouse] is the file's last section
        f.write('engine = "spark"\n')
    settings = (
        f"spark.master={url} spark.executor.cores=1 spark.executor.memory=1g "
        "spark.cores.max=2 spark.driver.host=127.0.0.1 spark.driver.bindAddress=127.0.0.1"
    )
    env = dict(env, PGMEDALLION_SPARK_CONF=settings)

    first = _run(config, env, "run")
    assert first.returncode == 0, first.stdout + first.stderr
    assert "gold: public.accounts: 5000 rows" in first.stdout, first.stdout
    assert "gold: public.events: 300 rows" in first.stdout, first.stdout

    with psycopg.connect(**db, autocommit=True) as conn:
        conn.execute("UPDATE accounts SET balance = balance + 1, tags = NULL WHERE id % 10 = 0")
        conn.execute("DELETE FROM accounts WHERE id % 33 = 0")
        conn.execute("UPDATE events SET n = n + 1 WHERE kind = 'k1'")
        conn.execute("DELETE FROM events WHERE kind = 'k2'")
    second = _run(config, env, "run")
    assert second.returncode == 0, second.stdout + second.stderr
    assert "gold: public.accounts: 4849 rows" in second.stdout, second.stdout

    verify = _run(config, env, "verify")
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert "verify: OK" in verify.stdout, verify.stdout

    # Each worker ran executors of the runs (their stderr in <work dir>/<app>/<executor>/), and
    # none of them failed to import what a task needed.
    for work in workers:
        logs = list(work.glob("app-*/*/stderr"))
        assert logs, f"no executor ran on {work}"
        text = "".join(p.read_text(errors="replace") for p in logs)
        assert "ModuleNotFoundError" not in text, text[-3000:]
