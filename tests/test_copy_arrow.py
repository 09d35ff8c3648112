"""COPY TEXT decoding over Arrow (silver/copy_arrow.py, in the driver and in Spark's Python
workers) against the reference decoder (capture/copy_text.py), line by line.

Both decode the same ``copy`` records; the diff rows (values, error codes, messages, raw lines,
LSNs) must be the same multiset.
"""

from __future__ import annotations

import random

import pyarrow as pa
from chispa import assert_df_equality
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql import functions as F
from pyspark.sql import types as T

from pgmedallion.capture.copy_text import CopyDecodeError, decode_copy_row
from pgmedallion.core import delta_rs
from pgmedallion.silver.cast_columns import UNSETTLED_COLUMN, plain_cast
from pgmedallion.silver.cast_rows import _plain_copy, cast_base
from pgmedallion.silver.contract import DIFF_ARROW
from pgmedallion.silver.copy_arrow import copy_columns
from pgmedallion.silver.decode import TableDiffs, _decode_lines
from pgmedallion.silver.decode import decode_copy as _decode_copy
from pgmedallion.silver.decode import snapshot_diffs as decode_snapshot
from pgmedallion.silver.pgtypes import PgType
from tests.silver_helpers import copy_values, encode_copy_row, snapshot_diffs

RECORDS = "table_oid bigint, lsn bigint, payload binary"

TRICKY_LINES = [
    b"1\tabc\t",
    b"\\N\t\t\\N",
    b"\\\\N\tx\\N\t\\N\\N",
    "caf\u00e9\t\u65e5\u672c \U0001f418\t\\\\".encode(),
    b"a\\\\b\t\\b\\f\\n\\r\\t\\v\t\\q\\'\\\"",
    b"a\\\\\\nb\t\\\\\\\\\t\\\\t",
    "\\\u00e9\t\\\U0001f418\t\\\u2028x".encode(),
    b"\\101\\60\\0071\tx\ty",
    b"\\x41\\x4a\\x4Ab\\xg\t\\x7\\x\t",
    b"\\303\\251\\xc3\\xa9\t1\t2",
    b"a\\\tb\tc\td",
    b"a\\\\\tb\tc",
    b"a\\\\\\\tb\tc\td",
    b"ends\twith a\tlone \\",
    b"end\\.of\tdata\tx",
    b"\\\\.\t\\\\x41\t\\\\101",
    b"\t\t",
    b"",
    b"1\t2",
    b"1\t2\t3\t4",
    b"a\rb\t\\r\t\r",
    b"\xff\xfe\tbad\tutf8",
    b"ok\t\xc3\xa9\\x\t\\n",
    b"only one",
    b"surrogate\t\xed\xa0\x80\tx",
    b"overlong\t\xc0\xaf\tx",
    b"beyond\t\xf4\x90\x80\x80\tx",
    b"cut\t\xe6\x97\tx",
]


def _batch(records: list[tuple[int, int, bytes]]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict(
        {
            "table_oid": pa.array([r[0] for r in records], pa.int64()),
            "lsn": pa.array([r[1] for r in records], pa.int64()),
            "payload": pa.array([r[2] for r in records], pa.binary()),
        }
    )


def _rows(batches) -> list[tuple]:
    rows = []
    for out in batches:
        rows.extend(zip(*out.to_pydict().values(), strict=True))
    return rows


def _reference(records: list[tuple[int, int, bytes]], widths) -> list[tuple]:
    """Each followed record decoded line by line by ``capture.copy_text.decode_copy_row``."""
    out = []
    for oid, width in widths.items():
        own = [r for r in records if r[0] == oid]
        if own:
            out.append(_decode_lines(_batch(own), oid, *width))
    return _rows(out)


def _key(row) -> tuple:
    row = tuple(row)
    return tuple(tuple(v) if isinstance(v, list) else v for v in row)


def _compare(spark, records, widths) -> list[tuple]:
    """Spark's decoding (its Python workers, batches of several records), the driver's over
    each record alone (the Arrow path wherever the record allows it) and over all of them
    give what the reference gives."""
    want = sorted(map(_key, _reference(records, widths)), key=repr)
    df = spark.createDataFrame(records, RECORDS)
    got = [_key(r) for r in snapshot_diffs(df, widths).collect()]
    assert sorted(got, key=repr) == want
    alone = _rows(_decode_copy(iter([_batch([r]) for r in records]), widths))
    assert sorted(map(_key, alone), key=repr) == want
    together = _rows(_decode_copy(iter([_batch(records)]), widths))
    assert sorted(map(_key, together), key=repr) == want
    return got


def test_decoding_matches_the_reference_on_tricky_lines(spark):
    # One line per record, in payloads of 3 columns (table 1) and of 3 padded to 5 (table 2),
    # whole and with or without the trailing newline; a table nobody follows (9) is skipped.
    records = []
    for i, line in enumerate(TRICKY_LINES):
        records.append((1, 100 + i, line + b"\n"))
        records.append((2, 200 + i, line))
        records.append((9, 300 + i, line))
    records.append((1, 1, b"\n".join(TRICKY_LINES) + b"\n"))
    valid = b"\n".join(line for line in TRICKY_LINES if b"\xff" not in line)
    records.append((2, 2, valid))
    records.append((1, 3, b""))
    records.append((1, 4, b"\n\n"))
    got = _compare(spark, records, {1: (3, 3), 2: (3, 5)})
    assert ("MissingColumn" in {r[5] for r in got}) and ("InvalidCopyInput" in {r[5] for r in got})
    assert (1, 0, None, 1, ("\\N", "xN", "NN"), None, None, None) in got
    assert (2, 0, None, 1, ("\\N", "xN", "NN", None, None), None, None, None) in got
    assert (1, 0, None, 1, ("a\\\nb", "\\\\", "\\t"), None, None, None) in got


def test_decoding_of_zero_and_one_column_tables(spark):
    records = [(1, 1, b"\n\nx\n"), (2, 2, b"\n\\N\n\\\\N\nx\ty\n")]
    got = _compare(spark, records, {1: (0, 0), 2: (1, 2)})
    assert (1, 0, None, 1, (), None, None, None) in got
    assert (2, 0, None, 1, ("", None), None, None, None) in got


def test_decoding_matches_the_reference_on_random_rows(spark):
    rng = random.Random(20261122)
    alphabet = ["a", "Z", "0", "7", "x", "N", ".", " ", "\\", "\t", "\n", "\r", "\b", "\f",
                "\v", "\u00e9", "\u65e5", "\U0001f418", "\u2028", "\\N", "\\.", "\\x4"]  # fmt: skip
    lines = []
    for _ in range(400):
        values = [
            None if rng.random() < 0.15 else "".join(rng.choices(alphabet, k=rng.randrange(6)))
            for _ in range(3)
        ]
        line = encode_copy_row(values)[:-1]
        if rng.random() < 0.3:  # raw bytes PostgreSQL would not write, but its parser reads
            at = rng.randrange(len(line) + 1)
            line = line[:at] + rng.choice([b"\\", b"\t", b"\\1", b"\\x", b"\\\\"]) + line[at:]
        lines.append(line)
    records = [(1, i, b"\n".join(lines[i : i + 50]) + b"\n") for i in range(0, 400, 50)]
    records += [(2, 1000 + i, line) for i, line in enumerate(lines[:100])]
    got = _compare(spark, records, {1: (3, 3), 2: (3, 4)})
    assert sum(1 for r in got if r[3] == 1) > 300


def test_the_arrow_path_decodes_what_the_reference_decodes():
    """Lines as PostgreSQL writes them (one-character escapes, NULLs, empty fields, multibyte
    text) take the Arrow path whole, with the reference's values; a line it leaves (an octal
    escape) is decoded by the reference within it; a short line leaves the payload."""
    rng = random.Random(7)
    alphabet = ["a", "\\", "\t", "\n", "\r", "\b", "\f", "\v", "\u00e9", "\U0001f418", ""]
    rows = [
        [None if rng.random() < 0.1 else "".join(rng.choices(alphabet, k=3)) for _ in range(3)]
        for _ in range(300)
    ]
    payload = b"".join(encode_copy_row(row) for row in rows)
    values = copy_values(pa.array([payload], pa.binary()), 3)
    assert values is not None and values.to_pylist() == rows
    octal = pa.array([b"a\\101\tb\tc\nd\te\tf\n"], pa.binary())
    # (the reference's lines come after the others: rows are a multiset)
    assert sorted(copy_values(octal, 3).to_pylist()) == [["aA", "b", "c"], ["d", "e", "f"]]
    assert copy_values(pa.array([b"a\tb\n"], pa.binary()), 3) is None


def test_diff_schema_is_the_output(spark):
    df = spark.createDataFrame([(1, 1, b"a\tb\n")], RECORDS)
    written = T.StructType(
        [
            *(T.StructField(n, T.LongType()) for n in ("table_oid", "lsn", "ordinal", "diff")),
            T.StructField("values", T.ArrayType(T.StringType())),
            *(T.StructField(n, T.StringType()) for n in ("code", "message", "raw")),
        ]
    )
    assert delta_rs.spark_types(DIFF_ARROW) == written
    decoded = snapshot_diffs(df, {1: (2, 2)})
    assert decoded.schema == written
    assert [r["values"] for r in decoded.collect()] == [["a", "b"]]
    assert snapshot_diffs(df, {}).count() == 0


def test_copy_records_decoded_and_cast_in_one_pass_as_in_two(spark):
    """The Spark engine decodes a snapshot's COPY records and casts them in one ``mapInArrow``
    (``silver.cast_rows._plain_copy``): the same rows, settled or not, as decoding in one and
    casting in another (``plain_cast`` of ``cast_base``), decode errors included."""
    lines = [
        b"1\tone\t1.50\n",
        b"2\t\\N\t12.345\n",  # rounded to numeric(5,2): adjusted, so unsettled
        b"x\tbad int\t1\n",  # a cast error: unsettled
        b"4\tfour\t4\n5\tfive\t5.5\n",
        b"6\ttoo few\n",  # another number of fields: a decode error
    ]
    records = spark.createDataFrame([(7, 0, line) for line in lines], RECORDS)
    widths = {7: (3, 3)}
    diffs = TableDiffs(
        spark.createDataFrame([], delta_rs.spark_types(DIFF_ARROW)),
        decode_snapshot(records, widths),
        records,
        widths,
    )
    columns = [("i", PgType(23)), ("t", PgType(25)), ("n", PgType(1700, (5 << 16 | 2) + 4))]
    fused = _plain_copy(diffs, columns)
    two = plain_cast(cast_base(diffs.copy), "values", columns)
    assert fused.schema == two.schema
    assert_df_equality(fused, two, ignore_row_order=True)
    assert fused.where(F.col(UNSETTLED_COLUMN)).count() == 3


BYTES = [b"a", b"N", b"\\", b"\t", b"\r", b"x", b"0", b"7", b"\xc3\xa9", b"\xc3", b"\xff", b"."]


@settings(max_examples=400, deadline=None)
@given(
    lines=st.lists(st.lists(st.sampled_from(BYTES), max_size=8).map(b"".join), max_size=10),
    width=st.integers(1, 3),
    cut=st.integers(0, 10),
)
def test_the_column_decoder_is_the_reference_line_by_line(lines, width, cut):
    """``copy_columns`` over any bytes (escapes of every kind, raw carriage returns, empty lines,
    invalid UTF-8, lines of other widths), in payloads cut anywhere between lines: each row's
    values are the reference decoder's for its line, in order; None only where the reference
    rejects a line or the line holds what the CSV reader reads otherwise (a raw carriage
    return, a backslash before a raw tab, an empty line of a table of several columns)."""
    payloads = pa.array(
        [b"".join(line + b"\n" for line in chunk) for chunk in (lines[:cut], lines[cut:])],
        pa.binary(),
    )
    got = copy_columns(payloads, width)
    try:
        want = [decode_copy_row(line, width) for line in lines]
    except CopyDecodeError:
        assert got is None
        return
    if got is None:
        assert any(
            b"\r" in line or b"\\\t" in line or (width > 1 and line == b"") for line in lines
        )
        return
    assert [list(row) for row in zip(*(c.to_pylist() for c in got), strict=True)] == want
    assert len(got) == width and all(len(c) == len(lines) for c in got)
