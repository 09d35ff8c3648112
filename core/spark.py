"""The one place a SparkSession comes from.

Locally the session is ``local[*]`` with Delta Lake (jars from Maven Central, resolved and
downloaded once by Ivy: :func:`fetch_jars`), a Hive catalog whose Derby metastore and
warehouse live under the state directory (so a second run sees the first run's tables), small
shuffle partitions and no UI. On Databricks the runtime's own session is returned untouched.

The same settings feed ``spark-defaults.conf`` for the declarative pipeline runner: Spark
Connect ignores static settings passed any other way.
"""

from __future__ import annotations

import atexit
import hashlib
import importlib.metadata
import json
import logging
import os
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlparse

from pgmedallion.core import delta_rs, sparkapi
from pgmedallion.core.config import on_databricks  # noqa: F401 (where callers import it from)
from pgmedallion.core.delta_rs import application
from pgmedallion.core.errors import JavaMissing, TransientError
from pgmedallion.core.naming import STATS_COLUMNS, parse_stats_columns, plain, quote, stats_columns

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql import types as T

log = logging.getLogger(__name__)

MIN_JAVA = 17
POSTGRES_JDBC = "org.postgresql:postgresql:42.7.4"


def check_java() -> int:
    """Return Java's major version, or fail with what to install."""
    java_home = os.environ.get("JAVA_HOME")
    java = str(Path(java_home) / "bin" / "java") if java_home else shutil.which("java")
    if not java or not Path(java).exists():
        raise JavaMissing(
            f"Java {MIN_JAVA}, 21 or 25 is required by Spark 4 and was not found on PATH or in "
            "JAVA_HOME; install it (Debian: apt-get install openjdk-17-jre-headless)."
        )
    out = subprocess.run([java, "-version"], capture_output=True, text=True).stderr
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out)
    if not match:
        raise JavaMissing(f"could not read the Java version from `{java} -version`: {out!r}")
    major = int(match.group(1))
    if major == 1:
        major = int(match.group(2))
    if major < MIN_JAVA:
        raise JavaMissing(f"Java {major} found at {java}; Spark 4 needs Java {MIN_JAVA}, 21 or 25.")
    return major


def delta_package() -> str:
    """The Maven coordinates of the Delta jars matching the installed pip packages."""
    spark_minor = ".".join(importlib.metadata.version("pyspark").split(".")[:2])
    delta_version = importlib.metadata.version("delta-spark")
    return f"io.delta:delta-spark_{spark_minor}_2.13:{delta_version}"


JVM_OPTIONS = "-XX:-DontCompileHugeMethods"
"""Options for every Spark JVM that runs silver (set as well in ``resources/pgmedallion.job.yml``'s
clusters)."""


PYTHON_WORKER_ENV = {"ARROW_DEFAULT_MEMORY_POOL": "jemalloc"}
"""The environment of every Spark Python worker that runs silver's kernels (set as well in
``resources/pgmedallion.job.yml``'s clusters, as ``spark.executorEnv.*``). pyarrow 18 and later
allocate with mimalloc by default, which gave each batch's memory back to the system and faulted
it in again for the next: locally, 40% of the CPU of a worker casting a 4M-row first load was
system time (page faults), and silver's kernels took 11.2-13.4 CPU-s there against 8.5-10.2
with jemalloc (the silver stage's append −1.7 s over five alternating pairs;
benchmarks/RESULTS.md, session 53). The driver keeps pyarrow's default: casting a whole table
in one batch there, mimalloc was the faster of the two."""


def python_worker_env() -> dict[str, str]:
    """:data:`PYTHON_WORKER_ENV`, where this pyarrow has jemalloc (its wheels for macOS and
    Linux on ARM do not: there a worker would print that it falls back to the default)."""
    import pyarrow as pa

    return dict(PYTHON_WORKER_ENV) if "jemalloc" in pa.supported_memory_backends() else {}


LOG4J2 = """\
# Written by pgmedallion: Spark's own messages at ERROR, without the ones that are not errors.
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n%ex
# "Failed to translate filter": Delta falls back to reading without that filter (not an error).
logger.delta_parquet.name = org.apache.spark.sql.delta.DeltaParquetFileFormat
logger.delta_parquet.level = off
logger.native.name = org.apache.hadoop.util.NativeCodeLoader
logger.native.level = off
# "AlreadyExistsException: Database ... already exists" with a stack trace, for every CREATE
# SCHEMA IF NOT EXISTS of a schema that exists (the Hive client tries, then Spark ignores it);
# a metastore failure that matters reaches the caller as Spark's own exception.
logger.hms.name = org.apache.hadoop.hive.metastore.RetryingHMSHandler
logger.hms.level = off
# A PySpark driver counts as a shell: where the level of the class that starts it (PySpark's
# gateway) differs from the root's, Spark prints "Setting default log level to ..." and how to
# change it, at every start.
logger.gateway.name = org.apache.spark.api.python.PythonGatewayServer
logger.gateway.level = error
"""
"""Spark's log4j2 configuration (written to the state directory): the default one prints
warnings and a few ERROR lines for things that are not errors."""


LOCAL_JVM_OPTIONS = "-XX:ReservedCodeCacheSize=512m -XX:CompileThresholdScaling=4"
"""Options for the local Spark JVM.

- The code cache: every query Spark compiles (whole-stage code generation) adds classes whose
  compiled methods stay in the JIT's code cache. A long-lived session filled the cache (48 MB
  when tiered compilation stops at C1, 240 MB otherwise) within minutes; from then on
  HotSpot's sweeper evicted and the compilers recompiled without end: the sweeper alone took a
  quarter of the JVM's CPU in the test suite.
- The compile thresholds, four times HotSpot's: a cold ``pgmedallion run`` spent up to half its
  CPU in the JIT's compilers, compiling code it ran a few hundred times (planning, Delta's
  bookkeeping) on the same two cores as its work. A method is now compiled after four times as
  many calls and loops; the hot loops of a large table still are. A 4M-row Spark-engine update
  run: 85.7 s against 100.9 and 101.8 s, the compilers' CPU 56.9 s against 83-84 s; its first
  load 132.1 s against 130.2 and 141.0 s (benchmarks/RESULTS.md, session 53)."""


EXTRA_JVM_OPTIONS_ENV = "PGMEDALLION_SPARK_JAVA_OPTIONS"
"""More options for the local Spark JVM, from the environment. The test suite sets
``-XX:TieredStopAtLevel=1``: on its small tables the JIT's optimizing compiler cost more CPU
than it saved (a third of the JVM's CPU time went to compiling)."""


CLASS_ARCHIVE_ENV = "PGMEDALLION_SPARK_CLASS_ARCHIVE"
"""``0`` turns the local JVM's class archive off (see :func:`class_archive_options`)."""
_ARCHIVE_LEFTOVER_S = 600
CDS_SUFFIX, AOT_SUFFIX = ".jsa", ".aot"
"""The ends of a class archive's file name: a class data sharing archive before Java
:data:`AOT_JAVA`, an ahead-of-time cache from it on."""
ARCHIVE_UNUSED_DAYS = 14
"""An archive no run has started from for this many days is deleted when the next one is put in
place (:func:`prune_class_archives`)."""


def _cache_dir() -> Path:
    """pgmedallion's folder in the user's cache (beside Ivy's own, for every state directory)."""
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "pgmedallion"


def class_archive_dir() -> Path:
    return _cache_dir() / "jvm-classes"


def jvm_flags() -> str:
    """The local JVM's options other than its state directory's (what its classes depend on)."""
    return f"{JVM_OPTIONS} {LOCAL_JVM_OPTIONS} {os.environ.get(EXTRA_JVM_OPTIONS_ENV, '')}".strip()


def _archive_key(jars: list[str], java_options: str) -> str:
    """What an archive of the JVM's loaded classes depends on: the Java installation, Spark's
    jars, the packages' jars and the options (a mismatch would only make the JVM ignore it)."""
    import pyspark

    java = Path(os.path.realpath(shutil.which("java", path=_java_path()) or "java"))
    spark_jars = Path(pyspark.__file__).parent / "jars"
    parts = [
        str(java),
        str(java.stat().st_mtime) if java.exists() else "",
        pyspark.__version__,
        str(spark_jars),  # the JVM checks the class path's files: another install, another key
        *sorted(p.name for p in spark_jars.glob("*.jar")),
        *jars,
        java_options,
    ]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:20]


def _java_path() -> str | None:
    home = os.environ.get("JAVA_HOME")
    return f"{home}/bin{os.pathsep}{os.environ.get('PATH', '')}" if home else None


AOT_JAVA = 25
"""From this Java on, the archive is an ahead-of-time cache (JEPs 483, 514 and 515): Spark's,
Delta's and Hive's classes loaded and linked, and the methods' profiles of the run that wrote
it, so that the JIT compiles the hot ones sooner. Before it, a dynamic class data sharing
archive (classes loaded, not linked, no profiles)."""


def class_archive(jars: list[str], java_options: str, java: int) -> Path | None:
    """The file of the class archive for a local JVM of Java ``java`` (its major version) with
    ``jars`` and ``java_options`` (there or not yet), or None where archives are turned off
    (:data:`CLASS_ARCHIVE_ENV`)."""
    if os.environ.get(CLASS_ARCHIVE_ENV, "1") == "0":
        return None
    kind = AOT_SUFFIX if java >= AOT_JAVA else CDS_SUFFIX
    return class_archive_dir() / f"{_archive_key(jars, java_options)}{kind}"


def class_archive_options(jars: list[str], java_options: str, java: int) -> str:
    """JVM options that start the local Spark JVM from an archive of the classes an earlier
    run loaded (HotSpot's class data sharing), or that make this run write one at its exit.

    A cold local run spent most of its first seconds loading and verifying Spark's, Delta's
    and Hive's classes: every bookkeeping query before silver's work paid for it (measured:
    a JVM start, five small Delta reads and two small scans 25-28 s without the archive,
    20-22 s with it; whole runs 5-7 s less, ``benchmarks/RESULTS.md``). The
    archive (about 200 MB, one per Java, Spark and jar set) is written by the first run
    without one (its exit takes 10-15 s longer, once): the JVM writes it when it exits, to a
    file this process claimed (other processes meanwhile start without an archive), and this
    process renames it into place once the JVM exited cleanly (:func:`end_local_jvm`), so a
    run never starts from a partial archive. ``PGMEDALLION_SPARK_CLASS_ARCHIVE=0`` turns it off.
    Each start from an archive marks it used; putting a new one in place deletes those unused
    for :data:`ARCHIVE_UNUSED_DAYS` days (:func:`prune_class_archives`).

    From Java 25 on (:data:`AOT_JAVA`) the archive is an ahead-of-time cache, which holds the
    classes linked and the methods' profiles too: cold update runs of 30 rows in a 3,000-row
    table on the Spark engine took 58.7-62.6 s with it against 69.4-79.8 s on Java 17 with its
    archive, run by run; Java 25's class archive alone sat in between (``benchmarks/RESULTS.md``,
    session 52). The JVM that writes it records the run, then at its exit starts a second JVM
    that assembles the cache (that exit takes 20-50 s longer, once)."""
    archive = class_archive(jars, java_options, java)
    if archive is None:
        return ""
    folder = archive.parent
    aot = archive.suffix == AOT_SUFFIX
    quiet = "-Xlog:aot*=off -Xlog:cds*=off" if aot else "-Xlog:cds=off -Xlog:cds+dynamic=off"
    if archive.is_file():
        _touch(archive)
        if aot:
            return f"-XX:AOTCache={archive} {quiet}"
        return f"-XX:SharedArchiveFile={archive} {quiet} -Xshare:auto"
    pending = folder / f"{archive.stem}.tmp"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if pending.exists() and time.time() - pending.stat().st_mtime > _ARCHIVE_LEFTOVER_S:
            pending.unlink(missing_ok=True)  # a run killed while its JVM wrote it
        # One process writes the archive; the others meanwhile start without one.
        os.close(os.open(pending, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except OSError:
        return ""
    _remember_claim(pending, archive)
    if aot:
        return f"-XX:AOTCacheOutput={pending} {quiet}"
    return f"-XX:ArchiveClassesAtExit={pending} {quiet} -Xshare:auto"


def _touch(archive: Path) -> None:
    """Mark ``archive`` used now (what :func:`prune_class_archives` goes by)."""
    try:
        os.utime(archive)
    except OSError as exc:  # another user's archive, say: it is only ever an optimisation
        log.debug("class archive %s not marked used: %s", archive, exc)


def prune_class_archives() -> list[Path]:
    """Delete the archives no run has started from for :data:`ARCHIVE_UNUSED_DAYS` days; the
    ones deleted. Every change of pgmedallion's JVM options, pyspark, Delta or Java gives the
    archive a new key and leaves the old one (100-250 MB) behind. A JVM that still maps a
    deleted archive keeps reading it; one about to start from an archive deleted a moment
    before (unused for two weeks until then) starts without one."""
    cutoff = time.time() - ARCHIVE_UNUSED_DAYS * 86400
    deleted = []
    for path in class_archive_dir().glob("*"):
        try:
            if path.suffix in (CDS_SUFFIX, AOT_SUFFIX) and path.stat().st_mtime < cutoff:
                path.unlink()
                deleted.append(path)
        except OSError as exc:
            log.debug("class archive %s not deleted: %s", path, exc)
    return deleted


_CLAIMED: list[tuple[Path, Path]] = []
"""The archives this process claimed: (the file its JVM writes as it exits, the archive)."""


def _remember_claim(pending: Path, archive: Path) -> None:
    """Remember the claim; the JVM about to start writes ``pending`` as it exits, and
    :func:`end_local_jvm` (at this process's exit at the latest) puts it in place."""
    if not _CLAIMED:
        atexit.register(_end_at_exit)
    _CLAIMED.append((pending, archive))


def _end_at_exit() -> None:
    try:
        end_local_jvm()
    except Exception as exc:  # noqa: BLE001 - a JVM already gone, say: nothing to keep
        log.debug("no JVM class archive kept: %s", exc)


def end_local_jvm() -> bool:
    """End this process's local Spark JVM, if it has one: stop Spark, then the JVM (it exits
    when its standard input closes), and put in place the class archive it wrote as it exited
    (cleanly, or the archive is dropped), so a run never starts from a partial one. A later
    :func:`get_spark` starts a new JVM. True if a JVM was ended. (Stopping the session alone
    keeps the JVM, and the embedded Derby metastore, open.)"""
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    ended = False
    code = None
    try:
        active = SparkSession.getActiveSession()
        if active is not None:
            active.stop()
        elif SparkContext._active_spark_context is not None:
            SparkContext._active_spark_context.stop()
        gateway = SparkContext._gateway
        if gateway is not None:
            proc = getattr(gateway, "proc", None)
            gateway.shutdown()
            if proc is not None:
                if proc.stdin is not None:
                    proc.stdin.close()
                code = proc.wait(timeout=300)
            SparkContext._gateway = None
            SparkContext._jvm = None
            ended = True
    finally:
        while _CLAIMED:
            pending, archive = _CLAIMED.pop()
            try:
                if code == 0 and pending.is_file() and pending.stat().st_size > 0:
                    os.replace(pending, archive)
                    prune_class_archives()
            except OSError as exc:  # an archive is only ever an optimisation
                log.debug("no JVM class archive kept: %s", exc)
            finally:
                pending.unlink(missing_ok=True)
                Path(f"{pending}.config").unlink(missing_ok=True)  # an AOT cache's recording
    return ended


def log4j2_file(state_dir: Path) -> Path:
    return Path(state_dir).absolute() / "log4j2.properties"


def write_log4j2(state_dir: Path) -> Path:
    """Write :data:`LOG4J2` where :func:`spark_settings` points Spark at it."""
    path = log4j2_file(state_dir)
    if not path.exists() or path.read_text() != LOG4J2:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(LOG4J2)
    return path


def jars_file() -> Path:
    """Where the jar files resolved for a set of Maven coordinates are remembered (in
    pgmedallion's cache, for every state directory), so that every start passes them as
    ``spark.jars`` and none resolves."""
    return _cache_dir() / "spark-jars.json"


def resolved_jars(packages: str) -> list[str] | None:
    """The jar files resolved before for ``packages``, when every one of them still exists."""
    try:
        recorded = json.loads(jars_file().read_text())
    except (OSError, ValueError):
        return None
    jars = recorded.get(packages)
    if not jars or not all(Path(urlparse(j).path or j).exists() for j in jars):
        return None
    return jars


def _remember_jars(packages: str, jars: list[str]) -> None:
    path = jars_file()
    try:
        recorded = json.loads(path.read_text())
    except (OSError, ValueError):
        recorded = {}
    recorded[packages] = jars
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(recorded, indent=1))
        tmp.replace(path)  # atomic: concurrent starts never read half a file
    except OSError:
        pass  # a read-only home: every start resolves, as without the cache


IVY_MODULE = """\
<ivy-module version="2.0">
  <info organisation="pgmedallion" module="spark-jars"/>
  <dependencies>
{dependencies}
    <exclude org="org.apache.spark"/>
    <exclude module="scala-library"/>
  </dependencies>
</ivy-module>
"""
"""What Spark itself resolves for ``spark.jars.packages``: each coordinate's ``default``
configuration (compile and runtime scopes), without Spark's own artifacts and the Scala
library, which Spark brings."""


def fetch_jars(packages: str) -> list[str]:
    """The jar files of ``packages`` (Maven coordinates, comma-separated), resolved and
    downloaded once by Ivy (the one Spark ships) into Ivy's cache and remembered.

    Spark resolves ``spark.jars.packages`` itself at every start, printing Ivy's report (about
    a hundred lines, with a "Host ... not found" line for each artifact its spark-packages
    resolver cannot reach). Done here instead, the first start prints one line and every
    later start resolves nothing. Processes starting together resolve one at a time (a lock
    beside the record); the later ones find the jars recorded."""
    jars = resolved_jars(packages)
    if jars is not None:
        return jars
    import fcntl

    lock_path = jars_file().with_suffix(".lock")
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        jars = resolved_jars(packages)
        if jars is None:
            jars = _ivy_resolve(packages)
            _remember_jars(packages, jars)
    return jars


def _ivy_resolve(packages: str) -> list[str]:
    import tempfile
    from xml.sax.saxutils import quoteattr

    import pyspark

    coordinates = [c.strip().split(":") for c in packages.split(",") if c.strip()]
    dependencies = "\n".join(
        f"    <dependency org={quoteattr(group)} name={quoteattr(name)} rev={quoteattr(rev)}"
        ' conf="default->default"/>'
        for group, name, rev in coordinates
    )
    settings = _extra_settings()
    ivy_home = Path(settings.get("spark.jars.ivy") or Path.home() / ".ivy2.5.2")
    (ivy_jar,) = (Path(pyspark.__file__).parent / "jars").glob("ivy-*.jar")
    names = ", ".join(":".join(c) for c in coordinates)
    log.info("Downloading %s and its dependencies from Maven Central (once) ...", names)
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        module = Path(tmp) / "ivy.xml"
        module.write_text(IVY_MODULE.format(dependencies=dependencies))
        classpath = Path(tmp) / "classpath"
        command = [
            shutil.which("java", path=_java_path()) or "java",
            "-cp",
            str(ivy_jar),
            "org.apache.ivy.Main",
            "-ivy",
            str(module),
            "-confs",
            "default",
            "-cache",
            str(ivy_home / "cache"),
            "-cachepath",
            str(classpath),
            "-warn",
        ]
        if settings.get("spark.jars.ivySettings"):
            command += ["-settings", settings["spark.jars.ivySettings"]]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0 or not classpath.is_file():
            problems = [
                line.strip()
                for line in (done.stdout + done.stderr).splitlines()
                if "::" in line or "ERROR" in line or "not found" in line.lower()
            ]
            raise TransientError(
                f"could not download the Spark jars of {names} from Maven Central (is it "
                "reachable from here?): " + ("; ".join(problems[:8]) or f"exit {done.returncode}")
            )
        jars = [j for j in classpath.read_text().strip().split(os.pathsep) if j]
    log.info("Downloaded %d jars in %.0f s", len(jars), time.monotonic() - started)
    return jars


def spark_settings(state_dir: Path, *, packages: tuple[str, ...] = ()) -> dict[str, str]:
    """The local session's settings: Delta's jars and ``packages`` (Maven coordinates) as
    files resolved once (:func:`fetch_jars`), so that Spark resolves nothing."""
    state_dir = Path(state_dir).absolute()
    metastore = state_dir / "metastore_db"
    java_options = (
        f"-Dderby.system.home={state_dir} -Dlog4j2.configurationFile={log4j2_file(state_dir)} "
        + jvm_flags()
    )
    jars = fetch_jars(",".join((delta_package(), *packages)))
    return {
        "spark.master": "local[*]",
        "spark.app.name": "pgmedallion",
        **jar_settings(jars, _extra_settings().get("spark.master", "local[*]")),
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        "spark.sql.catalogImplementation": "hive",
        "spark.sql.warehouse.dir": str(state_dir / "warehouse"),
        "spark.hadoop.javax.jdo.option.ConnectionURL": (
            f"jdbc:derby:;databaseName={metastore};create=true"
        ),
        # HotSpot leaves a method of over 8000 bytes of bytecode interpreted for good. A
        # whole-stage generated method holding silver's decode or cast expressions is larger
        # than that, and ran 3-4x slower than compiled (silver's COPY decoding: 3.3 s against
        # 0.9 s for 500k rows), so huge methods are compiled too (see JVM_OPTIONS).
        "spark.driver.extraJavaOptions": java_options,
        **{f"spark.executorEnv.{k}": v for k, v in python_worker_env().items()},
        "spark.driver.memory": "4g",
        "spark.sql.shuffle.partitions": "2",
        "spark.default.parallelism": "2",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.databricks.delta.snapshotPartitions": "2",
        "spark.databricks.delta.properties.defaults.autoOptimize.optimizeWrite": "false",
        **_extra_settings(),
    }


def jar_settings(jars: list[str], master: str) -> dict[str, str]:
    """Where the session finds the resolved ``jars``. A local master's executors run in the
    driver's JVM, so the jars pyspark does not ship (an artifact it ships, in another version,
    stays pyspark's, as Spark's own loader picks it first) go on the driver's class path.
    Passed as ``spark.jars`` instead, each start copied every jar (89 MB for Delta's 33) into
    a scratch folder and forked a ``chmod`` per jar, and their classes stayed out of the JVM's
    class archive (:func:`class_archive_options`). Other masters' executors get them through
    ``spark.jars``."""
    if not master.startswith("local"):
        return {"spark.jars": ",".join(jars)}
    shipped = {_artifact(p.name) for p in (_pyspark_dir() / "jars").glob("*.jar")}
    own = [jar for jar in jars if _artifact(Path(jar).name) not in shipped]
    return {"spark.driver.extraClassPath": os.pathsep.join(own)}


def session_jars(settings: dict[str, str]) -> list[str]:
    """The jar files ``settings`` (:func:`spark_settings`) give the session, either way."""
    if settings.get("spark.jars"):
        return settings["spark.jars"].split(",")
    return [j for j in settings.get("spark.driver.extraClassPath", "").split(os.pathsep) if j]


def _artifact(jar_name: str) -> str:
    """``jackson-core-2.13.5.jar`` -> ``jackson-core``."""
    return re.sub(r"-\d[\w.+-]*\.jar$", "", jar_name)


def _pyspark_dir() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


EXTRA_SETTINGS_ENV = "PGMEDALLION_SPARK_CONF"
"""More settings for the local session, from the environment: ``key=value`` pairs separated
by spaces."""


def _extra_settings() -> dict[str, str]:
    pairs = os.environ.get(EXTRA_SETTINGS_ENV, "").split()
    return dict(p.split("=", 1) for p in pairs if "=" in p)


def write_spark_defaults(conf_dir: Path, settings: dict[str, str]) -> Path:
    conf_dir.mkdir(parents=True, exist_ok=True)
    path = conf_dir / "spark-defaults.conf"
    path.write_text("".join(f"{k} {v}\n" for k, v in settings.items()))
    return path


def get_spark(
    state_dir: Path | str = ".pgmedallion", *, packages: tuple[str, ...] = ()
) -> SparkSession:
    """Return the SparkSession: Databricks' own, or a local one with Delta and a Hive catalog."""
    if on_databricks():
        return sparkapi.SparkSession.builder.getOrCreate()
    active = sparkapi.SparkSession.getActiveSession()
    if active is not None:
        return active
    java = check_java()
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", _python())
    state = Path(state_dir).absolute()
    state.mkdir(parents=True, exist_ok=True)
    write_log4j2(state)
    builder = sparkapi.SparkSession.builder
    settings = spark_settings(state, packages=packages)
    archive = class_archive_options(session_jars(settings), jvm_flags(), java)
    if archive:
        settings["spark.driver.extraJavaOptions"] += " " + archive
    _launch_driver(settings)
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


JVM_NOISE = (
    b"WARNING: Using incubator modules:",
    b"WARNING: package sun.security.action not in java.base",
    b"Temporary AOTConfiguration recorded: ",
    b"Launching child process ",
    b"Picked up JAVA_TOOL_OPTIONS: -Djava.class.path=",
    b"Reading AOTConfiguration ",
    b"AOTCache creation is complete: ",
    b"Removed temporary AOT configuration file ",
)
"""Lines the local driver's JVM writes that are not for people, and no JVM flag silences:
Spark 4's launcher adds ``--add-modules=jdk.incubator.vector`` to every driver, and the JVM
warns that an incubator module is in use; it adds ``--add-opens`` for a package Java 25 no
longer has, and Java 25 warns about that; and a JVM that writes an ahead-of-time cache
(:func:`class_archive_options`) reports each step on its stdout, the cache's assembler its
class path on stderr."""


def _launch_driver(settings: dict[str, str]) -> None:
    """Start the local driver's JVM as the session builder would (the same settings on its
    command line), with its stdout and stderr passed on line by line without
    :data:`JVM_NOISE`. The builder then finds the JVM running and uses it."""
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    if SparkContext._gateway is not None:
        return
    conf = SparkConf()
    conf.setAll(list(settings.items()))
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
    gateway = launch_gateway(conf, popen_kwargs=pipes)
    SparkContext._gateway, SparkContext._jvm = gateway, gateway.jvm
    for name, stream, fd in (
        ("stdout", gateway.proc.stdout, 1),
        ("stderr", gateway.proc.stderr, 2),
    ):
        threading.Thread(
            target=_pass_lines, args=(stream, fd), name=f"jvm-{name}", daemon=True
        ).start()


def _pass_lines(stream, fd: int) -> None:
    """Copy one of the JVM's outputs to this process's file descriptor ``fd`` (where the JVM
    wrote before), leaving out :data:`JVM_NOISE`, until the JVM closes it."""
    with stream:
        for line in stream:
            if line.startswith(JVM_NOISE):
                continue
            view = memoryview(line)
            try:
                while view:
                    view = view[os.write(fd, view) :]
            except OSError:
                return


def _python() -> str:
    import sys

    return sys.executable


def one_task_per_partition(spark: SparkSession, count: int) -> DataFrame:
    """Ids ``0 .. count-1`` (column ``id``), exactly one per partition, so that a ``mapInArrow``
    over it runs ``count`` Spark tasks that Spark can schedule in parallel.

    (``createDataFrame(tasks).repartition(n)`` does not do that: round-robin repartitioning of a
    few rows often puts two of them in one partition, and one task then runs both in turn.)
    """
    return spark.range(0, count, 1, numPartitions=max(1, count))


_ENSURED: set[tuple[str, str]] = set()


def first_time(
    spark: SparkSession, what: str, local_tables: Callable[[], Sequence[str | None]] = tuple
) -> bool:
    """Whether ``what`` (a layer's tables, say) is asked about for the first time in this
    Spark application, or again because one of ``local_tables()`` (the tables' directories,
    where local; asked only then) is gone. A long-lived process (``run --continuous``) then
    creates and upgrades its tables once instead of before every application (a dozen catalog
    calls)."""
    key = (application(spark), what)
    if key in _ENSURED:
        try:
            there = all(Path(p, "_delta_log").is_dir() for p in local_tables() if p is not None)
        except Exception:  # the schema itself is gone
            there = False
        if there:
            return False
    _ENSURED.add(key)
    return True


def forget(spark: SparkSession, what: str) -> None:
    """After a failed ensure: ask again next time."""
    _ENSURED.discard((application(spark), what))


def create_table(spark: SparkSession, create) -> None:
    """Run ``create``, a ``CREATE TABLE IF NOT EXISTS`` of a managed Delta table.

    Spark creates such a table in two steps: Delta's first commit in the table's directory,
    then the catalog's record. A process killed between the two leaves a directory that the
    catalog does not know and that Delta refuses to create a table in
    (``DELTA_CREATE_TABLE_WITH_NON_EMPTY_LOCATION``). When that directory holds nothing but
    a Delta log of at most the creation commit (no data file, no later commit), it is what an
    interrupted create left: it is removed and the table created again. Anything else is
    raised as it is.
    """
    try:
        create()
        return
    except sparkapi.AnalysisException as exc:
        if exc.getCondition() != "DELTA_CREATE_TABLE_WITH_NON_EMPTY_LOCATION":
            raise
        url = urlparse(exc.getMessageParameters().get("tableLocation", ""))
        path = Path(url.path)
        if url.scheme not in ("file", "") or not delta_rs.creation_leftover(path):
            raise
    log.warning("removing what an interrupted CREATE TABLE left in %s", path)
    shutil.rmtree(path)
    create()


def drop_table(spark: SparkSession, schema: str, name: str, table: str) -> None:
    """``DROP TABLE IF EXISTS table`` (table ``name`` of ``schema``), and its directory where
    the catalog keeps the schema's managed tables: a table a run made before Spark started is
    in the catalog as a table at that place (``delta_rs.register_created``), whose files a
    ``DROP TABLE`` leaves, and a table created there again would find them."""
    path = delta_rs.table_dir(delta_rs.schema_dir(spark, schema), name)
    spark.sql(f"DROP TABLE IF EXISTS {table}")
    if path is not None and Path(path).is_dir():
        shutil.rmtree(path)


def _unlist_stats_columns(spark: SparkSession, table: str, names: set[str]) -> None:
    """``names`` out of the table's statistics columns (``delta.dataSkippingStatsColumns``),
    before they are renamed to names that need quoting there (see
    :func:`pgmedallion.core.naming.plain`)."""
    if not names:
        return
    properties = spark.sql(f"DESCRIBE DETAIL {table}").first()["properties"] or {}
    listed = parse_stats_columns(properties.get(STATS_COLUMNS, ""))
    if not listed:
        return
    lower = {n.lower() for n in names}
    kept = [c for c in listed if c.lower() not in lower]
    if kept == listed:
        return
    if kept:
        value = stats_columns(kept).replace("\\", "\\\\").replace("'", "\\'")
        spark.sql(f"ALTER TABLE {table} SET TBLPROPERTIES ('{STATS_COLUMNS}' = '{value}')")
    else:
        spark.sql(f"ALTER TABLE {table} UNSET TBLPROPERTIES ('{STATS_COLUMNS}')")


def reshape_columns(
    spark: SparkSession,
    table: str,
    renames: dict[str, str],
    drops: Sequence[str],
    add: Sequence[tuple[str, T.DataType]] = (),
    before: str | None = None,
) -> tuple[list[str], list[str]]:
    """Rename (old -> new), drop and add (nullable; ``before`` the column of that name, else
    last) columns of a column-mapped Delta table: metadata only, no file rewritten. Each step
    only where still to do (the old name there, the new one not; a new name not there), so a
    second call after a crash does the rest. Returns the columns renamed (old names) and
    dropped."""
    have = set(spark.table(table).columns)
    quoted = {old for old, new in renames.items() if old in have and new not in have}
    _unlist_stats_columns(spark, table, {old for old in quoted if not plain(renames[old])})
    renamed = []
    for old, new in sorted(renames.items()):
        if old in have and new not in have:
            spark.sql(f"ALTER TABLE {table} RENAME COLUMN {quote(old)} TO {quote(new)}")
            have = (have - {old}) | {new}
            renamed.append(old)
    dropped = sorted(name for name in drops if name in have)
    if dropped:
        spark.sql(f"ALTER TABLE {table} DROP COLUMNS ({', '.join(quote(d) for d in dropped)})")
    lower = {n.lower() for n in have - set(dropped)}
    new = [(n, t) for n, t in add if n.lower() not in lower]
    if new:
        order = spark.table(table).columns
        where = ""
        if before in order:
            at = order.index(before)
            where = " FIRST" if at == 0 else f" AFTER {quote(order[at - 1])}"
        for name, dtype in new:
            spark.sql(
                f"ALTER TABLE {table} ADD COLUMNS ({quote(name)} {dtype.simpleString()}{where})"
            )
            where = f" AFTER {quote(name)}"
    return renamed, dropped
