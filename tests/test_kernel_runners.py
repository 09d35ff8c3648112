"""The cast kernels (``silver.kernel``) decide every text alike in the driver (``cast_rows``)
and in Spark's Python workers (``silver.cast_columns.cast_values``, through ``mapInArrow``), and
cast what PostgreSQL writes.

PostgreSQL is the oracle for the texts: each type's values are written by the server (with the
settings capture pins), together with texts PostgreSQL would never write (padded, signed,
rounded, out of range, other offsets) and seeded random near-misses. For every text both runs
give the same value and the same error; every text PostgreSQL wrote casts.
"""

from __future__ import annotations

import math

import psycopg
import pyarrow as pa
import pytest
from pyspark.sql import types as T

from pgmedallion.silver.cast_columns import CAST_ERRORS_COLUMN, cast_values
from pgmedallion.silver.kernel import cast_rows
from pgmedallion.silver.pgtypes import PgType
from tests.test_kernel import mutations


def numeric(p: int, s: int) -> int:
    return ((p << 16) | (s & 0x7FF)) + 4


# name: (its PgType, values PostgreSQL reads and writes back, texts PostgreSQL does not write)
CASES = {
    "int2": (PgType(21), ["-32768", "-1", "0", "32767", "7"], ["007", "+1", "-0", "32768", "1.0"]),
    "int4": (PgType(23), ["-2147483648", "2147483647", "42"], ["2147483648", "1e3", " 1"]),
    "int8": (
        PgType(20),
        ["-9223372036854775808", "9223372036854775807", "123456789012345678", "-5"],
        ["9223372036854775808", "00", "--1"],
    ),
    "oid": (PgType(26), ["0", "4294967295", "16384"], ["-1"]),
    "float8": (
        PgType(701),
        ["0.1", "-0", "1e300", "1e-310", "NaN", "Infinity", "-Infinity", "3.141592653589793"],
        ["1e400", "inf", "1.", ".5", "1E5", "nan", " 1"],
    ),
    "float4": (PgType(700), ["0.1", "3.4028235e38", "1.1", "-0", "1e-45", "NaN"], ["3.5e38"]),
    "numeric(12,2)": (
        PgType(1700, numeric(12, 2)),
        ["0", "-0.5", "1234567890.12", "-9999999999.99", "1.1"],
        ["1.1", "1.123", "12345678901.00", "NaN", "+1.00", "1e2", "-0.00"],
    ),
    "numeric": (
        PgType(1700),
        [
            "0",
            "1.5",
            "-0.000000000000000001",
            "12345678901234567890.5",
            "1.50",
            "0.25000000000000000000000",
        ],
        ["1.0000000000000000001", "123456789012345678901", "NaN", "Infinity"]
        + ["85070591730234615865.84365185794205286400"],  # 25 * 2**128 digits: no wrap
    ),
    "numeric(40,40)": (
        PgType(1700, numeric(40, 40)),
        ["0.8507059173023461586584365185794205286400", "0.1", "-0.5"],
        ["0.85070591730234615865843651857942052864001"],
    ),
    "bool": (PgType(16), ["t", "f"], ["true", "T", "1"]),
    "bytea": (PgType(17), ["\\x", "\\x00ff10", "abc"], ["\\x0", "abc", "\\xZZ"]),
    "date": (
        PgType(1082),
        ["2024-02-29", "0001-01-01", "9999-12-31", "1970-01-01", "infinity"],
        ["2024-02-30", "24-01-01", "2024-1-1", "0001-01-01 BC", "10000-01-01"],
    ),
    "timestamp(3)": (
        PgType(1114, 3),
        ["2024-01-01 12:00:00.5", "0001-01-01 00:00:00", "9999-12-31 23:59:59.999"],
        ["2024-01-01 12:00:00.500", "2024-01-01T12:00:00", "2024-01-01 12:00:00+00"],
    ),
    "timestamptz": (
        PgType(1184),
        ["2024-01-01 12:00:00.123456+00", "1999-12-31 23:59:59+05", "-infinity"],
        ["2024-01-01 12:00:00+01", "2024-01-01 12:00:00.0+00", "2024-01-01 12:00:00Z"],
    ),
    "text": (PgType(25), ["", "a b", "tab\there", "ü"], []),
    "jsonb": (PgType(3802), ['{"b": 1, "a": [1, null]}', "null"], []),
}
ERRORS_BY_DESIGN: set[str] = set()  # texts PostgreSQL writes that no Spark type holds


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or (
            a == b and math.copysign(1, a) == math.copysign(1, b)
        )
    return a == b


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_driver_and_spark_decide_every_text_alike(db, spark, name):
    t, literals, others = CASES[name]
    with psycopg.connect(**db, autocommit=True) as conn:
        for setting in ("DateStyle = ISO", "IntervalStyle = postgres", "TimeZone = 'UTC'"):
            conn.execute(f"SET {setting}")
        conn.execute("SET extra_float_digits = 3")
        conn.execute("SET bytea_output = hex")
        # each value's text as its type's output function writes it (bool's: t, f)
        text = "CASE WHEN v::bool THEN 't' ELSE 'f' END" if name == "bool" else f"v::{name}::text"
        query = f"SELECT {text} FROM unnest(%s::text[]) AS s(v)"
        written = [r[0] for r in conn.execute(query, (literals,))]
    texts = [*written, *others, *mutations(written, seed=len(name)), None]
    values = pa.array([[x] for x in texts], pa.list_(pa.string()))
    rows = cast_rows(values, [("v", t)])
    mine = rows.columns[0].to_pylist()
    my_errors = {row: message for row, _, _, message in rows.errors}

    df = spark.createDataFrame(
        list(enumerate([[x] for x in texts])),
        T.StructType(
            [
                T.StructField("i", T.IntegerType()),
                T.StructField("values", T.ArrayType(T.StringType())),
            ]
        ),
    )
    cast = cast_values(df, "values", [("v", t)]).orderBy("i").toArrow()
    theirs, errors = cast.column("v").to_pylist(), cast.column(CAST_ERRORS_COLUMN).to_pylist()
    for i, text in enumerate(texts):
        their_error = errors[i][0]["message"] if errors[i] else None
        assert my_errors.get(i) == their_error, (name, text, my_errors.get(i), their_error)
        assert _same(mine[i], theirs[i]), (name, text, mine[i], theirs[i])
    for i, text in enumerate(written):  # what PostgreSQL writes casts (or meets its policy)
        assert i not in my_errors or text in ERRORS_BY_DESIGN, (name, text, my_errors[i])
    assert mine[-1] is None and len(texts) - 1 not in my_errors  # NULL is NULL, no error


@pytest.mark.skipif(
    "jemalloc" not in pa.supported_memory_backends(), reason="this pyarrow has no jemalloc"
)
def test_spark_python_workers_allocate_arrow_memory_with_jemalloc(spark):
    """The workers that run the kernels on Spark allocate with jemalloc, because the session
    says so (``core.spark.PYTHON_WORKER_ENV``), not because this process's environment does."""
    assert spark.conf.get("spark.executorEnv.ARROW_DEFAULT_MEMORY_POOL") == "jemalloc"

    def pool(batches):
        for _ in batches:
            yield pa.RecordBatch.from_pylist([{"pool": pa.default_memory_pool().backend_name}])

    (row,) = spark.range(1, numPartitions=1).mapInArrow(pool, "pool string").collect()
    assert row["pool"] == "jemalloc"
