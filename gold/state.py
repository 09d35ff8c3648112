"""Diffs to state: gold's rules, each written once, over Arrow tables (no reads, no writes).

A table's state is a multiset of rows. Gold keeps it as plain rows (a row of multiplicity m
appears m times) and works on it in *consolidated* form: one row per distinct value with
``_multiplicity`` (the signed sum of its diffs) and ``_lsn`` (the largest LSN among them: the
row's last change).

An incremental run groups the changes by a *key*: the primary key, or, for a table without
one, the whole row (then a "key" is a distinct row value and its multiplicity says how many
copies exist). For every key the new diffs touch, the new state is the old state of that key
(gold's copies, +1 each, plus any rows held in quarantine with their multiplicity) plus the
new diffs, consolidated. Keys nothing touched keep their rows, so the work is proportional to
the changes::

    silver diffs ─┐
    gold's rows of the touched keys (+1) ─┼─ state_of ──> state ── rules (SQL, Spark) ──> judge
    quarantined rows of those keys ───────┘                                              │
                                            tallies <── counts per rule, rows held, gold rows
                                            merge_operations ──> MERGE into gold   (increment)
                                            gold_rows ──> overwrite of gold        (full build)

The quality rules (``gold.quality``) are SQL conditions that Spark evaluates on the state;
what each policy sends to gold and to quarantine is decided here (``judge``), and so are the
MERGE operations: per key, an ``upsert`` (at most one row before and after: update in place or
insert), a ``delete`` (the key is gone), or, when a key has several rows on either side (a
key-less table's copies, or duplicate keys kept under ``warn``), a ``delete`` of all its old
rows plus an ``insert`` of each new copy. Every target row then matches at most one source row,
as MERGE requires.

Every function here is correct on any set of rows that holds all the rows of each key it sees,
so the same function serves a small table whole, in the driver (``gold.batch``), and a large
one a bucket of keys at a time, in Spark's Python workers (``gold.on_spark``). Rows are equal
by Spark's equality (``pgmedallion.core.multiset``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pgmedallion.core.multiset import (
    DIFF,
    LSN,
    MULT,
    consolidate,
    first_rows,
    group_ids,
    int_column,
    sum_by,
)

RULES, TO_GOLD, OP = "_rules", "_to_gold", "_op"
COPIES, TALLY = "_pgm_copies", "_pgm_tally"
OLD_GOLD, KEY_ROWS = "_old_gold", "_key_rows"
UPSERT, DELETE, INSERT = "upsert", "delete", "insert"
COUNTED, HELD, GOLD = "_n", "_held", "_gold"

__all__ = [
    "DIFF",
    "LSN",
    "MULT",
    "consolidate",
    "state_of",
    "with_key_rows",
    "old_state",
    "affected_keys",
    "failed_rules",
    "judge",
    "checked",
    "copies",
    "settled",
    "tallies",
    "rule_count",
    "failing",
    "merge_operations",
    "expand",
    "gold_rows",
]


def _key_columns(tables: Sequence[pa.Table], key: Sequence[str]) -> list[pa.ChunkedArray]:
    """Each key column of ``tables`` one after the other (of the first table's types)."""
    out = []
    for k in key:
        t = tables[0].schema.field(k).type
        chunks = []
        for table in tables:
            chunks += table.column(k).cast(t).chunks
        out.append(pa.chunked_array(chunks, t))
    return out


def with_key_rows(state: pa.Table, key: Sequence[str]) -> pa.Table:
    """Adds ``_key_rows``: how many copies (positive multiplicity) the row's key has. Without
    a key, the row is its own key (the state has one row per distinct value)."""
    copies = np.maximum(int_column(state, MULT), 0)
    if key:
        ids = group_ids([state.column(k) for k in key], state.num_rows)
        copies = sum_by(ids, int(ids.max(initial=-1)) + 1, copies)[ids]
    return state.append_column(KEY_ROWS, pa.array(copies, pa.int64()))


def state_of(
    diffs: pa.Table, columns: Sequence[str], key: Sequence[str], *, distinct: bool = False
) -> pa.Table:
    """``(columns, _lsn, _diff)`` -> the consolidated state with ``_key_rows``: what the rules
    are evaluated on (``key``: the primary key, empty for a table without one). ``distinct``:
    no two of ``diffs`` are equal (see ``core.multiset.consolidate``)."""
    return with_key_rows(consolidate(diffs, columns, distinct=distinct), key)


def old_state(gold: pa.Table, keys: pa.Table, key: Sequence[str], columns: Sequence[str]):
    """Gold's rows of the touched ``keys`` as diffs: ``(columns, _lsn, _diff = 1)``."""
    ids = group_ids(_key_columns([keys, gold], key), keys.num_rows + gold.num_rows)
    touched = np.isin(ids[keys.num_rows :], ids[: keys.num_rows])
    old = gold.filter(pa.array(touched)).select([*columns, LSN])
    return old.append_column(DIFF, pa.array(np.ones(old.num_rows, np.int64), pa.int64()))


def affected_keys(keys: pa.Table, old: pa.Table, key: Sequence[str]) -> pa.Table:
    """Every touched key once, with ``_old_gold``: how many rows gold has for it (``old``:
    gold's rows, or those of the touched keys, see ``old_state``)."""
    ids = group_ids(_key_columns([keys, old], key), keys.num_rows + old.num_rows)
    groups = int(ids.max(initial=-1)) + 1
    counts = np.bincount(ids[keys.num_rows :], minlength=groups).astype(np.int64)
    touched, first = first_rows(ids[: keys.num_rows])
    out = keys.select(list(key)).take(pa.array(first, pa.int64()))
    return out.append_column(OLD_GOLD, pa.array(counts[touched], pa.int64()))


def judge(checked: pa.Table, policy: str) -> pa.Table:
    """Adds ``_to_gold`` to consolidated rows with ``_rules`` (the rules each fails).

    A row goes to gold unless it fails a rule under ``quarantine``. A negative multiplicity
    can never be rows of gold: under every policy such a row stays out of gold (in quarantine),
    where the next run finds it as part of the key's old state.
    """
    held = int_column(checked, MULT) < 0
    if policy == "quarantine":
        failing = pc.fill_null(pc.list_value_length(checked.column(RULES)), 0)
        held |= failing.to_numpy(zero_copy_only=False) > 0
    return checked.append_column(TO_GOLD, pa.array(~held))


def failed_rules(state: pa.Table, rules: Sequence) -> pa.ListArray:
    """Per row of ``state`` (with ``_key_rows``), the names of the ``rules`` it fails, in the
    rules' order: each rule's :class:`~pgmedallion.gold.quality.Check` over Arrow, a NULL
    comparison failing as in SQL (the rule's SQL is the same condition, as data)."""
    rows = state.num_rows
    fails = np.zeros((rows, len(rules)), bool)
    for i, rule in enumerate(rules):
        if rule.check is None:
            raise ValueError(f"rule {rule.name} has no check to evaluate over Arrow")
        fails[:, i] = ~rule.check.passes(state)
    offsets = np.zeros(rows + 1, np.int32)
    np.cumsum(fails.sum(axis=1), out=offsets[1:])
    _, which = np.nonzero(fails)  # row by row, each row's rules in order
    names = pa.array([r.name for r in rules], pa.string()).take(pa.array(which, pa.int64()))
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), names)


def checked(state: pa.Table, rules: Sequence, policy: str) -> pa.Table:
    """``state_of``'s state -> with ``_rules`` (``failed_rules``) and ``_to_gold``
    (``judge``); ``_key_rows`` dropped."""
    with_rules = state.append_column(RULES, failed_rules(state, rules))
    return judge(with_rules, policy).drop_columns([KEY_ROWS])


def settled(
    diffs: pa.Table,
    columns: Sequence[str],
    key: Sequence[str],
    rules: Sequence,
    policy: str,
) -> pa.Table:
    """``(columns, _lsn, _diff)`` -> the checked state with ``_pgm_copies`` (``copies``) and a
    last row holding only ``_pgm_tally``, the ``tallies`` of these rows as a list (NULL in every
    other row): the whole of a table's rules for a set of rows holding all the rows of each
    key, in one pass (what Spark runs per bucket of keys, see ``gold.on_spark.settled``)."""
    rows = checked(state_of(diffs, columns, key), rules, policy)
    rows = rows.append_column(COPIES, pa.array(copies(rows), pa.int64()))
    (counts,) = tallies(rows, [r.name for r in rules]).to_pylist()
    tally = pa.array([list(counts.values())], pa.list_(pa.int64()))
    last = pa.table(
        {**{f.name: pa.nulls(1, f.type) for f in rows.schema}, TALLY: tally},
    )
    rows = rows.append_column(TALLY, pa.nulls(rows.num_rows, pa.list_(pa.int64())))
    return pa.concat_tables([rows, last])


def tally_names(rule_names: Sequence[str]) -> list[str]:
    """The ``tallies`` columns, in order (the order of ``settled``'s ``_pgm_tally`` lists)."""
    return [COUNTED, HELD, GOLD] + [rule_count(i) for i in range(len(rule_names))]


def copies(checked: pa.Table) -> np.ndarray:
    """How many copies of each checked row gold gets: its multiplicity where ``judge`` sends
    it to gold, else 0."""
    return np.where(_to_gold(checked), int_column(checked, MULT), 0)


def _to_gold(checked: pa.Table) -> np.ndarray:
    goes = pc.fill_null(checked.column(TO_GOLD), False).to_numpy(zero_copy_only=False)
    return goes & (int_column(checked, MULT) > 0)


def tallies(checked: pa.Table, rule_names: Sequence[str]) -> pa.Table:
    """One row: ``_n`` rows, ``_held`` rows kept out of gold, ``_gold`` rows gold gets, and per
    rule (in order) ``_f<i>``, the rows failing it. Tallies of parts add up to the whole's."""
    goes = _to_gold(checked)
    held = ~pc.fill_null(checked.column(TO_GOLD), False).to_numpy(zero_copy_only=False)
    counts = {  # in the order of tally_names
        COUNTED: checked.num_rows,
        HELD: int(held.sum()),
        GOLD: int(int_column(checked, MULT)[goes].sum()),
    }
    for i, name in enumerate(rule_names):
        counts[rule_count(i)] = int(failing(checked, name).sum())
    return pa.table({k: pa.array([v], pa.int64()) for k, v in counts.items()})


def failing(checked: pa.Table, rule: str) -> np.ndarray:
    """Which rows of ``checked`` fail ``rule`` (its name is in their ``_rules``)."""
    rules = checked.column(RULES).combine_chunks() if checked.num_rows else None
    out = np.zeros(checked.num_rows, bool)
    if rules is None:
        return out
    hits = pc.fill_null(pc.equal(pc.list_flatten(rules), rule), False)
    hits = hits.to_numpy(zero_copy_only=False)
    out[pc.list_parent_indices(rules).to_numpy()[hits]] = True
    return out


def rule_count(i: int) -> str:
    """The ``tallies`` column counting the rows that fail rule ``i``."""
    return f"_f{i}"


def expand(rows: pa.Table, times: np.ndarray | None = None) -> pa.Table:
    """Consolidated rows -> plain rows: a row of multiplicity m (or ``times``) appears m
    times."""
    times = np.maximum(int_column(rows, MULT), 0) if times is None else times
    taken = rows.take(pa.array(np.repeat(np.arange(rows.num_rows), times), pa.int64()))
    return taken.drop_columns([MULT])


def gold_rows(checked: pa.Table, columns: Sequence[str]) -> pa.Table:
    """A full build's gold rows: each checked row as many times as ``copies`` says,
    ``(columns, _lsn)``."""
    return expand(checked.select([*columns, LSN, MULT]), copies(checked))


def merge_operations(
    checked: pa.Table, affected: pa.Table, key: Sequence[str], columns: Sequence[str]
) -> pa.Table:
    """MERGE source rows ``(columns, _lsn, _op)`` turning gold's old rows into the new ones.

    ``checked``: the new consolidated state of the affected keys (``judge``'s output);
    ``affected``: every key the changes touch, with ``_old_gold``, how many rows gold has for
    it (a key whose rows all cancelled out is in ``affected`` but not in ``checked``).
    """
    columns = list(columns)
    to_gold = checked.filter(pa.array(_to_gold(checked))).select([*columns, LSN, MULT])
    n_affected = affected.num_rows
    ids = group_ids(_key_columns([affected, to_gold], key), n_affected + to_gold.num_rows)
    groups = int(ids.max(initial=-1)) + 1
    mine, theirs = ids[:n_affected], ids[n_affected:]
    old = np.zeros(groups, np.int64)
    old[mine] = int_column(affected, OLD_GOLD)
    new = sum_by(theirs, groups, int_column(to_gold, MULT))
    several = (old > 1) | (new > 1)  # the key's old rows all go, its new ones are inserted
    gone = (several & (old >= 1)) | ((old == 1) & (new == 0))

    deleted = affected.filter(pa.array(gone[mine]))
    types = {n: to_gold.schema.field(n).type for n in [*columns, LSN]}
    deletes = pa.table(
        {
            **{
                n: deleted.column(n).cast(types[n])
                if n in key
                else pa.nulls(deleted.num_rows, types[n])
                for n in columns
            },
            LSN: pa.nulls(deleted.num_rows, pa.int64()),
            OP: pa.array([DELETE] * deleted.num_rows, pa.string()),
        }
    )
    inserted = several[theirs]
    upserts = to_gold.filter(pa.array(~inserted)).drop_columns([MULT])
    upserts = upserts.append_column(OP, pa.array([UPSERT] * upserts.num_rows, pa.string()))
    inserts = expand(to_gold.filter(pa.array(inserted)))
    inserts = inserts.append_column(OP, pa.array([INSERT] * inserts.num_rows, pa.string()))
    schema = pa.schema([pa.field(n, types[n]) for n in [*columns, LSN]] + [(OP, pa.string())])
    parts = (upserts, deletes, inserts)
    return pa.concat_tables([t.select(schema.names).cast(schema) for t in parts])
