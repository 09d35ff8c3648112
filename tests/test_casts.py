"""Silver casts against the text a real PostgreSQL writes: every mapped type, its edge values,
the values that must fail, and PostgreSQL array literals parsed back element for element."""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import date, datetime
from decimal import Decimal

import psycopg
import pyarrow as pa
import pytest
from chispa import assert_df_equality
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql
from pyspark.sql import Row
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from pgmedallion.capture.connection import connect
from pgmedallion.capture.copy_text import decode_copy_row
from pgmedallion.capture.snapshot import Column, table_schema_at_snapshot
from pgmedallion.silver.cast_columns import CAST_ERRORS_COLUMN, cast_values, plain_cast
from pgmedallion.silver.cast_columns import UNSETTLED_COLUMN as SUSPECT_COLUMN
from pgmedallion.silver.kernel import cast_rows
from pgmedallion.silver.pgtypes import (
    ARRAY_ELEMENT,
    INTERVAL,
    NON_COMMA_DELIMITED,
    NUMERIC,
    PgType,
    override_problem,
    pg_type_of,
    spark_type,
)

INTERVAL_TYPE = spark_type(PgType(INTERVAL))
UNCONSTRAINED_NUMERIC = spark_type(PgType(NUMERIC))
INF, NAN = float("inf"), float("nan")
BIG_TEXT = ('größe ☃\tTab\nNewline\\Back "quoted" {a,b} NULL \\N ' * 500)[:20_000]
ALL_BYTES = bytes(range(256))
ARRAY_TEXTS = ["a b", 'c"d', None, "NULL", "", "x\\y", "tab\there\nnl", "☃", "{}", " lead", "null"]


def interval(months: int, days: int, microseconds: int) -> Row:
    return Row(months=months, days=days, microseconds=microseconds)


def numeric(precision: int, scale: int) -> str:
    return f"numeric({precision},{scale})"


# (column, PostgreSQL type, Spark type, four input values, the four values expected in Spark)
TYPES = [
    ("b", "bool", BooleanType(), ["t", "f", "true", "no"], [True, False, True, False]),
    ("i2", "int2", ShortType(), ["-32768", "32767", "0", "-1"], [-32768, 32767, 0, -1]),
    (
        "i4",
        "int4",
        IntegerType(),
        ["-2147483648", "2147483647", "0", "7"],
        [-(2**31), 2**31 - 1, 0, 7],
    ),
    (
        "i8",
        "int8",
        LongType(),
        [str(-(2**63)), str(2**63 - 1), "0", "-5"],
        [-(2**63), 2**63 - 1, 0, -5],
    ),
    ("o", "oid", LongType(), ["0", "4294967295", "16384", "1"], [0, 4294967295, 16384, 1]),
    (
        "f4",
        "float4",
        FloatType(),
        ["NaN", "-0", "3.4028235e38", "-Infinity"],
        [NAN, -0.0, 3.4028235e38, -INF],
    ),
    (
        "f8",
        "float8",
        DoubleType(),
        ["Infinity", "-0", "1.7976931348623157e308", "5e-324"],
        [INF, -0.0, 1.7976931348623157e308, 5e-324],
    ),
    (
        "n",
        numeric(12, 2),
        DecimalType(12, 2),
        ["9999999999.99", "-0.01", "0", "12.5"],
        [Decimal("9999999999.99"), Decimal("-0.01"), Decimal(0), Decimal("12.5")],
    ),
    (
        "nu",
        "numeric",
        UNCONSTRAINED_NUMERIC,
        [
            "12345678901234567890.123456789012345678",
            "-0.000000000000000001",
            "1.50000000000000000000000",
            "-99999999999999999999",
        ],
        [
            Decimal("12345678901234567890.123456789012345678"),
            Decimal("-0.000000000000000001"),
            Decimal("1.5"),
            Decimal("-99999999999999999999"),
        ],
    ),
    (
        "nneg",
        numeric(3, -2),
        DecimalType(5, 0),
        ["12345", "-99900", "0", "50"],
        [Decimal(12300), Decimal(-99900), Decimal(0), Decimal(100)],
    ),
    (
        "nsmall",
        numeric(3, 5),
        DecimalType(5, 5),
        ["0.00123", "-0.00999", "0", "0.000001"],
        [Decimal("0.00123"), Decimal("-0.00999"), Decimal(0), Decimal(0)],
    ),
    (
        "nbig",
        numeric(50, 10),
        DecimalType(38, 10),
        ["1234567890123456789012345678.0123456789", "0", "-1", "0.5"],
        [
            Decimal("1234567890123456789012345678.0123456789"),
            Decimal(0),
            Decimal(-1),
            Decimal("0.5"),
        ],
    ),
    ("t", "text", StringType(), [BIG_TEXT, "", "NULL", "\\N"], [BIG_TEXT, "", "NULL", "\\N"]),
    ("vc", "varchar(10)", StringType(), ["héllo", " ", "a\\b", "x"], ["héllo", " ", "a\\b", "x"]),
    ("bp", "char(5)", StringType(), ["ab", "", "abcde", "ä"], ["ab   ", "     ", "abcde", "ä    "]),
    ("c", '"char"', StringType(), ["x", "y", "z", "w"], ["x", "y", "z", "w"]),
    ("nm", "name", StringType(), ["Größe", "a b", "x", "y"], ["Größe", "a b", "x", "y"]),
    (
        "by",
        "bytea",
        BinaryType(),
        [b"\x00\xff\x00", b"", b"\x00", ALL_BYTES],
        [bytearray(b"\x00\xff\x00"), bytearray(), bytearray(b"\x00"), bytearray(ALL_BYTES)],
    ),
    (
        "d",
        "date",
        DateType(),
        ["2024-02-29", "0001-01-01", "9999-12-31", "1970-01-01"],
        [date(2024, 2, 29), date(1, 1, 1), date(9999, 12, 31), date(1970, 1, 1)],
    ),
    (
        "ts",
        "timestamp",
        TimestampNTZType(),
        [
            "2024-01-02 03:04:05.123456",
            "0001-01-01 00:00:00",
            "9999-12-31 23:59:59.999999",
            "2000-01-01 00:00:00.5",
        ],
        [
            datetime(2024, 1, 2, 3, 4, 5, 123456),
            datetime(1, 1, 1),
            datetime(9999, 12, 31, 23, 59, 59, 999999),
            datetime(2000, 1, 1, 0, 0, 0, 500000),
        ],
    ),
    (
        "tstz",
        "timestamptz",
        TimestampType(),
        [
            "2024-01-02 03:04:05.123456+00",
            "2024-06-30 23:59:59-07",
            "1900-01-01 00:00:00+00",
            "2038-01-19 03:14:08+00",
        ],
        [
            datetime(2024, 1, 2, 3, 4, 5, 123456),
            datetime(2024, 7, 1, 6, 59, 59),
            datetime(1900, 1, 1),
            datetime(2038, 1, 19, 3, 14, 8),
        ],
    ),
    (
        "tm",
        "time",
        StringType(),
        ["24:00:00", "13:14:15.5", "00:00:00", "23:59:59.999999"],
        ["24:00:00", "13:14:15.5", "00:00:00", "23:59:59.999999"],
    ),
    (
        "ttz",
        "timetz",
        StringType(),
        ["13:14:15+05:30", "00:00:00-12", "01:02:03.25+00", "12:00:00+14"],
        ["13:14:15+05:30", "00:00:00-12", "01:02:03.25+00", "12:00:00+14"],
    ),
    (
        "iv",
        "interval",
        INTERVAL_TYPE,
        [
            "1 year 2 mons 3 days 04:05:06.789",
            "-1 days 2 hours",
            "-0.5 seconds",
            "2562047788:00:54.775807",
        ],
        [
            interval(14, 3, 14_706_789_000),
            interval(0, -1, 7_200_000_000),
            interval(0, 0, -500_000),
            interval(0, 0, 2**63 - 1),
        ],
    ),
    (
        "u",
        "uuid",
        StringType(),
        ["A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11", "00000000-0000-0000-0000-000000000000"] * 2,
        ["a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "00000000-0000-0000-0000-000000000000"] * 2,
    ),
    (
        "j",
        "json",
        StringType(),
        ['{"b": 1,  "a": [1,2]}', "[]", '"x\\ty"', "null"],
        ['{"b": 1,  "a": [1,2]}', "[]", '"x\\ty"', "null"],
    ),
    (
        "jb",
        "jsonb",
        StringType(),
        ['{"b": 1,  "a": [1,2]}', "[]", '"x\\ty"', '{"k": "☃"}'],
        ['{"a": [1, 2], "b": 1}', "[]", '"x\\ty"', '{"k": "☃"}'],
    ),
    ("e", "mood", StringType(), ["happy ☃", "sad", "ok", "sad"], ["happy ☃", "sad", "ok", "sad"]),
    ("dom", "positive_int", IntegerType(), ["7", "1", "2147483647", "3"], [7, 1, 2**31 - 1, 3]),
    (
        "dprice",
        "price",
        DecimalType(12, 2),  # the domain's modifier: its column's typmod is -1
        ["12.34", "0.1", "-5", "9999999999.99"],
        [Decimal("12.34"), Decimal("0.1"), Decimal(-5), Decimal("9999999999.99")],
    ),
    ("ip", "inet", StringType(), ["192.168.0.1/24", "::1", "10.1.2.3", "2001:db8::/32"], None),
    ("cid", "cidr", StringType(), ["10/8", "::/0", "192.168.1.0/24", "2001:db8::/32"], None),
    ("mac", "macaddr", StringType(), ["08:00:2b:01:02:03", "08002b010203"] * 2, None),
    ("mac8", "macaddr8", StringType(), ["08:00:2b:01:02:03:04:05"] * 4, None),
    ("m", "money", StringType(), ["1234.5", "-0.01", "0", "1000000"], None),
    ("bt", "bit(4)", StringType(), ["1010", "0000", "1111", "0101"], None),
    ("vb", "varbit", StringType(), ["101", "", "1", "0000000011"], None),
    ("tsv", "tsvector", StringType(), ["a fat rat", "", "x:1", "'a b'"], None),
    ("tsq", "tsquery", StringType(), ["fat & rat", "a | !b", "x", "y <-> z"], None),
    ("r", "int4range", StringType(), ["[1,5)", "empty", "(,3]", "[2,2]"], None),
    ("pt", "point", StringType(), ["(1,2)", "(-1.5,0)", "(0,0)", "(1e300,2)"], None),
    ("ai", "int[]", ArrayType(IntegerType()), ["{1,2,NULL}", "{}", "{-2147483648}", "{7}"], None),
    ("at", "text[]", ArrayType(StringType()), [ARRAY_TEXTS, [], [None], ["\\", '"']], None),
    ("an", "numeric(12,2)[]", ArrayType(DecimalType(12, 2)), ["{1.5,NULL,-0.01}", "{}"] * 2, None),
    ("ab", "bool[]", ArrayType(BooleanType()), ["{t,f,NULL}", "{}", "{f}", "{NULL}"], None),
    ("af", "float8[]", ArrayType(DoubleType()), ["{-Infinity,-0,1.5}", "{NaN}", "{}", "{0}"], None),
    (
        "ad",
        "date[]",
        ArrayType(DateType()),
        ["{2024-01-02,NULL}", "{}", "{0001-01-01}", "{}"],
        None,
    ),
    ("ats", "timestamp[]", ArrayType(TimestampNTZType()), ['{"2024-01-02 03:04:05"}'] * 4, None),
    ("atz", "timestamptz[]", ArrayType(TimestampType()), ['{"2024-01-02 03:04:05+00"}'] * 4, None),
    ("aby", "bytea[]", ArrayType(BinaryType()), [[b"\x00\xff", b""], [], [None], [b"\\"]], None),
    ("au", "uuid[]", ArrayType(StringType()), ["{A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11}"] * 4, None),
    (
        "ajb",
        "jsonb[]",
        ArrayType(StringType()),
        [['{"a": "x,y"}', "[1, 2]"], [], ["null"], []],
        None,
    ),
    ("ae", "mood[]", ArrayType(StringType()), ['{"happy ☃",sad}', "{}", "{NULL}", "{ok}"], None),
    ("aiv", "interval[]", ArrayType(INTERVAL_TYPE), ['{"1 mon","-1 days"}', "{}"] * 2, None),
    ("adom", "positive_int[]", ArrayType(IntegerType()), ["{1,NULL}", "{}", "{2}", "{3}"], None),
    ("dlist", "int_list", ArrayType(IntegerType()), ["{1,2}", "{}", "{NULL}", "{3}"], None),
    ("abox", "box[]", StringType(), ["{(1,1),(0,0);(2,2),(0,0)}"] * 4, None),
]

# What PostgreSQL writes for the inputs whose text differs from the input.
EXPECTED_TEXT = {
    "cid": ["10.0.0.0/8", "::/0", "192.168.1.0/24", "2001:db8::/32"],
    "mac": ["08:00:2b:01:02:03"] * 4,
    "m": ["$1,234.50", "-$0.01", "$0.00", "$1,000,000.00"],
    "tsv": ["'a' 'fat' 'rat'", "", "'x':1", "'a b'"],
    "tsq": ["'fat' & 'rat'", "'a' | !'b'", "'x'", "'y' <-> 'z'"],
    "r": ["[1,5)", "empty", "(,4)", "[2,3)"],
    "pt": ["(1,2)", "(-1.5,0)", "(0,0)", "(1e+300,2)"],
    "abox": ["{(1,1),(0,0);(2,2),(0,0)}"] * 4,
}

ARRAY_VALUES = {
    "ai": [[1, 2, None], [], [-(2**31)], [7]],
    "at": [ARRAY_TEXTS, [], [None], ["\\", '"']],
    "an": [[Decimal("1.5"), None, Decimal("-0.01")], []] * 2,
    "ab": [[True, False, None], [], [False], [None]],
    "af": [[-INF, -0.0, 1.5], [NAN], [], [0.0]],
    "ad": [[date(2024, 1, 2), None], [], [date(1, 1, 1)], []],
    "ats": [[datetime(2024, 1, 2, 3, 4, 5)]] * 4,
    "atz": [[datetime(2024, 1, 2, 3, 4, 5)]] * 4,
    "aby": [[bytearray(b"\x00\xff"), bytearray()], [], [None], [bytearray(b"\\")]],
    "au": [["a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"]] * 4,
    "ajb": [['{"a": "x,y"}', "[1, 2]"], [], ["null"], []],
    "ae": [["happy ☃", "sad"], [], [None], ["ok"]],
    "aiv": [[interval(1, 0, 0), interval(0, -1, 0)], []] * 2,
    "adom": [[1, None], [], [2], [3]],
    "dlist": [[1, 2], [], [None], [3]],
}


def expected_values(name: str, inputs: list, expected: list | None) -> list:
    if expected is not None:
        return expected
    if name in ARRAY_VALUES:
        return ARRAY_VALUES[name]
    return EXPECTED_TEXT.get(name, inputs)


def create_types(conn: psycopg.Connection) -> None:
    conn.execute("CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy ☃')")
    conn.execute("CREATE DOMAIN positive_int AS int CHECK (VALUE > 0)")
    conn.execute("CREATE DOMAIN price AS numeric(12,2)")
    conn.execute("CREATE DOMAIN int_list AS int[]")


def create_table(conn: psycopg.Connection, table: str, columns: list[tuple[str, str]]) -> int:
    conn.execute(
        sql.SQL("CREATE TABLE {} (id int, {})").format(
            sql.Identifier(table),
            sql.SQL(", ").join(
                sql.SQL("{} {}").format(sql.Identifier(name), sql.SQL(type_sql))
                for name, type_sql in columns
            ),
        )
    )
    (oid,) = conn.execute("SELECT quote_ident(%s)::regclass::oid::int8", (table,)).fetchone()
    return oid


def insert(conn: psycopg.Connection, table: str, types: list[str], rows: list[list]) -> None:
    """Each value goes in as a parameter cast to its column's type, so PostgreSQL parses it."""
    query = sql.SQL("INSERT INTO {} VALUES (%s, {})").format(
        sql.Identifier(table),
        sql.SQL(", ").join(sql.SQL("%s::" + type_sql) for type_sql in types),
    )
    for row_id, row in enumerate(rows, start=1):
        conn.execute(query, [row_id, *row])


def read_as_text(conninfo, table: str) -> list[tuple[int, list[str | None]]]:
    """The table's rows as COPY TEXT, decoded: exactly the text silver gets from bronze."""
    conn = connect(conninfo)
    query = sql.SQL("COPY (SELECT * FROM {} ORDER BY id) TO STDOUT").format(sql.Identifier(table))
    with conn.cursor() as cursor, cursor.copy(query) as copy:
        rows = [decode_copy_row(bytes(raw)) for raw in copy]
    conn.close()
    return [(int(row[0]), row[1:]) for row in rows]


def schema_types(conninfo, oid: int) -> list[tuple[str, PgType]]:
    conn = connect(conninfo)
    schema = table_schema_at_snapshot(conn, oid)
    conn.close()
    return [(column.name, pg_type_of(column)) for column in schema.columns[1:]]


def text_frame(spark, rows: list[tuple[int, list[str | None]]]):
    return spark.createDataFrame(rows, "id int, payload array<string>")


def test_builtin_oids_match_the_server(db):
    conn = connect(db)
    named = {16: "bool", 17: "bytea", 20: "int8", 21: "int2", 23: "int4", 25: "text"}
    named |= {26: "oid", 114: "json", 3802: "jsonb", 700: "float4", 701: "float8"}
    named |= {1700: "numeric", 1082: "date", 1114: "timestamp", 1184: "timestamptz"}
    named |= {1083: "time", 1266: "timetz", 1186: "interval", 2950: "uuid", 1042: "bpchar"}
    named |= {1043: "varchar", 18: "char", 19: "name"}
    rows = conn.execute(
        "SELECT a.oid::int8, a.typname, a.typelem::int8, e.typdelim FROM pg_type a"
        " LEFT JOIN pg_type e ON e.oid = a.typelem WHERE a.oid = ANY(%s)",
        (list(named) + list(ARRAY_ELEMENT),),
    ).fetchall()
    by_oid = {oid: (name, element, delimiter) for oid, name, element, delimiter in rows}
    assert {oid: by_oid[oid][0] for oid in named} == named
    assert {oid: by_oid[oid][1] for oid in ARRAY_ELEMENT} == dict(ARRAY_ELEMENT)
    # array_out separates elements with the element type's typdelim
    semicolons = {by_oid[oid][1] for oid in ARRAY_ELEMENT if by_oid[oid][2] != ","}
    assert semicolons == set(NON_COMMA_DELIMITED)


@pytest.mark.parametrize(
    ("pg_type", "expected"),
    [
        (PgType(1700, (12 << 16 | 2) + 4), DecimalType(12, 2)),
        (PgType(1700, (38 << 16 | 0) + 4), DecimalType(38, 0)),
        (PgType(1700, (3 << 16 | (-2 & 0x7FF)) + 4), DecimalType(5, 0)),
        (PgType(1700, (3 << 16 | 5) + 4), DecimalType(5, 5)),
        (PgType(1700, (50 << 16 | 10) + 4), DecimalType(38, 10)),
        (PgType(1700, (1000 << 16 | 900) + 4), DecimalType(38, 38)),
        (PgType(1700), DecimalType(38, 18)),
        (PgType(1231, (12 << 16 | 2) + 4), ArrayType(DecimalType(12, 2))),
        (PgType(16390, category="E", type_name="mood"), StringType()),
        (PgType(16391, category="A", element_type_oid=16390), ArrayType(StringType())),
        (PgType(16392, category="A"), ArrayType(StringType())),
        (
            PgType(16393, base_type_oid=1016, category="A", element_type_oid=20),
            ArrayType(LongType()),
        ),
        (PgType(16394, base_type_oid=1184, category="D"), TimestampType()),
        (PgType(19, element_type_oid=18), StringType()),
        (PgType(600, element_type_oid=701, category="G"), StringType()),
        (PgType(1020), StringType()),
        (PgType(1187), ArrayType(INTERVAL_TYPE)),
        (PgType(26), LongType()),
        (PgType(3904), StringType()),
        (PgType(999_999), StringType()),
    ],
)
def test_spark_type_mapping(pg_type, expected):
    assert spark_type(pg_type) == expected


def test_pg_type_of_snapshot_columns_and_dicts(db):
    conn = connect(db)
    create_types(conn)
    conn.execute("CREATE DOMAIN positive_ints AS int_list")
    conn.execute("CREATE DOMAIN cheap AS price CHECK (VALUE < 100)")  # a domain over a domain
    columns = [("a", "price"), ("b", "int_list"), ("c", "positive_int[]"), ("d", "mood[]")]
    columns += [("e", "mood"), ("f", "name"), ("g", "numeric(10,3)[]"), ("h", "positive_ints")]
    columns += [("i", "cheap"), ("j", "int4[][]"), ("k", "text[][][]")]
    oid = create_table(conn, "kinds", columns)
    schema = table_schema_at_snapshot(conn, oid)
    (mood,) = conn.execute("SELECT 'mood'::regtype::oid::int8").fetchone()
    got = {c.name: (c.base_type_oid, c.element_type_oid, c.category) for c in schema.columns}
    assert got == {
        "id": (0, 0, "N"),
        "a": (1700, 0, "N"),
        "b": (1007, 23, "A"),
        "c": (0, 23, "A"),
        "d": (0, mood, "A"),
        "e": (0, 0, "E"),
        "f": (0, 0, "S"),
        "g": (0, 1700, "A"),
        "h": (1007, 23, "A"),
        "i": (1700, 0, "N"),
        "j": (0, 23, "A"),
        "k": (0, 25, "A"),
    }
    dims = {
        c.name: (c.typmod, c.domain_typmod, c.dims) for c in schema.columns if c.name in "ghijk"
    }
    numeric_12_2 = ((12 << 16) | 2) + 4
    assert dims == {
        "g": (((10 << 16) | 3) + 4, -1, 1),
        "h": (-1, -1, 0),
        "i": (-1, numeric_12_2, 0),
        "j": (-1, -1, 2),
        "k": (-1, -1, 3),
    }
    types = {c.name: spark_type(pg_type_of(c)) for c in schema.columns}
    assert types == {
        "id": IntegerType(),
        "a": DecimalType(12, 2),
        "b": ArrayType(IntegerType()),
        "c": ArrayType(IntegerType()),
        "d": ArrayType(StringType()),
        "e": StringType(),
        "f": StringType(),
        "g": ArrayType(DecimalType(10, 3)),
        "h": ArrayType(IntegerType()),
        "i": DecimalType(12, 2),
        "j": ArrayType(ArrayType(IntegerType())),
        "k": ArrayType(ArrayType(ArrayType(StringType()))),
    }
    as_dict = {"type_oid": 1700, "typmod": (10 << 16 | 3) + 4, "type_name": "numeric(10,3)"}
    assert pg_type_of(as_dict) == PgType(1700, (10 << 16 | 3) + 4, "numeric(10,3)")
    assert pg_type_of(Column("x", 23, -1, False, "integer", False)) == PgType(23, -1, "integer")


def test_every_type_casts_from_postgres_text(spark, db):
    conn = connect(db)
    create_types(conn)
    oid = create_table(conn, "every type", [(name, type_sql) for name, type_sql, *_ in TYPES])
    rows = [[inputs[i] for _, _, _, inputs, _ in TYPES] for i in range(4)]
    insert(conn, "every type", [type_sql for _, type_sql, *_ in TYPES], rows)
    conn.execute('INSERT INTO "every type" (id) VALUES (5)')
    texts = read_as_text(db, "every type")
    columns = schema_types(db, oid)
    assert [name for name, _ in columns] == [name for name, *_ in TYPES]

    got = cast_values(text_frame(spark, texts), "payload", columns).orderBy("id")

    schema = StructType(
        [StructField("id", IntegerType())]
        + [StructField(name, target) for name, _, target, _, _ in TYPES]
    )
    values = [expected_values(name, inputs, exp) for name, _, _, inputs, exp in TYPES]
    expected_rows = [(i + 1, *(column[i] for column in values)) for i in range(4)]
    expected_rows.append((5, *([None] * len(TYPES))))
    expected = spark.createDataFrame(expected_rows, schema)
    # the 20 kB text is compared on its own: a failure report with it would be unreadable
    assert_df_equality(
        got.drop(CAST_ERRORS_COLUMN),
        expected,
        ignore_nullable=True,
        allow_nan_equality=True,
        ignore_columns=["t"],
    )
    collected = got.collect()
    assert [row["t"] for row in collected] == [BIG_TEXT, "", "NULL", "\\N", None]
    assert [row[CAST_ERRORS_COLUMN] for row in collected] == [[]] * 5
    # -0.0 == 0.0 in Python, so the sign of negative zero gets its own check
    assert math.copysign(1, collected[1]["f4"]) == -1
    assert math.copysign(1, collected[1]["f8"]) == -1
    assert math.copysign(1, collected[0]["af"][1]) == -1
    assert texts[0][1][[name for name, *_ in TYPES].index("bp")] == "ab   "


ERROR_COLUMNS = [
    ("n", "numeric(12,2)"),
    ("nu", "numeric"),
    ("d", "date"),
    ("ts", "timestamp"),
    ("tz", "timestamptz"),
    ("iv", "interval"),
    ("ai", "int[]"),
    ("an", "numeric(12,2)[]"),
    ("g", "text"),
]
ERROR_ROWS = [
    [
        "NaN",
        "1e30",
        "0044-03-15 BC",
        "infinity",
        "-infinity",
        "infinity",
        "{{1,2},{3,4}}",
        "{1,NaN}",
        "12x",
    ],
    [
        "1.5",
        "1e-19",
        "infinity",
        "0044-03-15 10:00 BC",
        "294276-01-01 00:00+00",
        "1 day",
        "[0:1]={1,2}",
        "{NaN,NaN,1}",
        "99999999999",
    ],
    [
        "-0.5",
        "Infinity",
        "10000-01-01",
        "2024-01-02",
        "0001-01-01 00:00+00 BC",
        "-infinity",
        "{1}",
        "{}",
        "-1",
    ],
]


def test_values_that_do_not_fit_are_errors_not_nulls(spark, db):
    conn = connect(db)
    oid = create_table(conn, "errs", ERROR_COLUMNS)
    insert(conn, "errs", [type_sql for _, type_sql in ERROR_COLUMNS], ERROR_ROWS)
    texts = read_as_text(db, "errs")
    columns = schema_types(db, oid)
    columns[-1] = ("g", PgType(23, type_name="integer"))  # PostgreSQL never writes '12x' for int
    # infinities are errors only by choice (the default clamps them, see test_declared_...)
    columns = [(n, replace(t, infinity="error")) for n, t in columns]

    got = cast_values(text_frame(spark, texts), "payload", columns).orderBy("id").collect()

    def errors(row: Row) -> list[tuple[str, str, str]]:
        return [(e.column_name, e.raw, e.message) for e in row[CAST_ERRORS_COLUMN]]

    assert errors(got[0]) == [
        ("n", "NaN", "numeric NaN does not fit DecimalType(12,2)"),
        ("nu", "1000000000000000000000000000000", "numeric value does not fit DecimalType(38,18)"),
        ("d", "0044-03-15 BC", "date BC is outside DateType's range (years 1 to 9999)"),
        (
            "ts",
            "infinity",
            "timestamp infinity is outside TimestampNTZType's range (years 1 to 9999)",
        ),
        (
            "tz",
            "-infinity",
            "timestamptz -infinity is outside TimestampType's range (years 1 to 9999)",
        ),
        ("iv", "infinity", "interval infinity has no Spark representation"),
        ("ai", "{{1,2},{3,4}}", "multi-dimensional arrays are not supported"),
        ("an", "{1.00,NaN}", "element 2: numeric NaN does not fit DecimalType(12,2)"),
        ("g", "12x", "invalid integer text"),
    ]
    assert [got[0][name] for name, _ in ERROR_COLUMNS] == [None] * len(ERROR_COLUMNS)
    assert errors(got[1]) == [
        ("d", "infinity", "date infinity is outside DateType's range (years 1 to 9999)"),
        (
            "ts",
            "0044-03-15 10:00:00 BC",
            "timestamp BC is outside TimestampNTZType's range (years 1 to 9999)",
        ),
        (
            "tz",
            "294276-01-01 00:00:00+00",
            "timestamptz after year 9999 is outside TimestampType's range (years 1 to 9999)",
        ),
        ("ai", "[0:1]={1,2}", "arrays with a lower bound other than 1 are not supported"),
        (
            "an",
            "{NaN,NaN,1.00}",
            "element 1: numeric NaN does not fit DecimalType(12,2) (and 1 more)",
        ),
        ("g", "99999999999", "integer out of range for IntegerType"),
    ]
    # the row's other values still cast; an unconstrained numeric's extra decimals round
    assert (got[1]["n"], got[1]["iv"]) == (Decimal("1.50"), interval(0, 1, 0))
    assert got[1]["nu"] == Decimal("0E-18")
    assert [e.column_name for e in got[2][CAST_ERRORS_COLUMN]] == ["nu", "d", "tz", "iv"]
    assert (
        got[2][CAST_ERRORS_COLUMN][0].message == "numeric Infinity does not fit DecimalType(38,18)"
    )
    assert (got[2]["n"], got[2]["ts"], got[2]["ai"], got[2]["an"], got[2]["g"]) == (
        Decimal("-0.50"),
        datetime(2024, 1, 2),
        [1],
        [],
        -1,
    )


def test_malformed_text_and_missing_values(spark):
    columns = [
        ("b", PgType(16)),
        ("f", PgType(700)),
        ("by", PgType(17)),
        ("d", PgType(1082)),
        ("iv", PgType(1186)),
        ("at", PgType(1009)),
        ("ai", PgType(1007)),
    ]
    rows = [
        (1, ["yes", "1e39", "\\x0", "2024-02-30", "1 fortnight", '{"a"b}', "{1,,2}"]),
        (2, ["t", "1.5", "\\x00"]),
        (3, None),
    ]
    got = cast_values(text_frame(spark, rows), "payload", columns).orderBy("id").collect()
    messages = [[(e.column_name, e.message) for e in row[CAST_ERRORS_COLUMN]] for row in got]
    assert messages[0] == [
        ("b", "invalid boolean text"),
        ("f", "floating-point value out of range for FloatType"),
        ("by", "invalid bytea text (expected \\x hex)"),
        ("d", "invalid date"),
        ("iv", "invalid interval text"),
        ("at", "invalid array literal"),
        ("ai", "invalid array literal"),
    ]
    assert messages[1] == [
        ("d", "no value at position 3"),
        ("iv", "no value at position 4"),
        ("at", "no value at position 5"),
        ("ai", "no value at position 6"),
    ]
    assert (got[1]["b"], got[1]["f"], got[1]["by"]) == (True, 1.5, bytearray(b"\x00"))
    assert len(messages[2]) == len(columns)


PLAIN_COLUMNS = [
    ("i", PgType(23)),
    ("n", PgType(1700, typmod=(12 << 16 | 2) + 4)),
    ("nu", PgType(1700)),
    ("f", PgType(701)),
    ("b", PgType(16)),
    ("d", PgType(1082)),
    ("tz", PgType(1184)),
    ("t", PgType(25)),
    ("at", PgType(1009, element_type_oid=25, category="A")),
]
PLAIN_ROWS = [
    # (id, texts, suspect): the plain values settle a row of canonical texts on their own
    (
        1,
        ["1", "12.50", None, "NaN", "t", "2024-02-29", "2024-01-01 10:00:00+00", "x", '{a,"b c"}'],
        False,
    ),
    (2, ["-7", "-0.05", None, "-0", "f", None, None, "", "{}"], False),
    (3, [None] * 9, False),
    # texts that cast cleanly though PostgreSQL writes them otherwise; values a declared rule
    # adjusts (rounded, clamped: counted from the unsettled rows); errors
    (4, ["1", "12.5", None, None, None, None, None, None, None], False),  # not numeric's form
    (5, ["1", None, "1.5", None, None, None, None, None, None], False),  # unconstrained numeric
    (12, ["1", None, "0.12345678901234567890", None, None, None, None, None, None], True),
    (6, ["1", None, None, None, None, None, None, None, "{a,NULL}"], False),
    (7, ["1", "NaN", None, None, None, None, None, None, None], True),
    (8, ["x1", None, None, None, None, None, None, None, None], True),
    (9, ["1", None, None, None, None, "infinity", None, None, None], True),
    (10, ["1", "1.00"], True),  # too few values
    (11, None, True),
]


def test_plain_cast_settles_exactly_what_it_can(spark):
    """A row plain_cast does not mark suspect gets exactly cast_values' typed columns, and every
    row with a cast error or an adjusted value is suspect."""
    df = text_frame(spark, [(i, texts) for i, texts, _ in PLAIN_ROWS])
    staged = plain_cast(df, "payload", PLAIN_COLUMNS)
    assert staged is not None
    names = [name for name, _ in PLAIN_COLUMNS]
    assert staged.columns == ["id", *names, "payload", SUSPECT_COLUMN]
    suspect = {r["id"]: r[SUSPECT_COLUMN] for r in staged.collect()}
    assert suspect == {i: expected for i, _, expected in PLAIN_ROWS}
    # suspect rows keep their texts for the full cast, the others do not
    kept = {r["id"]: r["payload"] for r in staged.collect()}
    assert {i for i, texts in kept.items() if texts is not None} == {
        i for i, _, s in PLAIN_ROWS if s and i != 11
    }

    full = cast_values(df, "payload", PLAIN_COLUMNS)
    clean = [r["id"] for r in full.collect() if not r[CAST_ERRORS_COLUMN]]
    # 4, 6, 9 and 12 cast cleanly through the full cast (12 rounded, 9's infinity clamped)
    assert set(clean) == {1, 2, 3, 4, 5, 6, 9, 12}
    assert_df_equality(
        staged.where(~staged[SUSPECT_COLUMN]).select("id", *names),
        full.where("id IN (1, 2, 3, 4, 5, 6)").select("id", *names),
        ignore_nullable=True,
        allow_nan_equality=True,
        ignore_row_order=True,
    )
    first = staged.where("id = 1").first()
    assert (first["n"], first["at"]) == (Decimal("12.50"), ["a", "b c"])
    assert math.isnan(staged.where("id = 1").select("f").first()[0]) is True
    # every type has its plain half (interval too); a column named like the texts has none
    assert plain_cast(df, "payload", [*PLAIN_COLUMNS, ("iv", PgType(1186))]) is not None
    assert plain_cast(df, "payload", [("payload", PgType(25))]) is None


def test_hostile_column_names_and_column_order(spark):
    names = ["a.b", 'q"uote', "back`tick", "space name", "☃", "payload"]
    columns = [(name, PgType(23)) for name in names]
    df = spark.createDataFrame(
        [("k", [str(i) for i in range(6)], 1.5)], "`x.y` string, v array<string>, `z` double"
    )
    got = cast_values(df, "v", columns)
    assert got.columns == ["x.y", *names, "z", CAST_ERRORS_COLUMN]
    assert got.collect()[0][1:7] == tuple(range(6))
    assert cast_values(df, "v", []).columns == ["x.y", "z", CAST_ERRORS_COLUMN]
    with pytest.raises(ValueError, match="duplicate"):
        cast_values(df, "v", [("z", PgType(23))])


def test_huge_arrays_and_long_escaped_elements(spark, db):
    conn = connect(db)
    (literal,) = conn.execute(
        "SELECT array_agg(CASE WHEN i % 1000 = 0 THEN repeat(E'\"\\\\,', 5000) ELSE i::text END"
        " ORDER BY i)::text FROM generate_series(1, 50000) i"
    ).fetchone()
    got = cast_values(text_frame(spark, [(1, [literal])]), "payload", [("a", PgType(1009))])
    row = got.collect()[0]
    assert row[CAST_ERRORS_COLUMN] == []
    assert len(row["a"]) == 50000
    assert row["a"][:2] == ["1", "2"]
    assert row["a"][999] == '"\\,' * 5000


ELEMENT_TEXT = st.one_of(
    st.none(),
    st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=8),
    st.sampled_from(["NULL", "null", "", " ", '"', "\\", ",", "{", "}", "{}", "a,b", '\\"', "\t"]),
)


@settings(
    max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(arrays=st.lists(st.lists(ELEMENT_TEXT, max_size=8), min_size=1, max_size=8))
def test_postgres_text_array_literals_parse_back(spark, db, arrays):
    conn = connect(db)
    literals = [conn.execute("SELECT %s::text[]::text", (array,)).fetchone()[0] for array in arrays]
    conn.close()
    rows = [(i, [literal]) for i, literal in enumerate(literals)]
    got = cast_values(text_frame(spark, rows), "payload", [("a", PgType(1009))]).orderBy("id")
    assert [(row["a"], row[CAST_ERRORS_COLUMN]) for row in got.collect()] == [
        (array, []) for array in arrays
    ]


def test_declared_adjustments_and_overrides(spark):
    """Rounding of numerics wider than their Spark decimal, each infinity policy, and type
    overrides: the values are the declared ones (Spark's own CAST rounding, half up), no
    error, and the kernel tells silver which values to count."""
    ts, tz, d = PgType(1114), PgType(1184), PgType(1082)
    columns = [
        ("nu", PgType(1700)),
        ("wide", PgType(1700, typmod=(60 << 16 | 40) + 4)),  # numeric(60,40)
        ("ratio", PgType(1700, target="decimal(38,30)")),
        ("as_text", PgType(1700, target="string")),
        ("as_double", PgType(1700, target="double")),
        ("big", PgType(23, target="bigint")),
        ("clamp", ts),
        ("nulled", replace(tz, infinity="null")),
        ("day", d),
    ]
    rows = [
        (
            1,
            [
                "0.14285714285714285714",
                "0." + "5" * 40,
                "0.142857142857142857142857142857142857",
                "0.14285714285714285714",
                "0.25",
                "7",
                "infinity",
                "infinity",
                "-infinity",
            ],
        ),
        (
            2,
            [
                "-0.99999999999999999999",
                "0.5",
                "1",
                "1.10",
                "NaN",
                "-7",
                "-infinity",
                "-infinity",
                "2024-02-29",
            ],
        ),
        (3, ["2", "0.25", "2", None, "1e3", None, "2024-01-01 00:00:00", None, "infinity"]),
    ]
    full = cast_values(text_frame(spark, rows), "payload", columns).orderBy("id").collect()
    assert [r[CAST_ERRORS_COLUMN] for r in full] == [[], [], []]
    first, second, third = full
    assert first["nu"] == Decimal("0.142857142857142857")
    assert second["nu"] == Decimal("-1.000000000000000000")
    assert first["wide"] == Decimal("0." + "5" * 37 + "6")  # numeric(60,40): decimal(38,38)
    assert first["ratio"] == Decimal("0.142857142857142857142857142857")
    assert (first["as_text"], second["as_text"]) == ("0.14285714285714285714", "1.10")
    assert first["as_double"] == 0.25 and math.isnan(second["as_double"])
    assert third["as_double"] == 1000.0
    assert (first["big"], second["big"]) == (7, -7)
    assert first["clamp"] == datetime(9999, 12, 31, 23, 59, 59, 999999)
    assert second["clamp"] == datetime(1, 1, 1)
    assert (first["nulled"], second["nulled"]) == (None, None)
    assert (first["day"], second["day"], third["day"]) == (
        date(1, 1, 1),
        date(2024, 2, 29),
        date(9999, 12, 31),
    )
    # the plain half leaves every adjusted value to the full cast, and settles the rest
    staged = plain_cast(text_frame(spark, rows), "payload", columns)
    assert {r["id"]: r[SUSPECT_COLUMN] for r in staged.collect()} == {1: True, 2: True, 3: True}
    values = pa.array([texts for _, texts in rows], pa.list_(pa.string()))
    found = cast_rows(values, columns).adjustments([0] * len(rows))
    counted = {(name, code): count for name, code, count, _, _ in found}
    assert counted == {
        ("nu", "Rounded"): 2,
        ("wide", "Rounded"): 1,
        ("ratio", "Rounded"): 1,
        ("clamp", "Clamped"): 2,
        ("nulled", "Nulled"): 2,
        ("day", "Clamped"): 2,
    }
    assert spark_type(PgType(1700, target="decimal(38,30)")) == DecimalType(38, 30)


@pytest.mark.parametrize(
    "pg_type, override, problem",
    [
        (PgType(1700, type_name="numeric"), "decimal(38,30)", None),
        (PgType(1700, type_name="numeric"), "text", "unknown type 'text'"),
        (PgType(1700, type_name="numeric"), "decimal(39,2)", "unknown type"),
        (PgType(25, type_name="text"), "double", "text cannot be read as double"),
        (PgType(1082, type_name="date"), "string", None),
        (PgType(701, type_name="double precision"), "decimal(10,2)", "cannot be read as"),
        (PgType(20, type_name="bigint"), "int", None),
        (PgType(1007, type_name="integer[]", category="A"), "double", "can only be read as"),
    ],
)
def test_override_problems(pg_type, override, problem):
    got = override_problem(pg_type, override)
    assert (got is None) if problem is None else (problem in got), got
