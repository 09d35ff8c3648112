"""Open the two kinds of PostgreSQL session capture uses, with deterministic text formats.

Bronze stores values exactly as the server prints them (COPY text, pgoutput text tuples), and
silver parses that text later, possibly on another machine. So every capture session pins the
settings that change how values print, in the startup packet, before any query runs::

    client_encoding=UTF8  DateStyle=ISO,MDY  IntervalStyle=postgres  TimeZone=UTC
    extra_float_digits=3  bytea_output=hex

``MDY`` does not change ISO output; pinning it keeps a caller's ``DMY`` from changing date
input too. The walsender formats pgoutput tuples with the same settings, because it runs the
type output functions in the replication session (the tests check both against a caller who
asks for another time zone and date style).

- :func:`connect` opens an ordinary session in autocommit mode: capture never leaves an implicit
  transaction open (it would hold back vacuum); snapshot reads begin theirs explicitly.
- :func:`connect_replication` opens a ``replication=database`` session, which speaks only the
  simple query protocol; ``prepare_threshold=None`` stops psycopg from preparing a repeated
  statement there.

A failure to connect is a :class:`~capture.errors.TransientError` whose one-line message names
the server through :func:`redact`, never with its password.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import psycopg

from pgmedallion.capture.errors import TransientError

SESSION_SETTINGS = {
    "client_encoding": "UTF8",
    "DateStyle": "ISO,MDY",
    "IntervalStyle": "postgres",
    "TimeZone": "UTC",
    "extra_float_digits": "3",
    "bytea_output": "hex",
}

SECRET_KEYS = frozenset({"password", "sslpassword"})

DEFAULT_CONNECT_TIMEOUT_S = 30


def connect(conninfo: Mapping[str, Any]) -> psycopg.Connection:
    """An autocommit session with the capture settings pinned."""
    return _open(conninfo, autocommit=True)


def connect_replication(conninfo: Mapping[str, Any]) -> psycopg.Connection:
    """A logical replication (``replication=database``) session with the settings pinned."""
    return _open(conninfo, autocommit=True, replication="database", prepare_threshold=None)


def redact(conninfo: Mapping[str, Any]) -> str:
    """``key=value`` text for logs, with secrets masked."""
    return " ".join(
        f"{key}={'********' if key in SECRET_KEYS else value}"
        for key, value in conninfo.items()
        if value is not None and value != ""
    )


def session_options(extra: str = "") -> str:
    """The libpq ``options`` string: ``-c`` flags for :data:`SESSION_SETTINGS` after ``extra``."""
    flags = " ".join(f"-c {name}={value}" for name, value in SESSION_SETTINGS.items())
    return f"{extra} {flags}".strip()


def _open(conninfo: Mapping[str, Any], **kwargs: Any) -> psycopg.Connection:
    params = dict(conninfo)
    params["options"] = session_options(params.get("options") or "")
    params.setdefault("connect_timeout", DEFAULT_CONNECT_TIMEOUT_S)
    try:
        return psycopg.connect(**params, **kwargs)
    except psycopg.OperationalError as exc:
        raise TransientError(
            f"cannot connect to {redact(conninfo)}: {_one_line(exc, conninfo)}",
            getattr(exc, "sqlstate", None),
        ) from None


def _one_line(exc: Exception, conninfo: Mapping[str, Any]) -> str:
    text = " ".join(str(exc).split())
    for key in SECRET_KEYS:
        secret = conninfo.get(key)
        if secret:
            text = text.replace(str(secret), "********")
    return text
