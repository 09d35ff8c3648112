"""pgoutput protocol 1: byte-level decoding of every message, malformed input, a round-trip
property against a reference encoder, and the bytes a real PostgreSQL sends."""

from __future__ import annotations

import struct

import psycopg
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pgmedallion.capture.pgoutput import (
    TRUNCATE_CASCADE,
    TRUNCATE_RESTART_IDENTITY,
    UNCHANGED_TOAST,
    Begin,
    BinaryValue,
    Commit,
    Delete,
    Insert,
    Message,
    Origin,
    PgoutputError,
    PgoutputMessage,
    Relation,
    RelationColumn,
    Truncate,
    TupleData,
    Type,
    Update,
    decode,
    format_lsn,
    parse_lsn,
)
from pgmedallion.capture.pgoutput import (
    encode as encode_message,
)


def cstr(text: str) -> bytes:
    return text.encode() + b"\0"


def tuple_bytes(values: TupleData) -> bytes:
    out = [struct.pack(">H", len(values))]
    for value in values:
        if value is None:
            out.append(b"n")
        elif value is UNCHANGED_TOAST:
            out.append(b"u")
        else:
            kind = b"b" if isinstance(value, BinaryValue) else b"t"
            out.append(kind + struct.pack(">I", len(value)) + value)
    return b"".join(out)


def encode(message: PgoutputMessage) -> bytes:
    """A reference encoder, written from the protocol documentation like the decoder."""
    match message:
        case Begin(final_lsn, commit_time, xid):
            return struct.pack(">cQqI", b"B", final_lsn, commit_time, xid)
        case Commit(flags, commit_lsn, end_lsn, commit_time):
            return struct.pack(">cBQQq", b"C", flags, commit_lsn, end_lsn, commit_time)
        case Origin(commit_lsn, name):
            return struct.pack(">cQ", b"O", commit_lsn) + cstr(name)
        case Relation(relid, namespace, name, replica_identity, columns):
            head = struct.pack(">cI", b"R", relid) + cstr(namespace) + cstr(name)
            head += replica_identity.encode() + struct.pack(">H", len(columns))
            return head + b"".join(
                struct.pack(">B", c.flags)
                + cstr(c.name)
                + struct.pack(">Ii", c.type_oid, c.type_modifier)
                for c in columns
            )
        case Type(type_oid, namespace, name):
            return struct.pack(">cI", b"Y", type_oid) + cstr(namespace) + cstr(name)
        case Insert(relid, new):
            return struct.pack(">cIc", b"I", relid, b"N") + tuple_bytes(new)
        case Update(relid, old, old_kind, new):
            out = struct.pack(">cI", b"U", relid)
            if old is not None:
                assert old_kind is not None
                out += old_kind.encode() + tuple_bytes(old)
            return out + b"N" + tuple_bytes(new)
        case Delete(relid, old, old_kind):
            return struct.pack(">cI", b"D", relid) + old_kind.encode() + tuple_bytes(old)
        case Truncate(options, relids):
            return struct.pack(f">cIB{len(relids)}I", b"T", len(relids), options, *relids)
        case Message(transactional, lsn, prefix, content):
            return (
                struct.pack(">cBQ", b"M", int(transactional), lsn)
                + cstr(prefix)
                + struct.pack(">I", len(content))
                + content
            )
    raise AssertionError(message)


BEGIN = struct.pack(">cQqI", b"B", 0x1_0000_0020, 760_000_000_123_456, 741)
COMMIT = struct.pack(">cBQQq", b"C", 0, 0x1_0000_0020, 0x1_0000_0058, 760_000_000_123_456)
ORIGIN = struct.pack(">cQ", b"O", 0x16B3748) + b"upstream\0"
# fmt: off
RELATION = (
    struct.pack(">cI", b"R", 16384)
    + b"public\0orders\0"
    + b"f"
    + struct.pack(">H", 3)
    + struct.pack(">B", 1) + b"id\0" + struct.pack(">Ii", 23, -1)
    + struct.pack(">B", 0) + b"note\0" + struct.pack(">Ii", 1043, 68)
    + struct.pack(">B", 0) + "größe\0".encode() + struct.pack(">Ii", 16390, -1)
)
TYPE = struct.pack(">cI", b"Y", 16390) + b"public\0mood\0"
NEW_TUPLE = (
    struct.pack(">H", 4)
    + b"t" + struct.pack(">I", 2) + b"42"
    + b"n"
    + b"u"
    + b"b" + struct.pack(">I", 4) + b"\x00\x00\x00\x2a"
)
# fmt: on
INSERT = struct.pack(">cIc", b"I", 16384, b"N") + NEW_TUPLE
MESSAGE = struct.pack(">cBQ", b"M", 1, 0x2_0000_0000) + b"audit\0" + struct.pack(">I", 3) + b"a\0b"
TRUNCATE = struct.pack(">cIBII", b"T", 2, 3, 16384, 16390)


def test_begin() -> None:
    assert decode(BEGIN) == Begin(final_lsn=0x1_0000_0020, commit_time=760_000_000_123_456, xid=741)


def test_commit() -> None:
    assert decode(COMMIT) == Commit(
        flags=0, commit_lsn=0x1_0000_0020, end_lsn=0x1_0000_0058, commit_time=760_000_000_123_456
    )


def test_origin() -> None:
    assert decode(ORIGIN) == Origin(commit_lsn=0x16B3748, name="upstream")


def test_relation() -> None:
    relation = decode(RELATION)
    assert relation == Relation(
        relid=16384,
        namespace="public",
        name="orders",
        replica_identity="f",
        columns=(
            RelationColumn(flags=1, name="id", type_oid=23, type_modifier=-1),
            RelationColumn(flags=0, name="note", type_oid=1043, type_modifier=68),
            RelationColumn(flags=0, name="größe", type_oid=16390, type_modifier=-1),
        ),
    )
    assert isinstance(relation, Relation)
    assert [c.is_key for c in relation.columns] == [True, False, False]


def test_relation_in_pg_catalog_has_empty_namespace() -> None:
    raw = struct.pack(">cI", b"R", 1) + b"\0t\0" + b"d" + struct.pack(">H", 0)
    assert decode(raw) == Relation(1, "", "t", "d", ())


def test_type() -> None:
    assert decode(TYPE) == Type(type_oid=16390, namespace="public", name="mood")


def test_insert_with_text_null_unchanged_toast_and_binary_values() -> None:
    insert = decode(INSERT)
    assert insert == Insert(relid=16384, new=(b"42", None, UNCHANGED_TOAST, b"\x00\x00\x00\x2a"))
    assert isinstance(insert, Insert)
    text, _, _, binary = insert.new
    assert type(text) is bytes
    assert isinstance(binary, BinaryValue)
    assert repr(UNCHANGED_TOAST) == "UNCHANGED_TOAST"


def test_insert_with_empty_value_and_no_columns() -> None:
    empty_value = struct.pack(">cIcH", b"I", 7, b"N", 1) + b"t" + struct.pack(">I", 0)
    assert decode(empty_value) == Insert(7, (b"",))
    assert decode(struct.pack(">cIcH", b"I", 7, b"N", 0)) == Insert(7, ())


def test_update_without_old_tuple() -> None:
    raw = struct.pack(">cIc", b"U", 16384, b"N") + NEW_TUPLE
    assert decode(raw) == Update(
        relid=16384, old=None, old_kind=None, new=(b"42", None, UNCHANGED_TOAST, b"\0\0\0*")
    )


@pytest.mark.parametrize("kind", ["K", "O"])
def test_update_with_old_tuple(kind: str) -> None:
    old = struct.pack(">H", 2) + b"t" + struct.pack(">I", 1) + b"7" + b"n"
    raw = struct.pack(">cIc", b"U", 16384, kind.encode()) + old + b"N" + NEW_TUPLE
    assert decode(raw) == Update(
        relid=16384,
        old=(b"7", None),
        old_kind=kind,
        new=(b"42", None, UNCHANGED_TOAST, b"\0\0\0*"),
    )


@pytest.mark.parametrize("kind", ["K", "O"])
def test_delete(kind: str) -> None:
    old = struct.pack(">H", 2) + b"t" + struct.pack(">I", 3) + b"a\tb" + b"n"
    raw = struct.pack(">cIc", b"D", 16384, kind.encode()) + old
    assert decode(raw) == Delete(relid=16384, old=(b"a\tb", None), old_kind=kind)


def test_truncate_two_relations_cascade_restart_identity() -> None:
    truncate = decode(TRUNCATE)
    assert truncate == Truncate(options=3, relids=(16384, 16390))
    assert isinstance(truncate, Truncate)
    assert truncate.options == TRUNCATE_CASCADE | TRUNCATE_RESTART_IDENTITY


def test_message() -> None:
    assert decode(MESSAGE) == Message(
        transactional=True, lsn=0x2_0000_0000, prefix="audit", content=b"a\0b"
    )
    non_transactional = struct.pack(">cBQ", b"M", 0, 5) + b"p\0" + struct.pack(">I", 0)
    assert decode(non_transactional) == Message(False, 5, "p", b"")


def test_accepts_memoryview_and_bytearray() -> None:
    assert decode(memoryview(b"xx" + INSERT)[2:]) == decode(INSERT)
    assert decode(bytearray(COMMIT)) == decode(COMMIT)


ALL = [BEGIN, COMMIT, ORIGIN, RELATION, TYPE, INSERT, MESSAGE, TRUNCATE]


@pytest.mark.parametrize("raw", ALL, ids=lambda raw: chr(raw[0]))
def test_every_truncation_raises_pgoutput_error(raw: bytes) -> None:
    for end in range(len(raw)):
        with pytest.raises(PgoutputError):
            decode(raw[:end])


@pytest.mark.parametrize("raw", ALL, ids=lambda raw: chr(raw[0]))
def test_trailing_bytes_raise_pgoutput_error(raw: bytes) -> None:
    with pytest.raises(PgoutputError, match="trailing"):
        decode(raw + b"\0")


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"S" + struct.pack(">IB", 1, 1),  # Stream Start exists only in protocol 2
        b"\xff",
        struct.pack(">cIcH", b"I", 1, b"N", 1) + b"x",  # unknown tuple value kind
        struct.pack(">cIcH", b"I", 1, b"K", 0),  # insert without 'N'
        struct.pack(">cIcH", b"D", 1, b"N", 0),  # delete without old tuple
        struct.pack(">cIcH", b"U", 1, b"K", 0) + b"X" + struct.pack(">H", 0),
        struct.pack(">cIBI", b"T", 0xFFFFFFFF, 0, 1),  # relid count beyond the buffer
        struct.pack(">cI", b"Y", 1) + b"\xff\0t\0",  # name not UTF-8
        struct.pack(">cIcH", b"I", 1, b"N", 1) + b"t" + struct.pack(">I", 0xFFFFFFFF),
    ],
)
def test_malformed_input_raises_pgoutput_error(raw: bytes) -> None:
    with pytest.raises(PgoutputError):
        decode(raw)


def test_pgoutput_error_is_a_value_error() -> None:
    assert issubclass(PgoutputError, ValueError)


@pytest.mark.parametrize(
    ("lsn", "text"),
    [
        (0, "0/0"),
        (0x16B3748, "0/16B3748"),
        (0x1_0000_0000, "1/0"),
        ((1 << 64) - 1, "FFFFFFFF/FFFFFFFF"),
    ],
)
def test_lsn_format_and_parse(lsn: int, text: str) -> None:
    assert format_lsn(lsn) == text
    assert parse_lsn(text) == lsn
    assert parse_lsn(text.lower()) == lsn


@pytest.mark.parametrize(
    "text", ["", "0", "/0", "0/", "0/0/0", "1FFFFFFFF/0", "+1/0", "0/ 1", "0/g", "0_1/0"]
)
def test_parse_lsn_rejects_malformed(text: str) -> None:
    with pytest.raises(ValueError):
        parse_lsn(text)


@pytest.mark.parametrize("lsn", [-1, 1 << 64])
def test_format_lsn_rejects_out_of_range(lsn: int) -> None:
    with pytest.raises(ValueError):
        format_lsn(lsn)


@given(st.integers(min_value=0, max_value=(1 << 64) - 1))
def test_lsn_round_trip(lsn: int) -> None:
    assert parse_lsn(format_lsn(lsn)) == lsn


u8 = st.integers(0, 0xFF)
u16 = st.integers(0, 0xFFFF)
u32 = st.integers(0, 0xFFFF_FFFF)
u64 = st.integers(0, (1 << 64) - 1)
i32 = st.integers(-(1 << 31), (1 << 31) - 1)
i64 = st.integers(-(1 << 63), (1 << 63) - 1)
names = st.text(st.characters(exclude_characters="\0", exclude_categories=["Cs"]), max_size=20)
values = st.one_of(
    st.none(),
    st.just(UNCHANGED_TOAST),
    st.binary(max_size=30),
    st.binary(max_size=30).map(BinaryValue),
)
tuples = st.lists(values, max_size=8).map(tuple)
old_tuples = st.one_of(
    st.tuples(st.none(), st.none()), st.tuples(tuples, st.sampled_from(["K", "O"]))
)

messages = st.one_of(
    st.builds(Begin, u64, i64, u32),
    st.builds(Commit, u8, u64, u64, i64),
    st.builds(Origin, u64, names),
    st.builds(
        Relation,
        u32,
        names,
        names,
        st.sampled_from("dnfi"),
        st.lists(st.builds(RelationColumn, u8, names, u32, i32), max_size=6).map(tuple),
    ),
    st.builds(Type, u32, names, names),
    st.builds(Insert, u32, tuples),
    st.builds(lambda relid, old, new: Update(relid, old[0], old[1], new), u32, old_tuples, tuples),
    st.builds(Delete, u32, tuples, st.sampled_from(["K", "O"])),
    st.builds(Truncate, u8, st.lists(u32, max_size=5).map(tuple)),
    st.builds(Message, st.booleans(), u64, names, st.binary(max_size=40)),
)


@given(messages)
def test_decode_inverts_reference_encoder(message: PgoutputMessage) -> None:
    decoded = decode(encode(message))
    assert decoded == message
    for got, want in zip(_values(decoded), _values(message), strict=True):
        assert type(got) is type(want)


def _values(message: PgoutputMessage) -> list[object]:
    return [
        value
        for data in (getattr(message, "old", None), getattr(message, "new", None))
        for value in data or ()
    ]


@given(messages)
def test_the_project_encoder_writes_what_the_reference_writes(message: PgoutputMessage) -> None:
    """``capture.pgoutput.encode`` (used to rewrite messages under column policies) gives the
    reference encoder's bytes for every kind it encodes."""
    if isinstance(message, (Relation, Insert, Update, Delete)):
        assert encode_message(message) == encode(message)
    else:
        with pytest.raises(TypeError):
            encode_message(message)


@given(messages, st.data())
def test_any_truncation_raises_pgoutput_error(
    message: PgoutputMessage, data: st.DataObject
) -> None:
    raw = encode(message)
    end = data.draw(st.integers(0, len(raw) - 1))
    with pytest.raises(PgoutputError):
        decode(raw[:end])


def test_real_postgres_stream(db: dict) -> None:
    """Insert, update (with an unchanged TOASTed value), delete and truncate on a REPLICA
    IDENTITY FULL table, read back through pgoutput protocol 1."""
    big = "x" * 5000
    with psycopg.connect(**db, autocommit=True) as conn:
        conn.execute("CREATE TYPE mood AS ENUM ('sad', 'happy')")
        conn.execute(
            "CREATE TABLE t (id int PRIMARY KEY, note text, big text, m mood, n numeric(10,2))"
        )
        conn.execute("ALTER TABLE t ALTER COLUMN big SET STORAGE EXTERNAL")
        conn.execute("ALTER TABLE t REPLICA IDENTITY FULL")
        conn.execute("CREATE PUBLICATION p FOR TABLE t")
        conn.execute("SELECT pg_create_logical_replication_slot('s', 'pgoutput')")
        with conn.transaction():
            conn.execute(
                "INSERT INTO t VALUES (1, %s, %s, 'happy', 1.5), (2, NULL, NULL, NULL, NULL)",
                ("tab\there\nnew line \\ back", big),
            )
        conn.execute("UPDATE t SET note = 'é' WHERE id = 1")
        conn.execute("DELETE FROM t WHERE id = 2")
        conn.execute("TRUNCATE t")
        relid, mood_oid = conn.execute("SELECT 't'::regclass::oid, 'mood'::regtype::oid").fetchone()
        rows = conn.execute(
            "SELECT lsn, data FROM pg_logical_slot_peek_binary_changes("
            "'s', NULL, NULL, 'proto_version', '1', 'publication_names', 'p')"
        ).fetchall()

    decoded = [decode(data) for _, data in rows]
    kinds = [type(m).__name__ for m in decoded]
    assert kinds == [
        "Begin", "Type", "Relation", "Insert", "Insert", "Commit",
        "Begin", "Update", "Commit",
        "Begin", "Delete", "Commit",
        "Begin", "Type", "Relation", "Truncate", "Commit",
    ]  # fmt: skip

    begin, mood, relation, insert1, insert2, commit = decoded[:6]
    assert isinstance(begin, Begin) and isinstance(commit, Commit)
    assert begin.final_lsn == commit.commit_lsn
    assert parse_lsn(str(rows[5][0])) == commit.end_lsn  # a commit row sits at its end LSN
    assert commit.end_lsn > commit.commit_lsn
    assert begin.commit_time == commit.commit_time > 0
    assert mood == Type(mood_oid, "public", "mood")
    assert relation == Relation(
        relid,
        "public",
        "t",
        "f",
        (
            RelationColumn(1, "id", 23, -1),
            RelationColumn(1, "note", 25, -1),
            RelationColumn(1, "big", 25, -1),
            RelationColumn(1, "m", mood_oid, -1),
            RelationColumn(1, "n", 1700, (10 << 16 | 2) + 4),
        ),
    )
    row1 = (b"1", b"tab\there\nnew line \\ back", big.encode(), b"happy", b"1.50")
    assert insert1 == Insert(relid, row1)
    assert insert2 == Insert(relid, (b"2", None, None, None, None))

    update, delete, truncate = decoded[7], decoded[10], decoded[15]
    assert update == Update(
        relid, row1, "O", (b"1", "é".encode(), UNCHANGED_TOAST, b"happy", b"1.50")
    )
    assert delete == Delete(relid, (b"2", None, None, None, None), "O")
    assert decoded[13:15] == [mood, relation]  # TRUNCATE re-sends the schema first
    assert truncate == Truncate(0, (relid,))


@given(st.sampled_from(list(b"BCORYIUDTM")), st.binary(max_size=60))
def test_arbitrary_bytes_decode_or_raise_pgoutput_error(type_byte: int, body: bytes) -> None:
    try:
        decode(bytes([type_byte]) + body)
    except PgoutputError:
        pass
