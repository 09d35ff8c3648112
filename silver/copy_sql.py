r"""Decode COPY TEXT rows with Spark SQL expressions (code-generated), Python only where needed.

The same decoding as :func:`capture.copy_text.decode_copy_row`, split in two by what a line
holds:

Spark SQL (nearly every line)
    A ``copy`` record's payload (valid UTF-8) is split into lines on ``\n``, a line into fields
    on tab. ``\N`` is NULL, a field without a backslash is taken as it is, and a field with
    backslashes is unescaped by plain string expressions: every ``\\`` pair becomes a NUL
    placeholder (PostgreSQL text cannot hold NUL, and a line holding one goes to Python), then
    ``\b \f \n \r \t \v`` become their control characters, any other ``\c`` becomes ``c``, and
    the placeholders become single backslashes. A line with the wrong number of fields becomes
    the same error record (``MissingColumn`` / ``ColumnCountMismatch``, message and raw line)
    as the Python decoder makes.

Python (:func:`pgmedallion.capture.copy_text.decode_copy_row`, in Arrow workers)
    A payload that is not valid UTF-8 (all of it, so that errors keep their exact messages),
    and a line with an escape SQL does not resolve: octal ``\NNN`` or hex ``\xNN`` (bytes that
    may combine into one multibyte character), ``\.`` (an error), a backslash before a raw tab
    or at the end of the line (an escaped delimiter, or an error), or a NUL. The test is
    conservative (``\\x``, a literal backslash and an ``x``, goes to Python too, which decodes
    it correctly), so it only costs speed.

Both halves read the bronze rows once each; the Python half keeps only the records whose
payload holds one of those escapes (or is not UTF-8), usually none, and is left out of the plan
when a first query finds none. The escape test's regular
expression runs only over a payload that holds a backslash or a NUL (a byte search first),
since every match starts with one.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.utils import is_remote

NUL = "\u0000"
# An escape left to Python, within one line: octal, hex, end-of-data, escaped tab, a backslash
# ending the line, or a NUL (which the placeholder needs absent).
HARD_LINE = r"\\(?:[0-7x.\t]|\z)|\x00"
# The same within a whole payload (a line's end is a newline or the payload's end).
HARD_PAYLOAD = r"\\(?:[0-7x.\t\n]|\z)|\x00"
_CONTROL = (("b", "\b"), ("f", "\f"), ("n", "\n"), ("r", "\r"), ("t", "\t"), ("v", "\v"))


def unescape_field(field: Column) -> Column:
    """A field (neither NULL marker nor holding a hard escape) with its escapes resolved."""
    s = F.replace(field, F.lit("\\\\"), F.lit(NUL))
    for code, char in _CONTROL:
        s = F.replace(s, F.lit("\\" + code), F.lit(char))
    s = F.regexp_replace(s, r"(?s)\\(.)", "$1")
    return F.replace(s, F.lit(NUL), F.lit("\\"))


def decode_field(field: Column) -> Column:
    return (
        F.when(field == F.lit("\\N"), F.lit(None).cast("string"))
        .when(~field.contains("\\"), field)
        .otherwise(unescape_field(field))
    )


def _lookup(mapping: Mapping[int, int], key: Column) -> Column:
    pairs = []
    for k, v in mapping.items():
        pairs += [F.lit(k).cast("bigint"), F.lit(v).cast("int")]
    return F.create_map(*pairs)[key]


def _lines(pieces: Column) -> Column:
    """A payload's lines without their newlines from its pieces split on newlines (a final
    empty piece dropped, as ``copy_lines``); the pieces should be a column computed once."""
    return F.when(
        F.element_at(pieces, -1) == F.lit(""), F.slice(pieces, 1, F.size(pieces) - 1)
    ).otherwise(pieces)


PYTHON_CODE = "_pgm_python"
"""The ``code`` of a marker row (see :func:`copy_diffs`): a record that holds rows for Python."""


def copy_diffs(
    copy_rows: DataFrame,
    widths: Mapping[int, tuple[int, int]],
    python_decode: Callable[[DataFrame], DataFrame],
) -> DataFrame:
    """``table_oid, lsn, payload`` copy records -> diff rows (silver's ``DIFF_SCHEMA``).

    ``widths`` maps a followed table's OID to ``(columns in its COPY rows, columns of the
    row out)``, the extra ones NULL; records of other tables are skipped. ``python_decode``
    turns ``table_oid, lsn, payload`` records (whole payloads, or single lines ended by a
    newline) into diff rows with the Python decoder.

    The Python half is not run: each record holding rows for it gives instead one marker row
    (``code`` :data:`PYTHON_CODE`, the record's ``table_oid`` and ``lsn``, ``diff`` 0), found
    in the same scan as the SQL half. A caller that finds markers runs :func:`python_diffs` on
    those tables' records.
    """
    if not widths:
        return python_decode(copy_rows.where(F.lit(False)))
    e = _decode_exprs(tuple(sorted(widths.items())), is_remote())
    followed = copy_rows.where(e.followed)
    fast = (
        followed.select(*e.chunks)
        .select(*e.lines)
        .where(e.keep)
        .select("*", e.fields)
        .select(*e.out)
    )
    # (The Python branch on an empty relation runs no task; it keeps the output's schema that
    # of the Python half.)
    return fast.unionByName(python_decode(copy_rows.where(F.lit(False))))


@dataclass(frozen=True)
class _DecodeExprs:
    """The expressions of :func:`copy_diffs`'s Spark SQL half, stage by stage."""

    followed: Column
    chunks: list[Column]
    lines: list[Column]
    keep: Column
    fields: Column
    out: list[Column]


@functools.lru_cache(maxsize=256)
def _decode_exprs(widths: tuple[tuple[int, tuple[int, int]], ...], remote: bool) -> _DecodeExprs:
    """Built once per process for each set of tables: building them costs one call into the
    JVM per expression node, about a quarter of a second. ``remote`` keeps Spark Connect
    columns apart from classic ones."""
    del remote
    oids = [oid for oid, _ in widths]
    copy_width = _lookup({oid: w[0] for oid, w in widths}, F.col("table_oid"))
    width = _lookup({oid: w[1] for oid, w in widths}, F.col("table_oid"))
    text = F.col("payload").cast("string")
    valid = F.is_valid_utf8(text)

    # Spark SQL: the lines of valid payloads that hold no hard escape (a line is looked at
    # only in a payload that holds one), and a NULL line after the lines of a payload that
    # needs Python (the marker). Each payload is split once, before the explode.
    chunks = [
        F.col("table_oid"),
        F.col("lsn"),
        copy_width.alias("_cw"),
        width.alias("_w"),
        _needs_python(text, valid).alias("_hard"),
        F.when(valid, F.split(text, "\n", -1)).alias("_pieces"),
    ]
    marker = F.array(F.lit(None).cast("string"))
    lines = [
        *(F.col(c) for c in ("table_oid", "lsn", "_cw", "_w", "_hard")),
        F.explode(
            F.when(
                F.col("_hard"),
                F.concat(
                    F.coalesce(_lines(F.col("_pieces")), F.array().cast("array<string>")), marker
                ),
            ).otherwise(_lines(F.col("_pieces")))
        ).alias("_line"),
    ]
    line = F.col("_line")
    keep = line.isNull() | ~(F.col("_hard") & (line.isNull() | line.rlike(HARD_LINE)))
    fields = F.col("_fields")
    count = F.size(fields)
    most = max(w for _, (_, w) in widths)
    values = F.slice(
        F.array(*(decode_field(F.get(fields, i)) for i in range(most))).cast("array<string>"),
        1,
        F.col("_w"),
    )
    empty_row = (F.col("_cw") == 0) & (line == F.lit(""))
    ok = line.isNotNull() & ((count == F.col("_cw")) | empty_row)
    null = F.lit(None)
    out = [
        F.col("table_oid"),
        F.when(ok, F.lit(0)).otherwise(F.col("lsn")).cast("bigint").alias("lsn"),
        null.cast("bigint").alias("ordinal"),
        F.when(ok, F.lit(1)).otherwise(F.lit(0)).cast("bigint").alias("diff"),
        F.when(ok, values).alias("values"),
        F.when(ok, null)
        .when(line.isNull(), F.lit(PYTHON_CODE))
        .when(count < F.col("_cw"), F.lit("MissingColumn"))
        .otherwise(F.lit("ColumnCountMismatch"))
        .cast("string")
        .alias("code"),
        F.when(ok | line.isNull(), null)
        .otherwise(F.format_string("COPY row has %d fields, expected %d", count, F.col("_cw")))
        .cast("string")
        .alias("message"),
        F.when(ok, null).otherwise(line).cast("string").alias("raw"),
    ]
    return _DecodeExprs(
        followed=F.col("table_oid").isin(oids),
        chunks=chunks,
        lines=lines,
        keep=keep,
        fields=F.split("_line", "\t", -1).alias("_fields"),
        out=out,
    )


def _needs_python(text: Column, valid: Column) -> Column:
    """Whether a payload is not UTF-8 or holds a hard escape. Every match of HARD_PAYLOAD
    starts with a backslash or a NUL: the regex runs only over the payloads holding one (two
    byte searches), not over every whole payload."""
    maybe_hard = text.contains("\\") | text.contains(NUL)
    return ~valid | F.when(maybe_hard, text.rlike(HARD_PAYLOAD)).otherwise(F.lit(False))


def python_diffs(
    copy_rows: DataFrame,
    widths: Mapping[int, tuple[int, int]],
    python_decode: Callable[[DataFrame], DataFrame],
) -> DataFrame:
    """The Python half of :func:`copy_diffs`: the diff rows of the payloads that are not UTF-8
    (whole) and of the lines of the others that hold a hard escape."""
    followed = copy_rows.where(F.col("table_oid").isin(list(widths)))
    text = F.col("payload").cast("string")
    valid = F.is_valid_utf8(text)
    hard = (
        followed.where(_needs_python(text, valid))
        .select(
            "table_oid",
            "lsn",
            "payload",
            F.when(valid, _lines(F.split(text, "\n", -1)))
            .otherwise(F.array(F.lit(None).cast("string")))
            .alias("_ls"),
        )
        .select("table_oid", "lsn", "payload", F.explode("_ls").alias("_line"))
    )
    slow = hard.where(F.col("_line").isNull() | F.col("_line").rlike(HARD_LINE)).select(
        "table_oid",
        "lsn",
        F.when(F.col("_line").isNull(), F.col("payload"))
        .otherwise(F.concat(F.col("_line"), F.lit("\n")).cast("binary"))
        .alias("payload"),
    )
    return python_decode(slow)
