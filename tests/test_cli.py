"""The console command."""

from __future__ import annotations

import signal
import subprocess

import pytest


def source_config(db: dict, name: str, state) -> str:
    """A config file's text for a test database: source ``name`` (its publication
    ``<name>_pub``, slot ``<name>_slot``, password in ``<NAME>_PW``), state under ``state``."""
    return (
        "[source]\n"
        f"name = '{name}'\nhost = '{db['host']}'\nport = {db['port']}\n"
        f"dbname = '{db['dbname']}'\nuser = '{db['user']}'\npassword_env = '{name.upper()}_PW'\n"
        f"publication = '{name}_pub'\nslot = '{name}_slot'\n"
        f"[lakehouse]\nstate_dir = '{state}'\n"
    )


def _run_ok(command: list[str], cwd, env: dict) -> subprocess.CompletedProcess:
    """``command`` run to its end, which must be exit 0 (its output in the message if not)."""
    done = subprocess.run(command, capture_output=True, text=True, cwd=cwd, env=env, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def test_help_lists_the_commands():
    out = subprocess.run(["pgmedallion", "--help"], capture_output=True, text=True, check=True)
    for command in (
        "demo",
        "doctor",
        "capture",
        "run",
        "verify",
        "status",
        "sql",
        "sdp",
        "postgres",
    ):
        assert command in out.stdout


def test_every_command_takes_config_and_verbose_after_its_name():
    from pgmedallion.cli import build_parser

    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices
    required = {"resync": ["t"], "sql": ["SELECT 1"], "postgres": ["status"]}
    extra = {"sdp": ["--definitions", "d"]}
    for command in commands:
        argv = [command, *extra.get(command, []), "-c", "x.toml", "-v", *required.get(command, [])]
        args = parser.parse_args(argv)
        assert (args.config, args.verbose) == ("x.toml", True), command


def test_malformed_config_exits_2_with_the_key(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[source]\nport = 'x'\n")
    proc = subprocess.run(
        ["pgmedallion", "-c", str(bad), "postgres", "status"], capture_output=True, text=True
    )
    assert proc.returncode == 2
    assert "[source] port must be an integer" in proc.stderr


def test_a_local_capture_needs_no_java(db, spark, tmp_path):
    """``run --stage capture`` with no Java to be found: it snapshots and streams into bronze,
    which Spark then reads (so nothing in the capture started a JVM)."""
    import os
    import sys
    from pathlib import Path

    import psycopg

    with psycopg.connect(**db, autocommit=True) as conn:
        conn.execute("CREATE TABLE nojvm (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO nojvm SELECT g, 'v' || g FROM generate_series(1, 500) g")
        conn.execute("CREATE PUBLICATION nojvm_pub FOR TABLE nojvm")
    state = tmp_path / "state"
    config = tmp_path / "pgmedallion.toml"
    config.write_text(source_config(db, "nojvm", state))
    repo = Path(__file__).resolve().parent.parent
    env = dict(
        os.environ,
        NOJVM_PW=db["password"],
        JAVA_HOME=str(tmp_path / "no-java-here"),  # get_spark would fail: JavaMissing
        PYTHONPATH=str(repo),
    )
    outputs = []
    for late in (True, False):  # the snapshot, then a run that finds bronze and streams on
        proc = subprocess.run(
            [sys.executable, "-m", "pgmedallion.cli", "-c", str(config), "run"]
            + ["--stage", "capture"],
            capture_output=True,
            text=True,
            cwd=repo,
            env=env,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr
        outputs.append(proc.stdout)
        if late:
            with psycopg.connect(**db, autocommit=True) as conn:
                conn.execute("INSERT INTO nojvm VALUES (1000, 'late')")
    assert "capture: snapshot public.nojvm: 500 rows" in outputs[0]
    assert "snapshot" not in outputs[1] and "capture: 0 messages" not in outputs[1]
    bronze = spark.read.format("delta").load(str(state / "warehouse" / "pgm_bronze.db" / "bronze"))
    assert bronze.where("kind = 'rewind'").count() == 1
    assert bronze.where("kind = 'wal' AND substring(payload, 1, 1) = 'I'").count() == 1


@pytest.mark.slow
def test_run_exits_1_naming_the_table_when_gold_quality_fails(db, tmp_path):
    """A definite error under the default ``fail`` policy: ``run`` prints one line naming the
    table and the rule, exits 1, and shows no traceback."""
    import os
    import sys
    from pathlib import Path

    import psycopg

    with psycopg.connect(**db, autocommit=True) as conn:
        conn.execute("CREATE TABLE truncated (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO truncated SELECT g, 'v' || g FROM generate_series(1, 50) g")
        conn.execute("CREATE PUBLICATION truncated_pub FOR TABLE truncated")
    config = tmp_path / "pgmedallion.toml"
    config.write_text(source_config(db, "truncated", tmp_path / "state"))
    repo = Path(__file__).resolve().parent.parent
    env = dict(os.environ, TRUNCATED_PW=db["password"], PYTHONPATH=str(repo))

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "pgmedallion.cli", "-c", str(config), *(args or ("run",))],
            capture_output=True,
            text=True,
            cwd=repo,
            env=env,
            timeout=600,
        )

    first = run()
    assert first.returncode == 0, first.stderr
    with psycopg.connect(**db, autocommit=True) as conn:
        conn.execute("TRUNCATE truncated")
    second = run()
    assert second.returncode == 1, second.stdout + second.stderr
    assert "gold failed: GoldQualityError: gold quality expectations failed" in second.stderr
    assert "public.truncated" in second.stderr and "capture failed" not in second.stderr
    assert "no_definite_errors" in second.stderr
    assert "Traceback" not in second.stderr
    # the message names the error and the way out, which works as printed
    assert "(first: TableTruncated: public.truncated was truncated)" in second.stderr
    assert 'set truncate = "delete" under [tables."public.truncated"]' in second.stderr
    assert "`pgmedallion resync public.truncated` takes the table again" in second.stderr
    with psycopg.connect(**db, autocommit=True) as conn:
        conn.execute("INSERT INTO truncated SELECT g, 'w' || g FROM generate_series(1, 7) g")
    resync = run("resync", "public.truncated")
    assert resync.returncode == 0, resync.stdout + resync.stderr
    third = run()
    assert third.returncode == 0, third.stdout + third.stderr
    verified = run("verify")
    assert verified.returncode == 0 and "verify: OK" in verified.stdout, verified.stdout


def test_doctor_capture_and_status_run_without_pyspark(db, tmp_path):
    """The commands that need PostgreSQL only give their real answers with PySpark absent
    (a capture host, or a wheel installed without the ``local`` extra)."""
    import os
    import sys
    from pathlib import Path

    import psycopg

    with psycopg.connect(**db, autocommit=True) as conn:
        conn.execute("CREATE TABLE nospark (id int PRIMARY KEY, v text, secret text)")
        conn.execute("INSERT INTO nospark SELECT g, 'v' || g, 's' FROM generate_series(1, 50) g")
        conn.execute("CREATE PUBLICATION nospark_pub FOR TABLE nospark")
    config = tmp_path / "pgmedallion.toml"
    config.write_text(
        source_config(db, "nospark", tmp_path / "state")
        + "[tables.'public.nospark'.columns]\nsecret = { pii = 'exclude' }\n"
    )
    repo = Path(__file__).resolve().parent.parent
    env = dict(os.environ, NOSPARK_PW=db["password"], PYTHONPATH=str(repo))

    def run(*argv):
        return subprocess.run(
            [sys.executable, str(repo / "tests" / "nospark_child.py"), *argv, "-c", str(config)],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env=env,
            timeout=300,
        )

    doctor = run("doctor")
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    assert "✓ column policies" in doctor.stdout and "all checks passed" in doctor.stdout
    capture = run("capture")
    assert capture.returncode == 0, capture.stderr
    assert "snapshot public.nospark: 50 rows" in capture.stdout
    with psycopg.connect(**db, autocommit=True) as conn:
        conn.execute("UPDATE nospark SET v = 'changed' WHERE id <= 3")
    staged = run("run", "--stage", "capture")
    assert staged.returncode == 0, staged.stdout + staged.stderr
    assert "capture: " in staged.stdout and "messages, frontier" in staged.stdout
    status = run("status")
    assert status.returncode == 0, status.stderr
    assert "slot nospark_slot (pgoutput, idle): confirmed" in status.stdout
    # the lakehouse's part is read by delta-rs: bronze's frontier and the source's clock for it
    assert "bronze frontier: 0/" in status.stdout and ", as of 20" in status.stdout, status.stdout
    assert "nothing captured yet" not in status.stdout
    watching = subprocess.Popen(
        [sys.executable, str(repo / "tests" / "nospark_child.py"), "status", "--watch", "0.2"]
        + ["-c", str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        env=env,
    )
    try:
        out, err = watching.communicate(timeout=4)
    except subprocess.TimeoutExpired:
        watching.send_signal(signal.SIGINT)
        out, err = watching.communicate(timeout=60)
    assert watching.returncode == 0, out + err  # Ctrl-C ends the watch
    assert out.count("pgmedallion status, every 0.2 s") >= 2, out  # refreshed
    assert "Traceback" not in doctor.stderr + capture.stderr + staged.stderr + status.stderr + err


def test_a_run_with_nothing_new_starts_no_jvm(db, tmp_path):
    """After a complete run, ``run`` with nothing new decides from the bookkeeping (read by
    delta-rs) that silver and gold are current, and starts no Spark: it passes where PySpark
    cannot even be imported. A change then makes the next run go through Spark."""
    import os
    import sys
    from pathlib import Path

    import psycopg

    with psycopg.connect(**db, autocommit=True) as conn:
        conn.execute("CREATE TABLE quiet (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO quiet SELECT g, 'v' || g FROM generate_series(1, 30) g")
        conn.execute("CREATE PUBLICATION quiet_pub FOR TABLE quiet")
    config = tmp_path / "pgmedallion.toml"
    config.write_text(source_config(db, "quiet", tmp_path / "state"))
    repo = Path(__file__).resolve().parent.parent
    env = dict(os.environ, QUIET_PW=db["password"], PYTHONPATH=str(repo))

    def run(*command: str) -> subprocess.CompletedProcess:
        return _run_ok([sys.executable, *command, "-c", str(config), "run"], repo, env)

    with_spark, without = ("-m", "pgmedallion.cli"), (str(repo / "tests" / "nospark_child.py"),)
    first = run(*with_spark)
    assert "gold: public.quiet: 30 rows" in first.stdout
    quiet = run(*without)
    assert "current (Spark not started)" in quiet.stdout, quiet.stdout
    with psycopg.connect(**db, autocommit=True) as conn:
        conn.execute("INSERT INTO quiet VALUES (31, 'new')")
    changed = run(*with_spark)
    assert "gold: public.quiet: 31 rows" in changed.stdout, changed.stdout
    assert "Spark not started" not in changed.stdout


def test_a_run_with_nothing_new_on_the_spark_engine_runs_no_silver_or_gold(db, tmp_path):
    """With ``engine = "spark"`` (what a Databricks job runs) capture starts Spark anyway; a
    capture that lands nothing is followed by the same bookkeeping questions, read through
    Spark, and silver and gold do not run. A change then goes through all of them."""
    import os
    import sys
    from pathlib import Path

    import psycopg

    with psycopg.connect(**db, autocommit=True) as conn:
        conn.execute("CREATE TABLE quiet_spark (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO quiet_spark SELECT g, 'v' || g FROM generate_series(1, 30) g")
        conn.execute("CREATE PUBLICATION quiet_spark_pub FOR TABLE quiet_spark")
    config = tmp_path / "pgmedallion.toml"
    config.write_text(source_config(db, "quiet_spark", tmp_path / "state") + "engine = 'spark'\n")
    repo = Path(__file__).resolve().parent.parent
    env = {k: v for k, v in os.environ.items() if k != "PGMEDALLION_LAKEHOUSE_ENGINE"}
    env.update(QUIET_SPARK_PW=db["password"], PYTHONPATH=str(repo))

    def run() -> str:
        command = [sys.executable, "-m", "pgmedallion.cli", "-c", str(config), "run"]
        return _run_ok(command, repo, env).stdout

    assert "gold: public.quiet_spark: 30 rows" in run()
    quiet = run()
    assert "silver, gold: nothing new since the last run; current\n" in quiet, quiet
    assert not any(line.startswith(("silver:", "gold:")) for line in quiet.splitlines()), quiet
    with psycopg.connect(**db, autocommit=True) as conn:
        conn.execute("INSERT INTO quiet_spark VALUES (31, 'new')")
    changed = run()
    assert "gold: public.quiet_spark: 31 rows" in changed, changed
    assert "nothing new since the last run" not in changed, changed
