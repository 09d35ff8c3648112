"""Decoding: bronze's records of a run -> diff rows (``DIFF_ARROW``), before the cast.

Changes (pgoutput Insert/Update/Delete) are decoded by Python workers over Arrow batches
(:func:`decode_changes`, with :mod:`silver.changes`); COPY records too (:func:`decode_copy`,
with :mod:`silver.copy_arrow` and, for rare lines, :mod:`capture.copy_text`).
:func:`wal_window` picks the window's complete transactions.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pgmedallion.bronze.table import copy_lines
from pgmedallion.capture.copy_text import CopyDecodeError, decode_copy_row
from pgmedallion.capture.copy_text import InvalidCopyInput as CopyInputError
from pgmedallion.capture.pgoutput import (
    MSG_COMMIT,
    MSG_DELETE,
    MSG_INSERT,
    MSG_UPDATE,
    decode,
)
from pgmedallion.core import delta_rs, sparkapi
from pgmedallion.core.by_key import by_key
from pgmedallion.core.sparkapi import F
from pgmedallion.silver.changes import LayoutIndex, change_diffs
from pgmedallion.silver.contract import CHANGE_ARROW, DIFF_ARROW
from pgmedallion.silver.copy_arrow import as_lists, copy_columns
from pgmedallion.silver.errors import InvalidCopyInput, SilverError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


def message_type(message: bytes) -> str:
    """How the ``mtype`` column writes a pgoutput message type: its byte in upper-case hex."""
    return message.hex().upper()


READ = pa.schema([pa.field("lsn", pa.int64()), pa.field("run_id", pa.string())])


def chosen_reads(commits: pa.Table) -> pa.Table:
    """The read-once rule: of a window's Commit messages (``lsn, run_id``), the capture read
    (``run_id``) whose messages of each commit LSN silver takes: the least of the reads that
    reached that Commit. Any complete read holds the same messages; the least makes the choice
    the same in every run. A transaction no read took to its Commit is not chosen. Correct on
    any set of rows holding all the Commit rows of each LSN it sees (``core.by_key``)."""
    picked = commits.group_by("lsn").aggregate([("run_id", "min")])
    return pa.table(
        [picked.column("lsn").cast(pa.int64()), picked.column("run_id_min")], schema=READ
    )


def wal_window(bronze: DataFrame, f_from: int, f_to: int, b_to: int) -> DataFrame:
    """The window's wal rows of the reads :func:`chosen_reads` picks, with ``mtype`` (the
    message type, see :func:`message_type`) and ``relid``."""
    wal = bronze.where(
        (F.col("kind") == "wal")
        & (F.col("lsn") >= f_from)
        & (F.col("lsn") < f_to)
        & (F.col("batch_id") <= b_to)
    ).withColumn("mtype", F.hex(F.substring("payload", 1, 1)))
    commits = wal.where(F.col("mtype") == message_type(MSG_COMMIT)).select("lsn", "run_id")
    chosen = by_key(commits, ["lsn"], chosen_reads, "lsn long, run_id string")
    return wal.join(chosen, ["lsn", "run_id"]).withColumn(
        "relid", F.conv(F.hex(F.substring("payload", 2, 4)), 16, 10).cast("bigint")
    )


def decode_changes(
    batches: Iterator[pa.RecordBatch], layouts: dict[int, tuple[LayoutIndex, int]]
) -> Iterator[pa.RecordBatch]:
    """Worker body: Insert/Update/Delete messages -> diff rows (or error rows)."""
    for batch in batches:
        out = {name: [] for name in CHANGE_ARROW.names}

        def emit(
            oid, lsn, ordinal, diff, values, code=None, message=None, kind=0, columns=(), out=out
        ):
            out["table_oid"].append(oid)
            out["lsn"].append(lsn)
            out["ordinal"].append(ordinal)
            out["diff"].append(diff)
            out["values"].append(values)
            out["code"].append(code)
            out["message"].append(message)
            out["raw"].append(None)
            out["kind"].append(kind)
            out["columns"].append(list(columns))

        cols = batch.to_pydict()
        for lsn, ordinal, payload in zip(
            cols["lsn"], cols["ordinal"], cols["payload"], strict=False
        ):
            message = decode(payload)
            relid = message.relid
            entry = layouts.get(relid)
            if entry is None:
                continue  # a table silver does not follow
            index, width = entry
            try:
                for d in change_diffs(message, index.at(lsn, ordinal), width):
                    emit(relid, lsn, ordinal, d.diff, d.values, kind=d.kind, columns=d.columns)
            except SilverError as e:
                emit(relid, lsn, ordinal, 0, None, e.code, str(e))
        yield pa.RecordBatch.from_pydict(out, schema=CHANGE_ARROW)


def decode_copy(
    batches: Iterator[pa.RecordBatch], widths: dict[int, tuple[int, int]]
) -> Iterator[pa.RecordBatch]:
    """Worker body: COPY TEXT records (``table_oid, lsn, payload``) -> ``(values, +1)`` at LSN
    0, or error rows (:func:`copy_parts`, each part's values as ``list<string>``)."""
    for batch in batches:
        for part, texts in copy_parts(batch, widths):
            if texts is not None:
                part = part.set_column(
                    part.schema.get_field_index("values"), "values", as_lists(texts)
                )
            yield part


def copy_parts(
    batch: pa.RecordBatch, widths: dict[int, tuple[int, int]]
) -> Iterator[tuple[pa.RecordBatch, list[pa.Array] | None]]:
    """A batch of COPY TEXT records (``table_oid, lsn, payload``; a payload is a chunk of rows
    or one row, each ended by a newline) -> per table of ``widths``, its diff rows
    (``DIFF_ARROW``) and the columns of their values (padded with NULL columns up to the
    silver table's width).

    Each table's payloads are decoded over Arrow (:func:`silver.copy_arrow.copy_columns`):
    every row ``(texts, +1)`` at LSN 0, its ``values`` left NULL for the caller to fill from
    the columns it returns. Where that leaves them (a payload not UTF-8, a line not valid COPY
    TEXT or of another number of fields), they are decoded line by line by the reference
    decoder, which names each line's error; the columns are then None."""
    oids = batch.column("table_oid")
    for oid in pc.unique(oids).to_pylist():
        if oid not in widths:
            continue
        own = batch.filter(pc.equal(oids, oid))
        copy_width, width = widths[oid]
        texts = copy_columns(own.column("payload"), copy_width) if copy_width else None
        if texts is None:
            yield _decode_lines(own, oid, copy_width, width), None
            continue
        n = len(texts[0])
        texts += [pa.nulls(n, pa.string())] * (width - copy_width)
        nulls = pa.nulls(n, pa.string())
        rows = pa.RecordBatch.from_arrays(
            [
                pa.array(np.full(n, oid, np.int64)),
                pa.array(np.zeros(n, np.int64)),
                pa.nulls(n, pa.int64()),
                pa.array(np.ones(n, np.int64)),
                pa.nulls(n, DIFF_ARROW.field("values").type),
                nulls,
                nulls,
                nulls,
            ],
            schema=DIFF_ARROW,
        )
        yield rows, texts


def _decode_lines(records: pa.RecordBatch, oid: int, copy_width: int, width: int) -> pa.RecordBatch:
    """One table's records decoded line by line by ``capture.copy_text.decode_copy_row``."""
    out = {name: [] for name in DIFF_ARROW.names}
    padding = [None] * (width - copy_width)
    lsns, payloads = records.column("lsn").to_pylist(), records.column("payload").to_pylist()
    for lsn, payload in zip(lsns, payloads, strict=True):
        for line in copy_lines(payload):
            try:
                values = decode_copy_row(line, copy_width)
            except CopyDecodeError as e:
                invalid = isinstance(e, CopyInputError)
                row = (lsn, 0, None, InvalidCopyInput.__name__ if invalid else type(e).__name__)
                row += (str(e), line.decode("utf-8", "replace"))
            else:
                row = (0, 1, values + padding, None, None, None)
            for name, value in zip(_LINE_COLUMNS, row, strict=True):
                out[name].append(value)
            out["table_oid"].append(oid)
            out["ordinal"].append(None)
    return pa.RecordBatch.from_pydict(out, schema=DIFF_ARROW)


_LINE_COLUMNS = ("lsn", "diff", "values", "code", "message", "raw")


def snapshot_diffs(copy_rows: DataFrame, copy_widths: dict[int, tuple[int, int]]) -> DataFrame:
    """``table_oid, lsn, payload`` copy records -> diff rows (``DIFF_ARROW``), at LSN 0, of
    the tables of ``copy_widths`` (OID -> columns of its COPY rows, columns of its silver
    rows), decoded in Spark's Python workers (:func:`decode_copy`)."""
    followed = copy_rows.where(F.col("table_oid").isin(list(copy_widths)))
    widths = dict(copy_widths)
    return followed.select("table_oid", "lsn", "payload").mapInArrow(
        lambda it: decode_copy(it, widths), delta_rs.spark_types(DIFF_ARROW)
    )


@dataclass
class TableDiffs:
    """One table's diff rows of a run, before the cast (see :func:`table_diffs`)."""

    wal: DataFrame
    """``DIFF_ARROW`` rows of the table's decoded changes (good ones only)."""
    copy: DataFrame
    """``DIFF_ARROW`` rows of its COPY records: good ones and decode errors (``code`` set)."""
    records: DataFrame | None = None
    """Its COPY records themselves (``table_oid, lsn, payload``), which :attr:`copy` decodes
    (None: not known here)."""
    widths: dict[int, tuple[int, int]] | None = None
    """:func:`decode_copy`'s widths for :attr:`records`."""

    @property
    def rows(self) -> DataFrame:
        return self.wal.unionByName(self.copy, allowMissingColumns=True)


def table_diffs(
    oid: int, wal_good: DataFrame, copy_rows: DataFrame, copy_width: tuple[int, int]
) -> TableDiffs:
    """Table ``oid``'s diff rows of a run: its decoded changes (from ``wal_good``, good rows
    only) and its COPY records (from ``copy_rows``: ``table_oid, lsn, payload``) decoded."""
    own = copy_rows.where(F.col("table_oid") == oid)
    widths = {oid: copy_width}
    return TableDiffs(
        wal_good.where(F.col("table_oid") == oid),
        snapshot_diffs(own, widths),
        own.select("table_oid", "lsn", "payload"),
        widths,
    )


CHANGE_TYPES = [message_type(m) for m in (MSG_INSERT, MSG_UPDATE, MSG_DELETE)]


def decoded_changes(wal: DataFrame, layouts: dict[int, tuple[LayoutIndex, int]]) -> DataFrame:
    """The window's Insert/Update/Delete messages decoded (``CHANGE_ARROW``), persisted."""
    changes = wal.where(F.col("mtype").isin(CHANGE_TYPES)).select("lsn", "ordinal", "payload")
    return changes.mapInArrow(
        lambda it: decode_changes(it, layouts), delta_rs.spark_types(CHANGE_ARROW)
    ).persist(sparkapi.StorageLevel.MEMORY_AND_DISK)
