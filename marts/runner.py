"""Run a folder of Spark Declarative Pipelines definitions locally, the way Lakeflow would.

Open-source SDP executes through Spark Connect: ``SparkPipelines`` starts a local Connect server
(a JVM of its own) and runs ``marts.entry`` as its Python client. Static settings (Delta jars,
the Hive catalog with its Derby metastore, the warehouse) only reach that JVM through
``$SPARK_CONF_DIR/spark-defaults.conf``, which we write under the state directory before every
run, so two runs on the same state see the same tables.

Derby is embedded: one JVM at a time may open the metastore. A process that holds a local
SparkSession on the same state directory must stop its JVM before a pipeline run
(:func:`stop_local_spark`; stopping the session alone leaves the metastore open in the JVM).

:func:`run_marts` runs the configured marts folder (``[lakehouse] marts``) into the marts
schema: the ``marts`` stage of ``pgmedallion run``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from pgmedallion.core.config import Config, on_databricks
from pgmedallion.core.errors import PipelineError
from pgmedallion.core.spark import (
    check_java,
    end_local_jvm,
    spark_settings,
    write_log4j2,
    write_spark_defaults,
)
from pgmedallion.marts import GOLD_SCHEMA_KEY

QUALITY_PREFIX = "pgmedallion-quality "
"""Marks the driver's output lines that carry one recorded quality row as JSON."""


@dataclass(frozen=True)
class PipelineRun:
    ok: bool
    events: list[str]
    output: str
    quality: list[dict] = field(default_factory=list)
    """The expectation results this run recorded in ``<schema>._quality`` (see ``entry``)."""

    def failure(self) -> str:
        lines = [e for e in self.events if "FAILED" in e or "ERROR" in e or "failed" in e]
        return "\n".join(lines) or self.output[-4000:]


class MartsError(PipelineError):
    """The marts could not run, or their update failed (an ``expect_or_fail`` rule broke...)."""


def stop_local_spark() -> bool:
    """End this process's local Spark JVM, if it has one, so that another JVM can open the
    embedded Derby metastore (``core.spark.end_local_jvm``: the JVM's class archive, if it
    wrote one, is kept); a later ``core.spark.get_spark`` starts a new JVM. True if a JVM was
    ended."""
    if on_databricks():
        return False
    return end_local_jvm()


def run_marts(cfg: Config, *, echo: bool = False) -> PipelineRun:
    """Run the marts folder ``cfg`` names into its marts schema, after gold. This process must
    hold no local Spark JVM on the same state (:func:`stop_local_spark`). Raises
    :class:`MartsError` when the folder is missing or the update fails."""
    folder = Path(cfg.lakehouse.marts)
    if not cfg.lakehouse.marts or not folder.is_dir():
        raise MartsError(f"[lakehouse] marts: no definitions folder at {folder}")
    run = run_pipeline(
        [folder],
        state_dir=cfg.state_dir,
        name=f"{cfg.source.name}_marts",
        schema=cfg.lakehouse.marts_schema,
        configuration={GOLD_SCHEMA_KEY: cfg.lakehouse.gold_schema},
        source=cfg.source.name,
        echo=echo,
    )
    if not run.ok:
        raise MartsError(f"the marts update failed:\n{run.failure()}")
    return run


def format_quality(rows: list[dict]) -> str:
    """Expectation results, one line per dataset and rule, for people."""
    if not rows:
        return "  (no expectations)"
    width = max(len(f"{r['table']}.{r['rule']}") for r in rows)
    return "\n".join(
        f"  {r['table'] + '.' + r['rule']:<{width}}  {r['policy']:<4}  "
        f"passed {r['passed']:>6}  failed {r['failed']:>6}"
        for r in rows
    )


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
    source: str = "",
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
    # The driver and the definitions import this project (pgmedallion.core.expectations,
    # pgmedallion.marts...): the same copy of it as this process.
    (package_dir,) = importlib.util.find_spec("pgmedallion").submodule_search_locations
    root = str(Path(package_dir).resolve().parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    entry = Path(__file__).with_name("entry.py")
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
        "--source",
        source or name,
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
    quality: list[dict] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith(QUALITY_PREFIX):
            quality.append(json.loads(line.removeprefix(QUALITY_PREFIX)))
            continue
        output.append(line)
        if line[:4].isdigit() and line[4:5] == "-":
            events.append(line.rstrip())
            if echo:
                print(line, end="", flush=True)
    code = proc.wait()
    return PipelineRun(ok=code == 0, events=events, output="".join(output), quality=quality)
