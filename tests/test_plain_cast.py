"""On Spark, the plain half of the cast (``plain_cast``) settles a row only with the value the
full cast (``cast_values``) gives it, and with no error (both run ``silver.kernel``)."""

from __future__ import annotations

import pytest
from pyspark.sql import functions as F

from pgmedallion.silver.cast_columns import UNSETTLED_COLUMN, cast_values, plain_cast
from pgmedallion.silver.pgtypes import INTERVAL, NUMERIC, PgType

TEXT_ARRAY = 1009


@pytest.mark.parametrize(
    ("oid", "typmod", "texts"),
    [
        (16, -1, ["t", "f", None, "yes"]),
        (23, -1, ["1", "-2147483648", "2147483648", " 1", None]),
        (701, -1, ["1.5", "NaN", "-Infinity", "1e400", "x"]),
        (NUMERIC, (12 << 16 | 2) + 4, ["1.25", "1.255", "NaN", "-0.10"]),
        (1082, -1, ["2024-02-29", "infinity", "2023-02-29"]),
        (1184, -1, ["2024-01-01 10:00:00+01", "2024-01-01 10:00:00.5+05:30"]),
        (TEXT_ARRAY, -1, ['{a,"b c",NULL}', "{}", '{"x\\\\y"}', "{a"]),
        (INTERVAL, -1, ["1 day", "-1 mons +00:00:01.5", "infinity", "1 fortnight"]),
    ],
)
def test_the_plain_cast_settles_a_value_only_as_the_full_cast_does(spark, oid, typmod, texts):
    t = PgType(oid, typmod)
    df = spark.createDataFrame([(i, [x]) for i, x in enumerate(texts)], "id int, v array<string>")
    full = {r["id"]: r for r in cast_values(df, "v", [("c", t)]).collect()}
    staged = plain_cast(df, "v", [("c", t)])
    assert staged is not None
    for r in staged.where(~F.col(UNSETTLED_COLUMN)).collect():
        assert _same(r["c"], full[r["id"]]["c"])
        assert full[r["id"]]["_cast_errors"] == []


def _same(a, b) -> bool:
    return a == b or (a != a and b != b)  # NaN is NaN
