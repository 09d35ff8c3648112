"""Read the main slot's pgoutput stream, message by message, up to a target WAL position.

``START_REPLICATION SLOT s LOGICAL X/Y (proto_version '1', publication_names 'p')`` turns the
session into a CopyBoth stream. Each CopyData from the server is one of

- ``'w'`` XLogData: start, end, send time, then exactly one pgoutput message;
- ``'k'`` primary keepalive: the server's WAL end, send time, and whether it wants a reply.

Transactions arrive whole and in commit order, as ``Begin, ..., Commit``. Each message becomes
a :class:`WalMessage` stamped with its transaction's commit LSN (``Begin.final_lsn``, equal to
``Commit.commit_lsn``) and its ordinal in the transaction (Begin is 0, Commit is last).
Messages are yielded as they arrive, so memory stays bounded whatever the transaction size.

``(commit_lsn, ordinal)`` names a message within one streaming session only. The server sends a
Relation (and Type) message before a table's first change *in each session*, so a transaction
read again in a later session can carry more or fewer of them and its ordinals shift; its own
messages (Begin, changes, Commit) repeat byte for byte. A run cut mid-transaction re-reads the
whole transaction next time, so the unit of deduplication is the transaction: keep each commit
LSN's messages from one complete read (one that reached its Commit).

Progress and the frontier
    After a Commit, every transaction with commit LSN below its ``end_lsn`` has been seen. With
    no transaction open, a keepalive's ``wal_end`` is the last position the walsender has
    decoded and sent, so it bounds everything still to come just as well: this is what moves
    the frontier when the publication is idle or when the server skips empty transactions
    (writes to unpublished tables). Keepalives inside a transaction prove nothing and are not
    yielded.

    ``position_time`` is the source's clock for the position: the commit time of the
    transaction whose Commit moved it, or the send time of the keepalive that did (the server's
    clock when it had nothing more to send below ``wal_end``). Gold's tables are "as of" it.

Acknowledging
    The reader never acknowledges on its own. The caller calls :meth:`ReplicationStream.ack`
    once bronze has durably committed up to an LSN (a Commit's ``end_lsn`` or a keepalive's
    ``wal_end``); the server then sets the slot's ``confirmed_flush_lsn`` to exactly that and
    may recycle WAL before it. Status replies the server asks for, and the polls that solicit a
    keepalive when the stream is quiet, repeat the last acknowledged position and nothing more.

Status timer
    The walsender drops a client it has not heard from for ``wal_sender_timeout``. While the
    caller iterates, the reader sends a status update (with the reply flag set, so the server
    answers with a keepalive that can move the frontier) every :func:`status_interval` seconds:
    once a second, and always under half of the server's timeout, whether the stream is busy
    or idle. Between two iterations (a bronze commit) nothing is sent, so a commit must take
    less than half of ``wal_sender_timeout`` (a minute by default).

Dropped publications
    Before PostgreSQL 18 the walsender fails with "publication does not exist" at the first
    change decoded after the drop (:class:`~capture.errors.PublicationDropped`). PostgreSQL 18
    skips a missing publication with a warning and sends nothing, so a run checks its
    publication (``snapshot.publication_tables``) before it reads.

Stopping
    :meth:`ReplicationStream.read_until` returns once the stream has caught up with a target,
    normally ``pg_current_wal_lsn()`` read at the start of a run: after a Commit whose
    ``end_lsn >= target``, or a keepalive outside a transaction whose ``wal_end >= target``.
    With a ``deadline`` (a ``time.monotonic()`` value) it also returns when that passes, which
    is how a continuous run wakes up to commit and to check for a stop request without
    spinning: between messages it waits in ``select()``.

::

    socket ──select()──> CopyData ──┬─ 'w' ─> WalMessage(commit_lsn, ordinal, payload) ─> caller
                                    └─ 'k' ─> Keepalive(wal_end)  (no open transaction) ─> caller
    caller ──ack(lsn) after bronze commit──> 'r' standby status (write = flush = apply = lsn)
"""

from __future__ import annotations

import select
import struct
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple, NoReturn

import psycopg
from psycopg import pq, sql
from psycopg.pq.abc import PGconn, PGresult

from pgmedallion.capture.errors import PipelineError, TransientError, classify
from pgmedallion.capture.pgoutput import MSG_BEGIN, MSG_COMMIT, format_lsn

PROTO_VERSION = "1"

XLOG_DATA = b"w"
PRIMARY_KEEPALIVE = b"k"
STANDBY_STATUS_UPDATE = b"r"

PG_EPOCH_UNIX_S = 946_684_800
"""2000-01-01 00:00:00 UTC, the zero of replication protocol timestamps."""

_XLOG_DATA_HEADER = struct.Struct(">cQQq")
_XLOG_DATA_LSNS = struct.Struct(">QQ")
_BEGIN_FIELDS = struct.Struct(">QqI")
"""Begin after its type byte: final LSN, commit time, xid."""
_COMMIT_END_AND_TIME = struct.Struct(">Qq")
PG_EPOCH_US = 946_684_800_000_000
"""PostgreSQL's timestamps count microseconds from 2000-01-01; Unix's from 1970-01-01."""
"""Commit's transaction end LSN, after its type byte, flags and commit LSN (offset 10)."""
_XLOG_DATA_BYTE = XLOG_DATA[0]
_FAST_MESSAGES = 512
"""Messages read back to back from libpq's buffer before the timers are looked at again."""
_KEEPALIVE = struct.Struct(">cQq?")
_STANDBY_STATUS = struct.Struct(">cQQQq?")

_BEGIN_BYTE = MSG_BEGIN[0]
_COMMIT_BYTE = MSG_COMMIT[0]

SETTLE_S = 0.01
"""How long the reader lets data gather once the socket turns readable, before reading it.

The walsender tries to flush after every message, so a client that reads each message as it
arrives gets one ``send()`` per message from it (and pays one ``select()`` and ``recv()`` per
message itself): on two cores, reading 1M messages took 5.5 s that way, as long as
``pg_recvlogical`` takes. Waiting 10 ms and then reading everything the socket holds lets the
walsender's flushes coalesce: the same read took 2.2 s, with a third of the client CPU. The
wait delays a quiet stream's next message by 10 ms, which nothing here notices."""
DRAIN_READS = 256
"""At most this many reads (``PQconsumeInput``, at least 8 KB each) once the socket is
readable, while it stays readable."""
STATUS_INTERVAL_S = 1.0
"""The status timer's period when ``wal_sender_timeout`` allows it (at least 4 s)."""


@dataclass(frozen=True, slots=True)
class XLogData:
    start: int
    """``dataStart``; the server leaves it 0/0 on some messages that are not last in a write."""
    end: int
    time: int
    payload: bytes


@dataclass(frozen=True, slots=True)
class Keepalive:
    wal_end: int
    time: int = 0
    reply_requested: bool = False


class WalMessage(NamedTuple):
    """One pgoutput message with its place in the stream. A named tuple, not a dataclass:
    the stream makes one per message, and a tuple is the cheapest object Python builds."""

    commit_lsn: int
    """The commit LSN of the message's transaction: the time of its changes."""
    end_lsn: int
    """The XLogData ``walEnd`` the message arrived with."""
    xid: int
    ordinal: int
    """Position in the transaction: 0 for Begin, counting up to its Commit."""
    message_lsn: int
    """The XLogData ``dataStart`` (0 where the server does not set it)."""
    payload: bytes
    """One raw pgoutput message (``pgmedallion.capture.pgoutput.decode`` reads it)."""


def parse_copy_data(buf: bytes | memoryview) -> XLogData | Keepalive:
    """One CopyData message of the replication stream."""
    kind = bytes(buf[:1])
    if kind == XLOG_DATA and len(buf) >= _XLOG_DATA_HEADER.size:
        _, start, end, sent = _XLOG_DATA_HEADER.unpack_from(buf)
        return XLogData(start, end, sent, bytes(buf[_XLOG_DATA_HEADER.size :]))
    if kind == PRIMARY_KEEPALIVE and len(buf) == _KEEPALIVE.size:
        _, wal_end, sent, reply = _KEEPALIVE.unpack_from(buf)
        return Keepalive(wal_end, sent, reply)
    raise TransientError(f"unexpected replication CopyData: {bytes(buf[:32])!r}")


def standby_status(flush_lsn: int, reply: bool, now_us: int) -> bytes:
    """A standby status update reporting ``flush_lsn`` as written, flushed and applied."""
    return _STANDBY_STATUS.pack(
        STANDBY_STATUS_UPDATE, flush_lsn, flush_lsn, flush_lsn, now_us, reply
    )


def pg_now_us() -> int:
    """Now, in microseconds since 2000-01-01 UTC."""
    return time.time_ns() // 1000 - PG_EPOCH_UNIX_S * 1_000_000


def send_standby_status(conn: psycopg.Connection, flush_lsn: int, reply: bool = False) -> None:
    """Send a standby status update on a streaming connection and flush it out."""
    pgconn = conn.pgconn
    message = standby_status(flush_lsn, reply, pg_now_us())
    try:
        while pgconn.put_copy_data(message) == 0:
            _wait(pgconn, write=True, timeout_s=None)
        while pgconn.flush():
            _wait(pgconn, write=True, timeout_s=None)
    except psycopg.OperationalError as exc:
        raise TransientError(f"replication connection lost: {_one_line(exc)}") from exc


def status_interval(wal_sender_timeout_s: float) -> float:
    """Seconds between status updates: once a second, and under half of the server's timeout.

    A timeout of 0 disables the walsender's timeout; the timer still runs once a second, since
    its replies are what keep the frontier moving when nothing is published.
    """
    if wal_sender_timeout_s <= 0:
        return STATUS_INTERVAL_S
    return min(STATUS_INTERVAL_S, wal_sender_timeout_s / 4)


def wal_sender_timeout(conn: psycopg.Connection) -> float:
    """This session's ``wal_sender_timeout`` in seconds (0 when disabled)."""
    try:
        row = conn.execute(
            "SELECT setting::int8 FROM pg_settings WHERE name = 'wal_sender_timeout'"
        ).fetchone()
    except psycopg.Error as exc:
        raise TransientError(f"cannot read wal_sender_timeout: {_one_line(exc)}") from exc
    return 0.0 if row is None else row[0] / 1000


def start_replication(
    repl_conn: psycopg.Connection,
    slot: str,
    publication: str | Sequence[str],
    start_lsn: int,
    status_interval_s: float | None = None,
) -> ReplicationStream:
    """Start streaming ``slot`` from ``start_lsn`` for one or more publications.

    ``status_interval_s`` defaults to :func:`status_interval` of the session's
    ``wal_sender_timeout``.
    """
    if status_interval_s is None:
        status_interval_s = status_interval(wal_sender_timeout(repl_conn))
    publications = [publication] if isinstance(publication, str) else list(publication)
    # pgoutput splits publication_names like an identifier list, so each name is quoted.
    names = ",".join(sql.Identifier(name).as_string(repl_conn) for name in publications)
    query = sql.SQL(
        "START_REPLICATION SLOT {slot} LOGICAL {lsn}"
        " (proto_version {proto}, publication_names {names})"
    ).format(
        slot=sql.Identifier(slot),
        lsn=sql.SQL(format_lsn(start_lsn)),
        proto=sql.Literal(PROTO_VERSION),
        names=sql.Literal(names),
    )
    pgconn = repl_conn.pgconn
    try:
        pgconn.send_query(query.as_bytes(repl_conn))
        while pgconn.flush():
            _wait(pgconn, write=True, timeout_s=None)
        while pgconn.is_busy():
            _wait(pgconn, write=False, timeout_s=None)
            pgconn.consume_input()
        result = pgconn.get_result()
    except psycopg.OperationalError as exc:
        raise TransientError(f"replication connection lost: {_one_line(exc)}") from exc
    if result is None or result.status != pq.ExecStatus.COPY_BOTH:
        error = _result_error(result)
        _drain_results(pgconn)
        raise error
    return ReplicationStream(repl_conn, start_lsn, status_interval_s)


class ReplicationStream:
    """A started stream; iterate with :meth:`read_until`, acknowledge with :meth:`ack`."""

    def __init__(
        self, conn: psycopg.Connection, start_lsn: int, status_interval_s: float = STATUS_INTERVAL_S
    ) -> None:
        self.conn = conn
        self.position = start_lsn
        """Everything committed below this LSN has been yielded."""
        self.position_time = 0
        """The source's clock for ``position`` (PostgreSQL microseconds; 0 before the first
        Commit or keepalive): see the module's "Progress and the frontier"."""
        self.acked = 0
        self.status_interval_s = status_interval_s
        self._next_status = time.monotonic() + status_interval_s
        self._final_lsn: int | None = None
        """The open transaction's commit LSN (from its Begin); None between transactions."""
        self._xid = 0
        self._ordinal = 0
        self._closed = False

    @property
    def in_transaction(self) -> bool:
        return self._final_lsn is not None

    def read_until(
        self,
        target_lsn: int | None,
        poll_interval_s: float = 1.0,
        *,
        deadline: float | None = None,
    ) -> Iterator[WalMessage | Keepalive]:
        """Yield messages and keepalives until the stream has caught up with ``target_lsn``.

        ``target_lsn=None`` reads on with no target. ``deadline`` (``time.monotonic()``) ends
        the iteration when it passes, even mid-transaction; the next call carries on where this
        one stopped. When nothing arrives for ``poll_interval_s`` the reader asks the server for
        a keepalive, so an idle stream still reaches the target promptly.
        """
        if target_lsn is not None and self._final_lsn is None and self.position >= target_lsn:
            return
        get_copy_data = self.conn.pgconn.get_copy_data
        header = _XLOG_DATA_HEADER.size
        while True:
            now = time.monotonic()
            if now >= self._next_status:
                self._send_status(self.acked, reply=True, now=now)
            if deadline is not None and now >= deadline:
                return
            wait = min(poll_interval_s, self._next_status - now)
            if deadline is not None:
                wait = min(wait, deadline - now)
            buf = self._receive(max(wait, 0.0))
            if buf is None:
                if time.monotonic() - now >= poll_interval_s:
                    self._send_status(self.acked, reply=True)
                continue
            # The hot loop: whatever libpq already holds is handled back to back, with no
            # clock, no objects but the message, and only the two fields of Begin and Commit
            # that place a message (commit LSN and xid; the end LSN of the transaction).
            budget = _FAST_MESSAGES
            while True:
                if buf[0] == _XLOG_DATA_BYTE and len(buf) > header:
                    start, end = _XLOG_DATA_LSNS.unpack_from(buf, 1)
                    payload = bytes(buf[header:])
                    kind = payload[0]
                    final_lsn = self._final_lsn
                    if kind == _BEGIN_BYTE:
                        if final_lsn is not None:
                            raise TransientError("pgoutput Begin inside an open transaction")
                        final_lsn, _, self._xid = _BEGIN_FIELDS.unpack_from(payload, 1)
                        self._final_lsn = final_lsn
                        self._ordinal = 0
                    elif final_lsn is None:
                        raise TransientError(
                            f"pgoutput message {payload[:1]!r} outside a transaction"
                        )
                    yield WalMessage(final_lsn, end, self._xid, self._ordinal, start, payload)
                    self._ordinal += 1
                    if kind == _COMMIT_BYTE:
                        end_lsn, committed = _COMMIT_END_AND_TIME.unpack_from(payload, 10)
                        self._final_lsn = None
                        if end_lsn > self.position:
                            self.position = end_lsn
                        if committed > self.position_time:
                            self.position_time = committed
                        if target_lsn is not None and end_lsn >= target_lsn:
                            return
                else:
                    event = parse_copy_data(buf)
                    if isinstance(event, XLogData):  # an XLogData without a payload
                        raise TransientError("empty XLogData in the replication stream")
                    if event.reply_requested:
                        self._send_status(self.acked)
                    if self._final_lsn is None:
                        self.position = max(self.position, event.wal_end)
                        self.position_time = max(self.position_time, event.time)
                        yield event
                        if target_lsn is not None and event.wal_end >= target_lsn:
                            return
                budget -= 1
                if not budget:
                    break
                try:
                    size, buf = get_copy_data(1)
                except psycopg.OperationalError as exc:
                    raise TransientError(f"replication connection lost: {_one_line(exc)}") from exc
                if size <= 0:
                    if size == -1:
                        self._stream_ended()
                    break

    def ack(self, lsn: int) -> None:
        """Report ``lsn`` as durably stored: the slot's ``confirmed_flush_lsn`` becomes ``lsn``.

        Only call it with positions bronze has committed; lower positions than an earlier ack
        are ignored, because the server never moves the slot back.
        """
        if lsn <= self.acked:
            return
        self.acked = lsn
        self._send_status(lsn)

    def _send_status(self, lsn: int, reply: bool = False, now: float | None = None) -> None:
        send_standby_status(self.conn, lsn, reply)
        self._next_status = (now or time.monotonic()) + self.status_interval_s

    def close(self) -> None:
        """End the stream (CopyDone) so the session accepts queries again."""
        if self._closed:
            return
        self._closed = True
        pgconn = self.conn.pgconn
        try:
            pgconn.put_copy_end()
            while pgconn.flush():
                _wait(pgconn, write=True, timeout_s=None)
            while self._receive(None) is not None:
                pass
        except _StreamEnded:
            _drain_results(pgconn)
        except psycopg.OperationalError as exc:
            raise TransientError(f"replication connection lost: {_one_line(exc)}") from exc

    def __enter__(self) -> ReplicationStream:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        if self.conn.closed:
            return
        try:
            self.close()
        except PipelineError:
            if exc_type is None:
                raise  # otherwise the error that ended the block says more

    def _receive(self, timeout_s: float | None) -> memoryview | None:
        """The next CopyData, or ``None`` after ``timeout_s`` without one."""
        pgconn = self.conn.pgconn
        try:
            while True:
                size, data = pgconn.get_copy_data(1)
                if size > 0:
                    return data
                if size == -1:
                    self._stream_ended()
                if not _wait(pgconn, write=False, timeout_s=timeout_s):
                    return None
                time.sleep(SETTLE_S)
                pgconn.consume_input()
                sock = pgconn.socket
                for _ in range(DRAIN_READS):
                    if not select.select([sock], [], [], 0)[0]:
                        break
                    pgconn.consume_input()
        except psycopg.OperationalError as exc:
            raise TransientError(f"replication connection lost: {_one_line(exc)}") from exc

    def _stream_ended(self) -> NoReturn:
        """The server ended the CopyBoth stream: raise its error (or, after our own CopyDone,
        :class:`_StreamEnded` for :meth:`close`)."""
        if self._closed:
            raise _StreamEnded
        self._closed = True
        pgconn = self.conn.pgconn
        error = _result_error(pgconn.get_result())
        _drain_results(pgconn)
        raise error


class _StreamEnded(Exception):
    pass


def _wait(pgconn: PGconn, write: bool, timeout_s: float | None) -> bool:
    """Wait until the socket is readable (or writable); False on timeout."""
    sock = pgconn.socket
    readable, writable, _ = select.select(
        [] if write else [sock], [sock] if write else [], [], timeout_s
    )
    return bool(readable or writable)


def _result_error(result: PGresult | None) -> PipelineError:
    if result is None:
        return TransientError("replication stream ended without a result")
    if result.status == pq.ExecStatus.FATAL_ERROR:
        sqlstate = result.error_field(pq.DiagnosticField.SQLSTATE)
        message = result.error_field(pq.DiagnosticField.MESSAGE_PRIMARY)
        return classify(
            sqlstate.decode() if sqlstate else None,
            message.decode(errors="replace") if message else result.error_message.decode(),
        )
    # The C implementation of psycopg reports the status as a plain int.
    status = pq.ExecStatus(result.status).name
    return TransientError(f"replication stream ended by the server ({status})")


def _drain_results(pgconn: PGconn) -> None:
    try:
        while pgconn.is_busy() or pgconn.get_result() is not None:
            if pgconn.is_busy():
                _wait(pgconn, write=False, timeout_s=None)
                pgconn.consume_input()
    except psycopg.OperationalError:
        pass  # the session is gone; the error already raised says why


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())
