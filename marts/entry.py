"""Driver of a local Spark Declarative Pipelines run (launched by ``runner.run_pipeline``).

It does what ``spark-pipelines run`` does (create the dataflow graph, import the definition
files, start the run, stream its events) with three differences:

- the spec comes from command-line arguments instead of a YAML file, so nothing is written into
  the (possibly read-only) folder that holds the definitions;
- the target schema is created first (the local Hive catalog has no implicit schemas);
- the event stream also accepts ``PlanObservedMetrics`` responses, which Python data source
  workers send and which pyspark 4.2's ``execute_command_as_iterator`` rejects with
  ``UNKNOWN_RESPONSE`` (SPARK-59135). The run is judged by its events, never by that exception.

After the run, the expectation counts of every ``<dataset>_quality`` view that this run
refreshed are appended to ``<schema>._quality`` in the project's one quality format
(``core.expectations.quality_schema``), with ``run`` one more than the table's largest (the
count of recorded runs of this pipeline), and printed as ``pgmedallion-quality {json}`` lines for
the runner (``runner.PipelineRun.quality``).

Exit status: 0 when the last run event says COMPLETED, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from datetime import UTC, datetime
from functools import reduce
from pathlib import Path
from typing import Any, cast

from pyspark.sql import SparkSession
from pyspark.sql.connect.client.core import PlanObservedMetrics

from pgmedallion.core.expectations import quality_rows, quality_schema
from pgmedallion.core.naming import quote
from pgmedallion.marts.runner import QUALITY_PREFIX

COUNT_COLUMNS = ["dataset", "rule", "action", "passed", "failed"]
_FLOW_DONE = re.compile(r"^Flow '?(?P<name>[^' ]+)'? has COMPLETED")


def completed_flow(message: str) -> str | None:
    """The dataset a "Flow ... has COMPLETED" event names (its last name part, lower case)."""
    match = _FLOW_DONE.match(message)
    if match is None:
        return None
    return match["name"].split(".")[-1].strip("`").lower()


def record_quality(
    spark: SparkSession, schema: str, source: str, refreshed: set[str]
) -> list[dict[str, Any]]:
    """Append the refreshed ``<dataset>_quality`` views' counts to ``<schema>._quality``."""
    names = [r.tableName for r in spark.sql(f"SHOW TABLES IN {quote(schema)}").collect()]
    views = sorted(n for n in names if n.endswith("_quality") and n.lower() in refreshed)
    counts = [spark.read.table(f"{quote(schema)}.{quote(n)}") for n in views]
    counts = [df for df in counts if df.columns == COUNT_COLUMNS]
    if not counts:
        return []
    target = f"{quote(schema)}.{quote('_quality')}"
    run = 1
    if spark.catalog.tableExists(f"{schema}._quality"):
        run = (spark.sql(f"SELECT max(run) FROM {target}").first()[0] or 0) + 1
    now = datetime.now(UTC).replace(tzinfo=None)
    rows = quality_rows(
        reduce(lambda a, b: a.unionByName(b), counts), run=run, source=source, checked_at=now
    ).select(*quality_schema().fieldNames())
    collected = rows.collect()
    rows.write.format("delta").mode("append").saveAsTable(target)
    return [
        {**r.asDict(), "checked_at": r["checked_at"].isoformat(sep=" ")}
        for r in sorted(collected, key=lambda r: (r["table"], r["rule"]))
    ]


def _events(spark: SparkSession, graph_id: str, storage: str, full_refresh: bool):
    import pyspark.sql.connect.proto as pb2

    start = pb2.PipelineCommand.StartRun(
        dataflow_graph_id=graph_id, full_refresh_all=full_refresh, dry=False, storage=storage
    )
    command = pb2.Command()
    command.pipeline_command.start_run.CopyFrom(start)
    client = cast(Any, spark).client
    req = client._execute_plan_request_with_metadata()
    client._set_command_in_plan(req.plan, command)
    for response in client._execute_and_fetch_as_iterator(req, {}):
        if isinstance(response, PlanObservedMetrics):
            continue
        if isinstance(response, dict) and "pipeline_event_result" in response:
            yield response["pipeline_event_result"].event


def main(argv: list[str]) -> int:
    from pyspark.pipelines.cli import LibrariesGlob, PipelineSpec, register_definitions
    from pyspark.pipelines.spark_connect_graph_element_registry import (
        SparkConnectGraphElementRegistry,
    )
    from pyspark.pipelines.spark_connect_pipeline import create_dataflow_graph

    parser = argparse.ArgumentParser()
    parser.add_argument("--definitions", required=True, action="append")
    parser.add_argument("--name", required=True)
    parser.add_argument("--schema", required=True)
    parser.add_argument("--storage", required=True)
    parser.add_argument("--configuration", default="{}")
    parser.add_argument("--full-refresh", action="store_true")
    parser.add_argument("--source", default="", help="the quality rows' source (default: name)")
    args = parser.parse_args(argv)

    configuration: dict[str, str] = json.loads(args.configuration)
    builder = SparkSession.builder.config("spark.sql.connect.serverStacktrace.enabled", "false")
    for key, value in configuration.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    status = "FAILED"
    refreshed: set[str] = set()
    try:
        spark.sql(f"CREATE SCHEMA IF NOT EXISTS `{args.schema.replace('`', '``')}`")
        graph_id = create_dataflow_graph(
            spark, default_catalog=None, default_database=args.schema, sql_conf=configuration
        )
        registry = SparkConnectGraphElementRegistry(spark, graph_id)
        for folder in args.definitions:
            folder_path = Path(folder).resolve()
            spec = PipelineSpec(
                name=args.name,
                storage=args.storage,
                catalog=None,
                database=args.schema,
                configuration=configuration,
                libraries=[LibrariesGlob(include=f"{folder_path.name}/**")],
            )
            # Only the spec file's folder is used (as the root the globs are relative to).
            spec_path = folder_path.parent / "pipeline.yml"
            register_definitions(spec_path, registry, spec, spark, graph_id)
        for event in _events(spark, graph_id, args.storage, args.full_refresh):
            when = event.timestamp.ToDatetime().replace(tzinfo=UTC)
            # One line per event: a failure's message carries its error on further lines.
            message = " ".join(event.message.split())
            print(f"{when:%Y-%m-%d %H:%M:%S} {message}", flush=True)
            if event.message.startswith("Run is "):
                status = event.message.removeprefix("Run is ").rstrip(".")
            if (flow := completed_flow(event.message)) is not None:
                refreshed.add(flow)
        for row in record_quality(spark, args.schema, args.source or args.name, refreshed):
            print(QUALITY_PREFIX + json.dumps(row), flush=True)
    finally:
        spark.stop()
    return 0 if status == "COMPLETED" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
