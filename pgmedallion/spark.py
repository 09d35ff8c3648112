"""The one place a SparkSession comes from.

Locally the session is ``local[*]`` with Delta Lake (jars from Maven through
``spark.jars.packages``, downloaded once by Ivy), a Hive catalog whose Derby metastore and
warehouse live under the state directory (so a second run sees the first run's tables), small
shuffle partitions and no UI. On Databricks the runtime's own session is returned untouched.

The same settings feed ``spark-defaults.conf`` for the declarative pipeline runner: Spark
Connect ignores static settings passed any other way.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import subprocess
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession

MIN_JAVA = 17
POSTGRES_JDBC = "org.postgresql:postgresql:42.7.4"


class JavaMissing(RuntimeError):
    pass


def on_databricks() -> bool:
    return "DATABRICKS_RUNTIME_VERSION" in os.environ


def check_java() -> int:
    """Return Java's major version, or fail with what to install."""
    java_home = os.environ.get("JAVA_HOME")
    java = str(Path(java_home) / "bin" / "java") if java_home else shutil.which("java")
    if not java or not Path(java).exists():
        raise JavaMissing(
            f"Java {MIN_JAVA} or 21 is required by Spark 4 and was not found on PATH or in "
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
        raise JavaMissing(f"Java {major} found at {java}; Spark 4 needs Java {MIN_JAVA} or 21.")
    return major


def delta_package() -> str:
    """The Maven coordinates of the Delta jars matching the installed pip packages."""
    spark_minor = ".".join(importlib.metadata.version("pyspark").split(".")[:2])
    delta_version = importlib.metadata.version("delta-spark")
    return f"io.delta:delta-spark_{spark_minor}_2.13:{delta_version}"


JVM_OPTIONS = "-XX:-DontCompileHugeMethods"
"""Options for every Spark JVM that runs silver (set as well in ``databricks.yml``'s cluster)."""


def spark_settings(state_dir: Path, *, packages: tuple[str, ...] = ()) -> dict[str, str]:
    state_dir = Path(state_dir).absolute()
    metastore = state_dir / "metastore_db"
    return {
        "spark.master": "local[*]",
        "spark.app.name": "pgmedallion",
        "spark.jars.packages": ",".join((delta_package(), *packages)),
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
        "spark.driver.extraJavaOptions": f"-Dderby.system.home={state_dir} {JVM_OPTIONS}",
        "spark.driver.memory": "4g",
        "spark.sql.shuffle.partitions": "2",
        "spark.default.parallelism": "2",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.databricks.delta.snapshotPartitions": "2",
        "spark.databricks.delta.properties.defaults.autoOptimize.optimizeWrite": "false",
    }


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
        return SparkSession.builder.getOrCreate()
    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    check_java()
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", _python())
    Path(state_dir).mkdir(parents=True, exist_ok=True)
    builder = SparkSession.builder
    for key, value in spark_settings(Path(state_dir), packages=packages).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


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
