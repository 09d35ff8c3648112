"""Smoke tests of the benchmark suite: each benchmark runs end to end on tiny data.

They run in-process on the test run's PostgreSQL and Spark (``pg``, ``db``, ``spark``), check
the result line's shape, what was recorded and that the data really landed. They never assert on
timings: those only mean something at full size on a quiet machine (see benchmarks/RESULTS.md).
"""

from __future__ import annotations

import json
import re

import psycopg
import pytest

from benchmarks import BENCHMARKS, load
from benchmarks.__main__ import main
from benchmarks.common import BenchEnv, MemoryResult, Peak, Result, Timing, execute, module_parser
from pgmedallion.bronze.spark_table import copy_row_counts

RESULT_LINE = re.compile(
    r"^(\w+): pgmedallion [\d.]+ \S+.*, (.+?) [\d.]+ \S+.*, "
    r"ratio \d+\.\d+ \((goal >= [\d.]+|no goal set)\)$"
)
RSS_LINE = re.compile(
    r"^rss: pgmedallion peak RSS (\d+(?:\.\d)?) MB, pg_recvlogical peak RSS (\d+(?:\.\d)?) MB, "
    r"ratio (\d+\.\d\d) \(ours / peer, lower is better; goal pgmedallion <= \d+ MB\)$"
)


@pytest.fixture
def bench_env(pg, db, spark, tmp_path) -> BenchEnv:
    return BenchEnv(
        pg, db["dbname"], tmp_path / "bench", spark=spark, results_path=tmp_path / "results.jsonl"
    )


def _run(env: BenchEnv, name: str, argv: list[str], capsys) -> tuple[Result, str, list[dict]]:
    module = load(name)
    args = module_parser(module).parse_args(argv)
    args.env = env
    result = execute(module, args)
    out = capsys.readouterr().out.strip().splitlines()
    records = [json.loads(line) for line in env.results_path.read_text().splitlines()]
    return result, out[-1], records


def test_summary_line_shape():
    result = Result(
        name="snapshot",
        work={"MB/s": 1000.0},
        ours=Timing("pgmedallion", 4.0),
        peer=Timing("psql COPY", 2.0),
        goal=0.6,
    )
    assert result.summary_line() == (
        "snapshot: pgmedallion 250.0 MB/s, psql COPY 500.0 MB/s, ratio 0.50 (goal >= 0.6)"
    )
    stream = Result("stream", {"msg/s": 1_000_000, "MB/s": 50.0}, Timing("pgmedallion", 10.0),
                    Timing("pg_recvlogical", 8.0), 0.8)  # fmt: skip
    assert stream.summary_line() == (
        "stream: pgmedallion 100000 msg/s 5.0 MB/s, pg_recvlogical 125000 msg/s 6.2 MB/s, "
        "ratio 0.80 (goal >= 0.8)"
    )


def test_memory_summary_line_shape():
    """Lower is better for memory: the ratio is ours over the peer's and the line says so."""
    result = MemoryResult("rss", Peak("pgmedallion", 204_800), Peak("pg_recvlogical", 8_192), 512)
    assert result.summary_line() == (
        "rss: pgmedallion peak RSS 209.7 MB, pg_recvlogical peak RSS 8.4 MB, "
        "ratio 25.00 (ours / peer, lower is better; goal pgmedallion <= 512 MB)"
    )
    assert RSS_LINE.match(result.summary_line())
    assert not RESULT_LINE.match(result.summary_line())  # not mistaken for a rate line
    record = result.to_record()
    assert record["ratio"] == 25.0 and record["goal_met"] is True and record["goal"] is None


def test_every_registered_benchmark_has_the_interface():
    for name in BENCHMARKS:
        module = load(name)
        assert module.NAME == name
        assert callable(module.run) and callable(module.add_arguments) and module.DESCRIPTION
    with pytest.raises(ValueError, match="unknown benchmark"):
        load("nope")
    assert main(["nope"]) == 2


def test_snapshot_runs_end_to_end(bench_env, capsys):
    result, last, records = _run(bench_env, "snapshot", ["--size-mb", "2"], capsys)
    match = RESULT_LINE.match(last)
    assert match, last
    assert match.group(1) == "snapshot" and match.group(2) == "psql COPY"
    assert re.search(r"ratio \d+\.\d+", last)
    assert match.group(3) == "goal >= 0.6"
    with psycopg.connect(**bench_env.conninfo) as conn:
        rows, size = conn.execute(
            "SELECT count(*), pg_relation_size('bench_snapshot_2mb') FROM bench_snapshot_2mb"
        ).fetchone()
    assert size >= 2_000_000
    bronze = bench_env.state_dir / "bronze-without-spark" / "snapshot"  # as capture runs locally
    copy = bench_env.spark.read.format("delta").load(str(bronze)).where("kind = 'copy'")
    [landed] = [r["rows"] for r in copy_row_counts(copy).collect()]
    assert landed == rows == result.details["rows"]
    [record] = records
    assert record["name"] == "snapshot" and record["params"]["size_mb"] == 2
    assert record["work"]["MB/s"] == pytest.approx(size / 1e6)
    assert record["ratio"] == pytest.approx(result.ratio, rel=1e-3)


def test_snapshot_reuses_a_complete_table(bench_env, capsys):
    from benchmarks.snapshot import ensure_table

    with psycopg.connect(**bench_env.conninfo, autocommit=True) as conn:
        first = ensure_table(conn, "bench_snapshot_1mb", 1_000_000)
        conn.execute("INSERT INTO bench_snapshot_1mb (id) VALUES (-1)")
        again = ensure_table(conn, "bench_snapshot_1mb", 1_000_000)
        assert again["rows"] == first["rows"] + 1  # reused, not rebuilt
        conn.execute("COMMENT ON TABLE bench_snapshot_1mb IS NULL")  # as if a build was cut
        rebuilt = ensure_table(conn, "bench_snapshot_1mb", 1_000_000)
    assert rebuilt["rows"] == first["rows"] and rebuilt["min_id"] == 1
    assert "building public.bench_snapshot_1mb" in capsys.readouterr().out


def test_stream_runs_end_to_end(bench_env, capsys):
    result, last, records = _run(bench_env, "stream", ["--rows", "3000", "--txns", "30"], capsys)
    match = RESULT_LINE.match(last)
    assert match, last
    assert match.group(1) == "stream" and match.group(2) == "pg_recvlogical"
    assert match.group(3) == "goal >= 0.8"
    wal = bench_env.spark.table("bench_bronze.stream").where("kind = 'wal'")
    assert wal.count() == result.details["messages"]
    # 30 transactions of Begin + 100 changes + Commit, plus Relation messages ('R').
    not_relation = wal.where("substring(payload, 1, 1) != X'52'").count()
    assert not_relation == 30 * 102
    [record] = records
    assert record["name"] == "stream" and record["work"]["msg/s"] == result.details["messages"]
    with psycopg.connect(**bench_env.conninfo) as conn:
        slots = conn.execute(
            "SELECT count(*) FROM pg_replication_slots WHERE slot_name LIKE 'bench_stream%'"
        ).fetchone()[0]
    assert slots == 0  # no slot is left behind to retain WAL


@pytest.mark.slow
def test_rss_runs_end_to_end(bench_env, capsys):
    """The capture runs in a child process without Spark (the tests' JVM is another process)."""
    result, last, records = _run(bench_env, "rss", ["--rows", "20000"], capsys)
    match = RSS_LINE.match(last)
    assert match, last
    ours_mb, peer_mb, ratio = (float(g) for g in match.groups())
    assert ours_mb > 0 and peer_mb > 0
    assert result.ours.kib > 0 and result.peer.kib > 0
    assert ratio == pytest.approx(result.ours.kib / result.peer.kib, abs=0.01)
    details = result.details
    assert details["landed_by_kind"]["I"] == 20000
    assert details["landed_by_kind"]["B"] == 1 and details["landed_by_kind"]["C"] == 1
    assert details["pyspark_imported"] is False
    assert 0 < details["setup_peak_rss_kib"] <= result.ours.kib
    [record] = records
    assert record["name"] == "rss" and record["metric"] == "peak_rss"
    assert record["params"] == {"rows": 20000}
    assert record["ours"]["kib"] == result.ours.kib and record["peer"]["kib"] == result.peer.kib
    with psycopg.connect(**bench_env.conninfo) as conn:
        slots = conn.execute(
            "SELECT count(*) FROM pg_replication_slots WHERE slot_name LIKE 'bench_rss%'"
        ).fetchone()[0]
    assert slots == 0  # no slot is left behind to retain WAL


@pytest.mark.slow
def test_snapshot_jdbc_peer_runs_in_a_child_session(bench_env, capsys):
    """The tests' Spark session has no JDBC driver, so the peer gets a session of its own."""
    result, last, _ = _run(bench_env, "snapshot", ["--size-mb", "1", "--peer", "jdbc"], capsys)
    match = RESULT_LINE.match(last)
    assert match, last
    assert match.group(2) == "spark.read.jdbc" and match.group(3) == "no goal set"
    landed = (
        bench_env.spark.read.format("delta")
        .load(str(bench_env.state_dir / "jdbc-delta" / "bench_snapshot_1mb"))
        .count()
    )
    assert landed == result.details["rows"]


def test_silver_runs_end_to_end(bench_env, capsys):
    module = load("silver")
    args = module_parser(module).parse_args(["--rows", "2000", "--repeats", "2"])
    args.env = bench_env
    result = execute(module, args)
    out = capsys.readouterr().out.strip().splitlines()
    [record] = [json.loads(line) for line in bench_env.results_path.read_text().splitlines()]
    last = out[-1]
    match = RESULT_LINE.match(last)
    assert match, last
    assert match.group(1) == "silver" and match.group(2) == "spark.read.csv"
    assert match.group(3) == "goal >= 0.5"
    assert result.params == {"rows": 2000, "repeats": 2} and result.details["csv_bytes"] > 0
    diffs = bench_env.spark.table("bench_silver_silver.public_bench_silver")
    assert diffs.count() == 2000 and diffs.where("_diff != 1 OR _lsn != 0").count() == 0
    # The result's figure is the decode + cast stage; the whole run is beside it.
    details = result.details
    assert details["stage_seconds"] == result.ours.seconds == min(details["stage_runs"])
    assert result.peer.seconds == min(details["peer_runs"]) and len(details["peer_runs"]) == 2
    assert details["first_runs_ratio"] == pytest.approx(
        details["peer_runs"][0] / details["stage_runs"][0]
    )
    assert details["stage_ratio"] == pytest.approx(result.ratio)
    assert details["whole_run_seconds"] > 0
    assert details["whole_run_ratio"] == pytest.approx(
        result.peer.seconds / details["whole_run_seconds"]
    )
    [both] = [line for line in out if "decode + cast stage" in line]
    assert re.search(
        r"stage [\d.]+ s, ratio [\d.]+ \(first runs: [\d.]+ s vs [\d.]+ s, ratio [\d.]+\); "
        r"whole silver run [\d.]+ s, ratio [\d.]+;",
        both,
    )
    stage = bench_env.spark.table("bench_silver_silver.stage_typed")
    assert stage.count() == 2000
    assert stage.subtract(diffs.drop("_lsn", "_diff", "_run")).count() == 0
    assert record["name"] == "silver" and record["details"]["whole_run_seconds"] > 0


def test_identity_runs_end_to_end(bench_env, capsys):
    argv = ["--small", "2000", "--large", "20000", "--changes", "400", "--repeats", "1"]
    result, last, records = _run(bench_env, "identity", argv, capsys)
    match = RESULT_LINE.match(last)
    assert match, last
    assert match.group(1) == "identity" and match.group(2).startswith("same on")
    assert result.details["large_over_small"] == pytest.approx(
        result.ours.seconds / result.peer.seconds
    )
    assert records[-1]["name"] == "identity"


def test_tables_runs_end_to_end(bench_env, capsys):
    """Four runs over three small tables; the benchmark itself checks that each run applied
    the changed tables incrementally and left the others unchanged, with every row."""
    result, line, records = _run(bench_env, "tables", ["--tables", "3", "--rows", "20"], capsys)
    assert RESULT_LINE.match(line), line
    assert result.params["tables"] == 3 and result.params["rows"] == 20
    assert records[-1]["name"] == "tables"
    with psycopg.connect(**bench_env.conninfo) as conn:
        (n,) = conn.execute("SELECT count(*) FROM many.t002 WHERE name = 'changed 2'").fetchone()
    assert n == 1


@pytest.mark.parametrize("identity", ["full", "default"])
def test_incremental_runs_end_to_end(bench_env, capsys, identity):
    """The benchmark checks that each timed gold run was incremental and kept every row; here
    the updated rows hold the update's values. Under the default identity the update sends
    ``name`` as unchanged TOAST, so silver's resolution keeps the old name."""
    argv = ["--small", "2000", "--large", "20000", "--changes", "400", "--repeats", "1"]
    result, last, records = _run(bench_env, "incremental", [*argv, "--identity", identity], capsys)
    assert RESULT_LINE.match(last), last
    assert result.params["identity"] == identity and records[-1]["name"] == "incremental"
    gold = bench_env.spark.table("bench_inc_2000_gold.accounts")
    assert gold.count() == 2000  # 200 updated, 100 deleted, 100 inserted
    updated = gold.where("balance * 100 != (id * 7) % 100000")
    assert updated.count() == 200
    renamed = updated.where("name LIKE '% v1'").count()
    assert renamed == (200 if identity == "full" else 0)


@pytest.mark.slow
def test_load_runs_end_to_end(bench_env, capsys):
    """Whole ``pgmedallion run`` processes and the JDBC peer's, each with a JVM of its own (the
    tests' session is not used). The benchmark itself checks gold's row count and sampled
    values after the update wave, and the JDBC table's; here the record and the slot. With
    ``--history``: the runs with the table keeping its history, and without it again. With
    ``--floor``: the three-layer floor's processes, a first load and an update (the benchmark
    checks each layer's rows, and the third layer's sampled values after the update)."""
    argv = ["--rows", "3000", "--skip-noop", "--history", "--floor"]
    result, last, records = _run(bench_env, "load", argv, capsys)
    match = RESULT_LINE.match(last)
    assert match, last
    assert match.group(1) == "load" and match.group(2) == "spark.read.jdbc"
    assert match.group(3) == "goal >= 1"
    details = result.details
    assert details["updated_rows"] == 30 and details["noop_s"] is None
    assert details["migrations_s"] == {}  # --migrations not asked
    assert details["update_ratio"] == pytest.approx(
        details["jdbc_reload_s"] / details["update_s"], rel=0.01
    )
    assert set(details["stages_s"]["first"]) == {"capture", "silver", "gold"}
    assert set(details["peak_rss_tree_kib"]) == {
        "first",
        "update",
        "history-build",
        "update-history",
        "update-again",
        "jdbc_first",
        "jdbc_floor",
        "jdbc_floor_update",
        "jdbc_reload",
    }
    assert details["floor_s"] > 0 and details["floor_update_s"] > 0
    assert set(details["peer_inside_s"]["floor"]) == {
        "spark_start_s",
        "read_write_s",
        "layer2_s",
        "layer3_s",
    }
    assert details["peer_inside_s"]["floor_update"]["changed_rows"] == 30
    assert set(details["peer_inside_s"]["floor_update"]) == {
        "spark_start_s",
        "read_changes_s",
        "layer1_s",
        "layer2_s",
        "layer3_merge_s",
        "changed_rows",
    }
    history = details["history"]
    assert history["noop_s"] is None and history["update_s"] > 0 and history["build_s"] > 0
    plain = (details["update_s"] + history["update_again_s"]) / 2
    assert history["added"] == pytest.approx(history["update_s"] / plain - 1, abs=0.01)
    assert all(kib > 0 for kib in details["peak_rss_tree_kib"].values())
    # every process's CPU by part; the peer's processes start a JVM, whose compilers work
    assert set(details["cpu_seconds"]) == set(details["peak_rss_tree_kib"])
    for label, parts in details["cpu_seconds"].items():
        assert parts["total"] > 0, label
        if label.startswith("jdbc"):
            assert 0 < parts["JIT compilers"] < parts["total"], label
    [record] = records
    assert record["name"] == "load" and record["params"] == {
        "rows": 3000,
        "snapshot_range_mb": None,
        "skip_noop": True,
        "migrations": False,
        "history": True,
        "floor": True,
    }
    config = (bench_env.state_dir / "load" / "pgmedallion.toml").read_text()
    assert bench_env.conninfo["password"] not in config  # through the environment only
    with psycopg.connect(**bench_env.conninfo) as conn:
        slots = conn.execute(
            "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'bench_load_slot'"
        ).fetchone()[0]
    assert slots == 0  # no slot is left behind to retain WAL


def test_freshness_runs_end_to_end(bench_env, capsys):
    """A whole ``run --continuous`` process under pgbench for a few seconds: every marker is
    timed into gold, the balances match PostgreSQL's (the benchmark checks), SIGTERM ends it,
    and no slot is left behind."""
    argv = ["--minutes", "0.2", "--rate", "20"]
    result, last, records = _run(bench_env, "freshness", argv, capsys)
    assert last.startswith("freshness: pgmedallion p50 "), last
    latency = result.details["latency"]
    assert latency["gold"]["markers"] >= 10
    assert latency["pg_recvlogical"]["markers"] == latency["gold"]["markers"]
    assert 0 < latency["gold"]["p50"] <= latency["gold"]["p95"] <= latency["gold"]["max"]
    assert result.details["applications"] and result.details["memory_mb"]
    [record] = records
    assert record["name"] == "freshness" and record["metric"] == "latency_p50_s"
    with psycopg.connect(**bench_env.conninfo) as conn:
        slots = conn.execute(
            "SELECT count(*) FROM pg_replication_slots WHERE slot_name LIKE 'bench_fresh%'"
        ).fetchone()[0]
    assert slots == 0
