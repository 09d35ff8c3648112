r"""Decode rows of PostgreSQL's COPY TEXT format (what ``COPY ... TO STDOUT`` sends by default).

A row is its fields joined by tabs and ended by one newline. ``\N`` alone is SQL NULL. Inside a
field a backslash escapes the next byte: ``\b \f \n \r \t \v`` are those control bytes, ``\``
followed by 1-3 octal digits or by ``x`` and 1-2 hex digits is one byte of that value (modulo
256), a backslash before any other byte (the delimiter included) stands for that byte, except that
``\.`` is the end-of-data marker, which PostgreSQL rejects inside a row::

    on the wire:   1 <TAB> O\\Brien <TAB> two\nlines <TAB> \N <LF>
    decoded:       "1",    "O\Brien",     "two<LF>lines",  NULL

Escapes are resolved on bytes, because ``\xNN`` and octal escapes may spell out the bytes of a
multibyte character; each field is then decoded as UTF-8 (the capture connections pin
``client_encoding=UTF8``). Because every tab that PostgreSQL writes inside a value is escaped, a
row without any backslash splits on raw tabs in one C-level call: that is the common case, and
the only one that needs to be fast. Silver decodes snapshot rows over Arrow
(``silver/copy_arrow.py``) and leaves this decoder, the reference, the rows with rare escapes.

Errors are definite, i.e. they belong to the row and would recur on every re-read:
``InvalidCopyInput`` for a row ending in a lone backslash, ``\.``, or a field that is not UTF-8;
``ColumnCountMismatch`` (``MissingColumn`` when fields are missing) when the row does not have
the number of columns the caller expects.
"""

from __future__ import annotations

import re

NULL_MARKER = "\\N"
DELIMITER = "\t"

_RAW_NULL = NULL_MARKER.encode()
_RAW_DELIMITER = DELIMITER.encode()
_BACKSLASH = b"\\"
_ESCAPE = re.compile(rb"\\([0-7]{1,3}|x[0-9A-Fa-f]{1,2}|.)", re.DOTALL)
_END_OF_DATA = b"."
_SINGLE_BYTE_ESCAPES = {bytes([c]): bytes([c]) for c in range(256) if c not in b"01234567."} | {
    b"b": b"\b",
    b"f": b"\f",
    b"n": b"\n",
    b"r": b"\r",
    b"t": b"\t",
    b"v": b"\v",
}


class CopyDecodeError(ValueError):
    """A COPY TEXT row that cannot be decoded into the expected columns."""


class InvalidCopyInput(CopyDecodeError):
    """Not valid COPY TEXT: a dangling backslash, an end-of-data marker, or bytes not UTF-8."""


class ColumnCountMismatch(CopyDecodeError):
    """The row has a different number of fields than the table has columns."""

    def __init__(self, expected: int, actual: int) -> None:
        super().__init__(f"COPY row has {actual} fields, expected {expected}")
        self.expected = expected
        self.actual = actual


class MissingColumn(ColumnCountMismatch):
    """The row has fewer fields than the table has columns."""


def decode_copy_row(raw: bytes, expected_columns: int | None = None) -> list[str | None]:
    """Decode one COPY TEXT row, with or without its trailing newline, into field values."""
    if raw.endswith(b"\n"):
        raw = raw[:-1]
    fields: list[str | None]
    if _BACKSLASH in raw:
        fields = [_decode_field(field) for field in _split_escaped(raw)]
    else:
        try:
            fields = raw.decode().split(DELIMITER)  # type: ignore[assignment]
        except UnicodeDecodeError as exc:
            raise InvalidCopyInput(f"COPY row is not valid UTF-8: {exc}") from None
    if expected_columns is not None and len(fields) != expected_columns:
        if expected_columns == 0 and fields == [""]:
            return []
        if len(fields) < expected_columns:
            raise MissingColumn(expected_columns, len(fields))
        raise ColumnCountMismatch(expected_columns, len(fields))
    return fields


def copy_fields(line: bytes) -> list[bytes]:
    """A row (without its newline) split into its fields as they are on the wire: still escaped,
    ``\\N`` for NULL. Joining them with tabs gives the row back."""
    return _split_escaped(line) if _BACKSLASH in line else line.split(_RAW_DELIMITER)


def field_bytes(field: bytes) -> bytes | None:
    """One field's value as the type's output function wrote it (escapes resolved), or None for
    NULL: the bytes pgoutput sends for the same value."""
    if field == _RAW_NULL:
        return None
    return _ESCAPE.sub(_unescape, field) if _BACKSLASH in field else field


def _split_escaped(raw: bytes) -> list[bytes]:
    """Split on the tabs that are not escaped by an odd run of backslashes."""
    fields: list[bytes] = []
    pending = b""
    for piece in raw.split(_RAW_DELIMITER):
        piece = pending + piece
        trailing_backslashes = len(piece) - len(piece.rstrip(_BACKSLASH))
        if trailing_backslashes % 2:
            pending = piece + _RAW_DELIMITER
        else:
            pending = b""
            fields.append(piece)
    if pending:
        raise InvalidCopyInput("COPY row ends with a lone backslash")
    return fields


def _decode_field(field: bytes) -> str | None:
    value = field_bytes(field)
    if value is None:
        return None
    try:
        return value.decode()
    except UnicodeDecodeError as exc:
        raise InvalidCopyInput(f"COPY field is not valid UTF-8: {exc}") from None


def _unescape(match: re.Match[bytes]) -> bytes:
    escaped = match.group(1)
    single = _SINGLE_BYTE_ESCAPES.get(escaped)
    if single is not None:
        return single
    if escaped == _END_OF_DATA:
        raise InvalidCopyInput("COPY row contains the end-of-data marker \\.")
    if escaped[0] == ord("x"):
        return bytes([int(escaped[1:], 16)])
    return bytes([int(escaped, 8) & 0xFF])
