"""pgoutput changes to differential updates: pure functions, no Spark.

A change is read against the Relation message in effect for its table at that point of the
stream (the latest one before it, by ``(commit LSN, ordinal)``), and becomes rows of text
values in the *table's* column order, each with a signed multiplicity::

    INSERT  new               ->  (new, +1)
    DELETE  old ('O')         ->  (old, -1)
    UPDATE  old ('O'), new    ->  (old, -1), (new, +1)      'u' in new = the old value

Under REPLICA IDENTITY DEFAULT or USING INDEX the stream carries no old row for an update (only
the old key, when the key changed) and only the key for a delete, and an unchanged TOASTed value
arrives as ``'u'`` with nothing to take it from. Such a change becomes rows that name what they
need instead of holding it, for :mod:`silver.identity` to resolve against the table's state just
before the change::

    UPDATE  old key ('K') or none, new   ->  (key, -1) RETRACT,  (new, +1) FILL
    DELETE  key ('K')                    ->  (key, -1) RETRACT

A ``RETRACT`` row holds the identity's key columns only (the rest NULL) and stands for the whole
row with that key; a ``FILL`` row is the new row, whose ``'u'`` columns (NULL here, listed in
``columns``) take the values of the row the same change retracts. A table whose Relation marks
no key column (REPLICA IDENTITY NOTHING, or DEFAULT without a primary key) cannot resolve
anything: its updates and deletes are the definite error ``DefaultReplicaIdentity``. Under FULL
an old row with an unchanged-TOAST marker is ``MissingToast``.

Column layouts. The table's columns are those of its schema record (the catalog at the
snapshot), extended by columns that later Relation messages add: rows from before an added
column carry NULL there, or the value PostgreSQL gives them when the column was added with one
(:func:`with_fill`). A Relation that drops, renames or retypes a known column (another type,
or a type modifier that changes its Spark type, such as numeric(10,2) to numeric(12,2)) makes the
layout incompatible (``SchemaIncompatible``): changes read against it produce no rows.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from pgmedallion.capture.pgoutput import (
    OLD_TUPLE_FULL,
    UNCHANGED_TOAST,
    BinaryValue,
    Delete,
    Insert,
    Relation,
    Update,
)
from pgmedallion.silver.errors import (
    DefaultReplicaIdentity,
    InvalidValue,
    MissingToast,
    SchemaIncompatible,
)


@dataclass(frozen=True)
class TableColumn:
    name: str
    type_oid: int
    typmod: int


DISCARDED = -1
"""The position of a Relation column the table does not have (see :func:`plan_columns`)."""


@dataclass(frozen=True)
class Layout:
    """How one Relation message's columns map onto the table's columns."""

    positions: tuple[int, ...] | None
    """For each Relation column, its index among the table's columns; None = incompatible."""
    problem: str | None = None
    keys: tuple[int, ...] = ()
    """The table positions of the columns the Relation marks as its replica identity's key."""
    fill: tuple[str | None, ...] = ()
    """What a row read against this Relation holds in the table's columns it lacks, by table
    position (empty: NULL in all): the value rows from before a column read when it was added
    with one (``ADD COLUMN ... DEFAULT 1``, see :func:`with_fill`)."""


PLAIN, RETRACT, FILL = 0, 1, 2
"""What a diff row of a change is: a whole row; the row with this key (see the module doc); the
new row of a change with a RETRACT, whose unchanged-TOAST columns come from the retracted row."""


class Diff(NamedTuple):
    diff: int
    values: list
    kind: int = PLAIN
    columns: tuple[int, ...] = ()
    """RETRACT: the key's positions; FILL: the positions of the unchanged-TOAST columns."""


"""What :func:`change_diffs` raises for a change it cannot read (a :mod:`silver.errors` type;
``code`` names it in the errors table)."""


def _retyped(
    known: TableColumn, column: Any, target_type: Callable[[TableColumn], object] | None
) -> bool:
    """Another type, or a type modifier that changes the column's Spark type (numeric(10,2) to
    numeric(12,2)); varchar(10) to varchar(20) stays a string and is compatible."""
    if known.type_oid != column.type_oid:
        return True
    if known.typmod == column.type_modifier or target_type is None:
        return False
    return target_type(known) != target_type(replace(known, typmod=column.type_modifier))


def plan_columns(
    base: Sequence[TableColumn],
    relations: Sequence[tuple[int, Relation]],
    snapshot_lsn: int | None = None,
    target_type: Callable[[TableColumn], object] | None = None,
    aliases: Mapping[str, str] | None = None,
    adds_from: int | None = None,
    widened_from: Mapping[str, Collection[tuple[int, int]]] | None = None,
    positional: tuple[Sequence[str], Sequence[Collection[str]], bool] | None = None,
) -> tuple[list[TableColumn], list[Layout]]:
    """The table's final columns and each ``(lsn, Relation)``'s layout, in stream order.

    A Relation whose columns are a superset of the known ones (same names and types, new ones
    anywhere) adds its new columns at the end; one missing a known column, or giving a known
    column another type, is incompatible. ``base`` is the table as its snapshot landed, so a
    Relation from before the snapshot may lack columns added since (NULL there), or have
    columns the snapshot has not, or has with another type (dropped, retyped, hashed or no
    longer published by then): those are left out (position ``DISCARDED``). Rewinds retract
    such a Relation's changes anyway. ``aliases``: the names a Relation may give a column the
    source renamed since (its name now) or dropped ("": never the table's again, left out of
    the Relations that still have it), from ``silver.catalog.followed_columns``. Only a
    Relation at or after ``adds_from`` (the first LSN whose changes this run reads) adds
    columns: an older one was planned by the run that read it, and a name of it the table no
    longer has (a column renamed twice since) is left out rather than added again.
    ``widened_from``: a column's earlier ``(type OID, typmod)``, before the source widened it
    (followed: ``silver.catalog.followed_columns``); a Relation with one of them is
    compatible, and its text casts to the column's type now. ``positional``: the column names
    now in attnum order, and the name sets a Relation may have, for a table whose columns were
    renamed with no column added or dropped since its snapshot (swaps included): a Relation
    after the snapshot lists those columns in that order, so its columns are named by
    position, and one with other names or another count is incompatible (with ``strict``,
    under ``on_schema_change = "error"``: one naming them in another order too).
    """
    aliases = aliases or {}
    widened_from = widened_from or {}
    columns = list(base)
    index = {c.name: i for i, c in enumerate(columns)}
    layouts = []
    for lsn, rel in relations:
        if positional is not None and (snapshot_lsn is None or lsn > snapshot_lsn):
            order, accepted, strict = positional
            listed = [c.name for c in rel.columns]
            fits = len(listed) == len(order) and any(set(listed) == set(a) for a in accepted)
            if not fits or (strict and listed != list(order)):
                layouts.append(
                    Layout(
                        None,
                        "column(s) renamed in a way no catalog record shows: " + ", ".join(listed),
                    )
                )
                continue
            rel = replace(
                rel,
                columns=tuple(replace(c, name=n) for c, n in zip(rel.columns, order, strict=True)),
            )
        elif aliases:
            rel = replace(
                rel,
                columns=tuple(
                    replace(c, name=aliases[c.name]) if c.name in aliases else c
                    for c in rel.columns
                ),
            )
        names = [c.name for c in rel.columns]
        adds = adds_from is None or lsn >= adds_from
        before_snapshot = snapshot_lsn is not None and lsn <= snapshot_lsn
        missing = [] if before_snapshot else [c.name for c in columns if c.name not in names]
        retyped = [
            c.name
            for c in rel.columns
            if c.name in index
            and (c.type_oid, c.type_modifier) not in widened_from.get(c.name, ())
            and _retyped(columns[index[c.name]], c, target_type)
        ]
        if before_snapshot and retyped:
            # the snapshot holds such a column with its type of then; these changes are
            # rewound anyway, so their old-typed values are left out like a dropped column's
            layouts.append(
                Layout(
                    tuple(
                        DISCARDED if c.name in retyped else index.get(c.name, DISCARDED)
                        for c in rel.columns
                    ),
                    keys=tuple(index[c.name] for c in rel.columns if c.is_key and c.name in index),
                )
            )
            continue
        if missing or retyped:
            parts = []
            if missing:
                parts.append("column(s) dropped or renamed: " + ", ".join(missing))
            if retyped:
                parts.append("column(s) changed type: " + ", ".join(retyped))
            layouts.append(Layout(None, "; ".join(parts)))
            continue
        for c in rel.columns:
            if c.name not in index and not before_snapshot and c.name != "" and adds:
                index[c.name] = len(columns)
                columns.append(TableColumn(c.name, c.type_oid, c.type_modifier))
        layouts.append(
            Layout(
                tuple(index.get(c.name, DISCARDED) for c in rel.columns),
                keys=tuple(index[c.name] for c in rel.columns if c.is_key and c.name in index),
            )
        )
    return columns, layouts


def with_fill(layouts: Sequence[Layout], fill: Sequence[str | None]) -> list[Layout]:
    """``layouts`` reading ``fill[i]`` (text) in table column ``i`` where a Relation lacks it.

    A column added with a value for the rows already there (``ADD COLUMN c ... DEFAULT 1``:
    PostgreSQL stores it once, ``attmissingval``, and writes no row) holds that value in every
    row written before it existed, so a change read against a Relation from before the column
    (an insert, an update's old or new row) carries it, as its retraction later does."""
    if not any(v is not None for v in fill):
        return list(layouts)
    return [
        layout if layout.positions is None else replace(layout, fill=tuple(fill))
        for layout in layouts
    ]


class LayoutIndex:
    """The layout in effect for a table at a stream position ``(lsn, ordinal)``."""

    def __init__(self, entries: Sequence[tuple[tuple[int, int], Layout]]) -> None:
        ordered = sorted(entries, key=lambda e: e[0])
        self._keys = [k for k, _ in ordered]
        self._layouts = [v for _, v in ordered]

    def at(self, lsn: int, ordinal: int) -> Layout | None:
        i = bisect.bisect_right(self._keys, (lsn, ordinal)) - 1
        return self._layouts[i] if i >= 0 else None


def _text(value) -> str | None:
    if value is None:
        return None
    if isinstance(value, BinaryValue):
        raise InvalidValue("binary-format value in a text-format stream")
    return value.decode("utf-8")


def _row(values, layout: Layout, width: int, old: list | None) -> tuple[list, tuple[int, ...]]:
    """The tuple in table column order, and the positions of its unchanged-TOAST values that
    ``old`` could not fill (NULL in the row)."""
    row: list[str | None] = list(layout.fill) if layout.fill else [None] * width
    if len(values) != len(layout.positions):
        raise SchemaIncompatible(
            f"tuple has {len(values)} columns, its Relation {len(layout.positions)}",
        )
    unfilled = []
    for value, pos in zip(values, layout.positions, strict=True):
        if pos == DISCARDED:
            continue
        if value is UNCHANGED_TOAST:
            if old is None or old[pos] is UNCHANGED_TOAST:
                unfilled.append(pos)
            else:
                row[pos] = old[pos]
        else:
            row[pos] = _text(value)
    return row, tuple(unfilled)


def _old_row(values, layout: Layout, width: int) -> list:
    row: list = list(layout.fill) if layout.fill else [None] * width
    if len(values) != len(layout.positions):
        raise SchemaIncompatible(
            f"old tuple has {len(values)} columns, its Relation {len(layout.positions)}",
        )
    for value, pos in zip(values, layout.positions, strict=True):
        if pos != DISCARDED:
            row[pos] = value if value is UNCHANGED_TOAST else _text(value)
    return row


def _key_row(source: list, keys: tuple[int, ...], width: int, what: str) -> list[str | None]:
    row: list[str | None] = [None] * width
    for pos in keys:
        if source[pos] is None or source[pos] is UNCHANGED_TOAST:
            raise MissingToast(f"{what} has no value in a key column")
        row[pos] = source[pos]
    return row


def change_diffs(
    message: Insert | Update | Delete, layout: Layout | None, width: int
) -> list[Diff]:
    """The diff rows of one change, values in table column order (``width`` long)."""
    if layout is None:
        raise SchemaIncompatible("change without a Relation message before it")
    if layout.positions is None:
        raise SchemaIncompatible(layout.problem or "incompatible Relation")
    if isinstance(message, Insert):
        new, unfilled = _row(message.new, layout, width, None)
        if unfilled:
            raise MissingToast("inserted row has an unchanged TOAST value")
        return [Diff(1, new)]
    full = message.old is not None and message.old_kind == OLD_TUPLE_FULL
    if not full and not layout.keys:
        verb = "delete" if isinstance(message, Delete) else "update"
        raise DefaultReplicaIdentity(
            f"{verb} of a table without a replica identity key: it needs a primary key, "
            "REPLICA IDENTITY USING INDEX, or REPLICA IDENTITY FULL",
        )
    old = _old_row(message.old, layout, width) if message.old is not None else None
    if full and any(v is UNCHANGED_TOAST for v in old):
        what = "deleted row" if isinstance(message, Delete) else "old row of an update"
        raise MissingToast(f"{what} has an unchanged TOAST value")
    if isinstance(message, Delete):
        if full:
            return [Diff(-1, old)]
        return [Diff(-1, _key_row(old, layout.keys, width, "deleted key"), RETRACT, layout.keys)]
    new, unfilled = _row(message.new, layout, width, old if full else None)
    if full:
        return [Diff(-1, old), Diff(1, new)]
    key = _key_row(old if old is not None else new, layout.keys, width, "updated key")
    return [
        Diff(-1, key, RETRACT, layout.keys),
        Diff(1, new, FILL, unfilled),
    ]
