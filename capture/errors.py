"""What can go wrong on the PostgreSQL side, as types.

Every failure capture raises is a :class:`~core.errors.PipelineError`, and every one is either

- **transient**: the world may heal on its own (a connection refused or lost, an authentication
  timeout, a slot still held by a dying walsender, a walsender killed by an administrator).
  The caller retries with backoff; nothing about it is ever written as data; or
- **definite**: a fact about the source at some LSN that no retry can change (the publication
  or the slot is gone, the slot no longer holds the WAL we need, the server is on another
  timeline, a table was dropped). The caller records it for the tables it concerns and stops
  reading those tables, not the others.

::

    psycopg.Error ──server_errors()──┐
    server error message ───────────classify()──> TransientError ─> retry with backoff
                                             └──> DefiniteError  ─> bronze error record

Messages are single lines meant for logs and error records, so they never carry a password:
connection errors name the server through ``connection.redact``, and :func:`classify` receives
only the server's message text, which PostgreSQL never fills with credentials.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import psycopg

from pgmedallion.core.errors import (  # the shared taxonomy
    DefiniteError,
    PipelineError,
    TransientError,
)


class SlotInUse(TransientError):
    """Another session still streams from the slot (often a stale connection of ours)."""


class PublicationDropped(DefiniteError):
    """The publication the stream reads no longer exists."""


class SlotMissing(DefiniteError):
    """The replication slot does not exist (dropped, or never created on this server)."""


class SlotInvalidated(DefiniteError):
    """The server invalidated the slot (``wal_status = 'lost'``): its WAL was removed."""


class SlotCompacted(DefiniteError):
    """The resume point is older than what the slot still holds, so changes were lost."""


class SlotPluginMismatch(DefiniteError):
    """A slot with our name exists but decodes with another plugin or in another database."""


class TimelineChanged(DefiniteError):
    """The server is not the one (system id, timeline) whose LSNs we recorded, nor a later
    timeline of it that branched off after everything bronze holds."""


class SlotNotSynchronized(DefiniteError):
    """After a failover: the new primary (a later timeline of the recorded system) has no copy
    of the slot, so its changes since bronze's frontier cannot be read there. Nothing is
    recorded: pointing ``[source]`` back at the old primary, if it still runs, is still a way
    back."""


class SourceBehind(DefiniteError):
    """A slot is to be made anew (``pgmedallion resync --all``) on a server whose WAL position
    is still before bronze's frontier (a standby promoted before it received what bronze read,
    or another server): its LSNs would go back. Nothing was written; a later run goes on once
    the server's WAL has passed the frontier."""


class FailoverUnsupported(DefiniteError):
    """``[source] failover_slot = "on"`` on a server without failover slots (before 17)."""


class PolicyNotApplicable(DefiniteError):
    """A table's column policies (``pii``) cannot be applied to what the stream sends: a column
    they protect is gone from it under that name (renamed or dropped), or is a replica identity
    key column to exclude. Capture stops before anything of the table lands unprotected."""


class SnapshotWaiting(TransientError):
    """A snapshot gave up waiting for transactions open on the server to end (see
    ``capture.snapshot.export_snapshot``): the tables it was for are left to the next run."""


class TableDropped(DefiniteError):
    """A table we capture no longer exists."""


class ColumnsAmbiguous(DefiniteError):
    """Under ``on_schema_change = "error"``: columns were renamed so that their names no longer
    tell them apart in the stream (two names swapped, a name given again after a drop), and
    the table cannot be read by position. Nothing is followed and nothing is snapshotted
    again under that policy, so the table's changes from here are held (``pgmedallion resync``
    makes it exact) rather than read under the wrong names."""


@dataclass(frozen=True)
class _Rule:
    sqlstate: str
    needle: str
    error: type[PipelineError]


# Server errors are matched on SQLSTATE and, where one SQLSTATE covers several causes, on a
# fragment of the (English) message text; anything unmatched is transient, because a definite
# error stops a table forever and must only be claimed when we are sure.
_RULES = (
    _Rule("42704", "replication slot", SlotMissing),
    _Rule("42704", "publication", PublicationDropped),
    _Rule("55006", "", SlotInUse),
    _Rule("55000", "can no longer", SlotInvalidated),
    _Rule("55000", "invalidated", SlotInvalidated),
    _Rule("42P01", "", TableDropped),
)


def classify(sqlstate: str | None, message: str) -> PipelineError:
    """The capture error for a server error with this SQLSTATE and primary message."""
    line = " ".join(message.split())
    for rule in _RULES:
        if sqlstate == rule.sqlstate and rule.needle in line:
            return rule.error(line, sqlstate)
    return TransientError(line, sqlstate)


def from_psycopg(exc: psycopg.Error) -> PipelineError:
    """The capture error for a psycopg error; a lost connection has no SQLSTATE: transient."""
    return classify(exc.sqlstate, exc.diag.message_primary or str(exc))


@contextmanager
def server_errors() -> Iterator[None]:
    """Re-raise any psycopg error inside the block as its capture error."""
    try:
        yield
    except psycopg.Error as exc:
        raise from_psycopg(exc) from exc
