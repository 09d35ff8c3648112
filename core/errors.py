"""The error taxonomy every layer shares.

Every failure pgmedallion names is a :class:`PipelineError`, and every one is either

- **transient** (:class:`TransientError`): the world may heal on its own (a connection lost, a
  slot still held, a server restarting). The caller retries with backoff and never records it
  as data; or
- **definite** (:class:`DefiniteError`): a fact about the source at some LSN that no retry
  changes (a publication dropped, a value that does not cast, a table without a usable
  replica identity). It is recorded as an error record for the tables it concerns, which stop
  there; the other tables go on.

An error's ``code`` is its class name: the value of ``code`` in bronze's and silver's error
records, and what the CLI reports. Capture's errors live in ``capture/errors.py``, silver's in
``silver/errors.py``.
"""

from __future__ import annotations


class PipelineError(Exception):
    """Any failure pgmedallion names; ``sqlstate`` is the server's, when one caused it.
    ``stage``: the pipeline stage it ended (``capture``, ``silver``, ``gold``, ``marts``), set
    by the pipeline as the error leaves that stage."""

    stage: str | None = None

    def __init__(self, message: str, sqlstate: str | None = None) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate

    @property
    def code(self) -> str:
        return type(self).__name__


class TransientError(PipelineError):
    """Retry later: connection refused or lost, timeouts, a slot in use, a killed walsender."""


class DefiniteError(PipelineError):
    """A fact about the source that no retry changes; recorded as data for its tables."""


class JavaMissing(RuntimeError):
    """No Java that Spark 4 can run on: a setup problem, said with what to install."""


def error_type(code: str) -> type[PipelineError] | None:
    """The error class whose code this is, among those defined so far (None: not ours)."""
    pending: list[type[PipelineError]] = [PipelineError]
    while pending:
        cls = pending.pop()
        if cls.__name__ == code:
            return cls
        pending.extend(cls.__subclasses__())
    return None


def holds_table(run: int, lsn: int, snapshot_run: int | None, snapshot_lsn: int | None) -> bool:
    """Whether a definite error recorded for a table (by silver's run ``run``, at ``lsn``)
    still holds it: it is not from before the table's newest snapshot (``snapshot_run``, the
    silver run that rebuilt it from that snapshot, at ``snapshot_lsn``). An older one is history
    (``pgmedallion resync`` recovered the table), even when silver read it in the same run as
    the snapshot (a lost slot's error, then ``resync --all``): the snapshot holds the table's
    rows from before it. Gold's ``no_definite_errors`` and ``status`` count these."""
    return (snapshot_run is None or run >= snapshot_run) and (
        lsn is None or snapshot_lsn is None or lsn >= snapshot_lsn
    )
