"""History at the source's transaction boundaries, with PostgreSQL as the oracle.

A seeded workload over a keyed table (default replica identity: key-only old images), a
table without a key (copies, TRUNCATE) and a keyed table whose key changes runs in steps;
after each step the test records every table's rows and the WAL position
(``pg_current_wal_lsn()``): a dozen quiet points. The pipeline runs every few steps, so one
run's increment spans several points; along the way a column is added with a default, one is
renamed and one dropped while captured, and a table is snapshotted again (``resync``). At the
end, every table read as of every recorded point equals what was recorded there (chispa).
"""

from __future__ import annotations

import random
from dataclasses import replace
from decimal import Decimal

import psycopg
from chispa import assert_df_equality
from pyspark.sql import functions as F

from pgmedallion.core import delta_rs
from pgmedallion.core.config import TablePolicy
from pgmedallion.gold.as_of import read_as_of, sql_as_of
from pgmedallion.pipeline import request_resync, run_stages
from pgmedallion.verify import verify
from tests.workload import assert_exact, drop_schemas, make_config

SCHEMA = """
CREATE TABLE acct (id int PRIMARY KEY, owner text NOT NULL, balance numeric(12,2), tier text);
CREATE TABLE ledger (kind text, n int);
ALTER TABLE ledger REPLICA IDENTITY FULL;
CREATE TABLE badge (code text PRIMARY KEY, holder int, gone text);
INSERT INTO acct SELECT g, 'o' || g, g * 10.5, 'basic' FROM generate_series(1, 40) g;
INSERT INTO ledger SELECT 'k' || (g % 4), g % 3 FROM generate_series(1, 30) g;
INSERT INTO badge SELECT 'b' || g, g, 'x' FROM generate_series(1, 10) g;
CREATE PUBLICATION pub FOR TABLE acct, ledger, badge;
"""

TABLES = ("acct", "ledger", "badge")


def _step(conn, rng: random.Random, step: int) -> None:
    """A few transactions of every kind (each ``with conn.transaction()`` is one commit)."""
    next_id = 1000 + step * 100
    for t in range(rng.randint(2, 4)):
        with conn.transaction():
            ids = [r[0] for r in conn.execute("SELECT id FROM acct ORDER BY id").fetchall()]
            pick = rng.sample(ids, min(3, len(ids)))
            conn.execute("UPDATE acct SET balance = balance + 1 WHERE id = %s", (pick[0],))
            # the same row changed twice in one transaction: one version
            conn.execute("UPDATE acct SET tier = 'gold' WHERE id = %s", (pick[1],))
            conn.execute("UPDATE acct SET tier = 'plat' WHERE id = %s", (pick[1],))
            if rng.random() < 0.4:
                conn.execute("DELETE FROM acct WHERE id = %s", (pick[2],))
            conn.execute(
                "INSERT INTO acct (id, owner, balance, tier) VALUES (%s, %s, %s, 'new')",
                (next_id + t, f"n{step}", Decimal("1.25")),
            )
            # copies in a table without a key, and a value coming and going
            kind = f"k{rng.randint(0, 4)}"
            conn.execute("INSERT INTO ledger VALUES (%s, 1), (%s, 1)", (kind, kind))
            conn.execute(
                "DELETE FROM ledger WHERE ctid = (SELECT ctid FROM ledger WHERE kind = %s LIMIT 1)",
                (f"k{rng.randint(0, 4)}",),
            )
            codes = [r[0] for r in conn.execute("SELECT code FROM badge").fetchall()]
            code = rng.choice(codes)
            # a key change: the old key's version ends where the new one starts
            conn.execute("UPDATE badge SET code = %s WHERE code = %s", (f"{code}.{step}{t}", code))
    if step == 4:
        with conn.transaction():
            conn.execute("TRUNCATE ledger")
            conn.execute("INSERT INTO ledger VALUES ('after', 7), ('after', 7)")


def _record(conn, late: bool = False) -> tuple[int, dict]:
    lsn = conn.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()[0]
    rows = {}
    for t in TABLES + (("late",) if late else ()):
        cur = conn.execute(f"SELECT * FROM {t}")
        rows[t] = ([d.name for d in cur.description], cur.fetchall())
    return int(lsn), rows


RENAMES = {"ledger": {"n": "amount"}}


def _check_point(spark, cfg, lsn: int, recorded: dict, skip: dict) -> None:
    for table, (columns, rows) in recorded.items():
        kept = [i for i, c in enumerate(columns) if c not in skip.get(table, ())]
        now = [RENAMES.get(table, {}).get(columns[i], columns[i]) for i in kept]
        got = read_as_of(spark, cfg, f"public_{table}", lsn).select(*now)
        expected = spark.createDataFrame([tuple(r[i] for i in kept) for r in rows], got.schema)
        assert_df_equality(got, expected, ignore_row_order=True, ignore_nullable=True)


def test_every_table_read_as_of_every_recorded_point_is_what_postgres_held(spark, db):
    rng = random.Random(47)
    with psycopg.connect(**db, autocommit=True) as conn:
        conn.execute(SCHEMA)
    cfg = make_config(
        db,
        "hist",
        **{
            "public.ledger": TablePolicy(truncate="delete"),
            "public.badge": TablePolicy(history="on"),
        },
    )
    cfg = replace(cfg, lakehouse=replace(cfg.lakehouse, history=True))
    drop_schemas(spark, cfg)
    run_stages(spark, cfg)  # the snapshot: history starts at its LSN
    points = []
    with psycopg.connect(**db, autocommit=True) as conn:
        points.append(_record(conn))
        for step in range(1, 13):
            _step(conn, rng, step)
            if step == 7:  # a table added to the publication later: history from its snapshot
                conn.execute(
                    "CREATE TABLE late (id int PRIMARY KEY, v text);"
                    "INSERT INTO late SELECT g, 'v' || g FROM generate_series(1, 5) g;"
                    "ALTER PUBLICATION pub ADD TABLE late"
                )
            if step >= 10:
                conn.execute("UPDATE late SET v = v || '+' WHERE id = %s", (step - 9,))
            if step == 5:  # migrations while captured
                conn.execute("ALTER TABLE acct ADD COLUMN note text NOT NULL DEFAULT 'hi'")
                conn.execute("ALTER TABLE ledger RENAME COLUMN n TO amount")
                conn.execute("ALTER TABLE badge DROP COLUMN gone")
                conn.execute("UPDATE acct SET note = 'changed' WHERE id = 2")
            # late is snapshotted by step 9's run: its rows count from the points after it
            points.append(_record(conn, late=step >= 10))
            if step % 3 == 0:
                run_stages(spark, cfg)
            if step == 9:  # snapshotted again, with nothing written since the run
                request_resync(spark, cfg, ["public.acct"])
                run_stages(spark, cfg)
    run_stages(spark, cfg)
    checked = verify(spark, cfg)
    assert_exact(checked)
    assert {t.table: t.history_exact for t in checked.tables} == {
        "public.acct": True,
        "public.badge": True,
        "public.ledger": True,
        "public.late": True,
    }
    assert "history exact" in checked.report()

    for i, (lsn, recorded) in enumerate(points):
        # A dropped column keeps its values in the versions earlier runs wrote; the run that
        # saw the drop (step 6's, of steps 4-6) reads its changes without it, as silver does.
        skip = {"badge": ("gone",)} if i > 3 else {}
        _check_point(spark, cfg, lsn, recorded, skip)

    # a table added later has no history before its snapshot
    assert read_as_of(spark, cfg, "public_late", points[8][0]).count() == 0
    assert read_as_of(spark, cfg, "public_late", points[10][0]).count() == 5

    # a column added later is NULL in the versions that ended before it
    first_lsn = points[0][0]
    early = read_as_of(spark, cfg, "public_acct", first_lsn)
    assert early.where(F.col("note").isNotNull()).count() == 0
    # the dropped column stays in the versions that had it
    assert read_as_of(spark, cfg, "public_badge", first_lsn).where("gone = 'x'").count() == 10

    # the versions a row went through, with their commit times
    hist = spark.table(cfg.qualified("gold", "public_acct__history"))
    one = hist.where("id = 2").orderBy("__start_lsn").collect()
    assert one[0]["__start_lsn"] <= first_lsn and one[-1]["__end_lsn"] is None
    for a, b in zip(one, one[1:], strict=False):
        assert a["__end_lsn"] == b["__start_lsn"] and a["__end_at"] is not None
    assert hist.where("__end_lsn IS NOT NULL AND __end_at IS NULL").count() == 0

    # pgmedallion sql's AS OF LSN reads the same
    lsn, recorded = points[7]
    query = f"SELECT count(*) AS n FROM {cfg.qualified('gold', 'public_ledger')} AS OF LSN '{lsn}'"
    assert spark.sql(sql_as_of(spark, cfg, query)).collect()[0]["n"] == len(recorded["ledger"][1])

    # a run with nothing new writes no history commit
    path = delta_rs.table_dir(
        delta_rs.schema_dir(spark, cfg.schema("gold")), "public_acct__history"
    )
    before = delta_rs.open_table(path).version() if delta_rs.usable(path) else None
    run_stages(spark, cfg)
    if before is not None:
        assert delta_rs.open_table(path).version() == before

    # retention: upkeep deletes the versions that ended before its cutoff, never a current one
    from pgmedallion.maintain import maintain

    hist = spark.table(cfg.qualified("gold", "public_acct__history"))
    assert hist.where("__end_lsn IS NOT NULL").count() > 0
    current = spark.createDataFrame(hist.where("__end_lsn IS NULL").collect(), hist.schema)
    short = replace(cfg, lakehouse=replace(cfg.lakehouse, history_retention_days=1e-9))
    done = maintain(spark, short)
    assert any("public_acct__history" in d for d in done), done
    hist = spark.table(cfg.qualified("gold", "public_acct__history"))
    assert hist.where("__end_lsn IS NOT NULL").count() == 0
    assert_df_equality(hist, current, ignore_row_order=True, ignore_nullable=True)
    lsn, recorded = points[-1]
    _check_point(spark, cfg, lsn, {"acct": recorded["acct"]}, {})


def test_history_turned_on_is_built_by_the_next_run_even_with_nothing_new(spark, db):
    """A scheduled run with nothing new costs the capture alone (``current.lakehouse_current``),
    unless a table's history was turned on since: then the lakehouse is not current, and the run
    builds the history from what silver holds."""
    from pgmedallion.current import lakehouse_current

    with psycopg.connect(**db, autocommit=True) as conn:
        conn.execute(SCHEMA)
    cfg = make_config(db, "later")
    drop_schemas(spark, cfg)
    run_stages(spark, cfg)
    with psycopg.connect(**db, autocommit=True) as conn:
        conn.execute("UPDATE acct SET tier = 'gold' WHERE id <= 5")
    run_stages(spark, cfg)
    assert lakehouse_current(cfg, spark=spark)  # nothing new, no table keeps history
    on = replace(cfg, lakehouse=replace(cfg.lakehouse, history=True))
    assert not lakehouse_current(on, spark=spark)
    run_stages(spark, on)
    assert lakehouse_current(on, spark=spark)
    hist = spark.table(cfg.qualified("gold", "public_acct__history"))
    gold = spark.table(cfg.qualified("gold", "public_acct")).drop("_lsn")
    assert_df_equality(
        hist.where("__end_lsn IS NULL").select(*gold.columns),
        gold,
        ignore_row_order=True,
        ignore_nullable=True,
    )
    # silver kept every change since the snapshot: the updated rows' versions before it too
    assert hist.where("id <= 5 AND __end_lsn IS NOT NULL AND tier = 'basic'").count() == 5


def test_rows_gold_holds_in_quarantine_are_not_in_the_history(spark, db):
    """Under ``on_error = "quarantine"`` a row failing a row rule (here a NOT NULL column that
    an ``infinity = "null"`` policy makes NULL) is in the quarantine table, not gold: its
    history has no version while it is there, and one from the transaction that fixed it."""
    with psycopg.connect(**db, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE q (id int PRIMARY KEY, at timestamp NOT NULL, v int);"
            "INSERT INTO q VALUES (1, '2026-01-01', 1), (2, 'infinity', 2);"
            "CREATE PUBLICATION pub FOR TABLE q"
        )
    policy = TablePolicy(on_error="quarantine", infinity="null", history="on")
    cfg = make_config(db, "quar", **{"public.q": policy})
    drop_schemas(spark, cfg)
    run_stages(spark, cfg)
    hist = cfg.qualified("gold", "public_q__history")
    assert sorted(r["id"] for r in spark.table(hist).collect()) == [1]
    lsn = "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn"
    with psycopg.connect(**db, autocommit=True) as conn:
        conn.execute("UPDATE q SET at = '2026-02-02' WHERE id = 2")
        fixed = conn.execute(lsn).fetchone()[0]
        conn.execute("UPDATE q SET at = 'infinity' WHERE id = 1")
        broken = conn.execute(lsn).fetchone()[0]
    run_stages(spark, cfg)
    rows = {r["id"]: r for r in spark.table(hist).collect()}
    assert sorted(rows) == [1, 2]  # one version each
    assert rows[2]["__end_lsn"] is None and rows[2]["__start_lsn"] <= fixed
    assert fixed < rows[1]["__end_lsn"] <= broken
    gold = spark.table(cfg.qualified("gold", "public_q")).drop("_lsn")
    current = spark.table(hist).where("__end_lsn IS NULL").select(*gold.columns)
    assert_df_equality(current, gold, ignore_row_order=True, ignore_nullable=True)
