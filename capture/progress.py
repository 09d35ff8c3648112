"""Snapshot progress: rows copied so far of rows estimated, per table, while the COPYs run.

The COPYs run inside Spark tasks, and a task cannot report anything to the driver until it
ends. PostgreSQL can: every backend running a COPY has a row in ``pg_stat_progress_copy``
(PostgreSQL >= 14) with its ``tuples_processed``. Its ``relid`` is 0 for ``COPY (SELECT ...)``,
so each task names its session instead: ``application_name = "pgm-copy <tag> <oid> <part>"``
(:func:`copy_application_name`), and the driver polls the view joined with
``pg_stat_activity`` on its own connection, from a thread (:class:`CopyProgressMonitor`).

A range's row vanishes from the view when its COPY ends, so the monitor keeps the highest
count it saw per range: a finished range may show slightly fewer rows than it copied until the
snapshot commits, when the caller reports the rows actually landed. Below PostgreSQL 14 there
is no view, and only the table list (with estimates) is shown.

Estimates come from the catalog: ``reltuples / relpages`` times the table's current block
count where the table has been analyzed, otherwise the block count times the rows a block can
hold given the columns' widths (:func:`estimate_rows`)::

    Spark tasks: COPY ... (application_name pgm-copy tag oid part)
         │
    pg_stat_progress_copy ⋈ pg_stat_activity ──poll──> {(oid, part): max tuples}
                                                           └─> [TableProgress] ─> callback
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from pgmedallion.capture.connection import connect
from pgmedallion.capture.errors import PipelineError, server_errors

log = logging.getLogger(__name__)

COPY_PROGRESS_MIN_VERSION = 140000
APPLICATION_PREFIX = "pgm-copy"
POLL_INTERVAL_S = 0.5

PAGE_HEADER_BYTES = 24
LINE_POINTER_BYTES = 4
TUPLE_HEADER_BYTES = 24
MAXALIGN = 8
VARLENA_WIDTH_GUESS = 32


@dataclass(frozen=True)
class TableProgress:
    table: str
    """``schema.name``."""
    rows_staged: int | None
    """Rows copied so far (None where the server cannot tell, below PostgreSQL 14)."""
    rows_estimated: int | None
    done: bool = False
    """True once the snapshot is committed: ``rows_staged`` is then the rows landed."""
    ranges: tuple[int, int] | None = None
    """A snapshot read in key ranges (``capture.ranges``): ranges landed (earlier attempts
    included), of how many."""


ProgressCallback = Callable[[Sequence[TableProgress]], None]


@dataclass(frozen=True)
class TableSize:
    oid: int
    reltuples: float
    relpages: int
    blocks: int
    row_width: int
    block_size: int = 8192


def copy_application_name(tag: str, oid: int, part: int) -> str:
    """The ``application_name`` of a snapshot COPY session (under 64 bytes)."""
    return f"{APPLICATION_PREFIX} {tag[:16]} {int(oid)} {int(part)}"


def parse_copy_application_name(name: str, tag: str) -> tuple[int, int] | None:
    """``(oid, part)`` of one of this snapshot's COPY sessions, or None for anything else."""
    fields = name.split(" ")
    if len(fields) != 4 or fields[0] != APPLICATION_PREFIX or fields[1] != tag[:16]:
        return None
    try:
        return int(fields[2]), int(fields[3])
    except ValueError:
        return None


def estimate_rows(size: TableSize) -> int:
    """Rows in a table of ``size.blocks`` blocks, from its statistics or its row width."""
    if size.blocks <= 0:
        return 0
    if size.reltuples > 0 and size.relpages > 0:
        return round(size.reltuples / size.relpages * size.blocks)
    tuple_bytes = -(-(TUPLE_HEADER_BYTES + max(size.row_width, 1)) // MAXALIGN) * MAXALIGN
    per_block = max(1, (size.block_size - PAGE_HEADER_BYTES) // (tuple_bytes + LINE_POINTER_BYTES))
    return size.blocks * per_block


def table_sizes(conn: psycopg.Connection, oids: Iterable[int]) -> dict[int, TableSize]:
    """Catalog statistics and a row-width guess for each table (unknown oids are left out)."""
    oids = [int(oid) for oid in oids]
    if not oids:
        return {}
    query = sql.SQL(
        "SELECT c.oid::int8, c.reltuples::float8, c.relpages::int8,"
        " pg_relation_size(c.oid) / current_setting('block_size')::int8,"
        " coalesce(sum(CASE WHEN t.typlen > 0 THEN t.typlen ELSE {varlena} END), 0)::int8,"
        " current_setting('block_size')::int8"
        " FROM pg_class c"
        " LEFT JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped"
        " LEFT JOIN pg_type t ON t.oid = a.atttypid"
        " WHERE c.oid IN ({oids}) GROUP BY c.oid"
    ).format(
        varlena=sql.Literal(VARLENA_WIDTH_GUESS),
        oids=sql.SQL(", ").join(sql.Literal(oid) for oid in oids),
    )
    with server_errors():
        rows = conn.execute(query).fetchall()
    return {row[0]: TableSize(*row) for row in rows}


def table_progress(
    names: Mapping[int, str],
    estimates: Mapping[int, int],
    seen: Mapping[tuple[int, int], int] | None,
    landed: Mapping[int, int] | None = None,
    ranges: Mapping[int, tuple[int, int]] | None = None,
) -> list[TableProgress]:
    """Per-table progress from the highest count seen per ``(oid, part)``; None: not known.
    ``landed``: rows earlier attempts landed (a snapshot that resumes, ``capture.ranges``);
    ``ranges``: ranges landed and in all, per table read in key ranges."""
    landed, ranges = landed or {}, ranges or {}
    staged: dict[int, int] = {oid: landed.get(oid, 0) for oid in names}
    for (oid, _part), rows in (seen or {}).items():
        if oid in staged:
            staged[oid] += rows
    return [
        TableProgress(
            names[oid],
            None if seen is None and not landed.get(oid) else staged[oid],
            estimates.get(oid),
            ranges=ranges.get(oid),
        )
        for oid in names
    ]


class CopyProgressMonitor:
    """Poll this snapshot's COPY sessions from a thread and report per-table progress.

    Use as a context manager around the Spark job. The callback runs in the polling thread;
    a failing poll (the monitor's own connection lost) is logged once and polling stops: the
    snapshot itself does not depend on it.
    """

    def __init__(
        self,
        conninfo: Mapping[str, Any],
        tag: str,
        names: Mapping[int, str],
        estimates: Mapping[int, int],
        callback: ProgressCallback,
        *,
        server_version: int,
        interval_s: float = POLL_INTERVAL_S,
    ) -> None:
        self.conninfo = conninfo
        self.tag = tag
        self.names = dict(names)
        self.estimates = dict(estimates)
        self.callback = callback
        self.interval_s = interval_s
        self.supported = server_version >= COPY_PROGRESS_MIN_VERSION
        self.seen: dict[tuple[int, int], int] = {}
        self.landed: dict[int, int] = {}
        """Rows of each table that earlier attempts landed (a snapshot that resumes)."""
        self.ranges: dict[int, tuple[int, int]] = {}
        """Ranges landed and in all, of each table read in key ranges (updated as they land)."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> CopyProgressMonitor:
        self.report()
        if self.supported:
            self._thread = threading.Thread(target=self._run, name="copy-progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def report(self) -> None:
        self.callback(
            table_progress(
                self.names,
                self.estimates,
                self.seen if self.supported else None,
                self.landed,
                self.ranges,
            )
        )

    def poll(self, conn: psycopg.Connection) -> None:
        with server_errors():
            rows = conn.execute(
                "SELECT a.application_name, p.tuples_processed::int8"
                " FROM pg_stat_progress_copy p JOIN pg_stat_activity a ON a.pid = p.pid"
                f" WHERE a.application_name LIKE '{APPLICATION_PREFIX} %'"
            ).fetchall()
        for name, tuples in rows:
            key = parse_copy_application_name(name, self.tag)
            if key is not None and tuples > self.seen.get(key, -1):
                self.seen[key] = tuples

    def _run(self) -> None:
        try:
            conn = connect(self.conninfo)
        except PipelineError as exc:
            log.warning("snapshot progress unavailable: %s", exc)
            return
        try:
            while not self._stop.wait(self.interval_s):
                self.poll(conn)
                self.report()
        except PipelineError as exc:
            log.warning("snapshot progress stopped: %s", exc)
        finally:
            conn.close()


class RichSnapshotProgress:
    """A :data:`ProgressCallback` drawing one ``rich`` progress bar per table (on stderr).

    The bars appear with the first report and stay after the snapshot; without an estimate
    (or below PostgreSQL 14, without a count) a table's bar shows what is known.
    """

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
        )

        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            TextColumn("{task.fields[note]}"),
            console=Console(stderr=True),
        )
        self._tasks: dict[str, Any] = {}
        self._lock = threading.Lock()

    def __call__(self, updates: Sequence[TableProgress]) -> None:
        with self._lock:
            if not self._tasks:
                self._progress.start()
            for update in updates:
                total = update.rows_estimated
                staged = update.rows_staged
                if update.done and staged is not None:
                    total = staged
                elif total is not None and staged is not None:
                    total = max(total, staged)
                note = "landed" if update.done else ("" if staged is not None else "copying")
                if update.ranges is not None:
                    note = f"{note} ranges {update.ranges[0]}/{update.ranges[1]}".strip()
                task = self._tasks.get(update.table)
                if task is None:
                    task = self._tasks[update.table] = self._progress.add_task(
                        update.table, total=total, note=note
                    )
                self._progress.update(task, completed=staged or 0, total=total, note=note)

    def close(self) -> None:
        with self._lock:
            if self._tasks:
                self._progress.stop()
