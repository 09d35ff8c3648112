"""Diffs to state: the pure DataFrame transformations of gold (no reads, no writes).

A table's state is a multiset of rows. Gold keeps it as plain rows (a row of multiplicity m
appears m times) and works on it in *consolidated* form: one row per distinct value with
``_multiplicity`` (the signed sum of its diffs) and ``_lsn`` (the largest LSN among them: the
row's last change).

An incremental run groups the changes by a *key*: the primary key, or, for a table without
one, the whole row (then a "key" is a distinct row value and its multiplicity says how many
copies exist). For every key the new diffs touch, the new state is the old state of that key
(gold's copies, +1 each, plus any rows held in quarantine with their multiplicity) plus the
new diffs, consolidated. Keys nothing touched keep their rows, so the work is proportional to
the changes.

The rules (``gold.quality``) are evaluated on that consolidated state; what each policy sends
to gold and to quarantine is decided here, and so are the MERGE operations: per key, an
``upsert`` (at most one row before and after: update in place or insert), a ``delete`` (the key
is gone), or, when a key has several rows on either side (a key-less table's copies, or
duplicate keys kept under ``warn``), a ``delete`` of all its old rows plus an ``insert`` of each
new copy. Every target row then matches at most one source row, as MERGE requires.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from pgmedallion.core.naming import quote
from pgmedallion.gold.quality import Rule
from pgmedallion.silver.contract import DIFF, LSN

MULT, RULES, TO_GOLD, OP = "_multiplicity", "_rules", "_to_gold", "_op"
OLD_GOLD, KEY_ROWS = "_old_gold", "_key_rows"
UPSERT, DELETE, INSERT = "upsert", "delete", "insert"


def c(name: str, alias: str | None = None) -> Column:
    return F.col(f"{alias}.{quote(name)}" if alias else quote(name))


def consolidate(updates: DataFrame, columns: Sequence[str]) -> DataFrame:
    """``(columns, _lsn, _diff)`` -> one row per distinct value: ``_multiplicity``, ``_lsn``.

    Values whose diffs sum to zero are not in the state and are dropped.
    """
    return (
        updates.groupBy(*[c(n) for n in columns])
        .agg(F.sum(DIFF).alias(MULT), F.max(LSN).alias(LSN))
        .filter(F.col(MULT) != 0)
    )


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


def with_key_rows(state: DataFrame, key: Sequence[str]) -> DataFrame:
    """Adds ``_key_rows``: how many copies (positive multiplicity) the row's key has. Without
    a key, the row is its own key (the state has one row per distinct value)."""
    if not key:
        return state.withColumn(KEY_ROWS, F.greatest(F.col(MULT), F.lit(0)))
    by_key = state.groupBy(*[c(k) for k in key]).agg(
        F.sum(F.greatest(F.col(MULT), F.lit(0))).alias(KEY_ROWS)
    )
    return null_safe_join(state, by_key, key, "left")


def check(state: DataFrame, rules: Sequence[Rule], key: Sequence[str], policy: str) -> DataFrame:
    """Adds ``_rules`` (names of the rules the row fails) and ``_to_gold`` (``judge``), the
    rules seeing ``_key_rows`` (``with_key_rows``)."""
    return judge(with_key_rows(state, key), rules, policy).drop(KEY_ROWS)


def judge(keyed: DataFrame, rules: Sequence[Rule], policy: str) -> DataFrame:
    """Adds ``_rules`` and ``_to_gold`` to consolidated rows with ``_key_rows``.

    A row goes to gold unless it fails a rule under ``quarantine``. A negative multiplicity
    can never be rows of gold: under every policy such a row stays out of gold (in quarantine),
    where the next run finds it as part of the key's old state.
    """
    checked = keyed.withColumn(RULES, failed_rules(rules))
    held = F.col(MULT) < 0
    if policy == "quarantine":
        held = held | (F.size(F.col(RULES)) > 0)
    return checked.withColumn(TO_GOLD, ~held)


def old_state(gold: DataFrame, keys: DataFrame, key: Sequence[str], columns: Sequence[str]):
    """Gold's rows of the touched ``keys`` as diffs: ``(columns, _lsn, _diff = 1)``."""
    old = null_safe_join(gold, keys, key, "left_semi")
    return old.select(*[c(n) for n in columns], LSN, F.lit(1).cast("bigint").alias(DIFF))


def affected_keys(keys: DataFrame, old: DataFrame, key: Sequence[str]) -> DataFrame:
    """Every touched key with ``_old_gold``: how many rows gold has for it (``old_state``)."""
    counts = old.groupBy(*[c(k) for k in key]).agg(F.count(F.lit(1)).alias(OLD_GOLD))
    return null_safe_join(keys, counts, key, "left").fillna(0, [OLD_GOLD])


def tallies(checked: DataFrame, rule_names: Sequence[str], by: Sequence[str] = ()) -> DataFrame:
    """Per group of ``by`` (one row without): ``_n`` rows, ``_held`` rows kept out of gold,
    ``_gold`` rows gold gets, and per rule (in order) ``_f<i>``, the rows failing it."""
    to_gold = F.when(F.col(TO_GOLD) & (F.col(MULT) > 0), F.col(MULT)).otherwise(0)
    aggs = [
        F.count(F.lit(1)).alias("_n"),
        F.count_if(~F.col(TO_GOLD)).alias("_held"),
        F.coalesce(F.sum(to_gold), F.lit(0)).cast("bigint").alias("_gold"),
    ]
    for i, name in enumerate(rule_names):
        aggs.append(F.count_if(F.array_contains(F.col(RULES), name)).alias(f"_f{i}"))
    return checked.groupBy(*[c(n) for n in by]).agg(*aggs)


def failed_rules(rules: Sequence[Rule]) -> Column:
    """The names of the ``rules`` a row fails (its columns, ``_multiplicity``, ``_key_rows``)."""
    failing = [F.when(~r.passes(), F.lit(r.name)) for r in rules]
    names = F.filter(F.array(*failing), lambda x: x.isNotNull()) if failing else F.array()
    return names.cast(T.ArrayType(T.StringType()))


def expand(rows: DataFrame) -> DataFrame:
    """Consolidated rows -> plain rows: a row of multiplicity m appears m times."""
    return rows.withColumn("_copy", F.explode(F.sequence(F.lit(1), F.col(MULT)))).drop(
        "_copy", MULT
    )


def merge_operations(
    checked: DataFrame, affected: DataFrame, key: Sequence[str], columns: Sequence[str]
) -> DataFrame:
    """MERGE source rows ``(columns, _lsn, _op)`` turning gold's old rows into the new ones.

    ``checked``: the new consolidated state of the affected keys (``check``'s output);
    ``affected``: every key the changes touch, with ``_old_gold``, how many rows gold has for
    it (a key whose rows all cancelled out is in ``affected`` but not in ``checked``).
    """
    to_gold = checked.filter(F.col(TO_GOLD) & (F.col(MULT) > 0)).select(
        *[c(n) for n in columns], LSN, MULT
    )
    new_counts = to_gold.groupBy(*[c(k) for k in key]).agg(F.sum(MULT).alias("_new_gold"))
    keys = null_safe_join(affected, new_counts, key, "left").fillna(0, ["_new_gold", OLD_GOLD])
    single = keys.filter((F.col(OLD_GOLD) <= 1) & (F.col("_new_gold") <= 1))
    multi = keys.filter((F.col(OLD_GOLD) > 1) | (F.col("_new_gold") > 1))

    upserts = null_safe_join(to_gold, single, key, "left_semi").drop(MULT)
    upserts = upserts.withColumn(OP, F.lit(UPSERT))
    gone = single.filter((F.col(OLD_GOLD) == 1) & (F.col("_new_gold") == 0))
    rewritten = multi.filter(F.col(OLD_GOLD) >= 1)
    deletes = _key_only(gone.unionByName(rewritten), key, columns, to_gold.schema)
    inserts = expand(null_safe_join(to_gold, multi, key, "left_semi"))
    inserts = inserts.withColumn(OP, F.lit(INSERT))
    return upserts.unionByName(deletes).unionByName(inserts)


def _key_only(
    keys: DataFrame, key: Sequence[str], columns: Sequence[str], schema: T.StructType
) -> DataFrame:
    """Delete markers: the key's values, NULL elsewhere."""
    types = {f.name: f.dataType for f in schema.fields}
    cols = [c(n) if n in key else F.lit(None).cast(types[n]).alias(n) for n in columns]
    return keys.select(*cols, F.lit(None).cast("bigint").alias(LSN), F.lit(DELETE).alias(OP))
