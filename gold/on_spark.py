"""``gold.state``'s rules on a large table: Spark reads and shuffles, the rules run as they are.

Spark does what only Spark can at size: read silver and gold, select the touched keys' rows,
and write. Every rule of ``gold.state`` is applied unchanged, to one bucket of keys at a time
(``pgmedallion.core.by_key``), so a large table and a small one are judged by one definition.
A table's rows cross into Python once: ``gold.state.settled`` computes the state, the rules each
row fails, what goes to gold and the tallies in one pass; what Spark does after that reads the
columns it wrote (a filter, gold's copies of a row) without Python::

    diffs ──by_key(settled)──> checked rows + a tallies row per part ──persisted
      (a full build of a keyed table: by_key_ranges, so that its rows come out clustered)
    tallies rows ──sum──> counts
    checked, affected ──cogrouped(merge_operations)──> MERGE source   (increment)
    checked ──each row _pgm_copies times──> gold's rows               (full build)
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING

from pgmedallion.core.by_key import by_key, by_key_ranges, cogrouped
from pgmedallion.core.naming import quote
from pgmedallion.core.sparkapi import F, T
from pgmedallion.gold import state
from pgmedallion.gold.quality import Rule
from pgmedallion.gold.state import (
    COPIES,
    DIFF,
    LSN,
    MULT,
    OLD_GOLD,
    OP,
    RULES,
    TALLY,
    TO_GOLD,
)

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame


def c(name: str, alias: str | None = None) -> Column:
    return F.col(f"{alias}.{quote(name)}" if alias else quote(name))


def _fields(df: DataFrame, names: Sequence[str]) -> list[T.StructField]:
    types = {f.name: f.dataType for f in df.schema.fields}
    return [T.StructField(n, types[n]) for n in names]


def _ordered(rule, names: Sequence[str]):
    """``rule`` with its result's columns in the order of the declared schema."""

    def apply(*tables):
        return rule(*tables).select(list(names))

    return apply


def settled(
    diffs: DataFrame,
    columns: Sequence[str],
    key: Sequence[str],
    group: Sequence[str],
    rules: Sequence[Rule],
    policy: str,
    ranges: int | None = None,
) -> DataFrame:
    """:func:`gold.state.settled` by buckets of ``group`` (the key, or every column), or, with
    ``ranges``, by that many ranges of ``group`` (its rows clustered for the write); see
    :func:`split` for its two kinds of rows."""
    schema = T.StructType(
        [
            *_fields(diffs, columns),
            T.StructField(MULT, T.LongType()),
            T.StructField(LSN, T.LongType()),
            T.StructField(RULES, T.ArrayType(T.StringType())),
            T.StructField(TO_GOLD, T.BooleanType()),
            T.StructField(COPIES, T.LongType()),
            T.StructField(TALLY, T.ArrayType(T.LongType())),
        ]
    )
    rule = partial(
        state.settled, columns=list(columns), key=list(key), rules=list(rules), policy=policy
    )
    if ranges is not None:
        return by_key_ranges(diffs, group, _ordered(rule, schema.names), schema, ranges)
    return by_key(diffs, group, _ordered(rule, schema.names), schema)


def split(settled: DataFrame, rule_names: Sequence[str]) -> tuple[DataFrame, dict]:
    """``settled``'s checked rows (``_rules``, ``_to_gold``, ``_pgm_copies``), and the
    tallies of the whole table: its parts' ``_pgm_tally`` lists, summed (one small collect)."""
    names = state.tally_names(rule_names)
    totals = dict.fromkeys(names, 0)
    for (tally,) in settled.filter(F.col(TALLY).isNotNull()).select(TALLY).collect():
        for name, value in zip(names, tally, strict=True):
            totals[name] += int(value)
    return settled.filter(F.col(TALLY).isNull()).drop(TALLY), totals


def gold_rows(checked: DataFrame, columns: Sequence[str]) -> DataFrame:
    """A full build's gold rows, ``(columns, _lsn)``: each checked row ``_pgm_copies`` times
    (:func:`gold.state.copies`), made by Spark in place (a row's partition and order kept)."""
    copy = "_pgm_copy"
    repeated = F.explode(F.array_repeat(F.lit(True), F.col(COPIES).cast("int"))).alias(copy)
    return checked.select(*[c(n) for n in columns], LSN, repeated).drop(copy)


def failed_rules(rules: Sequence[Rule]) -> Column:
    """The names of the ``rules`` a row fails (its columns, ``_multiplicity``, ``_key_rows``)."""
    failing = [F.when(~r.passes(), F.lit(r.name)) for r in rules]
    names = F.filter(F.array(*failing), lambda x: x.isNotNull()) if failing else F.array()
    return names.cast(T.ArrayType(T.StringType()))


def affected_keys(keys: DataFrame, old: DataFrame, key: Sequence[str]) -> DataFrame:
    """:func:`gold.state.affected_keys` by buckets of the key."""
    schema = T.StructType([*_fields(keys, key), T.StructField(OLD_GOLD, T.LongType())])
    rule = partial(state.affected_keys, key=list(key))
    return cogrouped(keys.select(*[c(k) for k in key]), old, key, rule, schema)


def merge_operations(
    checked: DataFrame, affected: DataFrame, key: Sequence[str], columns: Sequence[str]
) -> DataFrame:
    """:func:`gold.state.merge_operations` by buckets of the key."""
    schema = T.StructType([*_fields(checked, [*columns, LSN]), T.StructField(OP, T.StringType())])
    rule = partial(state.merge_operations, key=list(key), columns=list(columns))
    return cogrouped(checked, affected, key, _ordered(rule, schema.names), schema)


def old_state(gold: DataFrame, keys: DataFrame, key: Sequence[str], columns: Sequence[str]):
    """Gold's rows of the touched ``keys`` as diffs ``(columns, _lsn, _diff = 1)``: the
    selection of :func:`gold.state.old_state`, made by Spark's join where gold is read."""
    old = null_safe_join(gold, keys, key, "left_semi")
    return old.select(*[c(n) for n in columns], LSN, F.lit(1).cast("bigint").alias(DIFF))


def null_safe_join(
    left: DataFrame, right: DataFrame, key: Sequence[str], how: str, right_key: str = "__k"
) -> DataFrame:
    """Join on ``key`` with NULL equal to NULL (a NULL key is a key like any other here).

    The right side's key columns are renamed so both sides' names stay unambiguous; for an
    inner or left join they are dropped from the result.
    """
    renamed = right.select(
        *[c(k).alias(f"{right_key}{i}") for i, k in enumerate(key)],
        *[c(n) for n in right.columns if n not in key],
    )
    cond = None
    for i, k in enumerate(key):
        term = c(k).eqNullSafe(F.col(f"{right_key}{i}"))
        cond = term if cond is None else cond & term
    joined = left.join(renamed, cond if cond is not None else F.lit(True), how)
    if how in ("left_semi", "left_anti"):
        return joined
    return joined.drop(*[f"{right_key}{i}" for i in range(len(key))])
