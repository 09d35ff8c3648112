"""COPY TEXT decoding in Spark SQL (silver/copy_sql.py) against the Python decoder it fronts.

Both decode the same ``copy`` records; the diff rows (values, error codes, messages, raw lines,
LSNs) must be the same multiset.
"""

from __future__ import annotations

import random

import pyarrow as pa
import pytest
from pyspark.sql import functions as F

from pgmedallion.silver.contract import DIFF_SCHEMA
from pgmedallion.silver.copy_sql import HARD_LINE, HARD_PAYLOAD, PYTHON_CODE, python_diffs
from pgmedallion.silver.decode import decode_copy as _decode_copy
from pgmedallion.silver.decode import python_copy as _python_copy
from tests.silver_helpers import encode_copy_row, snapshot_diffs

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


def _python(records: list[tuple[int, int, bytes]], widths) -> list[tuple]:
    batch = pa.RecordBatch.from_pydict(
        {
            "table_oid": [r[0] for r in records],
            "lsn": [r[1] for r in records],
            "payload": [r[2] for r in records],
        }
    )
    rows = []
    for out in _decode_copy(iter([batch]), widths):
        rows.extend(zip(*out.to_pydict().values(), strict=True))
    return rows


def _key(row) -> tuple:
    row = tuple(row)
    return tuple(tuple(v) if isinstance(v, list) else v for v in row)


def _compare(spark, records, widths, markers: bool | None = None) -> list[tuple]:
    """Both ways of running the SQL decoder give what the Python decoder gives: whole, and
    with marker rows resolved as silver's run does (``decoded_rows``). ``markers``: whether
    some record must have needed Python."""
    df = spark.createDataFrame(records, RECORDS)
    got = [_key(r) for r in snapshot_diffs(df, widths).collect()]
    want = [_key(r) for r in _python(records, widths)]
    assert sorted(got, key=repr) == sorted(want, key=repr)

    marked = snapshot_diffs(df, widths, mark=True)
    found = marked.where(F.col("code") == PYTHON_CODE).select("table_oid", "lsn", "diff").collect()
    assert all(r["diff"] == 0 and r["table_oid"] in widths for r in found)
    if markers is not None:
        assert bool(found) is markers
    # what silver's cast does with the markers: the rows but the markers, and the Python
    # decoder's rows of the marked tables' records
    resolved = marked.where(F.col("code").isNull() | (F.col("code") != PYTHON_CODE))
    tables = sorted({r["table_oid"] for r in found})
    if tables:
        only = {oid: widths[oid] for oid in tables}
        resolved = resolved.unionByName(python_diffs(df, only, _python_copy(only)))
    assert sorted(map(_key, resolved.collect()), key=repr) == sorted(want, key=repr)
    return got


def test_sql_decoding_matches_python_on_tricky_lines(spark):
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
    got = _compare(spark, records, {1: (3, 3), 2: (3, 5)}, markers=True)
    assert ("MissingColumn" in {r[5] for r in got}) and ("InvalidCopyInput" in {r[5] for r in got})
    assert (1, 0, None, 1, ("\\N", "xN", "NN"), None, None, None) in got
    assert (2, 0, None, 1, ("\\N", "xN", "NN", None, None), None, None, None) in got
    assert (1, 0, None, 1, ("a\\\nb", "\\\\", "\\t"), None, None, None) in got


def test_sql_decoding_of_zero_and_one_column_tables(spark):
    records = [(1, 1, b"\n\nx\n"), (2, 2, b"\n\\N\n\\\\N\nx\ty\n")]
    got = _compare(spark, records, {1: (0, 0), 2: (1, 2)}, markers=False)
    assert (1, 0, None, 1, (), None, None, None) in got
    assert (2, 0, None, 1, ("", None), None, None, None) in got


def test_sql_decoding_matches_python_on_random_rows(spark):
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
    got = _compare(spark, records, {1: (3, 3), 2: (3, 4)}, markers=True)
    assert sum(1 for r in got if r[3] == 1) > 300


@pytest.mark.parametrize("pattern", [HARD_LINE, HARD_PAYLOAD])
def test_hard_escape_patterns(spark, pattern):
    cases = {"a\\101": True, "\\x4": True, "a\\.": True, "a\\\tb": True, "a\\": True,
             "a\\\\": True, "nul\u0000": True, "\\n\\t\\\\q": False, "\\N": False}  # fmt: skip
    df = spark.createDataFrame([(k,) for k in cases], "s string")
    got = {r[0]: r[1] for r in df.select("s", F.col("s").rlike(pattern)).collect()}
    assert got == cases


def test_diff_schema_is_the_output(spark):
    df = spark.createDataFrame([(1, 1, b"a\tb\n")], RECORDS)
    assert snapshot_diffs(df, {1: (2, 2)}).schema == DIFF_SCHEMA
    assert snapshot_diffs(df, {}).count() == 0
    assert snapshot_diffs(df, {1: (2, 2)}, mark=True).schema == DIFF_SCHEMA
