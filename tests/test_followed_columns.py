"""``ALTER TABLE ... DROP COLUMN`` followed in place: silver and gold drop the column (Delta's
column mapping, no file rewritten in silver) and keep every row, with no new snapshot.

The state after a drop is the rows as they were without that column, so rows that differed only
in it become equal, and a key-less table then holds them twice: the multiset must stay exact
when one of them is deleted. PostgreSQL is the oracle (``verify`` after every run).
"""

from __future__ import annotations

import logging
from dataclasses import replace

import psycopg
import pytest
from chispa import assert_df_equality

from pgmedallion.core.config import TablePolicy
from pgmedallion.gold.quality import GoldQualityError
from pgmedallion.pipeline import run_stages
from pgmedallion.verify import verify
from tests.migrations import gold_matches_source, snapshots, sql
from tests.workload import assert_exact, drop_schemas, make_config

SCHEMA = """
CREATE TABLE d (id int PRIMARY KEY, f1 int NOT NULL, gone text NOT NULL, note text);
CREATE TABLE f (id int PRIMARY KEY, f1 int NOT NULL, gone text NOT NULL, note text);
ALTER TABLE f REPLICA IDENTITY FULL;
CREATE TABLE k (n int, gone text);
ALTER TABLE k REPLICA IDENTITY FULL;
INSERT INTO d SELECT g, g, 'x' || g, 'n' || g FROM generate_series(1, 30) g;
INSERT INTO f SELECT g, g, 'x' || g, 'n' || g FROM generate_series(1, 30) g;
INSERT INTO k VALUES (1, 'a'), (1, 'b'), (2, 'c');
CREATE PUBLICATION pub FOR ALL TABLES;
"""


def _columns(spark, cfg, layer: str, table: str) -> list[str]:
    df = spark.table(cfg.qualified(layer, f"public_{table}"))
    return [c for c in df.columns if not c.startswith("_")]


def _run_followed(spark, cfg, caplog, silver_says: str) -> None:
    """A run after the migrations: exact, no new snapshot, silver reshaped each of the three
    tables, and gold followed in place (no full build)."""
    with caplog.at_level(logging.INFO, logger="pgmedallion"):
        run_stages(spark, cfg)
    assert_exact(verify(spark, cfg))
    assert snapshots(spark, cfg) == 1, "followed without a new snapshot"
    for text in (silver_says, "followed in place"):
        found = [r.getMessage() for r in caplog.records if text in r.getMessage()]
        assert len(found) == 3, (text, found)


def test_a_dropped_column_leaves_silver_and_gold_in_place(spark, db, caplog):
    sql(db, SCHEMA)
    cfg = make_config(db, "dropflw")
    drop_schemas(spark, cfg)
    run_stages(spark, cfg)
    assert snapshots(spark, cfg) == 1
    sql(
        db,
        "UPDATE d SET gone = 'changed' WHERE id = 1",  # read against the Relation with it
        "UPDATE f SET gone = 'changed' WHERE id = 1",
        "ALTER TABLE d DROP COLUMN gone",
        "ALTER TABLE f DROP COLUMN gone",
        "ALTER TABLE k DROP COLUMN gone",
        "UPDATE d SET f1 = f1 + 100 WHERE id % 5 = 0",
        "UPDATE f SET f1 = f1 + 100 WHERE id % 5 = 0",
        "INSERT INTO d (id, f1) VALUES (1000, 1)",
        "INSERT INTO f (id, f1) VALUES (1000, 1)",
        "DELETE FROM d WHERE id = 4",
        "DELETE FROM f WHERE id = 4",
        "DELETE FROM k WHERE ctid = (SELECT min(ctid) FROM k WHERE n = 1)",  # one of two equal
    )
    _run_followed(spark, cfg, caplog, "dropped here too")
    for table in ("d", "f"):
        assert _columns(spark, cfg, "silver", table) == ["id", "f1", "note"]
        assert _columns(spark, cfg, "gold", table) == ["id", "f1", "note"]
    gold_k = spark.table(cfg.qualified("gold", "public_k")).select("n")
    assert_df_equality(
        gold_k,
        spark.createDataFrame([(1,), (2,)], "n int"),
        ignore_row_order=True,
        ignore_nullable=True,
    )
    # a later run reads the Relations of before the drop again: the column stays gone
    sql(db, "UPDATE d SET note = 'later' WHERE id < 10", "DELETE FROM k WHERE n = 2")
    run_stages(spark, cfg)
    assert_exact(verify(spark, cfg))
    assert _columns(spark, cfg, "silver", "d") == ["id", "f1", "note"]
    assert snapshots(spark, cfg) == 1


def test_under_error_a_drop_is_not_followed(spark, db):
    """``on_schema_change = "error"`` keeps the table as its snapshot had it: its changes after
    the drop are ``SchemaIncompatible`` errors, which hold gold's table (its quality rule)."""
    sql(db, SCHEMA)
    cfg = make_config(db, "droperr")
    cfg = replace(cfg, tables={"public.d": TablePolicy(on_schema_change="error")})
    drop_schemas(spark, cfg)
    run_stages(spark, cfg)
    sql(db, "ALTER TABLE d DROP COLUMN gone", "UPDATE d SET f1 = 0 WHERE id = 1")
    with pytest.raises(GoldQualityError, match="no_definite_errors"):
        run_stages(spark, cfg)
    assert "gone" in _columns(spark, cfg, "silver", "d")
    assert "gone" in _columns(spark, cfg, "gold", "d")
    errors = spark.table(cfg.qualified("silver", "_errors")).where("code = 'SchemaIncompatible'")
    assert errors.count() >= 1


def test_a_renamed_column_is_renamed_in_place(spark, db, caplog):
    """``RENAME COLUMN`` of a column the snapshot had, to a name no column had: silver renames
    its column (column mapping), gold takes the new name, values stay with their column, with
    no new snapshot; also with no row changed after it (nothing in the stream), and again in a
    later run. Swaps: see test_a_swap_of_two_names_is_followed_in_place."""
    sql(db, SCHEMA)
    cfg = make_config(db, "renflw")
    drop_schemas(spark, cfg)
    run_stages(spark, cfg)
    sql(
        db,
        "UPDATE d SET note = 'before' WHERE id = 2",
        "UPDATE f SET note = 'before' WHERE id = 2",
        "ALTER TABLE d RENAME COLUMN note TO remark",
        "ALTER TABLE f RENAME COLUMN note TO remark",
        "ALTER TABLE k RENAME COLUMN gone TO kept",  # no row of k changes: no Relation
        "UPDATE d SET remark = 'after', f1 = -1 WHERE id % 6 = 0",
        "UPDATE f SET remark = 'after', f1 = -1 WHERE id % 6 = 0",
        "INSERT INTO d (id, f1, gone, remark) VALUES (1000, 1, 'g', 'r')",
        "DELETE FROM f WHERE id = 5",
    )
    _run_followed(spark, cfg, caplog, "renamed here too")
    for table in ("d", "f"):
        assert _columns(spark, cfg, "gold", table) == ["id", "f1", "gone", "remark"]
    assert _columns(spark, cfg, "gold", "k") == ["n", "kept"]
    with psycopg.connect(**db) as conn:
        rows = conn.execute("SELECT id, remark FROM d").fetchall()
    gold = spark.table(cfg.qualified("gold", "public_d")).select("id", "remark")
    assert_df_equality(
        gold,
        spark.createDataFrame(rows, gold.schema),
        ignore_row_order=True,
        ignore_nullable=True,
    )
    # renamed again, in a later run
    sql(
        db,
        "ALTER TABLE d RENAME COLUMN remark TO memo",
        "UPDATE d SET memo = 'again' WHERE id = 3",
    )
    run_stages(spark, cfg)
    assert_exact(verify(spark, cfg))
    assert snapshots(spark, cfg) == 1
    assert _columns(spark, cfg, "gold", "d") == ["id", "f1", "gone", "memo"]
    # and back to its name at the snapshot: a change from the last record, none from the
    # snapshot's catalog
    sql(db, "ALTER TABLE d RENAME COLUMN memo TO note")
    run_stages(spark, cfg)
    assert_exact(verify(spark, cfg))
    assert snapshots(spark, cfg) == 1
    assert _columns(spark, cfg, "gold", "d") == ["id", "f1", "gone", "note"]


def test_not_null_set_and_dropped_are_followed(spark, db):
    """``SET NOT NULL`` and ``DROP NOT NULL`` change no row: no new snapshot, and gold's rules
    follow the source's constraints (a NULL inserted after the drop passes them)."""
    from pgmedallion.silver.catalog import load_tables

    sql(db, SCHEMA)
    cfg = make_config(db, "nnflw")
    drop_schemas(spark, cfg)
    run_stages(spark, cfg)

    def not_null(table: str) -> list[str]:
        (info,) = [i for i in load_tables(spark, cfg).values() if i.name == table]
        return sorted(info.not_null)

    assert not_null("d") == ["f1", "gone", "id"]
    sql(
        db,
        "ALTER TABLE d ALTER COLUMN note SET NOT NULL",
        "ALTER TABLE d ALTER COLUMN gone DROP NOT NULL",
        "INSERT INTO d (id, f1, gone, note) VALUES (1000, 1, NULL, 'x')",
    )
    run_stages(spark, cfg)  # a rule of the old constraint would fail the run (NULL in gone)
    assert_exact(verify(spark, cfg))
    assert snapshots(spark, cfg) == 1
    assert not_null("d") == ["f1", "id", "note"]


SWAP_SCHEMA = """
CREATE TABLE s (id int PRIMARY KEY, a int NOT NULL, b int, c text);
CREATE TABLE sf (id int PRIMARY KEY, a int NOT NULL, b int, c text);
ALTER TABLE sf REPLICA IDENTITY FULL;
INSERT INTO s SELECT g, g, 100 + g, 'c' || g FROM generate_series(1, 30) g;
INSERT INTO sf SELECT * FROM s;
CREATE PUBLICATION pub FOR ALL TABLES;
"""


def _gold_is_source(spark, cfg, conninfo, table: str) -> None:
    gold_matches_source(spark, cfg, conninfo, table, ["id", "a", "b", "c"])


def test_a_swap_of_two_names_is_followed_in_place(spark, db, caplog):
    """Two columns swap names (what a migration that meant ``a`` for ``b`` writes) with no
    column added or dropped since the snapshot: every Relation since lists the same columns in
    attnum order, so silver reads each by position, the old ones included, and renames its
    columns in one commit; gold rebuilds from silver. No new snapshot, values stay with their
    column. Then a swap and a swap back between two looks at the catalog, with rows written
    in between: no catalog shows which column the middle Relation's names meant; positions
    do while no column was added or dropped, else the table is snapshotted again."""
    sql(db, SWAP_SCHEMA)
    cfg = make_config(db, "swapflw")
    drop_schemas(spark, cfg)
    run_stages(spark, cfg)
    swap = [
        "ALTER TABLE {t} RENAME COLUMN a TO tmp",
        "ALTER TABLE {t} RENAME COLUMN b TO a",
        "ALTER TABLE {t} RENAME COLUMN tmp TO b",
    ]
    for t in ("s", "sf"):
        sql(
            db,
            f"UPDATE {t} SET a = -a, c = 'before' WHERE id % 4 = 0",
            *(statement.format(t=t) for statement in swap),
            f"UPDATE {t} SET a = a + 1000, c = 'after' WHERE id % 3 = 0",
            f"INSERT INTO {t} (id, a, b, c) VALUES (1000, 1, 2, 'new')",
            f"DELETE FROM {t} WHERE id = 5",
        )
    with caplog.at_level(logging.INFO, logger="pgmedallion"):
        run_stages(spark, cfg)
    assert_exact(verify(spark, cfg))
    assert snapshots(spark, cfg) == 1, "followed without a new snapshot"
    said = [r.getMessage() for r in caplog.records if "a -> b" in r.getMessage()]
    assert len(said) == 2, said
    for t in ("s", "sf"):
        assert _columns(spark, cfg, "silver", t) == ["id", "b", "a", "c"]
        _gold_is_source(spark, cfg, db, t)
    # a later run reads the Relations of before the swap again: by position still
    sql(db, "UPDATE s SET b = 7 WHERE id < 6", "UPDATE sf SET a = 8 WHERE id < 6")
    run_stages(spark, cfg)
    assert_exact(verify(spark, cfg))
    assert snapshots(spark, cfg) == 1
    _gold_is_source(spark, cfg, db, "s")
    # swapped back, a row written, swapped again: the catalog looks as capture last saw it.
    # sf has had no column added or dropped: its Relations are read by position (capture
    # records the catalog); s has a column added first: it is snapshotted again
    sql(
        db,
        "ALTER TABLE s ADD COLUMN d int",
        *(statement.format(t="s") for statement in swap),
        "UPDATE s SET a = 55 WHERE id = 9",
        *(statement.format(t="s") for statement in swap),
        *(statement.format(t="sf") for statement in swap),
        "UPDATE sf SET a = 55 WHERE id = 9",
        *(statement.format(t="sf") for statement in swap),
    )
    run_stages(spark, cfg)
    assert_exact(verify(spark, cfg))
    assert snapshots(spark, cfg) == 2  # s's
    resyncs = spark.table(cfg.qualified("bronze", "bronze")).where("kind = 'resync'")
    reasons = [bytes(r["payload"]).decode() for r in resyncs.select("payload").collect()]
    assert len(reasons) == 1 and "renamed again before capture looked" in reasons[0], reasons
    for t in ("s", "sf"):
        _gold_is_source(spark, cfg, db, t)


def test_under_error_a_swap_is_schema_incompatible(spark, db):
    """``on_schema_change = "error"`` follows nothing: a Relation after a swap names silver's
    columns in another order, which read by its names would put each value in the other
    column. With no column added or dropped since the snapshot, silver reads it by position
    and, finding the names moved, records ``SchemaIncompatible`` for those changes; after a
    column was added (``sf``), capture records ``ColumnsAmbiguous`` for the table. Either
    holds gold's table."""
    sql(db, SWAP_SCHEMA)
    cfg = make_config(db, "swaperr")
    error = TablePolicy(on_schema_change="error")
    cfg = replace(cfg, tables={"public.s": error, "public.sf": error})
    drop_schemas(spark, cfg)
    run_stages(spark, cfg)
    sql(db, "ALTER TABLE sf ADD COLUMN d int", "UPDATE sf SET d = 1 WHERE id = 2")
    run_stages(spark, cfg)
    swap = [
        "ALTER TABLE {t} RENAME COLUMN a TO tmp",
        "ALTER TABLE {t} RENAME COLUMN b TO a",
        "ALTER TABLE {t} RENAME COLUMN tmp TO b",
        "UPDATE {t} SET a = -1 WHERE id = 1",
    ]
    sql(db, *(s.format(t="s") for s in swap), *(s.format(t="sf") for s in swap))
    with pytest.raises(GoldQualityError, match="no_definite_errors"):
        run_stages(spark, cfg)
    assert _columns(spark, cfg, "silver", "s") == ["id", "a", "b", "c"]
    errors = spark.table(cfg.qualified("silver", "_errors"))
    codes = {(r["table_name"], r["code"]) for r in errors.collect()}
    assert ("s", "SchemaIncompatible") in codes, codes
    assert ("sf", "ColumnsAmbiguous") in codes, codes
    # nothing of the update reached silver under the wrong names
    silver = spark.table(cfg.qualified("silver", "public_s")).where("id = 1 AND _diff > 0")
    assert sorted(r["b"] for r in silver.collect()) == [101]
