r"""The plain cast in the driver: PostgreSQL's text of a value -> its typed value, over Arrow.

Silver's casts are Spark SQL expressions (:mod:`silver.casts`): the *full* cast, with an error
message per value that does not cast and the column policies (``±infinity``, rounding), and the
*plain* cast, which settles the texts that are a value's own canonical form and leaves every
other text *unsettled* for the full cast. A run whose window is small is read and decoded in the
driver (no JVM needed); this module is its plain cast. It settles a text only when the value it
reads is beyond doubt, and leaves everything else unsettled (the table then takes Spark's path,
which decides it with the full cast):

- integers and constrained numerics: the value's text written back by Arrow is the text itself
  (what :func:`silver.casts._canonical_number` asks in Spark: nothing rounded, cut, padded or
  out of range); numerics silver may round (an unconstrained one) are settled when they have at
  most the column's scale of decimals and fit (``_rounding_number``);
- floating point: the text PostgreSQL writes (``extra_float_digits=3``) parsed with correct
  rounding, as Java's parser does; ``NaN`` and ``±Infinity`` as themselves; a finite text that
  overflows is unsettled;
- dates and timestamps: the ISO form with a four-digit year (``timestamptz`` in UTC, ``+00``,
  as capture sessions pin ``TimeZone``), written back by Arrow to the same instant's text;
  ``±infinity`` is unsettled (its policy is the full cast's);
- ``bool``: ``t`` / ``f``; ``bytea``: ``\x`` and an even number of hex digits;
- every type silver keeps as text (text, json, uuid, enums, ...): the text as it is.

Interval, arrays and columns with a type override have no plain cast here: their tables take
Spark's path. No value is ever decided differently from the full cast: a settled value is one
whose text both casts read as that value.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.pandas.types import to_arrow_type
from pyspark.sql.types import DecimalType

from pgmedallion.silver.casts import CASTS, _rounds
from pgmedallion.silver.pgtypes import (
    BOOL,
    BYTEA,
    DATE,
    FLOAT4,
    FLOAT8,
    INT2,
    INT4,
    INT8,
    NUMERIC,
    OID,
    TIMESTAMP,
    TIMESTAMPTZ,
    PgType,
    base_oid,
    element_type,
    spark_type,
)

ArrowPlain = Callable[[pa.Array], pa.Array]
"""Texts (``string``, NULL = SQL NULL) -> typed values, NULL where a non-NULL text is not
settled."""

_INT = r"^-?[0-9]{1,19}$"
_FLOAT = r"^-?([0-9]+(\.[0-9]*)?|\.[0-9]+)(e[+-]?[0-9]+)?$"
_DECIMAL = r"^-?[0-9]+(\.[0-9]+)?$"
_DATE = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$"
_TIMESTAMP = r"^[0-9]{4}-[0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,6})?$"
_UTC = "+00"


def arrow_type(t: PgType) -> pa.DataType:
    """The Arrow type of ``t``'s Spark type (what silver's Delta table holds)."""
    return to_arrow_type(spark_type(t), timezone="UTC")


def _nulls(n: int, target: pa.DataType) -> pa.Array:
    return pa.nulls(n, target)


def _where(mask: pa.Array, texts: pa.Array) -> pa.Array:
    """``texts`` where ``mask`` holds, NULL elsewhere."""
    return pc.if_else(pc.fill_null(mask, False), texts, pa.scalar(None, texts.type))


def _cast(texts: pa.Array, target: pa.DataType) -> pa.Array | None:
    """Arrow's cast; where it refuses some value, each value alone (NULL for those refused)."""
    try:
        return pc.cast(texts, target)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        pass
    out = []
    for text in texts:
        try:
            out.append(pc.cast(text, target))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            out.append(pa.scalar(None, target))
    return pa.array([v.as_py() for v in out], target)


def _text(texts: pa.Array) -> pa.Array:
    return texts


def _bool(texts: pa.Array) -> pa.Array:
    true, false = pc.equal(texts, "t"), pc.equal(texts, "f")
    return pc.if_else(true, True, pc.if_else(false, False, pa.scalar(None, pa.bool_())))


def _integer(target: pa.DataType) -> ArrowPlain:
    def cast(texts: pa.Array) -> pa.Array:
        candidates = _where(pc.match_substring_regex(texts, _INT), texts)
        wide = _cast(candidates, pa.int64())
        if wide is None:
            return _nulls(len(texts), target)
        info = np.iinfo(target.to_pandas_dtype())
        fits = pc.and_(pc.greater_equal(wide, info.min), pc.less_equal(wide, info.max))
        canonical = pc.equal(pc.cast(wide, pa.string()), texts)
        ok = pc.fill_null(pc.and_(fits, canonical), False)
        return pc.cast(pc.if_else(ok, wide, pa.scalar(None, pa.int64())), target)

    return cast


def _float(target: pa.DataType) -> ArrowPlain:
    special = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}

    def cast(texts: pa.Array) -> pa.Array:
        numbers = _where(pc.match_substring_regex(texts, _FLOAT), texts)
        parsed = _cast(numbers, target)
        if parsed is None:
            return _nulls(len(texts), target)
        finite = pc.fill_null(pc.is_finite(parsed), False)
        out = pc.if_else(finite, parsed, pa.scalar(None, target))
        for text, value in special.items():
            out = pc.if_else(
                pc.fill_null(pc.equal(texts, text), False), pa.scalar(value, target), out
            )
        return out

    return cast


def _decimal(target: pa.DataType, rounding: bool) -> ArrowPlain:
    whole_digits = target.precision - target.scale

    def cast(texts: pa.Array) -> pa.Array:
        valid = pc.match_substring_regex(texts, _DECIMAL)
        # A numeric silver may round is read by its significant decimals (as Spark's plain cast
        # reads it, ``silver.casts._rounding_number``): trailing zeros change no value, and
        # 0.25000000000000000000 is 0.25 in decimal(38,18). The digits cast are those.
        digits = _without_trailing_zeros(texts) if rounding else texts
        whole = pc.utf8_length(pc.extract_regex(digits, r"^-?0*(?P<w>[0-9]*)").field("w"))
        point = pc.find_substring(digits, ".")
        decimals = pc.if_else(
            pc.equal(point, -1), 0, pc.subtract(pc.subtract(pc.utf8_length(digits), point), 1)
        )
        fits = pc.and_(pc.less_equal(whole, whole_digits), pc.less_equal(decimals, target.scale))
        parsed = _cast(_where(pc.and_(valid, fits), digits), target)
        if parsed is None:
            return _nulls(len(texts), target)
        if rounding:
            # at most the type's precision of digits was parsed (leading zeros aside): the
            # value is the text's, nothing wraps (a 42-digit text could, in Arrow's parser)
            return parsed
        # the value written back is the text: nothing cut, padded or rounded on the way (Arrow
        # writes some small values as 1E-7, and zero at a scale of 7 or more as 0E-7: those
        # are compared with PostgreSQL's zero, else left unsettled)
        zero = "0" if target.scale == 0 else "0." + "0" * target.scale
        back = pc.cast(parsed, pa.string())
        canonical = pc.or_(
            pc.equal(back, texts),
            pc.and_(pc.equal(parsed, pa.scalar(0, target)), pc.equal(texts, zero)),
        )
        return pc.if_else(pc.fill_null(canonical, False), parsed, pa.scalar(None, target))

    return cast


def _without_trailing_zeros(texts: pa.Array) -> pa.Array:
    """``1.500`` -> ``1.5``, ``2.000`` -> ``2``; a text without a point as it is."""
    stripped = pc.replace_substring_regex(texts, r"\.?0+$", "")
    has_point = pc.fill_null(pc.match_substring(texts, "."), False)
    return pc.if_else(has_point, stripped, texts)


def _bytea(texts: pa.Array) -> pa.Array:
    valid = pc.fill_null(pc.match_substring_regex(texts, r"^\\x([0-9a-fA-F]{2})*$"), False)
    out = [
        bytes.fromhex(text[2:]) if ok else None
        for text, ok in zip(texts.to_pylist(), valid.to_pylist(), strict=True)
    ]
    return pa.array(out, pa.binary())


_WRITTEN = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}( [0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{0,5}[1-9])?)?$"
"""A date or timestamp as PostgreSQL writes it: its fields at their places, no trailing zero
in a fraction of a second."""


def _written_back(values: pa.Array, texts: pa.Array) -> pa.Array:
    """Whether each of ``texts`` is what PostgreSQL writes for the date or timestamp parsed from
    it (``values``): written as it writes them (:data:`_WRITTEN`) with each field that value's.
    Compared field by field: formatting 4M timestamps back to text took 4 s."""

    def field(start: int, stop: int) -> pa.Array:
        return pc.cast(pc.utf8_slice_codeunits(texts, start, stop), pa.int64())

    same = pc.match_substring_regex(texts, _WRITTEN)
    parts = [(pc.year, 0, 4), (pc.month, 5, 7), (pc.day, 8, 10)]
    if pa.types.is_timestamp(values.type):
        parts += [(pc.hour, 11, 13), (pc.minute, 14, 16), (pc.second, 17, 19)]
    texts = _where(same, texts)
    for part, start, stop in parts:
        same = pc.and_(same, pc.equal(part(values), field(start, stop)))
    if pa.types.is_timestamp(values.type):
        digits = pc.utf8_rpad(pc.utf8_slice_codeunits(texts, 20, 26), 6, "0")
        micros = pc.add(pc.multiply(pc.millisecond(values), 1000), pc.microsecond(values))
        same = pc.and_(same, pc.equal(micros, pc.cast(digits, pa.int64())))
    return pc.fill_null(same, False)


def _timestamp(target: pa.DataType, suffix: str | None) -> ArrowPlain:
    def cast(texts: pa.Array) -> pa.Array:
        local = texts
        if suffix is not None:
            ends = pc.fill_null(pc.ends_with(texts, suffix), False)
            local = _where(ends, pc.utf8_slice_codeunits(texts, 0, -len(suffix)))
        candidates = _where(pc.match_substring_regex(local, _TIMESTAMP), local)
        parsed = _cast(candidates, pa.timestamp("us"))
        if parsed is None:
            return _nulls(len(texts), target)
        same = _written_back(parsed, local)
        typed = parsed if suffix is None else pc.assume_timezone(parsed, "UTC")
        return pc.if_else(same, typed.cast(target), pa.scalar(None, target))

    return cast


def _date(texts: pa.Array) -> pa.Array:
    candidates = _where(pc.match_substring_regex(texts, _DATE), texts)
    parsed = _cast(candidates, pa.date32())
    if parsed is None:
        return _nulls(len(texts), pa.date32())
    same = _written_back(parsed, texts)
    return pc.if_else(same, parsed, pa.scalar(None, pa.date32()))


def arrow_plain(t: PgType) -> ArrowPlain | None:
    """``t``'s plain cast over Arrow, or None when only Spark casts it (see the module)."""
    if t.target or element_type(t) is not None:
        return None
    oid = base_oid(t)
    if oid not in CASTS:
        return _text
    target = arrow_type(t)
    if oid == BOOL:
        return _bool
    if oid in (INT2, INT4, INT8, OID):
        return _integer(target)
    if oid in (FLOAT4, FLOAT8):
        return _float(target)
    if oid == NUMERIC:
        if not isinstance(spark_type(t), DecimalType):
            return None
        return _decimal(target, _rounds(t))
    if oid == BYTEA:
        return _bytea
    if oid == DATE:
        return _date
    if oid == TIMESTAMP:
        return _timestamp(target, None)
    if oid == TIMESTAMPTZ:
        return _timestamp(target, _UTC)
    return None


def plain_cast_arrow(
    values: pa.Array, columns: Sequence[tuple[str, PgType]]
) -> tuple[list[pa.Array], np.ndarray] | None:
    """``values`` (``list<string>``, one per row, in the table's column order) -> one typed
    array per column and, per row, whether the row is unsettled (a value not settled, fewer
    values than columns, or no values). None when a column has no plain cast here."""
    casts = [arrow_plain(t) for _, t in columns]
    if any(c is None for c in casts):
        return None
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    rows = len(values)
    unsettled = ~pc.fill_null(pc.is_valid(values), False).to_numpy(zero_copy_only=False)
    sizes = pc.fill_null(pc.list_value_length(values), 0).to_numpy(zero_copy_only=False)
    unsettled |= sizes < len(columns)
    if rows and unsettled.any():  # rows short of values are unsettled: read none of theirs
        values = pc.if_else(pa.array(~unsettled), values, pa.scalar(None, values.type))
    typed: list[pa.Array] = []
    for position, ((_, t), cast) in enumerate(zip(columns, casts, strict=True)):
        texts = pc.list_element(values, position) if rows else pa.array([], pa.string())
        texts = texts.cast(pa.string())
        value = cast(texts)
        failed = pc.and_(pc.is_valid(texts), pc.is_null(value))
        unsettled |= pc.fill_null(failed, False).to_numpy(zero_copy_only=False)
        typed.append(value.cast(arrow_type(t)))
    return typed, unsettled
