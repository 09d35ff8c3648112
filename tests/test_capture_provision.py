"""The doctor preflight against the embedded PostgreSQL 18, and its pure checks on values."""

from __future__ import annotations

import psycopg
import pytest
from psycopg import sql

from pgmedallion.capture.preflight import CheckResult, TableFacts
from pgmedallion.capture.provision import (
    all_ok,
    format_report,
    free_slots_result,
    free_wal_senders_result,
    run_checks,
    server_version_result,
    wal_level_result,
)
from pgmedallion.capture.replica_identity import check_replica_identity, identity_advice

PASSWORD = "x-doctor-secret-7f3a"
"""Distinctive, so "not in any message" means something (a bare 'x' is in many words)."""

HOSTILE = 'we"ird ; DROP TABLE t; --'


def execute(conninfo, *statements) -> None:
    with psycopg.connect(**conninfo, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)


def by_name(results: list[CheckResult]) -> dict[str, CheckResult]:
    merged: dict[str, CheckResult] = {}
    for result in results:
        # A check may report more than one result; any failure is the one that matters.
        if result.name not in merged or not result.ok:
            merged[result.name] = result
    return merged


def failed(results: list[CheckResult]) -> set[str]:
    return {r.name for r in results if not r.ok}


@pytest.fixture
def role(pg, db, request):
    """A login role (unique to the test) with a password; dropped with what it owns."""
    name = "pgm_doctor_" + "".join(c for c in request.node.name if c.isalnum())[-30:].lower()
    drop = [
        sql.SQL("DROP OWNED BY {}").format(sql.Identifier(name)),
        sql.SQL("DROP ROLE {}").format(sql.Identifier(name)),
    ]
    execute(pg.conninfo(), sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(name)))
    execute(
        pg.conninfo(),
        sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
            sql.Identifier(name), sql.Literal(PASSWORD)
        ),
    )
    yield name
    execute(db, *drop)


def role_conninfo(db, role: str) -> dict[str, str]:
    return {**db, "user": role, "password": PASSWORD}


def test_all_green_on_a_well_configured_database(db):
    execute(
        db,
        "CREATE TABLE orders (id int PRIMARY KEY, note text)",
        "CREATE TABLE events (payload text)",
        "ALTER TABLE events REPLICA IDENTITY FULL",
        "CREATE PUBLICATION pub FOR TABLE orders, events",
    )
    results = run_checks(
        db, publication="pub", slot="main", tables=["public.orders"], create_publication=False
    )
    assert all_ok(results), format_report(results)
    assert by_name(results)["slot"].message.endswith("will be created")
    # No tables configured: every published table is checked.
    execute(db, "SELECT pg_create_logical_replication_slot('main', 'pgoutput')")
    results = run_checks(db, publication="pub", slot="main", tables=[], create_publication=False)
    assert all_ok(results), format_report(results)
    assert by_name(results)["tables"].message == "2 table(s) to capture"
    assert "exists with pgoutput" in by_name(results)["slot"].message
    assert format_report(results).endswith("all checks passed")


def test_missing_publication_is_reported_then_created(db):
    execute(
        db, "CREATE TABLE orders (id int PRIMARY KEY)", "CREATE TABLE items (id int PRIMARY KEY)"
    )
    args = dict(publication="pub", slot="main", tables=["public.orders", "items"])

    results = run_checks(db, **args, create_publication=False)
    assert failed(results) == {"publication"}
    publication = by_name(results)["publication"]
    assert publication.remediation_sql == (
        'CREATE PUBLICATION "pub" FOR TABLE "public"."orders", "public"."items";'
    )
    with psycopg.connect(**db) as conn:
        assert conn.execute("SELECT count(*) FROM pg_publication").fetchone() == (0,)

    results = run_checks(db, **args, create_publication=True)
    assert all_ok(results), format_report(results)
    assert by_name(results)["publication"].message == "created publication 'pub'"
    assert all_ok(run_checks(db, **args, create_publication=False))


def test_publication_missing_a_table_is_extended_only_when_asked(db):
    execute(
        db,
        "CREATE TABLE orders (id int PRIMARY KEY)",
        "CREATE TABLE items (id int PRIMARY KEY)",
        "CREATE PUBLICATION pub FOR TABLE orders WITH (publish = 'insert')",
    )
    args = dict(publication="pub", slot="main", tables=["public.orders", "public.items"])
    results = [r for r in run_checks(db, **args, create_publication=False) if not r.ok]
    assert {r.remediation_sql for r in results} == {
        'ALTER PUBLICATION "pub" ADD TABLE "public"."items";',
        "ALTER PUBLICATION \"pub\" SET (publish = 'insert, update, delete, truncate');",
    }
    results = run_checks(db, **args, create_publication=True)
    added = [r for r in results if r.name == "publication" and r.ok]
    assert added[0].message == "added public.items to publication 'pub'"
    with psycopg.connect(**db) as conn:
        rows = conn.execute("SELECT tablename FROM pg_publication_tables ORDER BY 1").fetchall()
    assert rows == [("items",), ("orders",)]


def test_replica_identity_nothing_and_default_without_key_fail(db):
    execute(
        db,
        "CREATE TABLE keyed (id int PRIMARY KEY)",
        "CREATE TABLE keyless (v text)",
        "CREATE TABLE nothing (id int PRIMARY KEY)",
        "ALTER TABLE nothing REPLICA IDENTITY NOTHING",
        "CREATE TABLE full_keyless (v text)",
        "ALTER TABLE full_keyless REPLICA IDENTITY FULL",
        "CREATE TABLE by_index (id int NOT NULL)",
        "CREATE UNIQUE INDEX by_index_id ON by_index (id)",
        "ALTER TABLE by_index REPLICA IDENTITY USING INDEX by_index_id",
        "CREATE PUBLICATION pub FOR ALL TABLES",
    )
    results = run_checks(db, publication="pub", slot="main", tables=[], create_publication=False)
    assert failed(results) == {"replica identity"}
    identity = by_name(results)["replica identity"]
    assert "public.keyless (DEFAULT, no primary key)" in identity.message
    assert "public.nothing (NOTHING)" in identity.message
    assert identity.remediation_sql.splitlines() == [
        "-- public.keyless has no primary key or usable unique index: with FULL every UPDATE and"
        " DELETE writes the whole old row to the WAL (a primary key avoids that)",
        'ALTER TABLE "public"."keyless" REPLICA IDENTITY FULL;',
        'ALTER TABLE "public"."nothing" REPLICA IDENTITY DEFAULT;',
    ]


def test_role_without_replication_or_select(pg, db, role):
    execute(
        db, "CREATE TABLE orders (id int PRIMARY KEY)", "CREATE PUBLICATION pub FOR TABLE orders"
    )
    results = run_checks(
        role_conninfo(db, role),
        publication="pub",
        slot="main",
        tables=["public.orders"],
        create_publication=True,
    )
    checks = by_name(results)
    assert failed(results) == {"replication privilege", "replication session", "select privilege"}
    assert checks["replication privilege"].remediation_sql == f'ALTER ROLE "{role}" REPLICATION;'
    assert checks["select privilege"].remediation_sql == (
        f'GRANT SELECT ON "public"."orders" TO "{role}";'
    )
    report = format_report(results)
    assert PASSWORD not in report
    assert all(PASSWORD not in (r.message + (r.remediation_sql or "")) for r in results)

    execute(
        pg.conninfo(),
        sql.SQL("ALTER ROLE {} REPLICATION").format(sql.Identifier(role)),
    )
    execute(db, checks["select privilege"].remediation_sql)
    results = run_checks(
        role_conninfo(db, role),
        publication="pub",
        slot="main",
        tables=["public.orders"],
        create_publication=False,
    )
    assert all_ok(results), format_report(results)


def test_role_cannot_create_a_publication_for_tables_it_does_not_own(db, role):
    execute(
        db,
        "CREATE TABLE orders (id int PRIMARY KEY)",
        sql.SQL("GRANT SELECT ON orders TO {}").format(sql.Identifier(role)),
    )
    results = run_checks(
        role_conninfo(db, role),
        publication="pub",
        slot="main",
        tables=["public.orders"],
        create_publication=True,
    )
    publication = by_name(results)["publication"]
    assert not publication.ok
    assert publication.remediation_sql == 'CREATE PUBLICATION "pub" FOR TABLE "public"."orders";'


def test_row_level_security_hides_rows_from_the_role(pg, db, role):
    execute(
        db,
        "CREATE TABLE orders (id int PRIMARY KEY)",
        "ALTER TABLE orders ENABLE ROW LEVEL SECURITY",
        "CREATE PUBLICATION pub FOR TABLE orders",
        sql.SQL("GRANT SELECT ON orders TO {}").format(sql.Identifier(role)),
    )
    execute(pg.conninfo(), sql.SQL("ALTER ROLE {} REPLICATION").format(sql.Identifier(role)))
    args = dict(publication="pub", slot="main", tables=["public.orders"], create_publication=False)
    results = run_checks(role_conninfo(db, role), **args)
    assert failed(results) == {"row-level security"}
    security = by_name(results)["row-level security"]
    assert "snapshot would miss rows" in security.message
    assert security.remediation_sql == f'ALTER ROLE "{role}" BYPASSRLS;'
    # The superuser bypasses row-level security.
    assert all_ok(run_checks(db, **args))


def test_slot_with_another_plugin_fails_and_is_kept(db):
    execute(
        db,
        "CREATE TABLE orders (id int PRIMARY KEY)",
        "CREATE PUBLICATION pub FOR TABLE orders",
        "SELECT pg_create_logical_replication_slot('theirs', 'test_decoding')",
    )
    results = run_checks(
        db, publication="pub", slot="theirs", tables=["public.orders"], create_publication=True
    )
    assert failed(results) == {"slot"}
    assert "plugin 'test_decoding'" in by_name(results)["slot"].message
    with psycopg.connect(**db) as conn:
        plugin = conn.execute(
            "SELECT plugin FROM pg_replication_slots WHERE slot_name = 'theirs'"
        ).fetchone()
    assert plugin == ("test_decoding",)


def test_hostile_table_name_is_quoted_in_remediation(db):
    table = sql.Identifier("public", HOSTILE)
    execute(
        db,
        sql.SQL("CREATE TABLE {} (v text)").format(table),
        sql.SQL("ALTER TABLE {} REPLICA IDENTITY NOTHING").format(table),
    )
    results = run_checks(
        db,
        publication='p"ub ; x',
        slot="main",
        tables=[f"public.{HOSTILE}"],
        create_publication=False,
    )
    checks = by_name(results)
    quoted = '"public"."we""ird ; DROP TABLE t; --"'
    # the table joins the publication only once its identity can carry its updates
    assert checks["replica identity"].remediation_sql.splitlines()[1:] == [
        f"ALTER TABLE {quoted} REPLICA IDENTITY FULL;",
        f'ALTER PUBLICATION "p""ub ; x" ADD TABLE {quoted};',
    ]
    assert checks["publication"].remediation_sql == 'CREATE PUBLICATION "p""ub ; x";'
    # The remediation is valid SQL that fixes exactly what was reported.
    execute(db, checks["publication"].remediation_sql, checks["replica identity"].remediation_sql)
    results = run_checks(
        db,
        publication='p"ub ; x',
        slot="main",
        tables=[f"public.{HOSTILE}"],
        create_publication=False,
    )
    assert all_ok(results), format_report(results)


def test_missing_table_is_reported_and_others_still_checked(db):
    execute(db, "CREATE TABLE keyless (v text)", "CREATE PUBLICATION pub FOR TABLE keyless")
    results = run_checks(
        db,
        publication="pub",
        slot="main",
        tables=["public.keyless", "public.absent"],
        create_publication=False,
    )
    assert failed(results) == {"tables", "replica identity"}
    assert "public.absent" in by_name(results)["tables"].message


def test_unreachable_server_or_wrong_password_is_one_failed_check(db):
    results = run_checks(
        {**db, "password": PASSWORD},
        publication="pub",
        slot="main",
        tables=[],
        create_publication=False,
    )
    assert [(r.name, r.ok) for r in results] == [("server", False)]
    assert PASSWORD not in results[0].message
    assert "password authentication failed" in results[0].message


def test_wal_level_replica_needs_logical_and_a_restart():
    result = wal_level_result("replica")
    assert not result.ok
    assert result.remediation_sql.splitlines()[0] == "ALTER SYSTEM SET wal_level = 'logical';"
    assert "restart" in result.remediation_sql
    assert wal_level_result("logical").ok


def test_capacity_checks_count_what_capture_needs():
    assert free_slots_result(10, 8, needed=2).ok
    short = free_slots_result(10, 9, needed=2)
    assert not short.ok
    assert short.message == "1 of max_replication_slots = 10 free, 2 needed"
    assert short.remediation_sql.startswith('ALTER SYSTEM SET "max_replication_slots" = 11;')
    assert not free_wal_senders_result(4, 4, needed=1).ok


def test_old_server_is_a_warning_not_a_failure():
    result = server_version_result(130011, "13.11")
    assert result.ok
    assert "warning" in result.message


def test_replica_identity_on_values():
    def table(identity: str, key: bool) -> TableFacts:
        return TableFacts("s", f"{identity}{key}", True, identity, key, True, True, False)

    ok = [table("f", False), table("d", True), table("i", False)]
    assert check_replica_identity(None, ok).ok
    assert not check_replica_identity(None, [table("d", False)]).ok


def test_format_report_marks_and_indents():
    report = format_report(
        [
            CheckResult("wal_level", True, "wal_level = logical"),
            CheckResult("slot", False, "bad", "SELECT 1;\nSELECT 2;"),
        ]
    )
    assert report.splitlines() == [
        "✓ wal_level: wal_level = logical",
        "✗ slot: bad",
        "    SELECT 1;",
        "    SELECT 2;",
        "1 check(s) failed",
    ]


ORDINARY_SCHEMA = """
CREATE TABLE keyed (id int PRIMARY KEY, v text);
CREATE TABLE keyless (v text);
CREATE TABLE by_unique (code text NOT NULL UNIQUE, v text);
CREATE TABLE nothing (id int PRIMARY KEY, v text);
ALTER TABLE nothing REPLICA IDENTITY NOTHING;
CREATE TABLE gen_keyless (a int, doubled int GENERATED ALWAYS AS (a * 2) STORED);
CREATE TABLE gen_full (id int PRIMARY KEY, a int, doubled int GENERATED ALWAYS AS (a * 2) STORED);
"""
PG18_SCHEMA = """
ALTER TABLE gen_full REPLICA IDENTITY FULL;
CREATE TABLE virt_keyed (
    id int PRIMARY KEY, a int, tripled int GENERATED ALWAYS AS (a * 3) VIRTUAL);
"""
TABLES = ("keyed", "keyless", "by_unique", "nothing", "gen_keyless", "gen_full")


def test_every_remediation_is_safe_to_run_in_production(any_db):
    """Doctor's whole remediation, pasted as it is, then the application's own INSERTs,
    UPDATEs and DELETEs on every table from an ordinary session: none may fail (PostgreSQL 18
    rejects them when the identity holds unpublished generated columns, any server when a
    published table has no identity). Afterwards every table is published and doctor has
    nothing left to say about identities."""
    with psycopg.connect(**any_db) as conn:
        pg18 = conn.info.server_version >= 180000
    tables = TABLES + (("virt_keyed",) if pg18 else ())
    execute(any_db, ORDINARY_SCHEMA + (PG18_SCHEMA if pg18 else ""))

    def doctor():
        return run_checks(
            any_db,
            publication="pub",
            slot="main",
            tables=[f"public.{t}" for t in tables],
            create_publication=False,
        )

    results = doctor()
    assert "replica identity" in failed(results)
    with psycopg.connect(**any_db, autocommit=True) as conn:
        for result in results:
            if result.remediation_sql and result.name in ("publication", "replica identity"):
                conn.execute(result.remediation_sql)
    with psycopg.connect(**any_db, autocommit=True) as app:
        app.execute("INSERT INTO keyed VALUES (1, 'a'); INSERT INTO keyless VALUES ('a')")
        app.execute("INSERT INTO by_unique VALUES ('c', 'a'); INSERT INTO nothing VALUES (1, 'a')")
        app.execute("INSERT INTO gen_keyless (a) VALUES (1); INSERT INTO gen_full VALUES (1, 1)")
        if pg18:
            app.execute("INSERT INTO virt_keyed (id, a) VALUES (1, 1)")
        for t in tables:
            column, value = ("a", "2") if t.startswith(("gen", "virt")) else ("v", "'b'")
            app.execute(f"UPDATE {t} SET {column} = {value}")
            app.execute(f"DELETE FROM {t}")
        published = {
            r[0] for r in app.execute("SELECT tablename FROM pg_publication_tables").fetchall()
        }
    assert published == set(tables)
    after = by_name(doctor())
    assert after["replica identity"].ok, after["replica identity"]
    assert after["publication"].ok, after["publication"]


def test_full_is_never_advised_where_postgresql_18_would_reject_updates():
    def table(name, identity="d", key=False, index=None, stored=False, virtual=False):
        return TableFacts("s", name, True, identity, key, True, True, False, index, stored, virtual)

    def advice(t, version=180006, publishes=False):
        result = identity_advice(
            None, t, server_version=version, publication="p", publishes_generated=publishes
        )
        return None if result is None else result.statements

    assert advice(table("keyed", key=True)) is None
    assert advice(table("by_index", index="t_code_key")) == (
        'ALTER TABLE "s"."by_index" REPLICA IDENTITY USING INDEX "t_code_key";',
    )
    stored = advice(table("g", stored=True))
    assert stored[1] == 'ALTER PUBLICATION "p" SET (publish_generated_columns = stored);'
    assert stored[-1] == 'ALTER TABLE "s"."g" REPLICA IDENTITY FULL;'
    assert advice(table("g", stored=True), publishes=True)[-1].endswith("IDENTITY FULL;")
    assert advice(table("g", stored=True), version=170000)[-1].endswith("IDENTITY FULL;")
    assert all(line.startswith("--") for line in advice(table("v", virtual=True)))
    assert advice(table("f", "f", key=True, stored=True)) == (
        'ALTER TABLE "s"."f" REPLICA IDENTITY DEFAULT;',
    )
    assert advice(table("f", "f", stored=True), publishes=True) is None


def test_column_policies_are_checked_against_the_catalog(db):
    from pgmedallion.checks import check_column_policies
    from pgmedallion.core.config import ColumnPolicy, TablePolicy
    from tests.workload import make_config

    execute(db, "CREATE TABLE ledger (id int PRIMARY KEY, ratio numeric, memo text)")
    good = {"ratio": ColumnPolicy("decimal(38,30)"), "memo": ColumnPolicy("string")}
    cfg = make_config(db, "cp", **{"public.ledger": TablePolicy(columns=good)})
    assert check_column_policies(cfg).ok
    bad = {
        "ratio": ColumnPolicy("double"),
        "nope": ColumnPolicy("string"),
        "memo": ColumnPolicy("int"),
    }
    result = check_column_policies(
        make_config(db, "cp", **{"public.ledger": TablePolicy(columns=bad)})
    )
    assert not result.ok
    assert (
        "[tables.\"public.ledger\".columns] nope: public.ledger has no column 'nope'"
        in result.message
    )
    assert '[tables."public.ledger".columns] memo: text cannot be read as int' in result.message
    assert "ratio" not in result.message
