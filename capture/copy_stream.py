"""Read a snapshot range's COPY in the server's own chunks, with no Python code per row.

libpq (and so psycopg) hands a COPY over one row per call: reading 1M rows costs about 1.5 s
of client CPU there, whatever the caller does with them. asyncpg reads the server's
``CopyData`` messages straight from its socket buffer and passes them to an output callback in
buffer-sized pieces (about 100 KB each), so the whole 1M-row read costs about 0.1 s of CPU.
Each ``CopyData`` message of a text COPY holds exactly one row, newline included, and asyncpg
hands over whole messages, so every piece ends with a newline; :func:`copy_chunks` joins
pieces to about ``chunk_bytes`` and counts rows with ``bytes.count`` (C).

The reader runs in a thread of its own with its own event loop, so callers (a Spark task's
generator) stay synchronous. The thread hands chunks over through a small bounded queue: when
the consumer is slower, the thread stops reading and TCP holds the server back, so memory stays
at a few chunks. A consumer that stops early makes the callback raise; the connection is then
terminated rather than returned half-read.

The session is the same as :func:`capture.connection.connect`'s: the settings that change how
values print travel in the startup packet (``server_settings``), before any query. asyncpg does
not read a libpq conninfo, so :func:`asyncpg_params` translates the keys it can express; a
conninfo with any other key (client certificates, ``passfile``, ``service``, several hosts)
is read through psycopg instead (:func:`pgmedallion.capture.snapshot.copy_range_chunks` decides).
"""

from __future__ import annotations

import asyncio
import queue
import shlex
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from pgmedallion.capture.connection import DEFAULT_CONNECT_TIMEOUT_S, SESSION_SETTINGS, redact
from pgmedallion.capture.errors import PipelineError, TransientError, classify

try:  # asyncpg is a dependency of the wheel; without it every read goes through psycopg.
    import asyncpg
except ImportError:  # pragma: no cover - exercised only in a broken install
    asyncpg = None

_TRANSLATED = frozenset(
    {
        "host",
        "port",
        "user",
        "password",
        "dbname",
        "sslmode",
        "application_name",
        "connect_timeout",
        "options",
    }
)
_SSL_MODES = {
    "disable": False,
    "allow": "allow",
    "prefer": "prefer",
    "require": "require",
    "verify-ca": "verify-ca",
    "verify-full": "verify-full",
}
_QUEUE_CHUNKS = 4


def asyncpg_params(conninfo: Mapping[str, Any]) -> dict[str, Any] | None:
    """``asyncpg.connect`` keyword arguments for this libpq conninfo, or ``None`` when it uses
    a key asyncpg cannot express the same way (the caller then reads through psycopg)."""
    if asyncpg is None:
        return None
    info = {key: str(value) for key, value in conninfo.items() if value not in (None, "")}
    if set(info) - _TRANSLATED or "," in info.get("host", "") + info.get("port", ""):
        return None
    settings = _option_settings(info.get("options", ""))
    if settings is None or info.get("sslmode", "prefer") not in _SSL_MODES:
        return None
    settings.update(SESSION_SETTINGS)
    if "application_name" in info:
        settings["application_name"] = info["application_name"]
    params: dict[str, Any] = {
        "server_settings": settings,
        "timeout": float(info.get("connect_timeout", DEFAULT_CONNECT_TIMEOUT_S)),
        # No statement cache: the COPY is the session's only statement and is never prepared.
        "statement_cache_size": 0,
    }
    for ours, theirs in (
        ("host", "host"),
        ("user", "user"),
        ("password", "password"),
        ("dbname", "database"),
    ):
        if ours in info:
            params[theirs] = info[ours]
    if "port" in info:
        params["port"] = int(info["port"])
    if "sslmode" in info:
        params["ssl"] = _SSL_MODES[info["sslmode"]]
    return params


def _option_settings(options: str) -> dict[str, str] | None:
    """libpq ``options`` made of ``-c name=value`` flags as a dict; ``None`` for anything else."""
    settings: dict[str, str] = {}
    words = shlex.split(options)
    while words:
        word = words.pop(0)
        if word == "-c" and words:
            word = words.pop(0)
        elif word.startswith("-c"):
            word = word[2:]
        elif word.startswith("--"):
            word = word[2:]
        else:
            return None
        name, sep, value = word.partition("=")
        if not sep:
            return None
        settings[name.replace("-", "_")] = value
    return settings


class _Stopped(Exception):
    """The consumer left before the COPY ended."""


_DONE = object()


def copy_chunks(
    params: Mapping[str, Any],
    statements: Sequence[str],
    query: str,
    chunk_bytes: int,
    conninfo_for_errors: Mapping[str, Any],
) -> Iterator[tuple[int, bytes]]:
    """Run ``statements`` (no results, no parameters) then ``COPY (query) TO STDOUT`` in one
    read-only REPEATABLE READ transaction; yield ``(rows, chunk)``, each chunk whole COPY TEXT
    lines of about ``chunk_bytes``.

    Server errors become capture errors (:func:`pgmedallion.capture.errors.classify`); a failure to
    connect is transient and names the server without its password.
    """
    handoff: queue.Queue[Any] = queue.Queue(maxsize=_QUEUE_CHUNKS)
    stop = threading.Event()

    def give(item: Any) -> None:
        while True:
            if stop.is_set():
                raise _Stopped
            try:
                handoff.put(item, timeout=0.2)
                return
            except queue.Full:
                continue

    async def read() -> None:
        try:
            conn = await asyncpg.connect(**params)
        except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            detail = " ".join(str(exc).split()) or type(exc).__name__
            password = conninfo_for_errors.get("password")
            if password:
                detail = detail.replace(str(password), "********")
            raise TransientError(
                f"cannot connect to {redact(conninfo_for_errors)}: {detail}",
                getattr(exc, "sqlstate", None),
            ) from None
        pieces: list[bytes] = []
        size = 0

        async def sink(piece: bytes) -> None:
            nonlocal pieces, size
            pieces.append(piece)
            size += len(piece)
            if size >= chunk_bytes:
                chunk = b"".join(pieces)
                pieces, size = [], 0
                give((chunk.count(b"\n"), chunk))

        try:
            async with conn.transaction(isolation="repeatable_read", readonly=True):
                for statement in statements:
                    await conn.execute(statement)
                # A bare query and no arguments: asyncpg then sends the COPY as a simple query
                # instead of preparing it first.
                await conn.copy_from_query(query, output=sink)
            if pieces:
                chunk = b"".join(pieces)
                give((chunk.count(b"\n"), chunk))
        finally:
            # After a failed or abandoned COPY the protocol state is not worth trusting.
            conn.terminate()

    def run() -> None:
        try:
            asyncio.run(read())
            give(_DONE)
        except _Stopped:
            pass
        except BaseException as exc:  # handed to the consumer, which raises it
            try:
                give(exc)
            except _Stopped:
                pass

    thread = threading.Thread(target=run, name="pgmedallion-copy", daemon=True)
    thread.start()
    try:
        while True:
            item = handoff.get()
            if item is _DONE:
                return
            if isinstance(item, BaseException):
                raise _capture_error(item)
            yield item
    finally:
        stop.set()
        thread.join()


def _capture_error(exc: BaseException) -> BaseException:
    if isinstance(exc, PipelineError):
        return exc
    if asyncpg is not None and isinstance(exc, asyncpg.PostgresError):
        error = classify(exc.sqlstate, getattr(exc, "message", None) or str(exc))
        error.__cause__ = exc
        return error
    if isinstance(exc, (OSError, EOFError, TimeoutError)) or (
        asyncpg is not None and isinstance(exc, asyncpg.InterfaceError)
    ):
        error = TransientError(f"connection lost during COPY: {' '.join(str(exc).split())}")
        error.__cause__ = exc
        return error
    return exc
