"""The project-owned PostgreSQL: logical replication on, password auth, a pgoutput slot works."""

from __future__ import annotations

import psycopg
import pytest

from pgmedallion.capture.pgoutput import Begin, Commit, Insert, Relation, decode
from pgmedallion.localpg import LocalPostgres


def test_server_is_configured_for_logical_replication(any_pg: LocalPostgres):
    with psycopg.connect(**any_pg.conninfo()) as conn:
        settings = dict(
            conn.execute(
                "SELECT name, setting FROM pg_settings WHERE name IN "
                "('wal_level', 'max_replication_slots', 'max_wal_senders', 'listen_addresses')"
            ).fetchall()
        )
    assert settings["wal_level"] == "logical"
    assert int(settings["max_replication_slots"]) >= 10
    assert int(settings["max_wal_senders"]) >= 10
    assert settings["listen_addresses"] == "127.0.0.1"


def test_wrong_password_is_refused(pg: LocalPostgres):
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(**{**pg.conninfo(), "password": "not-the-password"})


def test_start_is_idempotent(pg: LocalPostgres):
    again = LocalPostgres(pg.state_dir, bin_dir=pg.bin_dir).start()
    assert again.port == pg.port and again.is_running()


def test_pgoutput_slot_sees_a_change(any_db):
    with psycopg.connect(**any_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, name text)")
        conn.execute("CREATE PUBLICATION p FOR TABLE t")
        conn.execute("SELECT pg_create_logical_replication_slot('localpg_s', 'pgoutput')")
        conn.execute("INSERT INTO t VALUES (1, 'hello')")
        rows = conn.execute(
            "SELECT data FROM pg_logical_slot_get_binary_changes("
            "'localpg_s', NULL, NULL, 'proto_version', '1', 'publication_names', 'p')"
        ).fetchall()
    messages = [decode(data) for (data,) in rows]
    assert [type(m) for m in messages] == [Begin, Relation, Insert, Commit]
    assert messages[1].name == "t"
    assert messages[2].new == (b"1", b"hello")
