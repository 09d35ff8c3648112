"""``verify`` proves gold and silver equal the source, and catches a gold row removed behind
its back."""

from __future__ import annotations

import psycopg

from pgmedallion.pipeline import run_stages
from pgmedallion.verify import verify
from tests.test_silver import drop_schemas, make_config


def test_verify_passes_then_detects_a_row_removed_from_gold(spark, db):
    with psycopg.connect(**db, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE accounts (id int PRIMARY KEY, owner text NOT NULL,"
            " balance numeric(12,2));"
            "ALTER TABLE accounts REPLICA IDENTITY FULL;"
            "INSERT INTO accounts SELECT g, 'owner ' || g, g * 10 FROM generate_series(1, 300) g;"
            "CREATE PUBLICATION pub FOR ALL TABLES"
        )
    cfg = make_config(db, "vf1")
    drop_schemas(spark, cfg)
    run_stages(spark, cfg)
    with psycopg.connect(**db, autocommit=True) as conn:
        conn.execute("UPDATE accounts SET balance = balance + 1 WHERE id <= 20")
        conn.execute("DELETE FROM accounts WHERE id > 290")
    run_stages(spark, cfg)

    first = verify(spark, cfg)
    assert first.ok, first.report()
    (check,) = first.tables
    assert (check.source_rows, check.silver_rows, check.gold_rows) == (290, 290, 290)

    spark.sql(f"DELETE FROM {cfg.qualified('gold', 'public_accounts')} WHERE id = 7")
    second = verify(spark, cfg)
    assert not second.ok
    (check,) = second.tables
    assert check.exact and check.gold_exact is False  # silver is still right, gold is not
    assert any("only in silver" in s and "'id': 7" in s for s in check.samples), check.samples
    assert "MISMATCH" in second.report() and "verify: FAILED" in second.report()


def test_verify_before_any_run_says_so_in_a_sentence(spark, db):
    from pgmedallion.cli import failure
    from pgmedallion.verify import NothingToVerify

    cfg = make_config(db, "never_ran")
    drop_schemas(spark, cfg)
    try:
        verify(spark, cfg)
    except NothingToVerify as e:
        assert failure(e) == (
            "verify failed: NothingToVerify: silver holds no table of source 'never_ran' yet: "
            "run `pgmedallion run` first"
        )
    else:
        raise AssertionError("verify of a source never run did not fail")
