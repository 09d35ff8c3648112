r"""COPY TEXT rows decoded over Arrow: payloads -> a ``string`` column per field.

The same decoding as :func:`capture.copy_text.decode_copy_row` (the reference): lines split on
newlines, fields on tabs (Arrow's CSV reader), ``\N`` is NULL, one-character escapes (``\\``,
``\n``, ``\t`` ...) resolved by Arrow kernels; a line with another escape (octal, hex, ``\.``,
a lone backslash) is decoded by the reference decoder. It runs in the driver (a table's first
snapshot, :mod:`silver.first_load`) and in Spark's Python workers (:mod:`silver.decode`) alike.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv

from pgmedallion.capture.copy_text import CopyDecodeError, decode_copy_row

_NULL = "\\N"


_SIMPLE = r"^(?:[^\\\x00]|\\[\\bfnrtv])*$"
r"""A field whose escapes are all of one character (``\\``, ``\n``, ``\t`` ...): unescaped over
Arrow. Others (octal and hex escapes, ``\.``, a lone backslash) go to the reference decoder."""
_ONE_CHARACTER = [("\\n", "\n"), ("\\t", "\t"), ("\\r", "\r"), ("\\b", "\b")]
_ONE_CHARACTER += [("\\f", "\f"), ("\\v", "\v")]


def _unescaped(texts: pa.Array) -> pa.Array:
    """Fields matching :data:`_SIMPLE` with their escapes resolved: an escaped backslash is
    set aside as NUL (which no such field holds) while the others are replaced."""
    out = pc.replace_substring(texts, "\\\\", "\x00")
    for escape, character in _ONE_CHARACTER:
        out = pc.replace_substring(out, escape, character)
    return pc.replace_substring(out, "\x00", "\\")


def copy_columns(payloads: pa.Array, width: int) -> list[pa.Array] | None:
    """COPY TEXT payloads (each a chunk of rows ended by newlines) -> the rows' ``width``
    columns of values (``string``), decoded as ``capture.copy_text.decode_copy_row`` decodes
    them; None when a payload is not UTF-8 or does not end with a newline, holds a carriage
    return, or a line is not valid COPY TEXT or has another number of fields (the per-table
    path then decodes it line by line and writes its error records).

    The lines are split by Arrow's CSV reader (tab-delimited, no quoting, no escapes, ``\\N``
    NULL): COPY TEXT escapes every tab, newline and carriage return inside a value, so the
    raw ones are the separators. A field with a backslash is then unescaped: one-character
    escapes by Arrow kernels, a line with any other (octal, hex, ``\\.``, a lone backslash)
    by the reference decoder."""
    if isinstance(payloads, pa.ChunkedArray):
        payloads = payloads.combine_chunks()
    raw = payloads
    if raw.null_count or not pc.all(pc.greater(pc.binary_length(raw), 0)).as_py():
        raw = raw.filter(pc.greater(pc.binary_length(raw), 0))
    if len(raw) == 0:
        return [pa.array([], pa.string()) for _ in range(width)]
    if width == 0 or not pc.all(pc.ends_with(raw, b"\n")).as_py():
        return None
    data = _contiguous(raw)
    text = data.to_pybytes()  # (bytes.find is memchr: several times Arrow's substring kernels)
    if text.find(b"\r") >= 0:
        return None  # a line separator to the CSV reader, a character to COPY's
    if width > 1 and (text.startswith(b"\n") or text.find(b"\n\n") >= 0):
        return None  # an empty line: one field (the CSV reader would give it all of them)
    names = [f"c{i}" for i in range(width)]
    try:
        table = pcsv.read_csv(
            pa.BufferReader(data),
            pcsv.ReadOptions(
                column_names=names, use_threads=False, block_size=max(1 << 20, len(data) + 1)
            ),
            _PARSE,
            pcsv.ConvertOptions(
                column_types=dict.fromkeys(names, pa.string()),
                null_values=[_NULL],
                strings_can_be_null=True,
            ),
        )
    except pa.ArrowInvalid:  # a line of another number of fields, or not UTF-8
        return None
    columns = [c.combine_chunks() for c in table.columns]
    if text.find(b"\\") < 0:
        return columns
    return _unescaped_columns(columns, width)


_PARSE = pcsv.ParseOptions(
    delimiter="\t",
    quote_char=False,
    double_quote=False,
    escape_char=False,
    newlines_in_values=False,
    ignore_empty_lines=False,
)


def _contiguous(raw: pa.Array) -> pa.Buffer:
    """The bytes of ``raw``'s values, one after the other (a slice of its data buffer)."""
    offsets = np.frombuffer(
        raw.buffers()[1], np.int64 if pa.types.is_large_binary(raw.type) else np.int32
    )[raw.offset : raw.offset + len(raw) + 1]
    return raw.buffers()[2].slice(int(offsets[0]), int(offsets[-1] - offsets[0]))


def _unescaped_columns(columns: list[pa.Array], width: int) -> list[pa.Array] | None:
    """:func:`copy_columns`' columns with their escapes resolved (see there)."""
    n = len(columns[0])
    odd = np.zeros(n, bool)
    simple_rows: list[tuple[np.ndarray, pa.Array]] = []
    for texts in columns:
        escaped = np.flatnonzero(
            pc.fill_null(pc.match_substring(texts, "\\"), False).to_numpy(zero_copy_only=False)
        )
        found = texts.take(pa.array(escaped))
        simple = pc.match_substring_regex(found, _SIMPLE).to_numpy(zero_copy_only=False)
        odd[escaped[~simple]] = True  # a field with another escape: its line goes whole
        simple_rows.append((escaped[simple], found.filter(pa.array(simple))))
    decoded = None
    if odd.any():  # the lines, as they were (no field holds a tab), to the reference decoder
        rows = pa.array(np.flatnonzero(odd))
        raws = [texts.take(rows).to_pylist() for texts in columns]
        try:
            decoded = [
                decode_copy_row("\t".join(_NULL if v is None else v for v in line).encode(), width)
                for line in zip(*raws, strict=True)
            ]
        except CopyDecodeError:
            return None
    out = []
    for p, (texts, (rows, found)) in enumerate(zip(columns, simple_rows, strict=True)):
        if len(rows):
            mask = np.zeros(n, bool)
            mask[rows] = True
            texts = pc.replace_with_mask(texts, pa.array(mask), _unescaped(found))
        if decoded is not None:
            texts = pc.replace_with_mask(
                texts, pa.array(odd), pa.array([line[p] for line in decoded], pa.string())
            )
        out.append(texts)
    return out


def as_lists(columns: list[pa.Array]) -> pa.Array:
    """Columns of equal length -> one ``list<string>`` per row of their values."""
    width = len(columns)
    n = len(columns[0]) if columns else 0
    flat = pa.concat_arrays(columns) if columns else pa.array([], pa.string())
    order = (np.arange(n)[:, None] + np.arange(width)[None, :] * n).ravel()
    return pa.ListArray.from_arrays(
        pa.array(np.arange(0, n * width + 1, width, dtype=np.int32)),
        flat.take(pa.array(order)) if width else flat,
    )
