"""Run a folder of Spark Declarative Pipelines definitions locally, the way Lakeflow would.

Open-source SDP executes through Spark Connect: ``SparkPipelines`` starts a local Connect server
(a JVM of its own) and runs ``sdp_entry`` as its Python client. Static settings (Delta jars,
the Hive catalog with its Derby metastore, the warehouse) only reach that JVM through
``$SPARK_CONF_DIR/spark-defaults.conf``, which we write under the state directory before every
run, so two runs on the same state see the same tables.

Derby is embedded: one JVM at a time may open the metastore. A process that holds a local
SparkSession on the same state directory must stop its JVM before a pipeline run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from core.spark import check_java, spark_settings, write_log4j2, write_spark_defaults


@dataclass(frozen=True)
class PipelineRun:
    ok: bool
    events: list[str]
    output: str

    def failure(self) -> str:
        lines = [e for e in self.events if "FAILED" in e or "ERROR" in e or "failed" in e]
        return "\n".join(lines) or self.output[-4000:]


def _spark_class() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "bin" / "spark-class"


def run_pipeline(
    definitions: list[Path],
    *,
    state_dir: Path,
    name: str,
    schema: str,
    configuration: dict[str, str] | None = None,
    full_refresh: bool = False,
    echo: bool = False,
) -> PipelineRun:
    """Run the datasets defined in ``definitions`` (folders of .py files) into ``schema``."""
    check_java()
    state_dir = Path(state_dir).absolute()
    conf_dir = state_dir / "spark-conf"
    settings = spark_settings(state_dir)
    write_log4j2(state_dir)
    settings.pop("spark.master")
    # Lakeflow writes Delta by default; with an explicit format SDP's second run tries to alter
    # the reserved 'provider' property and fails (DELTA_CANNOT_CHANGE_PROVIDER).
    settings["spark.sql.sources.default"] = "delta"
    write_spark_defaults(conf_dir, settings)
    env = {
        **os.environ,
        "SPARK_CONF_DIR": str(conf_dir),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
    }
    env.pop("SPARK_REMOTE", None)
    entry = Path(__file__).with_name("sdp_entry.py")
    cmd = [str(_spark_class()), "org.apache.spark.deploy.SparkPipelines", str(entry)]
    for folder in definitions:
        cmd += ["--definitions", str(Path(folder).absolute())]
    cmd += [
        "--name",
        name,
        "--schema",
        schema,
        "--storage",
        (state_dir / "pipelines" / name).as_uri(),
        "--configuration",
        json.dumps(configuration or {}),
    ]
    if full_refresh:
        cmd.append("--full-refresh")
    proc = subprocess.Popen(
        cmd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=state_dir,
    )
    output: list[str] = []
    events: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        output.append(line)
        if line[:4].isdigit() and line[4:5] == "-":
            events.append(line.rstrip())
            if echo:
                print(line, end="", flush=True)
    code = proc.wait()
    return PipelineRun(ok=code == 0, events=events, output="".join(output))
