"""Previous images for REPLICA IDENTITY DEFAULT and USING INDEX: exact diffs from key-only changes.

Under those identities an UPDATE carries the new row only (plus the old key when the key
changed), a DELETE only the key, and an unchanged TOASTed value arrives as ``'u'`` with no old
value. :mod:`silver.changes` turns such a change into a ``RETRACT`` row (the key) and, for an
update, a ``FILL`` row (the new row, some columns still to fill). This module replaces them with
whole rows, taken from the table's state just before the change::

    state(before c) = silver's state at the last frontier         (the keys the run looks up)
                    + this run's snapshot rows                     (a table snapshotted now)
                    + the run's earlier changes, by (commit LSN, ordinal)

    RETRACT key  ->  (state[key], -1), and state loses key
    FILL new     ->  (new with its 'u' columns from the row the same change retracted, +1)

Every other change keeps its rows and only moves the state (a whole row in or out by its key).
The state at the last frontier is the sum of the silver table's rows of earlier runs (never
this run's: a rerun after a crash between two commits resolves against the same state, so it
produces the same rows), read only for the keys the run retracts, so the cost follows the run's
changes, not the table: a filter on each key column's range lets Delta skip files by their
statistics, then a semi-join keeps the keys themselves.

A change at or below the table's snapshot LSN S is already in the snapshot. With a whole old
row it is kept and rewound (see ``silver/build.py``); a key-only one is dropped with all its
rows instead: the state it would need is the one *before* the snapshot, which nobody has, and
the change and its rewind sum to nothing at every time from S on. So for such a table time 0
holds the state at S rather than at the slot's start, and every time from S on is exact.

A key that is not in the state (its row never reached silver, say it had a ``CastError``)
cannot be retracted: that change is the definite error ``UnknownPreviousRow`` for the table,
and a ``FILL`` with columns to fill from it is ``MissingToast``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from pgmedallion.core import sparkapi
from pgmedallion.core.by_key import by_key, by_position
from pgmedallion.core.multiset import MULT, consolidate, positive
from pgmedallion.core.naming import quote
from pgmedallion.core.sparkapi import F, T
from pgmedallion.silver.changes import FILL, PLAIN, RETRACT
from pgmedallion.silver.contract import DIFF, LSN
from pgmedallion.silver.errors import MissingToast, UnknownPreviousRow

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame


@dataclass(frozen=True)
class Change:
    """One diff row of a change, typed: ``values`` in table column order."""

    lsn: int
    ordinal: int
    diff: int
    kind: int
    columns: tuple[int, ...]
    values: list


@dataclass(frozen=True)
class Resolved:
    lsn: int
    diff: int
    values: list


@dataclass(frozen=True)
class Unresolved:
    lsn: int
    code: str
    message: str


def hashable(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(hashable(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, hashable(v)) for k, v in value.items()))
    if isinstance(value, Decimal):
        return value.normalize()
    if isinstance(value, float) and math.isnan(value):
        return _NAN  # NaN equals itself here, as in PostgreSQL (a row holding one is found)
    return value


_NAN = ("NaN",)


class _State:
    """Rows by key. The key is the one of the table's identity (``keys``). A run whose changes
    carry more than one identity (the source's primary key or replica identity changed within
    it) holds its rows by a serial number instead (``by_row``: the old key need not be unique
    after the change), and looks each up under its own key columns through an index of them,
    built at its first use and kept up to date."""

    def __init__(self, keys: tuple[int, ...], by_row: bool = False) -> None:
        self.keys = keys
        self.by_row = by_row
        self.rows: dict[Any, list] = {}
        self.other: dict[tuple[int, ...], dict[tuple, set]] = {}
        """Key columns -> key -> the ids in ``rows`` of the rows with it."""
        self.serial = 0

    def _key(self, values: Sequence, keys: tuple[int, ...]) -> tuple:
        return tuple(hashable(values[p]) for p in keys)

    def clear(self) -> None:
        self.rows.clear()
        self.other.clear()

    def put(self, values: list) -> None:
        if self.by_row:
            self.serial += 1
            key: Any = self.serial
        else:
            key = self._key(values, self.keys)
            if key in self.rows:
                self._unindex(key)
        self.rows[key] = values
        for keys, index in self.other.items():
            index.setdefault(self._key(values, keys), set()).add(key)

    def _unindex(self, key: Any) -> None:
        for keys, index in self.other.items():
            held = index.get(self._key(self.rows[key], keys))
            if held is not None:
                held.discard(key)

    def pop(self, values: Sequence, keys: tuple[int, ...]) -> list | None:
        if keys == self.keys and not self.by_row:
            key = self._key(values, keys)
        else:
            if keys not in self.other:
                index: dict[tuple, set] = {}
                for k, row in self.rows.items():
                    index.setdefault(self._key(row, keys), set()).add(k)
                self.other[keys] = index
            held = self.other[keys].get(self._key(values, keys))
            key = min(held, key=repr) if held else None
        if key is None or key not in self.rows:
            return None
        self._unindex(key)
        return self.rows.pop(key)


def resolve(
    base: Iterable[list],
    changes: Iterable[Change],
    keys: tuple[int, ...],
    truncates: Iterable[tuple[int, int]] = (),
    by_row: bool = False,
) -> tuple[list[Resolved], list[Unresolved]]:
    """The whole rows of the ``RETRACT`` and ``FILL`` rows among ``changes`` (any order; all of
    the table's changes of the run above its snapshot LSN), given ``base``: the table's rows at
    the last frontier with the keys the run retracts (and its snapshot rows, if any). ``keys``:
    the identity's key positions. ``truncates``: ``(lsn, ordinal)`` where the table was emptied
    (the ``delete`` policy). ``by_row``: the changes carry more than one identity (see
    :class:`_State`; a whole row's removal is then matched on every column). Pure and
    deterministic."""
    state = _State(keys, by_row)
    for values in base:
        state.put(values)
    events = sorted(
        [((c.lsn, c.ordinal, c.diff), c) for c in changes]
        + [((lsn, ordinal, -2), None) for lsn, ordinal in truncates],
        key=lambda e: e[0],
    )
    retracted: dict[tuple[int, int], list | None] = {}
    out: list[Resolved] = []
    errors: list[Unresolved] = []
    for _, c in events:
        if c is None:
            state.clear()
        elif c.kind == PLAIN:
            if c.diff < 0:
                state.pop(c.values, tuple(range(len(c.values))) if by_row else keys)
            else:
                state.put(c.values)
        elif c.kind == RETRACT:
            previous = state.pop(c.values, c.columns)
            retracted[(c.lsn, c.ordinal)] = previous
            if previous is None:
                key = ", ".join(repr(c.values[p]) for p in c.columns)
                errors.append(
                    Unresolved(
                        c.lsn,
                        UnknownPreviousRow.__name__,
                        f"no row with key ({key}) before this change: its earlier image never "
                        "reached silver (see the table's earlier errors)",
                    )
                )
            else:
                out.append(Resolved(c.lsn, -1, previous))
        elif c.kind == FILL:
            previous = retracted.get((c.lsn, c.ordinal))
            values = list(c.values)
            if c.columns:
                if previous is None:
                    errors.append(
                        Unresolved(
                            c.lsn,
                            MissingToast.__name__,
                            "unchanged TOAST value, and the row before the change is unknown",
                        )
                    )
                    continue
                for p in c.columns:
                    values[p] = previous[p]
            out.append(Resolved(c.lsn, 1, values))
            state.put(values)
    return out, errors


# --- on Spark -----------------------------------------------------------------------------------

ORDINAL, KIND, COLUMNS = "_pgm_ordinal", "_pgm_kind", "_pgm_columns"
_LSN, _DIFF = "_pgm_lsn", "_pgm_diff"
_SIDE = "_pgm_side"  # 0: a base row, 1: a change
_CODE, _MESSAGE = "_pgm_code", "_pgm_message"


def _key_filter(keys_df: DataFrame, names: Sequence[str], types: Sequence[T.DataType]) -> Any:
    """A range on each key column of an atomic type (what Delta's file statistics skip by)."""
    ranged = (T.NumericType, T.StringType, T.DateType, T.TimestampType, T.TimestampNTZType)
    names = [n if isinstance(t, ranged) else None for n, t in zip(names, types, strict=True)]
    bounds = keys_df.agg(
        *(F.min(f"_pgm_key{i}").alias(f"lo{i}") for i in range(len(names))),
        *(F.max(f"_pgm_key{i}").alias(f"hi{i}") for i in range(len(names))),
    ).first()
    conditions = [
        F.col(quote(n)).between(F.lit(bounds[f"lo{i}"]), F.lit(bounds[f"hi{i}"]))
        for i, n in enumerate(names)
        if n is not None and bounds[f"lo{i}"] is not None
    ]
    return functools.reduce(lambda a, b: a & b, conditions, F.lit(True))


@dataclass
class Images:
    rows: DataFrame
    """The run's rows, every ``RETRACT`` and ``FILL`` row replaced by a whole row."""
    errors: list[tuple[int, str, str]]
    """``(lsn, code, message)`` of the changes that could not be resolved."""
    cached: list[DataFrame]


def resolve_previous_images(
    typed: DataFrame,
    names: Sequence[str],
    keys: tuple[int, ...],
    prior: DataFrame | None,
    floor: int | Column | None,
    truncates: Sequence[tuple[int, int]] = (),
    identities: Sequence[tuple[int, ...]] | None = None,
) -> Images:
    """A table's cast rows of one run with every ``RETRACT`` and ``FILL`` row replaced by whole
    rows, and the changes that could not be resolved.

    ``typed``: the run's cast rows (data columns ``names``, then ``_pgm_lsn``, ``_pgm_diff``,
    ``_pgm_ordinal``, ``_pgm_kind``, ``_pgm_columns``; the last three NULL for snapshot rows).
    ``prior``: the silver table's rows of earlier runs, None if there are none to count (a
    table (re)snapshotted in this run: then only its rows above the snapshot LSN, ``floor``).
    The resolved rows are computed once, by buckets of keys (one Python task for the table
    where an update moved a row to another key, see :func:`_moves_a_key`), and kept in
    ``cached`` until the caller has written them. ``identities``: the key positions of each
    identity the run's key-only changes carry, when there is more than one (the source's key
    changed between them): the earlier rows are read under each, and held by row
    (:class:`_State`).
    """
    data = [quote(n) for n in names]
    above = F.col(_LSN) > (
        floor if isinstance(floor, sparkapi.Column) else F.lit(-1 if floor is None else floor)
    )
    changes = typed.where(F.col(KIND).isNotNull() & above)
    base = _previous_rows(typed, changes, names, keys, prior, identities)
    combined = base.select(
        *data,
        F.lit(0).cast("bigint").alias(_LSN),
        F.col(_DIFF),
        F.lit(None).cast("bigint").alias(ORDINAL),
        F.lit(None).cast("int").alias(KIND),
        F.lit(None).cast("array<int>").alias(COLUMNS),
        F.lit(0).alias(_SIDE),
    ).unionByName(changes.select(*data, _LSN, _DIFF, ORDINAL, KIND, COLUMNS, F.lit(1).alias(_SIDE)))
    schema = T.StructType(
        [f for f in typed.schema.fields if f.name in set(names)]
        + [
            T.StructField(_LSN, T.LongType()),
            T.StructField(_DIFF, T.LongType()),
            T.StructField(_CODE, T.StringType()),
            T.StructField(_MESSAGE, T.StringType()),
        ]
    )
    names, truncates = list(names), list(truncates)

    by_row = identities is not None
    key_names = [names[p] for p in keys]
    if not by_row and key_names and not _moves_a_key(changes, key_names):
        # Every change stays within its key: the keys' buckets resolve apart, in parallel.
        def by_bucket(table: pa.Table) -> pa.Table:
            return _resolve_arrow(table, names, keys, truncates)

        resolved = by_key(combined, key_names, by_bucket, schema)
    else:
        # applyInArrow parses its input columns' names (``back`tick`` fails): by position
        positional, order = by_position(combined)

        def run(table: pa.Table) -> pa.Table:
            return _resolve_arrow(table.rename_columns(order), names, keys, truncates, by_row)

        resolved = positional.groupBy(F.lit(0).alias("_pgm_group")).applyInArrow(run, schema)
    resolved = resolved.persist(sparkapi.StorageLevel.MEMORY_AND_DISK)
    errors = [
        (r[0], r[1], r[2])
        for r in resolved.where(F.col(_CODE).isNotNull()).select(_LSN, _CODE, _MESSAGE).collect()
    ]
    whole = typed.where(F.col(KIND).isNull() | (F.col(KIND) == PLAIN)).select(*data, _LSN, _DIFF)
    good = resolved.where(F.col(_CODE).isNull()).select(*data, _LSN, _DIFF)
    return Images(whole.unionByName(good), errors, [resolved])


def _moves_a_key(changes: DataFrame, key_names: Sequence[str]) -> bool:
    """Whether an update among ``changes`` moved its row to another key (its ``FILL`` row's key
    is not its ``RETRACT`` row's): its ``FILL`` row, in the new key's bucket, may take
    unchanged TOAST values from the row its ``RETRACT`` removed under the old key, in another
    bucket, so such a run's keys are resolved together."""
    pair = [F.col(_LSN), F.col(ORDINAL)]
    retracts = changes.where(F.col(KIND) == RETRACT).select(
        *pair, *(F.col(quote(n)).alias(f"_pgm_old{i}") for i, n in enumerate(key_names))
    )
    fills = changes.where(F.col(KIND) == FILL).select(
        *pair, *(F.col(quote(n)).alias(f"_pgm_new{i}") for i, n in enumerate(key_names))
    )
    same = functools.reduce(
        lambda a, b: a & b,
        [F.col(f"_pgm_old{i}").eqNullSafe(F.col(f"_pgm_new{i}")) for i in range(len(key_names))],
    )
    return bool(fills.join(retracts, [_LSN, ORDINAL]).where(~same).limit(1).collect())


def _previous_rows(
    typed: DataFrame,
    changes: DataFrame,
    names: Sequence[str],
    keys: tuple[int, ...],
    prior: DataFrame | None,
    identities: Sequence[tuple[int, ...]] | None = None,
) -> DataFrame:
    """The rows before the run (its snapshot rows and ``prior``) with a key some ``RETRACT``
    change of the run names, summed, with their positive multiplicities. With
    ``identities`` (more than one), a row is wanted when any ``RETRACT`` change names it under
    its own identity's key columns: one left join per identity flags the rows, so none is
    counted twice."""
    data = [quote(n) for n in names]
    base = typed.where(F.col(KIND).isNull()).select(*data, F.col(_DIFF))
    if prior is not None:
        base = base.unionByName(prior.select(*data, F.col("_diff").alias(_DIFF)))
    schema = T.StructType([typed.schema[n] for n in names] + [T.StructField(DIFF, T.LongType())])
    rule = functools.partial(state_before, names=list(names))
    if identities:
        hit = F.lit(False)
        for i, identity in enumerate(identities):
            key_names = [names[p] for p in identity]
            wanted = (
                changes.where(
                    (F.col(KIND) == RETRACT)
                    & (F.col(COLUMNS) == F.array(*[F.lit(p) for p in identity]))
                )
                .select(
                    *(F.col(quote(n)).alias(f"_pgm_id{i}_{j}") for j, n in enumerate(key_names))
                )
                .distinct()
                .withColumn(f"_pgm_hit{i}", F.lit(True))
            )
            on = functools.reduce(
                lambda a, b: a & b,
                [F.col(quote(n)) == F.col(f"_pgm_id{i}_{j}") for j, n in enumerate(key_names)],
            )
            base = base.join(F.broadcast(wanted), on, "left").drop(
                *[f"_pgm_id{i}_{j}" for j in range(len(key_names))]
            )
            hit = hit | F.col(f"_pgm_hit{i}").isNotNull()
        base = base.where(hit).select(*data, F.col(_DIFF))
        diffs = base.select(*data, F.col(_DIFF).alias(DIFF), F.lit(0).cast("bigint").alias(LSN))
        return by_key(diffs, list(names), rule, schema).withColumnRenamed(DIFF, _DIFF)
    key_names = [names[p] for p in keys]
    key_types = [typed.schema[n].dataType for n in key_names]
    wanted = (
        changes.where(F.col(KIND) == RETRACT)
        .select(*(F.col(quote(n)).alias(f"_pgm_key{i}") for i, n in enumerate(key_names)))
        .distinct()
    )
    if key_names:
        on = functools.reduce(
            lambda a, b: a & b,
            [F.col(quote(n)) == F.col(f"_pgm_key{i}") for i, n in enumerate(key_names)],
        )
        base = base.where(_key_filter(wanted, key_names, key_types)).join(
            F.broadcast(wanted), on, "left_semi"
        )
    diffs = base.select(*data, F.col(_DIFF).alias(DIFF), F.lit(0).cast("bigint").alias(LSN))
    return by_key(diffs, key_names or names, rule, schema).withColumnRenamed(DIFF, _DIFF)


def state_before(diffs: pa.Table, names: Sequence[str]) -> pa.Table:
    """A table's state before a run from ``(names, _lsn, _diff)``, the rows of its earlier runs
    (and its snapshot rows): each row value of a positive multiplicity once, with that
    multiplicity as ``_diff``. Spark applies it by buckets of keys, the batched path to a small
    table whole: one definition of the state previous images are taken from."""
    state = positive(consolidate(diffs, names))
    return state.select(list(names)).append_column(DIFF, state.column(MULT))


def _resolve_arrow(
    table: pa.Table,
    names: list[str],
    keys: tuple[int, ...],
    truncates: list[tuple[int, int]],
    by_row: bool = False,
) -> pa.Table:
    """Worker body: one table's previous rows (side 0) and changes (side 1) -> :func:`resolve`'s
    whole rows and errors."""
    rows = table.to_pylist()
    base_rows, changes_ = [], []
    for r in rows:
        values = [r[n] for n in names]
        if r[_SIDE] == 0:
            # held by row: each copy of a row is one (by key, a key is one row)
            base_rows.extend([values] * (max(1, r[_DIFF] or 1) if by_row else 1))
        else:
            changes_.append(
                Change(r[_LSN], r[ORDINAL], r[_DIFF], r[KIND], tuple(r[COLUMNS] or ()), values)
            )
    out, errors = resolve(base_rows, changes_, keys, truncates, by_row)
    records = [
        {**dict(zip(names, o.values, strict=True)), _LSN: o.lsn, _DIFF: o.diff} for o in out
    ] + [{_LSN: e.lsn, _DIFF: 0, _CODE: e.code, _MESSAGE: e.message} for e in errors]
    arrow = pa.schema(
        [table.schema.field(n) for n in names]
        + [
            pa.field(_LSN, pa.int64()),
            pa.field(_DIFF, pa.int64()),
            pa.field(_CODE, pa.string()),
            pa.field(_MESSAGE, pa.string()),
        ]
    )
    return pa.Table.from_pylist(records, schema=arrow)
