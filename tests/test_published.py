"""Only what the publication publishes reaches bronze, silver and gold: column lists, row
filters, and our column policies for personal data (``exclude``, ``hash``), in the snapshot and
the stream alike, on PostgreSQL 15 and 18. PostgreSQL is the oracle: gold is compared with a
query of what the publication publishes, and every Parquet file of every Delta version of the
three layers is searched for values that must never land."""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import replace
from pathlib import Path

import psycopg
import pyarrow.parquet as pq
import pytest
from chispa import assert_df_equality

from pgmedallion.capture.errors import PolicyNotApplicable
from pgmedallion.capture.pgoutput import Insert, Relation, RelationColumn, Update, decode, encode
from pgmedallion.capture.provision import run_checks
from pgmedallion.capture.published import (
    EVERYTHING,
    Published,
    StreamPolicies,
    combine,
    filter_columns,
    hash_copy_lines,
    keyed_hash,
)
from pgmedallion.checks import check_column_policies
from pgmedallion.core.config import ColumnPolicy, TablePolicy
from pgmedallion.pipeline import run_stages
from pgmedallion.verify import verify
from tests.workload import assert_exact, drop_schemas, make_config

KEY = "a test key of enough bytes"
SECRET = "SSN-5551234"
"""Every customer's ssn holds this (plus the id): a value that must never land."""

SCHEMA = f"""
CREATE TABLE customers (id int PRIMARY KEY, name text, region text, email text, ssn text);
INSERT INTO customers SELECT g, 'name ' || g, CASE WHEN g % 2 = 0 THEN 'eu' ELSE 'us' END,
    'user' || g || '@example.com', '{SECRET}-' || g FROM generate_series(1, 40) g;
CREATE TABLE orders (id int PRIMARY KEY, region text, amount numeric(10,2), note text);
ALTER TABLE orders REPLICA IDENTITY FULL;
INSERT INTO orders SELECT g, CASE WHEN g % 2 = 0 THEN 'eu' ELSE 'us' END, g * 1.25, 'n' || g
    FROM generate_series(1, 60) g;
CREATE TABLE both_sides (region text, id int, secret text, amount int, PRIMARY KEY (region, id));
INSERT INTO both_sides SELECT CASE WHEN g % 3 = 0 THEN 'eu' ELSE 'us' END, g, '{SECRET}-b' || g, g
    FROM generate_series(1, 30) g;
CREATE TABLE plain (id int PRIMARY KEY, v text);
INSERT INTO plain SELECT g, 'v' || g FROM generate_series(1, 20) g;
"""

PUBLICATION = """
CREATE PUBLICATION pub FOR TABLE customers (id, name, region), orders WHERE (region = 'eu'),
    both_sides (region, id, amount) WHERE (region = 'eu'), plain WHERE (id <= 10);
CREATE PUBLICATION other FOR TABLE plain;
"""

EXPECTED = {
    "customers": "SELECT id, name, region FROM customers",
    "orders": "SELECT id, region, amount, note FROM orders WHERE region = 'eu'",
    "both_sides": "SELECT region, id, amount FROM both_sides WHERE region = 'eu'",
    "plain": "SELECT id, v FROM plain WHERE id <= 10",
}


def _gold(spark, cfg, table: str, columns: list[str]):
    df = spark.table(cfg.qualified("gold", f"public_{table}"))
    assert [c for c in df.columns if not c.startswith("_")] == columns
    return df.select(*columns)


def _assert_gold_is(spark, cfg, conn, table: str, query: str) -> None:
    """Gold equals PostgreSQL's answer to ``query`` (what the publication publishes)."""
    cursor = conn.execute(query)
    columns = [d.name for d in cursor.description]
    rows = [tuple(r) for r in cursor.fetchall()]
    gold = _gold(spark, cfg, table, columns)
    expected = spark.createDataFrame(rows, gold.schema) if rows else gold.limit(0)
    assert_df_equality(
        gold, expected, ignore_row_order=True, ignore_nullable=True, ignore_column_order=False
    )


def _landed_files(spark, cfg) -> list[Path]:
    """Every Parquet file of every table of bronze, silver and gold (removed ones included:
    Delta keeps them until VACUUM, so every version is searched)."""
    files = []
    for layer in ("bronze", "silver", "gold"):
        schema = getattr(cfg.lakehouse, f"{layer}_schema")
        for row in spark.sql(f"SHOW TABLES IN `{schema}`").collect():
            if spark.catalog.getTable(f"`{schema}`.`{row['tableName']}`").tableType == "VIEW":
                continue  # gold's _lag: no files of its own
            location = spark.sql(f"DESCRIBE DETAIL `{schema}`.`{row['tableName']}`").first()[
                "location"
            ]
            files += Path(location.removeprefix("file:")).rglob("*.parquet")
    assert files
    return files


def _landed_values(spark, cfg) -> bytes:
    """Every value of every landed Parquet file, as bytes (binary payloads as they are)."""
    out = bytearray()
    for path in _landed_files(spark, cfg):
        for column in pq.read_table(path).columns:
            for value in column.to_pylist():
                if isinstance(value, bytes):
                    out += value
                elif value is not None:
                    out += str(value).encode()
                out += b"\0"
    return bytes(out)


@pytest.fixture
def shop(any_db, spark):
    with psycopg.connect(**any_db, autocommit=True) as conn:
        if conn.info.server_version < 150000:
            pytest.skip("column lists and row filters are PostgreSQL 15's")
        conn.execute(SCHEMA)
        conn.execute(PUBLICATION)
    cfg = make_config(any_db, "pubshape")
    drop_schemas(spark, cfg)
    return any_db, cfg


def test_only_what_the_publication_publishes_lands(spark, shop):
    db, cfg = shop
    run_stages(spark, cfg)
    with psycopg.connect(**db, autocommit=True) as conn:
        for table, query in EXPECTED.items():
            _assert_gold_is(spark, cfg, conn, table, query)
        # Rows move into and out of the filters, and on both sides of them.
        conn.execute("UPDATE orders SET region = 'eu' WHERE id IN (1, 3)")  # into
        conn.execute("UPDATE orders SET region = 'us' WHERE id IN (2, 4)")  # out of
        conn.execute("UPDATE orders SET amount = amount + 1 WHERE id IN (6, 7)")  # in, out
        conn.execute("DELETE FROM orders WHERE id IN (8, 9)")
        conn.execute("INSERT INTO orders VALUES (100, 'eu', 1, 'new'), (101, 'us', 2, 'new')")
        conn.execute("UPDATE both_sides SET region = 'eu' WHERE id = 1")  # a key change, into
        conn.execute("UPDATE both_sides SET secret = 'changed', amount = -1 WHERE id IN (3, 4)")
        conn.execute("DELETE FROM both_sides WHERE id IN (6, 7)")
        conn.execute(f"UPDATE customers SET ssn = '{SECRET}-new', name = 'renamed' WHERE id < 5")
        conn.execute(f"INSERT INTO customers VALUES (99, 'n', 'eu', 'x@y', '{SECRET}-99')")
        conn.execute("DELETE FROM customers WHERE id = 40")
        conn.execute("UPDATE plain SET v = 'moved' WHERE id IN (5, 15)")
        conn.execute("INSERT INTO plain VALUES (0, 'zero'), (50, 'fifty')")
    run_stages(spark, cfg)
    with psycopg.connect(**db, autocommit=True) as conn:
        for table, query in EXPECTED.items():
            _assert_gold_is(spark, cfg, conn, table, query)
        counts = {
            f"public.{t}": conn.execute(f"SELECT count(*) FROM ({q}) s").fetchone()[0]
            for t, q in EXPECTED.items()
        }
    assert_exact(verify(spark, cfg), counts)
    landed = _landed_values(spark, cfg)
    assert SECRET.encode() not in landed
    assert b"user1@example.com" not in landed  # email: withheld by the column list
    assert b"renamed" in landed  # the search does find what is published


def test_a_column_list_or_filter_changed_while_running_resyncs_the_table(spark, shop):
    db, cfg = shop
    run_stages(spark, cfg)
    with psycopg.connect(**db, autocommit=True) as conn:
        conn.execute(
            "ALTER PUBLICATION pub SET TABLE customers (id, name, email), orders,"
            " both_sides (region, id, amount) WHERE (id > 20), plain WHERE (id <= 10)"
        )
        conn.execute("UPDATE customers SET name = 'after' WHERE id = 2")
    expected = dict(
        EXPECTED,
        customers="SELECT id, name, email FROM customers",
        orders="SELECT id, region, amount, note FROM orders",
        both_sides="SELECT region, id, amount FROM both_sides WHERE id > 20",
    )
    run_stages(spark, cfg)
    with psycopg.connect(**db, autocommit=True) as conn:
        for table, query in expected.items():
            _assert_gold_is(spark, cfg, conn, table, query)
    assert_exact(verify(spark, cfg))


def test_exclude_and_hash_in_snapshot_and_stream(spark, shop, monkeypatch):
    db, cfg = shop
    monkeypatch.setenv("PGMEDALLION_HASH_KEY", KEY)
    with psycopg.connect(**db, autocommit=True) as conn:
        conn.execute("ALTER PUBLICATION pub SET TABLE customers")
        # a value with characters COPY escapes: snapshot and stream must hash the same value
        conn.execute("UPDATE customers SET email = E'tab\\there\\\\back' WHERE id = 1")
    policy = TablePolicy(
        columns={"ssn": ColumnPolicy(pii="exclude"), "email": ColumnPolicy(pii="hash")}
    )
    cfg = replace(cfg, tables={"public.customers": policy})
    run_stages(spark, cfg)
    with psycopg.connect(**db, autocommit=True) as conn:
        conn.execute("UPDATE customers SET email = E'tab\\there\\\\back' WHERE id = 2")
        conn.execute(f"UPDATE customers SET ssn = '{SECRET}-x', name = 'n2' WHERE id = 3")
        conn.execute(f"INSERT INTO customers VALUES (100, 'new', 'eu', 'new@x', '{SECRET}-1')")
        conn.execute("INSERT INTO customers VALUES (101, 'null mail', 'eu', NULL, NULL)")
        conn.execute("DELETE FROM customers WHERE id = 4")
    run_stages(spark, cfg)

    def digest(value):
        return None if value is None else keyed_hash(KEY.encode(), value.encode()).decode()

    with psycopg.connect(**db, autocommit=True) as conn:
        rows = conn.execute("SELECT id, name, region, email FROM customers").fetchall()
    gold = _gold(spark, cfg, "customers", ["id", "name", "region", "email"])
    expected = spark.createDataFrame([(i, n, r, digest(e)) for i, n, r, e in rows], gold.schema)
    assert_df_equality(gold, expected, ignore_row_order=True, ignore_nullable=True)
    hashed = {r["id"]: r["email"] for r in gold.where("id IN (1, 2)").collect()}
    assert hashed[1] == hashed[2] == digest("tab\there\\back")  # snapshot == stream
    assert_exact(verify(spark, cfg), {"public.customers": len(rows)})
    landed = _landed_values(spark, cfg)
    assert SECRET.encode() not in landed
    assert b"new@x" not in landed and b"user5@example.com" not in landed
    assert digest("new@x").encode() in landed

    # A policy changed: the table is snapshotted again under it.
    policy = replace(policy, columns={**policy.columns, "name": ColumnPolicy(pii="exclude")})
    cfg = replace(cfg, tables={"public.customers": policy})
    run_stages(spark, cfg)
    gold = spark.table(cfg.qualified("gold", "public_customers"))
    assert [c for c in gold.columns if not c.startswith("_")] == ["id", "region", "email"]
    assert_exact(verify(spark, cfg), {"public.customers": len(rows)})


def test_doctor_shows_what_is_published_and_warns_where_identity_does_not_cover_it(any_db):
    with psycopg.connect(**any_db, autocommit=True) as conn:
        if conn.info.server_version < 150000:
            pytest.skip("column lists and row filters are PostgreSQL 15's")
        conn.execute(SCHEMA)
        conn.execute("ALTER TABLE orders REPLICA IDENTITY DEFAULT")
        conn.execute(PUBLICATION)
    results = run_checks(
        any_db,
        publication="pub",
        slot="doctor_slot",
        tables=["public.customers", "public.orders", "public.both_sides", "public.plain"],
        create_publication=False,
    )
    shown = [r for r in results if r.name == "published columns and rows"]
    assert shown[0].ok and not shown[0].warning
    assert "public.customers: columns id, name, region (withheld: email, ssn)" in shown[0].message
    assert "public.orders: rows where (region = 'eu'::text)" in shown[0].message
    (warning,) = shown[1:]
    assert warning.ok and warning.warning
    assert "public.orders: the row filter uses region" in warning.message
    assert "public.both_sides" not in warning.message  # its filter's column is in its key
    with psycopg.connect(**any_db, autocommit=True) as conn:
        with pytest.raises(psycopg.errors.InvalidColumnReference):
            conn.execute("UPDATE orders SET note = 'x' WHERE id = 2")  # what it warns of


def test_publication_entries_combine_as_postgresql_combines_them():
    listed = Published(("id", "a"), "(a > 1)")
    assert combine([listed, Published(("id", "b"), "(b < 2)")]) == Published(
        ("id", "a", "b"), "((a > 1)) OR ((b < 2))"
    )
    assert combine([listed, EVERYTHING]) == EVERYTHING
    assert combine([listed, Published(None, "(a > 1)")]) == Published(None, "(a > 1)")
    assert combine([]) == EVERYTHING


def test_filter_columns_reads_names_not_literals_or_types():
    text = "((region = 'eu''s id'::text) AND (\"Amount\" > (10)::numeric) AND (id IS NOT NULL))"
    columns = ["region", "Amount", "id", "text", "numeric", "s"]
    assert filter_columns(text, columns) == ["region", "Amount", "id"]


def test_snapshot_and_stream_hash_one_value_alike():
    key = KEY.encode()
    value = "tab\there\\back\nline ü"
    copy_line = b"1\ttab\\there\\\\back\\nline \xc3\xbc\t\\N\tkept\n"
    hashed = hash_copy_lines(copy_line, [1, 2], key)
    assert hashed == b"1\t" + keyed_hash(key, value.encode()) + b"\t\\N\tkept\n"
    assert (
        keyed_hash(key, value.encode())
        == hmac.new(key, value.encode(), hashlib.sha256).hexdigest().encode()
    )

    policies = StreamPolicies({"public.t": {"a": "hash", "b": "exclude"}}, {}, key)
    relation = Relation(
        7,
        "public",
        "t",
        "d",
        (
            RelationColumn(1, "id", 23, -1),
            RelationColumn(0, "a", 25, -1),
            RelationColumn(0, "b", 1700, 655366),
            RelationColumn(0, "c", 25, -1),
        ),
    )
    rewritten = decode(policies(encode(relation)))
    assert [(c.name, c.type_oid) for c in rewritten.columns] == [("id", 23), ("a", 25), ("c", 25)]
    insert = decode(policies(encode(Insert(7, (b"1", value.encode(), b"1.5", b"kept")))))
    assert insert == Insert(7, (b"1", keyed_hash(key, value.encode()), b"kept"))
    update = Update(7, (b"1", None, None, None), "K", (b"2", None, b"2", b"x"))
    assert decode(policies(encode(update))) == Update(
        7, (b"1", None, None), "K", (b"2", None, b"x")
    )
    other = encode(Insert(8, (b"1", b"secret")))
    assert policies(other) == other  # a table without policies passes untouched


def test_hash_without_a_key_is_a_clear_error(monkeypatch):
    from pgmedallion.core.config import ConfigError, SourceConfig

    monkeypatch.delenv("PGMEDALLION_HASH_KEY", raising=False)
    with pytest.raises(ConfigError, match="PGMEDALLION_HASH_KEY"):
        SourceConfig().hash_key()
    monkeypatch.setenv("PGMEDALLION_HASH_KEY", "short")
    with pytest.raises(ConfigError, match="at least 16 bytes") as caught:
        SourceConfig().hash_key()
    assert "short" not in str(caught.value)


def test_policies_fail_closed_where_they_cannot_apply():
    """A protected column missing from the stream under its name (renamed or dropped) stops
    capture rather than letting it land under the new name; a column the publication's list
    withholds is not missing; an excluded key column is refused."""
    key = KEY.encode()
    policies = StreamPolicies({}, {7: {"email": "hash", "ssn": "exclude"}}, key, {7: None})

    def relation(*columns):
        return encode(Relation(7, "public", "t", "d", tuple(columns)))

    renamed = relation(RelationColumn(1, "id", 23, -1), RelationColumn(0, "mail", 25, -1))
    with pytest.raises(PolicyNotApplicable, match="email, ssn"):
        policies(renamed)
    listed = StreamPolicies({}, {7: {"ssn": "exclude"}}, key, {7: ("id", "email")})
    assert listed(relation(RelationColumn(1, "id", 23, -1), RelationColumn(0, "email", 25, -1)))
    keyed = StreamPolicies({}, {7: {"id": "exclude"}}, key, {7: None})
    with pytest.raises(PolicyNotApplicable, match="key column"):
        keyed(relation(RelationColumn(1, "id", 23, -1)))


def test_a_protected_column_renamed_while_captured_never_lands(spark, shop, monkeypatch):
    db, cfg = shop
    monkeypatch.setenv("PGMEDALLION_HASH_KEY", KEY)
    with psycopg.connect(**db, autocommit=True) as conn:
        conn.execute("ALTER PUBLICATION pub SET TABLE customers")
    policy = TablePolicy(columns={"ssn": ColumnPolicy(pii="exclude")})
    cfg = replace(cfg, tables={"public.customers": policy})
    run_stages(spark, cfg)
    with psycopg.connect(**db, autocommit=True) as conn:
        conn.execute("ALTER TABLE customers RENAME COLUMN ssn TO tax_id")
        conn.execute(f"UPDATE customers SET tax_id = '{SECRET}-renamed' WHERE id = 1")
    with pytest.raises(PolicyNotApplicable, match="ssn") as caught:
        run_stages(spark, cfg, ("capture", "silver", "gold"))
    assert caught.value.stage == "capture"
    assert SECRET.encode() not in _landed_values(spark, cfg)
    # Named as it is now, the policy applies again and the pipeline goes on.
    cfg = replace(
        cfg,
        tables={"public.customers": TablePolicy(columns={"tax_id": ColumnPolicy(pii="exclude")})},
    )
    run_stages(spark, cfg)
    assert SECRET.encode() not in _landed_values(spark, cfg)
    gold = spark.table(cfg.qualified("gold", "public_customers"))
    assert "tax_id" not in gold.columns and "ssn" not in gold.columns
    assert_exact(verify(spark, cfg))


def test_doctor_refuses_pii_policies_it_could_not_apply(any_db, monkeypatch):
    monkeypatch.setenv("PGMEDALLION_HASH_KEY", KEY)
    with psycopg.connect(**any_db, autocommit=True) as conn:
        conn.execute(SCHEMA)
        conn.execute("CREATE TABLE parted (id int, v text) PARTITION BY RANGE (id)")
        conn.execute("CREATE TABLE parted_1 PARTITION OF parted FOR VALUES FROM (0) TO (100)")
        conn.execute("CREATE PUBLICATION pub FOR TABLE customers, parted")
    cfg = make_config(any_db, "piidoctor")
    cfg = replace(
        cfg,
        tables={
            "public.customers": TablePolicy(columns={"id": ColumnPolicy(pii="exclude")}),
            "public.parted": TablePolicy(columns={"v": ColumnPolicy(pii="hash")}),
        },
    )
    result = check_column_policies(cfg)
    assert not result.ok
    assert 'id: pii = "exclude" on a primary key column' in result.message
    assert "does not publish public.parted itself" in result.message
