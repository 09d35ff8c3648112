"""``ALTER TABLE ... ADD COLUMN c ... DEFAULT <constant>`` followed in place.

PostgreSQL stores such a value once (``pg_attribute.attmissingval``) and writes no row: every row
already there reads it, and the WAL says nothing of them. Capture records the value with the
catalog it compared; silver gives it to the rows from before the column (changes read against
an older Relation, and the rows earlier runs wrote), so gold is exact with no new snapshot.
PostgreSQL is the oracle: ``verify`` after every run, gold's rows compared with chispa.
"""

from __future__ import annotations

import logging
from dataclasses import replace

import psycopg
from chispa import assert_df_equality

from pgmedallion.core.config import ColumnPolicy, TablePolicy
from pgmedallion.pipeline import run_stages
from pgmedallion.verify import verify
from tests.migrations import migrate_while_streaming, snapshots, sql
from tests.workload import assert_exact, drop_schemas, make_config

SCHEMA = """
CREATE TABLE d (id int PRIMARY KEY, f1 int NOT NULL, note text);
CREATE TABLE f (id int PRIMARY KEY, f1 int NOT NULL, note text);
ALTER TABLE f REPLICA IDENTITY FULL;
INSERT INTO d SELECT g, g, 'n' || g FROM generate_series(1, 30) g;
INSERT INTO f SELECT g, g, 'n' || g FROM generate_series(1, 30) g;
CREATE PUBLICATION pub FOR ALL TABLES;
"""

# What application frameworks write, with values whose text needs care: a comma, quotes and a
# backslash, a numeric scale, a time zone, a JSON document, an array.
ADDED = [
    "ADD COLUMN k int DEFAULT 1 NOT NULL",
    "ADD COLUMN label text DEFAULT E'a,b \"q\" \\\\ x'",
    "ADD COLUMN price numeric(12,2) DEFAULT 9.50",
    "ADD COLUMN seen timestamptz DEFAULT '2024-02-29 23:59:59.5+05:30'",
    "ADD COLUMN doc jsonb DEFAULT '{\"a\": [1, 2]}'",
    "ADD COLUMN tags int[] DEFAULT '{1,2,3}'",
]
NEW_COLUMNS = ["k", "label", "price", "seen", "doc", "tags"]


def _migrate(conninfo, table: str, next_id: int) -> None:
    """The columns added, then rows written on both sides of the migration."""
    sql(
        conninfo,
        f"UPDATE {table} SET note = 'before' WHERE id = 3",
        *(f"ALTER TABLE {table} {ddl}" for ddl in ADDED),
        f"UPDATE {table} SET f1 = f1 + 100 WHERE id % 5 = 0",  # old rows: their old image has k=1
        f"UPDATE {table} SET k = 7, label = NULL WHERE id = 2",
        f"INSERT INTO {table} (id, f1) VALUES ({next_id}, 1)",
        f"INSERT INTO {table} (id, f1, k, price) VALUES ({next_id + 1}, 1, 5, NULL)",
        f"DELETE FROM {table} WHERE id = 4",
    )


def _gold_matches_source(spark, cfg, conninfo, table: str) -> None:
    """Gold's rows of ``table`` equal PostgreSQL's, value for value (texts compared as PostgreSQL
    writes them, through ``::text`` on both sides where Spark's text differs)."""
    gold = spark.table(cfg.qualified("gold", f"public_{table}"))
    got = gold.selectExpr(
        "id",
        "f1",
        "note",
        "k",
        "label",
        "cast(price as string) as price",
        'date_format(seen, "yyyy-MM-dd HH:mm:ss.S") as seen',
        "cast(tags as string) as tags",
    )
    with psycopg.connect(**conninfo) as conn:
        conn.execute("SET TimeZone = 'UTC'")
        rows = conn.execute(
            f"SELECT id, f1, note, k, label, price::text,"
            f" to_char(seen, 'YYYY-MM-DD HH24:MI:SS.MS'), array_to_string(tags, ', ')"
            f" FROM {table}"
        ).fetchall()
    rows = [
        (*r[:6], r[6][:-2] if r[6] else None, f"[{r[7]}]" if r[7] is not None else None)
        for r in rows
    ]
    expected = spark.createDataFrame(rows, got.schema)
    assert_df_equality(got, expected, ignore_row_order=True, ignore_nullable=True)


def test_a_column_added_with_a_default_is_followed_in_place(spark, db, caplog):
    """Between two runs, under REPLICA IDENTITY DEFAULT and FULL: no new snapshot, the rows
    silver held take the defaults, changes before and after the migration read them, and an
    update of an old row (its old image, or its previous row from silver) retracts exactly what
    silver holds. ``verify`` exact after each run."""
    sql(db, SCHEMA)
    cfg = make_config(db, "addflw")
    drop_schemas(spark, cfg)
    run_stages(spark, cfg)
    assert snapshots(spark, cfg) == 1
    _migrate(db, "d", 1000)
    _migrate(db, "f", 1000)
    with caplog.at_level(logging.INFO, logger="pgmedallion"):
        run_stages(spark, cfg)
    assert_exact(verify(spark, cfg))
    assert snapshots(spark, cfg) == 1, "followed without a new snapshot"
    restated = [
        r.getMessage() for r in caplog.records if "the rows silver holds take it" in r.getMessage()
    ]
    assert len(restated) == 2, restated
    for table in ("d", "f"):
        _gold_matches_source(spark, cfg, db, table)
    # later changes of old rows still find them (silver's rows of earlier runs took the values)
    sql(
        db,
        "UPDATE d SET note = 'later' WHERE id BETWEEN 5 AND 9",
        "UPDATE f SET note = 'later' WHERE id BETWEEN 5 AND 9",
        "DELETE FROM d WHERE id = 11",
        "DELETE FROM f WHERE id = 11",
    )
    run_stages(spark, cfg)
    assert_exact(verify(spark, cfg))
    assert snapshots(spark, cfg) == 1
    for table in ("d", "f"):
        _gold_matches_source(spark, cfg, db, table)


def test_a_default_added_while_capture_streams(spark, db, caplog):
    """The migration lands while a continuous capture streams, after its look at the catalog:
    the stream stops before the Relation that names the new columns, capture looks again (the
    values for existing rows recorded first), and the next session lands the Relation. Exact,
    with no new snapshot."""
    sql(db, SCHEMA)
    cfg = make_config(db, "addlive")
    drop_schemas(spark, cfg)
    run_stages(spark, cfg)

    def migrate() -> None:
        # the first Relation naming the columns stops the stream (the other table's
        # migration is recorded by the same look when it came before it)
        _migrate(db, "d", 1000)
        _migrate(db, "f", 1000)

    migrate_while_streaming(spark, cfg, caplog, migrate)
    run_stages(spark, cfg)
    assert_exact(verify(spark, cfg))
    assert snapshots(spark, cfg) == 1
    for table in ("d", "f"):
        _gold_matches_source(spark, cfg, db, table)


def test_a_withheld_columns_default_never_reaches_bronze(spark, db):
    """A column a policy excludes, added with a default before the snapshot (so its value is
    the catalog's missing value, not in any row): neither the snapshot's catalog record nor the
    one recorded with a later followed migration holds the value."""
    sql(
        db,
        SCHEMA,
        "ALTER TABLE d ADD COLUMN secret text DEFAULT 'do-not-land-4711'",
    )
    policy = TablePolicy(columns={"secret": ColumnPolicy(pii="exclude")})
    cfg = replace(make_config(db, "addpii"), tables={"public.d": policy})
    drop_schemas(spark, cfg)
    run_stages(spark, cfg)
    sql(db, "ALTER TABLE d ADD COLUMN k int DEFAULT 1 NOT NULL", "UPDATE d SET f1 = 0 WHERE id = 1")
    run_stages(spark, cfg)
    assert_exact(verify(spark, cfg))
    assert snapshots(spark, cfg) == 1, "k is followed"
    bronze = spark.table(cfg.qualified("bronze", "bronze"))
    kinds = {r["kind"] for r in bronze.select("kind").distinct().collect()}
    assert {"schema", "schema_change"} <= kinds, kinds
    payloads = bronze.select("payload").collect()
    assert not any(b"do-not-land-4711" in bytes(r["payload"] or b"") for r in payloads)


def test_a_default_added_to_a_partitioned_table_is_snapshotted_again(spark, db):
    """A partitioned table keeps the value for existing rows in its partitions, not in its
    root (the root has no ``attmissingval``): capture sees it there and snapshots the table
    again, instead of following it as NULL."""
    sql(
        db,
        "CREATE TABLE p (id int, v int, PRIMARY KEY (id)) PARTITION BY RANGE (id)",
        "CREATE TABLE p1 PARTITION OF p FOR VALUES FROM (0) TO (100)",
        "CREATE TABLE p2 PARTITION OF p FOR VALUES FROM (100) TO (200)",
        "INSERT INTO p SELECT g, g FROM generate_series(1, 150) g",
        "CREATE PUBLICATION pub FOR TABLE p WITH (publish_via_partition_root = true)",
    )
    cfg = make_config(db, "addpart")
    drop_schemas(spark, cfg)
    run_stages(spark, cfg)
    sql(db, "ALTER TABLE p ADD COLUMN k int DEFAULT 5", "UPDATE p SET v = -v WHERE id = 7")
    run_stages(spark, cfg)
    assert_exact(verify(spark, cfg))
    assert snapshots(spark, cfg) == 2
