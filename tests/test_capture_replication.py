"""The replication side of capture against real servers: transactions, acks, frontier, slots."""

from __future__ import annotations

import struct
import time

import psycopg
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pgmedallion.capture.connection import connect, connect_replication
from pgmedallion.capture.errors import (
    PublicationDropped,
    SlotCompacted,
    SlotInUse,
    SlotMissing,
    SlotPluginMismatch,
    TimelineChanged,
    TransientError,
)
from pgmedallion.capture.pgoutput import Begin, Commit, Delete, Insert, Truncate, Update, decode
from pgmedallion.capture.replication import (
    Keepalive,
    WalMessage,
    XLogData,
    parse_copy_data,
    standby_status,
    start_replication,
)
from pgmedallion.capture.slot import (
    check_resume_point,
    check_system,
    current_wal_lsn,
    ensure_slot,
    identify_system,
    release_slot,
    slot_state,
)
from pgmedallion.capture.snapshot import publication_tables


def slot_for(conninfo) -> str:
    """Slot names are cluster-wide: name them after the test's own database."""
    return "s" + conninfo["dbname"]


def setup_source(conninfo) -> tuple[psycopg.Connection, psycopg.Connection, int]:
    """Tables ``t`` (published by ``p``) and ``u`` (not), the main slot; its start LSN."""
    conn = connect(conninfo)
    conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    conn.execute("CREATE TABLE u (id int)")
    conn.execute("CREATE PUBLICATION p FOR TABLE t")
    repl = connect_replication(conninfo)
    return conn, repl, ensure_slot(repl, slot_for(conninfo)).confirmed_flush_lsn


def write(conn: psycopg.Connection, *statements: str) -> int:
    """Run the statements as one transaction; its 32-bit xid."""
    with conn.transaction():
        for statement in statements:
            conn.execute(statement)
        (xid,) = conn.execute("SELECT pg_current_xact_id()::text::int8").fetchone()
    return xid & 0xFFFFFFFF


def transactions(events) -> list[list[WalMessage]]:
    """Group messages by commit LSN, in arrival order."""
    grouped: dict[int, list[WalMessage]] = {}
    for event in events:
        if isinstance(event, WalMessage):
            grouped.setdefault(event.commit_lsn, []).append(event)
    return list(grouped.values())


def wait_for_confirmed_flush(conn, slot: str, lsn: int, timeout_s: float = 10.0) -> int:
    deadline = time.monotonic() + timeout_s
    while (confirmed := slot_state(conn, slot).confirmed_flush_lsn) != lsn:
        assert time.monotonic() < deadline, f"confirmed_flush_lsn stuck at {confirmed:X}"
        time.sleep(0.05)
    return confirmed


def test_transactions_arrive_begin_to_commit(any_db):
    conn, repl, start = setup_source(any_db)
    xids = [
        write(conn, "INSERT INTO t VALUES (1, 'a')", "INSERT INTO t VALUES (2, 'b')"),
        write(conn, "UPDATE t SET v = 'c' WHERE id = 1"),
        write(conn, "DELETE FROM t WHERE id = 2"),
        write(conn, "TRUNCATE t"),
    ]
    target = current_wal_lsn(conn)
    stream = start_replication(repl, slot_for(any_db), "p", start)
    events = list(stream.read_until(target))
    txns = transactions(events)

    assert [txn[0].xid for txn in txns] == xids
    kinds = [[type(decode(m.payload)) for m in txn] for txn in txns]
    changes = [[k for k in txn if k in (Insert, Update, Delete, Truncate)] for txn in kinds]
    assert changes == [[Insert, Insert], [Update], [Delete], [Truncate]]
    commit_lsns = [txn[0].commit_lsn for txn in txns]
    assert commit_lsns == sorted(set(commit_lsns)) and commit_lsns[0] > start
    for txn in txns:
        begin, commit = decode(txn[0].payload), decode(txn[-1].payload)
        assert isinstance(begin, Begin) and isinstance(commit, Commit)
        assert [m.ordinal for m in txn] == list(range(len(txn)))
        assert {m.commit_lsn for m in txn} == {begin.final_lsn} == {commit.commit_lsn}
        assert {m.xid for m in txn} == {begin.xid}
        assert commit.commit_lsn < commit.end_lsn
    assert decode(txns[-1][-1].payload).end_lsn >= target
    assert events[-1] is txns[-1][-1]
    assert stream.position >= target and not stream.in_transaction


def test_ack_moves_confirmed_flush_exactly_and_never_beyond(db):
    conn, repl, start = setup_source(db)
    for i in range(3):
        write(conn, f"INSERT INTO t VALUES ({i}, 'x')")
    target = current_wal_lsn(conn)
    stream = start_replication(repl, slot_for(db), "p", start)
    ends = [decode(txn[-1].payload).end_lsn for txn in transactions(stream.read_until(target))]
    assert len(ends) == 3

    stream.ack(ends[0])
    assert wait_for_confirmed_flush(conn, slot_for(db), ends[0]) == ends[0]
    # The reader keeps answering the server (idle polls) without acknowledging anything more.
    conn.execute("INSERT INTO u VALUES (1)")
    list(stream.read_until(current_wal_lsn(conn), poll_interval_s=0.1))
    time.sleep(0.3)
    assert slot_state(conn, slot_for(db)).confirmed_flush_lsn == ends[0]
    stream.ack(ends[0] - 1)
    stream.ack(ends[2])
    assert wait_for_confirmed_flush(conn, slot_for(db), ends[2]) == ends[2]


def test_keepalives_carry_the_frontier_when_nothing_is_published(any_db):
    conn, repl, start = setup_source(any_db)
    for i in range(3):
        write(conn, f"INSERT INTO u VALUES ({i})")
    target = current_wal_lsn(conn)
    stream = start_replication(repl, slot_for(any_db), "p", start)
    events = list(stream.read_until(target, poll_interval_s=0.2))
    assert events and all(isinstance(e, Keepalive) for e in events)
    frontier = events[-1].wal_end
    assert frontier >= target
    stream.ack(frontier)
    assert wait_for_confirmed_flush(conn, slot_for(any_db), frontier) >= target


def test_resume_from_an_acked_lsn_rereads_nothing_before_it(any_db):
    conn, repl, start = setup_source(any_db)
    write(conn, "INSERT INTO t VALUES (1, 'first')")
    write(conn, "INSERT INTO t VALUES (2, 'second')")
    target = current_wal_lsn(conn)
    slot = slot_for(any_db)
    stream = start_replication(repl, slot, "p", start)
    first, second = transactions(stream.read_until(target))
    acked = decode(first[-1].payload).end_lsn
    stream.ack(acked)
    wait_for_confirmed_flush(conn, slot, acked)
    stream.close()
    repl.close()

    repl = connect_replication(any_db)
    state = slot_state(conn, slot)
    check_resume_point(state, acked)
    with pytest.raises(SlotCompacted):
        check_resume_point(state, acked - 1)
    stream = start_replication(repl, slot, "p", acked)
    (again,) = transactions(stream.read_until(target))
    # A new session sends the Relation again, so only the transaction's own messages compare.
    assert [m.payload for m in again if m.payload[:1] != b"R"] == [m.payload for m in second]
    assert {m.commit_lsn for m in again} == {second[0].commit_lsn}
    assert [m.ordinal for m in again] == list(range(len(again)))


def test_stream_ends_cleanly_and_the_session_is_reusable(db):
    conn, repl, start = setup_source(db)
    write(conn, "INSERT INTO t VALUES (1, 'a')")
    with start_replication(repl, slot_for(db), "p", start) as stream:
        next(iter(stream.read_until(current_wal_lsn(conn))))
    assert repl.execute("SELECT 1").fetchone() == (1,)
    assert slot_state(conn, slot_for(db)).active_pid is None


def test_a_stale_holder_is_terminated(db):
    conn, stale, start = setup_source(db)
    slot = slot_for(db)
    held = start_replication(stale, slot, "p", start)
    with pytest.raises(SlotInUse):
        start_replication(connect_replication(db), slot, "p", start)
    assert release_slot(conn, slot).active_pid is None
    with pytest.raises(TransientError):
        list(held.read_until(current_wal_lsn(conn) + 1, poll_interval_s=0.1))
    fresh = start_replication(connect_replication(db), slot, "p", start)
    assert slot_state(conn, slot).active_pid is not None
    fresh.close()


def test_missing_slot_and_publication_are_definite(any_db):
    conn, repl, start = setup_source(any_db)
    with pytest.raises(SlotMissing):
        start_replication(repl, "no_such_slot", "p", 0)
    write(conn, "INSERT INTO t VALUES (1, 'a')")
    conn.execute("DROP PUBLICATION p")
    write(conn, "INSERT INTO t VALUES (2, 'b')")
    with pytest.raises(PublicationDropped):
        publication_tables(conn, "p")
    stream = start_replication(repl, slot_for(any_db), "p", start)
    if conn.info.server_version >= 180000:
        # PostgreSQL 18 skips a missing publication with a warning: only publication_tables
        # (checked at every run) can notice.
        (txn,) = transactions(stream.read_until(current_wal_lsn(conn)))
        assert [decode(m.payload) for m in txn][2].new == (b"1", b"a")
        return
    with pytest.raises(PublicationDropped):
        list(stream.read_until(current_wal_lsn(conn)))


def test_slot_with_another_plugin_is_refused_and_kept(db):
    conn = connect(db)
    slot = slot_for(db)
    try:
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'test_decoding')", (slot,))
    except psycopg.errors.UndefinedFile:
        pytest.skip("this server has no test_decoding plugin")
    with pytest.raises(SlotPluginMismatch, match="test_decoding"):
        ensure_slot(connect_replication(db), slot)
    assert slot_state(conn, slot).plugin == "test_decoding"


def test_identify_system_guards_the_timeline(db):
    found = identify_system(connect_replication(db))
    assert found.timeline >= 1 and found.database == db["dbname"]
    check_system(found, found)
    moved = type(found)(found.system_id, found.timeline + 1, found.wal_position, found.database)
    with pytest.raises(TimelineChanged):
        check_system(found, moved)


def test_copy_data_layouts():
    header = struct.pack(">cQQq", b"w", 0x1_0000_00A0, 0x1_0000_00B0, 42)
    assert parse_copy_data(header + b"B...") == XLogData(0x1_0000_00A0, 0x1_0000_00B0, 42, b"B...")
    assert parse_copy_data(struct.pack(">cQqB", b"k", 7, 9, 1)) == Keepalive(7, 9, True)
    with pytest.raises(TransientError):
        parse_copy_data(b"k\x00")
    status = standby_status(0xABCDEF, True, 123)
    assert status == b"r" + struct.pack(">QQQqB", 0xABCDEF, 0xABCDEF, 0xABCDEF, 123, 1)


@given(lsn=st.integers(0, 2**64 - 1), now=st.integers(0, 2**62), reply=st.booleans())
def test_standby_status_is_34_bytes_big_endian(lsn, now, reply):
    status = standby_status(lsn, reply, now)
    assert len(status) == 34 and status[:1] == b"r"
    assert struct.unpack(">QQQqB", status[1:]) == (lsn, lsn, lsn, now, int(reply))
