"""A seeded, reproducible workload over a type-rich schema: PostgreSQL is the oracle.

::

    wl = Workload(conninfo, seed=3)
    wl.create()                    # schema, publication, initial load (deterministic per seed)
    wl.burst(transactions=60)      # concurrent sessions, multi-statement transactions
    wl.burst(transactions=60, large=True)   # ... with one large transaction per session

Tables (``accounts`` and ``"LineItems"`` keep PostgreSQL's default replica identity, their
primary key, as most production tables do; ``events`` and ``ledger`` are ``REPLICA IDENTITY
FULL``):

- ``accounts``: bigint key; numeric(14,2), timestamptz, date, jsonb, int[] (empty, NULL
  elements, int4 bounds), text[] with quotes, commas and braces, an enum whose labels have a
  space and non-ASCII letters, bytea, uuid, float8/float4 with NaN, ±Infinity and extremes,
  bool, interval, a TOAST-sized text column (updates that leave it alone send it as
  "unchanged TOAST"), a stored generated column (not published, so captured nowhere), NULLs
  everywhere they are allowed;
- ``"LineItems"``: a quoted mixed-case name, a composite key (``"orderId"``, ``"lineNo"``),
  quoted mixed-case and spaced column names, unconstrained numeric, timestamp;
- ``events``: no primary key, duplicate rows on purpose, updated and deleted one copy at a time
  (by ``ctid``);
- ``ledger``: int key, text with tabs, newlines, backslashes and unicode, and primary-key
  changes;
- ``orders``: partitioned by list on ``region`` (two partitions and a default one), published
  through its root (``publish_via_partition_root``), PostgreSQL's default identity on the
  composite key (region, id), ``infinity`` dates, unconstrained numerics from division, and rows
  moving between partitions when their region changes.

Reproducibility: every session owns the keys congruent to its number modulo ``sessions`` and
keeps its own view of them, with its own ``random.Random`` derived from (seed, burst, session).
What each session writes is therefore a function of the seed alone; only the interleaving of
commits between sessions varies, and PostgreSQL decides the resulting state, which verify reads.

Values are what applications store, within what the documented casts accept (README "Types"):
``±infinity`` dates and timestamps (clamped by default), unconstrained numerics from division
(``n / 7`` keeps 20 decimals; silver rounds them to 18, as declared, and verify compares at that
type), no BC dates and no numeric NaN; float ``-0`` is left out (silver normalises it to ``0``, a
documented limitation).
"""

from __future__ import annotations

import json
import os
import random
import string
import threading
import uuid
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from decimal import Context, Decimal, localcontext

import psycopg
from psycopg.types.json import Jsonb

from pgmedallion.core.config import Config, LakehouseConfig, SourceConfig

ENUM_LABELS = ("calm", "busy", "on fire", "ünïcødé", "Quoted'Label")

SCHEMA = """
CREATE TYPE mood AS ENUM ('calm', 'busy', 'on fire', 'ünïcødé', 'Quoted''Label');
CREATE TABLE accounts (
    id bigint PRIMARY KEY,
    owner text NOT NULL,
    balance numeric(14,2),
    opened timestamptz,
    born date,
    meta jsonb,
    scores int[],
    labels text[],
    mood mood,
    avatar bytea,
    ext uuid,
    ratio float8,
    weight float4,
    active boolean,
    wait interval,
    big bigint,
    bio text,
    balance_cents bigint GENERATED ALWAYS AS ((balance * 100)::bigint) STORED
);
CREATE TABLE "LineItems" (
    "orderId" bigint NOT NULL,
    "lineNo" int NOT NULL,
    "unitPrice" numeric,
    "Label Name" text,
    qty smallint,
    "placedAt" timestamp,
    PRIMARY KEY ("orderId", "lineNo")
);
CREATE TABLE events (
    sess int NOT NULL,
    tag int NOT NULL,
    n int NOT NULL,
    note text,
    payload jsonb,
    words text[]
);
CREATE TABLE ledger (
    id int PRIMARY KEY,
    memo text,
    amount numeric(12,2) NOT NULL,
    at timestamptz NOT NULL
);
ALTER TABLE events REPLICA IDENTITY FULL;
ALTER TABLE ledger REPLICA IDENTITY FULL;
CREATE TABLE orders (
    region text NOT NULL,
    id bigint NOT NULL,
    placed date,
    total numeric(12,2),
    share numeric,
    note text,
    PRIMARY KEY (region, id)
) PARTITION BY LIST (region);
CREATE TABLE orders_eu PARTITION OF orders FOR VALUES IN ('eu');
CREATE TABLE orders_us PARTITION OF orders FOR VALUES IN ('us');
CREATE TABLE orders_rest PARTITION OF orders DEFAULT;
"""

TABLES = (
    "public.accounts",
    'public."LineItems"',
    "public.events",
    "public.ledger",
    "public.orders",
)
REGIONS = ("eu", "us", "apac", "latam")

TRICKY_TEXT = (
    "",
    "plain",
    "tab\there",
    "new\nline",
    "carriage\rreturn",
    "back\\slash",
    "\\N",
    "quote ' and \" both",
    "żółw 🐢 日本語",
    'comma, {brace} "quoted"',
    " leading and trailing ",
    "NULL",
)
ARRAY_TEXT = ("a,b", "{x}", '"q"', "", "back\\slash", "NULL", "sp ace", "ü", None)
FLOATS = (
    float("nan"),
    float("inf"),
    float("-inf"),
    1.7976931348623157e308,
    5e-324,
    -2.5,
    0.0,
    1e-300,
)
FLOAT4S = (float("nan"), float("inf"), float("-inf"), 3.4028234e38, 1.5, 0.0, -7.25)
INTERVALS = ("1 year 2 mons 3 days 04:05:06.789", "-1 days", "00:00:00.000001", "-3 mons +2 days")


@dataclass
class BurstStats:
    transactions: int = 0
    statements: int = 0
    large: int = 0


@dataclass
class _Session:
    """One session's keys: every key it owns is congruent to ``number`` mod ``sessions``."""

    number: int
    sessions: int
    accounts: set[int] = field(default_factory=set)
    items: set[tuple[int, int]] = field(default_factory=set)
    ledger: set[int] = field(default_factory=set)
    events: list[tuple[int, int]] = field(default_factory=list)  # (tag, n), copies repeated
    orders: set[tuple[str, int]] = field(default_factory=set)  # (region, id)
    next_id: int = 0

    def new_id(self) -> int:
        self.next_id += 1
        return self.next_id * self.sessions + self.number


class Workload:
    def __init__(
        self,
        conninfo: dict,
        seed: int,
        *,
        sessions: int = 2,
        initial_rows: int = 120,
        toast_every: int = 7,
        publication: str | None = "pub",
        tables: tuple[str, ...] = TABLES,
    ) -> None:
        self.conninfo = dict(conninfo)
        self.seed = seed
        self.sessions = [_Session(n, sessions) for n in range(sessions)]
        self.initial_rows = initial_rows
        self.toast_every = toast_every
        self.publication = publication
        self.bursts = 0
        self.tables = tuple(t for t in TABLES if t in tables)
        inserts = {
            "public.accounts": self._insert_account,
            'public."LineItems"': self._insert_item,
            "public.events": self._insert_event,
            "public.ledger": self._insert_ledger,
            "public.orders": self._insert_order,
        }
        self.inserts = [inserts[t] for t in self.tables]

    # ------------------------------------------------------------------ values

    def _text(self, rng: random.Random) -> str | None:
        r = rng.random()
        if r < 0.1:
            return None
        if r < 0.6:
            return rng.choice(TRICKY_TEXT)
        return "".join(
            rng.choice(string.ascii_letters + " \t\\éß") for _ in range(rng.randint(1, 40))
        )

    def _toast(self, rng: random.Random) -> str:
        # Random letters compress poorly, so 12-30 kB stay well past the TOAST threshold.
        return "".join(rng.choice(string.ascii_letters) for _ in range(rng.randint(12_000, 30_000)))

    def _ts(self, rng: random.Random) -> datetime:
        base = datetime(1900, 1, 1, tzinfo=UTC)
        return base + timedelta(microseconds=rng.randint(0, 300 * 365 * 86400 * 10**6))

    def _account(self, rng: random.Random, key: int) -> tuple:
        def maybe(value):
            return None if rng.random() < 0.08 else value

        scores = rng.choice(
            [
                [],
                [None],
                [1, None, -2147483648, 2147483647],
                [rng.randint(-1000, 1000) for _ in range(rng.randint(1, 6))],
            ]
        )
        labels = [rng.choice(ARRAY_TEXT) for _ in range(rng.randint(0, 4))]
        meta = {
            "k": rng.choice(TRICKY_TEXT),
            "n": rng.randint(-(10**12), 10**12),
            "f": rng.choice([1.5, -0.25, 1e20]),
            "nested": {"list": [1, "two", None, True], "ü": "ß"},
        }
        return (
            key,
            rng.choice(TRICKY_TEXT[1:]) + f" #{key}",
            maybe(Decimal(rng.randint(-(10**13) + 1, 10**13 - 1)) / 100),
            maybe(self._ts(rng)),
            maybe(rng.choice([date(1, 1, 1), date(9999, 12, 31), date(2000, 2, 29), "infinity"])),
            maybe(Jsonb(meta)),
            maybe(scores),
            maybe(labels),
            maybe(rng.choice(ENUM_LABELS)),
            maybe(rng.choice([b"", b"\x00\\\xff", bytes(rng.getrandbits(8) for _ in range(40))])),
            maybe(uuid.UUID(int=rng.getrandbits(128))),
            maybe(rng.choice(FLOATS) if rng.random() < 0.4 else rng.uniform(-1e6, 1e6)),
            maybe(rng.choice(FLOAT4S)),
            maybe(rng.random() < 0.5),
            maybe(rng.choice(INTERVALS)),
            maybe(rng.choice([-(2**63), 2**63 - 1, 0, rng.randint(-(2**40), 2**40)])),
            self._toast(rng) if key % self.toast_every == 0 else self._text(rng),
        )

    def _item(self, rng: random.Random, key: tuple[int, int]) -> tuple:
        price = Decimal(rng.randint(-(10**15), 10**15)) / Decimal(10**6)
        if rng.random() < 0.3:  # what `amount::numeric / 7` stores: 20 decimals
            with localcontext(Context(prec=60)):
                price = (Decimal(rng.randint(-(10**9), 10**9)) / 7).quantize(Decimal("1e-20"))
        placed = self._ts(rng).replace(tzinfo=None)
        r = rng.random()
        return (
            key[0],
            key[1],
            None if rng.random() < 0.1 else price,
            self._text(rng),
            rng.choice([-32768, 32767, 0, rng.randint(1, 99)]),
            None if r < 0.1 else "infinity" if r < 0.15 else "-infinity" if r < 0.2 else placed,
        )

    def _event(self, rng: random.Random, sess: int, tag: int, n: int) -> tuple:
        # Derived from (sess, tag, n) alone so that duplicates are identical rows.
        r = random.Random(hash((self.seed, sess, tag, n)) & 0xFFFFFFFF)
        return (
            sess,
            tag,
            n,
            r.choice(TRICKY_TEXT),
            Jsonb({"tag": tag, "n": n, "t": r.choice(TRICKY_TEXT)}) if r.random() < 0.8 else None,
            [r.choice(ARRAY_TEXT) for _ in range(r.randint(0, 3))],
        )

    def _ledger(self, rng: random.Random, key: int) -> tuple:
        return (
            key,
            self._text(rng),
            Decimal(rng.randint(-(10**11), 10**11)) / 100,
            self._ts(rng),
        )

    def _order(self, rng: random.Random, key: tuple[str, int]) -> tuple:
        r = rng.random()
        placed = date(2020, 1, 1) + timedelta(days=rng.randint(0, 2000))
        with localcontext(Context(prec=60)):  # what `total / 7` stores: 20 decimals
            share = (Decimal(rng.randint(-(10**9), 10**9)) / 7).quantize(Decimal("1e-20"))
        return (
            *key,
            None if r < 0.05 else "infinity" if r < 0.1 else placed,
            Decimal(rng.randint(-(10**11), 10**11)) / 100,
            None if rng.random() < 0.1 else share,
            self._text(rng),
        )

    # ------------------------------------------------------------------ schema and load

    def create(self) -> None:
        """Schema, publication (unless ``publication`` is None) and the initial rows."""
        rng = random.Random(f"{self.seed}/initial")
        with psycopg.connect(**self.conninfo, autocommit=True) as conn:
            conn.execute(SCHEMA)
            with conn.transaction():
                for i in range(self.initial_rows):
                    s = self.sessions[i % len(self.sessions)]
                    for insert in self.inserts:
                        insert(conn, rng, s)
            if self.publication:
                # orders is partitioned: published through its root, one table downstream
                conn.execute(
                    f"CREATE PUBLICATION {self.publication} FOR TABLE {', '.join(self.tables)}"
                    " WITH (publish_via_partition_root = true)"
                )

    # ------------------------------------------------------------------ operations

    def _insert_account(self, conn, rng, s: _Session) -> None:
        key = s.new_id()
        conn.execute(
            "INSERT INTO accounts VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s,"
            " %s, %s::interval, %s, %s)",
            self._account(rng, key),
        )
        s.accounts.add(key)

    def _insert_item(self, conn, rng, s: _Session) -> None:
        key = (s.new_id(), rng.randint(1, 5))
        conn.execute(
            'INSERT INTO "LineItems" VALUES (%s, %s, %s, %s, %s, %s)', self._item(rng, key)
        )
        s.items.add(key)

    def _insert_event(self, conn, rng, s: _Session) -> None:
        if s.events and rng.random() < 0.3:
            tag, n = rng.choice(s.events)  # an exact duplicate of an existing row
        else:
            tag, n = s.new_id(), rng.randint(0, 3)
        conn.execute(
            "INSERT INTO events VALUES (%s, %s, %s, %s, %s, %s)", self._event(rng, s.number, tag, n)
        )
        s.events.append((tag, n))

    def _insert_ledger(self, conn, rng, s: _Session) -> None:
        key = s.new_id()
        conn.execute("INSERT INTO ledger VALUES (%s, %s, %s, %s)", self._ledger(rng, key))
        s.ledger.add(key)

    def _insert_order(self, conn, rng, s: _Session) -> None:
        key = (rng.choice(REGIONS), s.new_id())
        conn.execute("INSERT INTO orders VALUES (%s, %s, %s, %s, %s, %s)", self._order(rng, key))
        s.orders.add(key)

    def _order_statement(self, conn, rng: random.Random, s: _Session) -> None:
        """A change of the partitioned ``orders``: an update in place, a row moving to another
        partition (its partition key, part of the primary key, changes), or a delete."""
        op = rng.random()
        if op < 0.35 or not s.orders:
            self._insert_order(conn, rng, s)
            return
        key = rng.choice(sorted(s.orders))
        if op < 0.65:
            row = self._order(rng, key)
            conn.execute(
                "UPDATE orders SET total = %s, share = %s, note = %s WHERE region = %s AND id = %s",
                (row[3], row[4], row[5], *key),
            )
        elif op < 0.85:
            new = (rng.choice([r for r in REGIONS if r != key[0]]), key[1])
            conn.execute(
                "UPDATE orders SET region = %s WHERE region = %s AND id = %s", (new[0], *key)
            )
            s.orders.discard(key)
            s.orders.add(new)
        else:
            conn.execute("DELETE FROM orders WHERE region = %s AND id = %s", key)
            s.orders.discard(key)

    def _statement(self, conn, rng: random.Random, s: _Session) -> None:
        if "public.orders" in self.tables and rng.random() < 0.15:
            self._order_statement(conn, rng, s)
            return
        op = rng.random()
        if op < 0.30:
            rng.choice(self.inserts)(conn, rng, s)
        elif op < 0.45 and s.accounts:
            # Update a few columns, leaving the TOASTed bio alone (sent as unchanged TOAST).
            key = rng.choice(sorted(s.accounts))
            row = self._account(rng, key)
            conn.execute(
                "UPDATE accounts SET balance = %s, meta = %s, scores = %s, ratio = %s,"
                " mood = %s WHERE id = %s",
                (row[2], row[5], row[6], row[11], row[8], key),
            )
        elif op < 0.52 and s.accounts:
            key = rng.choice(sorted(s.accounts))
            row = self._account(rng, key)
            conn.execute(
                "UPDATE accounts SET bio = %s, labels = %s WHERE id = %s", (row[16], row[7], key)
            )
        elif op < 0.58 and s.accounts:
            old = rng.choice(sorted(s.accounts))  # a primary-key change
            new = s.new_id()
            conn.execute("UPDATE accounts SET id = %s WHERE id = %s", (new, old))
            s.accounts.discard(old)
            s.accounts.add(new)
        elif op < 0.64 and s.accounts:
            key = rng.choice(sorted(s.accounts))
            conn.execute("DELETE FROM accounts WHERE id = %s", (key,))
            s.accounts.discard(key)
        elif op < 0.70 and s.items:
            key = rng.choice(sorted(s.items))
            row = self._item(rng, key)
            conn.execute(
                'UPDATE "LineItems" SET "unitPrice" = %s, "Label Name" = %s, qty = %s'
                ' WHERE "orderId" = %s AND "lineNo" = %s',
                (row[2], row[3], row[4], *key),
            )
        elif op < 0.74 and s.items:
            old = rng.choice(sorted(s.items))  # composite-key change
            new = (old[0], old[1] + 10)
            if new not in s.items:
                conn.execute(
                    'UPDATE "LineItems" SET "lineNo" = %s WHERE "orderId" = %s AND "lineNo" = %s',
                    (new[1], *old),
                )
                s.items.discard(old)
                s.items.add(new)
        elif op < 0.78 and s.items:
            key = rng.choice(sorted(s.items))
            conn.execute('DELETE FROM "LineItems" WHERE "orderId" = %s AND "lineNo" = %s', key)
            s.items.discard(key)
        elif op < 0.85 and s.events:
            i = rng.randrange(len(s.events))
            tag, n = s.events[i]
            # One copy of possibly several identical rows changes.
            conn.execute(
                "UPDATE events SET n = n + 10, note = %s, payload = %s, words = %s WHERE ctid ="
                " (SELECT ctid FROM events WHERE sess = %s AND tag = %s AND n = %s LIMIT 1)",
                (*self._event(rng, s.number, tag, n + 10)[3:], s.number, tag, n),
            )
            s.events[i] = (tag, n + 10)
        elif op < 0.90 and s.events:
            i = rng.randrange(len(s.events))
            tag, n = s.events.pop(i)
            conn.execute(
                "DELETE FROM events WHERE ctid ="
                " (SELECT ctid FROM events WHERE sess = %s AND tag = %s AND n = %s LIMIT 1)",
                (s.number, tag, n),
            )
        elif op < 0.95 and s.ledger:
            old = rng.choice(sorted(s.ledger))
            new = s.new_id()
            conn.execute(
                "UPDATE ledger SET id = %s, memo = %s, amount = amount + 1 WHERE id = %s",
                (new, self._text(rng), old),
            )
            s.ledger.discard(old)
            s.ledger.add(new)
        elif s.ledger:
            key = rng.choice(sorted(s.ledger))
            conn.execute("DELETE FROM ledger WHERE id = %s", (key,))
            s.ledger.discard(key)
        else:
            rng.choice(self.inserts)(conn, rng, s)

    def _large(self, conn, rng: random.Random, s: _Session, rows: int) -> int:
        """One transaction with ``rows`` inserts into ledger, then updates and deletes of them
        (``ledger`` must be among the tables)."""
        start = s.next_id + 1
        s.next_id += rows
        keys = [k * s.sessions + s.number for k in range(start, start + rows)]
        conn.execute(
            "INSERT INTO ledger SELECT k, 'bulk ' || k || E'\\t' || repeat('x', k %% 50),"
            " (k %% 100000) / 100.0, timestamptz '2020-01-01 00:00:00+00' + k * interval '1 second'"
            " FROM unnest(%s::int[]) k",
            (keys,),
        )
        updated = keys[: rows // 3]
        conn.execute(
            "UPDATE ledger SET amount = amount + 0.5, memo = NULL WHERE id = ANY(%s)", (updated,)
        )
        deleted = keys[-(rows // 5) :]
        conn.execute("DELETE FROM ledger WHERE id = ANY(%s)", (deleted,))
        s.ledger.update(set(keys) - set(deleted))
        return 3

    def _session(
        self, s: _Session, transactions: int, large_rows: int, stats: BurstStats, errors: list
    ) -> None:
        rng = random.Random(f"{self.seed}/{self.bursts}/{s.number}")
        try:
            with psycopg.connect(**self.conninfo, autocommit=True) as conn:
                for t in range(transactions):
                    with conn.transaction():
                        if large_rows and t == transactions // 2:
                            n = self._large(conn, rng, s, large_rows)
                            with _LOCK:
                                stats.large += 1
                        else:
                            n = rng.randint(1, 6)
                            for _ in range(n):
                                self._statement(conn, rng, s)
                    with _LOCK:
                        stats.transactions += 1
                        stats.statements += n
        except BaseException as exc:  # surfaced by burst()
            errors.append(exc)

    def burst(self, transactions: int = 40, *, large_rows: int = 0) -> BurstStats:
        """``transactions`` per session, all sessions at once, each on its own connection.

        ``large_rows``: one transaction per session inserts that many rows (and updates and
        deletes a share of them) in one go.
        """
        stats, errors = BurstStats(), []
        threads = [
            threading.Thread(
                target=self._session, args=(s, transactions, large_rows, stats, errors)
            )
            for s in self.sessions
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.bursts += 1
        if errors:
            raise errors[0]
        return stats

    def counts(self) -> dict[str, int]:
        """Row counts per table as PostgreSQL sees them now, keyed like verify's table names."""
        with psycopg.connect(**self.conninfo) as conn:
            return {
                t.replace('"', ""): conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
                for t in self.tables
            }


_LOCK = threading.Lock()


def describe(stats: BurstStats) -> str:
    return json.dumps(stats.__dict__)


def make_config(
    conninfo: dict, name: str, *, publication: str = "pub", engine: str | None = None, **policies
) -> Config:
    """A pipeline config for a test database: its own source, slot and lakehouse schemas.
    ``engine``: ``[lakehouse] engine`` (default: ``PGMEDALLION_LAKEHOUSE_ENGINE``, as a
    configuration file read from the environment takes it, else ``auto``): CI runs the
    end-to-end trials once per engine."""
    return Config(
        source=SourceConfig(
            name=name,
            host=conninfo["host"],
            port=int(conninfo["port"]),
            dbname=conninfo["dbname"],
            user=conninfo["user"],
            password=conninfo.get("password", ""),
            publication=publication,
            slot=f"slot_{name}",
        ),
        lakehouse=LakehouseConfig(
            bronze_schema=f"{name}_bronze",
            silver_schema=f"{name}_silver",
            gold_schema=f"{name}_gold",
            engine=engine or os.environ.get("PGMEDALLION_LAKEHOUSE_ENGINE", "auto"),
        ),
        tables=policies,
    )


def assert_engine(spark, cfg: Config) -> None:
    """The configured engine wrote the run's tables: with ``spark`` no commit of bronze, silver
    or gold is delta-rs'; with ``auto`` (local tables) bronze's appends are."""
    from pyspark.sql import functions as F

    def engines(table: str) -> list[str]:
        history = spark.sql(f"DESCRIBE HISTORY {table}").where(F.col("version") > 0)
        return [r[0] or "" for r in history.select("engineInfo").collect()]

    bronze = engines(cfg.qualified("bronze", "bronze"))
    layers = [
        e
        for layer in ("silver", "gold")
        for r in spark.sql(f"SHOW TABLES IN {cfg.qualified(layer, '')}").collect()
        if not r["tableName"].startswith("_")
        for e in engines(cfg.qualified(layer, r["tableName"]))
    ]
    if cfg.lakehouse.engine == "spark":
        assert not [e for e in bronze + layers if e.startswith("delta-rs")], (bronze, layers)
    else:
        assert any(e.startswith("delta-rs") for e in bronze), bronze


def drop_schemas(spark, cfg: Config) -> None:
    for layer in ("bronze", "silver", "gold"):
        schema = getattr(cfg.lakehouse, layer + "_schema")
        spark.sql(f"DROP SCHEMA IF EXISTS `{schema}` CASCADE")


def assert_exact(result, expected: dict[str, int] | None = None, *, tables=None) -> None:
    """Every table of ``result`` (a VerifyResult) exact in silver and gold.

    ``expected``: table -> source row count (PostgreSQL's own count); then exactly these tables
    must be verified, and each count must match on every side. ``tables``: check only these.
    """
    checks = {t.table: t for t in result.tables}
    if expected is not None:
        assert sorted(checks) == sorted(expected), result.report()
    problems = []
    for name, t in sorted(checks.items()):
        if tables is not None and name not in tables:
            continue
        if not t.exact or t.gold_exact is not True:
            problems.append(f"{name}: silver exact={t.exact}, gold exact={t.gold_exact}")
        if expected is not None and not (
            expected[name] == t.source_rows == t.silver_rows == t.gold_rows
        ):
            problems.append(
                f"{name}: postgres {expected[name]}, verify source {t.source_rows},"
                f" silver {t.silver_rows}, gold {t.gold_rows}"
            )
    assert not problems, "\n".join(problems) + "\n" + result.report()
