"""What of a table reaches bronze: the publication's column list and row filter, and our column
policies for personal data.

PostgreSQL 15+ lets a publication withhold columns (``FOR TABLE t (a, b)``) and rows
(``FOR TABLE t WHERE (region = 'eu')``), and filters the replication stream by them itself. The
snapshot is our own ``COPY``, so it must apply the same rules, or the withheld values land in
bronze, where Delta's history keeps them for good. On top, the configuration may ``exclude`` a
column (it never reaches bronze) or ``hash`` it (a keyed HMAC-SHA256, hex: joins on it still
work, the value cannot be read back). Both apply to the snapshot's COPY rows and to the stream's
messages before bronze is written::

    catalog (pg_publication_tables) ─┐
    [tables."s.t".columns] pii       ├─> Shape ──> snapshot: SELECT listed columns WHERE filter,
    hash key (a secret)  ────────────┘               hashed fields rewritten in each COPY chunk
                                            └──> stream: Relation and tuples rewritten
                                                 (PostgreSQL already applied list and filter)

A table's :class:`Shape` is recorded with its schema in bronze. When the shape of now differs
from the recorded one (a column list or filter altered, a policy or the hash key changed),
capture snapshots the table again (``capture.run``): rows that move into a filter have no
change message, so nothing short of a new snapshot can follow that exactly.

Where a table is in several of the publications read, PostgreSQL combines them: a table
without a column list (or without a filter) in any of them is published whole (unfiltered);
otherwise the lists are united and the filters OR-ed. The one function :func:`combine` holds
that rule.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

import psycopg
from psycopg import sql

from pgmedallion.capture.copy_text import copy_fields, field_bytes
from pgmedallion.capture.errors import PolicyNotApplicable, server_errors
from pgmedallion.capture.pgoutput import (
    MSG_DELETE,
    MSG_INSERT,
    MSG_RELATION,
    MSG_UPDATE,
    UNCHANGED_TOAST,
    Relation,
    TupleData,
    decode,
    encode,
)

EXCLUDE = "exclude"
HASH = "hash"
PII_POLICIES = (EXCLUDE, HASH)

TEXT_OID = 25
ROW_FILTER_MIN_VERSION = 150000
"""Column lists and row filters are PostgreSQL 15's; before it a publication has neither."""

_KEY_ID_MESSAGE = b"pgmedallion hash key id"


@dataclass(frozen=True)
class Published:
    """One table as one publication publishes it."""

    columns: tuple[str, ...] | None
    """The publication's column list, in column order; None: every column."""
    row_filter: str | None
    """The row filter as PostgreSQL prints it (``pg_get_expr``); None: every row."""


EVERYTHING = Published(None, None)
"""No column list, no filter: what a publication without either publishes."""


def combine(entries: Sequence[Published]) -> Published:
    """One table's publication entries as PostgreSQL combines them for one subscriber."""
    if not entries:
        return EVERYTHING
    lists = [e.columns for e in entries]
    filters = [e.row_filter for e in entries]
    columns = None
    if all(c is not None for c in lists):
        seen: dict[str, None] = {}
        for listed in lists:
            seen.update(dict.fromkeys(listed))
        columns = tuple(seen)
    row_filter = None
    if all(f is not None for f in filters):
        unique = sorted(set(filters))
        row_filter = unique[0] if len(unique) == 1 else " OR ".join(f"({f})" for f in unique)
    return Published(columns, row_filter)


def published(
    conn: psycopg.Connection, publications: str | Sequence[str], oids: Iterable[int]
) -> dict[int, Published]:
    """OID -> how ``publications`` publish each of ``oids`` (tables they do not publish: absent).

    ``pg_publication_tables.attnames`` lists every published column even without a column
    list, so whether there is one comes from ``pg_publication_rel.prattrs`` (a table published
    through ``FOR ALL TABLES`` or ``TABLES IN SCHEMA`` has no row there, hence no list).
    """
    names = [publications] if isinstance(publications, str) else list(publications)
    wanted = sorted({int(oid) for oid in oids})
    if not wanted or not names:
        return {}
    if conn.info.server_version < ROW_FILTER_MIN_VERSION:
        listing = sql.SQL(", NULL::text[], NULL::text, false")
    else:
        listing = sql.SQL(
            ", p.attnames::text[], p.rowfilter,"
            " EXISTS (SELECT 1 FROM pg_publication_rel r JOIN pg_publication b ON b.oid = r.prpubid"
            "  WHERE b.pubname = p.pubname AND r.prrelid = c.oid AND r.prattrs IS NOT NULL)"
        )
    query = sql.SQL(
        "SELECT c.oid::int8{listing} FROM pg_publication_tables p"
        " JOIN pg_namespace n ON n.nspname = p.schemaname"
        " JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = p.tablename"
        " WHERE p.pubname = ANY({names}) AND c.oid = ANY({oids}::oid[])"
    ).format(
        listing=listing,
        names=sql.Literal(names),
        oids=sql.Literal(wanted),
    )
    with server_errors():
        rows = conn.execute(query).fetchall()
    entries: dict[int, list[Published]] = {}
    for oid, attnames, row_filter, has_list in rows:
        columns = tuple(attnames) if has_list and attnames is not None else None
        entries.setdefault(int(oid), []).append(Published(columns, row_filter))
    return {oid: combine(found) for oid, found in entries.items()}


def key_id(key: bytes | None) -> str:
    """A name for the hash key that does not reveal it: a changed key changes the hashes."""
    if not key:
        return ""
    return hmac.new(key, _KEY_ID_MESSAGE, hashlib.sha256).hexdigest()[:16]


@dataclass(frozen=True)
class Shape:
    """What of one table capture lands: recorded with its schema in bronze."""

    column_list: tuple[str, ...] | None = None
    row_filter: str | None = None
    policies: tuple[tuple[str, str], ...] = ()
    """``(column, "exclude" | "hash")`` from the configuration, sorted by column."""
    hash_key_id: str = ""
    """:func:`key_id` of the key hashed columns were hashed with ("" when none is hashed)."""

    @classmethod
    def of(cls, publication: Published, policies: Mapping[str, str], key: bytes | None) -> Shape:
        rules = tuple(sorted(policies.items()))
        hashed = any(rule == HASH for _, rule in rules)
        return cls(
            publication.columns, publication.row_filter, rules, key_id(key) if hashed else ""
        )

    @classmethod
    def from_record(cls, record: Mapping | None) -> Shape:
        """The shape a bronze ``schema`` record holds (older records have none: the default)."""
        if not record:
            return cls()
        listed = record.get("column_list")
        return cls(
            None if listed is None else tuple(listed),
            record.get("row_filter"),
            tuple((column, rule) for column, rule in record.get("policies", ())),
            record.get("hash_key_id", ""),
        )

    def rule(self, column: str) -> str:
        return dict(self.policies).get(column, "")

    def changes(self, recorded: Shape) -> list[str]:
        """What differs from ``recorded``, in words (empty: nothing)."""
        said = []
        if self.column_list != recorded.column_list:
            said.append("column list")
        if self.row_filter != recorded.row_filter:
            said.append("row filter")
        if self.policies != recorded.policies:
            said.append("column policies")
        elif self.hash_key_id != recorded.hash_key_id:
            said.append("hash key")
        return said


def keyed_hash(key: bytes, value: bytes) -> bytes:
    """HMAC-SHA256 of a value's text bytes, as 64 lower-case hex digits."""
    return hmac.new(key, value, hashlib.sha256).hexdigest().encode()


def hash_copy_lines(chunk: bytes, positions: Sequence[int], key: bytes) -> bytes:
    """COPY TEXT lines (each ending in a newline) with the fields at ``positions`` hashed.

    A field is hashed as the value it spells (escapes resolved), which is what pgoutput sends
    for it, so snapshot and stream hash one value alike; NULL stays NULL, and a hex digest needs
    no escaping.
    """
    out = []
    for line in chunk.split(b"\n")[:-1]:
        fields = copy_fields(line)
        for position in positions:
            value = field_bytes(fields[position])
            if value is not None:
                fields[position] = keyed_hash(key, value)
        out.append(b"\t".join(fields))
    out.append(b"")
    return b"\n".join(out)


_RELID = struct.Struct(">I")
_CHANGES = frozenset((MSG_INSERT[0], MSG_UPDATE[0], MSG_DELETE[0]))


@dataclass(frozen=True)
class _Rewrite:
    keep: tuple[int, ...]
    hashed: frozenset[int]


class StreamPolicies:
    """Rewrites the stream's messages of tables with column policies before bronze.

    A Relation message says which column is where; the changes after it are rewritten against
    it: excluded columns leave the Relation and every tuple, hashed ones become ``text`` in
    the Relation and a hash in the tuples (NULL and unchanged-TOAST markers stay). Every other
    message passes untouched. A table is known by OID first (so a renamed table keeps its
    policies for the rest of the run), by the Relation's name otherwise.
    """

    def __init__(
        self,
        by_name: Mapping[str, Mapping[str, str]],
        by_oid: Mapping[int, Mapping[str, str]],
        key: bytes | None,
        column_lists: Mapping[int, tuple[str, ...] | None] | None = None,
    ) -> None:
        self._by_name = by_name
        self._by_oid = by_oid
        self._key = key
        self._column_lists = column_lists or {}
        self._relations: dict[int, _Rewrite] = {}

    def __call__(self, payload: bytes) -> bytes:
        kind = payload[0]
        if kind == MSG_RELATION[0]:
            return self._relation(payload)
        if kind in _CHANGES:
            rewrite = self._relations.get(_RELID.unpack_from(payload, 1)[0])
            if rewrite is not None:
                return self._change(payload, rewrite)
        return payload

    def _relation(self, payload: bytes) -> bytes:
        relation: Relation = decode(payload)
        name = f"{relation.namespace or 'pg_catalog'}.{relation.name}"
        rules = self._by_oid.get(relation.relid) or self._by_name.get(name) or {}
        rules = {c: r for c, r in rules.items() if r in PII_POLICIES}
        if not rules:
            self._relations.pop(relation.relid, None)
            return payload
        _check_applicable(name, relation, rules, self._column_lists.get(relation.relid))
        keep, hashed, columns = [], set(), []
        for i, column in enumerate(relation.columns):
            rule = rules.get(column.name, "")
            if rule == EXCLUDE:
                continue
            if rule == HASH:
                if not self._key:
                    raise ValueError("a hashed column needs a hash key")
                hashed.add(i)
                column = replace(column, type_oid=TEXT_OID, type_modifier=-1)
            keep.append(i)
            columns.append(column)
        self._relations[relation.relid] = _Rewrite(tuple(keep), frozenset(hashed))
        return encode(replace(relation, columns=tuple(columns)))

    def _change(self, payload: bytes, rewrite: _Rewrite) -> bytes:
        message = decode(payload)
        fields = {"new": message.new} if hasattr(message, "new") else {}
        if getattr(message, "old", None) is not None:
            fields["old"] = message.old
        return encode(replace(message, **{k: self._tuple(v, rewrite) for k, v in fields.items()}))

    def _tuple(self, values: TupleData, rewrite: _Rewrite) -> TupleData:
        out = []
        for i in rewrite.keep:
            value = values[i]
            if i in rewrite.hashed and value is not None and value is not UNCHANGED_TOAST:
                value = keyed_hash(self._key, value)
            out.append(value)
        return tuple(out)


def check_protected_present(
    name: str, rules: Mapping[str, str], present: set[str], listed: tuple[str, ...] | None
) -> None:
    """Fail closed: a protected column that is not among the ``present`` ones under its name
    (and not withheld by the publication's column list ``listed``) was renamed or dropped, and
    a renamed one would land unprotected. The stream's Relation messages and a snapshot's
    columns are both held to it."""
    missing = [c for c in rules if c not in present and (listed is None or c in listed)]
    if missing:
        raise PolicyNotApplicable(
            f"{name}: column(s) {', '.join(missing)} that a pii policy protects are no longer "
            "there (renamed or dropped): capture stops so that no personal data lands under "
            'another name; name the column as it is now in [tables."...".columns] (or remove '
            "the policy) and run again"
        )


def _check_applicable(
    name: str, relation: Relation, rules: Mapping[str, str], listed: tuple[str, ...] | None
) -> None:
    """Fail closed: a protected column missing from the Relation under its name (and not
    withheld by the publication's column list) was renamed or dropped, and a renamed one would
    land unprotected; an excluded key column would leave changes without their key."""
    check_protected_present(name, rules, {c.name for c in relation.columns}, listed)
    keys = [c.name for c in relation.columns if c.is_key and rules.get(c.name) == EXCLUDE]
    if keys:
        raise PolicyNotApplicable(
            f'{name}: pii = "exclude" on replica identity key column(s) {", ".join(keys)}: '
            'its updates and deletes could not be applied without them; use pii = "hash"'
        )


_FILTER_TOKEN = re.compile(
    r"'(?:[^']|'')*'"  # a string literal: skipped
    r'|"((?:[^"]|"")+)"'  # a quoted name
    r"|(::\s*)?([A-Za-z_][A-Za-z0-9_$]*)"  # a bare name, or a type after ::
)


def filter_columns(row_filter: str, columns: Iterable[str]) -> list[str]:
    """The columns of ``columns`` that a row filter, as PostgreSQL prints it, refers to.

    Read from the expression's text: string literals are skipped, quoted names taken as
    written, bare names lower-cased as PostgreSQL folds them, and a name after ``::`` (a type)
    is not a column.
    """
    known = set(columns)
    found: dict[str, None] = {}
    for match in _FILTER_TOKEN.finditer(row_filter):
        quoted, cast, bare = match.groups()
        if quoted:
            name = quoted.replace('""', '"')
        else:
            name = bare.lower() if bare and not cast else None
        if name in known:
            found[name] = None
    return list(found)
