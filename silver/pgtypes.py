r"""PostgreSQL types as silver knows them, and the Spark type each one becomes.

:class:`PgType` is what silver knows about a column's type (from ``pg_type`` at the snapshot, or
a Relation message's type oid). The mapping below is written once, in Arrow types
(:func:`arrow_type`: what :mod:`silver.kernel` casts text values to, in the driver and on
Spark's executors alike); :func:`spark_type` is the same type as Spark names it, and
:func:`type_string` its Spark SQL name. Only :func:`spark_type` imports PySpark: a run that
starts no Spark imports none of it.

The mapping (``oid`` from ``pg_type``; domains cast as their base type)::

    PostgreSQL                        Spark                  notes
    --------------------------------  ---------------------  ----------------------------------
    bool (16)                         BooleanType            ``t`` / ``f``
    int2 (21), int4 (23), int8 (20)   Short/Integer/Long     range-checked
    oid (26)                          LongType               unsigned 32-bit
    float4 (700), float8 (701)        Float/DoubleType       ``NaN``, ``Infinity``,
                                                             ``-Infinity`` and ``-0`` kept
    numeric(p,s) (1700), p <= 38      DecimalType(p,s)       NaN/Infinity: error
    numeric(p,s), s < 0 or s > p      DecimalType(p-s,0) /   PostgreSQL 15+ scales, exact
                                      DecimalType(s,s)
    numeric(p,s), p > 38              DecimalType(38,s')     s' = min(s, 38); error if the
                                                             value does not fit
    numeric (unconstrained)           DecimalType(38,18)     error when the value has more than
                                                             20 integer digits or a non-zero
                                                             digit after the 18th decimal
    text (25), varchar (1043),        StringType             bpchar keeps its padding
    bpchar (1042), "char" (18),
    name (19)
    bytea (17)                        BinaryType             ``\x`` hex
    date (1082)                       DateType               infinity, BC and years after 9999:
                                                             error
    timestamp (1114)                  TimestampNTZType       infinity, BC, year > 9999: error
    timestamptz (1184)                TimestampType          (UTC instant) same errors
    time (1083), timetz (1266)        StringType             ``HH:MM:SS[.ffffff][+hh]``; sorts
                                                             right for time; Delta has no TIME
    interval (1186)                   struct<months: int,    PostgreSQL's own three fields;
                                      days: int,             ``infinity`` (PostgreSQL 17+):
                                      microseconds: bigint>  error
    uuid (2950)                       StringType             lower-case canonical form
    json (114), jsonb (3802)          StringType             see below
    enums (typcategory E)             StringType             the label
    arrays of the above               ArrayType(element)     NULL elements kept; element errors
                                                             name the element's position
    arrays declared with N > 1        N nested ArrayTypes    ``int4[][]``: ``{{1,2},{3,4}}`` is
    dimensions (``attndims``)                                ``[[1,2],[3,4]]``; a value of other
                                                             dimensions than declared: error
    a value of more dimensions than   (error)                ``{{1,2},{3,4}}`` in an ``int4[]``
    its column's, explicit lower                             column, ``[0:1]={1,2}``
    bounds
    box[] (element delimiter ``;``)   StringType             the literal as PostgreSQL wrote it
    inet, cidr, macaddr, macaddr8,    StringType             the text PostgreSQL wrote
    money, bit, varbit, xml,
    tsvector, tsquery, ranges,
    multiranges, hstore, geometric
    types, pg_lsn, xid, composite,
    anything unknown

Why not Spark's VARIANT for json/jsonb: silver consolidates diffs by grouping on whole rows and
gold compares rows with the source, and VARIANT values are neither groupable nor comparable in
Spark; jsonb's text form is already normalised (key order, whitespace), so equal jsonb values
are equal strings. Parse with ``parse_json``/``from_json`` downstream where needed.

Why a struct for interval: Spark's own interval types split year-month from day-time and
cannot hold ``1 mon 1 day`` (and Delta cannot store ``CalendarIntervalType``). The struct is
exactly PostgreSQL's representation, so no value is lost and ``'1 mon'`` stays distinct from
``'30 days'`` (PostgreSQL's ``=`` calls them equal; this mapping keeps what was written).

What is decided here and may need revisiting: ``infinity`` dates and timestamps are errors, not
sentinels (a sentinel like 9999-12-31 would collide with a real value); unconstrained numeric
is ``DecimalType(38,18)`` rather than a string. A domain over ``numeric(p,s)`` is
``DecimalType(p,s)``: its column's typmod is -1 (in the catalog and in pgoutput), so the
snapshot reads the domain's own (``pg_type.typtypmod``, along its chain); a domain column the
stream adds later, whose catalog the snapshot never read, is unconstrained.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from pgmedallion.core.config import parse_type_override

# --- PostgreSQL type oids (pg_type, stable since they are built in) -----------------------------

BOOL, BYTEA, CHAR, NAME, INT8, INT2, INT4, TEXT, OID = 16, 17, 18, 19, 20, 21, 23, 25, 26
JSON, FLOAT4, FLOAT8, BPCHAR, VARCHAR = 114, 700, 701, 1042, 1043
DATE, TIME, TIMESTAMP, TIMESTAMPTZ, INTERVAL, TIMETZ = 1082, 1083, 1114, 1184, 1186, 1266
NUMERIC, UUID, JSONB, BOX = 1700, 2950, 3802, 603

ARRAY_ELEMENT: Mapping[int, int] = {
    1000: BOOL,
    1001: BYTEA,
    1002: CHAR,
    1003: NAME,
    1005: INT2,
    1007: INT4,
    1009: TEXT,
    1014: BPCHAR,
    1015: VARCHAR,
    1016: INT8,
    1017: 600,  # point
    1020: BOX,
    1021: FLOAT4,
    1022: FLOAT8,
    1028: OID,
    1040: 829,  # macaddr
    1041: 869,  # inet
    651: 650,  # cidr
    775: 774,  # macaddr8
    791: 790,  # money
    1115: TIMESTAMP,
    1182: DATE,
    1183: TIME,
    1185: TIMESTAMPTZ,
    1187: INTERVAL,
    1231: NUMERIC,
    1270: TIMETZ,
    1561: 1560,  # bit
    1563: 1562,  # varbit
    143: 142,  # xml
    199: JSON,
    2951: UUID,
    3643: 3614,  # tsvector
    3645: 3615,  # tsquery
    3807: JSONB,
    3905: 3904,  # int4range
    3907: 3906,  # numrange
    3909: 3908,  # tsrange
    3911: 3910,  # tstzrange
    3913: 3912,  # daterange
    3927: 3926,  # int8range
}
"""Built-in array type -> element type, so arrays work even without ``element_type_oid``."""

NON_COMMA_DELIMITED = frozenset({BOX})
"""Element types whose array literals separate elements with ``;`` (``pg_type.typdelim``)."""

UNCONSTRAINED_NUMERIC = pa.decimal128(38, 18)
"""Where ``numeric`` without a usable precision goes (values that do not fit are errors)."""

INTERVAL_TYPE = pa.struct(
    [("months", pa.int32()), ("days", pa.int32()), ("microseconds", pa.int64())]
)

TIMESTAMP_TYPE = pa.timestamp("us")
"""Spark's ``TimestampNTZType``: a wall-clock time."""
TIMESTAMPTZ_TYPE = pa.timestamp("us", tz="UTC")
"""Spark's ``TimestampType``: an instant."""

_SCALAR_TYPES: Mapping[int, pa.DataType] = {
    BOOL: pa.bool_(),
    INT2: pa.int16(),
    INT4: pa.int32(),
    INT8: pa.int64(),
    OID: pa.int64(),
    FLOAT4: pa.float32(),
    FLOAT8: pa.float64(),
    BYTEA: pa.binary(),
    DATE: pa.date32(),
    TIMESTAMP: TIMESTAMP_TYPE,
    TIMESTAMPTZ: TIMESTAMPTZ_TYPE,
    INTERVAL: INTERVAL_TYPE,
}
"""Types with a Spark type of their own (numeric aside); every other scalar is a string."""

MAX_DECIMAL_PRECISION = 38


@dataclass(frozen=True)
class PgType:
    """What silver knows about a column's type."""

    type_oid: int
    typmod: int = -1
    type_name: str = ""
    """``format_type()``, e.g. ``numeric(12,2)``, ``order_status``, ``text[]``."""
    base_type_oid: int = 0
    """For domains: the base type's oid (0 = not a domain)."""
    element_type_oid: int = 0
    """For arrays: the element type's oid (0 = not an array)."""
    category: str = ""
    """``pg_type.typcategory`` of the (base) type: ``E`` enum, ``A`` array, ..."""
    target: str = ""
    """A type override from the configuration (see :func:`override_type`), or "" for the
    mapping's own type."""
    infinity: str = ""
    """Dates and timestamps: what ``infinity`` and ``-infinity`` become (see
    :data:`INFINITY_POLICIES`); "" is :data:`DEFAULT_INFINITY`."""
    dims: int = 0
    """Arrays: the dimensions the column was declared with (``pg_attribute.attndims``); 0 or 1
    is a one-dimensional array (0: not known, a domain over an array, a column the stream
    added)."""
    domain_typmod: int = -1
    """A domain's own type modifier (a domain over ``numeric(10,2)``): the column's ``typmod``
    is -1 for a domain, in the catalog and in pgoutput alike. -1: none, or not known (a column
    the stream added)."""


INFINITY_POLICIES = ("clamp", "null", "error")
"""``clamp``: Spark's largest and smallest value of the type (9999-12-31 23:59:59.999999 and
0001-01-01); ``null``: NULL; ``error``: a ``CastError``. Clamped and nulled values are counted
(see :func:`adjustments`)."""
DEFAULT_INFINITY = "clamp"

_OVERRIDES = {
    "string": pa.string(),
    "double": pa.float64(),
    "float": pa.float32(),
    "bigint": pa.int64(),
    "long": pa.int64(),
    "int": pa.int32(),
    "integer": pa.int32(),
    "smallint": pa.int16(),
}
INTEGER_TYPES = (pa.int16(), pa.int32(), pa.int64())
"""Spark's ``ShortType``, ``IntegerType`` and ``LongType``, narrowest first."""
FLOAT_TYPES = (pa.float32(), pa.float64())


def override_type(text: str) -> pa.DataType | None:
    """The type a configured override names (see
    :func:`pgmedallion.core.config.parse_type_override`), or None."""
    parsed = parse_type_override(text)
    if parsed is None:
        return None
    name, precision, scale = parsed
    return pa.decimal128(precision, scale) if name == "decimal" else _OVERRIDES[name]


def override_problem(t: PgType, text: str) -> str | None:
    """Why a column of type ``t`` cannot be read as the override ``text``; None if it can.
    Any type reads as ``string``; numbers (numeric, integers, floats) as ``double`` or
    ``float``; numeric and integers as ``decimal(p,s)``; integers as another integer type."""
    target = override_type(text)
    if target is None:
        return (
            f"unknown type {text!r} (string, double, float, bigint, int, smallint or "
            "decimal(p,s) with p <= 38)"
        )
    if target == pa.string():
        return None
    oid = base_oid(t)
    source = t.type_name or str(oid)
    if element_type(t) is not None:
        return f"an array ({source}) can only be read as string"
    integer = oid in (INT2, INT4, INT8, OID)
    if target in FLOAT_TYPES and (integer or oid in (NUMERIC, FLOAT4, FLOAT8)):
        return None
    if pa.types.is_decimal(target) and (integer or oid == NUMERIC):
        return None
    if target in INTEGER_TYPES and integer:
        return None
    return f"{source} cannot be read as {text}"


def pg_type_of(column: Any) -> PgType:
    """The :class:`PgType` of a :class:`capture.snapshot.Column` or a dict with its keys."""

    def get(key: str, default: Any) -> Any:
        if isinstance(column, Mapping):
            value = column.get(key, default)
        else:
            value = getattr(column, key, default)
        return default if value is None else value

    return PgType(
        type_oid=int(get("type_oid", 0)),
        typmod=int(get("typmod", -1)),
        type_name=str(get("type_name", "")),
        base_type_oid=int(get("base_type_oid", 0)),
        element_type_oid=int(get("element_type_oid", 0)),
        category=str(get("category", "")),
        target=str(get("target", "")),
        infinity=str(get("infinity", "")),
        dims=int(get("dims", 0)),
        domain_typmod=int(get("domain_typmod", -1)),
    )


# --- the mapping --------------------------------------------------------------------------------


def base_oid(t: PgType) -> int:
    return t.base_type_oid or t.type_oid


def type_modifier(t: PgType) -> int:
    """The modifier that applies to ``t``'s values: the column's, else its domain's."""
    return t.typmod if t.typmod >= 0 else t.domain_typmod


def element_type(t: PgType) -> PgType | None:
    """The element type if ``t`` is an array (its typmod is the element's), else None.

    ``pg_type.typelem`` is also set for a few fixed-size types that are not arrays (``name``,
    ``point``), so an element type counts only with category ``A`` (or no category known).
    """
    oid = base_oid(t)
    if oid in _SCALAR_TYPES or oid in (NUMERIC, TEXT, VARCHAR, BPCHAR, CHAR, NAME):
        return None
    element_oid = ARRAY_ELEMENT.get(oid)
    if not element_oid and t.category in ("A", ""):
        element_oid = t.element_type_oid
    if element_oid:
        return PgType(element_oid, type_modifier(t))
    if t.category == "A":
        return PgType(0, -1)  # an array of a type we know nothing about: its text
    return None


def decimal_type(typmod: int) -> pa.Decimal128Type:
    """The decimal for ``numeric`` with this typmod (see the mapping in the docstring).

    The typmod is ``((precision << 16) | (scale & 0x7ff)) + 4``; PostgreSQL 15+ allows a scale
    from -1000 to 1000 (11-bit two's complement), older servers 0..precision.
    """
    if typmod < 4:
        return UNCONSTRAINED_NUMERIC
    packed = typmod - 4
    precision = (packed >> 16) & 0xFFFF
    scale = ((packed & 0x7FF) ^ 0x400) - 0x400
    if scale < 0:
        precision, scale = precision - scale, 0
    elif scale > precision:
        precision = scale
    if precision > MAX_DECIMAL_PRECISION:
        return pa.decimal128(MAX_DECIMAL_PRECISION, min(scale, MAX_DECIMAL_PRECISION))
    return pa.decimal128(precision, scale)


def arrow_type(t: PgType) -> pa.DataType:
    """The type a column of PostgreSQL type ``t`` becomes (the mapping above), as Arrow names
    it: what silver's Delta table holds."""
    if t.target:
        target = override_type(t.target)
        if target is None:
            raise ValueError(override_problem(t, t.target))
        return target
    element = element_type(t)
    if element is not None:
        if base_oid(element) in NON_COMMA_DELIMITED:
            return pa.string()
        nested = arrow_type(element)
        for _ in range(max(1, t.dims)):
            nested = pa.list_(pa.field("element", nested))
        return nested
    oid = base_oid(t)
    if oid == NUMERIC:
        return decimal_type(type_modifier(t))
    return _SCALAR_TYPES.get(oid, pa.string())


def spark_type(t: PgType):
    """:func:`arrow_type` as Spark names it (a ``pyspark.sql.types.DataType``)."""
    from pyspark.sql.pandas.types import from_arrow_type

    return from_arrow_type(arrow_type(t), prefer_timestamp_ntz=True)


_SIMPLE = {
    pa.bool_(): "boolean",
    pa.int16(): "smallint",
    pa.int32(): "int",
    pa.int64(): "bigint",
    pa.float32(): "float",
    pa.float64(): "double",
    pa.binary(): "binary",
    pa.string(): "string",
    pa.date32(): "date",
    TIMESTAMP_TYPE: "timestamp_ntz",
    TIMESTAMPTZ_TYPE: "timestamp",
}


def type_string(t: PgType | pa.DataType) -> str:
    """``t``'s Spark type in Spark SQL's words (``DataType.simpleString``: ``decimal(12,2)``,
    ``array<int>``), without importing PySpark."""
    at = arrow_type(t) if isinstance(t, PgType) else t
    if pa.types.is_decimal(at):
        return f"decimal({at.precision},{at.scale})"
    if pa.types.is_list(at):
        return f"array<{type_string(at.value_type)}>"
    if pa.types.is_struct(at):
        fields = ",".join(f"{f.name}:{type_string(f.type)}" for f in at)
        return f"struct<{fields}>"
    return _SIMPLE[at]
