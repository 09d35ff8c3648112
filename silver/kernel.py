r"""The cast of every type over Arrow: PostgreSQL's text of a value -> its typed value, or a
definite error with its message.

One kernel per column type (:func:`kernel`), a function from an Arrow ``string`` array (NULL =
SQL NULL) to a :class:`Cast`: the typed values (in the Arrow type of the column's Spark type,
:func:`arrow_type`), an error message per value that does not cast (NULL where none; a NULL
text is NULL, never an error), and which values a declared rule adjusted (rounded, clamped,
nulled). It runs in the driver and on Spark's executors alike (plain Python and pyarrow, no
JVM). Capture sessions pin ``DateStyle=ISO``, ``IntervalStyle=postgres``, ``TimeZone=UTC``,
``extra_float_digits=3`` and ``bytea_output=hex`` (see :mod:`capture.connection`), so each type
has exactly one text form, and every cast here is a strict parse of that form.

Each kernel has two parts that always agree:

- a *fast* part over Arrow compute kernels, which settles the texts that are a value's own
  canonical form (what PostgreSQL writes): integers and decimals whose value written back is
  the text, floats, ISO dates and timestamps, ``t``/``f``, hex bytea, text as it is;
- a *per-value* part in Python (:func:`value_cast`), which decides every other text: its value
  (rounded, clamped or nulled where a column's policy says so) or its error. It is the
  reference: a text the fast part settles gets the same value from it.

Errors carry the messages the Spark SQL casts they replace gave (``tests/spark_sql_casts.py``, the
differential tests' reference), e.g. ``numeric NaN does not fit DecimalType(12,2)``. Nothing is
rounded, clamped or nulled silently: such values are counted by silver (``_adjustments``), and a
value Spark's type cannot hold exactly is an error.

The mapping of PostgreSQL types to Spark types is :mod:`silver.pgtypes`'s.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Context, Decimal, InvalidOperation
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pgmedallion.silver.pgtypes import (
    BOOL,
    BYTEA,
    DATE,
    DEFAULT_INFINITY,
    FLOAT4,
    FLOAT8,
    FLOAT_TYPES,
    INT2,
    INT4,
    INT8,
    INTEGER_TYPES,
    INTERVAL,
    MAX_DECIMAL_PRECISION,
    NON_COMMA_DELIMITED,
    NUMERIC,
    OID,
    TIMESTAMP,
    TIMESTAMP_TYPE,
    TIMESTAMPTZ,
    TIMESTAMPTZ_TYPE,
    PgType,
    arrow_type,
    base_oid,
    element_type,
    type_modifier,
)

Value = tuple[Any, str | None]
"""A value and its error (None: none); the value is None where there is an error."""
ValueCast = Callable[[str], Value]
"""One non-NULL text -> :data:`Value`."""


@dataclass(frozen=True)
class Cast:
    """A column's texts cast: ``values`` (NULL for NULL texts, errors and nulled values),
    ``errors`` (a message where the text does not cast, else NULL) and ``adjusted`` (whether a
    declared rule changed the value; None for a column with no such rule)."""

    values: pa.Array
    errors: pa.Array
    adjusted: pa.Array | None = None

    def failed(self) -> np.ndarray:
        return pc.is_valid(self.errors).to_numpy(zero_copy_only=False)


_LABELS = {
    pa.int16(): "ShortType",
    pa.int32(): "IntegerType",
    pa.int64(): "LongType",
    pa.float32(): "FloatType",
    pa.float64(): "DoubleType",
    pa.date32(): "DateType",
    TIMESTAMP_TYPE: "TimestampNTZType",
    TIMESTAMPTZ_TYPE: "TimestampType",
}


def type_label(target: pa.DataType) -> str:
    """``DecimalType(12,2)``, ``DateType``: the type as error messages name it (Spark's name)."""
    if pa.types.is_decimal(target):
        return f"DecimalType({target.precision},{target.scale})"
    return _LABELS[target]


# --- one value at a time (the reference) -------------------------------------------------------

_INT = re.compile(r"-?[0-9]+")
_FLOAT = re.compile(r"(-?([0-9]+(\.[0-9]*)?|\.[0-9]+)(e[+-]?[0-9]+)?|NaN|-?Infinity)")
_NUMERIC = re.compile(r"-?[0-9]+(\.[0-9]+)?")
_HEX = re.compile(r"\\x[0-9a-fA-F]*")
_DATE_TEXT = r"([0-9]{4})-([0-9]{2})-([0-9]{2})"
_TIME_TEXT = r" ([0-9]{2}):([0-9]{2}):([0-9]{2})(?:\.([0-9]{1,6}))?"
_OFFSET_TEXT = r"([+-])([0-9]{2})(?::([0-9]{2}))?(?::([0-9]{2}))?"
_DATE_RE = re.compile(_DATE_TEXT)
_TIMESTAMP_RE = re.compile(_DATE_TEXT + _TIME_TEXT)
_TIMESTAMPTZ_RE = re.compile(_DATE_TEXT + _TIME_TEXT + _OFFSET_TEXT)
_INTERVAL = re.compile(
    r"(?:([+-]?[0-9]{1,10}) years? ?)?(?:([+-]?[0-9]{1,10}) mons? ?)?"
    r"(?:([+-]?[0-9]{1,10}) days? ?)?"
    r"(?:([+-]?)([0-9]{1,10}):([0-9]{2}):([0-9]{2})(?:\.([0-9]{1,6}))?)?"
)
_INFINITE = ("infinity", "-infinity")
_RANGES = {
    pa.int16(): (-(2**15), 2**15 - 1),
    pa.int32(): (-(2**31), 2**31 - 1),
    pa.int64(): (-(2**63), 2**63 - 1),
}
_INT32 = (-(2**31), 2**31 - 1)
_INT64 = (-(2**63), 2**63 - 1)


def _bool_value(text: str) -> Value:
    if text == "t":
        return True, None
    if text == "f":
        return False, None
    return None, "invalid boolean text"


def _integer_value(target: pa.DataType) -> ValueCast:
    low, high = _RANGES[target]
    out_of_range = f"integer out of range for {type_label(target)}"

    def cast(text: str) -> Value:
        if not _INT.fullmatch(text):
            return None, "invalid integer text"
        value = int(text)
        if not low <= value <= high:
            return None, out_of_range
        return value, None

    return cast


def _float_value(target: pa.DataType) -> ValueCast:
    arrow = target
    out_of_range = f"floating-point value out of range for {type_label(target)}"

    def cast(text: str) -> Value:
        if not _FLOAT.fullmatch(text):
            return None, "invalid floating-point text"
        if text in _SPECIAL_FLOATS:
            return _SPECIAL_FLOATS[text], None
        # Arrow parses to the target's width directly (correctly rounded, as Java's parser):
        # a float4 read through a double could round twice. ``1.`` and ``.5`` as ``1.0``, ``0.5``
        digits = _BARE_POINT.sub(r"\g<1>0.", _POINT_BEFORE_EXPONENT.sub(r".0\1", text))
        value = pc.cast(pa.array([digits]), arrow)[0].as_py()
        if value in (float("inf"), float("-inf")):
            return None, out_of_range
        return value, None

    return cast


_SPECIAL_FLOATS = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}
_BARE_POINT = re.compile(r"^(-?)\.")
_POINT_BEFORE_EXPONENT = re.compile(r"\.(e|$)")


def _significant_decimals(text: str) -> int:
    point = text.find(".")
    return 0 if point < 0 else len(text[point + 1 :].rstrip("0"))


_DECIMALS = Context(prec=2 * MAX_DECIMAL_PRECISION + 2, rounding=ROUND_HALF_UP)
"""Room for any value the checks let through (at most 38 integer digits, rounded to at most
38 decimals), rounded half up as Spark's cast rounds."""


def _numeric_value(target: pa.Decimal128Type, rounding: bool) -> ValueCast:
    label = type_label(target)
    whole_digits = target.precision - target.scale
    quantum = Decimal(1).scaleb(-target.scale)
    limit = Decimal(10) ** whole_digits

    def cast(text: str) -> Value:
        if text in ("NaN", "Infinity", "-Infinity"):
            return None, f"numeric {text} does not fit {label}"
        if not _NUMERIC.fullmatch(text):
            return None, "invalid numeric text"
        whole = text.lstrip("-").split(".")[0].lstrip("0")
        fits = len(whole) <= whole_digits
        if not rounding:
            fits = fits and _significant_decimals(text) <= target.scale
        if fits:
            try:
                value = Decimal(text).quantize(quantum, context=_DECIMALS)
            except InvalidOperation:
                value = None
            if value is not None and abs(value) < limit:
                return value, None
        return None, f"numeric value does not fit {label}"

    return cast


def _rounds(t: PgType) -> bool:
    """Whether a numeric column's values may hold more decimals than its Spark type: an
    unconstrained numeric, a scale above 38, or an override. Those are rounded half up and
    counted; a constrained numeric's values always fit exactly."""
    if t.target:
        return True
    typmod = type_modifier(t)
    if typmod < 4:
        return True
    return (((typmod - 4) & 0x7FF) ^ 0x400) - 0x400 > MAX_DECIMAL_PRECISION


def _bytea_value(text: str) -> Value:
    if _HEX.fullmatch(text) and len(text) % 2 == 0:
        return bytes.fromhex(text[2:]), None
    return None, "invalid bytea text (expected \\x hex)"


_EXTREMES = {
    "date": (dt.date(9999, 12, 31), dt.date(1, 1, 1)),
    "timestamp": (dt.datetime(9999, 12, 31, 23, 59, 59, 999999), dt.datetime(1, 1, 1)),
    "timestamptz": (
        dt.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=dt.UTC),
        dt.datetime(1, 1, 1, tzinfo=dt.UTC),
    ),
}
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def _parse_datetime(label: str, match: re.Match) -> Any:
    """The value of a text matching the label's pattern, or None (a field out of range, or an
    instant outside years 1 to 9999 once its offset is applied)."""
    year, month, day = (int(g) for g in match.groups()[:3])
    try:
        if label == "date":
            return dt.date(year, month, day)
        hour, minute, second = (int(g) for g in match.groups()[3:6])
        micros = int((match.group(7) or "").ljust(6, "0"))
        value = dt.datetime(year, month, day, hour, minute, second, micros)
        if label == "timestamp":
            return value
        sign, oh, om, os_ = match.groups()[7:]
        offset = dt.timedelta(hours=int(oh), minutes=int(om or 0), seconds=int(os_ or 0))
        offset = -offset if sign == "-" else offset
        if int(om or 0) > 59 or int(os_ or 0) > 59 or abs(offset) > dt.timedelta(hours=18):
            return None  # (Java's ZoneOffset: at most 18 hours)
        return (value - offset).replace(tzinfo=dt.UTC)
    except (ValueError, OverflowError):
        return None


_DATETIME = {
    DATE: ("date", _DATE_RE),
    TIMESTAMP: ("timestamp", _TIMESTAMP_RE),
    TIMESTAMPTZ: ("timestamptz", _TIMESTAMPTZ_RE),
}


def _infinity(t: PgType) -> str:
    return t.infinity or DEFAULT_INFINITY


def _datetime_value(oid: int, target: pa.DataType, policy: str) -> ValueCast:
    """Dates and timestamps: the ISO form with a four-digit year, or a definite error;
    ``policy`` says what ``±infinity`` become (``pgtypes.INFINITY_POLICIES``)."""
    label, pattern = _DATETIME[oid]
    spark_range = f"outside {type_label(target)}'s range (years 1 to 9999)"
    largest, smallest = _EXTREMES[label]
    after_9999 = re.compile(r"[0-9]{5,}-")

    def cast(text: str) -> Value:
        if text in _INFINITE:
            if policy == "null":
                return None, None
            if policy == "clamp":
                return (largest if text == "infinity" else smallest), None
            return None, f"{label} {text} is {spark_range}"
        if text.endswith(" BC"):
            return None, f"{label} BC is {spark_range}"
        if after_9999.match(text):
            return None, f"{label} after year 9999 is {spark_range}"
        match = pattern.fullmatch(text)
        if match is None:
            return None, f"invalid {label} text"
        value = _parse_datetime(label, match)
        if value is None:
            return None, f"invalid {label}"
        return value, None

    return cast


def _interval_value(text: str) -> Value:
    """``[N year[s]] [N mon[s]] [N day[s]] [[+-]H:MM:SS[.ffffff]]`` into PostgreSQL's fields
    (months, days, microseconds); each part carries its own sign (``-1 days +02:00:00``)."""
    if text in _INFINITE:
        return None, f"interval {text} has no Spark representation"
    match = _INTERVAL.fullmatch(text)
    if match is None or text == "":
        return None, "invalid interval text"
    years, mons, days, sign, hours, minutes, seconds, fraction = match.groups()
    months = int(years or 0) * 12 + int(mons or 0)
    day_count = int(days or 0)
    micros = 0
    if hours is not None:
        micros = int(hours) * 3_600_000_000 + int(minutes) * 60_000_000
        micros += int(seconds) * 1_000_000 + int((fraction or "").ljust(6, "0"))
        micros = -micros if sign == "-" else micros
    fits = _INT32[0] <= months <= _INT32[1] and _INT32[0] <= day_count <= _INT32[1]
    # each part is checked as Spark's cast computes it: years and months as int, the clock's
    # parts as bigint
    parts = [int(years or 0), int(mons or 0), int(years or 0) * 12]
    if hours is not None:
        parts += [int(hours) * 3_600_000_000, micros]
    fits = fits and all(_INT32[0] <= p <= _INT32[1] for p in parts[:3])
    fits = fits and all(_INT64[0] <= p <= _INT64[1] for p in parts[3:])
    if not fits:
        return None, "interval out of range"
    return {"months": months, "days": day_count, "microseconds": micros}, None


def _text_value(text: str) -> Value:
    return text, None


_ESCAPED_BACKSLASH = "\u0000b"
_ESCAPED_QUOTE = "\u0000q"
_ARRAY_TOKEN = re.compile(r'"[^"]*"|[^,"{}]+')


def _array_value(element: ValueCast) -> ValueCast:
    """A one-dimensional array literal, each element cast; element errors name the element's
    position (``element 2: invalid integer text``)."""

    def cast(text: str) -> Value:
        inner = text[1:-1]
        escaped = inner.replace("\\\\", _ESCAPED_BACKSLASH).replace('\\"', _ESCAPED_QUOTE)
        tokens = _ARRAY_TOKEN.findall(escaped)
        well_formed = (
            text.startswith("{")
            and text.endswith("}")
            and "\u0000" not in text
            and "\\" not in escaped
            and ",".join(tokens) == escaped
        )
        values, failures = [], []
        for index, token in enumerate(tokens, 1):
            if token.startswith('"'):
                raw = token[1:-1].replace(_ESCAPED_QUOTE, '"').replace(_ESCAPED_BACKSLASH, "\\")
            elif token.upper() == "NULL":
                values.append(None)
                continue
            else:
                raw = token
            value, error = element(raw)
            values.append(value)
            if error is not None:
                failures.append(f"element {index}: {error}")
        if text.startswith("{{"):
            return None, "multi-dimensional arrays are not supported"
        if text.startswith("["):
            return None, "arrays with a lower bound other than 1 are not supported"
        if not well_formed:
            return None, "invalid array literal"
        if failures:
            more = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
            return None, failures[0] + more
        return values, None

    return cast


def _sub_arrays(text: str) -> list[str] | None:
    """The top-level parts of array literal ``text`` (``{{1,2},{3}}``: ``{1,2}`` and ``{3}``),
    quotes and backslash escapes respected; None when its braces or quotes do not close."""
    if not (text.startswith("{") and text.endswith("}")):
        return None
    parts, depth, start, quoted, i, end = [], 0, 1, False, 1, len(text) - 1
    while i < end:
        c = text[i]
        if quoted:
            if c == "\\":
                i += 1
            elif c == '"':
                quoted = False
        elif c == '"':
            quoted = True
        elif c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth < 0:
                return None
        elif c == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
        i += 1
    if quoted or depth != 0 or i != end:
        return None
    parts.append(text[start:end])
    return parts


def _nested_array_value(one: ValueCast, dims: int) -> ValueCast:
    """An array literal of a column declared with ``dims`` > 1 dimensions, as nested lists;
    ``one``: the cast of a one-dimensional literal (the innermost arrays). ``{}`` is the
    empty array at any dimensions; a value of other dimensions is an error (PostgreSQL does
    not hold a column to its declared dimensions, a Spark type is)."""

    def cast(text: str, level: int = 1) -> Value:
        if text.startswith("["):
            return None, "arrays with a lower bound other than 1 are not supported"
        if level == 1 and text == "{}":
            return [], None
        found = len(text) - len(text.lstrip("{"))  # this part's dimensions
        if found != dims - level + 1:
            if _sub_arrays(text) is None:
                return None, "invalid array literal"
            total = found + level - 1
            return None, f"a {total}-dimensional array in a column of {dims} dimensions"
        if level == dims:
            return one(text)
        parts = _sub_arrays(text)
        if parts is None:
            return None, "invalid array literal"
        values, width = [], None
        for index, part in enumerate(parts, 1):
            value, error = cast(part, level + 1)
            if error is not None:
                if error.startswith("element "):
                    return None, f"element {index},{error[len('element ') :]}"
                return None, error
            if width is not None and len(value) != width:
                return None, "invalid array literal"  # not rectangular
            width = len(value)
            values.append(value)
        return values, None

    return cast


def value_cast(t: PgType) -> ValueCast:
    """``t``'s cast of one non-NULL text (the reference the fast part agrees with)."""
    target = arrow_type(t)
    if t.target:
        return _override_value(target)
    element = element_type(t)
    if element is not None:
        if base_oid(element) in NON_COMMA_DELIMITED:
            return _text_value
        one = _array_value(value_cast(element))
        return one if t.dims <= 1 else _nested_array_value(one, t.dims)
    oid = base_oid(t)
    if oid == BOOL:
        return _bool_value
    if oid in (INT2, INT4, INT8, OID):
        return _integer_value(target)
    if oid in (FLOAT4, FLOAT8):
        return _float_value(target)
    if oid == NUMERIC:
        return _numeric_value(target, rounding=_rounds(t))
    if oid == BYTEA:
        return _bytea_value
    if oid in _DATETIME:
        return _datetime_value(oid, target, _infinity(t))
    if oid == INTERVAL:
        return _interval_value
    return _text_value


def _override_value(target: pa.DataType) -> ValueCast:
    """A column whose configuration overrides its type: cast by the target type."""
    if pa.types.is_decimal(target):
        return _numeric_value(target, rounding=True)
    if target in FLOAT_TYPES:
        return _float_value(target)
    if target in INTEGER_TYPES:
        return _integer_value(target)
    return _text_value


# --- declared adjustments -----------------------------------------------------------------------


def adjustment(t: PgType) -> tuple[str, Callable[[pa.Array], pa.Array]] | None:
    """``(code, test)`` for a column whose values a declared rule may change rather than keep
    exactly: ``Rounded`` (more decimals than the column's Spark decimal, see :func:`_rounds`),
    ``Clamped`` or ``Nulled`` (``±infinity`` in a date or timestamp). ``test(texts)`` is
    whether each text's value is adjusted. None for any other column."""
    if element_type(t) is not None and not t.target:
        return None
    target = arrow_type(t)
    oid = base_oid(t)
    if pa.types.is_decimal(target) and oid == NUMERIC and _rounds(t):
        scale = target.scale

        def rounded(texts: pa.Array) -> pa.Array:
            decimals = pc.utf8_length(
                pc.replace_substring_regex(
                    pc.replace_substring_regex(texts, r"^[^.]*\.?", ""), r"0+$", ""
                )
            )
            return pc.greater(decimals, scale)

        return "Rounded", rounded
    if not t.target and oid in _DATETIME:
        policy = _infinity(t)
        if policy != "error":
            code = "Clamped" if policy == "clamp" else "Nulled"
            return code, lambda texts: pc.is_in(texts, pa.array(_INFINITE))
    return None


# --- the fast part over Arrow -------------------------------------------------------------------

Fast = Callable[[pa.Array], pa.Array]
"""Texts -> typed values, NULL where a non-NULL text is left to the per-value part."""

_FAST_INT = r"^-?[0-9]{1,19}$"
_FAST_FLOAT = r"^-?([0-9]+(\.[0-9]*)?|\.[0-9]+)(e[+-]?[0-9]+)?$"
_FAST_DECIMAL = r"^-?[0-9]+(\.[0-9]+)?$"
_US = pa.timestamp("us")
_UTC = "+00"


def _where(mask: pa.Array, texts: pa.Array) -> pa.Array:
    """``texts`` where ``mask`` holds, NULL elsewhere."""
    return pc.if_else(pc.fill_null(mask, False), texts, pa.scalar(None, texts.type))


def _arrow_cast(texts: pa.Array, target: pa.DataType) -> pa.Array:
    """Arrow's cast; where it refuses some value, each value alone (NULL for those refused)."""
    try:
        return pc.cast(texts, target)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        pass
    out = []
    for text in texts:
        try:
            out.append(pc.cast(text, target).as_py())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OverflowError, ValueError):
            out.append(None)  # (OverflowError: a date Python cannot hold, such as year 0)
    return pa.array(out, target)


def _fast_text(texts: pa.Array) -> pa.Array:
    return texts


def _fast_bool(texts: pa.Array) -> pa.Array:
    true, false = pc.equal(texts, "t"), pc.equal(texts, "f")
    return pc.if_else(true, True, pc.if_else(false, False, pa.scalar(None, pa.bool_())))


def _fast_integer(target: pa.DataType) -> Fast:
    info = np.iinfo(target.to_pandas_dtype())

    def cast(texts: pa.Array) -> pa.Array:
        wide = _arrow_cast(_where(pc.match_substring_regex(texts, _FAST_INT), texts), pa.int64())
        fits = pc.and_(pc.greater_equal(wide, info.min), pc.less_equal(wide, info.max))
        canonical = pc.equal(pc.cast(wide, pa.string()), texts)
        ok = pc.fill_null(pc.and_(fits, canonical), False)
        return pc.cast(pc.if_else(ok, wide, pa.scalar(None, pa.int64())), target)

    return cast


def _fast_float(target: pa.DataType) -> Fast:
    special = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}

    def cast(texts: pa.Array) -> pa.Array:
        parsed = _arrow_cast(_where(pc.match_substring_regex(texts, _FAST_FLOAT), texts), target)
        finite = pc.fill_null(pc.is_finite(parsed), False)
        out = pc.if_else(finite, parsed, pa.scalar(None, target))
        for text, value in special.items():
            out = pc.if_else(
                pc.fill_null(pc.equal(texts, text), False), pa.scalar(value, target), out
            )
        return out

    return cast


def _without_trailing_zeros(texts: pa.Array) -> pa.Array:
    """``1.500`` -> ``1.5``, ``2.000`` -> ``2``; a text without a point as it is."""
    stripped = pc.replace_substring_regex(texts, r"\.?0+$", "")
    has_point = pc.fill_null(pc.match_substring(texts, "."), False)
    return pc.if_else(has_point, stripped, texts)


def _fast_decimal(target: pa.DataType, rounding: bool) -> Fast:
    whole_digits = target.precision - target.scale

    def cast(texts: pa.Array) -> pa.Array:
        valid = pc.match_substring_regex(texts, _FAST_DECIMAL)
        # a numeric silver may round is read by its significant decimals: trailing zeros
        # change no value (0.25000000000000000000 is 0.25 in decimal(38,18)); a text with
        # more decimals than the scale is left to the per-value part, which rounds it
        digits = _without_trailing_zeros(texts) if rounding else texts
        whole = pc.utf8_length(pc.extract_regex(digits, r"^-?0*(?P<w>[0-9]*)").field("w"))
        point = pc.find_substring(digits, ".")
        decimals = pc.if_else(
            pc.equal(point, -1), 0, pc.subtract(pc.subtract(pc.utf8_length(digits), point), 1)
        )
        fits = pc.and_(pc.less_equal(whole, whole_digits), pc.less_equal(decimals, target.scale))
        # at most the type's digits on either side of the point: Arrow's parse is the text's
        # value, nothing cut, rounded or wrapped (a 42-digit text could wrap in its parser)
        return _arrow_cast(_where(pc.and_(valid, fits), digits), target)

    return cast


def _fast_bytea(texts: pa.Array) -> pa.Array:
    valid = pc.fill_null(pc.match_substring_regex(texts, r"^\\x([0-9a-fA-F]{2})*$"), False)
    out = [
        bytes.fromhex(text[2:]) if ok else None
        for text, ok in zip(texts.to_pylist(), valid.to_pylist(), strict=True)
    ]
    return pa.array(out, pa.binary())


_WRITTEN_DATE = r"^(000[1-9]|00[1-9][0-9]|0[1-9][0-9]{2}|[1-9][0-9]{3})-[0-9]{2}-[0-9]{2}"
_WRITTEN = {
    False: _WRITTEN_DATE + "$",
    True: _WRITTEN_DATE + r" [0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{0,5}[1-9])?$",
}
"""A date or a timestamp as PostgreSQL writes it: its fields at their places, a year from 1 to
9999 (year 0 is no year: PostgreSQL writes 1 BC), no trailing zero in a fraction of a
second."""


def _fast_timestamp(target: pa.DataType, suffix: str | None) -> Fast:
    def cast(texts: pa.Array) -> pa.Array:
        local = texts
        if suffix is not None:
            ends = pc.fill_null(pc.ends_with(texts, suffix), False)
            local = _where(ends, pc.utf8_slice_codeunits(texts, 0, -len(suffix)))
        # a text as PostgreSQL writes it, and Arrow's parser refuses every field out of its
        # range (a 13th month, February 30th, 24:00, a leap second): the value is the text's
        parsed = _arrow_cast(_where(pc.match_substring_regex(local, _WRITTEN[True]), local), _US)
        typed = parsed if suffix is None else pc.assume_timezone(parsed, "UTC")
        return typed.cast(target)

    return cast


def _fast_date(texts: pa.Array) -> pa.Array:
    return _arrow_cast(_where(pc.match_substring_regex(texts, _WRITTEN[False]), texts), pa.date32())


def _fast(t: PgType, target: pa.DataType) -> Fast | None:
    """``t``'s fast part, or None where every value goes through the per-value part."""
    if t.target:
        if pa.types.is_decimal(target):
            return _fast_decimal(target, rounding=True)
        if target in FLOAT_TYPES:
            return _fast_float(target)
        if target in INTEGER_TYPES:
            return _fast_integer(target)
        return _fast_text
    element = element_type(t)
    if element is not None:
        return _fast_text if base_oid(element) in NON_COMMA_DELIMITED else None
    oid = base_oid(t)
    if oid == BOOL:
        return _fast_bool
    if oid in (INT2, INT4, INT8, OID):
        return _fast_integer(target)
    if oid in (FLOAT4, FLOAT8):
        return _fast_float(target)
    if oid == NUMERIC:
        return _fast_decimal(target, _rounds(t))
    if oid == BYTEA:
        return _fast_bytea
    if oid == DATE:
        return _fast_date
    if oid == TIMESTAMP:
        return _fast_timestamp(target, None)
    if oid == TIMESTAMPTZ:
        return _fast_timestamp(target, _UTC)
    if oid == INTERVAL:
        return None
    return _fast_text


# --- the kernel ---------------------------------------------------------------------------------

Kernel = Callable[[pa.Array], Cast]


def kernel(t: PgType) -> Kernel:
    """The cast of a column of type ``t``: texts (``string``, NULL = SQL NULL) -> :class:`Cast`."""
    target = arrow_type(t)
    fast = _fast(t, target)
    slow = value_cast(t)
    rule = adjustment(t)

    def cast(texts: pa.Array) -> Cast:
        if isinstance(texts, pa.ChunkedArray):
            texts = texts.combine_chunks()
        texts = texts.cast(pa.string())
        n = len(texts)
        adjusted = None if rule is None else pc.fill_null(rule[1](texts), False)
        if fast is not None:
            values = fast(texts).cast(target)
            left = pc.and_(pc.is_valid(texts), pc.is_null(values))
            left = pc.fill_null(left, False).to_numpy(zero_copy_only=False)
        else:
            values = pa.nulls(n, target)
            left = pc.is_valid(texts).to_numpy(zero_copy_only=False)
        positions = np.flatnonzero(left)
        if len(positions) == 0:
            return Cast(values, pa.nulls(n, pa.string()), adjusted)
        if adjusted is not None:  # a text that does not cast is not adjusted: it fails
            adjusted = adjusted.to_numpy(zero_copy_only=False).copy()
        decided = [slow(text) for text in texts.take(pa.array(positions)).to_pylist()]
        errors: list[str | None] = [None] * n
        for position, (_, error) in zip(positions.tolist(), decided, strict=True):
            errors[position] = error
            if error is not None and adjusted is not None:
                adjusted[position] = False
        if adjusted is not None:
            adjusted = pa.array(adjusted, pa.bool_())
        if fast is None:
            full: list[Any] = [None] * n
            for position, (value, _) in zip(positions.tolist(), decided, strict=True):
                full[position] = value
            values = pa.array(full, target)
        else:
            mask = np.zeros(n, bool)
            mask[positions] = True
            replacement = np.zeros(n, np.int64)
            replacement[positions] = np.arange(len(positions))
            slow_values = pa.array([v for v, _ in decided], target)
            values = pc.if_else(pa.array(mask), pc.take(slow_values, pa.array(replacement)), values)
        return Cast(values, pa.array(errors, pa.string()), adjusted)

    return cast


def cast_texts(t: PgType, texts: pa.Array) -> Cast:
    """``kernel(t)(texts)``."""
    return kernel(t)(texts)


# --- a table's rows ------------------------------------------------------------------------------


@dataclass
class Rows:
    """A table's rows cast: one typed array per column, and per row whether it failed (a
    value that does not cast, or fewer values than columns: the row is an error, not a diff)."""

    columns: list[pa.Array]
    failed: np.ndarray
    errors: list[tuple[int, str, str | None, str]]
    """``(row, column, raw, message)`` for each failed value, rows in order, columns in the
    table's order."""
    adjusted: list[tuple[str, str, np.ndarray, pa.Array]]
    """``(column, code, mask, texts)`` for each column a declared rule adjusted in some row."""

    def adjustments(self, lsns: pa.Array | np.ndarray) -> list[tuple]:
        """``(column, code, count, first_lsn, sample)`` per adjusted column, among the rows
        that did not fail (``lsns``: each row's LSN); ``sample``: the least and the greatest
        adjusted text, as JSON (as ``_adjustments`` holds them)."""
        if isinstance(lsns, (pa.Array, pa.ChunkedArray)):
            lsns = lsns.to_numpy(zero_copy_only=False)
        lsns = np.asarray(lsns)
        out = []
        for name, code, mask, texts in self.adjusted:
            hit = mask & ~self.failed
            if not hit.any():
                continue
            picked = texts.filter(pa.array(hit))
            least, greatest = pc.min_max(picked).values()
            sample = list(dict.fromkeys([least.as_py(), greatest.as_py()]))
            out.append((name, code, int(hit.sum()), int(lsns[hit].min()), json.dumps(sample)))
        return out


def _padded(values: pa.Array, short: np.ndarray, width: int) -> pa.Array:
    """``values`` with each ``short`` row's list padded with NULLs to ``width`` (a NULL list:
    ``width`` NULLs)."""
    rows = values.to_pylist()
    for i in np.flatnonzero(short).tolist():
        have = rows[i] or []
        rows[i] = have + [None] * (width - len(have))
    return pa.array(rows, pa.list_(pa.string()))


def cast_rows(values: pa.Array, columns: list[tuple[str, PgType]]) -> Rows:
    """``values`` (``list<string>``, one per row, in the table's column order) cast by each
    column's :func:`kernel`. A row whose values are NULL or fewer than the columns fails with
    ``no value at position p`` for each missing one (its other values are cast, and fail or
    not as any other)."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    n = len(values)
    sizes = pc.fill_null(pc.list_value_length(values), -1).to_numpy(zero_copy_only=False)
    short = sizes < len(columns)
    if n and short.any():  # a short row's values padded with NULLs (its missing ones fail)
        values = _padded(values, short, len(columns))
    found: list[tuple[int, int, str | None, str]] = []
    for position in np.flatnonzero(short).tolist():
        have = max(int(sizes[position]), 0)
        found += [
            (position, p, None, f"no value at position {p}") for p in range(have, len(columns))
        ]
    texts = [
        pc.list_element(values, p) if n else pa.array([], pa.string()) for p in range(len(columns))
    ]
    return cast_columns(texts, columns, short, found)


def cast_columns(
    texts: list[pa.Array],
    columns: list[tuple[str, PgType]],
    failed: np.ndarray | None = None,
    found: list[tuple[int, int, str | None, str]] | None = None,
) -> Rows:
    """``texts`` (one ``string`` array per column, in the table's column order, all of one
    length) cast by each column's :func:`kernel`; ``failed`` and ``found``: rows that failed
    already and their ``(row, position, raw, message)`` errors."""
    n = len(texts[0]) if texts else 0
    failed = np.zeros(n, bool) if failed is None else failed.copy()
    found = list(found or [])
    typed: list[pa.Array] = []
    adjusted = []
    for p, (name, t) in enumerate(columns):
        cast = kernel(t)(texts[p])
        typed.append(cast.values)
        bad = cast.failed()
        if bad.any():
            failed |= bad
            rows = np.flatnonzero(bad)
            raws = texts[p].take(pa.array(rows)).to_pylist()
            messages = cast.errors.take(pa.array(rows)).to_pylist()
            found += [
                (r, p, raw, m) for r, raw, m in zip(rows.tolist(), raws, messages, strict=True)
            ]
        if cast.adjusted is not None:
            mask = cast.adjusted.to_numpy(zero_copy_only=False)
            if mask.any():
                adjusted.append((name, cast_code(t), mask, texts[p]))
    found.sort(key=lambda e: (e[0], e[1]))
    names = [name for name, _ in columns]
    errors = [(row, names[p], raw, message) for row, p, raw, message in found]
    return Rows(typed, failed, errors, adjusted)


def merged_adjustments(parts: list[list[tuple]]) -> list[tuple]:
    """The :meth:`Rows.adjustments` of several parts of one table's rows, as one: counts
    summed, the least first LSN, the least and greatest sample text."""
    merged: dict[tuple[str, str], tuple] = {}
    for part in parts:
        for name, code, count, first_lsn, sample in part:
            texts = json.loads(sample)
            if (name, code) in merged:
                _, _, count0, lsn0, texts0 = merged[(name, code)]
                count, first_lsn, texts = count0 + count, min(lsn0, first_lsn), texts0 + texts
            merged[(name, code)] = (name, code, count, first_lsn, texts)
    return [
        (name, code, count, lsn, json.dumps(list(dict.fromkeys([min(t), max(t)]))))
        for name, code, count, lsn, t in merged.values()
    ]


def cast_code(t: PgType) -> str:
    """The code of ``t``'s declared adjustment (see :func:`adjustment`)."""
    rule = adjustment(t)
    assert rule is not None
    return rule[0]
