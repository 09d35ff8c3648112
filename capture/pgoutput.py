"""Decode PostgreSQL's pgoutput logical replication messages, protocol version 1.

Every change the replication stream carries (one ``XLogData`` payload, or one ``data`` value of
``pg_logical_slot_peek_binary_changes``) is exactly one pgoutput message: a type byte followed by
big-endian fields ("Logical Replication Message Formats" in the PostgreSQL manual)::

    B  Begin     final_lsn:u64 commit_time:i64 xid:u32
    C  Commit    flags:u8 commit_lsn:u64 end_lsn:u64 commit_time:i64
    O  Origin    commit_lsn:u64 name:str
    R  Relation  relid:u32 namespace:str name:str replica_identity:u8 ncols:u16
                 ncols x (flags:u8 name:str type_oid:u32 type_modifier:i32)
    Y  Type      type_oid:u32 namespace:str name:str
    I  Insert    relid:u32 'N' tuple
    U  Update    relid:u32 [('K' | 'O') tuple] 'N' tuple
    D  Delete    relid:u32 ('K' | 'O') tuple
    T  Truncate  nrelids:u32 options:u8 nrelids x relid:u32
    M  Message   flags:u8 lsn:u64 prefix:str length:u32 content:bytes[length]

    tuple = ncols:u16 ncols x ('n' | 'u' | ('t' | 'b') length:u32 bytes[length])
    str   = UTF-8 bytes up to a NUL terminator

One transaction arrives as ``Begin, (Origin), (Relation | Type | change)*, Commit``; a Relation
(and a Type for every non-built-in column type) precedes the first change of a table in a
session and follows every schema change, so a consumer keeps a ``relid -> Relation`` map and
reads each tuple against the latest one. An empty namespace means ``pg_catalog``. Times are
microseconds since 2000-01-01 UTC; an LSN is a 64-bit WAL position written ``X/Y`` in hex.

Tuple values stay raw: ``None`` for SQL NULL, ``UNCHANGED_TOAST`` for a TOASTed value the
update did not touch (the consumer takes it from the old tuple), ``bytes`` for a value in the
type's text output format, and ``BinaryValue`` (a ``bytes`` subclass) for the binary format,
which is only sent when the subscriber asks for it. Text is decoded to ``str`` by silver, where
a bad value becomes a definite error for its own row instead of stopping the stream.

A message decodes completely or not at all: a truncated body, trailing bytes, an unknown type
byte or tuple kind raise ``PgoutputError`` and nothing else. Decoding is pure and works on one
``bytes`` copy of the message with precompiled ``struct`` formats and C-level slicing and
searching, so the per-message cost is a few dozen bytecodes plus one step per column.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass
from typing import Literal, TypeAlias

MSG_BEGIN = b"B"
MSG_COMMIT = b"C"
MSG_ORIGIN = b"O"
MSG_RELATION = b"R"
MSG_TYPE = b"Y"
MSG_INSERT = b"I"
MSG_UPDATE = b"U"
MSG_DELETE = b"D"
MSG_TRUNCATE = b"T"
MSG_MESSAGE = b"M"

TUPLE_NEW = b"N"
TUPLE_KEY = b"K"
TUPLE_OLD = b"O"

VALUE_NULL = b"n"
VALUE_UNCHANGED_TOAST = b"u"
VALUE_TEXT = b"t"
VALUE_BINARY = b"b"

REPLICA_IDENTITY_DEFAULT = "d"
REPLICA_IDENTITY_NOTHING = "n"
REPLICA_IDENTITY_FULL = "f"
REPLICA_IDENTITY_INDEX = "i"

COLUMN_FLAG_KEY = 1
TRUNCATE_CASCADE = 1
TRUNCATE_RESTART_IDENTITY = 2
MESSAGE_FLAG_TRANSACTIONAL = 1


class PgoutputError(ValueError):
    """A buffer that is not one complete, well-formed pgoutput protocol-1 message."""


class _UnchangedToast(enum.Enum):
    UNCHANGED_TOAST = "u"

    def __repr__(self) -> str:
        return "UNCHANGED_TOAST"


UNCHANGED_TOAST = _UnchangedToast.UNCHANGED_TOAST
"""The value of a TOASTed column an UPDATE left unchanged (kind ``'u'``): not sent again."""


class BinaryValue(bytes):
    """A value in its type's binary send format (kind ``'b'``), as opposed to text output."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"BinaryValue({bytes(self)!r})"


TupleValue: TypeAlias = bytes | None | Literal[_UnchangedToast.UNCHANGED_TOAST]
TupleData: TypeAlias = tuple[TupleValue, ...]
OldTupleKind: TypeAlias = Literal["K", "O"]
OLD_TUPLE_KEY: OldTupleKind = "K"
"""``Update.old_kind`` / ``Delete.old_kind`` of an old tuple holding the replica identity key."""
OLD_TUPLE_FULL: OldTupleKind = "O"
"""``old_kind`` of a whole old row (REPLICA IDENTITY FULL)."""


@dataclass(frozen=True, slots=True)
class Begin:
    final_lsn: int
    commit_time: int
    xid: int


@dataclass(frozen=True, slots=True)
class Commit:
    flags: int
    commit_lsn: int
    end_lsn: int
    commit_time: int


@dataclass(frozen=True, slots=True)
class Origin:
    commit_lsn: int
    name: str


@dataclass(frozen=True, slots=True)
class RelationColumn:
    flags: int
    name: str
    type_oid: int
    type_modifier: int

    @property
    def is_key(self) -> bool:
        return bool(self.flags & COLUMN_FLAG_KEY)


@dataclass(frozen=True, slots=True)
class Relation:
    relid: int
    namespace: str
    name: str
    replica_identity: str
    columns: tuple[RelationColumn, ...]


@dataclass(frozen=True, slots=True)
class Type:
    type_oid: int
    namespace: str
    name: str


@dataclass(frozen=True, slots=True)
class Insert:
    relid: int
    new: TupleData


@dataclass(frozen=True, slots=True)
class Update:
    """``old`` is the key (``'K'``) when the key changed, the whole row (``'O'``) under REPLICA
    IDENTITY FULL, and ``None`` when neither applies."""

    relid: int
    old: TupleData | None
    old_kind: OldTupleKind | None
    new: TupleData


@dataclass(frozen=True, slots=True)
class Delete:
    relid: int
    old: TupleData
    old_kind: OldTupleKind


@dataclass(frozen=True, slots=True)
class Truncate:
    options: int
    relids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Message:
    """A ``pg_logical_emit_message`` payload (sent only with the ``messages`` option)."""

    transactional: bool
    lsn: int
    prefix: str
    content: bytes


PgoutputMessage: TypeAlias = (
    Begin | Commit | Origin | Relation | Type | Insert | Update | Delete | Truncate | Message
)

_BEGIN = struct.Struct(">QqI")
_COMMIT = struct.Struct(">BQQq")
_U64 = struct.Struct(">Q")
_U32 = struct.Struct(">I")
_U16 = struct.Struct(">H")
_COLUMN_TYPE = struct.Struct(">Ii")
_RELID_KIND = struct.Struct(">Ic")
_TRUNCATE = struct.Struct(">IB")
_MESSAGE = struct.Struct(">BQ")

_NULL = VALUE_NULL[0]
_UNCHANGED = VALUE_UNCHANGED_TOAST[0]
_TEXT = VALUE_TEXT[0]
_BINARY = VALUE_BINARY[0]


def decode(buf: bytes | bytearray | memoryview) -> PgoutputMessage:
    """Decode one complete pgoutput message, dispatching on its type byte."""
    if type(buf) is not bytes:
        # One copy up front: slices of bytes are the values themselves, and bytes.index finds
        # NUL terminators, which memoryview cannot; measured faster than slicing the view.
        buf = bytes(buf)
    if not buf:
        raise PgoutputError("empty pgoutput message")
    decoder = _DECODERS.get(buf[0])
    if decoder is None:
        raise PgoutputError(f"unknown pgoutput message type {buf[:1]!r}")
    try:
        message, end = decoder(buf)
    except PgoutputError:
        raise
    except (struct.error, IndexError, ValueError) as exc:
        raise PgoutputError(f"truncated or malformed {buf[:1]!r} message: {exc}") from exc
    if end != len(buf):
        problem = "truncated" if end > len(buf) else f"{len(buf) - end} trailing bytes in"
        raise PgoutputError(f"{problem} {buf[:1]!r} message")
    return message


def encode(message: Relation | Insert | Update | Delete) -> bytes:
    """The bytes of a Relation or change message: the inverse of :func:`decode` for the kinds
    capture rewrites before bronze (column policies, ``pgmedallion.capture.redact``)."""
    if isinstance(message, Relation):
        out = [MSG_RELATION, _U32.pack(message.relid), _cstr(message.namespace)]
        out += [_cstr(message.name), message.replica_identity.encode()]
        out.append(_U16.pack(len(message.columns)))
        for column in message.columns:
            out += [bytes([column.flags]), _cstr(column.name)]
            out.append(_COLUMN_TYPE.pack(column.type_oid, column.type_modifier))
        return b"".join(out)
    if isinstance(message, Insert):
        return MSG_INSERT + _U32.pack(message.relid) + TUPLE_NEW + _tuple_bytes(message.new)
    if isinstance(message, Update):
        out = [MSG_UPDATE, _U32.pack(message.relid)]
        if message.old is not None:
            out += [message.old_kind.encode(), _tuple_bytes(message.old)]
        return b"".join([*out, TUPLE_NEW, _tuple_bytes(message.new)])
    if isinstance(message, Delete):
        old = _tuple_bytes(message.old)
        return MSG_DELETE + _U32.pack(message.relid) + message.old_kind.encode() + old
    raise TypeError(f"cannot encode {type(message).__name__}")


def _cstr(text: str) -> bytes:
    return text.encode() + b"\0"


def _tuple_bytes(values: TupleData) -> bytes:
    out = [_U16.pack(len(values))]
    for value in values:
        if value is None:
            out.append(VALUE_NULL)
        elif value is UNCHANGED_TOAST:
            out.append(VALUE_UNCHANGED_TOAST)
        else:
            kind = VALUE_BINARY if isinstance(value, BinaryValue) else VALUE_TEXT
            out += [kind, _U32.pack(len(value)), value]
    return b"".join(out)


def format_lsn(lsn: int) -> str:
    """``0x16B3748`` -> ``'0/16B3748'``, as PostgreSQL prints a ``pg_lsn``."""
    if not 0 <= lsn < 1 << 64:
        raise ValueError(f"LSN out of range: {lsn}")
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def parse_lsn(text: str) -> int:
    """``'0/16B3748'`` -> ``0x16B3748``; the inverse of :func:`format_lsn`."""
    high, sep, low = text.partition("/")
    if not sep or not _is_hex32(high) or not _is_hex32(low):
        raise ValueError(f"invalid LSN {text!r}: expected X/Y with up to 8 hex digits each")
    return int(high, 16) << 32 | int(low, 16)


def _is_hex32(part: str) -> bool:
    return 0 < len(part) <= 8 and all(c in "0123456789abcdefABCDEF" for c in part)


def _read_str(buf: bytes, pos: int) -> tuple[str, int]:
    end = buf.index(0, pos)
    return buf[pos:end].decode(), end + 1


def _read_tuple(buf: bytes, pos: int) -> tuple[TupleData, int]:
    (ncols,) = _U16.unpack_from(buf, pos)
    pos += 2
    values: list[TupleValue] = []
    append = values.append
    unpack_length = _U32.unpack_from
    for _ in range(ncols):
        kind = buf[pos]
        if kind == _TEXT:
            start = pos + 5
            pos = start + unpack_length(buf, pos + 1)[0]
            append(buf[start:pos])
        elif kind == _NULL:
            pos += 1
            append(None)
        elif kind == _UNCHANGED:
            pos += 1
            append(UNCHANGED_TOAST)
        elif kind == _BINARY:
            start = pos + 5
            pos = start + unpack_length(buf, pos + 1)[0]
            append(BinaryValue(buf[start:pos]))
        else:
            raise PgoutputError(f"unknown tuple value kind {bytes([kind])!r} at offset {pos}")
    if pos > len(buf):
        raise PgoutputError("tuple data runs past the end of the message")
    return tuple(values), pos


def _decode_begin(buf: bytes) -> tuple[Begin, int]:
    return Begin(*_BEGIN.unpack_from(buf, 1)), 1 + _BEGIN.size


def _decode_commit(buf: bytes) -> tuple[Commit, int]:
    return Commit(*_COMMIT.unpack_from(buf, 1)), 1 + _COMMIT.size


def _decode_origin(buf: bytes) -> tuple[Origin, int]:
    (commit_lsn,) = _U64.unpack_from(buf, 1)
    name, pos = _read_str(buf, 9)
    return Origin(commit_lsn, name), pos


def _decode_relation(buf: bytes) -> tuple[Relation, int]:
    (relid,) = _U32.unpack_from(buf, 1)
    namespace, pos = _read_str(buf, 5)
    name, pos = _read_str(buf, pos)
    replica_identity = chr(buf[pos])
    (ncols,) = _U16.unpack_from(buf, pos + 1)
    pos += 3
    columns = []
    for _ in range(ncols):
        flags = buf[pos]
        column_name, pos = _read_str(buf, pos + 1)
        type_oid, type_modifier = _COLUMN_TYPE.unpack_from(buf, pos)
        pos += 8
        columns.append(RelationColumn(flags, column_name, type_oid, type_modifier))
    return Relation(relid, namespace, name, replica_identity, tuple(columns)), pos


def _decode_type(buf: bytes) -> tuple[Type, int]:
    (type_oid,) = _U32.unpack_from(buf, 1)
    namespace, pos = _read_str(buf, 5)
    name, pos = _read_str(buf, pos)
    return Type(type_oid, namespace, name), pos


def _decode_insert(buf: bytes) -> tuple[Insert, int]:
    relid, kind = _RELID_KIND.unpack_from(buf, 1)
    if kind != TUPLE_NEW:
        raise PgoutputError(f"Insert: expected new tuple 'N', got {kind!r}")
    new, pos = _read_tuple(buf, 6)
    return Insert(relid, new), pos


def _decode_update(buf: bytes) -> tuple[Update, int]:
    relid, kind = _RELID_KIND.unpack_from(buf, 1)
    old: TupleData | None = None
    old_kind: OldTupleKind | None = None
    pos = 6
    if kind == TUPLE_KEY or kind == TUPLE_OLD:
        old_kind = "K" if kind == TUPLE_KEY else "O"
        old, pos = _read_tuple(buf, pos)
        kind = buf[pos : pos + 1]
        pos += 1
    if kind != TUPLE_NEW:
        raise PgoutputError(f"Update: expected new tuple 'N', got {kind!r}")
    new, pos = _read_tuple(buf, pos)
    return Update(relid, old, old_kind, new), pos


def _decode_delete(buf: bytes) -> tuple[Delete, int]:
    relid, kind = _RELID_KIND.unpack_from(buf, 1)
    if kind != TUPLE_KEY and kind != TUPLE_OLD:
        raise PgoutputError(f"Delete: expected old tuple 'K' or 'O', got {kind!r}")
    old, pos = _read_tuple(buf, 6)
    return Delete(relid, old, "K" if kind == TUPLE_KEY else "O"), pos


def _decode_truncate(buf: bytes) -> tuple[Truncate, int]:
    nrelids, options = _TRUNCATE.unpack_from(buf, 1)
    end = 6 + 4 * nrelids
    if end > len(buf):
        raise PgoutputError(f"Truncate: {nrelids} relids do not fit in {len(buf)} bytes")
    return Truncate(options, struct.unpack_from(f">{nrelids}I", buf, 6)), end


def _decode_message(buf: bytes) -> tuple[Message, int]:
    flags, lsn = _MESSAGE.unpack_from(buf, 1)
    prefix, pos = _read_str(buf, 10)
    (length,) = _U32.unpack_from(buf, pos)
    start = pos + 4
    end = start + length
    return Message(bool(flags & MESSAGE_FLAG_TRANSACTIONAL), lsn, prefix, buf[start:end]), end


_DECODERS = {
    MSG_BEGIN[0]: _decode_begin,
    MSG_COMMIT[0]: _decode_commit,
    MSG_ORIGIN[0]: _decode_origin,
    MSG_RELATION[0]: _decode_relation,
    MSG_TYPE[0]: _decode_type,
    MSG_INSERT[0]: _decode_insert,
    MSG_UPDATE[0]: _decode_update,
    MSG_DELETE[0]: _decode_delete,
    MSG_TRUNCATE[0]: _decode_truncate,
    MSG_MESSAGE[0]: _decode_message,
}
