"""The local JVM starts from an archive of the classes an earlier run loaded.

``core.spark.class_archive_options``: the first process without an archive claims it, its JVM
writes it at exit and the process renames it into place; later processes start from it. Real
JVMs in child processes, each with a fresh cache directory of its own.
"""

from __future__ import annotations

import glob
import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pyspark
import pytest

REPO = Path(__file__).resolve().parent.parent

CHILD = textwrap.dedent(
    """
    import sys
    from pgmedallion.core.spark import get_spark
    spark = get_spark(sys.argv[1])
    options = spark.sparkContext.getConf().get("spark.driver.extraJavaOptions")
    print("OPTIONS", options)
    spark.sql("CREATE SCHEMA IF NOT EXISTS probe")
    spark.sql("CREATE TABLE IF NOT EXISTS probe.t (a INT) USING DELTA")
    spark.sql("INSERT INTO probe.t VALUES (1)")
    print("ROWS", spark.table("probe.t").count())
    """
)


def _start(cache: Path, state: Path, **more_env: str) -> tuple[str, int]:
    env = dict(os.environ, XDG_CACHE_HOME=str(cache), PYTHONPATH=str(REPO), **more_env)
    env.pop("PGMEDALLION_SPARK_CLASS_ARCHIVE", None)
    # the jars Ivy resolved (recorded in the usual cache) are found as in every other start
    recorded = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    recorded = recorded / "pgmedallion" / "spark-jars.json"
    mine = cache / "pgmedallion" / "spark-jars.json"
    mine.parent.mkdir(parents=True, exist_ok=True)
    if recorded.exists() and not mine.exists():
        mine.write_text(recorded.read_text())
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(state)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    out = done.stdout
    # nothing but the child's own lines: no JVM warning, no report of an archive written
    assert [line.split()[0] for line in out.splitlines()] == ["OPTIONS", "ROWS"], out
    assert done.stderr == "", done.stderr
    options = next(line for line in out.splitlines() if line.startswith("OPTIONS"))
    rows = int(next(line for line in out.splitlines() if line.startswith("ROWS")).split()[1])
    return options, rows


def _aged(path: Path, days: float) -> Path:
    """A file at ``path`` last modified ``days`` ago."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x")
    then = time.time() - days * 86400
    os.utime(path, (then, then))
    return path


@pytest.mark.slow  # four JVM starts with an archive written at exit: 2-3 minutes
def test_the_first_start_writes_the_archive_and_the_next_starts_from_it(tmp_path):
    cache = tmp_path / "cache"
    archives = cache / "pgmedallion" / "jvm-classes"
    # an upgrade's leftovers: archives of other keys, one unused for weeks
    stale, recent = (
        _aged(archives / ("0" * 20 + ".jsa"), 30),
        _aged(archives / ("1" * 20 + ".aot"), 1),
    )
    options, rows = _start(cache, tmp_path / "state")
    assert "-XX:ArchiveClassesAtExit=" in options and rows == 1
    written = [p for p in archives.glob("*.jsa") if p != stale]
    assert len(written) == 1 and written[0].stat().st_size > 10_000_000
    assert not list(archives.glob("*.tmp"))  # the claim became the archive
    assert not stale.exists() and recent.exists()  # the new archive's arrival pruned the stale

    then = time.time() - 86400
    os.utime(written[0], (then, then))
    options, rows = _start(cache, tmp_path / "state")
    assert f"-XX:SharedArchiveFile={written[0]}" in options and rows == 2
    assert written[0].stat().st_mtime > then + 3600  # marked used


def test_archives_unused_for_two_weeks_are_pruned_and_nothing_else(tmp_path, monkeypatch):
    from pgmedallion.core.spark import ARCHIVE_UNUSED_DAYS, class_archive_dir, prune_class_archives

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    folder = class_archive_dir()
    assert folder.is_relative_to(tmp_path)
    stale = [
        _aged(folder / f"a{i}{suffix}", ARCHIVE_UNUSED_DAYS + 1)
        for i, suffix in enumerate((".jsa", ".aot"))
    ]
    kept = [
        _aged(folder / "b.jsa", ARCHIVE_UNUSED_DAYS - 1),
        _aged(folder / "c.aot", 0),
        _aged(folder / "d.tmp", ARCHIVE_UNUSED_DAYS + 1),  # a claim: its own rule
        _aged(folder / "d.tmp.config", ARCHIVE_UNUSED_DAYS + 1),
    ]
    assert sorted(prune_class_archives()) == sorted(stale)
    assert not any(p.exists() for p in stale) and all(p.exists() for p in kept)
    assert prune_class_archives() == []


@pytest.mark.slow  # four JVM starts with an archive written at exit: 2-3 minutes
def test_a_claimed_archive_is_left_to_its_writer_and_an_old_claim_is_taken(tmp_path):
    cache = tmp_path / "cache"
    archives = cache / "pgmedallion" / "jvm-classes"
    archives.mkdir(parents=True)
    options, _ = _start(cache, tmp_path / "state")  # learn the archive's name
    claim = next(archives.glob("*.jsa")).with_suffix(".tmp")
    next(archives.glob("*.jsa")).unlink()

    claim.write_bytes(b"")  # another process writes the archive now
    options, rows = _start(cache, tmp_path / "state")
    assert "Archive" not in options and rows == 2
    assert not list(archives.glob("*.jsa")) and claim.exists()

    old = time.time() - 3600  # a process killed while its JVM wrote it
    os.utime(claim, (old, old))
    options, rows = _start(cache, tmp_path / "state")
    assert "-XX:ArchiveClassesAtExit=" in options and rows == 3
    assert len(list(archives.glob("*.jsa"))) == 1 and not claim.exists()


def _java(at_least: int) -> Path | None:
    """A Java home of major version ``at_least`` or later on this machine, if there is one."""
    homes = [os.environ.get("JAVA_HOME", ""), *sorted(glob.glob("/usr/lib/jvm/*"))]
    for home in homes:
        release = Path(home, "release")
        if not home or not release.is_file():
            continue
        found = re.search(r'JAVA_VERSION="(\d+)', release.read_text())
        if found and int(found.group(1)) >= at_least:
            return Path(home)
    return None


@pytest.mark.slow  # two JVM starts, the first assembling an AOT cache at exit: about a minute
@pytest.mark.skipif(_java(25) is None, reason="no Java 25 or later on this machine")
def test_from_java_25_on_the_archive_is_an_aot_cache_written_and_used_without_a_word(tmp_path):
    """Java 25 and later: the archive is an ahead-of-time cache (``.aot``), which the first
    JVM records and assembles as it exits and the next one starts from. The recording's and the
    assembly's reports, and the warning Java 25 gives for a package Spark's launcher opens,
    reach neither stdout nor stderr (checked in ``_start``)."""
    home = _java(25)
    java = {"JAVA_HOME": str(home), "PATH": f"{home}/bin{os.pathsep}{os.environ['PATH']}"}
    cache = tmp_path / "cache"
    archives = cache / "pgmedallion" / "jvm-classes"
    options, rows = _start(cache, tmp_path / "state", **java)
    assert "-XX:AOTCacheOutput=" in options and rows == 1
    written = list(archives.iterdir())
    assert [p.suffix for p in written] == [".aot"] and written[0].stat().st_size > 10_000_000

    options, rows = _start(cache, tmp_path / "state", **java)
    assert f"-XX:AOTCache={written[0]}" in options and rows == 2


def test_a_first_start_downloads_the_jars_with_one_line_and_no_resolution_report(tmp_path):
    """Nothing remembered (a fresh pgmedallion cache): the start resolves the Delta jars
    itself, says so in one line, and Spark resolves nothing (no Ivy report, no "Host ... not
    found" for resolvers it does not need). The next start does not resolve at all."""
    child = (
        "import logging, sys\n"
        "logging.basicConfig(level=logging.INFO, format='%(name)s: %(message)s')\n"
        "from pgmedallion.core.spark import get_spark, session_jars\n"
        "spark = get_spark(sys.argv[1])\n"
        "print('JARS', len(session_jars(dict(spark.sparkContext.getConf().getAll()))))\n"
        "print('ROWS', spark.range(3).count())\n"
        "import glob; from pyspark import SparkFiles\n"
        "print('COPIED', len(glob.glob(SparkFiles.getRootDirectory() + '/*.jar')))\n"
    )
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"))

    def start() -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-c", child, str(tmp_path / "state")],
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
            check=True,
        )

    first = start()
    said = [line for line in first.stderr.splitlines() if "from Maven Central" in line]
    assert len(said) == 1 and "io.delta:delta-spark_" in said[0], first.stderr
    for report in [
        ":: resolving dependencies",
        "found io.delta",
        "not found",
        ":: loading",
        "Setting default log level",
    ]:
        assert report not in first.stderr
    assert "ROWS 3" in first.stdout and int(first.stdout.split("JARS ")[1].split()[0]) > 1
    # a local session's executors share the driver's JVM: the jars are on its class path, not
    # copied into the session's scratch folder at each start
    assert "COPIED 0" in first.stdout
    recorded = json.loads((tmp_path / "cache" / "pgmedallion" / "spark-jars.json").read_text())
    assert all(Path(jar).is_file() for jars in recorded.values() for jar in jars)

    second = start()
    assert "Maven Central" not in second.stderr and "ROWS 3" in second.stdout
    # the JVM's warning about the incubator module Spark's launcher adds is not for people
    assert "incubator" not in first.stderr + second.stderr


def test_a_local_session_takes_the_jars_pyspark_lacks_on_its_class_path():
    """Delta's own jars go on a local driver's class path, without the artifacts pyspark ships
    in another version (pyspark's stay the ones loaded); other masters ship every jar to their
    executors through ``spark.jars``."""
    from pgmedallion.core.spark import delta_package, fetch_jars, jar_settings, session_jars

    jars = fetch_jars(delta_package())
    local = jar_settings(jars, "local[*]")
    assert set(local) == {"spark.driver.extraClassPath"}
    on_path = [Path(j).name for j in session_jars(local)]
    assert any(name.startswith("delta-spark_") for name in on_path)
    shipped = {p.name for p in (Path(pyspark.__file__).parent / "jars").glob("jackson-core-*.jar")}
    assert shipped and not any(name.startswith("jackson-core-") for name in on_path)
    assert len(on_path) < len(jars)
    cluster = jar_settings(jars, "spark://127.0.0.1:7077")
    assert set(cluster) == {"spark.jars"} and session_jars(cluster) == jars


def test_the_local_jvm_compiles_after_four_times_hotspots_thresholds(spark):
    """The local JVM runs with ``core.spark.LOCAL_JVM_OPTIONS`` (a cold run's JIT compiled
    code it ran a few hundred times; benchmarks/RESULTS.md, session 53)."""
    jvm = spark.sparkContext._jvm
    bean = jvm.java.lang.management.ManagementFactory.getPlatformMXBean(
        jvm.java.lang.Class.forName("com.sun.management.HotSpotDiagnosticMXBean")
    )
    assert bean.getVMOption("CompileThresholdScaling").getValue() == "4.0"
    assert bean.getVMOption("ReservedCodeCacheSize").getValue() == str(512 * 1024 * 1024)
