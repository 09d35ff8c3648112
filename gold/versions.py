"""History at the source's transaction boundaries: the rule that turns diffs into versions.

A table's history (``<gold table>__history``, SCD type 2) holds one row per *version*: a row
value together with the commit LSN of the transaction that made it (``__start_lsn``) and of
the one that ended it (``__end_lsn``, NULL while it is current), and those transactions'
commit times (``__start_at``, ``__end_at``). The table as of LSN ``L`` is its versions with
``__start_lsn <= L < __end_lsn`` (or no end)::

    silver diffs (row, lsn, diff) ─┐
                                   ├─ versions ──> the rows that replace the open versions
    the open versions (end NULL) ──┘                (closed ones, continuing ones, new ones)

Diffs are paired with versions by row value, in LSN order: per distinct row value (Spark's
equality, ``core.multiset``) and LSN the diffs are summed (so several changes of a row in one
transaction make one version, and an update that changes nothing makes none); a positive sum
``+d`` opens ``d`` versions at that LSN, a negative one closes the ``d`` oldest open versions
of that value. A key change is the old value's ``-1`` and the new value's ``+1`` at one LSN:
the old version ends where the new one starts. A table without a key keeps its copies, each a
version of its own; a TRUNCATE's diffs end every version.

The rule is correct on any set of rows holding all the diffs and open versions of each row
value it sees, so it runs whole in the driver and a bucket of keys at a time on Spark's
executors (``core.by_key.cogrouped``), and is written once (:func:`versions`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pgmedallion.core.multiset import group_ids

START, END, START_AT, END_AT = "__start_lsn", "__end_lsn", "__start_at", "__end_at"
VERSION_COLUMNS = (START, END, START_AT, END_AT)
LSN, DIFF = "_lsn", "_diff"
TIME = pa.timestamp("us", tz="UTC")


@dataclass(frozen=True)
class Times:
    """The source's commits known to silver (``_commits``): commit LSNs, ascending, and their
    commit times (Unix microseconds, UTC)."""

    lsns: np.ndarray
    micros: np.ndarray

    @staticmethod
    def of(lsns: Sequence[int], micros: Sequence[int | None]) -> Times:
        pairs = sorted(
            {(int(lsn), m) for lsn, m in zip(lsns, micros, strict=True) if m is not None}
        )
        return Times(
            np.array([p[0] for p in pairs], np.int64), np.array([p[1] for p in pairs], np.int64)
        )

    def at(self, lsns: np.ndarray, known: np.ndarray) -> pa.Array:
        """The time of the state at each LSN (where ``known``): that of the newest commit at
        or below it, since the database changes only at commits (a snapshot's LSN, which is no
        commit, takes the time of the last commit before it); NULL where none is known."""
        if len(self.lsns) == 0:
            return pa.nulls(len(lsns), TIME)
        at = np.searchsorted(self.lsns, lsns, side="right") - 1
        valid = known & (at >= 0)
        micros = np.where(valid, self.micros[np.clip(at, 0, None)], 0)
        return pa.array(micros, pa.int64(), mask=~valid).cast(TIME)


def versions(
    open_rows: pa.Table,
    diffs: pa.Table,
    columns: Sequence[str],
    times: Times,
    *,
    floor: int = 0,
    restart_at: int | None = None,
) -> pa.Table:
    """The rows that replace ``open_rows`` (a history's open versions: its columns, among them
    ``columns``, ``__start_lsn`` and ``__start_at``) once ``diffs`` (``columns``, ``_lsn``,
    ``_diff``) are applied: every open version (closed, with its end, or continuing) and every
    version the diffs start. In the history's columns (``open_rows``' schema): a column the
    diffs lack (one the source dropped) is NULL in the versions they start.

    ``floor``: a diff below it counts at it (a snapshot's rows, its rewinds and the changes it
    already holds, at the snapshot's LSN). ``restart_at``: the diffs are a whole new state
    from that LSN on (a table snapshotted again): every open version is retracted there, so
    a row the new state still holds continues, and the others end there.
    """
    columns = list(columns)
    names = open_rows.column_names
    data = [n for n in names if n not in VERSION_COLUMNS]
    n_open, n_diff = open_rows.num_rows, diffs.num_rows
    opened = open_rows.select(data)
    opened = opened.cast(pa.schema([f.with_nullable(True) for f in opened.schema]))
    started = aligned(diffs, opened.schema)
    rows = pa.concat_tables([opened, started]) if n_diff else opened
    ids = group_ids([rows.column(c) for c in columns], rows.num_rows)

    # the events: (value id, lsn, diff, the row that shows the value)
    lsn = np.maximum(_ints(diffs, LSN), floor) if n_diff else np.zeros(0, np.int64)
    ev_id = ids[n_open:]
    ev_lsn = lsn
    ev_diff = _ints(diffs, DIFF) if n_diff else np.zeros(0, np.int64)
    ev_row = np.arange(n_open, n_open + n_diff, dtype=np.int64)
    if restart_at is not None and n_open:
        ev_id = np.concatenate([ids[:n_open], ev_id])
        retracted = np.full(n_open, restart_at, np.int64)
        ev_lsn = np.concatenate([retracted, np.maximum(ev_lsn, restart_at)])
        ev_diff = np.concatenate([np.full(n_open, -1, np.int64), ev_diff])
        ev_row = np.concatenate([np.arange(n_open, dtype=np.int64), ev_row])
    # consolidated per (value, lsn), in LSN order within each value
    order = np.lexsort((ev_lsn, ev_id))
    ev_id, ev_lsn, ev_diff, ev_row = ev_id[order], ev_lsn[order], ev_diff[order], ev_row[order]
    if len(ev_id):
        new = np.ones(len(ev_id), bool)
        new[1:] = (ev_id[1:] != ev_id[:-1]) | (ev_lsn[1:] != ev_lsn[:-1])
        starts = np.flatnonzero(new)
        ev_diff = np.add.reduceat(ev_diff, starts)
        ev_id, ev_lsn = ev_id[starts], ev_lsn[starts]
        ev_row = _diff_row(ev_row[starts], ev_row, starts, n_open)
        keep = ev_diff != 0
        ev_id, ev_lsn, ev_diff, ev_row = ev_id[keep], ev_lsn[keep], ev_diff[keep], ev_row[keep]

    open_start = _ints(open_rows, START) if n_open else np.zeros(0, np.int64)
    out_row, out_start, out_end = _paired(ids[:n_open], open_start, ev_id, ev_lsn, ev_diff, ev_row)

    out = rows.take(pa.array(out_row, pa.int64()))
    carried = out_row < n_open  # an open version's own start time goes on
    start_at = times.at(out_start, ~carried)
    if n_open:
        own = open_rows.column(START_AT).combine_chunks().cast(TIME)
        own = own.take(pa.array(np.where(carried, out_row, 0), pa.int64()))
        start_at = pc.if_else(pa.array(carried), own, start_at)
    ended = out_end >= 0
    return (
        out.append_column(START, pa.array(out_start, pa.int64()))
        .append_column(END, pa.array(out_end, pa.int64(), mask=~ended))
        .append_column(START_AT, start_at)
        .append_column(END_AT, times.at(out_end, ended))
        .select(names)
    )


def _ints(table: pa.Table, name: str) -> np.ndarray:
    return pc.fill_null(table.column(name), 0).to_numpy(zero_copy_only=False).astype(np.int64)


def aligned(diffs: pa.Table, schema: pa.Schema) -> pa.Table:
    """``diffs``' rows in the columns of ``schema`` (NULL where they have no such column)."""
    out = []
    for f in schema:
        if f.name in diffs.column_names:
            out.append(diffs.column(f.name).cast(f.type))
        else:
            out.append(pa.nulls(diffs.num_rows, f.type))
    return pa.table(out, schema=pa.schema([f.with_nullable(True) for f in schema]))


def _diff_row(first: np.ndarray, rows: np.ndarray, starts: np.ndarray, n_open: int) -> np.ndarray:
    """Per consolidated event, a row showing its value: a diff's where the event has one (a
    version it starts takes the columns of now), else the open version's (a retraction)."""
    is_diff = rows >= n_open
    # the largest row index in each run: a diff's when the run has one
    best = np.maximum.reduceat(np.where(is_diff, rows, -1), starts)
    return np.where(best >= 0, best, first)


def _paired(
    open_id: np.ndarray,
    open_start: np.ndarray,
    ev_id: np.ndarray,
    ev_lsn: np.ndarray,
    ev_diff: np.ndarray,
    ev_row: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(row, start, end)`` of every version after the events (end -1: open): open versions
    first in their order, then the new ones. Closing takes a value's oldest open versions."""
    n_open = len(open_id)
    end = np.full(n_open, -1, np.int64)
    rows: list[np.ndarray] = [np.arange(n_open, dtype=np.int64)]
    starts: list[np.ndarray] = [open_start]
    ends: list[np.ndarray] = [end]
    if not len(ev_id):
        return rows[0], open_start.copy(), end
    # values with one event and no open version that it opens once: the common case (an
    # insert; an update's new value), done at once; and one open version closed by one -1
    ev_first = np.ones(len(ev_id), bool)
    ev_first[1:] = ev_id[1:] != ev_id[:-1]
    single = ev_first.copy()
    single[:-1] &= ev_first[1:]
    open_count = np.bincount(open_id, minlength=int(max(ev_id.max(), open_id.max(initial=-1))) + 1)
    opens = single & (ev_diff == 1) & (open_count[ev_id] == 0)
    closes = single & (ev_diff == -1) & (open_count[ev_id] == 1)
    rows.append(ev_row[opens])
    starts.append(ev_lsn[opens])
    ends.append(np.full(int(opens.sum()), -1, np.int64))
    if closes.any():
        where = np.full(len(open_count), -1, np.int64)
        where[open_id] = np.arange(n_open)
        end[where[ev_id[closes]]] = ev_lsn[closes]
    rest = ~(opens | closes)
    if rest.any():
        by_value: dict[int, list[int]] = {}
        order = np.lexsort((open_start, open_id))
        for i in order:
            by_value.setdefault(int(open_id[i]), []).append(int(i))
        new_rows, new_starts, new_ends = [], [], []
        live: dict[int, list] = {}
        for i in np.flatnonzero(rest):
            value, lsn, d = int(ev_id[i]), int(ev_lsn[i]), int(ev_diff[i])
            queue = live.get(value)
            if queue is None:  # the value's open versions, oldest first: ("open", i) or new
                queue = live[value] = [("open", j) for j in by_value.get(value, [])]
            if d > 0:
                for _ in range(d):
                    new_rows.append(int(ev_row[i]))
                    new_starts.append(lsn)
                    new_ends.append(-1)
                    queue.append(("new", len(new_rows) - 1))
            else:
                for _ in range(min(-d, len(queue))):  # more than there are: gold's rule
                    kind, j = queue.pop(0)  # (multiplicity_not_negative) reports it
                    if kind == "open":
                        end[j] = lsn
                    else:
                        new_ends[j] = lsn
        rows.append(np.array(new_rows, np.int64))
        starts.append(np.array(new_starts, np.int64))
        ends.append(np.array(new_ends, np.int64))
    return np.concatenate(rows), np.concatenate(starts), np.concatenate(ends)
