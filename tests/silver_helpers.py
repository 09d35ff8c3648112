"""Test-only helpers around silver's decoding (product code has no use for them)."""

from __future__ import annotations

from collections.abc import Iterable

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from pgmedallion.capture.copy_text import DELIMITER, NULL_MARKER
from pgmedallion.silver import decode
from pgmedallion.silver.copy_sql import PYTHON_CODE, python_diffs


def snapshot_diffs(
    copy_rows: DataFrame, copy_widths: dict[int, tuple[int, int]], *, mark: bool = False
) -> DataFrame:
    """:func:`silver.decode.snapshot_diffs`; without ``mark``, the records it marks for the
    Python decoder decoded there instead of their marker rows (the whole snapshot's diffs)."""
    marked = decode.snapshot_diffs(copy_rows, copy_widths)
    if mark:
        return marked
    fast = marked.where(F.col("code").isNull() | (F.col("code") != PYTHON_CODE))
    slow = python_diffs(copy_rows, copy_widths, decode.python_copy(copy_widths))
    return fast.unionByName(slow)


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
