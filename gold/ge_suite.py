"""A great_expectations suite per gold table, validated in-process on the Spark DataFrame.

``gold.quality`` enforces the rules on the rows each run changes, with a policy; this module is
the independent, whole-table check that ``pgmedallion verify`` (and a Databricks job) runs
afterwards. Per gold table listed in ``<gold schema>._frontier`` for the source:

- the primary key is unique (``ExpectCompoundColumnsToBeUnique``, or
  ``ExpectColumnValuesToBeUnique`` for a one-column key) and its columns are not NULL;
- the source's NOT NULL columns are not NULL;
- ``_lsn`` is in ``[0, F)`` where F is the table's frontier;
- the row count equals ``_frontier.rows``.

Everything runs in this process: an ephemeral context, a Spark datasource with one dataframe
asset and a whole-dataframe batch per table, an ExpectationSuite and a ValidationDefinition.
Nothing is written to disk, and the context's progress bars are off.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pgmedallion.core.config import Config
from pgmedallion.core.sparkapi import F

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@dataclass(frozen=True)
class Outcome:
    table: str
    expectation: str
    success: bool
    observed: str


def _observed(result) -> str:
    """The readable part of one expectation result: its observed value or its failures."""
    details = result.result or {}
    if "observed_value" in details:
        return str(details["observed_value"])
    if "unexpected_count" in details:
        sample = details.get("partial_unexpected_list") or []
        text = f"{details['unexpected_count']} unexpected"
        return text + (f", e.g. {sample[:3]}" if sample else "")
    return ""


def _describe(config) -> str:
    kwargs = {
        k: v
        for k, v in config.kwargs.items()
        if k not in ("batch_id", "result_format") and v is not None and v is not False
    }
    args = ", ".join(f"{k}={v}" for k, v in kwargs.items())
    return f"{config.type}({args})"


def suite_for(gx, name: str, key: list[str], not_null: list[str], frontier: int, rows: int):
    """The expectations of one gold table."""
    E = gx.expectations
    suite = gx.ExpectationSuite(name=name)
    if len(key) > 1:
        suite.add_expectation(E.ExpectCompoundColumnsToBeUnique(column_list=key))
    elif key:
        suite.add_expectation(E.ExpectColumnValuesToBeUnique(column=key[0]))
    for col in dict.fromkeys([*key, *not_null]):
        suite.add_expectation(E.ExpectColumnValuesToNotBeNull(column=col))
    suite.add_expectation(
        E.ExpectColumnValuesToBeBetween(
            column="_lsn", min_value=0, max_value=frontier, strict_max=True
        )
    )
    suite.add_expectation(E.ExpectTableRowCountToEqual(value=rows))
    return suite


def validate_gold(spark: SparkSession, cfg: Config) -> tuple[bool, str]:
    """Validate every gold table of the source; ``(all passed, readable report)``."""
    os.environ.setdefault("TQDM_DISABLE", "1")
    import great_expectations as gx

    if not spark.catalog.tableExists(cfg.qualified("gold", "_frontier")):
        return False, f"no gold run yet: {cfg.qualified('gold', '_frontier')} does not exist"
    frontier = spark.table(cfg.qualified("gold", "_frontier")).filter(
        F.col("source") == cfg.source.name
    )
    tables = spark.table(cfg.qualified("silver", "_tables")).filter(
        F.col("source") == cfg.source.name
    )
    rows = (
        frontier.alias("f")
        .join(tables.alias("t"), ["table_oid"])
        .select(
            "f.table_schema",
            "f.table_name",
            "f.frontier",
            "f.rows",
            "t.silver_table",
            "t.primary_key",
            "t.not_null",
        )
        .orderBy("table_schema", "table_name")
        .collect()
    )
    from great_expectations.data_context.types.base import ProgressBarsConfig

    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False, metric_calculations=False)
    source = context.data_sources.add_spark(name="pgmedallion_gold")
    outcomes: list[Outcome] = []
    for r in rows:
        label = f"{r['table_schema']}.{r['table_name']}"
        asset = source.add_dataframe_asset(name=r["silver_table"])
        batch = asset.add_batch_definition_whole_dataframe(name=f"{r['silver_table']}_all")
        suite = context.suites.add(
            suite_for(
                gx,
                f"gold_{r['silver_table']}",
                list(r["primary_key"] or []),
                list(r["not_null"] or []),
                int(r["frontier"]),
                int(r["rows"]),
            )
        )
        definition = context.validation_definitions.add(
            gx.ValidationDefinition(name=f"validate_{r['silver_table']}", data=batch, suite=suite)
        )
        df = spark.table(cfg.qualified("gold", r["silver_table"]))
        result = definition.run(batch_parameters={"dataframe": df})
        for res in result.results:
            outcomes.append(
                Outcome(label, _describe(res.expectation_config), bool(res.success), _observed(res))
            )
    ok = bool(outcomes) and all(o.success for o in outcomes)
    return ok, report(outcomes)


def report(outcomes: list[Outcome]) -> str:
    """A plain-text table: one line per expectation, failures marked."""
    if not outcomes:
        return "no gold tables to validate"
    head = ("table", "expectation", "success", "observed")
    lines = [
        (o.table, o.expectation, "ok" if o.success else "FAILED", o.observed) for o in outcomes
    ]
    widths = [max(len(str(x[i])) for x in [head, *lines]) for i in range(3)]
    out = []
    for line in [head, *lines]:
        cells = [str(line[i]).ljust(widths[i]) for i in range(3)]
        out.append("  ".join([*cells, str(line[3])]).rstrip())
    failed = sum(1 for o in outcomes if not o.success)
    out.append(f"{len(outcomes) - failed} of {len(outcomes)} expectations met")
    return "\n".join(out)
