r"""A table's first snapshot in the driver: COPY rows decoded, cast and consolidated over Arrow,
appended by delta-rs.

A first load spends most of its time in Spark's jobs over the snapshot's rows (decode, cast,
consolidation, write: 26 s of a 34 s run at 1M rows), where the same work over Arrow takes
about 5 s. Here a table whose silver table does not exist yet, and whose run brings its
snapshot's COPY rows and nothing else, takes that path:

    read         delta-rs: the table's ``copy`` records of the run's batch window
    decode       lines split on newlines, fields on tabs, ``\N`` is NULL; a line with another
                 escape is decoded by the reference decoder (``capture.copy_text.decode_copy_row``)
    cast         every column's kernel (``silver.kernel``): typed values, or an error record
    consolidate  ``silver.rewind.consolidated_rows`` (every row at LSN 0, +1)
    create       the silver table, by Spark (its catalog entry)
    append       delta-rs, one idempotent commit that stands for both of the per-table path's
                 (its settled and its unsettled rows)

Anything else goes the per-table path before anything is written: a table with changes,
truncates or columns added since the snapshot in the run, a line that is not valid COPY TEXT
or has the wrong number of fields (its error record is the per-table path's), more rows than
``[lakehouse] driver_rows``, a bronze or silver that is not local. A run that crashed after
the append is redone by the per-table path, which finds the table and rebuilds it from the
snapshot.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import SparkSession
from pyspark.sql import types as T

from pgmedallion.capture.copy_text import CopyDecodeError, decode_copy_row
from pgmedallion.core import delta_rs, engine
from pgmedallion.core.failpoints import failpoint
from pgmedallion.core.parallel import concurrently
from pgmedallion.silver.cast_rows import typed_columns
from pgmedallion.silver.contract import TableInfo
from pgmedallion.silver.errors import CastError, ErrorRecord
from pgmedallion.silver.kernel import Rows, cast_rows, merged_adjustments
from pgmedallion.silver.pgtypes import spark_type
from pgmedallion.silver.rewind import consolidated_rows
from pgmedallion.silver.write import create_diff_table, diffs_app

log = logging.getLogger(__name__)

_NULL = "\\N"


_SIMPLE = r"^(?:[^\\\x00]|\\[\\bfnrtv])*$"
r"""A field whose escapes are all of one character (``\\``, ``\n``, ``\t`` ...): unescaped over
Arrow. Others (octal and hex escapes, ``\.``, a lone backslash) go to the reference decoder."""
_ONE_CHARACTER = [("\\n", "\n"), ("\\t", "\t"), ("\\r", "\r"), ("\\b", "\b")]
_ONE_CHARACTER += [("\\f", "\f"), ("\\v", "\v")]


def _unescaped(texts: pa.Array) -> pa.Array:
    """Fields matching :data:`_SIMPLE` with their escapes resolved: an escaped backslash is
    set aside as NUL (which no such field holds) while the others are replaced."""
    out = pc.replace_substring(texts, "\\\\", "\x00")
    for escape, character in _ONE_CHARACTER:
        out = pc.replace_substring(out, escape, character)
    return pc.replace_substring(out, "\x00", "\\")


def copy_values(payloads: pa.Array, width: int) -> pa.Array | None:
    """COPY TEXT payloads (each a chunk of rows ended by newlines) -> one ``list<string>`` of
    ``width`` values per row, decoded as ``capture.copy_text.decode_copy_row`` decodes them
    (the lines with escapes other than one-character ones go to it); None when a payload is
    not UTF-8 or does not end with a newline, or a line is not valid COPY TEXT or has another
    number of fields (the per-table path then writes its error records)."""
    raw = payloads.filter(pc.greater(pc.binary_length(payloads), 0))
    if len(raw) == 0:
        return pa.array([], pa.list_(pa.string()))
    if width == 0 or not pc.all(pc.ends_with(raw, b"\n")).as_py():
        return None
    try:  # each payload without its last newline: the lines are then all the pieces
        body = pc.binary_slice(raw, 0, -1).cast(pa.string())
    except pa.ArrowInvalid:
        return None
    lines = pc.list_flatten(pc.split_pattern(body, "\n"))
    fields = pc.split_pattern(lines, "\t")
    fewest, most = pc.min_max(pc.list_value_length(fields)).values()
    if fewest.as_py() != width or most.as_py() != width:
        return None  # an escaped tab splits wrong too: the per-table path decides
    texts = pc.list_flatten(fields)
    null = pc.equal(texts, _NULL).to_numpy(zero_copy_only=False)
    odd = np.zeros(len(lines), bool)
    escaping = pc.match_substring(lines, "\\").to_numpy(zero_copy_only=False)
    if escaping.any():  # only the fields of lines with a backslash can hold an escape
        candidates = (np.flatnonzero(escaping)[:, None] * width + np.arange(width)).ravel()
        inside = pc.match_substring(texts.take(candidates), "\\").to_numpy(zero_copy_only=False)
        escaped = candidates[inside & ~null[candidates]]
        found = texts.take(escaped)
        simple = pc.match_substring_regex(found, _SIMPLE).to_numpy(zero_copy_only=False)
        # a field with another escape: its line goes to the reference decoder
        odd[escaped[~simple] // width] = True
        mask = np.zeros(len(texts), bool)
        mask[escaped[simple]] = True
        texts = pc.replace_with_mask(texts, pa.array(mask), _unescaped(found.filter(simple)))
    values = pa.ListArray.from_arrays(
        pa.array(np.arange(0, len(lines) * width + 1, width, dtype=np.int32)),
        _with_nulls(texts, null),
    )
    if not odd.any():
        return values
    decoded = []
    for line in lines.filter(pa.array(odd)).to_pylist():
        try:
            decoded.append(decode_copy_row(line.encode(), width))
        except CopyDecodeError:
            return None
    return pa.concat_arrays([values.filter(pa.array(~odd)), pa.array(decoded, values.type)])


def _with_nulls(texts: pa.Array, null: np.ndarray) -> pa.Array:
    """``texts`` with NULL where ``null`` holds, its text buffers shared (no copy of 4M
    strings to drop the NULL markers)."""
    texts = texts.combine_chunks() if isinstance(texts, pa.ChunkedArray) else texts
    valid = np.concatenate([np.zeros(texts.offset, bool), ~null])
    if texts.null_count:
        valid[texts.offset :] &= pc.is_valid(texts).to_numpy(zero_copy_only=False)
    bitmap = pa.py_buffer(np.packbits(valid, bitorder="little"))
    _, offsets, data = texts.buffers()
    return pa.Array.from_buffers(
        pa.string(), len(texts), [bitmap, offsets, data], offset=texts.offset
    )


def _halves(payloads: pa.Array) -> list[pa.Array]:
    """``payloads`` in two runs of whole payloads of about half the bytes each (the decode and
    cast of each are Arrow kernels, which release the GIL: two threads take two cores)."""
    if len(payloads) < 2:
        return [payloads]
    sizes = np.cumsum(pc.fill_null(pc.binary_length(payloads), 0).to_numpy(zero_copy_only=False))
    cut = int(np.searchsorted(sizes, sizes[-1] / 2)) + 1
    cut = min(max(cut, 1), len(payloads) - 1)
    return [payloads.slice(0, cut), payloads.slice(cut)]


def _typed(payloads: pa.Array, width: int, columns) -> Rows | None:
    """The rows of ``payloads`` decoded (:func:`copy_values`) and cast
    (``silver.kernel.cast_rows``); None when a line needs the per-table path."""
    values = copy_values(payloads, width)
    if values is None:
        return None
    return cast_rows(values, columns)


@dataclass
class FirstLoad:
    rows: int
    """Rows appended."""
    errors: list[ErrorRecord]
    """A ``CastError`` per value that does not cast (its row is not a diff)."""
    adjusted: list[tuple]
    """``(column, code, count, first_lsn, sample)``: values a declared rule adjusted."""


def diff_schema(info: TableInfo) -> T.StructType:
    """The silver table's columns as the per-table path creates them."""
    data = [T.StructField(name, spark_type(t), True) for name, t in typed_columns(info)]
    return T.StructType(
        [
            *data,
            T.StructField("_lsn", T.LongType(), True),
            T.StructField("_diff", T.LongType(), True),
            T.StructField("_run", T.LongType(), False),
        ]
    )


def first_snapshot(
    spark: SparkSession,
    info: TableInfo,
    bronze: str | None,
    where: str,
    target: str,
    path: str | None,
    width: int,
    source: str,
    run: int,
    silver: str,
) -> FirstLoad | None:
    """The table's first snapshot appended to a new silver table ``target`` (at ``path``, in
    schema ``silver``) from bronze's ``copy`` records at ``bronze`` matching ``where``: the
    rows appended, with the errors and adjustments of its values; None when the per-table path
    must take it (nothing was written).

    The one commit holds every row of the snapshot, and stands for both of the per-table
    path's commits of the run (its settled and its unsettled rows, ``write.diffs_app``)."""
    columns = typed_columns(info)
    if not (delta_rs.usable(bronze) and path is not None) or len(columns) != width:
        return None
    most = engine.current().driver_rows
    sql = f"SELECT part, max(ordinal) AS n FROM t WHERE {where} GROUP BY part"
    counted = delta_rs.query(bronze, sql).column("n").to_pylist()
    if sum(n or 0 for n in counted) > most:
        return None
    payloads = delta_rs.read_arrow(bronze, ["payload"], where).column("payload").combine_chunks()
    parts = concurrently(
        lambda part: _typed(part, width, columns), _halves(payloads), engine.current().workers
    )
    if any(part is None for part in parts):
        return None
    names = [name for name, _ in columns]
    errors = [
        ErrorRecord(info.oid, 0, CastError.__name__, message, column, raw)
        for part in parts
        for _, column, raw, message in part.errors
    ]
    adjusted = merged_adjustments([part.adjustments(np.zeros(len(part.failed))) for part in parts])
    kept = [pa.array(~part.failed) for part in parts]
    typed = [
        pa.chunked_array([part.columns[i].filter(k) for part, k in zip(parts, kept, strict=True)])
        for i in range(len(columns))
    ]
    rows = sum(int((~part.failed).sum()) for part in parts)
    table = pa.Table.from_arrays(
        [*typed, pa.array(np.zeros(rows, np.int64)), pa.array(np.ones(rows, np.int64))],
        names=[*names, "_lsn", "_diff"],
    )
    # a primary key (all of its columns published) makes each snapshot row distinct
    keyed = bool(info.primary_key) and set(info.primary_key) <= set(names)
    out = consolidated_rows(table, names, run, distinct=keyed)
    create_diff_table(spark, target, diff_schema(info), local=(silver, info.silver_table))
    dt = delta_rs.open_table(path)
    app = diffs_app(source)
    if delta_rs.done(dt, app, run):
        return None  # cannot be: a new table; the per-table path decides
    types = delta_rs.read_arrow(path, [*names, "_lsn", "_diff", "_run"], "FALSE").schema
    out = pa.table([out.column(f.name).cast(f.type) for f in types], schema=types)
    failpoint("silver.before_append")
    delta_rs.append(path, out, app, run, also=[diffs_app(source, unsettled=True)])
    failpoint("silver.after_append")
    log.info("silver: %s: snapshot of %d rows read in the driver", info.qualified_name, rows)
    return FirstLoad(out.num_rows, errors, adjusted)
