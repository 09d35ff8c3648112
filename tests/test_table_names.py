"""Tables renamed, or dropped and created again under one name, while the pipeline runs: gold
holds the source's live tables under their names of now, and nobody reads a dropped table's rows
under a live table's name. PostgreSQL is the oracle (``verify`` after every run)."""

from __future__ import annotations

import json

import psycopg
import pytest

from pgmedallion.capture.errors import PolicyNotApplicable
from pgmedallion.core.config import ColumnPolicy, TablePolicy
from pgmedallion.pipeline import run_stages
from pgmedallion.verify import verify
from tests.workload import assert_exact, drop_schemas, make_config


def _gold_tables(spark, cfg) -> set[str]:
    schema = cfg.qualified("gold", "x").rsplit(".", 1)[0]
    return {r["tableName"] for r in spark.sql(f"SHOW TABLES IN {schema}").collect()} - {
        "_frontier",
        "_quality",
        "_lag",
    }


def _silver_tables(spark, cfg) -> set[str]:
    schema = cfg.qualified("silver", "x").rsplit(".", 1)[0]
    return {
        r["tableName"]
        for r in spark.sql(f"SHOW TABLES IN {schema}").collect()
        if not r["tableName"].startswith("_")
    }


def _counts(conninfo, tables) -> dict[str, int]:
    with psycopg.connect(**conninfo) as conn:
        return {
            f"public.{t}": conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in tables
        }


def test_renamed_and_recreated_tables_take_their_names_of_now(spark, db):
    with psycopg.connect(**db, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE a (id int PRIMARY KEY, v text);"
            "CREATE TABLE b (id int PRIMARY KEY, v text);"
            "INSERT INTO a SELECT g, 'a' || g FROM generate_series(1, 10) g;"
            "INSERT INTO b SELECT g, 'b' || g FROM generate_series(1, 10) g;"
            "CREATE PUBLICATION pub FOR ALL TABLES;"
        )
    cfg = make_config(db, "tn")
    drop_schemas(spark, cfg)
    run_stages(spark, cfg)
    assert _gold_tables(spark, cfg) == {"public_a", "public_b"}
    with psycopg.connect(**db, autocommit=True) as conn:
        conn.execute("UPDATE a SET v = 'last' WHERE id = 1")  # lands after its drop record
        conn.execute("DROP TABLE a")  # and created again, another shape, fewer rows
        conn.execute("CREATE TABLE a (id int PRIMARY KEY, w int NOT NULL)")
        conn.execute("INSERT INTO a SELECT g, g FROM generate_series(1, 3) g")
        conn.execute("ALTER TABLE b RENAME TO c")
        conn.execute("UPDATE c SET v = 'x' WHERE id = 1")
        conn.execute("CREATE TABLE b (k text PRIMARY KEY)")  # the freed name, in the same run
        conn.execute("INSERT INTO b VALUES ('new b')")
    run_stages(spark, cfg)  # exits without a quality failure: a drop is not an error
    assert_exact(verify(spark, cfg), _counts(db, ("a", "b", "c")))
    assert _gold_tables(spark, cfg) == {"public_a", "public_b", "public_c"}
    assert _silver_tables(spark, cfg) == {"public_a", "public_b", "public_c"}
    assert spark.table(cfg.qualified("gold", "public_b")).columns[0] == "k"
    gold_a = spark.table(cfg.qualified("gold", "public_a"))
    assert [c for c in gold_a.columns if not c.startswith("_")] == ["id", "w"]
    assert gold_a.count() == 3
    frontier = spark.table(cfg.qualified("gold", "_frontier")).collect()
    assert sorted(r["gold_table"].rsplit(".", 1)[-1] for r in frontier) == [
        "public_a",
        "public_b",
        "public_c",
    ]
    reasons = [
        json.loads(bytes(r["payload"]))["reason"]
        for r in spark.table(cfg.qualified("bronze", "bronze")).where("kind = 'resync'").collect()
    ]
    assert reasons == ["table renamed from public.b to public.c"]
    # and a table dropped for good leaves silver and gold; the next runs stay quiet
    with psycopg.connect(**db, autocommit=True) as conn:
        conn.execute("DROP TABLE c")
        conn.execute("INSERT INTO a VALUES (4, 4)")
    run_stages(spark, cfg)
    run_stages(spark, cfg)
    assert_exact(verify(spark, cfg), _counts(db, ("a", "b")))
    assert _gold_tables(spark, cfg) == {"public_a", "public_b"}
    assert _silver_tables(spark, cfg) == {"public_a", "public_b"}


def test_a_renamed_table_keeps_its_column_policies_or_stops(spark, db):
    """A table whose columns are kept out of bronze (``pii``) renamed: capture stops, naming
    the policy to rename, rather than snapshot it under a name the policy does not cover; with
    the policy renamed, the new snapshot keeps the column out."""
    with psycopg.connect(**db, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE p (id int PRIMARY KEY, email text);"
            "INSERT INTO p SELECT g, 'u' || g || '@x' FROM generate_series(1, 5) g;"
            "CREATE PUBLICATION pub FOR ALL TABLES;"
        )
    secret = TablePolicy(columns={"email": ColumnPolicy(pii="exclude")})
    cfg = make_config(db, "tp", **{"public.p": secret})
    drop_schemas(spark, cfg)
    run_stages(spark, cfg)
    with psycopg.connect(**db, autocommit=True) as conn:
        conn.execute("ALTER TABLE p RENAME TO people")
    with pytest.raises(PolicyNotApplicable, match=r'\[tables."public.people"\]'):
        run_stages(spark, cfg)
    renamed = make_config(db, "tp", **{"public.people": secret})
    run_stages(spark, renamed)
    assert_exact(verify(spark, renamed), _counts(db, ("people",)))
    bronze = spark.table(cfg.qualified("bronze", "bronze")).where("kind = 'copy'")
    assert not [r for r in bronze.collect() if b"@x" in bytes(r["payload"])]
