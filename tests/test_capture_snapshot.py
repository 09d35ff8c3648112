"""The snapshot side of capture against real servers: exact rows, hostile names, one LSN."""

from __future__ import annotations

import re

import psycopg
import pytest
from hypothesis import given
from hypothesis import strategies as st
from psycopg import sql

from pgmedallion.capture.connection import connect, connect_replication
from pgmedallion.capture.errors import TableDropped, TransientError
from pgmedallion.capture.pgoutput import Delete, decode
from pgmedallion.capture.replication import WalMessage, start_replication
from pgmedallion.capture.slot import current_wal_lsn, ensure_slot
from pgmedallion.capture.snapshot import (
    WHOLE_TABLE,
    copy_range,
    estimate_table_block_counts,
    exported_snapshot,
    publication_tables,
    table_schema_at_snapshot,
    use_snapshot,
    worker_ctid_ranges,
)

SALES = 'Sales "EU"'
ORDER_ITEMS = (SALES, "Order Items; DROP TABLE x")
CUSTOMERS = (SALES, 'Kunden "Ä"')
NOTES = ("public", "notes\ttab ☃")
PUBLICATION = 'pub "q", r'
BIG_ROWS = 20_000

_ESCAPES = {"b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v", "\\": "\\"}


def slot_for(conninfo) -> str:
    """Slot names are cluster-wide: name them after the test's own database."""
    return "s" + conninfo["dbname"]


def copy_text_row(line: bytes) -> tuple[str | None, ...]:
    """A COPY TEXT row as strings (a stand-in until silver's decoder exists)."""
    return tuple(
        None
        if field == b"\\N"
        else re.sub(r"\\(.)", lambda m: _ESCAPES[m.group(1)], field.decode())
        for field in line.split(b"\t")
    )


def order_item(i: int) -> tuple[str, str | None, str]:
    size = None if i % 7 == 0 else f'größe {i}\t"tab"\nline \\ back ☃'
    return (str(i), size, f"{i * 3 % 101}")


def create_tables(conn: psycopg.Connection) -> None:
    conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(SALES)))
    conn.execute(
        sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, {} text, {} int NOT NULL)").format(
            sql.Identifier(*ORDER_ITEMS), sql.Identifier("Größe ☃"), sql.Identifier("q ty")
        )
    )
    conn.execute(
        sql.SQL(
            "CREATE TABLE {} ({} text, region text, note text, PRIMARY KEY (region, {}))"
        ).format(sql.Identifier(*CUSTOMERS), sql.Identifier('na"me'), sql.Identifier('na"me'))
    )
    conn.execute(sql.SQL("CREATE TABLE {} (body text)").format(sql.Identifier(*NOTES)))
    with conn.cursor() as cur:
        with cur.copy(sql.SQL("COPY {} FROM STDIN").format(sql.Identifier(*ORDER_ITEMS))) as cp:
            for i in range(1, BIG_ROWS + 1):
                cp.write_row(order_item(i))
        cur.execute(
            sql.SQL("INSERT INTO {} VALUES ('Zoë', 'EU', NULL), ('\\N', 'UK', '')").format(
                sql.Identifier(*CUSTOMERS)
            )
        )
        cur.execute(sql.SQL("INSERT INTO {} VALUES (NULL)").format(sql.Identifier(*NOTES)))
    conn.execute(
        sql.SQL("CREATE PUBLICATION {} FOR TABLE {}, {}, {}").format(
            sql.Identifier(PUBLICATION),
            sql.Identifier(*ORDER_ITEMS),
            sql.Identifier(*CUSTOMERS),
            sql.Identifier(*NOTES),
        )
    )


def read_table(conninfo, snapshot_name, schema, ranges) -> list[tuple[str | None, ...]]:
    columns = [column.name for column in schema.columns]
    return [
        copy_text_row(line)
        for ctid_range in ranges
        for line in copy_range(
            conninfo, snapshot_name, (schema.schema, schema.name), columns, ctid_range
        )
    ]


def test_snapshot_of_hostile_tables_is_exact_across_ranges(any_db):
    conn = connect(any_db)
    create_tables(conn)
    tables = publication_tables(conn, PUBLICATION)
    assert [(t.schema, t.name) for t in tables] == sorted([ORDER_ITEMS, CUSTOMERS, NOTES])
    with exported_snapshot(any_db, "tmp_" + slot_for(any_db)) as point:
        reader = connect(any_db)
        use_snapshot(reader, point.snapshot_name)
        blocks = estimate_table_block_counts(reader, [t.oid for t in tables])
        got = {}
        for table in tables:
            schema = table_schema_at_snapshot(reader, table.oid)
            ranges = worker_ctid_ranges(blocks[table.oid], 4, reader.info.server_version)
            got[(schema.schema, schema.name)] = (
                schema,
                ranges,
                read_table(any_db, point.snapshot_name, schema, ranges),
            )
    order_schema, order_ranges, order_rows = got[ORDER_ITEMS]
    assert [c.name for c in order_schema.columns] == ["id", "Größe ☃", "q ty"]
    assert order_schema.primary_key == ("id",)
    assert len(order_ranges) == 4 and order_ranges[-1][1] is None
    assert blocks[order_schema.oid] >= 40
    assert len(order_rows) == BIG_ROWS
    assert sorted(order_rows, key=lambda r: int(r[0])) == [
        order_item(i) for i in range(1, BIG_ROWS + 1)
    ]
    customers_schema, _, customer_rows = got[CUSTOMERS]
    assert customers_schema.primary_key == ("region", 'na"me')
    assert sorted(customer_rows, key=str) == sorted(
        [("Zoë", "EU", None), ("\\N", "UK", "")], key=str
    )
    notes_schema, _, note_rows = got[NOTES]
    assert notes_schema.primary_key == () and notes_schema.replica_identity == "d"
    assert note_rows == [(None,)]


def test_every_range_reads_its_own_blocks(db):
    conn = connect(db)
    create_tables(conn)
    (oid,) = conn.execute(
        sql.SQL("SELECT {}::regclass::oid::int8").format(
            sql.Literal(sql.Identifier(*ORDER_ITEMS).as_string(conn))
        )
    ).fetchone()
    with exported_snapshot(db, "tmp_" + slot_for(db)) as point:
        schema = table_schema_at_snapshot(conn, oid)
        ranges = worker_ctid_ranges(estimate_table_block_counts(conn, [oid])[oid], 4, 180000)
        sizes = [len(read_table(db, point.snapshot_name, schema, [r])) for r in ranges]
    assert all(size > 0 for size in sizes) and sum(sizes) == BIG_ROWS


def test_concurrent_writes_are_in_the_stream_not_the_snapshot(any_db):
    conn = connect(any_db)
    conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    conn.execute("INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 50) g")
    conn.execute("CREATE PUBLICATION p FOR TABLE t")
    repl = connect_replication(any_db)
    slot = ensure_slot(repl, slot_for(any_db))
    conn.execute("INSERT INTO t VALUES (1000, 'before snapshot')")
    (oid,) = conn.execute("SELECT 't'::regclass::oid::int8").fetchone()
    with exported_snapshot(any_db, "tmp_" + slot_for(any_db)) as point:
        conn.execute("INSERT INTO t VALUES (2000, 'during snapshot')")
        conn.execute("UPDATE t SET v = 'changed' WHERE id = 1")
        conn.execute("DELETE FROM t WHERE id = 2")
        reader = connect(any_db)
        use_snapshot(reader, point.snapshot_name)
        schema = table_schema_at_snapshot(reader, oid)
        snapshot_rows = read_table(any_db, point.snapshot_name, schema, [WHOLE_TABLE])
    expected = [(str(i), f"v{i}") for i in range(1, 51)] + [("1000", "before snapshot")]
    assert sorted(snapshot_rows) == sorted(expected)

    target = current_wal_lsn(conn)
    stream = start_replication(repl, slot.name, "p", slot.confirmed_flush_lsn)
    changes = {}
    for event in stream.read_until(target):
        if isinstance(event, WalMessage) and event.payload[:1] in (b"I", b"U", b"D"):
            message = decode(event.payload)
            row = message.old if isinstance(message, Delete) else message.new
            changes[row[0]] = event.commit_lsn
    stream.close()
    assert set(changes) == {b"1000", b"2000", b"1", b"2"}
    assert changes[b"1000"] <= point.snapshot_lsn
    assert all(changes[key] > point.snapshot_lsn for key in (b"2000", b"1", b"2"))


def test_schema_is_read_as_of_the_snapshot(db):
    conn = connect(db)
    conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    conn.execute("ALTER TABLE t REPLICA IDENTITY FULL")
    conn.execute("CREATE TABLE gone (id int)")
    (oid, gone) = conn.execute(
        "SELECT 't'::regclass::oid::int8, 'gone'::regclass::oid::int8"
    ).fetchone()
    with exported_snapshot(db, "tmp_" + slot_for(db)) as point:
        conn.execute("ALTER TABLE t ADD COLUMN later numeric(10, 2) NOT NULL DEFAULT 0")
        conn.execute("DROP TABLE gone")
        reader = connect(db)
        use_snapshot(reader, point.snapshot_name)
        at_snapshot = table_schema_at_snapshot(reader, oid)
        with pytest.raises(TableDropped):
            list(copy_range(db, point.snapshot_name, ("public", "gone"), ["id"], WHOLE_TABLE))
    assert [c.name for c in at_snapshot.columns] == ["id", "v"]
    assert at_snapshot.replica_identity == "f"
    now = table_schema_at_snapshot(conn, oid)
    assert [(c.name, c.type_name, c.typmod, c.not_null) for c in now.columns][-1] == (
        "later",
        "numeric(10,2)",
        (10 << 16 | 2) + 4,
        True,
    )
    with pytest.raises(TableDropped):
        table_schema_at_snapshot(conn, gone)
    assert estimate_table_block_counts(conn, [gone]) == {gone: 0}


def test_snapshot_cannot_be_imported_after_the_exporter_ends(db):
    connect(db).execute("CREATE TABLE t (id int)")
    with exported_snapshot(db, "tmp_" + slot_for(db)) as point:
        pass
    with pytest.raises(TransientError, match="snapshot"):
        list(copy_range(db, point.snapshot_name, ("public", "t"), ["id"], WHOLE_TABLE))
    assert point.snapshot_lsn == point.consistent_point_lsn - 1


def test_temporary_slot_is_gone_after_the_snapshot(db):
    conn = connect(db)
    with exported_snapshot(db, "tmp_" + slot_for(db)):
        names = conn.execute("SELECT slot_name FROM pg_replication_slots").fetchall()
        assert ("tmp_" + slot_for(db),) in names
    names = conn.execute("SELECT slot_name FROM pg_replication_slots").fetchall()
    assert ("tmp_" + slot_for(db),) not in names


@given(blocks=st.integers(0, 10_000), workers=st.integers(1, 64))
def test_ranges_cover_every_block_once(blocks, workers):
    ranges = worker_ctid_ranges(blocks, workers, 150000)
    assert ranges[0][0] == 0 and ranges[-1][1] is None
    assert len(ranges) <= max(1, min(workers, blocks))
    for (start, end), (next_start, _) in zip(ranges, ranges[1:], strict=False):
        assert start < end == next_start


def test_old_servers_read_each_table_whole():
    assert worker_ctid_ranges(1000, 4, 130011) == [WHOLE_TABLE]
    assert worker_ctid_ranges(0, 4, 180000) == [WHOLE_TABLE]
    assert worker_ctid_ranges(10, 4, 140000) == [(0, 2), (2, 5), (5, 7), (7, None)]
    assert worker_ctid_ranges(2, 4, 140000) == [(0, 1), (1, None)]
