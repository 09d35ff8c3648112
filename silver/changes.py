"""pgoutput changes to differential updates: pure functions, no Spark.

A change is read against the Relation message in effect for its table at that point of the
stream (the latest one before it, by ``(commit LSN, ordinal)``), and becomes rows of text
values in the *table's* column order, each with a signed multiplicity::

    INSERT  new               ->  (new, +1)
    DELETE  old ('O')         ->  (old, -1)
    UPDATE  old ('O'), new    ->  (old, -1), (new, +1)      'u' in new = the old value

Under REPLICA IDENTITY DEFAULT or INDEX the stream carries no old row for an update and only
the key for a delete, so the row to retract is unknown: that is the definite error
``DefaultReplicaIdentity`` for the table (use ``ALTER TABLE ... REPLICA IDENTITY FULL``). An
unchanged-TOAST marker with no old value to take it from is ``MissingToast``.

Column layouts. The table's columns are those of its schema record (the catalog at the
snapshot), extended by columns that later Relation messages add: rows from before an added
column carry NULL there. A Relation that drops, renames or retypes a known column (another type,
or a type modifier that changes its Spark type, such as numeric(10,2) to numeric(12,2)) makes the
layout incompatible (``SchemaIncompatible``): changes read against it produce no rows.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from pgmedallion.pgoutput import (
    UNCHANGED_TOAST,
    BinaryValue,
    Delete,
    Insert,
    Relation,
    Update,
)


@dataclass(frozen=True)
class TableColumn:
    name: str
    type_oid: int
    typmod: int


@dataclass(frozen=True)
class Layout:
    """How one Relation message's columns map onto the table's columns."""

    positions: tuple[int, ...] | None
    """For each Relation column, its index among the table's columns; None = incompatible."""
    problem: str | None = None


class ChangeError(ValueError):
    """A definite error of one change; ``code`` names it in the errors table."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


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
) -> tuple[list[TableColumn], list[Layout]]:
    """The table's final columns and each ``(lsn, Relation)``'s layout, in stream order.

    A Relation whose columns are a superset of the known ones (same names and types, new ones
    anywhere) adds its new columns at the end; one missing a known column, or giving a known
    column another type, is incompatible. ``base`` is the catalog at the snapshot, so a
    Relation from before the snapshot may lack columns added since: those are NULL there (and
    rewinds retract its changes anyway).
    """
    columns = list(base)
    index = {c.name: i for i, c in enumerate(columns)}
    layouts = []
    for lsn, rel in relations:
        names = [c.name for c in rel.columns]
        before_snapshot = snapshot_lsn is not None and lsn <= snapshot_lsn
        missing = [] if before_snapshot else [c.name for c in columns if c.name not in names]
        retyped = [
            c.name
            for c in rel.columns
            if c.name in index and _retyped(columns[index[c.name]], c, target_type)
        ]
        if missing or retyped:
            parts = []
            if missing:
                parts.append("column(s) dropped or renamed: " + ", ".join(missing))
            if retyped:
                parts.append("column(s) changed type: " + ", ".join(retyped))
            layouts.append(Layout(None, "; ".join(parts)))
            continue
        for c in rel.columns:
            if c.name not in index:
                index[c.name] = len(columns)
                columns.append(TableColumn(c.name, c.type_oid, c.type_modifier))
        layouts.append(Layout(tuple(index[c.name] for c in rel.columns)))
    return columns, layouts


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
        raise ChangeError("InvalidValue", "binary-format value in a text-format stream")
    return value.decode("utf-8")


def _row(values, layout: Layout, width: int, old: list | None) -> list[str | None]:
    row: list[str | None] = [None] * width
    if len(values) != len(layout.positions):
        raise ChangeError(
            "SchemaIncompatible",
            f"tuple has {len(values)} columns, its Relation {len(layout.positions)}",
        )
    for value, pos in zip(values, layout.positions, strict=True):
        if value is UNCHANGED_TOAST:
            if old is None or old[pos] is UNCHANGED_TOAST:
                raise ChangeError(
                    "MissingToast", "unchanged TOAST value without an old value to take it from"
                )
            row[pos] = old[pos]
        else:
            row[pos] = _text(value)
    return row


def _old_row(values, layout: Layout, width: int) -> list:
    row: list = [None] * width
    if len(values) != len(layout.positions):
        raise ChangeError(
            "SchemaIncompatible",
            f"old tuple has {len(values)} columns, its Relation {len(layout.positions)}",
        )
    for value, pos in zip(values, layout.positions, strict=True):
        row[pos] = value if value is UNCHANGED_TOAST else _text(value)
    return row


def change_diffs(
    message: Insert | Update | Delete, layout: Layout | None, width: int
) -> list[tuple[int, list[str | None]]]:
    """``[(diff, values)]`` of one change, values in table column order (``width`` long)."""
    if layout is None:
        raise ChangeError("SchemaIncompatible", "change without a Relation message before it")
    if layout.positions is None:
        raise ChangeError("SchemaIncompatible", layout.problem or "incompatible Relation")
    if isinstance(message, Insert):
        return [(1, _row(message.new, layout, width, None))]
    if isinstance(message, Delete):
        if message.old_kind != "O":
            raise ChangeError(
                "DefaultReplicaIdentity",
                "delete carries only the key: the table needs REPLICA IDENTITY FULL",
            )
        old = _old_row(message.old, layout, width)
        if any(v is UNCHANGED_TOAST for v in old):
            raise ChangeError("MissingToast", "deleted row has an unchanged TOAST value")
        return [(-1, old)]
    if message.old is None or message.old_kind != "O":
        raise ChangeError(
            "DefaultReplicaIdentity",
            "update without the old row: the table needs REPLICA IDENTITY FULL",
        )
    old = _old_row(message.old, layout, width)
    if any(v is UNCHANGED_TOAST for v in old):
        raise ChangeError("MissingToast", "old row of an update has an unchanged TOAST value")
    return [(-1, old), (1, _row(message.new, layout, width, old))]
