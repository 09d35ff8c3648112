"""What of a table's columns changed since its snapshot, as the catalog tells it.

A Relation message lists a table's columns by name in attnum order, but not their attnums, and
it is sent before the table's next change, not when the DDL runs. Several migrations are
therefore invisible or ambiguous in the stream, and each would leave gold silently different
from the source:

    ADD COLUMN c ... DEFAULT 1       existing rows read 1 (pg_attribute.attmissingval), and no
                                     row of them is in the WAL
    ADD COLUMN c ... DEFAULT random()  the table is rewritten, again without change messages
    swap two columns' names          the Relation lists the same names, in another order
    DROP c; ADD c (same type)        the Relation may look exactly as before
    DROP NOT NULL, DROP/ADD the key  no Relation difference at all

The catalog keeps what tells them apart: every column's attnum (never reused; a dropped column
stays in ``pg_attribute`` with ``attisdropped``), ``atthasmissing``, ``attnotnull``, the
primary key, and the table's ``relfilenode`` (a rewrite gives it a new one). A snapshot
records that fingerprint (:func:`catalog_of`); capture compares it with the catalog now at the
start of each attempt and after each stream (``capture.run``), and :func:`changes` says what
moved. What it calls *followed* is exact without a new snapshot: a column added with no value
for existing rows (they read NULL, as silver gives earlier rows of a new column), or with a
constant one (``ADD COLUMN c ... DEFAULT 1``: no rewrite, existing rows read ``attmissingval``,
which the catalog record carries to silver for the rows from before the column), a column
dropped whose name no other column took (silver and gold drop it; the rows keep their other
values), a column renamed to a name no column had, its old name taken by none (silver and gold
rename it), any renames, swaps included, of a table with no column added or dropped since its
snapshot (:func:`by_position`: a Relation's columns are then told apart by position), a type
change that keeps every value (:func:`widens`: silver and gold take the wider type),
``SET``/``DROP NOT NULL`` or a new primary key (no row changes: gold's rules and key follow).
Everything else (``resync`` reasons) is made exact by snapshotting the table again, which the
rewinds make correct at any LSN; the table's policy ``on_schema_change`` decides (``follow``:
resync what cannot be followed, ``resync``: every change, ``error``: neither, changes stop at
``SchemaIncompatible`` as before).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field, replace

import psycopg
from psycopg import sql

from pgmedallion.capture.errors import server_errors

FOLLOW, RESYNC, ERROR = "follow", "resync", "error"


@dataclass(frozen=True)
class CatalogColumn:
    attnum: int
    name: str
    type_oid: int
    typmod: int
    not_null: bool
    dropped: bool
    has_missing: bool
    """``atthasmissing``: rows written before the column was added read a stored value."""
    generated: str
    """``attgenerated``: ``''``, ``s`` stored, ``v`` virtual."""
    missing: str | None = None
    """With ``has_missing``: the value rows written before the column was added read, as its
    type's output text (``attmissingval``); None where it is not known here (a catalog
    recorded before capture read it, or a column a policy or the publication withholds, whose
    value must not reach bronze)."""
    base_type_oid: int = 0
    element_type_oid: int = 0
    category: str = ""
    dims: int = 0
    domain_typmod: int = -1
    """What the type is, as ``capture.snapshot.Column`` says it (a domain's base type and
    modifier, an array's element type and declared dimensions): what a Relation message does
    not carry, for a column added since the snapshot. Defaults in a catalog recorded before
    capture read them."""


@dataclass(frozen=True)
class Catalog:
    """A table's catalog fingerprint (see the module doc)."""

    columns: tuple[CatalogColumn, ...]
    primary_key: tuple[str, ...]
    relfilenode: int
    """0 for a partitioned table (its leaves hold the rows; attaching and detaching them is
    ``capture.run``'s other check)."""

    def landed(self, column_list: Sequence[str] | None, policied: Collection[str]) -> Catalog:
        """The catalog as bronze may hold it: the missing values of columns withheld from
        bronze (outside the publication's ``column_list``, or with a column policy in
        ``policied``) forgotten, so no value of theirs lands."""
        listed = None if column_list is None else set(column_list)

        def withheld(name: str) -> bool:
            return name in policied or (listed is not None and name not in listed)

        return replace(
            self,
            columns=tuple(
                replace(c, missing=None) if c.missing is not None and withheld(c.name) else c
                for c in self.columns
            ),
        )

    def keeping_missing(self, then: Catalog) -> Catalog:
        """The catalog with each column's value for rows from before it (``missing``) as
        ``then`` knew it where this one does not: a rewrite (``VACUUM FULL``, ``CLUSTER``)
        writes the value into the rows and clears ``attmissingval``, and the rows keep it."""
        known = {c.attnum: c for c in then.columns if c.has_missing and c.missing is not None}
        return replace(
            self,
            columns=tuple(
                replace(c, has_missing=True, missing=known[c.attnum].missing)
                if c.missing is None and c.attnum in known and not c.dropped
                else c
                for c in self.columns
            ),
        )

    def missing_values(self) -> dict[str, str]:
        """Live column name -> the value rows from before its addition read (where known)."""
        return {
            c.name: c.missing
            for c in self.columns
            if not c.dropped and c.has_missing and c.missing is not None
        }

    def to_record(self) -> dict:
        return {
            "columns": [list(vars(c).values()) for c in self.columns],
            "primary_key": list(self.primary_key),
            "relfilenode": self.relfilenode,
        }

    @staticmethod
    def from_record(record: dict | None) -> Catalog | None:
        if not record:
            return None
        return Catalog(
            tuple(CatalogColumn(*c) for c in record["columns"]),  # older records: 9 fields
            tuple(record["primary_key"]),
            int(record["relfilenode"]),
        )


@dataclass
class Changes:
    followed: list[str] = field(default_factory=list)
    """Changes exact without a new snapshot (described for people)."""
    unfollowable: list[str] = field(default_factory=list)
    """Changes only a new snapshot makes exact."""
    ambiguous: list[str] = field(default_factory=list)
    """Those of them the stream's names cannot show (a swap, a name given again): read by
    their names, the table's Relations would put values in the wrong columns."""

    def resync_reason(self, policy: str) -> str:
        """Why the table must be snapshotted again under ``policy`` ("": it need not)."""
        if policy == ERROR:
            return ""
        reasons = self.unfollowable if policy == FOLLOW else self.unfollowable + self.followed
        return "; ".join(reasons)


BASE_TYPE_SQL = (
    "WITH RECURSIVE chain(oid, depth) AS (SELECT {start}, 0 UNION ALL"
    " SELECT d.typbasetype, chain.depth + 1 FROM chain JOIN pg_type d ON d.oid = chain.oid"
    " WHERE d.typtype = 'd') SELECT oid FROM chain ORDER BY depth DESC LIMIT 1"
)
"""A subquery for the type ``{start}`` after following its chain of domains to the end."""

DOMAIN_TYPMOD_SQL = (
    "WITH RECURSIVE chain(oid, typmod, depth) AS (SELECT {start}, d0.typtypmod, 0"
    " FROM pg_type d0 WHERE d0.oid = {start} UNION ALL"
    " SELECT d.typbasetype, b.typtypmod, chain.depth + 1 FROM chain"
    " JOIN pg_type d ON d.oid = chain.oid JOIN pg_type b ON b.oid = d.typbasetype"
    " WHERE d.typtype = 'd' AND chain.typmod < 0)"
    " SELECT typmod FROM chain ORDER BY depth DESC LIMIT 1"
)
"""A subquery for the type modifier a domain ``{start}`` declares (``numeric(10,2)``): the
first along its chain of domains; -1 where none does."""

TYPE_FACTS_SQL = (
    " CASE WHEN t.typtype = 'd' THEN b.oid::int8 ELSE 0 END,"
    " CASE WHEN b.typcategory = 'A' THEN e.oid::int8 ELSE 0 END,"
    " coalesce(b.typcategory::text, ''), a.attndims::int,"
    " CASE WHEN t.typtype = 'd' THEN (" + DOMAIN_TYPMOD_SQL.format(start="t.oid") + ") ELSE -1 END"
)
"""What a column ``a`` of ``pg_attribute`` is, beyond its type OID and modifier (with
:data:`TYPE_JOINS_SQL`): the base type of a domain, the element type of an array (both resolved
through domains), the base type's category, the declared dimensions and a domain's modifier;
``capture.snapshot.Column`` and :class:`CatalogColumn` hold them in this order."""
TYPE_JOINS_SQL = (
    " LEFT JOIN pg_type t ON t.oid = a.atttypid"
    " LEFT JOIN LATERAL (" + BASE_TYPE_SQL.format(start="t.oid") + ") base ON true"
    " LEFT JOIN pg_type b ON b.oid = base.oid"
    " LEFT JOIN LATERAL (" + BASE_TYPE_SQL.format(start="b.typelem") + ") e ON true"
)


def catalog_of(conn: psycopg.Connection, oids: Sequence[int]) -> dict[int, Catalog]:
    """The catalog fingerprint of each existing table among ``oids``, as ``conn`` sees it (in
    a snapshot's transaction: as of the snapshot)."""
    if not oids:
        return {}
    wanted = sql.SQL(", ").join(sql.Literal(int(oid)) for oid in oids)
    with server_errors():
        rows = conn.execute(
            sql.SQL(
                # a partitioned table's partitions hold the values for existing rows, not its
                # root: found through pg_inherits (pg_partition_tree would take locks, and wait
                # behind a DDL transaction left open)
                "WITH RECURSIVE tree(root, relid) AS ("
                " SELECT c.oid, c.oid FROM pg_class c WHERE c.oid = ANY(ARRAY[{0}]::oid[])"
                " UNION ALL SELECT t.root, i.inhrelid FROM pg_inherits i"
                "  JOIN tree t ON i.inhparent = t.relid)"
                " SELECT a.attrelid::int8, a.attnum::int, a.attname, a.atttypid::int8,"
                " a.atttypmod, a.attnotnull, a.attisdropped,"
                " a.atthasmissing OR EXISTS (SELECT 1 FROM tree t"
                "  JOIN pg_attribute l ON l.attrelid = t.relid AND l.attname = a.attname"
                "  WHERE t.root = a.attrelid AND l.atthasmissing AND NOT l.attisdropped),"
                " a.attgenerated::text,"
                # the missing value as its type's output text (the array holds one element)
                " CASE WHEN a.atthasmissing AND NOT a.attisdropped"
                "  THEN (a.attmissingval::text::text[])[1] END,"
                # the type as the snapshot reads it (a dropped column's type is 0: none)
                + TYPE_FACTS_SQL
                + " FROM pg_attribute a"
                + TYPE_JOINS_SQL
                + " WHERE a.attrelid = ANY(ARRAY[{0}]::oid[]) AND a.attnum > 0"
                " ORDER BY a.attrelid, a.attnum"
            ).format(wanted)
        ).fetchall()
        tables = conn.execute(
            sql.SQL(
                "SELECT c.oid::int8, c.relfilenode::int8, ARRAY(SELECT a.attname::text"
                "  FROM pg_index i"
                "  CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, position)"
                "  JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum"
                "  WHERE i.indrelid = c.oid AND i.indisprimary ORDER BY k.position)"
                " FROM pg_class c WHERE c.oid = ANY(ARRAY[{}]::oid[])"
            ).format(wanted)
        ).fetchall()
    columns: dict[int, list[CatalogColumn]] = {}
    for oid, *column in rows:
        columns.setdefault(oid, []).append(CatalogColumn(*column))
    return {
        oid: Catalog(tuple(columns.get(oid, ())), tuple(key), int(relfilenode))
        for oid, relfilenode, key in tables
    }


_INT2, _INT4, _INT8, _TEXT, _VARCHAR, _NUMERIC = 21, 23, 20, 25, 1043, 1700
_TIMES = {1083: "time", 1114: "timestamp", 1184: "timestamptz", 1266: "timetz"}
_NAMES = {_INT2: "smallint", _INT4: "integer", _INT8: "bigint", _TEXT: "text"}
_NAMES |= {_VARCHAR: "varchar", _NUMERIC: "numeric", **_TIMES}
_INTEGERS = (_INT2, _INT4, _INT8)


def _numeric_typmod(typmod: int) -> tuple[int, int] | None:
    """numeric's ``(precision, scale)`` from its typmod; None when unconstrained."""
    if typmod < 4:
        return None
    packed = typmod - 4
    scale = packed & 0x7FF
    return packed >> 16, scale - 0x800 if scale & 0x400 else scale


def type_text(column: CatalogColumn) -> str:
    """The column's type as people read it (``varchar(20)``, ``numeric(12,2)``)."""
    name = _NAMES.get(column.type_oid, f"type {column.type_oid}")
    if column.typmod < 0:
        return name
    if column.type_oid == _VARCHAR:
        return f"{name}({column.typmod - 4})"
    if column.type_oid == _NUMERIC:
        precision, scale = _numeric_typmod(column.typmod) or (0, 0)
        return f"{name}({precision},{scale})"
    if column.type_oid in _TIMES:
        return f"{name}({column.typmod})"
    return name


def widens(old: CatalogColumn, new: CatalogColumn) -> bool:
    """Whether ``ALTER COLUMN ... TYPE`` from ``old``'s type to ``new``'s kept every value as
    it was, so silver and gold follow it by taking the new type (their Spark type is then the
    same or wider: Long for Integer, a decimal with more digits) and casting the text of
    changes read against an older Relation with it:

    - ``smallint`` -> ``integer`` -> ``bigint``;
    - ``varchar(n)`` <-> ``varchar(m)`` <-> ``text`` (``ALTER`` fails on a value too long, so
      when it succeeds no value changed);
    - ``numeric(p,s)`` -> ``numeric(p',s')`` with ``s' >= s`` and ``p'-s' >= p-s`` (no digit
      lost), or -> unconstrained ``numeric``;
    - ``time``, ``timestamp``, ``timestamptz``, ``timetz`` to a finer (or no) precision.

    ``real`` -> ``double precision`` is left out: PostgreSQL widens a real's binary value
    (``1.1`` becomes ``1.100000023841858``), while a change read against the older Relation
    carries the real's text, ``1.1``, which would cast to another double. Domains, arrays and
    every other change make a new snapshot."""
    a, b = old.type_oid, new.type_oid
    if a in _INTEGERS and b in _INTEGERS:
        return _INTEGERS.index(b) >= _INTEGERS.index(a)
    if a in (_TEXT, _VARCHAR) and b in (_TEXT, _VARCHAR):
        return True
    if a == b == _NUMERIC:
        before, after = _numeric_typmod(old.typmod), _numeric_typmod(new.typmod)
        if after is None or before is None:
            return after is None
        return after[1] >= before[1] and after[0] - after[1] >= before[0] - before[1]
    if a == b and a in _TIMES:
        return new.typmod < 0 or 0 <= old.typmod <= new.typmod
    return False


def by_position(snapshot: Catalog, now: Catalog) -> bool:
    """Whether every Relation message since the snapshot lists the very columns of
    ``snapshot`` in attnum order, so a column's position in it tells which it is whatever the
    names say (renames that swap or reuse names are followed: silver reads the table by
    position). So when ``now`` has the same columns by attnum, none added (attnums are never
    reused, and a column added then dropped stays as dropped) and none dropped since, and the
    table is not partitioned (a leaf's own Relation lists the leaf's columns in its order).
    The one rule capture (:func:`changes`, ``capture.run``) and silver
    (``silver.catalog._by_position``) both follow."""
    if not snapshot.relfilenode or not now.relfilenode:
        return False
    return {(c.attnum, c.dropped) for c in snapshot.columns} == {
        (c.attnum, c.dropped) for c in now.columns
    }


def changes(then: Catalog, now: Catalog, snapshot: Catalog | None = None) -> Changes:
    """What changed from ``then`` to ``now``, column by attnum. ``then`` is the table's
    snapshot's catalog, or one capture recorded since: then ``snapshot`` is the snapshot's.
    Silver follows a drop or a rename of a column its snapshot had (it knows that column's
    attnum), so a column added since is snapshotted again when it is dropped or renamed."""
    out = Changes()
    before = {c.attnum: c for c in then.columns}
    after = {c.attnum: c for c in now.columns}
    live_now = {c.name for c in now.columns if not c.dropped}
    live_then = {c.name for c in then.columns if not c.dropped}
    at_snapshot = {c.attnum for c in (snapshot or then).columns if not c.dropped}
    in_place = by_position(snapshot or then, now)
    for attnum, old in sorted(before.items()):
        new = after.get(attnum)
        if old.dropped:
            continue
        if new is None or new.dropped:
            if old.name in live_now or old.attnum not in at_snapshot:
                out.unfollowable.append(f"column {old.name} dropped and its name given again")
                if old.name in live_now:
                    out.ambiguous.append(f"column {old.name} dropped and its name given again")
            else:  # silver and gold drop it too (only under `follow`: see silver.catalog)
                out.followed.append(f"column {old.name} dropped")
            continue
        if new.name != old.name:
            reused = old.name in live_now or new.name in live_then
            if (reused and not in_place) or old.attnum not in at_snapshot:
                out.unfollowable.append(f"column {old.name} renamed to {new.name}")
                if reused:
                    out.ambiguous.append(f"column {old.name} renamed to {new.name}")
            else:  # silver and gold rename it (only under `follow`: see silver.catalog)
                out.followed.append(f"column {old.name} renamed to {new.name}")
        if (new.type_oid, new.typmod) != (old.type_oid, old.typmod):
            if widens(old, new):  # silver and gold take the new type (silver.catalog)
                out.followed.append(
                    f"column {new.name} widened from {type_text(old)} to {type_text(new)}"
                )
            else:
                out.unfollowable.append(f"column {new.name} changed type")
        if new.not_null != old.not_null:  # gold's rules follow (silver.catalog)
            verb = "set" if new.not_null else "dropped"
            out.followed.append(f"NOT NULL of column {new.name} {verb}")
        if new.generated != old.generated:
            out.unfollowable.append(f"column {new.name} changed generation")
    added = [c for attnum, c in sorted(after.items()) if attnum not in before]
    rewritten = then.relfilenode != now.relfilenode and then.relfilenode != 0
    reused = {  # names of the snapshot's columns dropped since
        c.name
        for c in (snapshot or then).columns
        if not c.dropped and (after.get(c.attnum) is None or after[c.attnum].dropped)
    }
    for column in added:
        if column.name in reused and not column.dropped:
            reason = f"column {column.name} dropped and its name given again"
            if reason not in out.unfollowable:
                out.unfollowable.append(reason)
            if reason not in out.ambiguous:
                out.ambiguous.append(reason)
        elif column.dropped:
            out.unfollowable.append("a column added since the snapshot was dropped")
        elif column.generated:
            out.unfollowable.append(f"generated column {column.name} added")
        elif column.has_missing and (column.missing is None or rewritten):
            out.unfollowable.append(f"column {column.name} added with a value for existing rows")
        elif column.has_missing:
            # ADD COLUMN ... DEFAULT <constant>: existing rows read attmissingval; silver gives
            # it to the rows from before the column (the value itself is never logged)
            out.followed.append(f"column {column.name} added (existing rows read its default)")
        elif rewritten:
            out.unfollowable.append(
                f"column {column.name} added and the table rewritten (a volatile default)"
            )
        else:
            out.followed.append(f"column {column.name} added (NULL in existing rows)")
    renamed = {
        c.name: after[c.attnum].name
        for c in then.columns
        if not c.dropped and c.attnum in after and not after[c.attnum].dropped
    }
    if tuple(renamed.get(k, k) for k in then.primary_key) != now.primary_key:
        # no row changes; silver reads each change's key from its Relation, and gold's rules
        # and MERGE take the new key (a full build from silver)
        old_key = ", ".join(then.primary_key) or "none"
        new_key = ", ".join(now.primary_key) or "none"
        out.followed.append(f"primary key changed ({old_key} -> {new_key})")
    return out
