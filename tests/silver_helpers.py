"""Test-only helpers around silver's decoding (product code has no use for them)."""

from __future__ import annotations

from collections.abc import Iterable

from pyspark.sql import DataFrame

from pgmedallion.capture.copy_text import DELIMITER, NULL_MARKER
from pgmedallion.silver import decode
from pgmedallion.silver.copy_arrow import as_lists, copy_columns


def snapshot_diffs(copy_rows: DataFrame, copy_widths: dict[int, tuple[int, int]]) -> DataFrame:
    """:func:`silver.decode.snapshot_diffs`: the whole snapshot's diffs."""
    return decode.snapshot_diffs(copy_rows, copy_widths)


_ENCODE_FIELD = str.maketrans(
    {
        "\\": "\\\\",
        "\b": "\\b",
        "\f": "\\f",
        "\n": "\\n",
        "\r": "\\r",
        "\t": "\\t",
        "\v": "\\v",
    }
)


def encode_copy_field(value: str | None) -> str:
    """One field as PostgreSQL's COPY TO writes it."""
    if value is None:
        return NULL_MARKER
    return value.translate(_ENCODE_FIELD)


def encode_copy_row(values: Iterable[str | None]) -> bytes:
    """One row as PostgreSQL's COPY TO writes it, newline included."""
    return (DELIMITER.join(map(encode_copy_field, values)) + "\n").encode()


def copy_values(payloads, width: int):
    """``silver.copy_arrow.copy_columns`` as one ``list<string>`` of values per row (None where
    it leaves the payloads to the reference decoder)."""
    columns = copy_columns(payloads, width)
    return None if columns is None else as_lists(columns)
