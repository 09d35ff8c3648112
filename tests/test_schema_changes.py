"""Schema migrations while the pipeline runs: gold stays exact, or the table is snapshotted
again by itself, never silently different. PostgreSQL is the oracle (``verify`` after every run).

Each migration runs on a table under REPLICA IDENTITY DEFAULT and one under FULL, with a change
after it (the stream then carries the new Relation), as application frameworks write them.
"""

from __future__ import annotations

import json
import os
import signal

import psycopg
import pytest

from pgmedallion.capture.schema_changes import Catalog, CatalogColumn, changes
from pgmedallion.core.config import TablePolicy
from pgmedallion.pipeline import run_stages
from pgmedallion.status import status_report
from pgmedallion.verify import verify
from tests.workload import assert_exact, drop_schemas, make_config

TABLES = ("d", "f")
SCHEMA = """
CREATE TABLE d (id int PRIMARY KEY, f1 int NOT NULL, f2 int, note text);
CREATE TABLE f (id int PRIMARY KEY, f1 int NOT NULL, f2 int, note text);
ALTER TABLE f REPLICA IDENTITY FULL;
INSERT INTO d SELECT g, g, 100 + g, 'n' || g FROM generate_series(1, 40) g;
INSERT INTO f SELECT g, g, 100 + g, 'n' || g FROM generate_series(1, 40) g;
CREATE PUBLICATION pub FOR ALL TABLES;
"""


def _both(conn, statement: str) -> None:
    for table in TABLES:
        conn.execute(statement.format(t=table))


def _counts(conninfo) -> dict[str, int]:
    with psycopg.connect(**conninfo) as conn:
        return {
            f"public.{t}": conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in TABLES
        }


def _snapshots(spark, cfg) -> int:
    """How many snapshots bronze holds (batches with copy rows)."""
    bronze = spark.table(cfg.qualified("bronze", "bronze"))
    return bronze.where("kind = 'copy'").select("batch_id").distinct().count()


def _reasons(spark, cfg) -> list[str]:
    bronze = spark.table(cfg.qualified("bronze", "bronze")).where("kind = 'resync'")
    payloads = [bytes(r["payload"]).decode() for r in bronze.select("payload").collect()]
    return sorted({json.loads(p).get("reason", "") for p in payloads})


def _gold_columns(spark, cfg, table: str) -> list[str]:
    gold = spark.table(cfg.qualified("gold", "public_" + table))
    return [c for c in gold.columns if not c.startswith("_")]


MIGRATIONS = [
    # (name, statements, followed without a new snapshot)
    (
        "add with a constant default",
        ["ALTER TABLE {t} ADD COLUMN f3 int DEFAULT 1 NOT NULL"],
        True,
    ),
    (
        "swap two columns' names",
        [
            "ALTER TABLE {t} RENAME f1 TO tmp",
            "ALTER TABLE {t} RENAME f2 TO f1",
            "ALTER TABLE {t} RENAME tmp TO f2",
        ],
        False,
    ),
    (
        "drop and add again",
        ["ALTER TABLE {t} DROP COLUMN f3", "ALTER TABLE {t} ADD COLUMN f3 int"],
        False,
    ),
    ("add without a default", ["ALTER TABLE {t} ADD COLUMN f4 text"], True),
    ("widen a type", ["ALTER TABLE {t} ALTER COLUMN f1 TYPE bigint"], True),
    ("change a type", ["ALTER TABLE {t} ALTER COLUMN f1 TYPE int"], False),
    (
        "drop not null",
        [
            "ALTER TABLE {t} ALTER COLUMN f2 DROP NOT NULL",
            "INSERT INTO {t} (id, f1, f2) VALUES (5000, 1, NULL)",
        ],
        True,
    ),
    ("drop a column", ["ALTER TABLE {t} DROP COLUMN note"], True),
    (
        "add with a volatile default",
        ["ALTER TABLE {t} ADD COLUMN r float8 DEFAULT random()"],
        False,
    ),
]


def test_every_migration_leaves_gold_exact(spark, db):
    """Each migration, then an update, an insert and a delete, then a run: exact (and no rule of
    a dropped constraint fails the run). A column added without a value for existing rows, or
    with a constant one, is followed without a new snapshot; every other migration snapshots
    the two tables again, by itself, in the same run, with its reason recorded."""
    with psycopg.connect(**db, autocommit=True) as conn:
        conn.execute(SCHEMA)
    cfg = make_config(db, "sc")
    drop_schemas(spark, cfg)
    run_stages(spark, cfg)
    assert_exact(verify(spark, cfg), _counts(db))
    next_id = 1000
    for name, statements, followed in MIGRATIONS:
        before = _snapshots(spark, cfg)
        with psycopg.connect(**db, autocommit=True) as conn:
            for statement in statements:
                _both(conn, statement)
            _both(conn, "UPDATE {t} SET f1 = f1 + 1 WHERE id % 7 = 0")
            _both(conn, f"INSERT INTO {{t}} (id, f1, f2) VALUES ({next_id}, 1, 2)")
            _both(conn, "DELETE FROM {t} WHERE id = (SELECT min(id) FROM {t})")
        next_id += 1
        run_stages(spark, cfg)
        assert_exact(verify(spark, cfg), _counts(db))
        assert (_snapshots(spark, cfg) == before) == followed, name
    assert _gold_columns(spark, cfg, "d") == ["id", "f2", "f1", "f3", "f4", "r"]
    reasons = _reasons(spark, cfg)
    assert not any("f3 added" in r for r in reasons), reasons
    assert "column f1 renamed to tmp" not in reasons  # the catalog compares the end states
    assert any("renamed to" in r for r in reasons), reasons
    assert not any("NOT NULL" in r for r in reasons), reasons  # followed: gold's rules
    report, _ = status_report(spark, cfg)
    assert "public.d at " in report and "a volatile default" in report, report
    # (status lists the newest ten: f4's addition is older than them now)
    assert "NOT NULL of column f2 dropped: followed" in report, report
    followed = spark.table(cfg.qualified("bronze", "bronze")).where("kind = 'schema_change'")
    # recorded once per table and change, although every later run compared the catalog again
    # (f3 and f4 added, f1 widened, NOT NULL of f2 dropped, note dropped)
    assert sorted(r["table_name"] for r in followed.collect()) == ["d"] * 5 + ["f"] * 5
    assert "column f1 widened from integer to bigint: followed" in report, report


def test_a_dropped_primary_key_and_a_migration_in_a_transaction_with_rows(spark, db):
    """``DROP CONSTRAINT ..._pkey`` then a duplicate row: the table is a multiset now, and the
    run does not fail on the old key's rule. Then a migration inside a transaction that also
    writes rows, and two migrations between two runs."""
    with psycopg.connect(**db, autocommit=True) as conn:
        conn.execute(SCHEMA)
    cfg = make_config(db, "sk")
    drop_schemas(spark, cfg)
    run_stages(spark, cfg)
    with psycopg.connect(**db, autocommit=True) as conn:
        conn.execute("ALTER TABLE d DROP CONSTRAINT d_pkey")
        conn.execute("ALTER TABLE d REPLICA IDENTITY FULL")
        conn.execute("INSERT INTO d SELECT * FROM d WHERE id = 3")
    run_stages(spark, cfg)
    assert_exact(verify(spark, cfg), _counts(db))
    with psycopg.connect(**db) as conn:  # one transaction: rows, DDL, rows
        _both(conn, "UPDATE {t} SET f2 = -1 WHERE id = 5")
        _both(conn, "ALTER TABLE {t} ADD COLUMN g int DEFAULT 7")
        _both(conn, "UPDATE {t} SET g = 8 WHERE id = 6")
    with psycopg.connect(**db, autocommit=True) as conn:
        _both(conn, "ALTER TABLE {t} RENAME note TO remark")
        _both(conn, "ALTER TABLE {t} ALTER COLUMN f2 TYPE numeric(10,2)")
        _both(conn, "UPDATE {t} SET remark = 'after' WHERE id = 7")
    run_stages(spark, cfg)
    assert_exact(verify(spark, cfg), _counts(db))
    assert "remark" in _gold_columns(spark, cfg, "f")


@pytest.mark.parametrize(
    ("policy", "snapshots_after"),
    [("resync", 2), ("error", 1)],
)
def test_the_policy_decides_what_a_migration_does(spark, db, policy, snapshots_after):
    """``resync``: even a column added without a default snapshots the table again;
    ``error``: nothing is snapshotted again, and a change the stream cannot follow stays a
    ``SchemaIncompatible`` error of the table (as before this policy existed)."""
    with psycopg.connect(**db, autocommit=True) as conn:
        conn.execute(SCHEMA)
    name = "sp" + policy[0]
    policies = {
        f"public.{t}": TablePolicy(on_error="warn", on_schema_change=policy) for t in TABLES
    }
    cfg = make_config(db, name, **policies)
    drop_schemas(spark, cfg)
    run_stages(spark, cfg)
    with psycopg.connect(**db, autocommit=True) as conn:
        _both(conn, "ALTER TABLE {t} ADD COLUMN extra text")
        _both(conn, "UPDATE {t} SET extra = 'x' WHERE id = 1")
    run_stages(spark, cfg)
    assert _snapshots(spark, cfg) == snapshots_after
    assert_exact(verify(spark, cfg), _counts(db))
    if policy == "error":
        with psycopg.connect(**db, autocommit=True) as conn:
            _both(conn, "ALTER TABLE {t} DROP COLUMN note")
            _both(conn, "UPDATE {t} SET f2 = 0 WHERE id = 2")
        run_stages(spark, cfg)
        errors = spark.table(cfg.qualified("silver", "_errors")).collect()
        assert {(r["table_name"], r["code"]) for r in errors} == {
            ("d", "SchemaIncompatible"),
            ("f", "SchemaIncompatible"),
        }
        assert _snapshots(spark, cfg) == 1
        # verify names why it cannot compare the tables (the source lost a column silver has)
        checked = verify(spark, cfg)
        assert not checked.ok
        for check in checked.tables:
            assert not check.exact and "columns note are no longer at the source" in str(
                check.samples
            ), checked.report()


def _catalog(*columns, key=("id",), relfilenode=100):
    """A catalog fingerprint: columns as (attnum, name, type oid[, dropped, has_missing]);
    has_missing a string: the missing value itself."""
    out = []
    for attnum, name, type_oid, *flags in columns:
        dropped, has_missing = (flags + [False, False])[:2]
        missing = has_missing if isinstance(has_missing, str) else None
        out.append(
            CatalogColumn(
                attnum, name, type_oid, -1, False, dropped, bool(has_missing), "", missing
            )
        )
    return Catalog(tuple(out), tuple(key), relfilenode)


BEFORE = _catalog((1, "id", 23), (2, "f1", 23), (3, "f2", 23))


def test_a_name_given_again_after_a_followed_drop_is_not_followed():
    """Compared with a catalog recorded after a followed drop, a column added under the dropped
    column's name is that name given again (the snapshot's catalog says so), not a new one."""
    dropped = _catalog((1, "id", 23), (2, "f1", 23), (3, "x", 23, True))
    again = _catalog((1, "id", 23), (2, "f1", 23), (3, "x", 23, True), (4, "f2", 23))
    found = changes(dropped, again, BEFORE)
    assert found.unfollowable == ["column f2 dropped and its name given again"]
    assert found.followed == []


def test_a_swap_after_a_column_was_added_is_ambiguous():
    """With a column added since the snapshot, positions no longer tell the columns apart:
    a swap is a new snapshot, and under ``error`` a ``ColumnsAmbiguous`` error (the names in
    the stream mean other columns now); a plain rename is neither."""
    added = _catalog((1, "id", 23), (2, "f1", 23), (3, "f2", 23), (4, "g", 23))
    swapped = _catalog((1, "id", 23), (2, "f2", 23), (3, "f1", 23), (4, "g", 23))
    found = changes(added, swapped, BEFORE)
    assert found.ambiguous == ["column f1 renamed to f2", "column f2 renamed to f1"]
    assert found.unfollowable == found.ambiguous
    renamed = _catalog((1, "id", 23), (2, "f1", 23), (3, "f3", 23), (4, "g", 23))
    assert changes(added, renamed, BEFORE).ambiguous == []
    assert changes(BEFORE, _catalog((1, "id", 23), (2, "f2", 23), (3, "f1", 23))).ambiguous == []


def test_a_rewrite_keeps_the_value_existing_rows_read():
    """``VACUUM FULL`` clears ``attmissingval`` (the rows hold the value now): the recorded
    value carries over to the next record by attnum."""
    then = _catalog((1, "id", 23), (2, "f1", 23), (3, "f2", 23), (4, "c", 23, False, "7"))
    now = _catalog((1, "id", 23), (2, "f1", 23), (3, "f2", 23), (4, "c", 23), relfilenode=101)
    kept = now.keeping_missing(then)
    assert kept.missing_values() == {"c": "7"}
    assert changes(then, kept).followed == changes(then, kept).unfollowable == []


@pytest.mark.parametrize(
    ("now", "followed", "unfollowable"),
    [
        (BEFORE, [], []),
        (
            _catalog((1, "id", 23), (2, "f1", 23), (3, "f2", 23), (4, "c", 25)),
            ["column c added (NULL in existing rows)"],
            [],
        ),
        (
            _catalog((1, "id", 23), (2, "f1", 23), (3, "f2", 23), (4, "c", 23, False, True)),
            [],
            ["column c added with a value for existing rows"],  # a value not known here
        ),
        (
            _catalog((1, "id", 23), (2, "f1", 23), (3, "f2", 23), (4, "c", 23, False, "7")),
            ["column c added (existing rows read its default)"],
            [],
        ),
        (
            _catalog((1, "id", 23), (2, "f1", 23), (3, "f2", 23), (4, "c", 25), relfilenode=101),
            [],
            ["column c added and the table rewritten (a volatile default)"],
        ),
        (  # a swap with no column added or dropped since the snapshot: read by position
            _catalog((1, "id", 23), (2, "f2", 23), (3, "f1", 23)),
            ["column f1 renamed to f2", "column f2 renamed to f1"],
            [],
        ),
        (  # dropped and added again under the same name: the Relation looks the same
            _catalog((1, "id", 23), (2, "f1", 23), (3, "x", 23, True), (4, "f2", 23)),
            [],
            ["column f2 dropped and its name given again"],
        ),
        (  # a drop alone: followed (silver and gold drop the column)
            _catalog((1, "id", 23), (2, "f1", 23), (3, "x", 23, True)),
            ["column f2 dropped"],
            [],
        ),
        (
            _catalog((1, "id", 23), (2, "f1", 20), (3, "f2", 23)),
            ["column f1 widened from integer to bigint"],
            [],
        ),
        (
            _catalog((1, "id", 23), (2, "f1", 25), (3, "f2", 23)),
            [],
            ["column f1 changed type"],
        ),
        (
            _catalog((1, "id", 23), (2, "f1", 23), (3, "f2", 23), (4, "x", 23, True)),
            [],
            ["a column added since the snapshot was dropped"],
        ),
        (
            _catalog((1, "id", 23), (2, "f1", 23), (3, "f2", 23), key=()),
            ["primary key changed (id -> none)"],
            [],
        ),
        (  # a key column renamed: the same key
            _catalog((1, "key", 23), (2, "f1", 23), (3, "f2", 23), key=("key",)),
            ["column id renamed to key"],
            [],
        ),
    ],
)
def test_changes_are_told_apart_by_attnum(now, followed, unfollowable):
    found = changes(BEFORE, now)
    assert found.followed == followed
    assert found.unfollowable == unfollowable
    assert found.resync_reason("error") == ""
    assert bool(found.resync_reason("follow")) == bool(unfollowable)
    assert bool(found.resync_reason("resync")) == bool(unfollowable or followed)


# (migration, the failpoint that kills the run after it): each point where a crash can fall
# between a migration's records (the resync request, the new snapshot) and the rows after it
CRASHES = [
    # followed in place: killed before silver's earlier rows take the default
    ("ALTER TABLE {t} ADD COLUMN k1 int DEFAULT 1 NOT NULL", "silver.before_restate"),
    (
        "ALTER TABLE {t} RENAME f1 TO tmp; ALTER TABLE {t} RENAME f2 TO f1;"
        " ALTER TABLE {t} RENAME tmp TO f2",
        "snapshot.after_commit",
    ),
    ("ALTER TABLE {t} DROP COLUMN k1; ALTER TABLE {t} ADD COLUMN k1 int", "bronze.after_commit"),
    # followed in place: killed before silver's rows take the wider type
    ("ALTER TABLE {t} ALTER COLUMN f1 TYPE bigint", "silver.before_widen"),
    ("ALTER TABLE {t} DROP COLUMN note", "gold.after_table"),
]
# (bronze.before_commit after ADD COLUMN k2 text, a followed change, was a sixth trial: it
# passed, 0 lost and 0 duplicated; left out to keep CI's slow pass within its time)
CI_CRASHES = (0, 1, 3, 4)
"""The trials run by default: a crash before silver restates a followed default, one after a
new snapshot's commit, one before silver widens a followed type and one after gold's (CI has
90 minutes for everything); ``PGMEDALLION_MIGRATION_CRASHES=all`` runs the five."""


def chosen_crashes() -> list[tuple[int, tuple[str, str]]]:
    if os.environ.get("PGMEDALLION_MIGRATION_CRASHES", "") == "all":
        return list(enumerate(CRASHES))
    return [(i, CRASHES[i]) for i in CI_CRASHES]


@pytest.mark.slow
def test_a_kill_between_a_migration_and_the_rows_after_it(spark, db, tmp_path):
    """The whole pipeline SIGKILLed after each migration, at a point between the migration's
    records and the rows written after it (``tests/pipeline_child.py``), then run again: every
    table exact against PostgreSQL (0 rows lost, 0 duplicated)."""
    from tests.test_pipeline_crash import Child

    with psycopg.connect(**db, autocommit=True) as conn:
        conn.execute(SCHEMA)
    spec, log = tmp_path / "spec.json", tmp_path / "child.log"

    def child(steps: list[dict]) -> Child:
        config = {"conninfo": db, "name": "skill"}
        state = str(tmp_path / "child-spark")
        spec.write_text(json.dumps({"config": config, "state_dir": state, "steps": steps}))
        return Child(spec, log)

    def recovered(line: dict | None) -> None:
        assert line is not None and line["step"] == "recover", f"child died, see {log}"
        assert line["ok"], line["report"]
        counts = _counts(db)
        for table, (src, silver, gold, exact) in line["tables"].items():
            assert exact and src == silver == gold == counts[table], line["report"]

    first = child([{"do": "recover", "verify": False}])
    assert first.next()["step"] == "recover"
    assert first.end() == 0
    kills = 0
    chosen = chosen_crashes()
    for n, (migration, point) in chosen:
        c = child([{"do": "wait"}, {"do": "crash", "failpoints": point}])
        with psycopg.connect(**db, autocommit=True) as conn:
            _both(conn, migration)
            _both(conn, f"INSERT INTO {{t}} (id, f1, f2) VALUES ({2000 + n}, {n}, {n})")
            _both(conn, f"UPDATE {{t}} SET f2 = {-n} WHERE id % 5 = {n % 5}")
            _both(conn, f"DELETE FROM {{t}} WHERE id = {10 + n}")
        c.go()
        assert c.next() == {"step": "armed"}, f"child died before its crash run, see {log}"
        kills += c.end() == -signal.SIGKILL
        again = child([{"do": "recover"}])
        recovered(again.next())
        assert again.end() == 0
    assert kills == len(chosen), f"every failpoint fires, see {log}"


def test_a_column_added_after_the_snapshot_then_renamed_or_retyped(spark, db):
    """The snapshot's catalog does not know a column added after it, so a later rename of it
    looks like an addition there. Capture compares the catalog with the one it recorded when
    it followed the addition: a rename with no row changed since (no Relation in the stream)
    is seen there. What neither catalog can tell, a column added and renamed between two runs
    with a row written in between (the stream holds both Relations), silver sees, and under
    ``follow`` it asks for the new snapshot itself; the same run takes it."""
    with psycopg.connect(**db, autocommit=True) as conn:
        conn.execute(SCHEMA)
    cfg = make_config(db, "sa")
    drop_schemas(spark, cfg)
    run_stages(spark, cfg)
    steps = [
        (
            [
                "ALTER TABLE {t} ADD COLUMN g int",
                "ALTER TABLE {t} ADD COLUMN m numeric(8,2)",
                "ALTER TABLE {t} ADD COLUMN p int",
                "UPDATE {t} SET g = id, m = 1.5, p = 7 WHERE id % 3 = 0",
            ],
            1,
        ),
        (["ALTER TABLE {t} RENAME p TO q"], 2),  # no row changes: nothing in the stream
        (
            [  # neither rewrites the table; both are followed (m is in step 2's snapshot)
                "ALTER TABLE {t} RENAME g TO h",
                "ALTER TABLE {t} ALTER COLUMN m TYPE numeric(10,2)",
                "UPDATE {t} SET h = -id, m = 12345678.5 WHERE id % 4 = 0",
            ],
            2,
        ),
        (
            [
                "ALTER TABLE {t} ADD COLUMN k text",
                "UPDATE {t} SET k = 'a' WHERE id % 2 = 0",
                "ALTER TABLE {t} RENAME k TO k2",
                "UPDATE {t} SET k2 = 'b' WHERE id % 5 = 0",
            ],
            3,
        ),
    ]
    for statements, snapshots in steps:
        with psycopg.connect(**db, autocommit=True) as conn:
            for statement in statements:
                _both(conn, statement)
        run_stages(spark, cfg)
        assert_exact(verify(spark, cfg), _counts(db))
        assert _snapshots(spark, cfg) == snapshots, statements
    assert _gold_columns(spark, cfg, "d")[-4:] == ["h", "m", "q", "k2"]
    reasons = _reasons(spark, cfg)
    assert "column p renamed to q" in reasons, reasons  # p was added after the snapshot
    # g and m were in the snapshot step 2 took: the rename and the widening are followed
    assert not any("column m" in r for r in reasons), reasons
    assert not any("column g renamed to h" in r for r in reasons), reasons
    assert any("silver cannot follow (column(s) dropped or renamed: k)" in r for r in reasons)
