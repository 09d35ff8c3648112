"""Declarative pipeline decorators: the SDP ones, plus DLT-style expectations everywhere.

Dataset files are written once and run unmodified on Databricks Lakeflow and locally::

    from pgmedallion.core.expectations import expect_or_drop, materialized_view

    @materialized_view(name="orders_gold")
    @expect_or_drop("id_not_null", "id IS NOT NULL")
    def orders_gold():
        return spark.read.table("orders_silver").transform(current_state)

On Databricks ``expect*`` are the native Lakeflow decorators and ``materialized_view`` / ``table``
are ``dp``'s own. Open-source SDP has no expectations, so elsewhere the same decorators keep
Lakeflow's semantics in the plan itself:

    warn   rows are kept;                      failures are counted
    drop   failing rows are filtered out;      failures are counted
    fail   the update fails, naming the rule and the offending row (``raise_error``)

A rule *fails* a row when its SQL condition is false or NULL. The per-rule counts of passing
and failing rows land in a companion materialized view ``<dataset>_quality`` with columns
``dataset, rule, action, passed, failed`` recomputed by every update, the local stand-in for
Lakeflow's event log. After a local pipeline run those counts are appended, like gold's rule
results, to the pipeline schema's ``_quality`` table in the one quality format of the project,
:func:`quality_schema` (see :func:`quality_rows`).

Expectations go on materialized views: a streaming table's input cannot be re-read as a batch to
count it, so ``table`` refuses them locally rather than count nothing.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from pgmedallion.core.delta_rs import spark_types
from pgmedallion.core.spark import on_databricks
from pgmedallion.core.sparkapi import F, T

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

WARN, DROP, FAIL = "warn", "drop", "fail"
_RULES_ATTR = "__pgmedallion_expectations__"
_OFFENDING = "__pgmedallion_offending_row__"


@dataclass(frozen=True)
class Expectation:
    name: str
    condition: str
    action: str

    def passes(self) -> Column:
        return F.coalesce(F.expr(self.condition), F.lit(False))


QUALITY_ARROW = pa.schema(
    [
        ("run", pa.int64()),
        ("source", pa.string()),
        ("table", pa.string()),
        ("rule", pa.string()),
        ("policy", pa.string()),
        ("failed", pa.int64()),
        ("passed", pa.int64()),
        ("sample", pa.string()),
        ("checked_at", pa.timestamp("us", tz="UTC")),
    ]
)
"""One rule's outcome on one table (or dataset) in one run: the rows of gold's ``_quality`` and
of a declarative pipeline's ``_quality`` alike. ``policy`` is warn, drop or fail for an
expectation (gold's tables: their ``on_error``, fail, quarantine or warn); ``sample`` a JSON
array of failing rows (``"[]"`` when none are kept); ``checked_at`` UTC."""


def quality_schema() -> T.StructType:
    """:data:`QUALITY_ARROW` as Spark's."""
    return spark_types(QUALITY_ARROW)


def quality_frame(spark: SparkSession, rows: Iterable[tuple]) -> DataFrame:
    """Rows ``(run, source, table, rule, policy, failed, passed, sample, checked_at)`` as a
    DataFrame of :func:`quality_schema`, ready to append to a ``_quality`` table."""
    return spark.createDataFrame(list(rows), quality_schema())


def quality_rows(counts: DataFrame, *, run: int, source: str, checked_at: datetime) -> DataFrame:
    """A ``<dataset>_quality`` view's counts (:func:`quality_counts`) in :func:`quality_schema`:
    ``table`` is the dataset, ``policy`` the rule's action; no sample is kept (``"[]"``)."""
    return counts.select(
        F.lit(run).cast("long").alias("run"),
        F.lit(source).alias("source"),
        F.col("dataset").alias("table"),
        F.col("rule"),
        F.col("action").alias("policy"),
        F.col("failed").cast("long").alias("failed"),
        F.col("passed").cast("long").alias("passed"),
        F.lit("[]").alias("sample"),
        F.lit(checked_at).cast("timestamp").alias("checked_at"),
    )


def rules_of(fn: Callable) -> list[Expectation]:
    return list(getattr(fn, _RULES_ATTR, []))


def apply_expectations(df: DataFrame, rules: list[Expectation]) -> DataFrame:
    """The dataset's output under its rules: drop rules filter, fail rules raise in the plan."""
    for rule in rules:
        if rule.action == DROP:
            df = df.filter(rule.passes())
        elif rule.action == FAIL:
            # The row as JSON, by a star in a projection: a pipeline's query function may not
            # analyse its DataFrame (``df.columns``: ATTEMPT_ANALYSIS_IN_PIPELINE_QUERY_FUNCTION).
            # A filter keeps raise_error in the plan; a projected column could be pruned away.
            df = df.withColumn(_OFFENDING, F.to_json(F.struct(F.col("*"))))
            df = df.filter(
                F.when(
                    ~rule.passes(),
                    F.raise_error(
                        F.concat(
                            F.lit(f"expectation '{rule.name}' failed ({rule.condition}) on row "),
                            F.col(_OFFENDING),
                        )
                    ),
                ).otherwise(F.lit(True))
            ).drop(_OFFENDING)
    return df


def quality_counts(df: DataFrame, dataset: str, rules: list[Expectation]) -> DataFrame:
    """One row per rule: how many input rows pass and fail it."""
    aggs = []
    for i, rule in enumerate(rules):
        aggs.append(F.count_if(rule.passes()).alias(f"p{i}"))
        aggs.append(F.count_if(~rule.passes()).alias(f"f{i}"))
    counted = df.agg(*aggs)
    rows = [
        F.struct(
            F.lit(dataset).alias("dataset"),
            F.lit(rule.name).alias("rule"),
            F.lit(rule.action).alias("action"),
            F.col(f"p{i}").alias("passed"),
            F.col(f"f{i}").alias("failed"),
        )
        for i, rule in enumerate(rules)
    ]
    return counted.select(F.explode(F.array(*rows)).alias("q")).select("q.*")


def _expectation(action: str, rules: dict[str, str]) -> Callable[[Callable], Callable]:
    new = [Expectation(name, cond, action) for name, cond in rules.items()]

    def decorate(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any):
            return fn(*args, **kwargs)

        setattr(wrapper, _RULES_ATTR, rules_of(fn) + new)
        return wrapper

    return decorate


def _native(name: str):
    from pyspark import pipelines as dp

    return getattr(dp, name)


def expect(name: str, condition: str):
    if on_databricks():
        return _native("expect")(name, condition)
    return _expectation(WARN, {name: condition})


def expect_or_drop(name: str, condition: str):
    if on_databricks():
        return _native("expect_or_drop")(name, condition)
    return _expectation(DROP, {name: condition})


def expect_or_fail(name: str, condition: str):
    if on_databricks():
        return _native("expect_or_fail")(name, condition)
    return _expectation(FAIL, {name: condition})


def expect_all(rules: dict[str, str]):
    if on_databricks():
        return _native("expect_all")(rules)
    return _expectation(WARN, rules)


def expect_all_or_drop(rules: dict[str, str]):
    if on_databricks():
        return _native("expect_all_or_drop")(rules)
    return _expectation(DROP, rules)


def expect_all_or_fail(rules: dict[str, str]):
    if on_databricks():
        return _native("expect_all_or_fail")(rules)
    return _expectation(FAIL, rules)


def materialized_view(*, name: str, **kwargs: Any) -> Callable[[Callable], Callable]:
    """``dp.materialized_view`` that also enforces and counts the function's expectations."""
    from pyspark import pipelines as dp

    def decorate(fn: Callable) -> Callable:
        rules = rules_of(fn)
        if not rules or on_databricks():
            return dp.materialized_view(name=name, **kwargs)(fn)

        def checked() -> DataFrame:
            return apply_expectations(fn(), rules)

        def quality() -> DataFrame:
            return quality_counts(fn(), name, rules)

        dp.materialized_view(name=f"{name}_quality")(quality)
        return dp.materialized_view(name=name, **kwargs)(checked)

    return decorate


def table(*, name: str, **kwargs: Any) -> Callable[[Callable], Callable]:
    """``dp.table`` (a streaming table); expectations on it only run on Databricks."""
    from pyspark import pipelines as dp

    def decorate(fn: Callable) -> Callable:
        if rules_of(fn) and not on_databricks():
            raise ValueError(
                f"expectations on streaming table {name!r} are enforced only by Lakeflow; "
                "put them on a materialized view that reads it"
            )
        return dp.table(name=name, **kwargs)(fn)

    return decorate
