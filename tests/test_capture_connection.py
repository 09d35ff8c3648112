"""Capture sessions: pinned text formats, errors as types, no password in any message."""

from __future__ import annotations

import psycopg
import pytest

from pgmedallion.capture.connection import SESSION_SETTINGS, connect, connect_replication, redact
from pgmedallion.capture.errors import (
    DefiniteError,
    PublicationDropped,
    SlotInUse,
    SlotInvalidated,
    SlotMissing,
    TableDropped,
    TransientError,
    classify,
    server_errors,
)
from pgmedallion.capture.pgoutput import Insert, decode
from pgmedallion.capture.replication import WalMessage, start_replication
from pgmedallion.capture.slot import current_wal_lsn, ensure_slot
from pgmedallion.capture.snapshot import WHOLE_TABLE, copy_range, exported_snapshot

# A caller's own options are kept, but cannot change how values print.
HOSTILE_OPTIONS = "-c application_name=pgm_test -c TimeZone=Asia/Kolkata -c DateStyle=SQL,DMY"

VALUES = (
    "'2024-02-29 23:59:59.123456+05:30'::timestamptz, '\\x00ff'::bytea, 0.1::float8,"
    " '1 year 2 mons 3 days 04:05:06'::interval, 'Größe\t☃'::text, '2024-02-29'::date"
)


@pytest.mark.parametrize("open_session", [connect, connect_replication])
def test_sessions_pin_text_formats(any_db, open_session):
    conn = open_session(dict(any_db, options=HOSTILE_OPTIONS))
    shown = {name: conn.execute(f"SHOW {name}").fetchone()[0] for name in SESSION_SETTINGS}
    assert shown == dict(SESSION_SETTINGS, DateStyle="ISO, MDY")  # shown normalised
    assert conn.execute("SHOW application_name").fetchone() == ("pgm_test",)


def test_snapshot_and_stream_print_values_alike(any_db):
    conn = connect(any_db)
    conn.execute(f"CREATE TABLE t AS SELECT {VALUES}")
    conn.execute("CREATE PUBLICATION p FOR TABLE t")
    slot = "s" + any_db["dbname"]
    repl = connect_replication(dict(any_db, options=HOSTILE_OPTIONS))
    start = ensure_slot(repl, slot).confirmed_flush_lsn
    conn.execute("INSERT INTO t SELECT * FROM t")
    columns = [
        name
        for (name,) in conn.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = 't'::regclass AND attnum > 0"
            " ORDER BY attnum"
        ).fetchall()
    ]
    with exported_snapshot(any_db, "tmp_" + slot) as point:
        (snapshot_row,) = set(
            copy_range(
                dict(any_db, options=HOSTILE_OPTIONS),
                point.snapshot_name,
                ("public", "t"),
                columns,
                WHOLE_TABLE,
            )
        )
    stream = start_replication(repl, slot, "p", start)
    (insert,) = [
        decode(e.payload)
        for e in stream.read_until(current_wal_lsn(conn))
        if isinstance(e, WalMessage) and e.payload[:1] == b"I"
    ]
    assert isinstance(insert, Insert)
    escaped = [v.replace(b"\\", b"\\\\").replace(b"\t", b"\\t") for v in insert.new]
    assert snapshot_row == b"\t".join(escaped)
    assert insert.new[:4] == (
        b"2024-02-29 18:29:59.123456+00",
        b"\\x00ff",
        b"0.1",
        b"1 year 2 mons 3 days 04:05:06",
    )


def test_connection_failures_are_transient_and_never_show_the_password(db):
    secret = "not-the-password-" + db["password"][::-1]
    with pytest.raises(TransientError) as wrong_password:
        connect(dict(db, password=secret))
    with pytest.raises(TransientError) as refused:
        connect_replication(dict(db, port="1"))
    for error in (wrong_password.value, refused.value):
        text = str(error)
        assert "\n" not in text and "********" in text
        assert secret not in text and db["password"] not in text
    assert "authentication" in str(wrong_password.value)


def test_redact_masks_secrets_only():
    info = {"host": "h", "port": "5432", "user": "u", "password": "p4ss", "sslpassword": "k"}
    assert redact(info) == "host=h port=5432 user=u password=******** sslpassword=********"


@pytest.mark.parametrize(
    ("sqlstate", "message", "expected"),
    [
        ("42704", 'replication slot "s" does not exist', SlotMissing),
        ("42704", 'publication "p" does not exist', PublicationDropped),
        ("55006", 'replication slot "s" is active for PID 7', SlotInUse),
        ("55000", 'can no longer get changes from replication slot "s"', SlotInvalidated),
        ("42P01", 'relation "t" does not exist', TableDropped),
        ("57P01", "terminating connection due to administrator command", TransientError),
        (None, "server closed the connection unexpectedly", TransientError),
    ],
)
def test_server_errors_map_to_types(sqlstate, message, expected):
    error = classify(sqlstate, message + "\n\tThis probably means ...")
    assert type(error) is expected and error.sqlstate == sqlstate
    assert "\n" not in str(error)
    assert issubclass(expected, DefiniteError) != issubclass(expected, TransientError)


def test_server_errors_translates_psycopg_errors(db):
    conn = connect(db)
    with pytest.raises(TableDropped) as raised, server_errors():
        conn.execute("SELECT * FROM no_such_table")
    assert isinstance(raised.value.__cause__, psycopg.errors.UndefinedTable)
