"""Decoding: bronze's records of a run -> diff rows (``DIFF_SCHEMA``), before the cast.

Changes (pgoutput Insert/Update/Delete) are decoded by Python workers over Arrow batches
(:func:`decode_changes`, with :mod:`silver.changes`); COPY records by Spark SQL expressions
(:mod:`silver.copy_sql`), the rare rows those leave to Python marked and decoded on demand
(:func:`decode_copy`, with :mod:`capture.copy_text`). :func:`wal_window` picks the window's
complete transactions.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pyarrow as pa
from pyspark import StorageLevel
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

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
from pgmedallion.silver.changes import LayoutIndex, change_diffs
from pgmedallion.silver.contract import CHANGE_ARROW, CHANGE_SCHEMA, DIFF_ARROW, DIFF_SCHEMA
from pgmedallion.silver.copy_sql import copy_diffs, python_diffs
from pgmedallion.silver.errors import InvalidCopyInput, SilverError


def message_type(message: bytes) -> str:
    """How the ``mtype`` column writes a pgoutput message type: its byte in upper-case hex."""
    return message.hex().upper()


def wal_window(bronze: DataFrame, f_from: int, f_to: int, b_to: int) -> DataFrame:
    """The window's wal rows, one capture read per commit LSN (one that reached its Commit),
    with ``mtype`` (the message type, see :func:`message_type`) and ``relid``."""
    wal = bronze.where(
        (F.col("kind") == "wal")
        & (F.col("lsn") >= f_from)
        & (F.col("lsn") < f_to)
        & (F.col("batch_id") <= b_to)
    ).withColumn("mtype", F.hex(F.substring("payload", 1, 1)))
    chosen = (
        wal.where(F.col("mtype") == message_type(MSG_COMMIT))
        .groupBy("lsn")
        .agg(F.min("run_id").alias("run_id"))
    )
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
    """Worker body: COPY TEXT payloads -> ``(values, +1)`` at LSN 0 (or error rows).

    A payload is a chunk of rows or one row, each ended by a newline (see ``copy_diffs``).
    """
    for batch in batches:
        cols = batch.to_pydict()
        out = {name: [] for name in DIFF_ARROW.names}
        values_out, diff_out, code_out = out["values"], out["diff"], out["code"]
        message_out, raw_out, lsn_out = out["message"], out["raw"], out["lsn"]
        oid_out = out["table_oid"]
        for oid, lsn, payload in zip(cols["table_oid"], cols["lsn"], cols["payload"], strict=False):
            copy_width, width = widths.get(oid, (None, None))
            if width is None:
                continue
            padding = [None] * (width - copy_width)
            for line in copy_lines(payload):
                oid_out.append(oid)
                try:
                    values = decode_copy_row(line, copy_width)
                except CopyDecodeError as e:
                    invalid = isinstance(e, CopyInputError)
                    values_out.append(None)
                    diff_out.append(0)
                    code_out.append(InvalidCopyInput.__name__ if invalid else type(e).__name__)
                    message_out.append(str(e))
                    raw_out.append(line.decode("utf-8", "replace"))
                    lsn_out.append(lsn)
                    continue
                if padding:
                    values += padding
                values_out.append(values)
                diff_out.append(1)
                code_out.append(None)
                message_out.append(None)
                raw_out.append(None)
                lsn_out.append(0)
        out["ordinal"] = [None] * len(diff_out)
        yield pa.RecordBatch.from_pydict(out, schema=DIFF_ARROW)


def snapshot_diffs(copy_rows: DataFrame, copy_widths: dict[int, tuple[int, int]]) -> DataFrame:
    """``table_oid, lsn, payload`` copy records -> diff rows (``DIFF_SCHEMA``), at LSN 0.

    ``copy_widths``: OID -> (columns of its COPY rows, columns of its silver rows). Decoding is
    Spark SQL; the records holding rows for the Python decoder give one marker row each
    (``code`` :data:`PYTHON_CODE`) instead (``silver/copy_sql.py``, :func:`python_copy`).
    """
    return copy_diffs(copy_rows, copy_widths, python_copy(copy_widths))


def python_copy(widths: dict[int, tuple[int, int]]):
    """The Python decoder of COPY records, as ``copy_diffs`` and ``python_diffs`` take it."""
    return lambda rows: rows.mapInArrow(lambda it: decode_copy(it, widths), DIFF_SCHEMA)


@dataclass
class TableDiffs:
    """One table's diff rows of a run, before the cast (see :func:`table_diffs`)."""

    wal: DataFrame
    """``DIFF_SCHEMA`` rows of the table's decoded changes (good ones only)."""
    copy: DataFrame
    """``DIFF_SCHEMA`` rows of its COPY records: good ones, decode errors (``code`` set) and
    :data:`PYTHON_CODE` markers, one per record that holds rows for the Python decoder."""
    python: Callable[[], DataFrame]
    """The Python decoder's diff rows of the marked records (run only when there are some)."""

    @property
    def rows(self) -> DataFrame:
        return self.wal.unionByName(self.copy, allowMissingColumns=True)


def table_diffs(
    oid: int, wal_good: DataFrame, copy_rows: DataFrame, copy_width: tuple[int, int]
) -> TableDiffs:
    """Table ``oid``'s diff rows of a run: its decoded changes (from ``wal_good``, good rows
    only) and its COPY records (from ``copy_rows``: ``table_oid, lsn, payload``) decoded in
    Spark SQL, the rows left to Python marked."""
    own = copy_rows.where(F.col("table_oid") == oid)
    widths = {oid: copy_width}
    return TableDiffs(
        wal_good.where(F.col("table_oid") == oid),
        snapshot_diffs(own, widths),
        lambda: python_diffs(own, widths, python_copy(widths)),
    )


CHANGE_TYPES = [message_type(m) for m in (MSG_INSERT, MSG_UPDATE, MSG_DELETE)]


def decoded_changes(wal: DataFrame, layouts: dict[int, tuple[LayoutIndex, int]]) -> DataFrame:
    """The window's Insert/Update/Delete messages decoded (``CHANGE_SCHEMA``), persisted."""
    changes = wal.where(F.col("mtype").isin(CHANGE_TYPES)).select("lsn", "ordinal", "payload")
    return changes.mapInArrow(lambda it: decode_changes(it, layouts), CHANGE_SCHEMA).persist(
        StorageLevel.MEMORY_AND_DISK
    )
