"""Generated columns: stored ones are captured, snapshot and stream alike, when the publication
publishes them (PostgreSQL 18's ``publish_generated_columns = stored``); virtual ones never
are."""

from __future__ import annotations

import psycopg
import pytest

from pgmedallion.pipeline import run_stages
from pgmedallion.silver.catalog import load_tables
from pgmedallion.verify import verify
from tests.workload import assert_exact, drop_schemas, make_config

SCHEMA = """
CREATE TABLE items (id int PRIMARY KEY, price numeric(10,2),
    gross numeric(12,2) GENERATED ALWAYS AS (price * 1.2) STORED,
    half numeric GENERATED ALWAYS AS (price / 2) VIRTUAL);
INSERT INTO items (id, price) SELECT g, g * 1.5 FROM generate_series(1, 100) g;
"""


def test_published_stored_generated_columns_are_captured(spark, db):
    """(Left out when the publication does not publish them: the workload's
    ``accounts.balance_cents`` shows that in every differential run.)"""
    with psycopg.connect(**db, autocommit=True) as conn:
        if conn.info.server_version < 180000:
            pytest.skip("publish_generated_columns and virtual columns are PostgreSQL 18's")
        conn.execute(SCHEMA)
        conn.execute(
            "CREATE PUBLICATION pub FOR TABLE items WITH (publish_generated_columns = stored)"
        )
    cfg = make_config(db, "gen")
    drop_schemas(spark, cfg)
    run_stages(spark, cfg)
    with psycopg.connect(**db, autocommit=True) as conn:
        conn.execute("UPDATE items SET price = price + 1 WHERE id <= 20")
        conn.execute("DELETE FROM items WHERE id > 90")
        conn.execute("INSERT INTO items (id, price) VALUES (500, 9.99)")
    run_stages(spark, cfg)
    assert_exact(verify(spark, cfg), {"public.items": 91})
    (info,) = load_tables(spark, cfg).values()
    assert [c["name"] for c in info.columns] == ["id", "price", "gross"]  # never the virtual one
    gold = spark.table(cfg.qualified("gold", "public_items")).where("id = 500").first()
    assert str(gold["gross"]) == "11.99"
