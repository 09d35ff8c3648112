"""Gold's expectations under each policy, the ``_quality`` table, and the great_expectations
report. Silver is crafted by hand (``craft``); each policy gets its own table in one run,
which also shows that a failing table does not stop the others."""

from __future__ import annotations

import json

import pytest
from pyspark.sql import functions as F
from pyspark.sql import types as T

from pgmedallion.gold.build import run_gold
from pgmedallion.gold.ge_suite import validate_gold
from pgmedallion.gold.quality import GoldQualityError
from tests.craft import CraftedTable, SilverCrafter
from tests.test_gold import assert_gold, frontier_rows, make_cfg

ITEMS = T.StructType([T.StructField("id", T.LongType()), T.StructField("label", T.StringType())])
POLICIES = ("fail", "quarantine", "warn")


def crafted(spark, cfg, prefix: str) -> SilverCrafter:
    silver = SilverCrafter(spark, cfg).ensure()
    for i, policy in enumerate(POLICIES):
        silver.add_table(CraftedTable(f"{prefix}_{policy}", ITEMS, ("id",), ("label",), 100 + i))
    return silver


def policies(prefix: str) -> dict[str, str]:
    return {f"public.{prefix}_{p}": p for p in POLICIES}


def quality(spark, cfg, run: int) -> dict[tuple[str, str], tuple]:
    rows = spark.table(cfg.qualified("gold", "_quality")).filter(F.col("run") == run).collect()
    return {
        (r["table"], r["rule"]): (r["policy"], r["failed"], r["passed"], r["sample"]) for r in rows
    }


def quarantine(spark, cfg, table: str):
    return sorted(
        (
            (r["id"], r["_multiplicity"], tuple(r["_rules"]))
            for r in spark.table(cfg.qualified("gold", f"{table}__quarantine")).collect()
        ),
        key=repr,
    )


def test_negative_multiplicity_under_each_policy(spark, request):
    cfg = make_cfg(spark, request, **policies("neg"))
    silver = crafted(spark, cfg, "neg")
    for p in POLICIES:
        silver.diffs(f"neg_{p}", [(1, "a", 0, 1), (2, "b", 0, 1)], run=1)
    silver.complete_run(1, 100)
    run_gold(spark, cfg)

    # Run 2 retracts a row that was never there (id 3) next to a normal insert.
    for p in POLICIES:
        silver.diffs(f"neg_{p}", [(3, "c", 150, -1), (4, "d", 160, 1)], run=2)
    silver.complete_run(2, 200)
    with pytest.raises(GoldQualityError) as err:
        run_gold(spark, cfg)
    message = str(err.value)
    assert "public.neg_fail: multiplicity_not_negative (1 failed)" in message
    assert "neg_quarantine" not in message and "neg_warn" not in message

    # fail: the table stays at run 1, and says so; the other tables went on.
    assert_gold(spark, cfg, "neg_fail", ITEMS, [(1, "a", 0), (2, "b", 0)])
    assert frontier_rows(spark, cfg)["neg_fail"][:3] == (100, 1, 2)
    for p in ("quarantine", "warn"):
        assert_gold(spark, cfg, f"neg_{p}", ITEMS, [(1, "a", 0), (2, "b", 0), (4, "d", 160)])
        assert frontier_rows(spark, cfg)[f"neg_{p}"][:3] == (200, 2, 3)
        # A negative multiplicity cannot be rows: it waits in quarantine under either policy.
        assert quarantine(spark, cfg, f"neg_{p}") == [(3, -1, ("multiplicity_not_negative",))]
    q = quality(spark, cfg, 2)
    for p in POLICIES:
        policy, failed, passed, sample = q[(f"public.neg_{p}", "multiplicity_not_negative")]
        assert (policy, failed, passed) == (p, 1, 1)
        assert json.loads(sample)[0]["id"] == 3
        assert q[(f"public.neg_{p}", "primary_key_unique")][1:3] == (0, 2)

    # Run 3: the insert of id 3 arrives late and cancels the retraction everywhere.
    for p in POLICIES:
        silver.diffs(f"neg_{p}", [(3, "c", 250, 1)], run=3)
    silver.complete_run(3, 300)
    result = run_gold(spark, cfg)
    for p in POLICIES:
        assert_gold(spark, cfg, f"neg_{p}", ITEMS, [(1, "a", 0), (2, "b", 0), (4, "d", 160)])
        assert result.table(f"neg_{p}").frontier == 300
    for p in ("quarantine", "warn"):
        assert quarantine(spark, cfg, f"neg_{p}") == []


def test_definite_error_under_each_policy(spark, request):
    cfg = make_cfg(spark, request, **policies("err"))
    silver = crafted(spark, cfg, "err")
    for p in POLICIES:
        silver.diffs(f"err_{p}", [(1, "a", 0, 1), (2, "b", 0, 1)], run=1)
    silver.complete_run(1, 100)
    run_gold(spark, cfg)

    for p in POLICIES:
        silver.diffs(f"err_{p}", [(3, "c", 120, 1), (4, "d", 180, 1)], run=2)
        silver.error(f"err_{p}", lsn=150, run=2, code="CastError", message="bad numeric")
    silver.complete_run(2, 200)
    with pytest.raises(GoldQualityError) as err:
        run_gold(spark, cfg)
    assert "public.err_fail: no_definite_errors (1 failed)" in str(err.value)
    assert "err_quarantine" not in str(err.value)
    result = err.value.result
    assert result.table("err_fail").mode == "held"

    assert_gold(spark, cfg, "err_fail", ITEMS, [(1, "a", 0), (2, "b", 0)])
    # quarantine: the state just before the error's LSN, and the frontier says so.
    assert_gold(spark, cfg, "err_quarantine", ITEMS, [(1, "a", 0), (2, "b", 0), (3, "c", 120)])
    full = [(1, "a", 0), (2, "b", 0), (3, "c", 120), (4, "d", 180)]
    assert_gold(spark, cfg, "err_warn", ITEMS, full)
    fr = frontier_rows(spark, cfg)
    assert (fr["err_fail"][:2], fr["err_quarantine"][:2], fr["err_warn"][:2]) == (
        (100, 1),
        (150, 2),
        (200, 2),
    )
    q = quality(spark, cfg, 2)
    for p in POLICIES:
        policy, failed, _, sample = q[(f"public.err_{p}", "no_definite_errors")]
        assert (policy, failed) == (p, 1)
        assert json.loads(sample)[0]["code"] == "CastError"

    # Run 3: later changes; quarantine stays held before the error, warn follows silver.
    for p in POLICIES:
        silver.diffs(f"err_{p}", [(5, "e", 250, 1)], run=3)
    silver.complete_run(3, 300)
    with pytest.raises(GoldQualityError):
        run_gold(spark, cfg)
    assert_gold(spark, cfg, "err_quarantine", ITEMS, [(1, "a", 0), (2, "b", 0), (3, "c", 120)])
    assert_gold(spark, cfg, "err_warn", ITEMS, [*full, (5, "e", 250)])
    assert frontier_rows(spark, cfg)["err_quarantine"][:2] == (150, 3)


def test_key_rules_quarantine_and_great_expectations_report(spark, request):
    cfg = make_cfg(
        spark, request, **{"public.dup_quarantine": "quarantine", "public.dup_warn": "warn"}
    )
    silver = SilverCrafter(spark, cfg).ensure()
    silver.add_table(CraftedTable("clean", ITEMS, ("id",), ("label",), 1))
    for i, p in enumerate(("quarantine", "warn")):
        silver.add_table(CraftedTable(f"dup_{p}", ITEMS, ("id",), ("label",), 10 + i))
    silver.diffs("clean", [(1, "a", 0, 1), (2, "b", 10, 1)], run=1)
    for p in ("quarantine", "warn"):
        # id 1 twice (a duplicate key), id 2 with a NULL in a NOT NULL column, a NULL key.
        rows = [(1, "a", 0, 1), (1, "z", 5, 1), (2, None, 0, 1), (3, "c", 0, 1), (None, "n", 7, 1)]
        silver.diffs(f"dup_{p}", rows, run=1)
    silver.complete_run(1, 100)
    run_gold(spark, cfg)

    assert_gold(spark, cfg, "dup_quarantine", ITEMS, [(3, "c", 0)])
    assert quarantine(spark, cfg, "dup_quarantine") == sorted(
        [
            (None, 1, ("primary_key_not_null",)),
            (1, 1, ("primary_key_unique",)),
            (1, 1, ("primary_key_unique",)),
            (2, 1, ("not_null_label",)),
        ],
        key=repr,
    )
    warned = [(1, "a", 0), (1, "z", 5), (2, None, 0), (3, "c", 0), (None, "n", 7)]
    assert_gold(spark, cfg, "dup_warn", ITEMS, warned)
    q = quality(spark, cfg, 1)
    assert q[("public.dup_warn", "primary_key_unique")][1:3] == (2, 3)
    assert q[("public.dup_warn", "primary_key_not_null")][1:3] == (1, 4)
    assert q[("public.dup_warn", "not_null_label")][1:3] == (1, 4)

    ok, report = validate_gold(spark, cfg)
    assert not ok
    lines = report.splitlines()
    assert lines[0].split() == ["table", "expectation", "success", "observed"]
    clean = [line for line in lines if line.startswith("public.clean ")]
    assert clean and all(" ok " in line for line in clean)
    assert any(
        line.startswith("public.dup_warn ")
        and "expect_column_values_to_be_unique" in line
        and "FAILED" in line
        for line in lines
    )
    assert any("expect_table_row_count_to_equal" in line for line in clean)
