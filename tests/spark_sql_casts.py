r"""The retired Spark SQL cast, kept as the reference of the differential tests (test_kernel).

Silver casts with :mod:`silver.kernel` (Arrow kernels in the driver and in Spark's Python
workers). Until 2026-11-28 it cast with the expressions below; the kernel was held equal to
them on every text of the type zoo before they retired from the product, and the tests keep
holding it so (a new type or rule needs no entry here: PostgreSQL is the oracle).

Cast PostgreSQL text values to Spark types, as Spark SQL expressions, with an error per value.

Silver decodes bronze's COPY TEXT rows and pgoutput tuples into one ``array<string>`` per row:
each column's value as PostgreSQL's type output function wrote it (``NULL`` element = SQL NULL),
in the table's column order. This module turns that text into typed columns. Capture sessions
pin ``DateStyle=ISO``, ``IntervalStyle=postgres``, ``TimeZone=UTC``, ``extra_float_digits=3``
and ``bytea_output=hex`` (see :mod:`capture.connection`), so each type has exactly one text
form, and every cast here is a strict parse of that form.

Everything runs as Spark SQL expressions (regular expressions, ``try_cast``, ``transform``), so
it runs in the JVM, in parallel, under ANSI mode or not, and never row by row in Python. Even
PostgreSQL array literals are split in SQL: ``array_out`` escapes only ``"`` and ``\`` inside
double-quoted elements and text never contains NUL, so the two escapes are first replaced by
NUL-led placeholders, after which every element is either ``"[^"]*"`` or ``[^,"{}]+``; a
literal is valid exactly when its elements joined by commas give it back. No regular
expression here repeats a group, so nothing recurses per character in Java's regex engine
(a 20 kB value or a 100k-element array must not overflow the stack).

Speed: Spark generates code for plain expressions but evaluates lambda functions
(``transform``, ``filter``) by interpreting them, value by value. So every scalar type's value
is first computed as a plain expression (:func:`plain_value`), and the full cast below, with
its error messages, runs only for a row where some value did not cast; text arrays without
escapes take a plain path too. Casting 500k rows of seven common types went from 41-53 s to
17-18 s on the shared 2-core machine (load 5-6).

Plan size matters as much as speed: a cast needs its parsed value both for the result and for
its error check, and repeating that subtree doubles the plan at every level (a 13-type table
measured 210 kB of plan text with repeated subtrees, 47 kB without). So intermediate results
are bound once with a one-element ``transform`` (:func:`_let`), and :func:`cast_values` casts
all columns of one type together through ``transform(array(texts...), <cast>)``: the plan
holds each distinct type's cast once, and that expression is built once per process (building
one costs hundreds of calls into the JVM).

Errors
    A non-NULL text that does not give a value gives a short message (NULL text is NULL, never
    an error), e.g. ``numeric NaN does not fit DecimalType(12,2)``. Nothing is rounded, clamped
    or turned into NULL silently: a value that Spark's type cannot hold exactly is an error. As a
    last line of defence, a non-NULL text whose typed value came out NULL is an error too.
    :func:`cast_values` collects the messages of a row in ``_cast_errors``; silver writes them
    to ``_errors`` as ``CastError`` (they are definite: the same text fails every time).

The mapping of PostgreSQL types to Spark types is :mod:`silver.pgtypes`'s. Each type's casts are
one entry of the registry :data:`CASTS` (:class:`TypeCast`: its plain and its full cast).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DataType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructField,
    StructType,
)

from pgmedallion.silver.pgtypes import (
    BOOL,
    BYTEA,
    DATE,
    DEFAULT_INFINITY,
    FLOAT4,
    FLOAT8,
    INT2,
    INT4,
    INT8,
    INTERVAL,
    MAX_DECIMAL_PRECISION,
    NON_COMMA_DELIMITED,
    NUMERIC,
    OID,
    TIMESTAMP,
    TIMESTAMPTZ,
    PgType,
    base_oid,
    element_type,
    spark_type,
)

CAST_ERRORS_COLUMN = "_cast_errors"
CAST_ERROR_TYPE = ArrayType(
    StructType(
        [
            StructField("column_name", StringType()),
            StructField("raw", StringType()),
            StructField("message", StringType()),
        ]
    ),
    containsNull=False,
)


# --- casting ------------------------------------------------------------------------------------
#
# A caster takes the text as a *cheap* column (a lambda variable or a column reference) and
# returns a pair ``struct<value, error>``. Where a caster needs an intermediate result more than
# once it binds it with :func:`_let` instead of repeating the expression, so plans stay linear
# in size (a repeated subtree is re-planned and re-evaluated for every copy).

Caster = Callable[[Column], Column]

_END = r"\z"  # Java's `$` also matches before a final newline; `\z` is the very end
_INT = r"^-?[0-9]+" + _END
_FLOAT = r"^(-?([0-9]+(\.[0-9]*)?|\.[0-9]+)(e[+-]?[0-9]+)?|NaN|-?Infinity)" + _END
_NUMERIC = r"^-?[0-9]+(\.[0-9]+)?" + _END
_HEX = r"^\\x[0-9a-fA-F]*" + _END
_DATE = r"[0-9]{4}-[0-9]{2}-[0-9]{2}"
_TIME = r" [0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,6})?"
_OFFSET = r"[+-][0-9]{2}(:[0-9]{2}){0,2}"
_INTERVAL = (
    r"^(?:[+-]?[0-9]{1,10} years? ?)?(?:[+-]?[0-9]{1,10} mons? ?)?(?:[+-]?[0-9]{1,10} days? ?)?"
    r"(?:[+-]?[0-9]{1,10}:[0-9]{2}:[0-9]{2}(?:\.[0-9]{1,6})?)?" + _END
)
_INTERVAL_CLOCK = r"([+-]?)([0-9]+):([0-9]{2}):([0-9]{2})(?:\.([0-9]+))?" + _END
_ESCAPED_BACKSLASH = "\u0000b"
_ESCAPED_QUOTE = "\u0000q"
_ARRAY_TOKEN = r'"[^"]*"|[^,"{}]+'


def type_label(target: DataType) -> str:
    """``DecimalType(12,2)``, ``DateType``: the type as error messages name it."""
    if isinstance(target, DecimalType):
        return f"DecimalType({target.precision},{target.scale})"
    return type(target).__name__


def _lit(value: Any) -> Column:
    return F.lit(value)


def _no_error() -> Column:
    return F.lit(None).cast(StringType())


def _let(value: Column, body: Callable[[Column], Column]) -> Column:
    """``body(v)`` with ``v`` bound to ``value``, which is computed once."""
    return F.get(F.transform(F.array(value), body), 0)


def _pair(text: Column, value: Column, error_of: Callable[[Column], Column], target: DataType):
    """``struct<value, error>`` from a value expression and its error given the bound value.

    The error is NULL for NULL text; a non-NULL text whose value is NULL without a more specific
    message gets ``cannot cast to <type>``.
    """
    fallback = F.when(text.isNotNull(), _lit(f"cannot cast to {type_label(target)}"))

    def finish(v: Column) -> Column:
        error = F.when(text.isNotNull(), error_of(v))
        return F.struct(
            v.alias("value"),
            F.coalesce(error, F.when(v.isNull(), fallback)).alias("error"),
        )

    return _let(value.cast(target), finish)


def _cast_string(text: Column) -> Column:
    return F.struct(text.alias("value"), _no_error().alias("error"))


def _bool_value(text: Column) -> Column:
    return F.when(text == "t", _lit(True)).when(text == "f", _lit(False))


def _cast_bool(text: Column) -> Column:
    return _pair(
        text,
        _bool_value(text),
        lambda v: F.when(v.isNull(), _lit("invalid boolean text")),
        BooleanType(),
    )


def _integer_value(text: Column, target: DataType) -> Column:
    return F.when(text.rlike(_INT), text.try_cast(target))


def _integer_caster(target: DataType) -> Caster:
    def cast(text: Column) -> Column:
        return _pair(
            text,
            _integer_value(text, target),
            lambda v: F.when(~text.rlike(_INT), _lit("invalid integer text")).when(
                v.isNull(), _lit(f"integer out of range for {type_label(target)}")
            ),
            target,
        )

    return cast


def _float_value(text: Column, target: DataType) -> Column:
    parsed = text.try_cast(target)
    # a finite text that parses to an infinity overflowed the target type
    overflow = (F.abs(parsed) == float("inf")) & ~text.endswith("Infinity")
    return F.when(text.rlike(_FLOAT) & ~overflow, parsed)


def _float_caster(target: DataType) -> Caster:
    def cast(text: Column) -> Column:
        return _pair(
            text,
            _float_value(text, target),
            lambda v: F.when(~text.rlike(_FLOAT), _lit("invalid floating-point text")).when(
                v.isNull(), _lit(f"floating-point value out of range for {type_label(target)}")
            ),
            target,
        )

    return cast


def _significant_decimals(text: Column) -> Column:
    return F.length(F.regexp_replace(F.regexp_extract(text, r"\.([0-9]*)\z", 1), r"0+\z", ""))


def _numeric_value(text: Column, target: DecimalType, rounding: bool = False) -> Column:
    valid = text.rlike(_NUMERIC)
    whole = F.regexp_extract(text, r"^-?0*([0-9]*)", 1)
    fits = F.length(whole) <= target.precision - target.scale
    if not rounding:
        fits = fits & (_significant_decimals(text) <= target.scale)
    return F.when(valid & fits, text.try_cast(target))


def _rounds(t: PgType) -> bool:
    """Whether a numeric column's values may hold more decimals than its Spark type: an
    unconstrained numeric, a scale above 38, or an override. Those are rounded as Spark's CAST
    rounds (half up) and counted; a constrained numeric's values always fit exactly."""
    if t.target:
        return True
    if t.typmod < 4:
        return True
    return (((t.typmod - 4) & 0x7FF) ^ 0x400) - 0x400 > MAX_DECIMAL_PRECISION


def _numeric_caster(target: DecimalType, rounding: bool = False) -> Caster:
    """The integer digits must fit; the decimals too, trailing zeros aside, unless
    ``rounding`` (see :func:`_rounds`), where extra decimals are rounded half up."""

    def cast(text: Column) -> Column:
        return _pair(
            text,
            _numeric_value(text, target, rounding),
            lambda v: (
                F.when(
                    text.isin("NaN", "Infinity", "-Infinity"),
                    F.concat(_lit("numeric "), text, _lit(f" does not fit {type_label(target)}")),
                )
                .when(~text.rlike(_NUMERIC), _lit("invalid numeric text"))
                .when(v.isNull(), _lit(f"numeric value does not fit {type_label(target)}"))
            ),
            target,
        )

    return cast


def _bytea_value(text: Column) -> Column:
    valid = text.rlike(_HEX) & (F.length(text) % 2 == 0)
    return F.when(valid, F.unhex(F.substring(text, F.lit(3), F.length(text))))


def _cast_bytea(text: Column) -> Column:
    return _pair(
        text,
        _bytea_value(text),
        lambda v: F.when(v.isNull(), _lit("invalid bytea text (expected \\x hex)")),
        BinaryType(),
    )


_INFINITE = ("infinity", "-infinity")
_EXTREMES = {
    "date": ("9999-12-31", "0001-01-01"),
    "timestamp": ("9999-12-31 23:59:59.999999", "0001-01-01 00:00:00"),
    "timestamptz": ("9999-12-31 23:59:59.999999+00", "0001-01-01 00:00:00+00"),
}


def _datetime_value(
    text: Column, target: DataType, full_pattern: str, clamp: str | None = None
) -> Column:
    """The value of an ISO text; with ``clamp`` (a label of :data:`_EXTREMES`), ``infinity``
    and ``-infinity`` are the type's largest and smallest values."""
    value = F.when(text.rlike(full_pattern), text.try_cast(target))
    if clamp is None:
        return value
    largest, smallest = _EXTREMES[clamp]
    return (
        F.when(text == "infinity", _lit(largest).cast(target))
        .when(text == "-infinity", _lit(smallest).cast(target))
        .otherwise(value)
    )


def _infinity(t: PgType) -> str:
    return t.infinity or DEFAULT_INFINITY


def nulled(t: PgType) -> Callable[[Column], Column] | None:
    """For a date or timestamp column whose infinities become NULL: which texts those are
    (a NULL value from such a text is no error)."""
    if t.target or element_type(t) is not None or base_oid(t) not in (DATE, TIMESTAMP, TIMESTAMPTZ):
        return None
    if _infinity(t) != "null":
        return None
    return lambda text: text.isin(*_INFINITE)


def _datetime_caster(pattern: str, target: DataType, label: str, infinity: str = "error") -> Caster:
    """Dates and timestamps: the ISO form with a four-digit year, or a definite error;
    ``infinity`` says what ``±infinity`` become (see :data:`INFINITY_POLICIES`)."""
    spark_range = f"outside {type_label(target)}'s range (years 1 to 9999)"
    full_pattern = "^" + pattern + _END
    clamp = label if infinity == "clamp" else None

    def cast(text: Column) -> Column:
        if infinity == "null":
            return F.when(
                text.isin(*_INFINITE),
                F.struct(_lit(None).cast(target).alias("value"), _no_error().alias("error")),
            ).otherwise(exact(text))
        return exact(text)

    def exact(text: Column) -> Column:
        return _pair(
            text,
            _datetime_value(text, target, full_pattern, clamp),
            lambda v: (
                F.when(
                    text.isin("infinity", "-infinity") & _lit(clamp is None),
                    F.concat(_lit(f"{label} "), text, _lit(f" is {spark_range}")),
                )
                .when(text.isin("infinity", "-infinity"), _no_error())
                .when(text.endswith(" BC"), _lit(f"{label} BC is {spark_range}"))
                .when(text.rlike(r"^[0-9]{5,}-"), _lit(f"{label} after year 9999 is {spark_range}"))
                .when(~text.rlike(full_pattern), _lit(f"invalid {label} text"))
                .when(v.isNull(), _lit(f"invalid {label}"))
            ),
            target,
        )

    return cast


def _cast_interval(text: Column) -> Column:
    """``[N year[s]] [N mon[s]] [N day[s]] [[+-]H:MM:SS[.ffffff]]`` into PostgreSQL's fields.

    Each part carries its own sign (``-1 days +02:00:00``); the whole text is validated once,
    so each part can be found with a short pattern of its own.
    """

    def number(pattern: str, index: int, target: str) -> Column:
        digits = F.regexp_extract(text, pattern, index)
        return F.when(digits == "", _lit(0).cast(target)).otherwise(digits.try_cast(target))

    def unit(name: str) -> Column:
        return number(r"([+-]?[0-9]+) " + name, 1, "int")

    def clock(index: int, factor: int) -> Column:
        return F.try_multiply(number(_INTERVAL_CLOCK, index, "bigint"), _lit(factor).cast("bigint"))

    fraction = F.rpad(F.regexp_extract(text, _INTERVAL_CLOCK, 5), 6, "0").try_cast("bigint")
    magnitude = F.try_add(
        F.try_add(clock(2, 3_600_000_000), clock(3, 60_000_000)),
        F.try_add(clock(4, 1_000_000), fraction),
    )
    sign = F.when(F.regexp_extract(text, _INTERVAL_CLOCK, 1) == "-", _lit(-1)).otherwise(_lit(1))
    fields = F.struct(
        F.try_add(F.try_multiply(unit("year"), _lit(12)), unit("mon")).alias("months"),
        unit("day").alias("days"),
        F.try_multiply(magnitude, sign.cast("bigint")).alias("microseconds"),
    )

    def checked(s: Column) -> Column:
        complete = s["months"].isNotNull() & s["days"].isNotNull()
        complete = complete & s["microseconds"].isNotNull()
        return F.when(text.rlike(_INTERVAL) & (text != "") & complete, s)

    return _pair(
        text,
        _let(fields, checked),
        lambda v: (
            F.when(
                text.isin("infinity", "-infinity"),
                F.concat(_lit("interval "), text, _lit(" has no Spark representation")),
            )
            .when(~text.rlike(_INTERVAL) | (text == ""), _lit("invalid interval text"))
            .when(v.isNull(), _lit("interval out of range"))
        ),
        spark_type(PgType(INTERVAL)),
    )


def _array_caster(element: PgType) -> Caster:
    """A 1-D array literal, split in SQL (see the module docstring), each element cast."""
    cast_element = caster(element)
    target = ArrayType(spark_type(element), containsNull=True)

    def cast(text: Column) -> Column:
        inner = F.substring(text, F.lit(2), F.length(text) - 2)
        escaped = F.replace(
            F.replace(inner, _lit("\\\\"), _lit(_ESCAPED_BACKSLASH)),
            _lit('\\"'),
            _lit(_ESCAPED_QUOTE),
        )
        return _let(
            escaped,
            lambda e: _let(
                F.regexp_extract_all(e, _lit(_ARRAY_TOKEN), 0),
                lambda tokens: split(text, e, tokens),
            ),
        )

    def split(text: Column, escaped: Column, tokens: Column) -> Column:
        well_formed = (
            text.startswith("{")
            & text.endswith("}")
            & ~text.contains("\u0000")
            & ~escaped.contains("\\")
            & (F.array_join(tokens, ",") == escaped)
        )
        pairs = F.transform(F.transform(tokens, _array_element), cast_element)
        return _let(pairs, lambda p: finish(text, well_formed, p))

    def finish(text: Column, well_formed: Column, pairs: Column) -> Column:
        failures = F.filter(
            F.transform(
                pairs,
                lambda pair, index: F.concat(
                    _lit("element "), (index + 1).cast("string"), _lit(": "), pair["error"]
                ),
            ),
            lambda message: message.isNotNull(),
        )
        return _let(failures, lambda f: report(text, well_formed, pairs, f))

    def report(text: Column, well_formed: Column, pairs: Column, failures: Column) -> Column:
        failed = F.size(failures)
        more = F.when(
            failed > 1, F.concat(_lit(" (and "), (failed - 1).cast("string"), _lit(" more)"))
        ).otherwise(_lit(""))
        return _pair(
            text,
            F.when(well_formed & (failed == 0), F.transform(pairs, lambda pair: pair["value"])),
            lambda v: (
                F.when(text.startswith("{{"), _lit("multi-dimensional arrays are not supported"))
                .when(
                    text.startswith("["),
                    _lit("arrays with a lower bound other than 1 are not supported"),
                )
                .when(~well_formed, _lit("invalid array literal"))
                .when(failed > 0, F.concat(F.get(failures, 0), more))
            ),
            target,
        )

    return cast


def _array_element(token: Column) -> Column:
    """One token of an escaped array literal as the element's text (NULL for unquoted NULL)."""
    quoted = F.substring(token, F.lit(2), F.length(token) - 2)
    unescaped = F.replace(
        F.replace(quoted, _lit(_ESCAPED_QUOTE), _lit('"')),
        _lit(_ESCAPED_BACKSLASH),
        _lit("\\"),
    )
    return (
        F.when(token.startswith('"'), unescaped)
        .when(F.upper(token) == "NULL", _no_error())
        .otherwise(token)
    )


Plain = Callable[[Column], Column]
"""A type's typed value as a plain expression (NULL for a non-NULL text: the full cast
decides; see :func:`plain_value`)."""


def _text_value(text: Column) -> Column:
    return text


def _float_plain(text: Column, target: DataType) -> Column:
    return _float_value(text, target).cast(target)


@dataclass(frozen=True)
class TypeCast:
    """One entry of the cast registry: both casts of one PostgreSQL type.

    ``full(t, target)`` is the full cast (a :data:`Caster`: text -> ``struct<value, error>``),
    ``plain(t, target)`` the fast one (a :data:`Plain`, or None when only the full cast handles
    the type), for the column type ``t`` whose Spark type is ``target``."""

    full: Callable[[PgType, DataType], Caster]
    plain: Callable[[PgType, DataType], Plain | None]


def _datetime_entry(pattern: str, label: str) -> TypeCast:
    full_pattern = "^" + pattern + _END
    return TypeCast(
        lambda t, target: _datetime_caster(pattern, target, label, _infinity(t)),
        lambda t, target: functools.partial(
            _datetime_plain, target=target, full_pattern=full_pattern
        ),
    )


_NUMBER_CAST = TypeCast(
    lambda t, target: _integer_caster(target),
    lambda t, target: functools.partial(_canonical_number, target=target),
)
_FLOAT_CAST = TypeCast(
    lambda t, target: _float_caster(target),
    lambda t, target: functools.partial(_float_plain, target=target),
)
_TEXT_CAST = TypeCast(lambda t, target: _cast_string, lambda t, target: _text_value)
"""Every type without an entry of its own (text, enums, json, uuid, ...): its text as is."""

CASTS: Mapping[int, TypeCast] = {
    BOOL: TypeCast(lambda t, target: _cast_bool, lambda t, target: _bool_value),
    INT2: _NUMBER_CAST,
    INT4: _NUMBER_CAST,
    INT8: _NUMBER_CAST,
    OID: _NUMBER_CAST,
    FLOAT4: _FLOAT_CAST,
    FLOAT8: _FLOAT_CAST,
    NUMERIC: TypeCast(
        lambda t, target: _numeric_caster(target, rounding=_rounds(t)),
        lambda t, target: functools.partial(
            _rounding_number if _rounds(t) else _canonical_number, target=target
        ),
    ),
    BYTEA: TypeCast(lambda t, target: _cast_bytea, lambda t, target: _bytea_value),
    DATE: _datetime_entry(_DATE, "date"),
    TIMESTAMP: _datetime_entry(_DATE + _TIME, "timestamp"),
    TIMESTAMPTZ: _datetime_entry(_DATE + _TIME + _OFFSET, "timestamptz"),
    INTERVAL: TypeCast(lambda t, target: _cast_interval, lambda t, target: None),
}
"""The cast registry: built-in scalar type oid -> its casts (domains cast as their base)."""


def _override_entry(target: DataType) -> TypeCast:
    """A column whose configuration overrides its type: cast by the target type."""
    if isinstance(target, DecimalType):
        return TypeCast(
            lambda t, target: _numeric_caster(target, rounding=True),
            lambda t, target: functools.partial(_rounding_number, target=target),
        )
    if isinstance(target, (DoubleType, FloatType)):
        return _FLOAT_CAST
    if isinstance(target, (LongType, IntegerType, ShortType)):
        return _NUMBER_CAST
    return _TEXT_CAST


def _array_entry(element: PgType) -> TypeCast:
    """An array by its element type; ``box[]`` literals (``;``-delimited) stay text."""
    if base_oid(element) in NON_COMMA_DELIMITED:
        return _TEXT_CAST
    text_elements = isinstance(spark_type(element), StringType)
    return TypeCast(
        lambda t, target: _array_caster(element),
        lambda t, target: _simple_text_array if text_elements else None,
    )


def type_cast(t: PgType) -> TypeCast:
    """The registry entry that casts values of ``t``."""
    if t.target:
        return _override_entry(spark_type(t))
    element = element_type(t)
    if element is not None:
        return _array_entry(element)
    return CASTS.get(base_oid(t), _TEXT_CAST)


def caster(t: PgType) -> Caster:
    return type_cast(t).full(t, spark_type(t))


def plain_value(t: PgType) -> Plain | None:
    """The typed value of a scalar type as a plain expression (no lambda functions, so Spark
    generates code for it), exactly the value of :func:`caster`'s pair; None for the types
    only the full cast handles (arrays, interval). NULL for a non-NULL text means an error
    (or, for a column whose infinities become NULL, see :func:`nulled`)."""
    return type_cast(t).plain(t, spark_type(t))


def _simple_text_array(text: Column) -> Column:
    """A one-dimensional text array literal without backslash escapes or unquoted NULLs as
    ``array<string>``, in plain expressions; NULL for any other literal (the full cast reads
    those). Without escapes a quoted element holds no ``"``, so every ``"`` is a token's
    boundary: the tokens joined by NUL (which text never holds), quotes removed, split on NUL."""
    inner = F.substring(text, F.lit(2), F.length(text) - 2)
    tokens = F.regexp_extract_all(inner, _lit(_ARRAY_TOKEN), 0)
    simple = (
        text.startswith("{")
        & text.endswith("}")
        & ~text.startswith("{{")
        & ~inner.contains("\\")
        & ~inner.contains("\u0000")
        # (the regex runs only where an upper-case copy holds NULL: rarely)
        & ~(F.upper(inner).contains("NULL") & inner.rlike(r"(?i)(^|,)NULL(,|$)"))
        & (F.array_join(tokens, ",") == inner)
    )
    elements = F.split(F.replace(F.array_join(tokens, "\u0000"), _lit('"'), _lit("")), "\u0000", -1)
    return F.when(
        simple,
        F.when(inner == "", F.array().cast(ArrayType(StringType())))
        .otherwise(elements)
        .cast(ArrayType(StringType(), containsNull=True)),
    )


def _canonical_number(text: Column, target: DataType) -> Column:
    """The integer or decimal of a text that is exactly the value's own text form (what
    PostgreSQL writes: ``-?digits``, and ``-?digits.digits`` with ``s`` decimals for
    ``numeric(p,s)``), else NULL, for the full cast to decide. One parse and one format instead
    of the full cast's regular expressions (four for numeric): a text that reads back as itself
    holds nothing that was rounded, cut or out of range."""
    value = text.try_cast(target)
    return F.when(value.cast(StringType()) == text, value)


def _rounding_number(text: Column, target: DecimalType) -> Column:
    """A number in PostgreSQL's form with at most the target's scale of significant decimals
    (trailing zeros change no value); NULL for one with more (the full cast rounds it, and
    silver counts it) or one that does not cast."""
    decimals = _significant_decimals(text)
    fits = ~text.contains(".") | (decimals <= target.scale)
    # a strict parse of PostgreSQL's form: Spark's own cast also reads ``.5`` and ``5E-1``
    return F.when(text.rlike(_NUMERIC) & fits, text.try_cast(target))


def _datetime_plain(text: Column, target: DataType, full_pattern: str) -> Column:
    """An ISO date or timestamp; NULL for anything else, ``±infinity`` included (the full cast
    applies the column's policy to those, and silver counts them)."""
    return _datetime_value(text, target, full_pattern).cast(target)


def is_partial(plain: Callable[[Column], Column] | None) -> bool:
    """Whether a plain value is NULL for texts it does not handle (the full cast decides those)
    rather than only for texts that do not cast."""
    return plain is _simple_text_array or (
        isinstance(plain, functools.partial)
        and plain.func in (_canonical_number, _rounding_number, _datetime_plain)
    )


def adjustments(columns: Sequence[tuple[str, PgType]]) -> list[tuple[str, str, Callable]]:
    """``(column, code, test)`` for each column whose values may be adjusted by a declared
    rule rather than kept exactly: ``Rounded`` (more decimals than the column's Spark decimal,
    see :func:`_rounds`), ``Clamped`` or ``Nulled`` (``±infinity`` in a date or timestamp).
    ``test(text)`` is whether a value's text is adjusted. Silver counts them per run."""
    out = []
    for name, t in columns:
        if element_type(t) is not None and not t.target:
            continue
        target = spark_type(t)
        oid = base_oid(t)
        if isinstance(target, DecimalType) and oid == NUMERIC and _rounds(t):
            scale = target.scale
            out.append((name, "Rounded", lambda text, s=scale: _significant_decimals(text) > s))
        elif not t.target and oid in (DATE, TIMESTAMP, TIMESTAMPTZ):
            policy = _infinity(t)
            if policy != "error":
                code = "Clamped" if policy == "clamp" else "Nulled"
                out.append((name, code, lambda text: text.isin(*_INFINITE)))
    return out
