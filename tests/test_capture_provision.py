"""The doctor preflight against the embedded PostgreSQL 18, and its pure checks on values."""

from __future__ import annotations

import psycopg
import pytest
from psycopg import sql

from capture.provision import (
    CheckResult,
    TableInfo,
    all_ok,
    check_replica_identity,
    format_report,
    free_slots_result,
    free_wal_senders_result,
    run_checks,
    server_version_result,
    wal_level_result,
)

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
    assert "public.keyless (DEFAULT, no PK)" in identity.message
    assert "public.nothing (NOTHING)" in identity.message
    assert identity.remediation_sql.splitlines() == [
        'ALTER TABLE "public"."keyless" REPLICA IDENTITY FULL;',
        'ALTER TABLE "public"."nothing" REPLICA IDENTITY FULL;',
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
    assert checks["replica identity"].remediation_sql == (
        f"ALTER TABLE {quoted} REPLICA IDENTITY FULL;"
    )
    assert checks["publication"].remediation_sql == (
        f'CREATE PUBLICATION "p""ub ; x" FOR TABLE {quoted};'
    )
    # The remediation is valid SQL that fixes exactly what was reported.
    execute(db, checks["replica identity"].remediation_sql, checks["publication"].remediation_sql)
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
    def table(identity: str, key: bool) -> TableInfo:
        return TableInfo("s", f"{identity}{key}", True, identity, key, True, True, False)

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
