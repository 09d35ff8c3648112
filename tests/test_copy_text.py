"""COPY TEXT rows: escapes byte by byte, errors, the encode/decode round trip, and the bytes a
real PostgreSQL writes."""

from __future__ import annotations

import psycopg
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pgmedallion.capture.copy_text import (
    ColumnCountMismatch,
    CopyDecodeError,
    InvalidCopyInput,
    MissingColumn,
    decode_copy_row,
)
from tests.silver_helpers import encode_copy_field, encode_copy_row


@pytest.mark.parametrize(
    ("raw", "values"),
    [
        (b"1\tabc\t\n", ["1", "abc", ""]),
        (b"1\tabc", ["1", "abc"]),
        (b"\n", [""]),
        (b"", [""]),
        (b"\\N", [None]),
        (b"\\N\t\t\\N\n", [None, "", None]),
        ("caf\u00e9\t\u65e5\u672c\n".encode(), ["caf\u00e9", "\u65e5\u672c"]),
        (b"a\\\\b", ["a\\b"]),
        (b"\\\\N", ["\\N"]),
        (b"x\\N", ["xN"]),
        (b"\\b\\f\\n\\r\\t\\v", ["\b\f\n\r\t\v"]),
        (b"\\101\\60\\0071", ["A0\x071"]),
        (b"\\7\\77", ["\x07?"]),
        (b"\\x41\\x4a\\x4Ab\\xg", ["AJJbxg"]),
        (b"\\x7\\x", ["\x07x"]),
        (b"\\303\\251\\xc3\\xa9", ["\u00e9\u00e9"]),
        (b"\\q\\'\\\"", ["q'\""]),
        (b"a\\\tb\tc", ["a\tb", "c"]),
        (b"a\\\\\tb", ["a\\", "b"]),
        (b"a\\\\\\\tb", ["a\\\tb"]),
        (b"a\\\nb\n", ["a\nb"]),
        (b"a\r\n", ["a\r"]),
        (b"a\n\n", ["a\n"]),
    ],
)
def test_decode_copy_row(raw: bytes, values: list[str | None]) -> None:
    assert decode_copy_row(raw) == values


def test_octal_escape_wraps_modulo_256_and_builds_utf8() -> None:
    # \777 is 0x1FF, truncated to the byte 0xFF like PostgreSQL does; 0xFF alone is not UTF-8.
    with pytest.raises(InvalidCopyInput):
        decode_copy_row(b"\\777")
    assert decode_copy_row(b"\\703\\251") == ["\u00e9"]


@pytest.mark.parametrize(
    "raw",
    [
        b"abc\\",
        b"a\tb\\\n",
        b"\\\\\\",
        b"\xff\tok",
        b"ok\t\xc3",
        b"\\xff\tok",
        b"\\xc3\\x28",
        b"ok\t\xc3\\n",
        b"\\.",
        b"a\\.b\tc",
    ],
)
def test_invalid_copy_input(raw: bytes) -> None:
    with pytest.raises(InvalidCopyInput):
        decode_copy_row(raw)


def test_missing_column() -> None:
    with pytest.raises(MissingColumn, match="2 fields, expected 3") as info:
        decode_copy_row(b"1\t\\N\n", expected_columns=3)
    assert (info.value.expected, info.value.actual) == (3, 2)


def test_extra_column() -> None:
    with pytest.raises(ColumnCountMismatch, match="3 fields, expected 2") as info:
        decode_copy_row(b"1\t2\t3\n", expected_columns=2)
    assert not isinstance(info.value, MissingColumn)


def test_expected_columns_match() -> None:
    assert decode_copy_row(b"1\t\\N\n", expected_columns=2) == ["1", None]


def test_zero_column_row() -> None:
    assert decode_copy_row(b"\n", expected_columns=0) == []
    assert decode_copy_row(b"\n") == [""]


def test_error_taxonomy() -> None:
    for error in (InvalidCopyInput, ColumnCountMismatch, MissingColumn):
        assert issubclass(error, CopyDecodeError)
    assert issubclass(CopyDecodeError, ValueError)


@pytest.mark.parametrize(
    ("value", "field"),
    [
        (None, "\\N"),
        ("", ""),
        ("\\N", "\\\\N"),
        ("a\tb\nc\rd\\e\bf\fg\vh", "a\\tb\\nc\\rd\\\\e\\bf\\fg\\vh"),
        ("\x01\x1f\x7f\u00e9", "\x01\x1f\x7f\u00e9"),
    ],
)
def test_encode_copy_field(value: str | None, field: str) -> None:
    assert encode_copy_field(value) == field


def test_encode_copy_row() -> None:
    assert encode_copy_row(["1", None, "a\tb", "\u00e9"]) == b"1\t\\N\ta\\tb\t\xc3\xa9\n"


rows = st.lists(st.one_of(st.none(), st.text()), min_size=1)


@given(rows)
def test_decode_inverts_encode(values: list[str | None]) -> None:
    assert decode_copy_row(encode_copy_row(values)) == values
    assert decode_copy_row(encode_copy_row(values)[:-1], expected_columns=len(values)) == values


@given(st.lists(st.one_of(st.none(), st.text()), max_size=0))
def test_decode_inverts_encode_without_columns(values: list[str | None]) -> None:
    assert decode_copy_row(encode_copy_row(values), expected_columns=0) == values


@given(st.binary())
def test_arbitrary_bytes_decode_or_raise_invalid_copy_input(raw: bytes) -> None:
    try:
        values = decode_copy_row(raw)
    except InvalidCopyInput:
        return
    assert all(value is None or isinstance(value, str) for value in values)


def test_real_postgres_copy(db: dict) -> None:
    values = [
        "tab\there",
        "line\nbreak\r\n",
        "back\\slash \\N \\t",
        None,
        "\\N",
        "",
        "caf\u00e9 \u65e5\u672c \U0001f418",
        "\x01\x7f\b\f\v",
    ]
    query = psycopg.sql.SQL("COPY (SELECT {}) TO STDOUT").format(
        psycopg.sql.SQL(", ").join(psycopg.sql.Literal(value) for value in values)
    )
    # Rows PostgreSQL never writes but reads: its COPY FROM parser is the reference.
    unusual = [b"a\\\tb", b"x\\N\\q", b"\\703\\251", b"\\x4Ab\\xg\\x", b"\\7\\77"]
    with psycopg.connect(**db, autocommit=True) as conn:
        conn.execute("SET client_encoding = 'UTF8'")
        with conn.cursor() as cur, cur.copy(query) as copy:
            chunks = [bytes(chunk) for chunk in copy]
        conn.execute("CREATE TABLE unusual (i serial, v text)")
        with conn.cursor() as cur, cur.copy("COPY unusual (v) FROM STDIN") as copy:
            for raw in unusual:
                copy.write(raw + b"\n")
        parsed = [v for (v,) in conn.execute("SELECT v FROM unusual ORDER BY i")]
    assert parsed == [decode_copy_row(raw, expected_columns=1)[0] for raw in unusual]
    assert len(chunks) == 1
    assert chunks[0] == encode_copy_row(values)
    assert decode_copy_row(chunks[0], expected_columns=len(values)) == values
