"""Silver's definite errors, as types, and the record silver writes for one.

Each class is a :class:`~core.errors.DefiniteError` whose ``code`` (its class name) is the value
of ``code`` in silver's ``_errors`` table. Silver records an error for the row, change or
table it concerns and goes on with the others; bronze's own error records (capture's
``PublicationDropped``, ``TableDropped``, ``SlotCompacted``, ...) are copied to ``_errors`` with
their codes as they are.
"""

from __future__ import annotations

from dataclasses import dataclass

from pgmedallion.core.errors import DefiniteError


class SilverError(DefiniteError):
    """A definite error silver finds in a table's rows or changes."""


class InvalidCopyInput(SilverError):
    """A snapshot's COPY TEXT line that is not valid COPY text (bad escape, not UTF-8)."""


class ColumnCountMismatch(SilverError):
    """A COPY line with more fields than the table's COPY columns."""


class MissingColumn(SilverError):
    """A COPY line with fewer fields than the table's COPY columns."""


class CastError(SilverError):
    """A value whose text does not cast to its column's Spark type."""


class InvalidValue(SilverError):
    """A change's value silver cannot read (a binary-format value in a text-format stream)."""


class SchemaIncompatible(SilverError):
    """A Relation (or a change read against one) that silver's table cannot follow."""


class MissingToast(SilverError):
    """An unchanged TOASTed value whose previous value silver does not know."""


class DefaultReplicaIdentity(SilverError):
    """An update or delete of a table whose replica identity does not give the old row."""


class UnknownPreviousRow(SilverError):
    """A change by key whose previous row never reached silver."""


class TableTruncated(SilverError):
    """A TRUNCATE of a table whose policy is ``truncate: error``."""


@dataclass(frozen=True)
class ErrorRecord:
    """One row of ``_errors`` as silver's run carries it (the run adds source, names, run)."""

    table_oid: int | None
    lsn: int | None
    code: str
    message: str
    column: str | None = None
    raw: str | None = None

    @classmethod
    def of(
        cls,
        table_oid: int | None,
        lsn: int | None,
        error: DefiniteError,
        column: str | None = None,
        raw: str | None = None,
    ) -> ErrorRecord:
        """The record of ``error`` (its code and message) for a table at an LSN."""
        return cls(table_oid, lsn, error.code, str(error), column, raw)
