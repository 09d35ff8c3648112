r"""COPY TEXT rows decoded over Arrow: payloads -> one ``list<string>`` of values per row.

The same decoding as :func:`capture.copy_text.decode_copy_row` (the reference): lines split on
newlines, fields on tabs, ``\N`` is NULL, one-character escapes (``\\``, ``\n``, ``\t`` ...)
resolved by Arrow kernels; a line with another escape (octal, hex, ``\.``, a lone backslash)
is decoded by the reference decoder. It runs in the driver (a table's first snapshot,
:mod:`silver.first_load`) and in Spark's Python workers (:mod:`silver.decode`) alike.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

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


def copy_values(payloads: pa.Array, width: int) -> pa.Array | None:
    """COPY TEXT payloads (each a chunk of rows ended by newlines) -> one ``list<string>`` of
    ``width`` values per row, decoded as ``capture.copy_text.decode_copy_row`` decodes them
    (the lines with escapes other than one-character ones go to it); None when a payload is
    not UTF-8 or does not end with a newline, or a line is not valid COPY TEXT or has another
    number of fields (the per-table path then writes its error records)."""
    raw = payloads.filter(pc.greater(pc.binary_length(payloads), 0))
    if len(raw) == 0:
        return pa.array([], pa.list_(pa.string()))
    if width == 0 or not pc.all(pc.ends_with(raw, b"\n")).as_py():
        return None
    try:  # each payload without its last newline: the lines are then all the pieces
        body = pc.binary_slice(raw, 0, -1).cast(pa.string())
    except pa.ArrowInvalid:
        return None
    lines = pc.list_flatten(pc.split_pattern(body, "\n"))
    fields = pc.split_pattern(lines, "\t")
    fewest, most = pc.min_max(pc.list_value_length(fields)).values()
    if fewest.as_py() != width or most.as_py() != width:
        return None  # an escaped tab splits wrong too: the per-table path decides
    texts = pc.list_flatten(fields)
    null = pc.equal(texts, _NULL).to_numpy(zero_copy_only=False)
    odd = np.zeros(len(lines), bool)
    escaping = pc.match_substring(lines, "\\").to_numpy(zero_copy_only=False)
    if escaping.any():  # only the fields of lines with a backslash can hold an escape
        candidates = (np.flatnonzero(escaping)[:, None] * width + np.arange(width)).ravel()
        inside = pc.match_substring(texts.take(candidates), "\\").to_numpy(zero_copy_only=False)
        escaped = candidates[inside & ~null[candidates]]
        found = texts.take(escaped)
        simple = pc.match_substring_regex(found, _SIMPLE).to_numpy(zero_copy_only=False)
        # a field with another escape: its line goes to the reference decoder
        odd[escaped[~simple] // width] = True
        mask = np.zeros(len(texts), bool)
        mask[escaped[simple]] = True
        texts = pc.replace_with_mask(texts, pa.array(mask), _unescaped(found.filter(simple)))
    values = pa.ListArray.from_arrays(
        pa.array(np.arange(0, len(lines) * width + 1, width, dtype=np.int32)),
        _with_nulls(texts, null),
    )
    if not odd.any():
        return values
    decoded = []
    for line in lines.filter(pa.array(odd)).to_pylist():
        try:
            decoded.append(decode_copy_row(line.encode(), width))
        except CopyDecodeError:
            return None
    return pa.concat_arrays([values.filter(pa.array(~odd)), pa.array(decoded, values.type)])


def _with_nulls(texts: pa.Array, null: np.ndarray) -> pa.Array:
    """``texts`` with NULL where ``null`` holds, its text buffers shared (no copy of 4M
    strings to drop the NULL markers)."""
    texts = texts.combine_chunks() if isinstance(texts, pa.ChunkedArray) else texts
    valid = np.concatenate([np.zeros(texts.offset, bool), ~null])
    if texts.null_count:
        valid[texts.offset :] &= pc.is_valid(texts).to_numpy(zero_copy_only=False)
    bitmap = pa.py_buffer(np.packbits(valid, bitorder="little"))
    _, offsets, data = texts.buffers()
    return pa.Array.from_buffers(
        pa.string(), len(texts), [bitmap, offsets, data], offset=texts.offset
    )
