"""The cast registry (silver/casts.py): one entry per PostgreSQL type, holding both its plain
(code-generated) cast and its full cast, and both giving the same value for a text."""

from __future__ import annotations

import pytest
from pyspark.sql import functions as F

from pgmedallion.silver.cast_columns import UNSETTLED_COLUMN, cast_values, plain_cast
from pgmedallion.silver.casts import CASTS, type_cast
from pgmedallion.silver.pgtypes import INTERVAL, NUMERIC, TEXT, PgType

TEXT_ARRAY = 1009


def test_every_built_in_scalar_type_finds_its_own_entry(spark):
    for oid, entry in CASTS.items():
        assert type_cast(PgType(oid)) is entry
    # domains cast as their base type; types without an entry cast as text
    assert type_cast(PgType(99999, base_type_oid=NUMERIC)) is CASTS[NUMERIC]
    assert type_cast(PgType(TEXT)) is type_cast(PgType(99999, category="E"))
    assert type_cast(PgType(TEXT)) not in CASTS.values()


def test_an_entry_holds_both_casts_or_only_the_full_one(spark):
    for t in (PgType(TEXT), PgType(NUMERIC, typmod=(12 << 16 | 2) + 4), PgType(TEXT_ARRAY)):
        entry = type_cast(t)
        assert entry.full is not None and entry.plain is not None
    interval = PgType(INTERVAL)
    assert type_cast(interval).plain(interval, None) is None


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
