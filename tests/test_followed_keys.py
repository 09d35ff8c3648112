"""A primary key dropped, added or changed at the source: followed without a new snapshot.

No row changes, so silver's rows stay; what changes is how the stream names a row (a key-only
change under REPLICA IDENTITY DEFAULT carries the key of its Relation, which may differ from
one change to the next within a run) and gold's rules and MERGE key, which follow the source's
key (a full build from silver). PostgreSQL is the oracle: ``verify`` after every run.
"""

from __future__ import annotations

from pgmedallion.gold.quality import PK_UNIQUE
from pgmedallion.pipeline import run_stages
from pgmedallion.silver.catalog import load_tables
from pgmedallion.status import status_report
from pgmedallion.verify import verify
from tests.migrations import gold_matches_source, snapshots, sql
from tests.workload import assert_exact, drop_schemas, make_config

SCHEMA = """
CREATE TABLE d (id int PRIMARY KEY, f1 int NOT NULL, note text);
CREATE TABLE f (id int PRIMARY KEY, f1 int NOT NULL, note text);
ALTER TABLE f REPLICA IDENTITY FULL;
CREATE TABLE k (n int NOT NULL, label text);
ALTER TABLE k REPLICA IDENTITY FULL;
INSERT INTO d SELECT g, g % 3, 'n' || g FROM generate_series(1, 40) g;
INSERT INTO f SELECT * FROM d;
INSERT INTO k SELECT g, 'l' || g FROM generate_series(1, 10) g;
CREATE PUBLICATION pub FOR ALL TABLES;
"""


def _keys(spark, cfg) -> dict[str, list[str]]:
    return {i.name: i.primary_key for i in load_tables(spark, cfg).values()}


def _gold_matches_source(spark, cfg, conninfo, table: str) -> None:
    gold_matches_source(spark, cfg, conninfo, table, ["id", "f1", "note"])


def test_a_changed_primary_key_is_followed_in_place(spark, db):
    sql(db, SCHEMA)
    cfg = make_config(db, "keyflw")
    drop_schemas(spark, cfg)
    run_stages(spark, cfg)
    assert _keys(spark, cfg) == {"d": ["id"], "f": ["id"], "k": []}
    # key-only changes under both keys in one run: d's UPDATEs before the migration name their
    # row by (id), after it by (id, f1)
    statements = []
    for t in ("d", "f"):
        statements += [
            f"UPDATE {t} SET note = 'before' WHERE id % 5 = 0",
            f"DELETE FROM {t} WHERE id = 1",
            f"ALTER TABLE {t} DROP CONSTRAINT {t}_pkey, ADD PRIMARY KEY (id, f1)",
            f"UPDATE {t} SET note = 'after' WHERE id % 3 = 0",
            f"UPDATE {t} SET f1 = f1 + 10 WHERE id % 4 = 0",  # a key change: the old key sent
            f"DELETE FROM {t} WHERE id = 2",
        ]
    statements += ["ALTER TABLE k ADD PRIMARY KEY (n)", "UPDATE k SET label = 'x' WHERE n = 3"]
    sql(db, *statements)
    run_stages(spark, cfg)
    assert_exact(verify(spark, cfg))
    assert snapshots(spark, cfg) == 1, "followed without a new snapshot"
    assert _keys(spark, cfg) == {"d": ["id", "f1"], "f": ["id", "f1"], "k": ["n"]}
    for table in ("d", "f"):
        _gold_matches_source(spark, cfg, db, table)
    report, _ = status_report(spark, cfg)
    assert "primary key changed (id -> id, f1): followed" in report, report
    assert "primary key changed (none -> n): followed" in report, report

    # the key dropped, then a row twice: gold's rules no longer ask for a unique key
    sql(
        db,
        "ALTER TABLE d DROP CONSTRAINT d_pkey",
        "INSERT INTO d SELECT * FROM d WHERE id = 7",
        "ALTER TABLE f DROP CONSTRAINT f_pkey",
        "INSERT INTO f SELECT * FROM f WHERE id = 7",
        "DELETE FROM f WHERE id = 8",
    )
    run_stages(spark, cfg)  # a rule of the old key would fail the run
    assert_exact(verify(spark, cfg))
    assert snapshots(spark, cfg) == 1
    assert _keys(spark, cfg)["d"] == []
    quality = spark.table(cfg.qualified("gold", "_quality")).where("table = 'public.d'")
    last = quality.agg({"run": "max"}).first()[0]
    rules = {r["rule"] for r in quality.where(f"run = {last}").collect()}
    assert PK_UNIQUE not in rules and "not_null_f1" in rules, rules
    _gold_matches_source(spark, cfg, db, "d")
