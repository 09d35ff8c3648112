"""REPLICA IDENTITY DEFAULT and USING INDEX: exact diffs from changes that carry only keys.

The pure resolver first (no Spark), then the whole pipeline against a real PostgreSQL, where
every edge case ends with ``verify`` exact: PostgreSQL is the oracle.
"""

from __future__ import annotations

import psycopg
import pytest

from pgmedallion.capture.pgoutput import UNCHANGED_TOAST, Delete, Update, decode
from pgmedallion.pipeline import run_stages
from pgmedallion.silver.build import run_silver
from pgmedallion.silver.changes import FILL, PLAIN, RETRACT
from pgmedallion.silver.identity import (
    Change,
    Resolved,
    Unresolved,
    _moves_a_key,
    resolve,
    resolve_previous_images,
)
from pgmedallion.verify import verify
from tests.workload import assert_exact, drop_schemas, make_config

KEY = (0,)


def c(lsn, ordinal, diff, kind, columns, *values):
    return Change(lsn, ordinal, diff, kind, tuple(columns), list(values))


def test_update_takes_the_previous_row_from_the_state():
    out, errors = resolve(
        [[1, "a", "toast"]],
        [c(10, 1, -1, RETRACT, KEY, 1, None, None), c(10, 1, 1, FILL, (2,), 1, "b", None)],
        KEY,
    )
    assert errors == []
    assert out == [Resolved(10, -1, [1, "a", "toast"]), Resolved(10, 1, [1, "b", "toast"])]


def test_changes_of_one_run_chain_in_commit_order():
    """Insert, two updates (one a key change, both leaving the TOAST column alone) and a delete
    of one row in one run, handed over out of order."""
    changes = [
        c(30, 1, -1, RETRACT, KEY, 2, None, None),
        c(20, 2, 1, FILL, (2,), 2, "c", None),
        c(20, 2, -1, RETRACT, KEY, 1, None, None),
        c(10, 1, 1, PLAIN, (), 1, "a", "big"),
        c(20, 1, 1, FILL, (2,), 1, "b", None),
        c(20, 1, -1, RETRACT, KEY, 1, None, None),
    ]
    out, errors = resolve([], changes, KEY)
    assert errors == []
    assert out == [
        Resolved(20, -1, [1, "a", "big"]),
        Resolved(20, 1, [1, "b", "big"]),
        Resolved(20, -1, [1, "b", "big"]),
        Resolved(20, 1, [2, "c", "big"]),
        Resolved(30, -1, [2, "c", "big"]),
    ]


def test_full_rows_move_the_state_too():
    changes = [
        c(10, 1, -1, PLAIN, (), 1, "a", "x"),
        c(10, 1, 1, PLAIN, (), 1, "b", "x"),
        c(20, 1, -1, RETRACT, KEY, 1, None, None),
    ]
    assert resolve([[1, "a", "x"]], changes, KEY)[0] == [Resolved(20, -1, [1, "b", "x"])]


def test_an_unknown_key_is_a_definite_error_and_nothing_is_made_up():
    out, errors = resolve(
        [],
        [c(10, 1, -1, RETRACT, KEY, 7, None), c(10, 1, 1, FILL, (1,), 7, None)],
        KEY,
    )
    assert out == []
    assert [(e.lsn, e.code) for e in errors] == [(10, "UnknownPreviousRow"), (10, "MissingToast")]
    assert all(isinstance(e, Unresolved) for e in errors)


def test_a_truncate_empties_the_state():
    out, errors = resolve(
        [[1, "a"]], [c(20, 2, -1, RETRACT, KEY, 1, None)], KEY, truncates=[(20, 1)]
    )
    assert out == [] and [e.code for e in errors] == ["UnknownPreviousRow"]


def test_composite_and_changed_identity_keys():
    base = [[1, 1, "a"], [1, 2, "b"]]
    changes = [
        c(10, 1, -1, RETRACT, (0, 1), 1, 2, None),
        c(10, 1, 1, FILL, (), 1, 3, "b2"),
        # the identity changed to a unique index on column 2 within the run
        c(20, 1, -1, RETRACT, (2,), None, None, "a"),
    ]
    out, errors = resolve(base, changes, (0, 1))
    assert errors == []
    assert out == [
        Resolved(10, -1, [1, 2, "b"]),
        Resolved(10, 1, [1, 3, "b2"]),
        Resolved(20, -1, [1, 1, "a"]),
    ]


def test_a_changed_identity_keeps_finding_rows_the_run_moved():
    """After a change of the identity, rows are looked up under the new key through an index of
    it, which follows every later change: a row updated under the new key is found again by
    its new value, a deleted one is gone, a truncate empties it."""
    base = [[1, "a", 10], [2, "b", 20]]
    changes = [
        c(10, 1, -1, RETRACT, (2,), None, None, 10),
        c(10, 1, 1, FILL, (), 1, "a2", 11),
        c(20, 1, -1, RETRACT, (2,), None, None, 11),  # found by its value of the change above
        c(20, 1, 1, FILL, (), 1, "a3", 12),
        c(30, 1, -1, RETRACT, (0,), 2, None, None),  # the old identity again: b deleted
        c(40, 1, -1, RETRACT, (2,), None, None, 20),  # b's new-key row is gone too
    ]
    out, errors = resolve(base, changes, (0,))
    assert out == [
        Resolved(10, -1, [1, "a", 10]),
        Resolved(10, 1, [1, "a2", 11]),
        Resolved(20, -1, [1, "a2", 11]),
        Resolved(20, 1, [1, "a3", 12]),
        Resolved(30, -1, [2, "b", 20]),
    ]
    assert [e.code for e in errors] == ["UnknownPreviousRow"]


def test_a_primary_key_changed_within_a_run_holds_rows_by_row():
    """The key changed from (id) to (id, region) within one run: after it, (id) is no longer
    unique, so rows are held by row (``by_row``) and each change looks its row up under its
    own key; a whole row's removal matches every column."""
    base = [[1, "us", "a"]]
    changes = [
        c(10, 1, -1, RETRACT, (0,), 1, None, None),  # under (id)
        c(10, 1, 1, FILL, (), 1, "us", "b"),
        c(20, 1, 1, PLAIN, (), 1, "eu", "x"),  # the key is (id, region) from here
        c(30, 1, -1, RETRACT, (0, 1), 1, "us", None),
        c(40, 1, -1, PLAIN, (), 1, "eu", "x"),
    ]
    out, errors = resolve(base, changes, (0,), by_row=True)
    assert errors == []
    assert out == [
        Resolved(10, -1, [1, "us", "a"]),
        Resolved(10, 1, [1, "us", "b"]),
        Resolved(30, -1, [1, "us", "b"]),
    ]


# --- on Spark: by buckets of keys, or whole where an update moved a key -----------------------


def _workload(seed: int, move_keys: bool) -> tuple[list[list], list[Change], list[tuple]]:
    """A table's rows before a run and a run's changes as silver makes them under REPLICA
    IDENTITY DEFAULT (key-only deletes, updates as RETRACT + FILL with unchanged TOAST
    columns to fill), over 300 keys; with ``move_keys``, some updates change the key."""
    import random

    rnd = random.Random(seed)
    state = {k: [k, f"t{k}", k * 10] for k in range(1, 301)}
    base = [list(v) for v in state.values()]
    changes: list[Change] = []
    truncates: list[tuple] = []
    lsn, next_key = 100, 1000
    for _ in range(600):
        lsn += 10
        ordinal = rnd.randrange(3)
        op = rnd.random()
        if op < 0.02:
            truncates.append((lsn, ordinal))
            state.clear()
        elif op < 0.25 or not state:
            next_key += 1
            row = [next_key, f"n{next_key}", lsn]
            changes.append(c(lsn, ordinal, 1, PLAIN, (), *row))
            state[next_key] = row
        elif op < 0.4:
            key = rnd.choice(sorted(state))
            changes.append(c(lsn, ordinal, -1, RETRACT, KEY, key, None, None))
            del state[key]
        else:
            key = rnd.choice(sorted(state))
            old = state.pop(key)
            new_key = key
            if move_keys and op > 0.9:
                next_key += 1
                new_key = next_key
            toast = rnd.random() < 0.5  # column 1 unchanged TOAST: to fill from the old row
            new = [new_key, None if toast else f"u{lsn}", lsn]
            changes.append(c(lsn, ordinal, -1, RETRACT, KEY, key, None, None))
            changes.append(c(lsn, ordinal, 1, FILL, (1,) if toast else (), *new))
            state[new_key] = [new_key, old[1] if toast else new[1], lsn]
    # a delete of a key that was never in the state: a definite error, found either way
    changes.append(c(lsn + 10, 0, -1, RETRACT, KEY, 99999, None, None))
    return base, changes, truncates


@pytest.mark.parametrize("move_keys", [False, True])
def test_spark_resolves_as_the_pure_resolver_does(spark, move_keys):
    """The Spark resolution (by buckets of keys where no update moved a key, else the table's
    changes whole) gives the pure resolver's rows and errors, row for row."""
    from pyspark.sql import types as T

    base, changes, truncates = _workload(7 if move_keys else 3, move_keys)
    names = ["id", "title", "n"]
    data = [
        T.StructField("id", T.LongType()),
        T.StructField("title", T.StringType()),
        T.StructField("n", T.LongType()),
    ]
    typed_schema = T.StructType(
        [
            *data,
            T.StructField("_pgm_lsn", T.LongType()),
            T.StructField("_pgm_diff", T.LongType()),
            T.StructField("_pgm_ordinal", T.LongType()),
            T.StructField("_pgm_kind", T.IntegerType()),
            T.StructField("_pgm_columns", T.ArrayType(T.IntegerType())),
        ]
    )
    typed = spark.createDataFrame(
        [(*ch.values, ch.lsn, ch.diff, ch.ordinal, ch.kind, list(ch.columns)) for ch in changes],
        typed_schema,
    )
    prior = spark.createDataFrame(
        [(*row, 1) for row in base], T.StructType([*data, T.StructField("_diff", T.LongType())])
    )
    changes_df = typed.where("_pgm_kind IS NOT NULL")
    assert _moves_a_key(changes_df, ["id"]) is move_keys

    images = resolve_previous_images(typed, names, KEY, prior, None, truncates)
    resolved = images.cached[0].where("_pgm_code IS NULL")
    got = sorted(
        (r["_pgm_lsn"], r["_pgm_diff"], r["id"], r["title"], r["n"]) for r in resolved.collect()
    )
    expected_rows, expected_errors = resolve(base, changes, KEY, truncates)
    relevant = [ch for ch in changes if ch.kind != PLAIN]
    assert len(relevant) > 300
    assert got == sorted((o.lsn, o.diff, *o.values) for o in expected_rows)
    assert sorted(images.errors) == sorted((e.lsn, e.code, e.message) for e in expected_errors)
    assert images.errors  # the unknown key at least
    for df in images.cached:
        df.unpersist()


# --- end to end ---------------------------------------------------------------------------------

SCHEMA = """
CREATE TABLE docs (id int PRIMARY KEY, title text NOT NULL, body text, n int,
    seen timestamptz DEFAULT '2024-05-06 07:08:09.123456+02', day date DEFAULT 'infinity');
-- out of line and uncompressed: an update that leaves body alone sends it as unchanged TOAST
ALTER TABLE docs ALTER COLUMN body SET STORAGE EXTERNAL;
CREATE TABLE lines (
    "orderId" bigint, "lineNo" int, qty int, note text, PRIMARY KEY ("orderId", "lineNo"));
CREATE TABLE coded (code text NOT NULL, v int);
CREATE UNIQUE INDEX coded_code ON coded (code);
ALTER TABLE coded REPLICA IDENTITY USING INDEX coded_code;
INSERT INTO docs SELECT g, 'doc ' || g, CASE WHEN g % 3 = 0 THEN repeat(md5(g::text), 2000) END, g
    FROM generate_series(1, 60) g;
INSERT INTO lines SELECT g / 4, g % 4, g, 'line' FROM generate_series(4, 83) g;
INSERT INTO coded SELECT 'c' || g, g FROM generate_series(1, 30) g;
CREATE PUBLICATION pub FOR ALL TABLES;
"""


@pytest.fixture
def shop(db):
    with psycopg.connect(**db, autocommit=True) as conn:
        conn.execute(SCHEMA)
    return db


def _counts(conninfo) -> dict[str, int]:
    with psycopg.connect(**conninfo) as conn:
        return {
            f"public.{t}": conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
            for t in ("docs", "lines", "coded")
        }


def test_default_identity_edge_cases_are_exact(spark, shop):
    """Unchanged TOAST, key changes, several updates of one key in one transaction and across
    the transactions of one run, insert-update-delete of one key in one run, a composite key,
    an index identity: silver and gold equal the source after every run, with no errors."""
    cfg = make_config(shop, "ri")
    drop_schemas(spark, cfg)
    run_stages(spark, cfg)
    with psycopg.connect(**shop, autocommit=True) as conn:
        conn.execute("UPDATE docs SET n = n + 100 WHERE id <= 9")  # TOAST of 3, 6, 9 unchanged
        conn.execute("UPDATE docs SET id = id + 1000 WHERE id IN (12, 15)")  # key change + 'u'
        with conn.transaction():
            for i in range(3):
                conn.execute("UPDATE docs SET title = %s WHERE id = 18", (f"t{i}",))
            conn.execute("UPDATE docs SET id = 2018 WHERE id = 18")
            conn.execute("UPDATE docs SET n = -1 WHERE id = 2018")
        conn.execute("UPDATE docs SET title = 'again' WHERE id = 2018")
        conn.execute("UPDATE docs SET body = NULL WHERE id = 21")  # TOAST value replaced
        conn.execute(
            "INSERT INTO docs (id, title, body, n) VALUES (500, 'new', repeat('x', 9000), 0)"
        )
        conn.execute("UPDATE docs SET n = 1 WHERE id = 500")
        conn.execute("UPDATE docs SET id = 501 WHERE id = 500")
        conn.execute("DELETE FROM docs WHERE id = 501")
        with conn.transaction():
            conn.execute("INSERT INTO docs (id, title, n) VALUES (600, 'in and out', 0)")
            conn.execute("UPDATE docs SET n = 2 WHERE id = 600")
            conn.execute("DELETE FROM docs WHERE id = 600")
        conn.execute("DELETE FROM docs WHERE id BETWEEN 40 AND 45")
        conn.execute('UPDATE lines SET qty = qty * 2 WHERE "orderId" = 3')
        conn.execute('UPDATE lines SET "lineNo" = "lineNo" + 10 WHERE "orderId" = 4')
        conn.execute('DELETE FROM lines WHERE "orderId" = 5 AND "lineNo" = 1')
        conn.execute("UPDATE coded SET v = -v WHERE code IN ('c1', 'c2')")
        conn.execute("UPDATE coded SET code = 'z' || code WHERE code = 'c3'")
        conn.execute("DELETE FROM coded WHERE code = 'c4'")
    run_stages(spark, cfg)
    assert_exact(verify(spark, cfg), _counts(shop))
    assert spark.table(cfg.qualified("silver", "_errors")).count() == 0
    # the stream did carry what DEFAULT leaves out: key-only deletes and unchanged TOAST
    wal = spark.table(cfg.qualified("bronze", "bronze")).where("kind = 'wal'").collect()
    messages = [decode(bytes(r["payload"])) for r in wal]
    updates = [m for m in messages if isinstance(m, Update)]
    assert any(UNCHANGED_TOAST in m.new for m in updates)
    assert any(m.old is None for m in updates) and any(m.old_kind == "K" for m in updates)
    assert any(isinstance(m, Delete) and m.old_kind == "K" for m in messages)
    with psycopg.connect(**shop, autocommit=True) as conn:  # a run that builds on the last one
        conn.execute("UPDATE docs SET n = n + 1 WHERE id IN (3, 1015, 2018)")
        conn.execute("DELETE FROM docs WHERE id = 6")
        conn.execute('UPDATE lines SET note = NULL WHERE "orderId" = 4')
    run_stages(spark, cfg)
    assert_exact(verify(spark, cfg), _counts(shop))
    assert spark.table(cfg.qualified("silver", "_errors")).count() == 0


def test_a_crash_between_silver_commits_resolves_the_same_way(spark, db, monkeypatch):
    """Silver dies after its first table's append, before the DEFAULT table's: the rerun redoes
    the run against the same earlier state (never its own half-written commit) and is exact."""
    with psycopg.connect(**db, autocommit=True) as conn:
        conn.execute(SCHEMA)
    cfg = make_config(db, "ricrash")
    drop_schemas(spark, cfg)
    run_stages(spark, cfg, ("capture", "silver"))
    with psycopg.connect(**db, autocommit=True) as conn:
        conn.execute("UPDATE coded SET v = v + 1")
        conn.execute("UPDATE docs SET n = n + 1 WHERE id <= 30")
        conn.execute("UPDATE docs SET id = id + 100 WHERE id <= 10")
        conn.execute('UPDATE lines SET qty = 0 WHERE "orderId" <= 3')
    run_stages(spark, cfg, ("capture",))

    class Crash(Exception):
        pass

    appends = []

    def crash_on_second(name):
        if name == "silver.after_append":
            appends.append(name)
            if len(appends) == 2:
                raise Crash(name)

    monkeypatch.setattr("pgmedallion.silver.write.failpoint", crash_on_second)
    with pytest.raises(Crash):
        run_silver(spark, cfg)
    monkeypatch.undo()
    again = run_silver(spark, cfg)
    assert again.errors == 0
    run_stages(spark, cfg, ("gold",))
    assert_exact(verify(spark, cfg), _counts(db))
